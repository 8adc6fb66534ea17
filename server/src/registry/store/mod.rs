//! The durable registry (`--state-dir`): every planned batch, every received
//! chunk of rows with its receipts, every seal and every watermark, written
//! to a [redb](https://www.redb.org) database before the server acts on it.
//!
//! # What is written when
//!
//! - plan: the batch (plan id and parameters) before GetFlightInfo answers;
//! - receive: each chunk (rows as Arrow IPC, receipts, visibility deadline)
//!   before a reader can stream its rows;
//! - seal: a marker when a ticket's receive ends, so a ticket that ended
//!   empty stays empty after a restart;
//! - commit: the new watermark, the committed batches removed and their
//!   receipts moved to the consumer's pending deletes (a rejected message's
//!   to its pending rejects instead), in one transaction, before
//!   `DeleteMessageBatch`; both lists are rewritten after the calls;
//! - release and lease expiry: the open batches removed.
//!
//! Every write is one redb transaction with `Durability::Immediate`: it is on
//! disk when the call returns, so `kill -9` (or a power cut) loses nothing the
//! server has acted on.
//!
//! # Plans
//!
//! A batch number can be planned again once its plan was released (or its
//! consumer's lease expired), and a receive of the released plan may still
//! be finishing. So chunks and seals carry the plan id of their ticket, and
//! a chunk or seal is written only if its batch is stored with that plan
//! (else it is dropped: the ticket is closed, and the receive hands its
//! messages back). At load, chunks and seals of another plan are dropped
//! too.
//!
//! # Format version
//!
//! The store records the version of its format ([`FORMAT_VERSION`]) when
//! it is created; a server refuses at start a store of a version it does
//! not know, naming both, rather than misread it.
//!
//! # Layout
//!
//! Keys start with the consumer: `u32 len, table, u32 len, consumer`, then
//! big-endian `u64`s (batch, partition, chunk sequence), so one consumer's
//! batches sort together and in order. Values are JSON, except chunk rows,
//! which are an Arrow IPC stream.
//!
//! # Code
//!
//! `keys` builds and splits the keys, `write` applies each [`Op`] (and runs
//! the group-commit writer thread, [`apply`]), `load` reads everything back
//! at start ([`Store::load`], [`Store::load_committed`]).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_ipc::writer::IpcWriteOptions;
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sqs_flight_schemas::TicketId;

mod keys;
mod load;
mod snapshot;
mod write;

#[cfg(test)]
mod tests;

pub(crate) use self::write::{apply, stopped, submit};
use super::packed::{read_ipc, write_ipc};
use crate::config::PlanParams;
use crate::error::{Error, Result};

const CONSUMERS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("consumers");
const BATCHES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("batches");
const CHUNK_META: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunk_meta");
const CHUNK_ROWS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunk_rows");
const SEALED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("sealed");
/// The ids commits deleted, per table until they leave the window: keys
/// `(table, "", [until_ms, id high, id low])`, empty values, so that a
/// table's expired ids are one range.
const COMMITTED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("committed_ids");

/// The store's format version, under the key [`FORMAT_KEY`].
const FORMAT: TableDefinition<&str, u64> = TableDefinition::new("format");
const FORMAT_KEY: &str = "version";

/// The version of the store's format this server writes, and the only one
/// it reads.
pub(crate) const FORMAT_VERSION: u64 = 1;

/// The file inside the state directory.
pub(crate) const FILE_NAME: &str = "registry.redb";

/// A consumer's watermarks, the receipts its commits still have to delete,
/// and the messages a commit rejected whose give-back may not have
/// happened yet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredConsumer {
    pub committed: Option<u64>,
    pub last_planned: Option<u64>,
    pub pending_delete: Vec<String>,
    /// Absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_reject: Vec<StoredReject>,
}

/// The messages one commit rejected: never deleted; given back to SQS,
/// hidden for `delay_seconds`, by the commit, or after a restart by the
/// server that finds them here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredReject {
    pub delay_seconds: u32,
    pub receipts: Vec<String>,
    /// A batch a previous process received ahead, given back at the start
    /// this way (see `build.rs`): no reject, so not counted as one.
    /// Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_ahead: bool,
}

/// Makes [`StoredBatch`]: its plan and the plan parameters of
/// `plan_params!`.
macro_rules! stored_batch {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident {
                default: $default_name:ident = $default:expr,
                limit: $limit_name:ident = $limit:expr,
                zero: $zero:literal,
                limit_flag: $flag:literal, $env:literal, $value_name:literal {
                    $(#[doc = $flag_doc:literal])*
                },
                spark: $spark:literal,
                client: $client:ident: $client_ty:ty,
                cli: [$({ $(#[doc = $cli_doc:literal])* })?],
            }
        )*
    ) => {
        /// A planned batch.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub(crate) struct StoredBatch {
            pub(crate) plan: u64,
            /// Planned by read-ahead, not by the consumer yet (see
            /// `registry::ahead`): a restart hands its messages back.
            #[serde(default, skip_serializing_if = "std::ops::Not::not")]
            pub(crate) ahead: bool,
            $( pub(crate) $name: u64, )*
        }

        impl StoredBatch {
            pub(crate) fn new(plan: u64, p: PlanParams) -> Self {
                Self {
                    plan,
                    ahead: false,
                    $( $name: p.$name, )*
                }
            }

            /// The same batch, planned by read-ahead (`true`) or by its consumer.
            pub(crate) fn with_ahead(self, ahead: bool) -> Self {
                Self { ahead, ..self }
            }

            pub(crate) fn params(&self) -> PlanParams {
                PlanParams {
                    $( $name: self.$name, )*
                }
            }
        }
    };
}

sqs_flight_schemas::plan_params!(stored_batch);

/// The receipts of one receive and their visibility deadline (Unix ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChunkMeta {
    pub receipts: Vec<String>,
    pub visible_until_ms: u64,
    pub bytes: u64,
    /// The plan of the ticket that received it; set by the store from the
    /// ticket id.
    pub plan: u64,
    /// The S3 objects its large payloads were read from, by offset in the
    /// receive (`delete_after_commit` only). Absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<(u32, crate::large_payload::S3Object)>,
}

/// The value of a seal: the plan of the ticket sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct StoredSeal {
    plan: u64,
}

/// One change to the store.
#[derive(Debug)]
pub(crate) enum Op {
    Consumer {
        table: String,
        consumer: String,
        state: StoredConsumer,
    },
    Batch {
        table: String,
        consumer: String,
        batch: u64,
        stored: StoredBatch,
    },
    /// Written only while the ticket's plan is the batch's stored plan.
    Chunk {
        id: TicketId,
        seq: u64,
        meta: ChunkMeta,
        rows: Vec<u8>,
    },
    /// Written only while the ticket's plan is the batch's stored plan.
    Seal { id: TicketId },
    /// A consumer with everything stored under it (a consumer forgotten:
    /// released before it committed, or idle and making room).
    DropConsumer { table: String, consumer: String },
    /// Row `offset` of chunk `seq` took the receipt of a later receive of
    /// the same message (see `registry::dedup`). Written only while the
    /// ticket's plan is the batch's stored plan.
    Renew {
        id: TicketId,
        seq: u64,
        offset: u32,
        receipt: String,
    },
    /// Message ids (`registry::dedup::Key`s) a commit of `table` deleted,
    /// remembered until `until_ms` (Unix ms). Each write also drops the
    /// table's ids whose time has passed.
    Committed {
        table: String,
        until_ms: u64,
        keys: Vec<u128>,
    },
    /// A batch with its chunks and seals.
    Forget {
        table: String,
        consumer: String,
        batch: u64,
    },
}

impl Op {
    /// The change's name, for logs (its fields may hold receipts).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Consumer { .. } => "consumer",
            Self::Batch { .. } => "batch",
            Self::Chunk { .. } => "chunk",
            Self::Seal { .. } => "seal",
            Self::DropConsumer { .. } => "drop_consumer",
            Self::Renew { .. } => "renew",
            Self::Committed { .. } => "committed",
            Self::Forget { .. } => "forget",
        }
    }
}

/// One ticket as stored.
#[derive(Debug, Default)]
pub(crate) struct LoadedTicket {
    pub sealed: bool,
    pub chunks: Vec<(RecordBatch, ChunkMeta)>,
}

/// One batch as stored.
#[derive(Debug)]
pub(crate) struct LoadedBatch {
    pub batch: u64,
    pub stored: StoredBatch,
    pub tickets: Vec<LoadedTicket>,
}

/// One consumer as stored.
#[derive(Debug)]
pub(crate) struct LoadedConsumer {
    pub table: String,
    pub consumer: String,
    pub state: StoredConsumer,
    pub batches: Vec<LoadedBatch>,
}

/// The crash-safe store of one server.
pub(crate) struct Store {
    db: Database,
    path: PathBuf,
    /// The group-commit writer thread's queue, started on first use.
    writer: std::sync::OnceLock<std::sync::mpsc::Sender<Job>>,
    /// Unit tests: every write fails while set (a full disk, say).
    #[cfg(test)]
    pub(crate) fail_writes: std::sync::atomic::AtomicBool,
    /// Unit tests: held, it stops the writer thread before its next write.
    #[cfg(test)]
    pub(crate) write_gate: std::sync::Mutex<()>,
    /// Unit tests: the writes made so far, and the first that fails.
    #[cfg(test)]
    pub(crate) writes: std::sync::atomic::AtomicU64,
    #[cfg(test)]
    pub(crate) fail_from_write: std::sync::atomic::AtomicU64,
    /// `--state-url`: every write goes to the state log first.
    replica: std::sync::OnceLock<crate::state_log::replica::Replica>,
    /// A directory of its own, removed with the store (`--state-url`
    /// without `--state-dir`); declared last, so dropped after `db`.
    _scratch: Option<Scratch>,
}

/// A private directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Ops waiting for the writer thread, and who waits for them.
type Job = (Vec<Op>, tokio::sync::oneshot::Sender<Result<()>>);

fn store_error(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("state store {}: {what}: {e}", path.display()))
}

/// The database in `dir`, checked and made private (see [`Store::open`]).
fn open_db(dir: &Path) -> Result<(Database, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let refused = |e: crate::secure_path::PathError| Error::Internal(e.to_string());
    let dir = crate::secure_path::private_dir(dir).map_err(refused)?;
    // Owner-only, as before the checks: they refuse only what others can write.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| store_error(&dir, "cannot make the directory private", e))?;
    let path = dir.join(FILE_NAME);
    let file = crate::secure_path::open_private(&path).map_err(refused)?;
    let backend =
        redb::backends::FileBackend::new(file).map_err(|e| store_error(&path, "cannot open", e))?;
    let db = Database::builder()
        .create_with_backend(backend)
        .map_err(|e| store_error(&path, "cannot open", e))?;
    Ok((db, path))
}

/// The rows of one receive as an Arrow IPC stream.
pub(crate) fn encode_rows(batch: &RecordBatch) -> Result<Vec<u8>> {
    write_ipc(batch, IpcWriteOptions::default())
        .map_err(|e| Error::Internal(format!("encoding rows: {e}")))
}

fn decode_rows(bytes: &[u8]) -> std::result::Result<RecordBatch, String> {
    read_ipc(bytes).map_err(|e| e.to_string())
}

impl Store {
    /// Opens (or creates) the store in `dir`: it holds receipt handles, so
    /// the directory is checked (this user's, not writable by others, nor
    /// any directory above it: see [`crate::secure_path`]) and made `0700`,
    /// and the file is `0600`.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let (db, path) = open_db(dir)?;
        let store = Self {
            db,
            path,
            writer: std::sync::OnceLock::new(),
            #[cfg(test)]
            fail_writes: Default::default(),
            #[cfg(test)]
            write_gate: Default::default(),
            #[cfg(test)]
            writes: Default::default(),
            #[cfg(test)]
            fail_from_write: std::sync::atomic::AtomicU64::new(u64::MAX),
            replica: std::sync::OnceLock::new(),
            _scratch: None,
        };
        store.check_format()?;
        // Create every table, so that reads never meet a missing one.
        store.write(&[])?;
        Ok(store)
    }

    /// A store in a new private directory under the system's temporary
    /// directory, removed with the store: the local copy of a state log
    /// when there is no `--state-dir`.
    pub(crate) fn open_scratch() -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("sqsf-state-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| store_error(&dir, "cannot make a private directory", e))?;
        let guard = Scratch(dir.clone());
        let mut store = Self::open(&dir)?;
        store._scratch = Some(guard);
        Ok(store)
    }

    /// From now on, every write goes to `replica` before the store.
    pub(crate) fn attach(&self, replica: crate::state_log::replica::Replica) {
        if self.replica.set(replica).is_err() {
            unreachable!("a store's state log is attached once");
        }
    }

    /// The state log, with `--state-url`.
    pub(crate) fn replica(&self) -> Option<&crate::state_log::replica::Replica> {
        self.replica.get()
    }

    /// Refuses a store of another format version than [`FORMAT_VERSION`];
    /// records the version in a store that holds none (a new one).
    fn check_format(&self) -> Result<()> {
        let txn = self.db.begin_write().map_err(self.fail("begin"))?;
        {
            let mut format = txn.open_table(FORMAT).map_err(self.fail("open table"))?;
            let found = format
                .get(FORMAT_KEY)
                .map_err(self.fail("read"))?
                .map(|v| v.value());
            match found {
                Some(FORMAT_VERSION) => {}
                Some(found) => {
                    return Err(store_error(
                        &self.path,
                        "unknown format",
                        format!(
                            "the store is format version {found}, and this server reads \
                             version {FORMAT_VERSION} only: start it with the server that \
                             wrote the store, or with another --state-dir"
                        ),
                    ));
                }
                None => {
                    format
                        .insert(FORMAT_KEY, FORMAT_VERSION)
                        .map_err(self.fail("insert"))?;
                }
            }
        }
        txn.commit().map_err(self.fail("commit"))
    }

    /// Gives the file's free pages back to the file system. The file keeps
    /// its high-water size while the server runs (rows of open batches come
    /// and go); at start, before anything else uses the store, it shrinks to
    /// what is held. A failure is logged: the store still works.
    pub(crate) fn compact(&mut self) {
        let size = || std::fs::metadata(&self.path).map_or(0, |m| m.len());
        let before = size();
        match self.db.compact() {
            Ok(_) => {
                let after = size();
                if after < before {
                    tracing::info!(path = %self.path.display(), before, after, "state store compacted");
                }
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not compact the state store; it keeps its size");
            }
        }
    }

    /// The error for an entry that does not parse (`what` names it).
    fn corrupt(&self, what: &str) -> Error {
        store_error(&self.path, "corrupt entry", what)
    }

    /// A `map_err` mapping for a redb error while doing `what`.
    fn fail<E: std::fmt::Display>(&self, what: &'static str) -> impl FnOnce(E) -> Error + '_ {
        move |e| store_error(&self.path, what, e)
    }

    /// Where the database file is.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}
