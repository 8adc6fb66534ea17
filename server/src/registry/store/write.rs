//! Writing the store: each [`Op`] applied in one durable transaction
//! ([`Writing`]), and the group-commit writer thread ([`apply`]).

use std::sync::Arc;

use redb::ReadableTable;
use sqs_flight_schemas::TicketId;

use super::keys::{chunk_key, consumer_key, key};
use super::{
    BATCHES, CHUNK_META, CHUNK_ROWS, COMMITTED, CONSUMERS, ChunkMeta, Job, Op, SEALED, Store,
    StoredBatch, StoredSeal, store_error,
};
use crate::error::{Error, Result};

impl Store {
    /// Applies `ops`: to the state log first (`--state-url`), then in one
    /// durable transaction. A log grown past its bound is compacted after.
    pub(crate) fn write(&self, ops: &[Op]) -> Result<()> {
        #[cfg(test)]
        self.test_hooks()?;
        let Some(replica) = self.replica.get().filter(|_| !ops.is_empty()) else {
            return self.write_local(ops);
        };
        replica.append(ops)?;
        if let Err(e) = self.write_local(ops) {
            replica.diverged(&e);
            return Err(e);
        }
        if replica.wants_snapshot() {
            match self.snapshot_ops() {
                Ok(state) => replica.compact(&state),
                Err(e) => {
                    tracing::warn!(error = %e, "state log: could not read the store for a snapshot")
                }
            }
        }
        Ok(())
    }

    /// Unit tests: waits while the write gate is held, then counts the
    /// write and fails it from `fail_from_write` on.
    #[cfg(test)]
    fn test_hooks(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        drop(self.write_gate.lock());
        if self.writes.fetch_add(1, SeqCst) >= self.fail_from_write.load(SeqCst) {
            return Err(store_error(
                &self.path,
                "write",
                "failure injected by a test",
            ));
        }
        Ok(())
    }

    /// Applies `ops` to this host's store only, in one durable transaction.
    pub(crate) fn write_local(&self, ops: &[Op]) -> Result<()> {
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
        let now_ms = crate::registry::status::unix_now_ms().max(0) as u64;
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
pub(crate) async fn apply(store: &Arc<Store>, ops: Vec<Op>) -> Result<()> {
    submit(store, ops)?.await.unwrap_or_else(|_| Err(stopped()))
}

/// Hands `ops` to the writer thread and answers how to learn the write's
/// outcome: written in the order submitted, with whatever else is waiting.
pub(crate) fn submit(
    store: &Arc<Store>,
    ops: Vec<Op>,
) -> Result<tokio::sync::oneshot::Receiver<Result<()>>> {
    let (done, answer) = tokio::sync::oneshot::channel();
    let queue = store
        .writer
        .get_or_init(|| start_writer(Arc::downgrade(store)));
    queue.send((ops, done)).map_err(|_| stopped())?;
    Ok(answer)
}

/// The error of a write the writer thread can no longer take.
pub(crate) fn stopped() -> Error {
    Error::Internal("state store writer stopped".into())
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
                        Err(e) => Err(e.copy_journal_error()),
                    };
                    let _ = done.send(answer);
                }
            }
        })
        .expect("spawn the state store writer thread");
    tx
}
