//! A SQL worker process: `sqs-flight-server __sql-worker THREADS
//! DATA_BYTES`, started by the server ([`super::child`]) for one
//! statement, never by hand.
//!
//! It first makes itself the process to lose: it dies with its parent
//! (`PR_SET_PDEATHSIG`), raises its `oom_score_adj` to 1000 so the OOM
//! killer picks it before the server, and caps its data memory
//! (`RLIMIT_DATA`) to DATA_BYTES, so an allocation past it fails (and the
//! process aborts) instead of growing until the machine swaps. Then it
//! reads its [`Request`] from stdin, plans the statement on THREADS
//! threads of 8 MiB stacks, answers on stdout ([`super::frame`]), and
//! exits. A scan's rows come from the server ([`super::remote`]).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::SchemaRef;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::StreamExt;
use tokio::io::{AsyncWrite, Stdin};
use tokio::sync::mpsc;
use tonic::Status;

use super::encode::ResultEncoder;
use super::frame::{self, Failure, FrameError, Kind, Mode, Request};
use super::remote::Peeker;
use super::runtime::SqlRuntime;
use super::{plan_on, query, session, status};
use crate::error::Error;

/// The hidden first argument that makes the server's binary a SQL worker.
pub(crate) const WORKER_ARG: &str = "__sql-worker";
/// Frames a worker may have written before the server reads them.
const QUEUED_FRAMES: usize = 2;

/// Whether this process was started as a SQL worker.
pub fn invoked() -> bool {
    std::env::args_os().nth(1).is_some_and(|a| a == WORKER_ARG)
}

/// The worker's `main`: one statement, then exit.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let (Some(threads), Some(data)) = (
        args.first().and_then(|a| a.parse::<usize>().ok()),
        args.get(1).and_then(|a| a.parse::<u64>().ok()),
    ) else {
        eprintln!("{WORKER_ARG} THREADS DATA_BYTES: started by sqs-flight-server only");
        return ExitCode::FAILURE;
    };
    become_expendable(data);
    let runtime = match SqlRuntime::new(threads) {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sql worker: starting its threads: {e}");
            return ExitCode::FAILURE;
        }
    };
    let done = runtime.handle().block_on(serve());
    if let Err(e) = done {
        eprintln!("sql worker: {e}");
    }
    // Without waiting for the thread that reads stdin.
    std::process::exit(0)
}

/// Dies with the server, offers itself to the OOM killer first, and caps
/// its data memory at `data` bytes.
fn become_expendable(data: u64) {
    // SAFETY: plain system calls on this process, with valid arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        let limit = libc::rlimit {
            rlim_cur: data,
            rlim_max: data,
        };
        if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
            eprintln!(
                "sql worker: setrlimit(RLIMIT_DATA): {}",
                std::io::Error::last_os_error()
            );
        }
    }
    if libc_getppid() == 1 {
        // The server died before the death signal was armed.
        std::process::exit(1);
    }
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
}

fn libc_getppid() -> libc::pid_t {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() }
}

/// Reads the request, runs it, answers: the statement's result, its
/// failure, or INTERNAL for a panic.
async fn serve() -> Result<(), FrameError> {
    let mut stdin = tokio::io::stdin();
    let Some(first) = frame::read_frame(&mut stdin, frame::MAX_SERVER_FRAME).await? else {
        return Ok(());
    };
    let request: Request = frame::json(Kind::Request, &first.payload)?;
    let (out, frames) = mpsc::channel(QUEUED_FRAMES);
    let writer = tokio::spawn(write_frames(tokio::io::stdout(), frames));
    let peeker = Arc::new(Peeker::new(out.clone()));
    tokio::spawn(read_answers(stdin, Arc::clone(&peeker)));
    let statement = tokio::spawn(statement(request, peeker, out.clone())).await;
    let failure = match statement {
        Ok(Ok(())) => None,
        Ok(Err(status)) => Some(status),
        Err(_) => Some(Status::from(Error::Internal(
            "the Flight SQL query panicked".into(),
        ))),
    };
    let last = match failure {
        None => (Kind::End, Vec::new()),
        Some(status) => {
            let failure = Failure {
                code: status.code() as i32,
                message: status.message().to_string(),
                reason: crate::error::reason_of(&status).map(|r| r.to_string()),
            };
            let body = serde_json::to_vec(&failure)
                .map_err(|e| FrameError::Malformed(Kind::Error, e.to_string()))?;
            (Kind::Error, body)
        }
    };
    let _ = out.send(last).await;
    drop(out);
    writer
        .await
        .map_err(|e| FrameError::Io(std::io::Error::other(e)))?
}

/// Writes the frames of `frames` to `w` until they end.
async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut frames: mpsc::Receiver<(Kind, Vec<u8>)>,
) -> Result<(), FrameError> {
    while let Some((kind, payload)) = frames.recv().await {
        frame::write_frame(&mut w, kind, &payload).await?;
    }
    Ok(())
}

/// Hands the server's peek frames to `peeker`; when the server closes
/// stdin (it is gone, or done with this statement), the worker exits.
async fn read_answers(mut stdin: Stdin, peeker: Arc<Peeker>) {
    loop {
        match frame::read_frame(&mut stdin, frame::MAX_SERVER_FRAME).await {
            Ok(Some(frame)) => {
                if let Err(e) = peeker.on_frame(frame) {
                    eprintln!("sql worker: a bad frame from the server: {e}");
                    std::process::exit(1);
                }
            }
            Ok(None) | Err(_) => std::process::exit(0),
        }
    }
}

/// Plans the statement and sends its schema, or (to run it) its result
/// as the FlightData messages of its DoGet ([`ResultEncoder`]): the
/// schema, always (an empty result has it too), then the batches, each
/// with exactly the planned schema (nullability included).
async fn statement(
    request: Request,
    peeker: Arc<Peeker>,
    out: mpsc::Sender<(Kind, Vec<u8>)>,
) -> Result<(), Status> {
    let tables = catalog(&request)?;
    let ctx = session::context(&tables, &peeker, request.memory_limit, request.threads)
        .map_err(Status::from)?;
    let limit = request.memory_limit;
    let df = plan_on(&ctx, &request.sql)
        .await
        .map_err(|e| status(limit, e))?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    if request.mode == Mode::Plan {
        let ipc = frame::encode_ipc(&schema, None).map_err(|e| status(limit, e.into()))?;
        return send(&out, Kind::Schema, ipc).await;
    }
    let mut stream = query::execute(df).await.map_err(|e| status(limit, e))?;
    send(&out, Kind::Started, Vec::new()).await?;
    let (mut encoder, first) = ResultEncoder::new(Arc::clone(&schema));
    send(&out, Kind::Flight, first).await?;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| status(limit, e))?;
        let batch = planned(&schema, batch)?;
        for message in encoder.messages(&batch) {
            send(&out, Kind::Flight, message.map_err(too_large)?).await?;
        }
    }
    Ok(())
}

/// `batch` with the planned `schema` (DataFusion's batches may differ in
/// nullability or metadata from the plan's schema).
fn planned(schema: &SchemaRef, batch: RecordBatch) -> Result<RecordBatch, Status> {
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(schema), batch.columns().to_vec(), &options)
        .map_err(|e| Status::from(Error::Internal(format!("result batch: {e}"))))
}

/// The queue tables of the request: names and schemas.
fn catalog(request: &Request) -> Result<HashMap<String, SchemaRef>, Status> {
    let mut tables = HashMap::new();
    for (name, schema) in &request.tables {
        let bytes = BASE64
            .decode(schema)
            .map_err(|e| crate::error::internal(format!("the schema of table {name}: {e}")))?;
        let (schema, _) = frame::decode_ipc(&bytes)
            .map_err(|e| crate::error::internal(format!("the schema of table {name}: {e}")))?;
        tables.insert(name.clone(), schema);
    }
    Ok(tables)
}

async fn send(
    out: &mpsc::Sender<(Kind, Vec<u8>)>,
    kind: Kind,
    body: Vec<u8>,
) -> Result<(), Status> {
    out.send((kind, body))
        .await
        .map_err(|_| crate::error::cancelled("the server stopped reading"))
}

/// A result row or dictionary too large for one message:
/// RESOURCE_EXHAUSTED.
fn too_large(e: FrameError) -> Status {
    match e {
        FrameError::RowTooLarge { .. } | FrameError::DictionaryTooLarge { .. } => {
            Status::from(Error::limit(
                "message_size",
                format!(
                    "{e}; a Flight SQL result row, and a dictionary of a result column, must fit \
             one gRPC message (a fixed limit): select fewer or smaller columns"
                ),
            ))
        }
        other => Status::from(Error::Internal(format!("encoding a result batch: {other}"))),
    }
}
