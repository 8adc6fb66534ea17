//! The DataFusion session a SQL worker process runs its statement in: the
//! queue tables (each a [`remote::RemoteTable`]), the JSON functions,
//! `peek`, a capped memory pool, no spill files, no recursive CTEs, and
//! none of the functions that make rows (or huge arrays) out of nothing.
//!
//! The refusals here are a courtesy (a clear message instead of a worker
//! that runs out of memory); what keeps the server safe is that the session
//! lives in a process of its own ([`super::child`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result as DfResult, plan_err};
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;

use super::remote::{self, Peeker};
use super::{CATALOG, SCHEMA};
use crate::error::Error;

/// Scalar functions removed: each builds an array as long as its argument
/// says (`range(10000000000)`), memory no pool accounts for.
const REFUSED_SCALAR_FUNCTIONS: [&str; 4] =
    ["range", "generate_series", "array_repeat", "list_repeat"];

/// A session over `tables` whose operators share a pool of `memory_limit`
/// bytes, on `threads` partitions; scans ask `peeker` for their rows.
pub(crate) fn context(
    tables: &HashMap<String, SchemaRef>,
    peeker: &Arc<Peeker>,
    memory_limit: u64,
    threads: usize,
) -> Result<SessionContext, Error> {
    let mut session = SessionConfig::new()
        .with_default_catalog_and_schema(CATALOG, SCHEMA)
        .with_create_default_catalog_and_schema(true)
        .with_information_schema(false)
        .with_target_partitions(threads.max(1));
    // `WITH RECURSIVE` makes rows out of nothing until a limit stops it.
    session.options_mut().execution.enable_recursive_ctes = false;
    let pool_bytes = usize::try_from(memory_limit).unwrap_or(usize::MAX);
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(pool_bytes, 1.0)
        // Nothing spills to disk: a query that needs more than the pool
        // fails with RESOURCE_EXHAUSTED instead of filling the disk.
        .with_disk_manager_builder(
            DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
        )
        .build_arc()
        .map_err(|e| Error::Internal(format!("building the SQL runtime environment: {e}")))?;
    let mut ctx = SessionContext::new_with_config_rt(session, runtime);
    datafusion_functions_json::register_all(&mut ctx)
        .map_err(|e| Error::Internal(format!("registering the JSON functions: {e}")))?;
    refuse_generators(&ctx);
    let peek = remote::PeekFunction {
        tables: tables.clone(),
        peeker: Arc::clone(peeker),
    };
    ctx.register_udtf("peek", Arc::new(peek));
    for (name, schema) in tables {
        let provider = remote::RemoteTable::new(name, Arc::clone(schema), Arc::clone(peeker));
        ctx.register_table(name, Arc::new(provider))
            .map_err(|e| Error::Internal(format!("registering table {name}: {e}")))?;
    }
    Ok(ctx)
}

/// Replaces DataFusion's table functions (`range`, `generate_series`: rows
/// without end) with a refusal that says why, and removes the scalar
/// functions of [`REFUSED_SCALAR_FUNCTIONS`].
fn refuse_generators(ctx: &SessionContext) {
    let names: Vec<String> = ctx.state().table_functions().keys().cloned().collect();
    for name in names {
        ctx.deregister_udtf(&name);
        ctx.register_udtf(&name, Arc::new(Refused(name.clone())));
    }
    for name in REFUSED_SCALAR_FUNCTIONS {
        ctx.deregister_udf(name);
    }
}

/// A table function that is refused when a query names it.
#[derive(Debug)]
struct Refused(String);

impl TableFunctionImpl for Refused {
    fn call_with_args(&self, _args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        plan_err!(
            "the table function {}() is not available: sqs-flight's SQL reads queue tables \
             only and makes no rows of its own (use VALUES for a few constant rows)",
            self.0
        )
    }
}
