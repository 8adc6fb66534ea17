//! DoAction: `commit`, `release` and `status`, each a JSON body in and out.

use std::collections::BTreeMap;

use arrow_flight::Action;
use bytes::Bytes;
use serde::Serialize;
use sqs_flight_schemas::{CommitCommand, ReleaseCommand, StatusCommand};

use crate::error::{Error, Result};
use crate::registry::{ConsumerStatus, Registry};

/// Every action with its one-line description.
pub const ACTIONS: &[(&str, &str)] = &[
    (
        "commit",
        "{\"table\",\"consumer\",\"batch\"}: delete every message of the consumer's batches <= batch",
    ),
    (
        "release",
        "{\"table\",\"consumer\"}: make the consumer's uncommitted messages visible now and forget its open batches",
    ),
    (
        "status",
        "{} or {\"table\"}: queue depth, in-flight counts and each consumer's batches",
    ),
];

#[derive(Serialize)]
struct TableStatus {
    approximate_depth: u64,
    approximate_in_flight: u64,
    consumers: BTreeMap<String, ConsumerStatus>,
}

#[derive(Serialize)]
struct Status {
    tables: BTreeMap<String, TableStatus>,
}

fn to_json<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("plain structs serialize"))
}

/// Runs one action and returns its JSON answer.
pub async fn do_action(registry: &Registry, action: Action) -> Result<Bytes> {
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
            Ok(to_json(&status(registry, cmd).await?))
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

async fn status(registry: &Registry, cmd: StatusCommand) -> Result<Status> {
    let tables = match &cmd.table {
        Some(name) => vec![registry.table(name)?],
        None => registry.tables().collect(),
    };
    let mut out = BTreeMap::new();
    for t in tables {
        let attrs = t
            .queue
            .attributes()
            .await
            .map_err(|e| Error::sqs(t.name(), e))?;
        out.insert(
            t.name().to_string(),
            TableStatus {
                approximate_depth: attrs.visible,
                approximate_in_flight: attrs.in_flight,
                consumers: registry.consumer_status(t.name()),
            },
        );
    }
    Ok(Status { tables: out })
}
