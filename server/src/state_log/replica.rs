//! The store's copy in a state log: every store write is appended to the
//! log before it is applied to the local store, so what the server acts
//! on is in the log first; at start, the log is read into the local
//! store and taken over.

use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Mutex as AsyncMutex;

use super::objects::LogObjects;
use super::s3::S3Objects;
use super::{AppendError, Log, StateUrl, ops, segment};
use crate::error::{Error, Result};
use crate::registry::store::Op;

/// Compact once the segments written since the last snapshot hold more
/// bytes than this or than the snapshot, whichever is more: what is
/// uploaded stays within about three times what is appended.
const COMPACT_MIN_BYTES: u64 = 8 << 20;

/// Compact after this many segments however small: a restart reads at
/// most about this many objects.
const COMPACT_SEGMENTS: u64 = 512;

/// Why this server may no longer change anything, once it found out;
/// shared with every table's queue, which then refuses to receive,
/// delete or change a message's visibility.
#[derive(Debug, Default)]
pub struct Fence {
    why: OnceLock<String>,
}

impl Fence {
    pub fn fenced(&self) -> Option<&str> {
        self.why.get().map(String::as_str)
    }

    /// The error of a call this server refuses for it.
    pub fn check(&self) -> Result<()> {
        match self.fenced() {
            Some(why) => Err(Error::Fenced(why.to_string())),
            None => Ok(()),
        }
    }

    fn set(&self, why: &dyn std::fmt::Display) {
        if self.why.set(why.to_string()).is_ok() {
            tracing::error!(error = %why, "state log: FENCED; this server refuses every call that would change SQS or the state from now on");
        }
    }
}

/// Bytes written since the last snapshot, and the snapshot's.
#[derive(Debug, Default)]
struct Sizes {
    since_snapshot: u64,
    segments: u64,
    snapshot: u64,
}

/// A store's state log.
pub struct Replica {
    /// Locked by the store's writer thread (blocking) and by the probe.
    log: AsyncMutex<Log>,
    sizes: Mutex<Sizes>,
    runtime: tokio::runtime::Handle,
    fence: Arc<Fence>,
}

impl Replica {
    /// Appends `ops` (called by the store's writer, off the runtime).
    pub fn append(&self, ops: &[Op]) -> Result<()> {
        self.fence.check()?;
        let frames: Vec<_> = ops.iter().map(ops::frame).collect();
        let bytes = frame_bytes(&frames);
        let appended = self.run(segment::Kind::Changes, &frames);
        self.outcome(appended)?;
        if tracing::enabled!(tracing::Level::DEBUG) {
            let kinds: Vec<_> = ops.iter().map(Op::kind).collect();
            tracing::debug!(bytes, changes = ?kinds, "state log: appended a segment");
        }
        let mut sizes = self.sizes.lock().expect("sizes lock");
        sizes.since_snapshot += bytes;
        sizes.segments += 1;
        Ok(())
    }

    /// Writes `frames` as the next segment, changes or a snapshot (which
    /// then deletes what it replaces), blocking this thread: the store's
    /// writer thread, or (at start) a runtime thread, from which a thread
    /// of its own waits instead.
    fn run(
        &self,
        kind: segment::Kind,
        frames: &[segment::Frame],
    ) -> std::result::Result<(), AppendError> {
        let blocking = || {
            let mut log = self.log.blocking_lock();
            self.runtime.block_on(async {
                match kind {
                    segment::Kind::Changes => log.append(frames).await.map(|_| ()),
                    segment::Kind::Snapshot => log.compact(frames).await,
                }
            })
        };
        match tokio::runtime::Handle::try_current() {
            Err(_) => blocking(),
            Ok(_) => std::thread::scope(|s| s.spawn(blocking).join().expect("state log call")),
        }
    }

    /// Whether the log has grown enough since its snapshot to write a new
    /// one.
    pub fn wants_snapshot(&self) -> bool {
        let sizes = self.sizes.lock().expect("sizes lock");
        sizes.since_snapshot > sizes.snapshot.max(COMPACT_MIN_BYTES)
            || sizes.segments > COMPACT_SEGMENTS
    }

    /// Writes `state` (the whole store) as a snapshot and deletes what it
    /// replaces. A failure is logged: the log still holds everything.
    pub fn compact(&self, state: &[Op]) {
        let frames: Vec<_> = state.iter().map(ops::frame).collect();
        let done = self.run(segment::Kind::Snapshot, &frames);
        match self.outcome(done) {
            Ok(()) => {
                *self.sizes.lock().expect("sizes lock") = Sizes {
                    snapshot: frame_bytes(&frames),
                    ..Sizes::default()
                };
            }
            Err(e) => {
                tracing::warn!(error = %e, "state log: could not write a snapshot; will try again")
            }
        }
    }

    /// Stops this server after the local store failed to apply a write
    /// the log took (`e`): what it acts on would no longer be what the log
    /// holds. It refuses every call from then on, as if fenced; a server
    /// started again reads the log.
    pub fn diverged(&self, e: &Error) {
        self.fence.set(&format!(
            "the local store failed after the state log took a write ({e}); \
             restart the server to read the state log again"
        ));
    }

    /// Checks, without writing, that no other server took the log over
    /// (for readiness).
    pub async fn probe(&self) -> Result<()> {
        self.fence.check()?;
        // The writer holds the log's lock across its writes, which the
        // probe need not wait for: a fenced write sets the fence itself.
        let Ok(mut log) = self.log.try_lock() else {
            return Ok(());
        };
        let probed = log.probe().await;
        drop(log);
        self.outcome(probed)
    }

    /// Maps a log error to the server's, fencing on the way.
    fn outcome<T>(&self, r: std::result::Result<T, AppendError>) -> Result<T> {
        r.map_err(|e| match &e {
            AppendError::Fenced { .. } => {
                self.fence.set(&e);
                Error::Fenced(e.to_string())
            }
            AppendError::Failed(_) => Error::StateUnavailable(e.to_string()),
        })
    }
}

fn frame_bytes(frames: &[segment::Frame]) -> u64 {
    frames
        .iter()
        .map(|f| (f.json.len() + f.blob.len()) as u64)
        .sum()
}

/// The local store's side of a takeover.
pub trait Local {
    /// Empties the store.
    fn clear(&self) -> Result<()>;
    /// Applies `ops` to the local store only.
    fn write_local(&self, ops: &[Op]) -> Result<()>;
    /// The whole state as changes that rebuild it.
    fn snapshot_ops(&self) -> Result<Vec<Op>>;
}

/// How many times a takeover reads the log again when another server
/// wrote between its read and its snapshot.
const TAKEOVER_ATTEMPTS: u32 = 10;

/// Reads the log into `local` and takes it over: from then on this
/// server is its only writer. An empty log (a new URL) takes what `local`
/// holds. Fails naming the URL when the log cannot be read or written.
pub async fn take_over(
    objects: Arc<dyn LogObjects>,
    local: &dyn Local,
    fence: Arc<Fence>,
) -> Result<Replica> {
    let url = objects.url();
    let mut log = Log::new(objects);
    let unreachable =
        |e: &dyn std::fmt::Display| Error::StateUnavailable(format!("state URL {url}: {e}"));
    for _ in 0..TAKEOVER_ATTEMPTS {
        let replayed = log.read().await.map_err(|e| unreachable(&e))?;
        let segments = replayed.len();
        // What the log holds replaces what the local store holds; only
        // its first segment can be a snapshot (`Log::read`).
        if !replayed.is_empty() {
            local.clear()?;
        }
        for r in replayed {
            let ops = r
                .frames
                .into_iter()
                .map(ops::op)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| unreachable(&format!("segment {}: {e}", r.seq)))?;
            local.write_local(&ops)?;
        }
        let state = local.snapshot_ops()?;
        let frames: Vec<_> = state.iter().map(ops::frame).collect();
        match log.take_over(&frames).await {
            Ok(true) => {
                tracing::info!(state_url = %url, segments, writer = log.writer(),
                    "state log: read and taken over; this server is its only writer");
                return Ok(Replica {
                    log: AsyncMutex::new(log),
                    sizes: Mutex::new(Sizes {
                        snapshot: frame_bytes(&frames),
                        ..Sizes::default()
                    }),
                    runtime: tokio::runtime::Handle::current(),
                    fence,
                });
            }
            Ok(false) => {
                tracing::info!(state_url = %url, "state log: another server wrote while it was read; reading it again");
            }
            Err(e) => return Err(unreachable(&e)),
        }
    }
    Err(unreachable(
        &"another server kept writing it: stop the other server first",
    ))
}

/// The objects of `url`: a directory, or an S3 prefix reached with the
/// AWS chain (`s3_endpoint` when given), as `role` when given
/// (`state_url_role_arn`).
pub async fn objects(
    url: &StateUrl,
    s3_endpoint: Option<&str>,
    role: Option<&crate::config::RoleConfig>,
    retries: crate::sqs::aws::Retries,
) -> Arc<dyn LogObjects> {
    match url {
        StateUrl::Files(dir) => Arc::new(super::objects::Files::new(dir.clone())),
        StateUrl::S3 { bucket, prefix } => {
            use crate::sqs::role::{Assumed, TableRole, assume};
            let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .load()
                .await;
            let client =
                |shared| crate::large_payload::s3::client(shared, None, s3_endpoint, retries);
            let Some(role) = role else {
                return Arc::new(S3Objects::new(client(&shared), bucket.clone(), prefix));
            };
            // Sessions named `sqs-flight-state` unless set.
            let table = "state";
            let shared = assume(&shared, TableRole { table, role }, None, retries).await;
            let objects = S3Objects::new(client(&shared), bucket.clone(), prefix);
            Arc::new(objects.with_role(Assumed::of(role, table)))
        }
    }
}
