//! What the test suites and the benches reach inside the server beyond its
//! API (`Config`, `server`, `registry::Registry`, the `sqs` backends):
//! DoPut's row conversion and its IPC bounds, for their property tests; the
//! DoGet encoder, for the benches; the limits and intervals the tests size
//! their calls and waits by; the `--tls-self-signed` certificate's hosts
//! and expiry; and the state a process that stopped at a bad moment leaves
//! in `--state-dir`, for the restart tests. The rest of the crate is its
//! own; tests never write the store's records themselves.

use std::path::Path;
use std::sync::Arc;

pub use crate::flight::do_get::encoder;
pub use crate::flight::do_put::CatchPanic;
pub use crate::flight::ipc_bounds::IpcBounds;
pub use crate::http::{DEPTH_POLL_INTERVAL, READY_CHECK_INTERVAL};
pub use crate::server::incoming::{NARROW_CALLS_PER_CONNECTION, ROOMY_CONNECTIONS};
pub use crate::sql::metadata::MAX_CATALOG_PATTERN_BYTES;
pub use crate::tls_self_signed::{hosts_for, not_after};
pub use crate::write::{WriteError, rows};

use crate::registry::store::{self, Op, Store, StoredConsumer, StoredReject};

/// Leaves in the `--state-dir` store at `state_dir` what a server leaves
/// when it stops between a commit's write and its give-back: consumer
/// `consumer` of `table` committed up to `committed`, and rejected the
/// messages of `receipts` (hidden for 0 s once given back), not yet given
/// back. A server started on `state_dir` gives them back at its start.
pub async fn journal_rejects_not_given_back(
    state_dir: &Path,
    table: &str,
    consumer: &str,
    committed: u64,
    receipts: Vec<String>,
) -> crate::error::Result<()> {
    let store = Arc::new(Store::open(state_dir)?);
    let state = StoredConsumer {
        committed: Some(committed),
        last_planned: Some(committed),
        pending_delete: Vec::new(),
        pending_reject: vec![StoredReject {
            delay_seconds: 0,
            receipts,
            read_ahead: false,
        }],
    };
    let op = Op::Consumer {
        table: table.into(),
        consumer: consumer.into(),
        state,
    };
    store::apply(&store, vec![op]).await
}
