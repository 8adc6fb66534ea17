//! Figures and their markdown: every figure is ours beside a baseline
//! measured in the same run, with the ratio and the target.

use std::fmt::Write as _;
use std::path::Path;

use crate::chart::Chart;

/// Whether a larger value is better (throughput) or a smaller one (latency,
/// bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One measured comparison.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured, e.g. "256 B, 4 partitions".
    pub case: String,
    pub ours: f64,
    pub baseline: f64,
    pub unit: &'static str,
    pub better: Better,
    /// The target on `ours / baseline`, if the issue sets one.
    pub target: Option<f64>,
}

impl Row {
    /// `ours / baseline`.
    pub fn ratio(&self) -> f64 {
        if self.baseline == 0.0 {
            f64::NAN
        } else {
            self.ours / self.baseline
        }
    }

    /// "met", "MISSED" or "-" when the figure has no target.
    pub fn verdict(&self) -> &'static str {
        let Some(target) = self.target else {
            return "-";
        };
        let ok = match self.better {
            Better::Higher => self.ratio() >= target,
            Better::Lower => self.ratio() <= target,
        };
        if ok { "met" } else { "MISSED" }
    }

    fn target_text(&self) -> String {
        match (self.target, self.better) {
            (None, _) => "-".into(),
            (Some(t), Better::Higher) => format!(">= {t:.2}"),
            (Some(t), Better::Lower) => format!("<= {t:.2}"),
        }
    }
}

/// One figure of the issue: a title, what the baseline is, its rows, notes.
#[derive(Debug, Clone)]
pub struct Figure {
    pub title: String,
    pub ours_label: String,
    pub baseline_label: String,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// A chart of the figure and the file name it is written to.
    pub chart: Option<(String, Chart)>,
    /// The machine's load average (1, 5, 15 min) when the figure started:
    /// other work on a shared machine shows here.
    pub load: Option<String>,
}

impl Figure {
    pub fn new(title: &str, ours: &str, baseline: &str) -> Self {
        Self {
            title: title.into(),
            ours_label: ours.into(),
            baseline_label: baseline.into(),
            rows: Vec::new(),
            notes: Vec::new(),
            chart: None,
            load: load_average(),
        }
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// The figure as a markdown section.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "### {}\n", self.title);
        let _ = writeln!(
            s,
            "ours: {}; baseline: {}\n",
            self.ours_label, self.baseline_label
        );
        let _ = writeln!(
            s,
            "| case | ours | baseline | unit | ours/baseline | target | verdict |"
        );
        let _ = writeln!(s, "| --- | ---: | ---: | --- | ---: | --- | --- |");
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.2} | {} | {} |",
                r.case,
                number(r.ours),
                number(r.baseline),
                r.unit,
                r.ratio(),
                r.target_text(),
                r.verdict()
            );
        }
        for n in &self.notes {
            let _ = writeln!(s, "\n- {n}");
        }
        if let Some(load) = &self.load {
            let _ = writeln!(
                s,
                "\n- Load average (1, 5, 15 min) when the figure started: {load}"
            );
        }
        s.push('\n');
        s
    }
}

/// `/proc/loadavg`'s first three fields, where there is one.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    (fields.len() == 3).then(|| fields.join(", "))
}

/// A number with a precision that suits its size.
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let a = x.abs();
    if a >= 100.0 {
        let mut digits = format!("{:.0}", a);
        let mut out = String::new();
        while digits.len() > 3 {
            let tail = digits.split_off(digits.len() - 3);
            out = format!(",{tail}{out}");
        }
        format!("{}{digits}{out}", if x < 0.0 { "-" } else { "" })
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Prints the figure and appends it to `out`; writes its chart, if any,
/// into `charts`.
pub fn emit(figure: &Figure, out: &Path, charts: &Path) -> std::io::Result<()> {
    let md = figure.markdown();
    println!("{md}");
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    f.write_all(md.as_bytes())?;
    if let Some((name, chart)) = &figure.chart {
        let path = charts.join(name);
        std::fs::write(&path, chart.svg())?;
        eprintln!("chart: {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(number(1234567.0), "1,234,567");
        assert_eq!(number(123.4), "123");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(0.1234), "0.12");
        assert_eq!(number(f64::NAN), "n/a");
    }

    #[test]
    fn verdict_follows_the_direction() {
        let mut r = Row {
            case: "x".into(),
            ours: 90.0,
            baseline: 100.0,
            unit: "msg/s",
            better: Better::Higher,
            target: Some(0.9),
        };
        assert_eq!(r.verdict(), "met");
        r.ours = 80.0;
        assert_eq!(r.verdict(), "MISSED");
        r.target = None;
        assert_eq!(r.verdict(), "-");
        let md = Figure {
            rows: vec![r],
            ..Figure::new("t", "a", "b")
        }
        .markdown();
        assert!(
            md.contains("| x | 80.0 | 100 | msg/s | 0.80 | - | - |"),
            "{md}"
        );
    }
}
