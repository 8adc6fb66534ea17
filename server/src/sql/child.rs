//! The server's side of a SQL worker process: one per statement.
//!
//! DataFusion's scalar functions allocate outside its memory pool (a
//! `repeat` of 10^14 characters aborts the process that folds it), a deep
//! expression can overflow a thread's stack, and a list of refused names
//! is never complete. So each statement is planned and run in a child
//! process, the server's own binary started as [`super::worker`], and a
//! query that exhausts memory or stack ends that process only: the
//! statement answers RESOURCE_EXHAUSTED naming the limits, and the process
//! that holds every consumer's receipts serves on.
//!
//! [`Workers::start`] spawns the worker, sends it the [`Request`], and
//! drives it in a task that the statement's call owns: the worker's
//! peeks are made here ([`super::peek`]) and their rows sent back, its
//! answers are relayed as [`Event`]s through a channel of
//! [`QUEUED_EVENTS`]. A result's messages are relayed as the worker made
//! them ([`super::encode`]): the next frame is read from the worker only
//! once the channel has room for it, so a statement holds at most one
//! result message here and the one its DoGet is sending, however large
//! its result is. The task, and with it the worker (killed when
//! dropped) and its peeks (released when dropped), ends when the client
//! goes away, at `--sql-query-timeout`, or when the server stops. The
//! worker raises its own OOM score, so the kernel's OOM killer picks it
//! before the server, and dies with the server (`PR_SET_PDEATHSIG`).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_flight::FlightData;
use arrow_schema::SchemaRef;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::io::AsyncRead;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tonic::Status;

use super::frame::{self, Failure, Frame, FrameError, Kind, Mode, PeekFailed, PeekRequest};
use super::query::{self, Running};
use super::worker::WORKER_ARG;
use crate::config::sql::{SqlConfig, show_bytes};
use crate::error::Error;
use crate::registry::Registry;

/// What a worker answered, in order: to plan, the schema; to run, that it
/// started, then the messages of the result's DoGet (the schema first);
/// the channel's end is the statement's.
pub(crate) enum Event {
    Schema(SchemaRef),
    Started,
    Data(FlightData),
}

/// Answers of a worker the server holds before the statement's call takes
/// them: one, so that a result's frame is read from the worker only when
/// the one before it has been taken.
const QUEUED_EVENTS: usize = 1;

/// A statement's answers, and the task that drives its worker (aborted,
/// killing the worker, when this is dropped).
pub(crate) struct Statement {
    pub events: mpsc::Receiver<Result<Event, Status>>,
    pub task: AbortOnDropHandle<()>,
}

impl Statement {
    /// Ends the statement and waits until its task is gone: its worker is
    /// killed and its slot given back before the caller answers, so a
    /// client's next call never finds the slot of a statement it saw end.
    pub(crate) async fn end(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Starts SQL worker processes for the statements of one server, at most
/// `max_statements` at once (lowered to the workers' share of the
/// file-descriptor limit: [`crate::fd_reserve`]).
#[derive(Clone)]
pub(crate) struct Workers {
    registry: Arc<Registry>,
    config: SqlConfig,
    program: PathBuf,
    stop: CancellationToken,
    slots: Arc<Semaphore>,
}

/// A peek's outcome, by its id.
type PeekDone = (u64, Result<Vec<Vec<RecordBatch>>, Error>);

impl Workers {
    /// Workers of `config.worker`'s binary (this process's own by default).
    pub(crate) fn new(
        registry: Arc<Registry>,
        config: &SqlConfig,
        stop: CancellationToken,
    ) -> Result<Self, Error> {
        let program = match &config.worker {
            Some(path) => path.clone(),
            None => std::env::current_exe()
                .map_err(|e| Error::Internal(format!("finding the SQL worker binary: {e}")))?,
        };
        let mut config = config.clone();
        config.max_statements = crate::fd_reserve::sql_statements(config.max_statements);
        Ok(Self {
            registry,
            slots: Arc::new(Semaphore::new(config.max_statements)),
            config,
            program,
            stop,
        })
    }

    /// Starts `sql` in a worker of its own.
    pub(crate) fn start(&self, mode: Mode, sql: String) -> Statement {
        let (tx, events) = mpsc::channel(QUEUED_EVENTS);
        let this = self.clone();
        let task = tokio::spawn(async move { this.drive(mode, sql, tx).await });
        Statement {
            events,
            task: AbortOnDropHandle::new(task),
        }
    }

    /// The statement within its time limit and the server's life; its
    /// failure, if any, as the last event.
    async fn drive(self, mode: Mode, sql: String, tx: mpsc::Sender<Result<Event, Status>>) {
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            let _ = tx.send(Err(self.too_many())).await;
            return;
        };
        // The slot is given back before the gauge falls (a tuple drops its
        // first field first): once no statement is counted, one may start.
        let _held = (slot, Running::new(self.registry.metrics()));
        let deadline = Instant::now() + self.config.query_timeout;
        let outcome = tokio::select! {
            done = tokio::time::timeout_at(deadline, self.converse(mode, sql, &tx)) => {
                done.unwrap_or_else(|_| Err(query::too_long(self.config.query_timeout)))
            }
            _ = self.stop.cancelled() => Err(query::shutting_down()),
        };
        if let Err(status) = outcome {
            let _ = tx.send(Err(status)).await;
        }
    }

    /// RESOURCE_EXHAUSTED: every slot for a statement is taken.
    fn too_many(&self) -> Status {
        Status::from(Error::limit(
            "sql.max_statements",
            format!(
                "{} Flight SQL statements are already planned or running, the server's limit \
                 (--sql-max-statements, TOML sql.max_statements): retry when one has ended",
                self.config.max_statements
            ),
        ))
    }

    /// Bytes of data memory a worker may map: the pool and
    /// [`crate::config::sql::SQL_WORKER_HEADROOM`].
    fn data_limit(&self) -> u64 {
        self.config.worker_data_limit()
    }

    fn spawn(&self) -> Result<Child, Status> {
        Command::new(&self.program)
            .arg(WORKER_ARG)
            .arg(self.config.threads.to_string())
            .arg(self.data_limit().to_string())
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                Status::from(Error::Internal(format!(
                    "starting the Flight SQL worker process {}: {e}",
                    self.program.display()
                )))
            })
    }

    fn request(&self, mode: Mode, sql: String) -> Result<Vec<u8>, Status> {
        let mut tables = Vec::new();
        for table in self.registry.tables() {
            let ipc = frame::encode_ipc(&table.schema(), None).map_err(internal)?;
            tables.push((table.name().to_string(), BASE64.encode(ipc)));
        }
        let request = frame::Request {
            mode,
            sql,
            tables,
            memory_limit: self.config.memory_limit,
            data_limit: self.data_limit(),
            threads: self.config.threads,
        };
        serde_json::to_vec(&request).map_err(internal)
    }

    /// Runs the statement in a worker: relays its answers to `tx`, makes
    /// its peeks, until its end, its error, its death, or its call's end.
    async fn converse(
        &self,
        mode: Mode,
        sql: String,
        tx: &mpsc::Sender<Result<Event, Status>>,
    ) -> Result<(), Status> {
        let request = self.request(mode, sql)?;
        let mut child = self.spawn()?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(internal("the SQL worker has no pipes"));
        };
        let (control_tx, mut control) = mpsc::channel(1);
        let reader = read_frames(stdout, tx.clone(), control_tx);
        let _reader = AbortOnDropHandle::new(tokio::spawn(reader));
        if frame::write_frame(&mut stdin, Kind::Request, &request)
            .await
            .is_err()
        {
            return Err(self.died(&mut child).await);
        }
        let mut peeks: JoinSet<PeekDone> = JoinSet::new();
        loop {
            tokio::select! {
                biased;
                _ = tx.closed() => return Ok(()),
                frame = control.recv() => match frame {
                    Some(Ok(frame)) => {
                        if self.answer(frame, &mut peeks)? {
                            return Ok(());
                        }
                    }
                    Some(Err(FrameError::Io(e))) => return Err(self.torn(&mut child, e).await),
                    Some(Err(e)) => return Err(internal(format!("reading the SQL worker: {e}"))),
                    None if tx.is_closed() => return Ok(()),
                    None => return Err(self.died(&mut child).await),
                },
                Some(done) = peeks.join_next() => {
                    let Ok((id, rows)) = done else { continue };
                    if send_peek(&mut stdin, id, rows).await.is_err() {
                        return Err(self.died(&mut child).await);
                    }
                }
            }
        }
    }

    /// Handles one of the worker's requests or its end; `true` when the
    /// statement is done.
    fn answer(&self, frame: Frame, peeks: &mut JoinSet<PeekDone>) -> Result<bool, Status> {
        match frame.kind {
            Kind::End => Ok(true),
            Kind::Error => {
                let failure: Failure = frame::json(frame.kind, &frame.payload).map_err(internal)?;
                let message = super::cut(failure.message);
                let reason = failure.reason.as_deref();
                Err(crate::error::relayed(failure.code, message, reason))
            }
            Kind::Peek => {
                let request: PeekRequest =
                    frame::json(frame.kind, &frame.payload).map_err(internal)?;
                let (registry, stop) = (Arc::clone(&self.registry), self.stop.clone());
                peeks.spawn(async move {
                    let id = request.id;
                    (id, super::peek::peek(registry, request, stop).await)
                });
                Ok(false)
            }
            other => Err(internal(format!("the SQL worker sent a {other:?} frame"))),
        }
    }

    /// Why a worker ended without an answer: it was killed (out of memory,
    /// over its stack: RESOURCE_EXHAUSTED naming the limits), or it exited.
    async fn died(&self, child: &mut Child) -> Status {
        match child.wait().await {
            Ok(status) => self.exit_status(status),
            Err(e) => internal(format!("waiting for the SQL worker: {e}")),
        }
    }

    /// The worker's output broke off inside a frame: most likely it was
    /// killed while writing a large one (out of memory). Its exit status
    /// says so if it comes within [`TORN_FRAME_WAIT`]; else the read error.
    async fn torn(&self, child: &mut Child, e: std::io::Error) -> Status {
        match tokio::time::timeout(TORN_FRAME_WAIT, child.wait()).await {
            Ok(Ok(status)) => self.exit_status(status),
            _ => internal(format!("reading the SQL worker: {e}")),
        }
    }

    fn exit_status(&self, status: ExitStatus) -> Status {
        tracing::warn!(%status, "a Flight SQL worker process ended without an answer");
        match status.signal() {
            Some(signal) => Status::from(Error::limit(
                "sql.memory_limit",
                format!(
                    "the Flight SQL query ended its worker process (signal {signal}): it needed more \
                 memory than the worker may map ({}: the {} of --sql-memory-limit, TOML \
                 sql.memory_limit, and {} for the rest) or nested deeper than its stack allows; \
                 the server runs on",
                    show_bytes(self.data_limit()),
                    show_bytes(self.config.memory_limit),
                    show_bytes(crate::config::sql::SQL_WORKER_HEADROOM)
                ),
            )),
            None => internal(format!(
                "the Flight SQL worker process exited ({status}) without an answer"
            )),
        }
    }
}

/// How long a worker whose output broke off inside a frame has to end,
/// so that its exit status (a signal: it ran out of memory) names the
/// limit it met.
const TORN_FRAME_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads the worker's frames (each at most [`frame::MAX_WORKER_FRAME`]):
/// its answers (schema, start, the result's messages) go to `events` as
/// they are, each read only once `events` has room for it; its requests,
/// its end and a bad frame go to `control`. Ends with the worker's
/// output, or when either channel's receiver is gone.
async fn read_frames<R: AsyncRead + Unpin>(
    mut out: R,
    events: mpsc::Sender<Result<Event, Status>>,
    control: mpsc::Sender<Result<Frame, FrameError>>,
) {
    loop {
        let Ok(room) = events.reserve().await else {
            return;
        };
        let frame = match frame::read_frame(&mut out, frame::MAX_WORKER_FRAME).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(e) => {
                drop(room);
                let _ = control.send(Err(e)).await;
                return;
            }
        };
        let forward = match frame.kind {
            Kind::Schema | Kind::Started | Kind::Flight => match event(frame) {
                Ok(event) => {
                    room.send(Ok(event));
                    continue;
                }
                Err(e) => Err(e),
            },
            _ => Ok(frame),
        };
        drop(room);
        let stop = forward.is_err();
        if control.send(forward).await.is_err() || stop {
            return;
        }
    }
}

/// The event of one of the worker's answers.
fn event(frame: Frame) -> Result<Event, FrameError> {
    Ok(match frame.kind {
        Kind::Schema => Event::Schema(frame::decode_ipc(&frame.payload)?.0),
        Kind::Started => Event::Started,
        _ => Event::Data(super::encode::flight_data(frame.payload)?),
    })
}

/// A peek's rows (or its failure) to the worker, each batch in frames of
/// at most [`frame::MAX_WORKER_FRAME`].
async fn send_peek(
    stdin: &mut ChildStdin,
    id: u64,
    rows: Result<Vec<Vec<RecordBatch>>, Error>,
) -> Result<(), FrameError> {
    let partitions = match rows {
        Ok(partitions) => partitions,
        Err(e) => {
            let status = Status::from(&e);
            let failed = PeekFailed {
                id,
                code: status.code() as i32,
                message: status.message().to_string(),
                reason: crate::error::reason_of(&status).map(|r| r.to_string()),
            };
            let body = serde_json::to_vec(&failed)
                .map_err(|e| FrameError::Malformed(Kind::PeekError, e.to_string()))?;
            return frame::write_frame(stdin, Kind::PeekError, &body).await;
        }
    };
    for (at, batches) in partitions.iter().enumerate() {
        let tag = frame::tag(id, at as u32);
        for batch in batches {
            for ipc in frame::encode_batch(batch, frame::MAX_WORKER_FRAME, tag.len())? {
                let mut body = Vec::with_capacity(tag.len() + ipc.len());
                body.extend_from_slice(&tag);
                body.extend_from_slice(&ipc);
                frame::write_frame(stdin, Kind::PeekRows, &body).await?;
            }
        }
    }
    let end = frame::tag(id, partitions.len() as u32);
    frame::write_frame(stdin, Kind::PeekEnd, &end).await
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::from(Error::Internal(format!("Flight SQL worker: {e}")))
}
