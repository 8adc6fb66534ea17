//! Reading the store back at start: every consumer with its batches and
//! tickets ([`Store::load`]), and the ids commits deleted
//! ([`Store::load_committed`]).

use std::collections::{BTreeMap, HashSet};

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::keys::parse_key;
use super::{
    BATCHES, CHUNK_META, CHUNK_ROWS, COMMITTED, CONSUMERS, ChunkMeta, LoadedBatch, LoadedConsumer,
    LoadedTicket, SEALED, Store, StoredBatch, StoredConsumer, StoredSeal, decode_rows, store_error,
};
use crate::error::Result;

impl Store {
    /// Everything stored, by consumer. Chunks and seals of batches that are
    /// no longer planned (a receive that finished after its batch was
    /// committed), or of another plan than the batch's, are dropped from
    /// the store.
    pub(crate) fn load(&self) -> Result<Vec<LoadedConsumer>> {
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
    pub(crate) fn load_committed(&self, now_ms: u64) -> Result<Vec<(String, u64, u128)>> {
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
