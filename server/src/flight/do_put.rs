//! DoPut: record batches of PATH `[table]` become SQS messages.

use std::sync::Arc;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::{FlightData, PutResult};
use futures::{Stream, StreamExt, TryStreamExt, stream};
use serde_json::json;
use sqs_flight_schemas::Reason;
use sqs_flight_schemas::command::check_name;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::ipc_bounds::{IpcBounds, IpcError};
use super::limits::ClientLimits;
use crate::error::{Error, Result};
use crate::registry::{Registry, Table};
use crate::write::{WriteError, rows};

type PutStream = std::pin::Pin<Box<dyn Stream<Item = Result<PutResult, Status>> + Send>>;

/// Starts a DoPut: reads the descriptor, then sends batch after batch,
/// answering one PutResult `{"sent": n}` per batch, within `limits`.
pub async fn do_put(
    registry: &Registry,
    mut input: Streaming<FlightData>,
    limits: ClientLimits,
) -> Result<PutStream> {
    let first = input
        .message()
        .await
        .map_err(read_error)?
        .ok_or_else(|| Error::InvalidArgument("DoPut stream is empty".into()))?;
    let table = Arc::clone(registry.table(&table_of(&first)?)?);
    let mut bounds = IpcBounds::new(limits.max_request_bytes, limits.max_put_rows);
    let data = stream::once(async { Ok(first) })
        .chain(input)
        .map_err(|s| FlightError::Tonic(Box::new(s)))
        .and_then(move |data| {
            let checked = bounds.check(&data).map(|()| data);
            async move { checked.map_err(|e| FlightError::ExternalError(Box::new(e))) }
        });
    let batches = CatchPanic::new(FlightRecordBatchStream::new_from_flight_data(data));
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        if let Err(e) = write(&table, batches, &tx, limits).await {
            let _ = tx.send(Err(e.into())).await;
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// A message of the DoPut stream that could not be read. tonic refuses a
/// message above `max_request_bytes` with OUT_OF_RANGE; it is a limit of
/// this server, so it is told as one, as is `max_buffered_request_bytes`
/// (RESOURCE_EXHAUSTED from [`crate::request_budget`]).
fn read_error(s: Status) -> Error {
    match s.code() {
        tonic::Code::ResourceExhausted => {
            let limit = match crate::error::reason_of(&s) {
                Some(Reason::Limit(limit)) => limit,
                _ => "max_buffered_request_bytes".into(),
            };
            Error::limit(limit, s.message())
        }
        tonic::Code::OutOfRange => Error::limit(
            MAX_REQUEST_BYTES,
            format!(
                "DoPut: a message is larger than this server accepts (max_request_bytes): {}; \
             send smaller record batches",
                s.message()
            ),
        ),
        _ => Error::InvalidArgument(format!("reading the DoPut stream: {}", s.message())),
    }
}

/// The limit on one message of a DoPut stream.
const MAX_REQUEST_BYTES: &str = "max_request_bytes";

/// The error of a DoPut that stopped at `limit`, after `sent` rows.
fn over_limit(table: &Table, sent: u64, limit: &str, what: String) -> Error {
    Error::limit(
        limit,
        format!(
            "table {:?}: {what}; nothing of this batch was sent, {sent} rows were sent before it",
            table.name()
        ),
    )
}

fn table_of(first: &FlightData) -> Result<String> {
    let descriptor = first.flight_descriptor.as_ref().ok_or_else(|| {
        Error::InvalidArgument("DoPut needs a PATH [table] descriptor on its first message".into())
    })?;
    match (
        DescriptorType::try_from(descriptor.r#type),
        descriptor.path.as_slice(),
    ) {
        (Ok(DescriptorType::Path), [table]) => {
            check_name("DoPut descriptor", "table", table)?;
            Ok(table.clone())
        }
        (Ok(DescriptorType::Cmd), _) if crate::sql::is_flight_sql(&descriptor.cmd) => {
            Err(Error::ReadOnly(crate::sql::READ_ONLY.into()))
        }
        _ => Err(Error::InvalidArgument(
            "DoPut descriptor must be PATH [table]".into(),
        )),
    }
}

/// Why the next record batch of a DoPut could not be decoded, after `sent` rows.
fn decode_error(table: &Table, sent: u64, e: FlightError) -> Error {
    let schema = |what: String| Error::Write {
        table: table.name().to_string(),
        sent,
        source: WriteError::Schema(what),
    };
    match e {
        FlightError::Tonic(s) if s.code() == tonic::Code::OutOfRange => {
            over_limit(table, sent, MAX_REQUEST_BYTES, read_error(*s).to_string())
        }
        FlightError::ExternalError(e) => match e.downcast::<IpcError>().map(|e| *e) {
            Ok(IpcError::TooLarge { limit, message }) => over_limit(table, sent, limit, message),
            Ok(e) => schema(e.to_string()),
            Err(e) => schema(format!("DoPut: not a valid Arrow stream: {e}")),
        },
        e => schema(format!("DoPut: not a valid Arrow stream: {e}")),
    }
}

async fn write(
    table: &Table,
    mut batches: CatchPanic<FlightRecordBatchStream>,
    results: &mpsc::Sender<Result<PutResult, Status>>,
    limits: ClientLimits,
) -> Result<()> {
    let rules = rows::RowRules {
        fifo: table.is_fifo(),
        max_message_bytes: table.max_body_bytes(),
    };
    let mut rows_seen = 0u64;
    let mut bytes_seen = 0u64;
    let mut sent = 0u64;
    let fail = |sent: u64, source: WriteError| Error::Write {
        table: table.name().to_string(),
        sent,
        source,
    };
    while let Some(batch) = batches.next().await {
        let batch = batch.map_err(|e| decode_error(table, sent, e))?;
        rows::check_schema(&batch.schema()).map_err(|e| fail(sent, e))?;
        let rows_after = rows_seen + batch.num_rows() as u64;
        if rows_after > limits.max_put_rows {
            return Err(over_limit(
                table,
                sent,
                "max_put_rows",
                format!(
                    "this batch would make {rows_after} rows in one DoPut call, above the limit \
                     of {} (max_put_rows); send the rest in another call",
                    limits.max_put_rows
                ),
            ));
        }
        let (messages, bad_row) =
            rows::messages(&batch, rows_seen, rules).map_err(|e| fail(sent, e))?;
        let bytes: u64 = messages.iter().map(|m| m.sqs_size() as u64).sum();
        if bytes_seen + bytes > limits.max_put_bytes {
            return Err(over_limit(
                table,
                sent,
                "max_put_bytes",
                format!(
                    "this batch would make {} bytes in one DoPut call, above the limit of {} \
                     (max_put_bytes); send the rest in another call",
                    bytes_seen + bytes,
                    limits.max_put_bytes
                ),
            ));
        }
        bytes_seen += bytes;
        rows_seen += batch.num_rows() as u64;
        let (n, error) = table
            .send(messages, rows_seen - batch.num_rows() as u64)
            .await;
        sent += n;
        if let Some(e) = error.or(bad_row) {
            return Err(fail(sent, e));
        }
        let metadata = json!({ "sent": n }).to_string();
        let result = PutResult {
            app_metadata: metadata.into_bytes().into(),
        };
        if results.send(Ok(result)).await.is_err() {
            break; // the client hung up
        }
    }
    tracing::info!(table = %table.name(), rows = rows_seen, sent, "DoPut finished");
    Ok(())
}

/// A stream of decoded batches that turns a panic of the decoder into an
/// error and ends: arrow-ipc still asserts on a few malformed inputs
/// [`IpcBounds`] does not look for (a validity buffer shorter than its
/// column, say), and a DoPut whose decoding panicked must not look like one
/// that finished.
pub struct CatchPanic<S> {
    inner: S,
    done: bool,
}

impl<S> CatchPanic<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, done: false }
    }
}

impl<S, T> Stream for CatchPanic<S>
where
    S: Stream<Item = Result<T, FlightError>> + Unpin,
{
    type Item = Result<T, FlightError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.done {
            return std::task::Poll::Ready(None);
        }
        let inner = &mut self.inner;
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll_next_unpin(cx)));
        polled.unwrap_or_else(|_| {
            self.done = true;
            tracing::warn!("DoPut: the Arrow decoder panicked on the client's input");
            std::task::Poll::Ready(Some(Err(FlightError::DecodeError(
                "the record batch does not decode (its buffers contradict its header)".into(),
            ))))
        })
    }
}
