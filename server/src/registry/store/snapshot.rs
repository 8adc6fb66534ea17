//! The whole store as changes that rebuild it (a state log's snapshot),
//! and emptying it (before a state log is read into it).

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use sqs_flight_schemas::TicketId;

use super::keys::parse_key;
use super::{
    BATCHES, CHUNK_META, CHUNK_ROWS, COMMITTED, CONSUMERS, ChunkMeta, Op, SEALED, Store,
    StoredBatch, StoredConsumer, StoredSeal,
};
use crate::error::Result;
use crate::state_log::replica::Local;

/// Every table of the store but its format version.
const TABLES: [TableDefinition<&[u8], &[u8]>; 6] = [
    CONSUMERS, BATCHES, CHUNK_META, CHUNK_ROWS, SEALED, COMMITTED,
];

impl Store {
    /// The changes that rebuild what the store holds, batches before
    /// their receives and seals (a receive is written only under its
    /// batch's plan).
    pub(crate) fn snapshot_ops(&self) -> Result<Vec<Op>> {
        let txn = self.db.begin_read().map_err(self.fail("begin"))?;
        let open = |def| txn.open_table(def).map_err(self.fail("open table"));
        let mut ops = Vec::new();
        for item in open(CONSUMERS)?.iter().map_err(self.fail("read"))? {
            let (k, v) = item.map_err(self.fail("read"))?;
            let (table, consumer, _) =
                parse_key(k.value()).ok_or_else(|| self.corrupt("consumer key"))?;
            let state: StoredConsumer =
                serde_json::from_slice(v.value()).map_err(|_| self.corrupt("consumer value"))?;
            ops.push(Op::Consumer {
                table,
                consumer,
                state,
            });
        }
        for item in open(BATCHES)?.iter().map_err(self.fail("read"))? {
            let (k, v) = item.map_err(self.fail("read"))?;
            let (table, consumer, tail) =
                parse_key(k.value()).ok_or_else(|| self.corrupt("batch key"))?;
            let [batch] = tail[..] else {
                return Err(self.corrupt("batch key"));
            };
            let stored: StoredBatch =
                serde_json::from_slice(v.value()).map_err(|_| self.corrupt("batch value"))?;
            ops.push(Op::Batch {
                table,
                consumer,
                batch,
                stored,
            });
        }
        let rows = open(CHUNK_ROWS)?;
        for item in open(CHUNK_META)?.iter().map_err(self.fail("read"))? {
            let (k, v) = item.map_err(self.fail("read"))?;
            let (table, consumer, tail) =
                parse_key(k.value()).ok_or_else(|| self.corrupt("chunk key"))?;
            let [batch, partition, seq] = tail[..] else {
                return Err(self.corrupt("chunk key"));
            };
            let meta: ChunkMeta =
                serde_json::from_slice(v.value()).map_err(|_| self.corrupt("chunk value"))?;
            let bytes = rows
                .get(k.value())
                .map_err(self.fail("read"))?
                .ok_or_else(|| self.corrupt("chunk without rows"))?
                .value()
                .to_vec();
            let id = ticket(table, consumer, batch, partition, meta.plan)?;
            ops.push(Op::Chunk {
                id,
                seq,
                meta,
                rows: bytes,
            });
        }
        for item in open(SEALED)?.iter().map_err(self.fail("read"))? {
            let (k, v) = item.map_err(self.fail("read"))?;
            let (table, consumer, tail) =
                parse_key(k.value()).ok_or_else(|| self.corrupt("seal key"))?;
            let [batch, partition] = tail[..] else {
                return Err(self.corrupt("seal key"));
            };
            let seal: StoredSeal =
                serde_json::from_slice(v.value()).map_err(|_| self.corrupt("seal value"))?;
            ops.push(Op::Seal {
                id: ticket(table, consumer, batch, partition, seal.plan)?,
            });
        }
        for item in open(COMMITTED)?.iter().map_err(self.fail("read"))? {
            let (k, _) = item.map_err(self.fail("read"))?;
            let (table, _, tail) =
                parse_key(k.value()).ok_or_else(|| self.corrupt("committed id key"))?;
            let [until_ms, high, low] = tail[..] else {
                return Err(self.corrupt("committed id key"));
            };
            let key = (u128::from(high) << 64) | u128::from(low);
            ops.push(Op::Committed {
                table,
                until_ms,
                keys: vec![key],
            });
        }
        Ok(ops)
    }

    /// Removes everything the store holds but its format version.
    pub(crate) fn clear(&self) -> Result<()> {
        let txn = self.db.begin_write().map_err(self.fail("begin"))?;
        for def in TABLES {
            let mut t = txn.open_table(def).map_err(self.fail("open table"))?;
            t.retain(|_, _| false).map_err(self.fail("remove"))?;
        }
        txn.commit().map_err(self.fail("commit"))
    }
}

/// A ticket id from a key's parts.
fn ticket(
    table: String,
    consumer: String,
    batch: u64,
    partition: u64,
    plan: u64,
) -> Result<TicketId> {
    let partition = u32::try_from(partition).map_err(|_| {
        crate::error::Error::Internal("state store: corrupt entry: partition".into())
    })?;
    Ok(TicketId {
        table,
        consumer,
        batch,
        partition,
        plan,
    })
}

impl Local for Store {
    fn clear(&self) -> Result<()> {
        Store::clear(self)
    }

    fn write_local(&self, ops: &[Op]) -> Result<()> {
        Store::write_local(self, ops)
    }

    fn snapshot_ops(&self) -> Result<Vec<Op>> {
        Store::snapshot_ops(self)
    }
}
