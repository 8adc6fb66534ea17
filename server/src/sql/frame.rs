//! What the server and a SQL worker process ([`super::child`],
//! [`super::worker`]) say to each other over the worker's stdin and
//! stdout: frames of `[kind u8][length u32 LE][payload]`.
//!
//! Every frame's length is checked against a cap before its payload is
//! allocated: the server reads at most [`MAX_WORKER_FRAME`] bytes from a
//! worker (so a query cannot make the server allocate what it likes), the
//! worker at most [`MAX_SERVER_FRAME`]. A peek's rows cross as Arrow IPC
//! streams, sliced by rows so that each fits a frame ([`encode_batch`]);
//! a result crosses as the very FlightData messages of its DoGet
//! ([`super::encode`]), which the server relays without decoding them.
//!
//! A statement's exchange: the server sends [`Kind::Request`]; to plan it,
//! the worker answers [`Kind::Schema`] (or [`Kind::Error`]) and
//! [`Kind::End`]; to run it, [`Kind::Started`] once its peeks are read,
//! then the result's messages ([`Kind::Flight`], the schema first) and
//! [`Kind::End`]. A scan asks the server for a peek with [`Kind::Peek`];
//! the server answers [`Kind::PeekRows`] then [`Kind::PeekEnd`] or
//! [`Kind::PeekError`], each tagged with the peek's id.

use std::io::Cursor;

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, SchemaRef};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::sql::show_bytes;

/// Largest frame the server reads from a worker: a gRPC message's size.
pub(crate) const MAX_WORKER_FRAME: usize = crate::server::MAX_MESSAGE_SIZE;
/// Largest frame a worker reads from the server: the statement's text (at
/// most `--max-request-bytes`, itself at most 1 GiB) and the catalog.
pub(crate) const MAX_SERVER_FRAME: usize =
    (crate::config::LIMIT_MAX_REQUEST_BYTES as usize) + (64 << 20);
/// Bytes of a frame's header.
const HEADER: usize = 5;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Server to worker: the [`Request`] (JSON).
    Request = 1,
    /// Server to worker: `[id u64][partition u32]` and an IPC batch.
    PeekRows = 2,
    /// Server to worker: `[id u64][partitions u32]`, the peek is whole.
    PeekEnd = 3,
    /// Server to worker: a [`PeekFailed`] (JSON).
    PeekError = 4,
    /// Worker to server: the result schema of a planned statement (IPC).
    Schema = 10,
    /// Worker to server: the query runs (its peeks are read).
    Started = 11,
    /// Worker to server: one FlightData message of the result
    /// ([`super::encode::flight_data`]).
    Flight = 12,
    /// Worker to server: the statement is done.
    End = 13,
    /// Worker to server: the statement failed, a [`Failure`] (JSON).
    Error = 14,
    /// Worker to server: a [`PeekRequest`] (JSON).
    Peek = 15,
}

impl Kind {
    fn from_u8(byte: u8) -> Option<Self> {
        use Kind::*;
        [
            Request, PeekRows, PeekEnd, PeekError, Schema, Started, Flight, End, Error, Peek,
        ]
        .into_iter()
        .find(|k| *k as u8 == byte)
    }
}

/// One frame.
#[derive(Debug)]
pub(crate) struct Frame {
    pub kind: Kind,
    pub payload: Vec<u8>,
}

/// Why a frame could not be read, written or decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of {len} bytes is over the cap of {cap} bytes")]
    TooLarge { len: usize, cap: usize },
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("a {0:?} frame is malformed: {1}")]
    Malformed(Kind, String),
    #[error("Arrow IPC: {0}")]
    Ipc(#[from] ArrowError),
    /// One row is larger than a frame may be.
    #[error(
        "one result row takes {} as Arrow IPC, over the {} a message may carry",
        show_bytes(*.bytes as u64),
        show_bytes(*.cap as u64)
    )]
    RowTooLarge { bytes: usize, cap: usize },
    /// One dictionary of a result column is larger than a message may be.
    #[error(
        "one dictionary of a result column takes {} as Arrow IPC, over the {} a message may carry",
        show_bytes(*.bytes as u64),
        show_bytes(*.cap as u64)
    )]
    DictionaryTooLarge { bytes: usize, cap: usize },
}

/// Whether the statement is only planned (its schema) or run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Mode {
    Plan,
    Run,
}

/// The statement a worker runs, its catalog and its limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    pub mode: Mode,
    pub sql: String,
    /// Each queue table's name and Arrow schema (IPC, base64).
    pub tables: Vec<(String, String)>,
    /// Bytes of the query's DataFusion memory pool.
    pub memory_limit: u64,
    /// Bytes of data memory (`RLIMIT_DATA`) the worker process may map.
    pub data_limit: u64,
    /// Worker threads and DataFusion's target partitions.
    pub threads: usize,
}

/// A scan's peek of one table, asked of the server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeekRequest {
    pub id: u64,
    pub table: String,
    pub max_messages: Option<u64>,
    pub partitions: Option<u64>,
    pub max_wait_ms: Option<u64>,
    /// A `LIMIT` pushed down into the scan.
    pub limit: Option<u64>,
}

/// A peek that failed: its status code and message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeekFailed {
    pub id: u64,
    pub code: i32,
    pub message: String,
    /// The status's reason (docs/protocol.md, "Error reasons").
    #[serde(default)]
    pub reason: Option<String>,
}

/// A statement that failed: its status code, message and reason.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Failure {
    pub code: i32,
    pub message: String,
    #[serde(default)]
    pub reason: Option<String>,
}

/// Writes one frame.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: Kind,
    payload: &[u8],
) -> Result<(), FrameError> {
    let len = u32::try_from(payload.len()).map_err(|_| FrameError::TooLarge {
        len: payload.len(),
        cap: u32::MAX as usize,
    })?;
    let mut head = [0u8; HEADER];
    head[0] = kind as u8;
    head[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame of at most `cap` bytes; `None` at the end of the input.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    cap: usize,
) -> Result<Option<Frame>, FrameError> {
    let mut head = [0u8; HEADER];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let kind = Kind::from_u8(head[0]).ok_or(FrameError::Kind(head[0]))?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > cap {
        return Err(FrameError::TooLarge { len, cap });
    }
    let mut payload = vec![0; len];
    r.read_exact(&mut payload).await?;
    Ok(Some(Frame { kind, payload }))
}

/// `schema` and `batch` (if any) as one Arrow IPC stream.
pub(crate) fn encode_ipc(
    schema: &SchemaRef,
    batch: Option<&RecordBatch>,
) -> Result<Vec<u8>, ArrowError> {
    let mut w = StreamWriter::try_new(Vec::new(), schema)?;
    if let Some(batch) = batch {
        w.write(batch)?;
    }
    w.finish()?;
    w.into_inner()
}

/// An Arrow IPC stream's schema and batches.
pub(crate) fn decode_ipc(bytes: &[u8]) -> Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok((schema, batches))
}

/// `batch` as IPC streams of at most `cap` bytes each (with `prefix`
/// bytes before each), halved by rows until each fits; a row that does
/// not fit alone is [`FrameError::RowTooLarge`].
pub(crate) fn encode_batch(
    batch: &RecordBatch,
    cap: usize,
    prefix: usize,
) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut out = Vec::new();
    slice_into(batch, cap.saturating_sub(prefix), &mut out)?;
    Ok(out)
}

fn slice_into(batch: &RecordBatch, cap: usize, out: &mut Vec<Vec<u8>>) -> Result<(), FrameError> {
    let bytes = encode_ipc(&batch.schema(), Some(batch))?;
    if bytes.len() <= cap {
        out.push(bytes);
        return Ok(());
    }
    let rows = batch.num_rows();
    if rows <= 1 {
        return Err(FrameError::RowTooLarge {
            bytes: bytes.len(),
            cap,
        });
    }
    drop(bytes);
    let half = rows / 2;
    slice_into(&batch.slice(0, half), cap, out)?;
    slice_into(&batch.slice(half, rows - half), cap, out)
}

/// `[id u64][n u32]` of the peek frames.
pub(crate) fn tag(id: u64, n: u32) -> [u8; 12] {
    let mut t = [0u8; 12];
    t[..8].copy_from_slice(&id.to_le_bytes());
    t[8..].copy_from_slice(&n.to_le_bytes());
    t
}

/// The `[id u64][n u32]` at the start of a peek frame, and the rest.
pub(crate) fn untag(kind: Kind, payload: &[u8]) -> Result<(u64, u32, &[u8]), FrameError> {
    if payload.len() < 12 {
        return Err(FrameError::Malformed(kind, "shorter than its tag".into()));
    }
    let id = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    let n = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes"));
    Ok((id, n, &payload[12..]))
}

/// A JSON payload, decoded.
pub(crate) fn json<T: serde::de::DeserializeOwned>(
    kind: Kind,
    payload: &[u8],
) -> Result<T, FrameError> {
    serde_json::from_slice(payload).map_err(|e| FrameError::Malformed(kind, e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, StringArray};

    use super::*;

    fn strings(n: usize, width: usize) -> RecordBatch {
        let values: Vec<String> = (0..n).map(|_| "x".repeat(width)).collect();
        let column: ArrayRef = Arc::new(StringArray::from(values));
        RecordBatch::try_from_iter([("s", column)]).unwrap()
    }

    #[tokio::test]
    async fn frames_round_trip_and_a_length_over_the_cap_is_refused_before_reading() {
        let mut buf = Vec::new();
        write_frame(&mut buf, Kind::Flight, b"hello").await.unwrap();
        let frame = read_frame(&mut buf.as_slice(), 5).await.unwrap().unwrap();
        assert_eq!(
            (frame.kind, frame.payload.as_slice()),
            (Kind::Flight, &b"hello"[..])
        );
        let err = read_frame(&mut buf.as_slice(), 4).await.unwrap_err();
        assert!(
            matches!(err, FrameError::TooLarge { len: 5, cap: 4 }),
            "{err}"
        );
        // A header that claims 4 GiB with nothing behind it allocates nothing.
        let claim = [Kind::Flight as u8, 0xff, 0xff, 0xff, 0xff];
        let err = read_frame(&mut &claim[..], 1 << 20).await.unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
        assert!(read_frame(&mut &b""[..], 10).await.unwrap().is_none());
        let err = read_frame(&mut &[99u8, 0, 0, 0, 0][..], 10)
            .await
            .unwrap_err();
        assert!(matches!(err, FrameError::Kind(99)), "{err}");
    }

    #[test]
    fn a_batch_is_sliced_to_fit_and_a_row_too_large_names_the_cap() {
        let batch = strings(1000, 1000);
        let parts = encode_batch(&batch, 100_000, 12).unwrap();
        assert!(parts.len() > 10, "{}", parts.len());
        let mut rows = 0;
        for p in &parts {
            assert!(p.len() <= 100_000 - 12, "{}", p.len());
            let (_, batches) = decode_ipc(p).unwrap();
            rows += batches.iter().map(RecordBatch::num_rows).sum::<usize>();
        }
        assert_eq!(rows, 1000);
        let err = encode_batch(&strings(2, 200_000), 100_000, 0).unwrap_err();
        assert!(err.to_string().contains("97.7 KiB"), "{err}");
    }
}
