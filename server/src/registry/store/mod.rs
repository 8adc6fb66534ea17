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

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_ipc::writer::IpcWriteOptions;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use sqs_flight_schemas::TicketId;

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
pub const FORMAT_VERSION: u64 = 1;

/// The file inside the state directory.
pub const FILE_NAME: &str = "registry.redb";

/// A consumer's watermarks, the receipts its commits still have to delete,
/// and the messages a commit rejected whose give-back may not have
/// happened yet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredConsumer {
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
pub struct StoredReject {
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
        pub struct StoredBatch {
            pub plan: u64,
            /// Planned by read-ahead, not by the consumer yet (see
            /// `registry::ahead`): a restart hands its messages back.
            #[serde(default, skip_serializing_if = "std::ops::Not::not")]
            pub ahead: bool,
            $( pub $name: u64, )*
        }

        impl StoredBatch {
            pub fn new(plan: u64, p: PlanParams) -> Self {
                Self {
                    plan,
                    ahead: false,
                    $( $name: p.$name, )*
                }
            }

            /// The same batch, planned by read-ahead (`true`) or by its consumer.
            pub fn with_ahead(self, ahead: bool) -> Self {
                Self { ahead, ..self }
            }

            pub fn params(&self) -> PlanParams {
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
pub struct ChunkMeta {
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
pub enum Op {
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

/// One ticket as stored.
#[derive(Debug, Default)]
pub struct LoadedTicket {
    pub sealed: bool,
    pub chunks: Vec<(RecordBatch, ChunkMeta)>,
}

/// One batch as stored.
#[derive(Debug)]
pub struct LoadedBatch {
    pub batch: u64,
    pub stored: StoredBatch,
    pub tickets: Vec<LoadedTicket>,
}

/// One consumer as stored.
#[derive(Debug)]
pub struct LoadedConsumer {
    pub table: String,
    pub consumer: String,
    pub state: StoredConsumer,
    pub batches: Vec<LoadedBatch>,
}

/// The crash-safe store of one server.
pub struct Store {
    db: Database,
    path: PathBuf,
    /// The group-commit writer thread's queue, started on first use.
    writer: std::sync::OnceLock<std::sync::mpsc::Sender<Job>>,
    /// Unit tests: every write fails while set (a full disk, say).
    #[cfg(test)]
    pub(crate) fail_writes: std::sync::atomic::AtomicBool,
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

/// `u32 len, table, u32 len, consumer`.
fn consumer_key(table: &str, consumer: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + table.len() + consumer.len() + 24);
    for part in [table, consumer] {
        k.extend_from_slice(&(part.len() as u32).to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k
}

fn key(table: &str, consumer: &str, tail: &[u64]) -> Vec<u8> {
    let mut k = consumer_key(table, consumer);
    for n in tail {
        k.extend_from_slice(&n.to_be_bytes());
    }
    k
}

/// The key of chunk `seq` of ticket `id`.
fn chunk_key(id: &TicketId, seq: u64) -> Vec<u8> {
    key(
        &id.table,
        &id.consumer,
        &[id.batch, u64::from(id.partition), seq],
    )
}

/// Splits a key into table, consumer and its `u64` tail; `None` if it is
/// not a key this module wrote.
fn parse_key(k: &[u8]) -> Option<(String, String, Vec<u64>)> {
    let mut rest = k;
    let mut parts = Vec::with_capacity(2);
    for _ in 0..2 {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let s = std::str::from_utf8(rest.get(4..4 + len)?).ok()?;
        parts.push(s.to_string());
        rest = &rest[4 + len..];
    }
    if !rest.len().is_multiple_of(8) {
        return None;
    }
    let tail = rest
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let consumer = parts.pop()?;
    let table = parts.pop()?;
    Some((table, consumer, tail))
}

/// The rows of one receive as an Arrow IPC stream.
pub fn encode_rows(batch: &RecordBatch) -> Result<Vec<u8>> {
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
    pub fn open(dir: &Path) -> Result<Self> {
        let (db, path) = open_db(dir)?;
        let store = Self {
            db,
            path,
            writer: std::sync::OnceLock::new(),
            #[cfg(test)]
            fail_writes: Default::default(),
        };
        store.check_format()?;
        // Create every table, so that reads never meet a missing one.
        store.write(&[])?;
        Ok(store)
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
    pub fn compact(&mut self) {
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
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies `ops` in one durable transaction.
    pub fn write(&self, ops: &[Op]) -> Result<()> {
        #[cfg(test)]
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(store_error(
                &self.path,
                "write",
                "failure injected by a test",
            ));
        }
        let txn = self.db.begin_write().map_err(self.fail("begin"))?;
        {
            let mut tables = Writing::open(self, &txn)?;
            for op in ops {
                tables.apply(op)?;
            }
        }
        txn.commit().map_err(self.fail("commit"))
    }

    /// Whether `id`'s batch is stored with `id`'s plan (as written so far in
    /// this transaction): a chunk or seal of a released or replaced plan is
    /// dropped instead of written.
    fn is_current(&self, batches: &redb::Table<&[u8], &[u8]>, id: &TicketId) -> Result<bool> {
        let k = key(&id.table, &id.consumer, &[id.batch]);
        let stored = batches.get(k.as_slice()).map_err(self.fail("read"))?;
        let current = stored
            .and_then(|v| serde_json::from_slice::<StoredBatch>(v.value()).ok())
            .is_some_and(|b| b.plan == id.plan);
        if !current {
            tracing::debug!(table = %id.table, consumer = %id.consumer, batch = id.batch,
                plan = id.plan, "state store: not writing a receive of a plan no longer open");
        }
        Ok(current)
    }

    /// Everything stored, by consumer. Chunks and seals of batches that are
    /// no longer planned (a receive that finished after its batch was
    /// committed), or of another plan than the batch's, are dropped from
    /// the store.
    pub fn load(&self) -> Result<Vec<LoadedConsumer>> {
        let txn = self.db.begin_read().map_err(self.fail("begin"))?;
        let open = |def| txn.open_table(def).map_err(self.fail("open table"));
        let mut loading = Loading {
            store: self,
            consumers: BTreeMap::new(),
            stale: HashSet::new(),
        };
        loading.consumers(&open(CONSUMERS)?)?;
        loading.batches(&open(BATCHES)?)?;
        let rows = open(CHUNK_ROWS)?;
        loading.chunks(&open(CHUNK_META)?, &rows)?;
        loading.seals(&open(SEALED)?)?;
        drop(rows);
        drop(txn);
        self.drop_orphans(&loading.stale)?;
        Ok(loading.consumers.into_values().collect())
    }

    /// The ids commits deleted that are still in their window at `now_ms`,
    /// as (table, until_ms, key), oldest first within a table.
    pub fn load_committed(&self, now_ms: u64) -> Result<Vec<(String, u64, u128)>> {
        let txn = self.db.begin_read().map_err(self.fail("begin"))?;
        let table = txn.open_table(COMMITTED).map_err(self.fail("open table"))?;
        let mut out = Vec::new();
        for item in table.iter().map_err(self.fail("read"))? {
            let (k, _) = item.map_err(self.fail("read"))?;
            let bad = || store_error(&self.path, "corrupt entry", "committed id key");
            let (t, _, tail) = parse_key(k.value()).ok_or_else(bad)?;
            let [until_ms, high, low] = tail[..] else {
                return Err(bad());
            };
            if until_ms > now_ms {
                out.push((t, until_ms, (u128::from(high) << 64) | u128::from(low)));
            }
        }
        Ok(out)
    }

    /// Removes the chunks (meta and rows) and seals `load` did not adopt.
    fn drop_orphans(&self, stale: &HashSet<Vec<u8>>) -> Result<()> {
        if stale.is_empty() {
            return Ok(());
        }
        let txn = self
            .db
            .begin_write()
            .map_err(self.fail("dropping orphans"))?;
        let mut dropped = 0usize;
        for def in [CHUNK_META, CHUNK_ROWS, SEALED] {
            let mut t = txn.open_table(def).map_err(self.fail("dropping orphans"))?;
            let before = t.len().map_err(self.fail("dropping orphans"))?;
            t.retain(|k, _| !stale.contains(k))
                .map_err(self.fail("dropping orphans"))?;
            dropped += (before - t.len().map_err(self.fail("dropping orphans"))?) as usize;
        }
        txn.commit().map_err(self.fail("dropping orphans"))?;
        if dropped > 0 {
            tracing::info!(
                entries = dropped,
                "state store: dropped entries of batches or plans no longer open"
            );
        }
        Ok(())
    }
}

/// A table of the store, open in a write transaction.
type WriteTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

/// The store's tables, open in one write transaction, and how each [`Op`]
/// changes them.
struct Writing<'s, 't> {
    store: &'s Store,
    consumers: WriteTable<'t>,
    batches: WriteTable<'t>,
    meta: WriteTable<'t>,
    rows: WriteTable<'t>,
    sealed: WriteTable<'t>,
    committed: WriteTable<'t>,
}

impl<'s, 't> Writing<'s, 't> {
    fn open(store: &'s Store, txn: &'t redb::WriteTransaction) -> Result<Self> {
        let open = |def| txn.open_table(def).map_err(store.fail("open table"));
        Ok(Self {
            store,
            consumers: open(CONSUMERS)?,
            batches: open(BATCHES)?,
            meta: open(CHUNK_META)?,
            rows: open(CHUNK_ROWS)?,
            sealed: open(SEALED)?,
            committed: open(COMMITTED)?,
        })
    }

    /// Inserts `k` = `v` into `t`.
    fn put(store: &Store, t: &mut WriteTable<'t>, k: &[u8], v: &[u8]) -> Result<()> {
        t.insert(k, v).map(|_| ()).map_err(store.fail("insert"))
    }

    fn apply(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::Consumer {
                table,
                consumer,
                state,
            } => {
                let v = serde_json::to_vec(state).expect("plain struct");
                Self::put(
                    self.store,
                    &mut self.consumers,
                    &consumer_key(table, consumer),
                    &v,
                )
            }
            Op::Batch {
                table,
                consumer,
                batch,
                stored,
            } => {
                let v = serde_json::to_vec(stored).expect("plain struct");
                let k = key(table, consumer, &[*batch]);
                Self::put(self.store, &mut self.batches, &k, &v)
            }
            Op::Chunk {
                id,
                seq,
                meta,
                rows,
            } => self.chunk(id, *seq, meta, rows),
            Op::Seal { id } => self.seal(id),
            Op::Renew {
                id,
                seq,
                offset,
                receipt,
            } => self.renew(id, *seq, *offset, receipt),
            Op::Committed {
                table,
                until_ms,
                keys,
            } => self.committed(table, *until_ms, keys),
            Op::DropConsumer { table, consumer } => self.drop_consumer(table, consumer),
            Op::Forget {
                table,
                consumer,
                batch,
            } => self.forget(table, consumer, *batch),
        }
    }

    /// Writes a receive, if its plan is its batch's stored plan.
    fn chunk(&mut self, id: &TicketId, seq: u64, meta: &ChunkMeta, rows: &[u8]) -> Result<()> {
        if !self.store.is_current(&self.batches, id)? {
            return Ok(());
        }
        let k = chunk_key(id, seq);
        let m = ChunkMeta {
            plan: id.plan,
            ..meta.clone()
        };
        let v = serde_json::to_vec(&m).expect("plain struct");
        Self::put(self.store, &mut self.meta, &k, &v)?;
        Self::put(self.store, &mut self.rows, &k, rows)
    }

    /// Writes a seal, if its plan is its batch's stored plan.
    fn seal(&mut self, id: &TicketId) -> Result<()> {
        if !self.store.is_current(&self.batches, id)? {
            return Ok(());
        }
        let k = key(
            &id.table,
            &id.consumer,
            &[id.batch, u64::from(id.partition)],
        );
        let v = serde_json::to_vec(&StoredSeal { plan: id.plan }).expect("plain struct");
        Self::put(self.store, &mut self.sealed, &k, &v)
    }

    /// Puts a renewed receipt in its stored receive, if that was written.
    fn renew(&mut self, id: &TicketId, seq: u64, offset: u32, receipt: &str) -> Result<()> {
        if !self.store.is_current(&self.batches, id)? {
            return Ok(());
        }
        let k = chunk_key(id, seq);
        let stored = self
            .meta
            .get(k.as_slice())
            .map_err(self.store.fail("read"))?;
        let Some(v) = stored.map(|v| v.value().to_vec()) else {
            // Its receive was not written: nothing to renew.
            return Ok(());
        };
        let mut m: ChunkMeta = serde_json::from_slice(&v)
            .map_err(|_| store_error(&self.store.path, "corrupt entry", "chunk value"))?;
        if let Some(r) = m.receipts.get_mut(offset as usize) {
            *r = receipt.to_string();
        }
        let v = serde_json::to_vec(&m).expect("plain struct");
        Self::put(self.store, &mut self.meta, &k, &v)
    }

    /// Adds a commit's deleted ids, and drops those past their window.
    fn committed(&mut self, table: &str, until_ms: u64, keys: &[u128]) -> Result<()> {
        for k in keys {
            let tail = [until_ms, (k >> 64) as u64, *k as u64];
            Self::put(self.store, &mut self.committed, &key(table, "", &tail), &[])?;
        }
        let from = key(table, "", &[]);
        let now_ms = super::status::unix_now_ms().max(0) as u64;
        let to = key(table, "", &[now_ms]);
        remove_range(&mut self.committed, &from, &to).map_err(self.store.fail("remove"))
    }

    /// Removes a consumer and everything of its batches.
    fn drop_consumer(&mut self, table: &str, consumer: &str) -> Result<()> {
        let prefix = consumer_key(table, consumer);
        self.consumers
            .remove(prefix.as_slice())
            .map_err(self.store.fail("remove"))?;
        for t in [
            &mut self.batches,
            &mut self.meta,
            &mut self.rows,
            &mut self.sealed,
        ] {
            remove_prefix(t, &prefix).map_err(self.store.fail("remove"))?;
        }
        Ok(())
    }

    /// Removes a batch and its receives and seals.
    fn forget(&mut self, table: &str, consumer: &str, batch: u64) -> Result<()> {
        let prefix = key(table, consumer, &[batch]);
        self.batches
            .remove(prefix.as_slice())
            .map_err(self.store.fail("remove"))?;
        for t in [&mut self.meta, &mut self.rows, &mut self.sealed] {
            remove_prefix(t, &prefix).map_err(self.store.fail("remove"))?;
        }
        Ok(())
    }
}

/// A table of the store, open in a read transaction.
type ReadTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// What [`Store::load`] gathered so far, table by table: the consumers
/// with their batches and tickets, and the entries it adopts nowhere.
struct Loading<'s> {
    store: &'s Store,
    consumers: BTreeMap<(String, String), LoadedConsumer>,
    /// Chunks and seals of no stored batch or of another plan.
    stale: HashSet<Vec<u8>>,
}

impl<'s> Loading<'s> {
    /// Calls `f` on every entry of `table`, its key split (see
    /// [`parse_key`]); `what` names the entry in the error for a key that
    /// does not parse.
    fn each(
        &mut self,
        table: &ReadTable,
        what: &str,
        mut f: impl FnMut(&mut Self, Entry<'_>) -> Result<()>,
    ) -> Result<()> {
        let store = self.store;
        for item in table.iter().map_err(store.fail("read"))? {
            let (k, v) = item.map_err(store.fail("read"))?;
            let (table, consumer, tail) =
                parse_key(k.value()).ok_or_else(|| store.corrupt(what))?;
            let entry = Entry {
                key: k.value(),
                table,
                consumer,
                tail,
                value: v.value(),
            };
            f(self, entry)?;
        }
        Ok(())
    }

    /// Each consumer's state.
    fn consumers(&mut self, table: &ReadTable) -> Result<()> {
        let store = self.store;
        self.each(table, "consumer key", |loading, e| {
            let state: StoredConsumer =
                serde_json::from_slice(e.value).map_err(|_| store.corrupt("consumer value"))?;
            loading.consumer(e.table, e.consumer).state = state;
            Ok(())
        })
    }

    /// Each planned batch, with a ticket per partition, nothing received yet.
    fn batches(&mut self, table: &ReadTable) -> Result<()> {
        let store = self.store;
        self.each(table, "batch key", |loading, e| {
            let [batch] = e.tail[..] else {
                return Err(store.corrupt("batch key"));
            };
            let stored: StoredBatch =
                serde_json::from_slice(e.value).map_err(|_| store.corrupt("batch value"))?;
            let tickets = (0..stored.partitions)
                .map(|_| LoadedTicket::default())
                .collect();
            loading
                .consumer(e.table, e.consumer)
                .batches
                .push(LoadedBatch {
                    batch,
                    stored,
                    tickets,
                });
            Ok(())
        })
    }

    /// Each received chunk, its rows decoded, in its ticket.
    fn chunks(&mut self, meta_table: &ReadTable, rows_table: &ReadTable) -> Result<()> {
        let store = self.store;
        self.each(meta_table, "chunk key", |loading, e| {
            let [batch, partition, _seq] = e.tail[..] else {
                return Err(store.corrupt("chunk key"));
            };
            let meta: ChunkMeta =
                serde_json::from_slice(e.value).map_err(|_| store.corrupt("chunk value"))?;
            let Some(ticket) = loading.ticket(&e, batch, partition, meta.plan) else {
                loading.stale.insert(e.key.to_vec());
                return Ok(());
            };
            let rows = rows_table
                .get(e.key)
                .map_err(store.fail("read"))?
                .ok_or_else(|| store.corrupt("chunk without rows"))?;
            let rows = decode_rows(rows.value())
                .map_err(|err| store.corrupt(&format!("chunk rows: {err}")))?;
            ticket.chunks.push((rows, meta));
            Ok(())
        })
    }

    /// Each seal, on its ticket.
    fn seals(&mut self, table: &ReadTable) -> Result<()> {
        let store = self.store;
        self.each(table, "seal key", |loading, e| {
            let [batch, partition] = e.tail[..] else {
                return Err(store.corrupt("seal key"));
            };
            let seal: StoredSeal =
                serde_json::from_slice(e.value).map_err(|_| store.corrupt("seal value"))?;
            match loading.ticket(&e, batch, partition, seal.plan) {
                Some(ticket) => ticket.sealed = true,
                None => {
                    loading.stale.insert(e.key.to_vec());
                }
            }
            Ok(())
        })
    }

    /// The loaded consumer `table`/`consumer`, added if new.
    fn consumer(&mut self, table: String, consumer: String) -> &mut LoadedConsumer {
        self.consumers
            .entry((table.clone(), consumer.clone()))
            .or_insert_with(|| LoadedConsumer {
                table,
                consumer,
                state: StoredConsumer::default(),
                batches: Vec::new(),
            })
    }

    /// The loaded ticket (`batch`, `partition`) of the entry's consumer that
    /// a chunk or seal of `plan` belongs to: its batch must be stored with
    /// that plan.
    fn ticket(
        &mut self,
        entry: &Entry,
        batch: u64,
        partition: u64,
        plan: u64,
    ) -> Option<&mut LoadedTicket> {
        let key = (entry.table.clone(), entry.consumer.clone());
        let consumer = self.consumers.get_mut(&key)?;
        let b = consumer.batches.iter_mut().find(|b| b.batch == batch)?;
        if plan != b.stored.plan {
            return None;
        }
        b.tickets.get_mut(usize::try_from(partition).ok()?)
    }
}

/// One entry of a store table, its key split.
struct Entry<'v> {
    key: &'v [u8],
    table: String,
    consumer: String,
    tail: Vec<u64>,
    value: &'v [u8],
}

/// Removes the keys from `from` (included) to `to` (excluded).
fn remove_range(
    t: &mut redb::Table<&[u8], &[u8]>,
    from: &[u8],
    to: &[u8],
) -> std::result::Result<(), redb::Error> {
    remove_from(t, from, |k| k < to)
}

/// Removes the keys that start with `prefix`.
fn remove_prefix(
    t: &mut redb::Table<&[u8], &[u8]>,
    prefix: &[u8],
) -> std::result::Result<(), redb::Error> {
    remove_from(t, prefix, |k| k.starts_with(prefix))
}

/// Removes the keys from `from` on while `within` holds.
fn remove_from(
    t: &mut redb::Table<&[u8], &[u8]>,
    from: &[u8],
    within: impl Fn(&[u8]) -> bool,
) -> std::result::Result<(), redb::Error> {
    let keys: Vec<Vec<u8>> = t
        .range::<&[u8]>(from..)?
        .map(|item| item.map(|(k, _)| k.value().to_vec()))
        .take_while(|k| k.as_ref().map_or(true, |k| within(k)))
        .collect::<std::result::Result<_, _>>()?;
    for k in keys {
        t.remove(k.as_slice())?;
    }
    Ok(())
}

/// Writes `ops` durably, off the async runtime. Concurrent callers share
/// transactions (group commit): one writer thread takes every job queued
/// while the previous transaction was being made durable and commits them
/// together, so N partitions receiving at once pay about one `fsync` per
/// round, not N.
pub async fn apply(store: &Arc<Store>, ops: Vec<Op>) -> Result<()> {
    let (done, answer) = tokio::sync::oneshot::channel();
    let queue = store
        .writer
        .get_or_init(|| start_writer(Arc::downgrade(store)));
    queue
        .send((ops, done))
        .map_err(|_| Error::Internal("state store writer stopped".into()))?;
    answer
        .await
        .map_err(|_| Error::Internal("state store writer stopped".into()))?
}

/// The writer thread; it ends when the store is dropped.
fn start_writer(store: std::sync::Weak<Store>) -> std::sync::mpsc::Sender<Job> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("sqsf-state-writer".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut jobs = vec![first];
                jobs.extend(rx.try_iter());
                let Some(store) = store.upgrade() else {
                    return;
                };
                let ops: Vec<Op> = jobs.iter_mut().flat_map(|(ops, _)| ops.drain(..)).collect();
                let result = store.write(&ops);
                drop(store);
                for (_, done) in jobs {
                    let answer = match &result {
                        Ok(()) => Ok(()),
                        Err(e) => Err(Error::Internal(e.to_string())),
                    };
                    let _ = done.send(answer);
                }
            }
        })
        .expect("spawn the state store writer thread");
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(batch: u64, partition: u32) -> TicketId {
        id_of(batch, partition, 7)
    }

    fn id_of(batch: u64, partition: u32, plan: u64) -> TicketId {
        TicketId {
            table: "t".into(),
            consumer: "c".into(),
            batch,
            partition,
            plan,
        }
    }

    fn rows(n: usize) -> RecordBatch {
        let msgs: Vec<_> = (0..n)
            .map(|i| sqs_flight_schemas::SqsMessage {
                message_id: format!("m{i}"),
                body: format!("body {i}"),
                ..Default::default()
            })
            .collect();
        sqs_flight_schemas::message::messages_to_batch(&msgs, 1, 0).unwrap()
    }

    fn chunk(batch: u64, partition: u32, seq: u64, n: usize) -> Op {
        chunk_of(id(batch, partition), seq, n)
    }

    fn chunk_of(id: TicketId, seq: u64, n: usize) -> Op {
        let (batch, partition) = (id.batch, id.partition);
        Op::Chunk {
            id,
            seq,
            meta: ChunkMeta {
                receipts: (0..n)
                    .map(|i| format!("r{batch}-{partition}-{seq}-{i}"))
                    .collect(),
                visible_until_ms: 42,
                objects: Vec::new(),
                bytes: n as u64,
                plan: 0,
            },
            rows: encode_rows(&rows(n)).unwrap(),
        }
    }

    fn batch(batch: u64) -> Op {
        Op::Batch {
            table: "t".into(),
            consumer: "c".into(),
            batch,
            stored: StoredBatch::new(7, PlanParams::DEFAULTS),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewed_receipts_and_committed_ids_load_back_and_expired_ids_go() {
        let scratch = crate::scratch::dir("dedup");
        let dir = scratch.path().join("state");
        let store = Arc::new(Store::open(&dir).unwrap());
        let renew = |offset, receipt: &str| Op::Renew {
            id: id(1, 0),
            seq: 0,
            offset,
            receipt: receipt.into(),
        };
        apply(&store, vec![batch(1), chunk(1, 0, 0, 3), renew(1, "newer")])
            .await
            .unwrap();
        // A renewal of another plan, or of a chunk never written, changes nothing.
        let other_plan = Op::Renew {
            id: id_of(1, 0, 8),
            seq: 0,
            offset: 0,
            receipt: "other plan".into(),
        };
        let no_chunk = Op::Renew {
            id: id(1, 0),
            seq: 5,
            offset: 0,
            receipt: "no chunk".into(),
        };
        apply(&store, vec![other_plan, no_chunk]).await.unwrap();
        let loaded = store.load().unwrap();
        let receipts = &loaded[0].batches[0].tickets[0].chunks[0].1.receipts;
        assert_eq!(receipts, &["r1-0-0-0", "newer", "r1-0-0-2"]);

        let now = crate::registry::status::unix_now_ms() as u64;
        let committed = |table: &str, until_ms, keys: Vec<u128>| Op::Committed {
            table: table.into(),
            until_ms,
            keys,
        };
        apply(
            &store,
            vec![committed("t", now + 2_000, vec![1, u128::MAX])],
        )
        .await
        .unwrap();
        assert_eq!(
            store.load_committed(now).unwrap(),
            [
                ("t".to_string(), now + 2_000, 1),
                ("t".into(), now + 2_000, u128::MAX)
            ]
        );
        assert_eq!(store.load_committed(now + 2_000).unwrap(), [], "expired");
        // A later write drops the table's expired ids from the file.
        let raw = |store: &Store| {
            let txn = store.db.begin_read().unwrap();
            txn.open_table(COMMITTED).unwrap().len().unwrap()
        };
        apply(&store, vec![committed("u", now + 60_000, vec![3])])
            .await
            .unwrap();
        assert_eq!(raw(&store), 3, "another table's write keeps t's ids");
        apply(&store, vec![committed("t", 1, vec![4])])
            .await
            .unwrap();
        assert_eq!(
            raw(&store),
            3,
            "4 went at once, 1 and MAX stay until their time"
        );
        drop(store);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_is_written_loads_back_and_forgotten_batches_are_gone() {
        let scratch = crate::scratch::dir("store");
        let dir = scratch.path().join("state");
        {
            let store = Arc::new(Store::open(&dir).unwrap());
            let state = StoredConsumer {
                committed: Some(0),
                last_planned: Some(2),
                pending_delete: vec!["p1".into()],
                pending_reject: vec![StoredReject {
                    delay_seconds: 30,
                    receipts: vec!["j1".into()],
                    read_ahead: false,
                }],
            };
            apply(&store, vec![batch(1), batch(2)]).await.unwrap();
            // Concurrent writers share transactions and all succeed.
            let writes = (0..8u64).map(|seq| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { apply(&store, vec![chunk(1, 0, seq, 3)]).await })
            });
            for w in futures::future::join_all(writes).await {
                w.unwrap().unwrap();
            }
            apply(&store, vec![chunk(2, 1, 0, 2), Op::Seal { id: id(2, 1) }])
                .await
                .unwrap();
            let consumer = Op::Consumer {
                table: "t".into(),
                consumer: "c".into(),
                state,
            };
            apply(&store, vec![consumer, chunk(9, 0, 0, 1)])
                .await
                .unwrap();
            apply(
                &store,
                vec![Op::Forget {
                    table: "t".into(),
                    consumer: "c".into(),
                    batch: 2,
                }],
            )
            .await
            .unwrap();
        }
        let store = Store::open(&dir).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.len(), 1);
        let c = &loaded[0];
        assert_eq!((c.table.as_str(), c.consumer.as_str()), ("t", "c"));
        assert_eq!(c.state.last_planned, Some(2));
        assert_eq!(c.state.pending_delete, vec!["p1".to_string()]);
        assert_eq!(c.state.pending_reject[0].receipts, ["j1"]);
        assert_eq!(c.state.pending_reject[0].delay_seconds, 30);
        assert_eq!(c.batches.len(), 1, "batch 2 was forgotten");
        let b = &c.batches[0];
        assert_eq!((b.batch, b.stored.plan), (1, 7));
        assert_eq!(b.tickets.len(), PlanParams::DEFAULTS.partitions as usize);
        let t0 = &b.tickets[0];
        assert!(!t0.sealed);
        assert_eq!(t0.chunks.len(), 8);
        assert_eq!(t0.chunks[0].0, rows(3), "rows come back as written");
        assert_eq!(t0.chunks[5].1.receipts[2], "r1-0-5-2", "in sequence order");
        // The chunk of batch 9, never planned, was dropped on load.
        let again = store.load().unwrap();
        assert_eq!(again[0].batches.len(), 1);
        drop(store);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn compaction_at_open_gives_forgotten_rows_back_and_keeps_the_rest() {
        let scratch = crate::scratch::dir("compact");
        let dir = scratch.path().join("state");
        let size = |store: &Store| std::fs::metadata(store.path()).unwrap().len();
        let full = {
            let store = Arc::new(Store::open(&dir).unwrap());
            apply(&store, vec![batch(1), batch(2)]).await.unwrap();
            for seq in 0..40 {
                apply(&store, vec![chunk(1, 0, seq, 500)]).await.unwrap();
            }
            apply(&store, vec![chunk(2, 0, 0, 3)]).await.unwrap();
            let forget = Op::Forget {
                table: "t".into(),
                consumer: "c".into(),
                batch: 1,
            };
            apply(&store, vec![forget]).await.unwrap();
            size(&store)
        };
        let mut store = Store::open(&dir).unwrap();
        let opened = size(&store);
        store.compact();
        let compacted = size(&store);
        assert!(
            compacted < opened / 2,
            "{compacted} B after compaction, {opened} B before ({full} B when written)"
        );
        let loaded = store.load().unwrap();
        assert_eq!(loaded[0].batches.len(), 1);
        assert_eq!(loaded[0].batches[0].tickets[0].chunks[0].0, rows(3));
        drop(store);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chunks_and_seals_of_another_plan_are_neither_written_nor_adopted() {
        let scratch = crate::scratch::dir("plans");
        let dir = scratch.path().join("state");
        let store = Arc::new(Store::open(&dir).unwrap());
        // Batch 1 is planned (plan 7), released, and planned again (plan 8);
        // the receive of plan 7 ends after that.
        let forget = Op::Forget {
            table: "t".into(),
            consumer: "c".into(),
            batch: 1,
        };
        apply(&store, vec![batch(1), chunk(1, 0, 0, 2), forget])
            .await
            .unwrap();
        let replanned = Op::Batch {
            table: "t".into(),
            consumer: "c".into(),
            batch: 1,
            stored: StoredBatch::new(
                8,
                PlanParams {
                    partitions: 3,
                    ..PlanParams::DEFAULTS
                },
            ),
        };
        apply(&store, vec![replanned]).await.unwrap();
        apply(&store, vec![chunk(1, 0, 1, 3), Op::Seal { id: id(1, 0) }])
            .await
            .unwrap();
        let loaded = store.load().unwrap();
        let b = &loaded[0].batches[0];
        assert_eq!(b.stored.plan, 8);
        assert!(
            b.tickets[0].chunks.is_empty() && !b.tickets[0].sealed,
            "plan 8's ticket adopted nothing of plan 7"
        );
        // Its own receives are written.
        let own = id_of(1, 0, 8);
        apply(
            &store,
            vec![chunk_of(own.clone(), 0, 4), Op::Seal { id: own }],
        )
        .await
        .unwrap();
        // Stale entries of plan 7 (written before the plan check).
        let rows = encode_rows(&rows(1)).unwrap();
        let stale_meta = br#"{"receipts":["s1"],"visible_until_ms":42,"bytes":1,"plan":7}"#;
        {
            let txn = store.db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(CHUNK_META).unwrap();
                let mut chunk_rows = txn.open_table(CHUNK_ROWS).unwrap();
                let mut sealed = txn.open_table(SEALED).unwrap();
                let k = key("t", "c", &[1, 2, 0]);
                meta.insert(k.as_slice(), &stale_meta[..]).unwrap();
                chunk_rows.insert(k.as_slice(), rows.as_slice()).unwrap();
                let stale_seal = br#"{"plan":7}"#;
                sealed
                    .insert(key("t", "c", &[1, 2]).as_slice(), &stale_seal[..])
                    .unwrap();
            }
            txn.commit().unwrap();
        }
        let loaded = store.load().unwrap();
        let t = &loaded[0].batches[0].tickets;
        assert_eq!(t[0].chunks.len(), 1);
        assert_eq!(t[0].chunks[0].1.plan, 8);
        assert!(t[0].sealed);
        assert!(t[2].chunks.is_empty() && !t[2].sealed, "plan 7: dropped");
        let txn = store.db.begin_read().unwrap();
        let meta = txn.open_table(CHUNK_META).unwrap();
        assert_eq!(
            meta.len().unwrap(),
            1,
            "the stale chunk is gone from the file"
        );
        drop((meta, txn, loaded, store));
    }

    #[test]
    fn keys_round_trip_and_sort_by_batch() {
        let k = key("orders", "spark", &[7, 1, 3]);
        assert_eq!(
            parse_key(&k),
            Some(("orders".into(), "spark".into(), vec![7, 1, 3]))
        );
        assert!(key("t", "c", &[2]) < key("t", "c", &[10]));
        assert!(parse_key(&[0, 0, 0, 9, b'x']).is_none());
        // A consumer that is a prefix of another never shares its keys.
        assert!(!key("t", "ab", &[1]).starts_with(&key("t", "a", &[])));
    }

    #[test]
    fn a_stored_batch_round_trips_and_requires_every_parameter() {
        let new = StoredBatch::new(3, PlanParams::DEFAULTS);
        let json = serde_json::to_value(new).unwrap();
        assert_eq!(
            serde_json::from_value::<StoredBatch>(json.clone()).unwrap(),
            new
        );
        for name in ["receivers", "max_bytes"] {
            let mut broken = json.clone();
            broken.as_object_mut().unwrap().remove(name);
            assert!(
                serde_json::from_value::<StoredBatch>(broken).is_err(),
                "{name}"
            );
        }
    }

    #[test]
    fn a_store_records_its_format_version_and_refuses_one_it_does_not_know() {
        let scratch = crate::scratch::dir("format");
        let dir = scratch.path().join("state");
        let version = |store: &Store| {
            let txn = store.db.begin_read().unwrap();
            let format = txn.open_table(FORMAT).unwrap();
            format.get(FORMAT_KEY).unwrap().map(|v| v.value())
        };
        let store = Store::open(&dir).unwrap();
        assert_eq!(version(&store), Some(FORMAT_VERSION), "a new store");
        drop(store);
        let store = Store::open(&dir).unwrap();
        assert_eq!(version(&store), Some(FORMAT_VERSION), "opened again");
        let txn = store.db.begin_write().unwrap();
        txn.open_table(FORMAT)
            .unwrap()
            .insert(FORMAT_KEY, FORMAT_VERSION + 1)
            .unwrap();
        txn.commit().unwrap();
        drop(store);
        let Err(e) = Store::open(&dir) else {
            panic!("a store of format version {} opened", FORMAT_VERSION + 1);
        };
        let e = e.to_string();
        assert!(e.contains("format version 2"), "{e}");
        assert!(e.contains("reads version 1 only"), "{e}");
        assert!(e.contains("--state-dir"), "{e}");
    }
}
