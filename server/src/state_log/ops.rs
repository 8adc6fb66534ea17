//! The store's changes ([`Op`]) as segment frames: each change as JSON,
//! a receive's rows (already Arrow IPC) as the frame's bytes.

use serde::{Deserialize, Serialize};
use sqs_flight_schemas::TicketId;

use super::segment::Frame;
use crate::registry::store::{ChunkMeta, Op, StoredBatch, StoredConsumer};

/// A ticket, as a frame names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ticket {
    table: String,
    consumer: String,
    batch: u64,
    partition: u32,
    plan: u64,
}

impl From<&TicketId> for Ticket {
    fn from(id: &TicketId) -> Self {
        Self {
            table: id.table.clone(),
            consumer: id.consumer.clone(),
            batch: id.batch,
            partition: id.partition,
            plan: id.plan,
        }
    }
}

impl From<Ticket> for TicketId {
    fn from(t: Ticket) -> Self {
        TicketId {
            table: t.table,
            consumer: t.consumer,
            batch: t.batch,
            partition: t.partition,
            plan: t.plan,
        }
    }
}

/// One change, without its rows.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Record {
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
    Chunk {
        id: Ticket,
        seq: u64,
        meta: ChunkMeta,
    },
    Seal {
        id: Ticket,
    },
    DropConsumer {
        table: String,
        consumer: String,
    },
    Renew {
        id: Ticket,
        seq: u64,
        offset: u32,
        receipt: String,
    },
    Committed {
        table: String,
        until_ms: u64,
        /// Message ids as decimal strings (JSON numbers stop at 2^53 in
        /// many readers).
        keys: Vec<String>,
    },
    Forget {
        table: String,
        consumer: String,
        batch: u64,
    },
}

/// The frame of one change.
pub fn frame(op: &Op) -> Frame {
    let (record, blob) = match op {
        Op::Consumer {
            table,
            consumer,
            state,
        } => (
            Record::Consumer {
                table: table.clone(),
                consumer: consumer.clone(),
                state: state.clone(),
            },
            Vec::new(),
        ),
        Op::Batch {
            table,
            consumer,
            batch,
            stored,
        } => (
            Record::Batch {
                table: table.clone(),
                consumer: consumer.clone(),
                batch: *batch,
                stored: *stored,
            },
            Vec::new(),
        ),
        Op::Chunk {
            id,
            seq,
            meta,
            rows,
        } => (
            Record::Chunk {
                id: id.into(),
                seq: *seq,
                meta: meta.clone(),
            },
            rows.clone(),
        ),
        Op::Seal { id } => (Record::Seal { id: id.into() }, Vec::new()),
        Op::DropConsumer { table, consumer } => (
            Record::DropConsumer {
                table: table.clone(),
                consumer: consumer.clone(),
            },
            Vec::new(),
        ),
        Op::Renew {
            id,
            seq,
            offset,
            receipt,
        } => (
            Record::Renew {
                id: id.into(),
                seq: *seq,
                offset: *offset,
                receipt: receipt.clone(),
            },
            Vec::new(),
        ),
        Op::Committed {
            table,
            until_ms,
            keys,
        } => (
            Record::Committed {
                table: table.clone(),
                until_ms: *until_ms,
                keys: keys.iter().map(u128::to_string).collect(),
            },
            Vec::new(),
        ),
        Op::Forget {
            table,
            consumer,
            batch,
        } => (
            Record::Forget {
                table: table.clone(),
                consumer: consumer.clone(),
                batch: *batch,
            },
            Vec::new(),
        ),
    };
    Frame {
        json: serde_json::to_vec(&record).expect("plain enum serializes"),
        blob,
    }
}

/// The change a frame holds; an error says what is wrong with it.
pub fn op(frame: Frame) -> Result<Op, String> {
    let record: Record =
        serde_json::from_slice(&frame.json).map_err(|e| format!("a change: {e}"))?;
    let no_rows = |op: Op| match frame.blob.is_empty() {
        true => Ok(op),
        false => Err("a change that has no rows carries some".to_string()),
    };
    match record {
        Record::Consumer {
            table,
            consumer,
            state,
        } => no_rows(Op::Consumer {
            table,
            consumer,
            state,
        }),
        Record::Batch {
            table,
            consumer,
            batch,
            stored,
        } => no_rows(Op::Batch {
            table,
            consumer,
            batch,
            stored,
        }),
        Record::Chunk { id, seq, meta } => Ok(Op::Chunk {
            id: id.into(),
            seq,
            meta,
            rows: frame.blob,
        }),
        Record::Seal { id } => no_rows(Op::Seal { id: id.into() }),
        Record::DropConsumer { table, consumer } => no_rows(Op::DropConsumer { table, consumer }),
        Record::Renew {
            id,
            seq,
            offset,
            receipt,
        } => no_rows(Op::Renew {
            id: id.into(),
            seq,
            offset,
            receipt,
        }),
        Record::Committed {
            table,
            until_ms,
            keys,
        } => {
            let keys = keys
                .iter()
                .map(|k| k.parse::<u128>().map_err(|_| format!("message id {k:?}")))
                .collect::<Result<Vec<_>, _>>()?;
            no_rows(Op::Committed {
                table,
                until_ms,
                keys,
            })
        }
        Record::Forget {
            table,
            consumer,
            batch,
        } => no_rows(Op::Forget {
            table,
            consumer,
            batch,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PlanParams;

    fn id() -> TicketId {
        TicketId {
            table: "t".into(),
            consumer: "c".into(),
            batch: 3,
            partition: 1,
            plan: 9,
        }
    }

    fn every_op() -> Vec<Op> {
        vec![
            Op::Consumer {
                table: "t".into(),
                consumer: "c".into(),
                state: StoredConsumer {
                    committed: Some(2),
                    last_planned: Some(3),
                    pending_delete: vec!["r1".into()],
                    pending_reject: vec![],
                },
            },
            Op::Batch {
                table: "t".into(),
                consumer: "c".into(),
                batch: 3,
                stored: StoredBatch::new(9, PlanParams::default()),
            },
            Op::Chunk {
                id: id(),
                seq: 4,
                meta: ChunkMeta {
                    receipts: vec!["a".into(), "b".into()],
                    visible_until_ms: 77,
                    bytes: 12,
                    plan: 9,
                    objects: vec![],
                },
                rows: vec![1, 2, 3],
            },
            Op::Seal { id: id() },
            Op::Renew {
                id: id(),
                seq: 4,
                offset: 1,
                receipt: "b2".into(),
            },
            Op::Committed {
                table: "t".into(),
                until_ms: 5,
                keys: vec![u128::MAX, 1],
            },
            Op::Forget {
                table: "t".into(),
                consumer: "c".into(),
                batch: 3,
            },
            Op::DropConsumer {
                table: "t".into(),
                consumer: "c".into(),
            },
        ]
    }

    #[test]
    fn every_change_round_trips_through_a_frame() {
        for o in every_op() {
            let back = op(frame(&o)).unwrap();
            assert_eq!(format!("{back:?}"), format!("{o:?}"));
        }
    }

    #[test]
    fn a_frame_that_is_not_a_change_is_refused() {
        let bad = |json: &str, blob: &[u8]| {
            op(Frame {
                json: json.as_bytes().to_vec(),
                blob: blob.to_vec(),
            })
            .unwrap_err()
        };
        assert!(bad("{\"op\":\"launch\"}", b"").contains("a change"));
        assert!(bad("[]", b"").contains("a change"));
        let seal = frame(&Op::Seal { id: id() });
        let seal = String::from_utf8(seal.json).unwrap();
        assert!(bad(&seal, b"rows").contains("carries some"));
        assert!(
            bad(
                "{\"op\":\"committed\",\"table\":\"t\",\"until_ms\":1,\"keys\":[\"x\"]}",
                b""
            )
            .contains("message id")
        );
    }
}
