//! Reading a ticket: the stream of its rows that DoGet sends and the Flight
//! SQL peeks collect, in-process. The first read of a ticket starts its
//! receive loop ([`super::receive`]); every read, the first included,
//! follows the ticket's log ([`super::ticket`]), so replays see the same
//! rows in the same order.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt, stream};
use sqs_flight_schemas::TicketId;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::Registry;
use super::receive::{ReceiveLoop, ReceiveSummary};
use super::ticket::{Begin, Ticket};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, OpenStream};

impl Registry {
    /// The rows of ticket `id`: received first if nobody has (rule 1 of
    /// docs/protocol.md#the-rules: recorded before they are yielded),
    /// replayed otherwise. A first read's receive stops when the stream is
    /// dropped or `shutdown` is cancelled.
    pub fn read(
        self: &Arc<Self>,
        id: &TicketId,
        shutdown: &CancellationToken,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        self.read_as(id, shutdown, Reader::Consumer)
    }

    /// [`Registry::read`] by `reader`: a consumer's read that follows the
    /// registry's own receive of the ticket takes over from it when that
    /// receive fails (see [`Reader`]).
    fn read_as(
        self: &Arc<Self>,
        id: &TicketId,
        shutdown: &CancellationToken,
        reader: Reader,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let (table, batch, ticket) = self.ticket(id)?;
        let begin = ticket.begin();
        let follows_registry = !begin.first && begin.joins_ahead;
        let receiving = begin.first.then(|| {
            let cancel = shutdown.child_token();
            let receive = ReceiveLoop {
                registry: Arc::clone(self),
                table,
                batch,
                ticket: Arc::clone(&ticket),
                cancel: cancel.clone(),
                background: false,
            };
            Receiving {
                task: tokio::spawn(receive.run()),
                _stop_on_drop: cancel.drop_guard(),
            }
        });
        let rows = rows(ticket, begin, receiving, Arc::clone(&self.metrics)).boxed();
        match reader {
            Reader::Consumer if follows_registry => Ok(self.taking_over(id, shutdown, rows)),
            _ => Ok(rows),
        }
    }

    /// `rows`, the stream of a consumer's read that follows the registry's
    /// own receive; if that receive fails, the stream of a read that takes
    /// over from it instead ([`Reader::TakingOver`]).
    fn taking_over(
        self: &Arc<Self>,
        id: &TicketId,
        shutdown: &CancellationToken,
        rows: BoxStream<'static, Result<RecordBatch>>,
    ) -> BoxStream<'static, Result<RecordBatch>> {
        // The registry's receive fails only before it recorded a row, so a
        // failure is this stream's first item.
        let (registry, id, shutdown) = (Arc::clone(self), id.clone(), shutdown.clone());
        let first = rows.into_future().then(move |(first, rest)| async move {
            match first {
                Some(Err(e)) => {
                    tracing::debug!(table = %id.table, consumer = %id.consumer, batch = id.batch,
                        partition = id.partition, error = %e,
                        "the registry's receive of a ticket failed; its first read receives");
                    registry
                        .read_as(&id, &shutdown, Reader::TakingOver)
                        .unwrap_or_else(|e| stream::once(async { Err(e) }).boxed())
                }
                first => stream::iter(first).chain(rest).boxed(),
            }
        });
        stream::once(first).flatten().boxed()
    }
}

/// Who reads a ticket.
///
/// A consumer's first read may follow the registry's own receive of the
/// ticket (read-ahead, `receive_at_plan`). When that receive fails before
/// recording anything (SQS's in-flight cap, an SQS error), the ticket is
/// fresh again and the consumer's read takes over: it reads again as the
/// first read, and receives with the back-off and retries a consumer's
/// first read has, as it would had it come a moment later, instead of
/// answering the registry's failure. The read that took over does not take
/// over again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    /// A consumer's read (DoGet, a Flight SQL peek).
    Consumer,
    /// A consumer's read that took over from the registry's failed
    /// receive.
    TakingOver,
}

/// Record batches found ready together are joined into one (one Flight
/// message, for DoGet) of up to this many source batches...
const JOIN_BATCHES: usize = 64;
/// ...and about this many bytes of buffers (the encoder's own size for one
/// message, past which it splits a batch).
const JOIN_BYTES: usize = 2 << 20;

/// Joins the record batches a reader finds ready at once (a first read
/// that fell behind its receive, or a replay of a log not yet coalesced)
/// into fewer, larger ones: each Flight message costs encoding, framing
/// and decoding work whatever its size, and one receive is only ten rows.
/// A batch that is alone when read goes out at once, so nothing waits.
fn joined(
    batches: impl Stream<Item = Result<RecordBatch>> + Send,
) -> impl Stream<Item = Result<RecordBatch>> + Send {
    batches
        .ready_chunks(JOIN_BATCHES)
        .flat_map(|ready| stream::iter(join_ready(ready)))
}

fn join_ready(ready: Vec<Result<RecordBatch>>) -> Vec<Result<RecordBatch>> {
    if ready.len() < 2 {
        return ready;
    }
    let mut out = Vec::new();
    let mut group = Vec::new();
    let mut group_bytes = 0;
    for item in ready {
        match item {
            Ok(b) => {
                let bytes: usize = b.columns().iter().map(|c| c.get_buffer_memory_size()).sum();
                if !group.is_empty() && group_bytes + bytes > JOIN_BYTES {
                    out.extend(join(std::mem::take(&mut group)).into_iter().map(Ok));
                    group_bytes = 0;
                }
                group_bytes += bytes;
                group.push(b);
            }
            Err(e) => {
                out.extend(join(std::mem::take(&mut group)).into_iter().map(Ok));
                group_bytes = 0;
                out.push(Err(e));
            }
        }
    }
    out.extend(join(group).into_iter().map(Ok));
    out
}

/// One batch of `group`'s rows, or the batches as they are if they do not
/// concatenate (they always share the table schema).
fn join(group: Vec<RecordBatch>) -> Vec<RecordBatch> {
    if group.len() < 2 {
        return group;
    }
    let schema = group[0].schema();
    match arrow_select::concat::concat_batches(&schema, &group) {
        Ok(one) => vec![one],
        Err(e) => {
            tracing::debug!(error = %e, "could not join ready record batches; sending them one by one");
            group
        }
    }
}

/// The receive task of a first read. Dropping it (the client hung up)
/// cancels the receive at once.
struct Receiving {
    task: JoinHandle<Result<ReceiveSummary>>,
    _stop_on_drop: DropGuard,
}

/// Logs one line per stream when it ends, however it ends.
struct StreamSummary {
    open: OpenStream,
    ticket: Arc<Ticket>,
    replay: bool,
    rows: u64,
    started: Instant,
}

impl Drop for StreamSummary {
    fn drop(&mut self) {
        let id = self.ticket.id();
        tracing::info!(table = %id.table, consumer = %id.consumer, batch = id.batch,
            partition = id.partition, rows = self.rows, replay = self.replay,
            duration_ms = self.started.elapsed().as_millis() as u64, "DoGet stream ended");
        if self.replay {
            Metrics::count(&self.open.0.replayed, &id.table, &id.consumer, self.rows);
        }
    }
}

/// The ticket's rows, then the receive task's error, if it failed.
fn rows(
    ticket: Arc<Ticket>,
    begin: Begin,
    receiving: Option<Receiving>,
    metrics: Arc<Metrics>,
) -> impl Stream<Item = Result<RecordBatch>> + Send {
    let mut summary = StreamSummary {
        open: OpenStream::new(metrics),
        ticket: Arc::clone(&ticket),
        replay: receiving.is_none() && !begin.joins_ahead,
        rows: 0,
        started: Instant::now(),
    };
    let batches = joined(ticket.follow(begin)).map(move |b| {
        if let Ok(b) = &b {
            summary.rows += b.num_rows() as u64;
        }
        let _ = &summary;
        b
    });
    let outcome = stream::once(async move {
        match receiving {
            None => None,
            Some(r) => match r.task.await {
                Ok(Ok(_summary)) => None,
                Ok(Err(e)) => Some(Err(e)),
                Err(join) => Some(Err(Error::Internal(format!("receive task failed: {join}")))),
            },
        }
    })
    .filter_map(|x| async move { x });
    batches.chain(outcome)
}

#[cfg(test)]
mod tests {
    use arrow_array::Int32Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn batch(values: &[i32]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from(values.to_vec()))]).unwrap()
    }

    fn values(b: &RecordBatch) -> Vec<i32> {
        b.column(0).as_primitive::<Int32Type>().values().to_vec()
    }

    #[test]
    fn ready_batches_are_joined_in_order_and_errors_keep_their_place() {
        let ready = vec![
            Ok(batch(&[1, 2])),
            Ok(batch(&[3])),
            Err(Error::Internal("boom".into())),
            Ok(batch(&[4])),
            Ok(batch(&[5, 6])),
        ];
        let out = join_ready(ready);
        assert_eq!(out.len(), 3);
        assert_eq!(values(out[0].as_ref().unwrap()), [1, 2, 3]);
        assert!(matches!(&out[1], Err(Error::Internal(m)) if m == "boom"));
        assert_eq!(values(out[2].as_ref().unwrap()), [4, 5, 6]);
        // A lone batch goes out as it is.
        let one = join_ready(vec![Ok(batch(&[7]))]);
        assert_eq!(values(one[0].as_ref().unwrap()), [7]);
    }

    #[test]
    fn joined_messages_stay_near_the_encoder_message_size() {
        let big: Vec<i32> = (0..(JOIN_BYTES / 4 / 3) as i32).collect();
        let ready = (0..7).map(|_| Ok(batch(&big))).collect();
        let out = join_ready(ready);
        let rows: Vec<usize> = out.iter().map(|b| b.as_ref().unwrap().num_rows()).collect();
        assert_eq!(rows.iter().sum::<usize>(), 7 * big.len());
        assert!(rows.len() >= 3, "{rows:?}");
        assert!(rows.iter().all(|&r| r <= 3 * big.len()), "{rows:?}");
    }

    #[tokio::test]
    async fn a_lone_ready_batch_is_not_held_back() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut out = Box::pin(joined(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        ));
        tx.send(Ok(batch(&[1]))).unwrap();
        let first = out.next().await.unwrap().unwrap();
        assert_eq!(values(&first), [1]);
        tx.send(Ok(batch(&[2]))).unwrap();
        tx.send(Ok(batch(&[3]))).unwrap();
        let next = out.next().await.unwrap().unwrap();
        assert_eq!(values(&next), [2, 3]);
        drop(tx);
        assert!(out.next().await.is_none());
    }
}
