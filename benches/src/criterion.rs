//! Figure 1 from criterion's output (`benches/conversion.rs`): each
//! benchmark's `new/benchmark.json` and `new/estimates.json`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::report::{Better, Figure, Row};

/// Messages per iteration of every conversion benchmark.
const MESSAGES: f64 = 1000.0;

/// (group, function) -> (mean ns per iteration, body bytes per iteration).
type Results = BTreeMap<(String, String), (f64, f64)>;

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
}

fn collect(dir: &Path, out: &mut Results) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        let bench = path.join("new").join("benchmark.json");
        if bench.is_file() {
            let b = read_json(&bench)?;
            let e = read_json(&path.join("new").join("estimates.json"))?;
            let group = b["group_id"].as_str().unwrap_or_default().to_string();
            let function = b["value_str"]
                .as_str()
                .or(b["function_id"].as_str())
                .unwrap_or_default()
                .to_string();
            let ns = e["mean"]["point_estimate"].as_f64().context("no mean")?;
            let bytes = b["throughput"]["Bytes"].as_f64().unwrap_or(0.0);
            out.insert((group, function), (ns, bytes));
        } else {
            collect(&path, out)?;
        }
    }
    Ok(())
}

/// Figure 1 from the criterion directory (`$CARGO_TARGET_DIR/criterion`).
pub fn figure(dir: &Path) -> Result<Figure> {
    let mut results = Results::new();
    collect(dir, &mut results)
        .with_context(|| format!("reading criterion results in {}", dir.display()))?;
    let mut fig = Figure::new(
        "1. Message -> Arrow conversion, per core (criterion)",
        "MessageBatchBuilder (all 13 columns), and with a payload schema PayloadDecoder::extend too",
        "the unavoidable work: id + body StringArrays only; arrow-json decoding the bodies only",
    );
    let groups: Vec<String> = {
        let mut g: Vec<String> = results.keys().map(|(g, _)| g.clone()).collect();
        g.dedup();
        g
    };
    for group in groups {
        let get = |f: &str| results.get(&(group.clone(), f.to_string())).copied();
        let pairs = [
            ("plain", "table_rows", "id_body_only"),
            ("payload schema", "table_rows_payload", "arrow_json_only"),
        ];
        for (what, ours, base) in pairs {
            let (Some((o, bytes)), Some((b, _))) = (get(ours), get(base)) else {
                continue;
            };
            let per_s = |ns: f64| MESSAGES / (ns / 1e9);
            fig.rows.push(Row {
                case: format!("{group}, {what}"),
                ours: per_s(o),
                baseline: per_s(b),
                params: Default::default(),
                unit: "msg/s".into(),
                better: Better::Higher,
                target: None,
            });
            fig.note(format!(
                "{group}, {what}: ours {:.0} MB/s, baseline {:.0} MB/s of bodies",
                bytes / o * 1e3,
                bytes / b * 1e3
            ));
        }
    }
    fig.note(
        "`NB_Mrows`: N-byte bodies in record batches of M rows (the server builds one batch \
         per ReceiveMessage, so 10). The issue sets no target for this figure.",
    );
    Ok(fig)
}
