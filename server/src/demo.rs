//! Sample messages for the embedded demo table.

use crate::sqs::memory::MemoryQueue;

const KINDS: &[&str] = &["order_created", "order_paid", "order_shipped"];

/// A memory queue holding `count` JSON order events.
pub fn seeded_queue(name: &str, count: u64) -> MemoryQueue {
    let queue = MemoryQueue::new(name);
    for i in 0..count {
        let kind = KINDS[(i % KINDS.len() as u64) as usize];
        let body = format!(
            r#"{{"order_id":{},"event":"{kind}","amount_cents":{}}}"#,
            1000 + i,
            (i * 731) % 10_000
        );
        queue.send(body, vec![("event".to_string(), kind.to_string())]);
    }
    queue
}
