//! The keys of the store's tables (see the module's `# Layout`).

use sqs_flight_schemas::TicketId;

/// `u32 len, table, u32 len, consumer`.
pub(super) fn consumer_key(table: &str, consumer: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + table.len() + consumer.len() + 24);
    for part in [table, consumer] {
        k.extend_from_slice(&(part.len() as u32).to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k
}

pub(super) fn key(table: &str, consumer: &str, tail: &[u64]) -> Vec<u8> {
    let mut k = consumer_key(table, consumer);
    for n in tail {
        k.extend_from_slice(&n.to_be_bytes());
    }
    k
}

/// The key of chunk `seq` of ticket `id`.
pub(super) fn chunk_key(id: &TicketId, seq: u64) -> Vec<u8> {
    key(
        &id.table,
        &id.consumer,
        &[id.batch, u64::from(id.partition), seq],
    )
}

/// Splits a key into table, consumer and its `u64` tail; `None` if it is
/// not a key this module wrote.
pub(super) fn parse_key(k: &[u8]) -> Option<(String, String, Vec<u64>)> {
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
