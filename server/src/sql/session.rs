//! The DataFusion session Flight SQL queries run in: the queue tables, the
//! JSON functions, `peek`, a capped memory pool, no spill files, and none
//! of the functions that make rows (or huge arrays) out of nothing.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result as DfResult, plan_err};
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::peek;
use super::{CATALOG, SCHEMA};
use crate::config::sql::SqlConfig;
use crate::error::Error;
use crate::registry::Registry;

/// Scalar functions removed: each builds an array as long as its argument
/// says (`range(10000000000)`), memory no pool accounts for.
const REFUSED_SCALAR_FUNCTIONS: [&str; 4] =
    ["range", "generate_series", "array_repeat", "list_repeat"];

/// A session over `registry`'s tables whose operators share a pool of
/// `config.memory_limit` bytes. `io` is the server's runtime, where peeks
/// make their SQS calls.
pub fn context(
    registry: &Arc<Registry>,
    shutdown: &CancellationToken,
    config: &SqlConfig,
    io: &Handle,
) -> Result<SessionContext, Error> {
    let session = SessionConfig::new()
        .with_default_catalog_and_schema(CATALOG, SCHEMA)
        .with_create_default_catalog_and_schema(true)
        .with_information_schema(false)
        .with_target_partitions(config.threads);
    let pool_bytes = usize::try_from(config.memory_limit).unwrap_or(usize::MAX);
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
    ctx.register_udtf(
        "peek",
        Arc::new(peek::PeekFunction {
            registry: Arc::clone(registry),
            shutdown: shutdown.clone(),
            io: io.clone(),
        }),
    );
    for table in registry.tables() {
        let provider = peek::PeekTable::new(
            Arc::clone(registry),
            table.name(),
            shutdown.clone(),
            io.clone(),
        )?;
        ctx.register_table(table.name(), Arc::new(provider))
            .map_err(|e| Error::Internal(format!("registering table {}: {e}", table.name())))?;
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
