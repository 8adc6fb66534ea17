//! `sqs-flight-bench compare OLD.json NEW.json`: per figure and row, ours
//! before -> after and the ratio ours/baseline before -> after, each
//! change beyond the threshold flagged. Rows are matched on
//! [`Row::key`](crate::report::Row::key).

use std::fmt::Write as _;

use crate::report::{Better, Figure, Row, number};
use crate::results::Run;

/// One row present in both runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub figure: String,
    pub case: String,
    pub unit: String,
    pub better: Better,
    pub ours: (f64, f64),
    pub ratio: (f64, f64),
}

impl Change {
    fn new(figure: &str, old: &Row, new: &Row) -> Self {
        Self {
            figure: figure.into(),
            case: new.case.clone(),
            unit: new.unit.clone(),
            better: new.better,
            ours: (old.ours, new.ours),
            ratio: (old.ratio(), new.ratio()),
        }
    }

    /// Whether ours or the ratio moved by more than `threshold` (0.1: 10%)
    /// of its old value: more than this machine's noise.
    pub fn beyond(&self, threshold: f64) -> bool {
        [self.ours, self.ratio]
            .into_iter()
            .any(|(a, b)| relative(a, b).is_some_and(|r| r.abs() > threshold))
    }

    /// "better" or "worse" by the figure's direction, on ours.
    fn direction(&self) -> &'static str {
        let up = self.ours.1 > self.ours.0;
        match (self.better, up) {
            (Better::Higher, true) | (Better::Lower, false) => "better",
            _ => "worse",
        }
    }

    fn line(&self, threshold: f64) -> String {
        let verdict = if self.beyond(threshold) {
            format!("CHANGED ({}; re-run before believing it)", self.direction())
        } else {
            "within noise".into()
        };
        format!(
            "  {}: ours {} -> {} {} ({}); ours/baseline {:.2} -> {:.2} ({}): {verdict}",
            self.case,
            number(self.ours.0),
            number(self.ours.1),
            self.unit,
            percent(self.ours),
            self.ratio.0,
            self.ratio.1,
            percent(self.ratio),
        )
    }
}

/// `(b - a) / a`, when both are finite and `a` is not 0.
fn relative(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && a != 0.0).then(|| (b - a) / a.abs())
}

fn percent((a, b): (f64, f64)) -> String {
    relative(a, b).map_or("n/a".into(), |r| format!("{:+.1}%", r * 100.0))
}

/// The rows of `figure` in both runs, and the keys found in one only.
fn figure_changes(number: &str, old: &Figure, new: &Figure) -> (Vec<Change>, Vec<String>) {
    let mut changes = Vec::new();
    let mut unmatched = Vec::new();
    for row in &new.rows {
        match old.rows.iter().find(|o| o.key() == row.key()) {
            Some(o) => changes.push(Change::new(number, o, row)),
            None => unmatched.push(format!("  {}: only in NEW", row.case)),
        }
    }
    for row in &old.rows {
        if !new.rows.iter().any(|n| n.key() == row.key()) {
            unmatched.push(format!("  {}: only in OLD", row.case));
        }
    }
    (changes, unmatched)
}

/// The report `compare` prints.
pub fn report(old: &Run, new: &Run, threshold: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "OLD: {} ({}, {})\nNEW: {} ({}, {})\nthreshold: {:.0}%\n",
        old.commit,
        old.date,
        old.mode,
        new.commit,
        new.date,
        new.mode,
        threshold * 100.0
    );
    let mut flagged = 0;
    let numbers: std::collections::BTreeSet<&String> =
        old.figures.keys().chain(new.figures.keys()).collect();
    for number in numbers {
        let (o, n) = (old.figures.get(number), new.figures.get(number));
        let title = n.or(o).map_or("", |f| f.title.as_str());
        let _ = writeln!(s, "{title}");
        let (Some(o), Some(n)) = (o, n) else {
            let side = if o.is_some() { "OLD" } else { "NEW" };
            let _ = writeln!(s, "  only in {side}\n");
            continue;
        };
        let (changes, unmatched) = figure_changes(number, o, n);
        for c in &changes {
            flagged += usize::from(c.beyond(threshold));
            let _ = writeln!(s, "{}", c.line(threshold));
        }
        for u in unmatched {
            let _ = writeln!(s, "{u}");
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "{flagged} row(s) moved by more than {:.0}%",
        threshold * 100.0
    );
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::results::{Machine, Part};

    fn run(commit: &str, ours_20ms: f64, ours_0ms: f64) -> Run {
        let mut fig = Figure::new("3. End to end", "ours", "raw");
        // The case names a count that changes between runs; the params
        // still match the rows.
        fig.rows.push(
            Row::new(
                format!("RTT 20 ms, {commit} msgs"),
                ours_20ms,
                1000.0,
                "msg/s",
            )
            .param("rtt_ms", 20),
        );
        fig.rows
            .push(Row::new("RTT 0 ms", ours_0ms, 1000.0, "msg/s").param("rtt_ms", 0));
        let mut r = Run {
            commit: commit.into(),
            date: "d".into(),
            mode: "full".into(),
            machine: Machine::default(),
            sqs_server: String::new(),
            charts: Vec::new(),
            figures: BTreeMap::new(),
            failed: Vec::new(),
            notes: Vec::new(),
        };
        r.add(Part {
            figures: vec![fig],
            failed: Vec::new(),
        });
        r
    }

    #[test]
    fn a_row_that_moved_30_percent_is_flagged_and_one_that_moved_2_is_not() {
        let (old, new) = (run("a", 1000.0, 1000.0), run("b", 1300.0, 1020.0));
        let c = figure_changes("3", &old.figures["3"], &new.figures["3"]).0;
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(c[0].beyond(0.1), "{c:?}");
        assert!(!c[1].beyond(0.1), "{c:?}");
        let text = report(&old, &new, 0.1);
        assert!(
            text.contains("ours 1,000 -> 1,300 msg/s (+30.0%)"),
            "{text}"
        );
        assert!(text.contains("CHANGED (better"), "{text}");
        assert!(text.contains("(+2.0%)"), "{text}");
        assert!(text.contains("1 row(s) moved by more than 10%"), "{text}");
    }

    #[test]
    fn a_drop_is_worse_and_a_missing_figure_is_named() {
        let old = run("a", 1000.0, 1000.0);
        let mut new = run("b", 600.0, 1000.0);
        assert!(report(&old, &new, 0.1).contains("CHANGED (worse"));
        new.figures.clear();
        assert!(report(&old, &new, 0.1).contains("only in OLD"));
        // A threshold of 50% takes the 40% drop for noise.
        let new = run("b", 600.0, 1000.0);
        assert!(!figure_changes("3", &old.figures["3"], &new.figures["3"]).0[0].beyond(0.5));
    }
}
