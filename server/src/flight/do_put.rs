//! DoPut: record batches of PATH `[table]` become SQS messages.

mod decode;

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::error::FlightError;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::{FlightData, PutResult};
use futures::{Stream, StreamExt, stream};
use serde_json::json;
use sqs_flight_schemas::Reason;
use sqs_flight_schemas::command::check_name;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::ipc_bounds::{HeldBudget, IpcBounds, IpcError};
use super::limits::ClientLimits;
use crate::error::{Error, Result};
use crate::registry::{Registry, Table};
use crate::write::{WriteError, off_runtime, rows, send_rows};

type PutStream = std::pin::Pin<Box<dyn Stream<Item = Result<PutResult, Status>> + Send>>;

/// The messages of a DoPut stream.
type FlightDataStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<FlightData, FlightError>> + Send>>;

/// Starts a DoPut: reads the descriptor, then sends batch after batch,
/// answering one PutResult `{"sent": n}` per batch, within `limits`; what
/// the stream holds decoded counts in `held`. A stream that sends nothing,
/// or reads no PutResult, for `put_idle_timeout` ends with
/// DEADLINE_EXCEEDED.
pub(crate) async fn do_put(
    registry: &Registry,
    mut input: Streaming<FlightData>,
    limits: ClientLimits,
    held: Arc<HeldBudget>,
) -> Result<PutStream, Status> {
    let idle = limits.put_idle_timeout;
    let first = tokio::time::timeout(idle, input.message())
        .await
        .map_err(|_| idle_status(None, 0, idle))?
        .map_err(read_error)?
        .ok_or_else(|| Error::InvalidArgument("DoPut stream is empty".into()))?;
    let table = Arc::clone(registry.table(&table_of(&first)?)?);
    let bounds = IpcBounds::new(limits.max_request_bytes, limits.max_put_rows)
        .with_held(held, limits.max_put_schema_bytes);
    let reader = Reader {
        bounds,
        decoder: decode::Decoder::default(),
    };
    let data = stream::once(async { Ok(first) }).chain(until_idle(input, idle));
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        if let Err(e) = write(&table, Box::pin(data), reader, &tx, limits).await {
            // A client that reads no answer gets none; the call's place is
            // given back when it reads or goes away.
            let _ = tokio::time::timeout(idle, tx.send(Err(e))).await;
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// What a DoPut stream keeps from one message to the next: its bounds
/// (and what it holds in the shared budget) and its decoder.
struct Reader {
    bounds: IpcBounds,
    decoder: decode::Decoder,
}

impl Reader {
    /// Checks `data` against the bounds before anything of it is decoded
    /// (a refusal is an [`IpcError`]), then decodes it: the record batch it
    /// holds, if any. Its CPU grows with the message (an LZ4 frame is run
    /// through once; strings are validated): it runs off the runtime.
    fn read(&mut self, data: FlightData) -> Result<Option<RecordBatch>, FlightError> {
        self.bounds
            .check(&data)
            .map_err(|e| FlightError::ExternalError(Box::new(e)))?;
        self.decoder.decode(data)
    }
}

/// The DoPut stream sent nothing for `put_idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the DoPut stream sent nothing for {0:?}")]
struct Idle(Duration);

/// The messages of `input`, as long as each comes within `idle` of the
/// server asking for it (time spent sending to SQS does not count: the
/// next message is asked for once a batch is sent); then an [`Idle`]
/// error, and the end.
fn until_idle(
    input: Streaming<FlightData>,
    idle: Duration,
) -> impl Stream<Item = Result<FlightData, FlightError>> + Send + 'static {
    stream::unfold(Some(input), move |input| async move {
        let mut input = input?;
        match tokio::time::timeout(idle, input.next()).await {
            Ok(Some(item)) => {
                let item = item.map_err(|s| FlightError::Tonic(Box::new(s)));
                Some((item, Some(input)))
            }
            Ok(None) => None,
            Err(_) => Some((Err(FlightError::ExternalError(Box::new(Idle(idle)))), None)),
        }
    })
}

/// The limit on how long a DoPut stream may send nothing.
const PUT_IDLE_TIMEOUT: &str = "put_idle_timeout";

/// DEADLINE_EXCEEDED naming `put_idle_timeout`, for a stream that sent
/// nothing for `idle` (on `table`, after `sent` rows).
fn idle_status(table: Option<&Table>, sent: u64, idle: Duration) -> Status {
    let on = table.map_or(String::new(), |t| format!("table {:?}: ", t.name()));
    let message = format!(
        "{on}the DoPut stream sent nothing for {} s, the limit (put_idle_timeout); \
         {sent} rows were sent before; send batches as they are made, or start a new call",
        idle.as_secs()
    );
    tracing::debug!(%message, "ended an idle DoPut stream");
    put_idle_timeout_status(message)
}

/// DEADLINE_EXCEEDED naming `put_idle_timeout`, for a stream whose client
/// read no PutResult for `idle`: the stream stops reading and gives back
/// the schema and dictionaries it held.
fn unread_status(table: &Table, idle: Duration) -> Status {
    let message = format!(
        "table {:?}: the client read no PutResult for {} s, the limit (put_idle_timeout); \
         read the answers as they come",
        table.name(),
        idle.as_secs()
    );
    tracing::debug!(%message, "ended a DoPut stream whose answers were not read");
    put_idle_timeout_status(message)
}

/// DEADLINE_EXCEEDED with `message`, reason `limit:put_idle_timeout`.
fn put_idle_timeout_status(message: String) -> Status {
    crate::error::status(
        tonic::Code::DeadlineExceeded,
        message,
        Reason::limit(PUT_IDLE_TIMEOUT),
    )
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
fn decode_error(table: &Table, sent: u64, e: FlightError) -> Status {
    let schema = |what: String| Error::Write {
        table: table.name().to_string(),
        sent,
        source: WriteError::Schema(what),
    };
    let error = match e {
        FlightError::Tonic(s) if s.code() == tonic::Code::OutOfRange => {
            over_limit(table, sent, MAX_REQUEST_BYTES, read_error(*s).to_string())
        }
        FlightError::ExternalError(e) => match e.downcast::<IpcError>().map(|e| *e) {
            Ok(IpcError::TooLarge { limit, message }) => over_limit(table, sent, limit, message),
            Ok(e) => schema(e.to_string()),
            Err(e) => match e.downcast::<Idle>() {
                Ok(idle) => return idle_status(Some(table), sent, idle.0),
                Err(e) => schema(format!("DoPut: not a valid Arrow stream: {e}")),
            },
        },
        e => schema(format!("DoPut: not a valid Arrow stream: {e}")),
    };
    error.into()
}

/// A decode that panicked: arrow-ipc still asserts on a few malformed
/// inputs [`IpcBounds`] does not look for (a validity buffer shorter than
/// its column, say); the call ends as for any batch that does not decode.
fn undecodable(table: &Table, sent: u64, e: tokio::task::JoinError) -> Status {
    if !e.is_panic() {
        return panicked(e);
    }
    tracing::warn!("DoPut: the Arrow decoder panicked on the client's input");
    let what = "DoPut: not a valid Arrow stream: the record batch does not decode (its \
                buffers contradict its header)";
    Error::Write {
        table: table.name().to_string(),
        sent,
        source: WriteError::Schema(what.into()),
    }
    .into()
}

/// A conversion that panicked: a bug, not the client's input.
fn panicked(e: tokio::task::JoinError) -> Status {
    Error::Internal(format!("DoPut: converting rows failed: {e}")).into()
}

/// Decodes the messages of `input` off the runtime and sends their batches
/// to `table` a slice at a time ([`crate::write::send_rows`]), answering
/// one PutResult per batch.
async fn write(
    table: &Table,
    input: FlightDataStream,
    reader: Reader,
    results: &mpsc::Sender<Result<PutResult, Status>>,
    limits: ClientLimits,
) -> Result<(), Status> {
    let mut sent = 0u64;
    write_batches(table, input, reader, results, limits, &mut sent)
        .await
        .map_err(|status| with_rows_sent(status, sent))
}

/// `status` with the `sqsf-rows-sent` trailer: `sent` rows of the call
/// were sent before it failed.
fn with_rows_sent(mut status: Status, sent: u64) -> Status {
    status.metadata_mut().insert(
        sqs_flight_schemas::reason::ROWS_SENT_HEADER,
        tonic::metadata::MetadataValue::from(sent),
    );
    status
}

/// The status of a write that stopped for `source` after `sent` rows, with
/// the `sqsf-row` trailer when one row was the reason.
fn write_failed(table: &Table, sent: u64, source: WriteError) -> Status {
    let row = match &source {
        WriteError::Row { row, .. } | WriteError::Offload { row, .. } => Some(*row),
        WriteError::Schema(_) | WriteError::Sqs(_) => None,
    };
    let mut status: Status = Error::Write {
        table: table.name().to_string(),
        sent,
        source,
    }
    .into();
    if let Some(row) = row {
        status.metadata_mut().insert(
            sqs_flight_schemas::reason::ROW_HEADER,
            tonic::metadata::MetadataValue::from(row),
        );
    }
    status
}

/// [`write`]'s loop; `sent` counts the rows sent so far.
async fn write_batches(
    table: &Table,
    mut input: FlightDataStream,
    mut reader: Reader,
    results: &mpsc::Sender<Result<PutResult, Status>>,
    limits: ClientLimits,
    sent: &mut u64,
) -> Result<(), Status> {
    let rules = rows::RowRules {
        fifo: table.is_fifo(),
        max_message_bytes: table.max_body_bytes(),
    };
    let mut rows_seen = 0u64;
    let mut bytes_seen = 0u64;
    let fail = |sent: u64, source: WriteError| write_failed(table, sent, source);
    while let Some(data) = input.next().await {
        let data = data.map_err(|e| decode_error(table, *sent, e))?;
        let (back, decoded) = off_runtime(move || {
            let decoded = reader.read(data);
            (reader, decoded)
        })
        .await
        .map_err(|e| undecodable(table, *sent, e))?;
        reader = back;
        let Some(batch) = decoded.map_err(|e| decode_error(table, *sent, e))? else {
            continue; // a schema or a dictionary
        };
        rows::check_schema(&batch.schema()).map_err(|e| fail(*sent, e))?;
        let rows_after = rows_seen + batch.num_rows() as u64;
        if rows_after > limits.max_put_rows {
            return Err(over_limit(
                table,
                *sent,
                "max_put_rows",
                format!(
                    "this batch would make {rows_after} rows in one DoPut call, above the limit \
                     of {} (max_put_rows); send the rest in another call",
                    limits.max_put_rows
                ),
            )
            .into());
        }
        let first_row = rows_seen;
        let rows = off_runtime(move || rows::Rows::new(&batch, first_row, rules))
            .await
            .map_err(panicked)?
            .map_err(|e| fail(*sent, e))?;
        let rows = check_put_bytes(table, rows, bytes_seen, *sent, limits.max_put_bytes).await?;
        rows_seen = rows_after;
        let done = send_rows(table, rows).await.map_err(panicked)?;
        bytes_seen += done.bytes;
        *sent += done.rows;
        if let Some(e) = done.error {
            return Err(fail(*sent, e));
        }
        let metadata = json!({ "sent": done.rows }).to_string();
        let result = PutResult {
            app_metadata: metadata.into_bytes().into(),
        };
        match tokio::time::timeout(limits.put_idle_timeout, results.send(Ok(result))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break, // the client hung up
            Err(_) => return Err(unread_status(table, limits.put_idle_timeout)),
        }
    }
    tracing::info!(table = %table.name(), rows = rows_seen, sent = *sent, "DoPut finished");
    Ok(())
}

/// Refuses the whole batch of `rows` if it would take the call past
/// `max_put_bytes` (`bytes_seen` before it, `sent` rows sent), before any
/// of it is sent. Its rows are measured one by one (off the runtime) only
/// when their columns' sizes say it might.
async fn check_put_bytes(
    table: &Table,
    rows: rows::Rows,
    bytes_seen: u64,
    sent: u64,
    max_put_bytes: u64,
) -> Result<rows::Rows, Status> {
    if bytes_seen.saturating_add(rows.bytes_at_most()) <= max_put_bytes {
        return Ok(rows);
    }
    let (rows, bytes) = off_runtime(move || {
        let bytes = rows.measure();
        (rows, bytes)
    })
    .await
    .map_err(panicked)?;
    let total = bytes_seen.saturating_add(bytes);
    if total > max_put_bytes {
        return Err(over_limit(
            table,
            sent,
            "max_put_bytes",
            format!(
                "this batch would make {total} bytes in one DoPut call, above the limit of \
                 {max_put_bytes} (max_put_bytes); send the rest in another call"
            ),
        )
        .into());
    }
    Ok(rows)
}

/// A stream of decoded batches that turns a panic of the decoder into an
/// error and ends: arrow-ipc still asserts on a few malformed inputs
/// [`IpcBounds`] does not look for (a validity buffer shorter than its
/// column, say), and a decode that panicked must not look like one that
/// finished. (DoPut itself decodes on the blocking pool, where a panic is
/// caught by the task; the property tests decode through this.)
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
