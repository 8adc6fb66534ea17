//! The write path: DoPut record batches become SQS messages.
//!
//! [`rows`] turns a record batch into messages, checking each row against
//! what SQS will accept, so that a row that can never be sent is named
//! before anything of it is sent; [`send`] packs messages into
//! SendMessageBatch calls within SQS's limits, runs them with bounded
//! concurrency, and retries the entries SQS failed on its side.
//!
//! A batch is converted and sent a slice at a time ([`send_rows`]): a batch
//! of ten million one-byte bodies is 48 MiB on the wire, but as messages it
//! would be ten million structs at once. Each slice is converted on the
//! blocking pool, a few at a time over the whole server ([`off_runtime`]),
//! since its CPU grows with what the client sent.

pub mod rows;
pub mod send;

use std::sync::{Arc, LazyLock};

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinError;

use crate::registry::Table;

/// Rows of one slice at most: a hundred SendMessageBatch calls of ten.
pub const SLICE_ROWS: usize = 1000;
/// Bytes of one slice at most, as SQS counts them (its last row may pass
/// it): eight full SendMessageBatch calls, what a standard queue keeps in
/// flight ([`send::SEND_CONCURRENCY`]).
pub const SLICE_BYTES: usize = 8 << 20;
/// Slices converted and waiting while one is sent. With the one being sent
/// and the one being converted, a DoPut holds at most three.
const SLICES_AHEAD: usize = 1;

/// Conversions that run at once on the blocking pool, over all DoPut calls:
/// one per CPU, so that calls converting millions of rows take turns
/// instead of taking every thread.
static CONVERSIONS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(Semaphore::new(cpus))
});

/// Runs `work` (CPU that grows with a client's input) on the blocking pool
/// once one of the [`CONVERSIONS`] is free, off the async runtime's threads.
pub async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, JoinError> {
    // Never closed; without a permit the work still runs off the runtime.
    let permit = Arc::clone(&CONVERSIONS).acquire_owned().await.ok();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
}

/// What [`send_rows`] did.
#[derive(Debug, Default)]
pub struct Sent {
    /// Rows SQS took.
    pub rows: u64,
    /// Bytes (as SQS counts them) of the rows converted.
    pub bytes: u64,
    /// Why the batch stopped: a bad row, SQS, S3.
    pub error: Option<WriteError>,
}

/// Sends the rows of one batch to `table`, converting slice after slice
/// off the runtime while the slice before is sent. Rows go out in order; at
/// a bad row or a failed send, nothing after it is sent, and the count of
/// rows sent is exact. Fails only if a conversion panicked.
pub async fn send_rows(table: &Table, rows: rows::Rows) -> Result<Sent, JoinError> {
    let (slices, mut ready) = mpsc::channel::<rows::Slice>(SLICES_AHEAD);
    let convert = async move {
        let mut rows = rows;
        while !rows.is_done() {
            let (back, slice) = off_runtime(move || {
                let slice = rows.next_slice(SLICE_ROWS, SLICE_BYTES);
                (rows, slice)
            })
            .await?;
            rows = back;
            if slices.send(slice).await.is_err() {
                break; // the sender stopped at an error
            }
        }
        Ok(())
    };
    let send = async move {
        let mut sent = Sent::default();
        while let Some(slice) = ready.recv().await {
            sent.bytes += slice.bytes;
            let (n, error) = table.send(slice.messages, slice.first_row).await;
            sent.rows += n;
            sent.error = error.or(slice.bad_row);
            if sent.error.is_some() {
                break; // dropping `ready` stops the conversion
            }
        }
        sent
    };
    let (converted, sent) = tokio::join!(convert, send);
    converted.map(|()| sent)
}

/// Why a write stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The input itself is wrong (missing `body`, wrong column type).
    #[error("{0}")]
    Schema(String),
    /// One row can never be sent.
    #[error("row {row}: {reason}")]
    Row { row: u64, reason: String },
    /// SQS could not be reached or failed past its retries.
    #[error(transparent)]
    Sqs(#[from] crate::sqs::SqsError),
    /// A large body could not be put into S3 (`large_payloads.bucket`).
    #[error("row {row}: {error}")]
    Offload {
        row: u64,
        error: Box<crate::large_payload::ObjectError>,
    },
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use arrow_array::{ArrayRef, RecordBatch, StringArray};

    use super::*;
    use crate::config::TableConfig;
    use crate::sqs::memory::MemoryQueue;
    use crate::sqs::{Queue, ReceiveRequest};

    fn table(queue: &Arc<MemoryQueue>) -> Table {
        let served: Arc<dyn Queue> = queue.clone();
        Table::new(TableConfig::memory("t", 0), served)
    }

    fn rows_of(bodies: Vec<String>, first_row: u64) -> rows::Rows {
        let bodies: ArrayRef = Arc::new(StringArray::from(bodies));
        let batch = RecordBatch::try_from_iter([("body", bodies)]).unwrap();
        rows::Rows::new(&batch, first_row, rows::RowRules::sqs(false)).unwrap()
    }

    async fn bodies_in(queue: &MemoryQueue) -> Vec<String> {
        let mut bodies = Vec::new();
        loop {
            let req = ReceiveRequest {
                max_messages: 10,
                wait: Duration::ZERO,
                visibility_timeout: Duration::from_secs(600),
            };
            let got = queue.receive(req).await.unwrap();
            if got.is_empty() {
                bodies.sort();
                return bodies;
            }
            bodies.extend(got.into_iter().map(|r| r.message.body));
        }
    }

    #[tokio::test]
    async fn rows_of_several_slices_reach_the_queue_once_each() {
        let queue = Arc::new(MemoryQueue::new("t"));
        let n = 2 * SLICE_ROWS + 345;
        let bodies: Vec<String> = (0..n).map(|i| format!("m{i:05}")).collect();
        let sent = send_rows(&table(&queue), rows_of(bodies.clone(), 0))
            .await
            .unwrap();
        assert!(sent.error.is_none(), "{:?}", sent.error);
        assert_eq!(sent.rows, n as u64);
        assert_eq!(sent.bytes, 6 * n as u64);
        assert_eq!(bodies_in(&queue).await, bodies);
    }

    #[tokio::test]
    async fn a_bad_row_in_a_later_slice_stops_the_batch_there() {
        let queue = Arc::new(MemoryQueue::new("t"));
        let n = 2 * SLICE_ROWS + 345;
        let bad = SLICE_ROWS + 17;
        let mut bodies: Vec<String> = (0..n).map(|i| format!("m{i:05}")).collect();
        bodies[bad] = String::new();
        let sent = send_rows(&table(&queue), rows_of(bodies.clone(), 50))
            .await
            .unwrap();
        let error = sent.error.expect("the empty body").to_string();
        assert!(
            error.starts_with(&format!("row {}: body is empty", 50 + bad)),
            "{error}"
        );
        assert_eq!(sent.rows, bad as u64, "every row before it, none after");
        bodies.truncate(bad);
        assert_eq!(bodies_in(&queue).await, bodies);
    }
}
