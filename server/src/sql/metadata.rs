//! The results of Flight SQL's metadata calls (GetCatalogs, GetDbSchemas,
//! GetTables, GetTableTypes, GetSqlInfo), built off the async runtime.
//!
//! arrow-flight's builders do work that grows with the command: a LIKE
//! pattern with wildcards becomes a regular expression (a 3.8 MiB
//! `table_name_filter_pattern` compiled for 8.7 s and took 2.7 GiB, while
//! another client's call on the same runtime waited), and each table type
//! or info id asked for is compared with every row. So:
//!
//! - a filter pattern is at most [`MAX_CATALOG_PATTERN_BYTES`], refused
//!   with INVALID_ARGUMENT before anything is compiled ([`check_tables`],
//!   [`check_schemas`]), at GetFlightInfo and at DoGet;
//! - table types and info ids are reduced to the few the server has
//!   before the builder sees them;
//! - every result is built on tokio's blocking pool, at most
//!   [`METADATA_BUILDS`] at once ([`Builds`]), never on a thread that
//!   serves calls.

use std::sync::Arc;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_flight::sql::metadata::SqlInfoData;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTables};
use arrow_schema::SchemaRef;
use tokio::sync::Semaphore;
use tonic::Status;

use super::{CATALOG, SCHEMA, TABLE_TYPE};
use crate::config::sql::show_bytes;

/// Longest LIKE pattern a catalog call may filter with (GetTables'
/// `db_schema_filter_pattern` and `table_name_filter_pattern`,
/// GetDbSchemas' `db_schema_filter_pattern`), in bytes: far longer than
/// any table name, short enough that the heaviest pattern (`%_` repeated)
/// compiles in about 50 ms in a debug build.
pub const MAX_CATALOG_PATTERN_BYTES: usize = 1024;
/// Metadata results built at once, all clients together; more wait their
/// turn (within the cap above, one takes at most about 100 ms in a debug
/// build: GetTables with two of the heaviest patterns).
pub(crate) const METADATA_BUILDS: usize = 2;

/// INVALID_ARGUMENT if `pattern` is longer than
/// [`MAX_CATALOG_PATTERN_BYTES`].
fn check_pattern(call: &str, field: &str, pattern: Option<&String>) -> Result<(), Status> {
    let Some(pattern) = pattern else {
        return Ok(());
    };
    if pattern.len() <= MAX_CATALOG_PATTERN_BYTES {
        return Ok(());
    }
    Err(crate::error::invalid_argument(format!(
        "{call}'s {field} is {} bytes, over the {} a catalog filter pattern may have \
         (MAX_CATALOG_PATTERN_BYTES, a fixed limit)",
        pattern.len(),
        show_bytes(MAX_CATALOG_PATTERN_BYTES as u64)
    )))
}

/// GetTables' patterns within [`MAX_CATALOG_PATTERN_BYTES`].
pub(crate) fn check_tables(query: &CommandGetTables) -> Result<(), Status> {
    let schema = query.db_schema_filter_pattern.as_ref();
    check_pattern("GetTables", "db_schema_filter_pattern", schema)?;
    let table = query.table_name_filter_pattern.as_ref();
    check_pattern("GetTables", "table_name_filter_pattern", table)
}

/// GetDbSchemas' pattern within [`MAX_CATALOG_PATTERN_BYTES`].
pub(crate) fn check_schemas(query: &CommandGetDbSchemas) -> Result<(), Status> {
    let schema = query.db_schema_filter_pattern.as_ref();
    check_pattern("GetDbSchemas", "db_schema_filter_pattern", schema)
}

/// Runs metadata builds on tokio's blocking pool, [`METADATA_BUILDS`] at
/// a time.
pub(crate) struct Builds {
    slots: Arc<Semaphore>,
}

impl Default for Builds {
    fn default() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(METADATA_BUILDS)),
        }
    }
}

impl Builds {
    /// The batch `build` makes, made on the blocking pool once a slot is
    /// free; the slot is held until `build` returns, even when the caller
    /// has gone.
    pub(crate) async fn run<F>(&self, build: F) -> Result<RecordBatch, Status>
    where
        F: FnOnce() -> Result<RecordBatch, String> + Send + 'static,
    {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| crate::error::internal("the metadata builds are closed"))?;
        let built = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            build()
        })
        .await
        .map_err(|e| crate::error::internal(format!("building a metadata result: {e}")))?;
        built.map_err(|e| crate::error::internal(format!("building a metadata result: {e}")))
    }
}

/// GetTables' result over `tables` (name and schema). The only table
/// type is [`TABLE_TYPE`], so a list of types keeps every table or none,
/// decided here: arrow-flight's builder would compare every type listed
/// (a command may list millions) with every row.
pub(crate) fn tables(
    mut query: CommandGetTables,
    mut tables: Vec<(String, SchemaRef)>,
) -> Result<RecordBatch, String> {
    let types = std::mem::take(&mut query.table_types);
    if !types.is_empty() && !types.iter().any(|t| t == TABLE_TYPE) {
        tables.clear();
    }
    tables.sort_by(|a, b| a.0.cmp(&b.0));
    let mut b = query.into_builder();
    for (name, schema) in tables {
        b.append(CATALOG, SCHEMA, name, TABLE_TYPE, schema.as_ref())
            .map_err(|e| format!("listing tables: {e}"))?;
    }
    b.build().map_err(|e| e.to_string())
}

/// GetDbSchemas' result: the one schema, if the filters keep it.
pub(crate) fn schemas(query: CommandGetDbSchemas) -> Result<RecordBatch, String> {
    let mut b = query.into_builder();
    b.append(CATALOG, SCHEMA);
    b.build().map_err(|e| e.to_string())
}

/// GetSqlInfo's result: the infos asked for among those of `info` (ids
/// the server does not know, and repeats, are dropped before arrow-flight
/// compares each id asked for with every row), or all of them.
pub(crate) fn sql_info(
    mut query: CommandGetSqlInfo,
    info: &SqlInfoData,
) -> Result<RecordBatch, String> {
    if query.info.is_empty() {
        return query.into_builder(info).build().map_err(|e| e.to_string());
    }
    let all = info.record_batch([]).map_err(|e| e.to_string())?;
    let known = known_ids(&all);
    query.info.retain(|id| known.contains(id));
    query.info.sort_unstable();
    query.info.dedup();
    if query.info.is_empty() {
        return Ok(RecordBatch::new_empty(all.schema()));
    }
    query.into_builder(info).build().map_err(|e| e.to_string())
}

/// The info ids of a GetSqlInfo result (its first column).
fn known_ids(all: &RecordBatch) -> Vec<u32> {
    all.column(0)
        .as_any()
        .downcast_ref::<UInt32Array>()
        .map(|ids| ids.values().to_vec())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_over_the_cap_is_refused_naming_it_and_one_at_the_cap_is_not() {
        let at = "%".repeat(MAX_CATALOG_PATTERN_BYTES);
        let query = CommandGetTables {
            table_name_filter_pattern: Some(at.clone()),
            ..Default::default()
        };
        assert!(check_tables(&query).is_ok());
        let over = CommandGetTables {
            db_schema_filter_pattern: Some(format!("{at}_")),
            ..Default::default()
        };
        let refused = check_tables(&over).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            refused
                .message()
                .contains("db_schema_filter_pattern is 1025 bytes")
                && refused.message().contains("MAX_CATALOG_PATTERN_BYTES")
                && refused.message().contains("1.0 KiB"),
            "{}",
            refused.message()
        );
        let schemas = CommandGetDbSchemas {
            db_schema_filter_pattern: Some(format!("{at}_")),
            ..Default::default()
        };
        assert_eq!(
            check_schemas(&schemas).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn table_types_keep_every_table_or_none() {
        let schema: SchemaRef = Arc::new(arrow_schema::Schema::empty());
        let list = vec![("b".into(), Arc::clone(&schema)), ("a".into(), schema)];
        let rows = |types: Vec<&str>| {
            let query = CommandGetTables {
                table_types: types.into_iter().map(String::from).collect(),
                ..Default::default()
            };
            tables(query, list.clone()).unwrap().num_rows()
        };
        assert_eq!(rows(vec![]), 2);
        assert_eq!(rows(vec!["VIEW", "TABLE"]), 2);
        assert_eq!(rows(vec!["VIEW"; 100_000]), 0);
    }

    #[test]
    fn sql_info_keeps_the_known_ids_asked_for() {
        let info = super::super::sql_info().unwrap();
        let rows = |ids: Vec<u32>| {
            let query = CommandGetSqlInfo { info: ids };
            sql_info(query, &info).unwrap().num_rows()
        };
        assert_eq!(rows(vec![]), 11);
        assert_eq!(rows(vec![0, 0, 1, 999_999]), 2);
        assert_eq!(rows(vec![999_999; 100_000]), 0);
    }
}
