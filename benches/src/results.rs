//! A run's results as JSON, and the Markdown summary rendered from it.
//!
//! Each part of `scripts/bench.sh` (criterion, e2e, Spark) writes a
//! [`Part`]: its figures and its failures. `sqs-flight-bench collect` folds
//! the parts into one [`Run`] with the run's metadata
//! (`bench-results/results.json`) and renders `results.md` from that JSON;
//! `sqs-flight-bench render` renders any recorded run or part again. The
//! Markdown of a figure is [`Figure::markdown`] and nothing else.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::report::Figure;

/// What one part of a run wrote: its figures, in order, and the figures
/// or parts that failed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Part {
    pub figures: Vec<Figure>,
    #[serde(default)]
    pub failed: Vec<Failure>,
}

/// A figure or part that failed, with the error.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Failure {
    /// "figure N", or the name of a part ("criterion", "spark").
    pub what: String,
    pub error: String,
}

impl Part {
    /// Writes the part as JSON (rewritten whole after each figure, so a run
    /// that dies keeps the figures it finished).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a part", path.display()))
    }
}

/// The machine a run measured on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_gib: u64,
    /// `/proc/loadavg`'s 1, 5 and 15 min when the run ended.
    pub load_at_end: String,
    /// `rustc --version` and the profile.
    pub toolchain: String,
}

impl Machine {
    /// This machine, as Linux describes it (fields left empty elsewhere).
    pub fn this(toolchain: String) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default();
        let memory_gib = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib >> 20);
        let loadavg = read("/proc/loadavg");
        Self {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            memory_gib,
            load_at_end: loadavg
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            toolchain,
        }
    }
}

/// One run of `scripts/bench.sh`: `bench-results/results.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    pub commit: String,
    /// UTC, `YYYY-MM-DD HH:MM`.
    pub date: String,
    /// "full", or "quick (small counts, not for the record)".
    pub mode: String,
    pub machine: Machine,
    /// The SQS server and the RTTs of each figure.
    pub sqs_server: String,
    /// The chart files beside the JSON.
    #[serde(default)]
    pub charts: Vec<String>,
    /// Figures by number ("1" .. "7"), in the order the run made them.
    pub figures: BTreeMap<String, Figure>,
    #[serde(default)]
    pub failed: Vec<Failure>,
    #[serde(default)]
    pub notes: Vec<String>,
}

impl Run {
    /// Folds `parts` into the run, figures keyed by number.
    pub fn add(&mut self, part: Part) {
        for fig in part.figures {
            self.figures.insert(fig.number(), fig);
        }
        self.failed.extend(part.failed);
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a run's results.json", path.display()))
    }

    /// The run's Markdown summary: its header, then each figure.
    pub fn markdown(&self) -> String {
        let mut s = String::from("# sqs-flight benchmark results\n\n");
        s.push_str(&self.header());
        let _ = writeln!(s, "- charts: {}\n", self.charts.join(" "));
        s.push_str(&self.figures_markdown());
        s.push_str(&failures(&self.failed));
        for n in &self.notes {
            let _ = writeln!(s, "- {n}\n");
        }
        s
    }

    /// The run's metadata as a Markdown list (the charts beside its JSON
    /// apart).
    pub fn header(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        let _ = writeln!(s, "- date: {}", self.date);
        let _ = writeln!(s, "- commit: {}", self.commit);
        let _ = writeln!(
            s,
            "- machine: {} cores ({}), {} GiB, load average at the end: {}",
            m.cores, m.cpu, m.memory_gib, m.load_at_end
        );
        let _ = writeln!(s, "- toolchain: {}", m.toolchain);
        let _ = writeln!(s, "- SQS server: {}", self.sqs_server);
        let _ = writeln!(s, "- mode: {}", self.mode);
        s
    }

    /// Each figure's Markdown: figure 1 first, then 2, 3, 5, 6, 7 and the
    /// Spark figure last, as the run makes them.
    pub fn figures_markdown(&self) -> String {
        let mut figures: Vec<&Figure> = self.figures.values().collect();
        figures.sort_by_key(|f| (f.number() == "4", f.number()));
        figures.into_iter().map(Figure::markdown).collect()
    }

    /// Whether the run was `scripts/bench.sh --quick` (small counts).
    pub fn is_quick(&self) -> bool {
        self.mode.starts_with("quick")
    }
}

/// The failures as Markdown sections.
pub fn failures(failed: &[Failure]) -> String {
    let mut s = String::new();
    for f in failed {
        let _ = write!(s, "### FAILED: {}\n\n```\n{}\n```\n\n", f.what, f.error);
    }
    if !failed.is_empty() {
        let names: Vec<&str> = failed.iter().map(|f| f.what.as_str()).collect();
        let _ = writeln!(s, "**Failed: {}**\n", names.join(", "));
    }
    s
}

/// The Markdown of a JSON file that holds either a [`Run`] or a [`Part`].
pub fn render(path: &Path) -> Result<String> {
    if let Ok(run) = Run::load(path) {
        return Ok(run.markdown());
    }
    let part = Part::load(path)?;
    let mut s: String = part.figures.iter().map(Figure::markdown).collect();
    s.push_str(&failures(&part.failed));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Row;

    fn figure(title: &str, ours: f64) -> Figure {
        let mut fig = Figure::new(title, "ours", "raw");
        fig.rows
            .push(Row::new("RTT 0 ms", ours, 100.0, "msg/s").param("rtt_ms", 0));
        fig
    }

    #[test]
    fn a_run_round_trips_through_json_and_renders_every_figure() {
        let mut run = Run {
            commit: "abc1234".into(),
            date: "2026-12-01 20:00 UTC".into(),
            mode: "full".into(),
            machine: Machine::this("rustc 1.95.0; release profile".into()),
            sqs_server: "rustack 0.12.0".into(),
            charts: vec!["fig3.svg".into()],
            figures: BTreeMap::new(),
            failed: Vec::new(),
            notes: Vec::new(),
        };
        run.add(Part {
            figures: vec![figure("4. Spark", 3.0), figure("3. End to end", 90.0)],
            failed: vec![Failure {
                what: "figure 5".into(),
                error: "boom".into(),
            }],
        });
        let json = serde_json::to_string_pretty(&run).unwrap();
        let back: Run = serde_json::from_str(&json).unwrap();
        assert_eq!(back.machine, run.machine);
        assert_eq!(back.figures["3"].rows, run.figures["3"].rows);
        let md = back.markdown();
        assert_eq!(md, run.markdown());
        let (three, four) = (
            md.find("### 3. End").unwrap(),
            md.find("### 4. Spark").unwrap(),
        );
        assert!(three < four, "figure 4 comes last: {md}");
        assert!(md.contains("### FAILED: figure 5"), "{md}");
        assert!(md.contains("- commit: abc1234"), "{md}");
    }
}
