//! `sql`: one query over every table of the server, then commit or release
//! what it read.

use std::sync::Arc;

use crate::datafusion::{SqsFlightTable, client_error, register_all_tables, session_context};
use crate::{Client, Error};
use arrow_array::RecordBatch;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use super::args::SqlArgs;
use super::exit::CliError;
use super::output::Output;
use super::{Say, plural};

pub async fn run(client: &Client, args: SqlArgs, say: &Say) -> Result<(), CliError> {
    let ctx = session_context().map_err(|e| query_error(&e))?;
    let tables = register_all_tables(&ctx, client, &args.batching.options()).await?;
    let names: Vec<&str> = tables.iter().map(|t| t.table()).collect();
    let result = tokio::select! {
        r = query(&ctx, &args.query, &names) => r,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    let written = match result {
        Ok(batches) => Output::new(args.format).write(&batches).await,
        Err(e) => Err(e),
    };
    let commit = written.is_ok() && args.acknowledge.commit;
    let acknowledged = acknowledge(&tables, commit, say).await;
    written.and(acknowledged)
}

async fn query(
    ctx: &SessionContext,
    sql: &str,
    tables: &[&str],
) -> Result<Vec<RecordBatch>, CliError> {
    let frame = ctx.sql(sql).await.map_err(|e| match unknown_table(&e) {
        Some(name) => not_found(name, tables),
        None => query_error(&e),
    })?;
    frame.collect().await.map_err(|e| query_error(&e))
}

/// The table a query names that the server does not serve, from
/// DataFusion's `table 'datafusion.public.NAME' not found`.
fn unknown_table(e: &DataFusionError) -> Option<&str> {
    let DataFusionError::Plan(message) = e.find_root() else {
        return None;
    };
    let reference = message
        .strip_prefix("table '")?
        .strip_suffix("' not found")?;
    Some(reference.rsplit('.').next().unwrap_or(reference))
}

/// The answer `tail` gets from the server for an unknown table: the same
/// message, exit status and hint.
fn not_found(name: &str, tables: &[&str]) -> CliError {
    CliError::Client(Error::NotFound {
        message: format!(
            "unknown table {name:?} (known tables: {})",
            tables.join(", ")
        ),
        reason: Some(crate::Reason::UnknownTable),
    })
}

/// A failed Flight call keeps its own exit status; a query that does not
/// parse or plan is a usage error; anything else failed while running.
fn query_error(e: &DataFusionError) -> CliError {
    if let Some(client) = client_error(e) {
        return CliError::Client(client.clone());
    }
    match e.find_root() {
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => {
            CliError::Usage(format!("the query: {}", e.find_root()))
        }
        _ => CliError::Query(e.to_string()),
    }
}

/// Commits (or releases) the batch each table read. Every table is tried;
/// the first failure is returned.
async fn acknowledge(
    tables: &[Arc<SqsFlightTable>],
    commit: bool,
    say: &Say,
) -> Result<(), CliError> {
    let mut first_error = None;
    for t in tables {
        let Some(batch) = t.batch().await else {
            continue;
        };
        let outcome = if commit {
            t.commit().await.map(|c| {
                c.map(|c| {
                    format!(
                        "committed batch {batch} of table {}: {} deleted",
                        t.table(),
                        c.deleted
                    )
                })
            })
        } else {
            t.release().await.map(|r| {
                r.map(|r| {
                    format!(
                        "released {} of table {} back to the queue",
                        plural(r.released, "message"),
                        t.table()
                    )
                })
            })
        };
        match outcome {
            Ok(Some(line)) => say.line(line),
            Ok(None) => {}
            Err(e) => {
                say.line(format_args!("warning: table {}: {e}", t.table()));
                first_error.get_or_insert(CliError::Client(e));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}
