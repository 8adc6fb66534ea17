//! DoAction: `commit`, `release`, `status` and `server_info`, each a JSON
//! body in and out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::Action;
use bytes::Bytes;
use serde::Serialize;
use sqs_flight_schemas::{CommitCommand, ReleaseCommand, StatusCommand};

use crate::error::{Error, Result};
use crate::flight::attributes_cache::AttributesCache;
use crate::instance::Instance;
use crate::registry::dedup::Dropped;
use crate::registry::{ConsumerStatus, Registry};

/// Every action with its one-line description.
pub(crate) const ACTIONS: &[(&str, &str)] = &[
    (
        "commit",
        "{\"table\",\"consumer\",\"batch\"} and optionally \"reject\" (message ids), \"reject_delay_seconds\", \"reject_payload_errors\": delete every message of the consumer's batches <= batch but the rejected ones, which go back to SQS",
    ),
    (
        "release",
        "{\"table\",\"consumer\"}: make the consumer's uncommitted messages visible now and forget its open batches",
    ),
    (
        "status",
        "{} or {\"table\"}, optionally \"max_age_ms\" (queue counts that old or less are answered again without an SQS call): queue depth, in-flight counts and each consumer's batches",
    ),
    (
        "server_info",
        "{}: this process's instance id, pid, version, start time and tables, without any SQS call (a liveness check)",
    ),
];

#[derive(Serialize)]
struct TableStatus {
    /// `None` when the queue's counts could not be read: only in the
    /// answer for every table, beside `error` (a status of one table fails).
    approximate_depth: Option<u64>,
    approximate_in_flight: Option<u64>,
    /// Why the queue's counts are missing (a deleted queue, SQS down), so
    /// that one table's queue does not hide the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    consumers: BTreeMap<String, ConsumerStatus>,
    /// SQS duplicates that added no row since the process started.
    duplicates_dropped: Dropped,
}

/// `server_info`: who answers, from the server alone.
#[derive(Serialize)]
struct ServerInfo<'a> {
    #[serde(flatten)]
    instance: &'a Instance,
    tables: Vec<&'a str>,
}

#[derive(Serialize)]
struct Status {
    tables: BTreeMap<String, TableStatus>,
}

fn to_json<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("plain structs serialize"))
}

/// Runs one action and returns its JSON answer; `instance` is the
/// identity `server_info` answers, `attributes` the queue counts `status`
/// read last.
pub(crate) async fn do_action(
    registry: &Arc<Registry>,
    instance: &Instance,
    attributes: &AttributesCache,
    action: Action,
) -> Result<Bytes> {
    match action.r#type.as_str() {
        "commit" => {
            let cmd = CommitCommand::parse(&action.body)?;
            Ok(to_json(&registry.commit(&cmd).await?))
        }
        "release" => {
            let cmd = ReleaseCommand::parse(&action.body)?;
            Ok(to_json(&registry.release(&cmd).await?))
        }
        "status" => {
            let cmd = StatusCommand::parse(&action.body)?;
            Ok(to_json(&status(registry, attributes, cmd).await?))
        }
        "server_info" => {
            empty_body(&action.body)?;
            let tables = registry.tables().map(|t| t.name()).collect();
            Ok(to_json(&ServerInfo { instance, tables }))
        }
        other => Err(Error::InvalidArgument(format!(
            "unknown action type {:?} (known: {})",
            sqs_flight_schemas::json::quote_cut(other),
            ACTIONS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `server_info` takes nothing: an empty body or `{}`.
fn empty_body(body: &[u8]) -> Result<()> {
    if body.is_empty() {
        return Ok(());
    }
    /// The one document `server_info` takes.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Nothing {}
    match serde_json::from_slice::<Nothing>(body) {
        Ok(Nothing {}) => Ok(()),
        Err(_) => Err(Error::InvalidArgument(format!(
            "server_info takes an empty body or {{}}, got {:?}",
            sqs_flight_schemas::json::quote_cut(&String::from_utf8_lossy(body))
        ))),
    }
}

async fn status(
    registry: &Registry,
    attributes: &AttributesCache,
    cmd: StatusCommand,
) -> Result<Status> {
    let tables = match &cmd.table {
        Some(name) => vec![registry.table(name)?],
        None => registry.tables().collect(),
    };
    let max_age = Duration::from_millis(cmd.max_age_ms.unwrap_or(0));
    let mut out = BTreeMap::new();
    for t in tables {
        let attrs = attributes
            .get(t.name(), max_age, || t.attributes())
            .await
            .map_err(|e| Error::sqs(t.name(), e));
        let (counts, error) = match attrs {
            Ok(a) => (Some((a.visible, a.in_flight)), None),
            // Asked for by name, the table's error is the answer.
            Err(e) if cmd.table.is_some() => return Err(e),
            Err(e) => (None, Some(e.to_string())),
        };
        out.insert(
            t.name().to_string(),
            TableStatus {
                approximate_depth: counts.map(|c| c.0),
                approximate_in_flight: counts.map(|c| c.1),
                error,
                consumers: registry.consumer_status(t.name()),
                duplicates_dropped: t.duplicates_dropped(),
            },
        );
    }
    Ok(Status { tables: out })
}
