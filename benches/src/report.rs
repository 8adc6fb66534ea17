//! Figures, their rows and their one Markdown rendering: every figure is
//! ours beside a baseline measured in the same run, with the ratio and the
//! issue's target. A [`Figure`] serialises to the run's JSON
//! ([`crate::results`]) and the Markdown is rendered from what the JSON
//! holds, so the two never disagree.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::chart::Chart;

/// Whether a larger value is better (throughput) or a smaller one (latency,
/// bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

/// What identifies a row across runs, e.g. `{"rtt_ms": 20, "partitions": 4}`:
/// `compare` matches rows on it (on the case text when it is empty, as the
/// case may name counts that change with the RTT).
pub type Params = BTreeMap<String, serde_json::Value>;

/// One measured comparison. In JSON also its ratio and verdict (for
/// readers of the file; ignored when read back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "RowJson", from = "RowJson")]
pub struct Row {
    /// What was measured, e.g. "256 B, 4 partitions".
    pub case: String,
    /// The row's identity across runs; see [`Params`].
    pub params: Params,
    pub ours: f64,
    pub baseline: f64,
    pub unit: String,
    pub better: Better,
    /// The target on `ours / baseline`, if the issue sets one.
    pub target: Option<f64>,
}

/// [`Row`] as written: a NaN (a run that failed) is `null`.
#[derive(Serialize, Deserialize)]
struct RowJson {
    case: String,
    #[serde(default, skip_serializing_if = "Params::is_empty")]
    params: Params,
    ours: Option<f64>,
    baseline: Option<f64>,
    unit: String,
    better: Better,
    target: Option<f64>,
    #[serde(default)]
    ratio: Option<f64>,
    #[serde(default)]
    verdict: String,
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

impl From<Row> for RowJson {
    fn from(r: Row) -> Self {
        Self {
            ratio: finite(r.ratio()),
            verdict: r.verdict().into(),
            ours: finite(r.ours),
            baseline: finite(r.baseline),
            case: r.case,
            params: r.params,
            unit: r.unit,
            better: r.better,
            target: r.target,
        }
    }
}

impl From<RowJson> for Row {
    fn from(r: RowJson) -> Self {
        Self {
            case: r.case,
            params: r.params,
            ours: r.ours.unwrap_or(f64::NAN),
            baseline: r.baseline.unwrap_or(f64::NAN),
            unit: r.unit,
            better: r.better,
            target: r.target,
        }
    }
}

impl Row {
    /// A row with no [`Params`].
    pub fn new(case: impl Into<String>, ours: f64, baseline: f64, unit: &str) -> Self {
        Self {
            case: case.into(),
            params: Params::new(),
            ours,
            baseline,
            unit: unit.into(),
            better: Better::Higher,
            target: None,
        }
    }

    /// Adds `key: value` to the row's [`Params`].
    pub fn param(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.params.insert(key.into(), value.into());
        self
    }

    /// The key `compare` matches rows on: the params, else the case.
    pub fn key(&self) -> String {
        if self.params.is_empty() {
            self.case.clone()
        } else {
            serde_json::to_string(&self.params).unwrap_or_default()
        }
    }

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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    pub title: String,
    pub ours_label: String,
    pub baseline_label: String,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// A chart of the figure and the file name it is written to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<(String, Chart)>,
    /// The machine's load average (1, 5, 15 min) when the figure started:
    /// other work on a shared machine shows here.
    #[serde(default)]
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

    /// The figure's number, from its title ("3. End to end ..." -> "3"):
    /// its key in the run's JSON.
    pub fn number(&self) -> String {
        let digits: String = self
            .title
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        if !digits.starts_with(|c: char| c.is_ascii_digit()) {
            self.title.clone()
        } else {
            digits
        }
    }

    /// Writes the figure's chart, if any, into `dir`.
    pub fn write_chart(&self, dir: &Path) -> std::io::Result<()> {
        if let Some((name, chart)) = &self.chart {
            let path = dir.join(name);
            std::fs::write(&path, chart.svg())?;
            eprintln!("chart: {}", path.display());
        }
        Ok(())
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

/// Prints the figure's Markdown and writes its chart, if any, into
/// `charts`.
pub fn emit(figure: &Figure, charts: &Path) -> std::io::Result<()> {
    println!("{}", figure.markdown());
    figure.write_chart(charts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_keyed_by_its_number_and_letter() {
        let key = |title: &str| Figure::new(title, "ours", "base").number();
        assert_eq!(key("3. End to end"), "3");
        assert_eq!(key("3m. Latency hiding"), "3m");
        assert_eq!(key("Untitled"), "Untitled");
    }

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
            target: Some(0.9),
            ..Row::new("x", 90.0, 100.0, "msg/s")
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

    #[test]
    fn a_figure_survives_json_and_renders_the_same() {
        let mut fig = Figure::new("3. End to end", "ours", "raw");
        fig.rows.push(Row {
            target: Some(0.9),
            ..Row::new("RTT 20 ms, 256 B", 9_000.0, 10_000.0, "msg/s").param("rtt_ms", 20)
        });
        fig.rows.push(Row::new("failed", f64::NAN, 1.0, "msg/s"));
        fig.note("a note");
        let json = serde_json::to_string(&fig).unwrap();
        assert!(json.contains(r#""ratio":0.9"#), "{json}");
        assert!(json.contains(r#""verdict":"met""#), "{json}");
        assert!(json.contains(r#""ours":null"#), "{json}");
        let back: Figure = serde_json::from_str(&json).unwrap();
        assert_eq!(back.rows[0], fig.rows[0]);
        assert!(back.rows[1].ours.is_nan());
        assert_eq!(back.markdown(), fig.markdown());
        assert_eq!(back.number(), "3");
        assert_eq!(back.rows[0].key(), r#"{"rtt_ms":20}"#);
        assert_eq!(back.rows[1].key(), "failed");
    }
}
