//! The state log (`--state-url`): the registry's store, kept as a
//! sequence of whole objects in a directory or under an S3 prefix, so that
//! a server on another host can take it over.
//!
//! # Objects
//!
//! `log/{seq:020}`: one [segment](segment) each, numbered from 0 without a
//! gap. A segment holds changes (what one store write applied) or a
//! snapshot (the whole state; what came before it no longer counts, and
//! is deleted once the snapshot is written).
//!
//! # One writer
//!
//! Every segment is created with a conditional write ([`LogObjects::create`]:
//! S3's `If-None-Match: *`, a hard link on a path) at the number after
//! the last one its writer knows. A server that starts on the log reads it
//! whole, then writes a snapshot at the next number: from then on it is
//! the writer. A server that wrote before is fenced at its next write:
//! the number it tries holds another writer's segment. Two writers can
//! never both succeed at one number, whatever the timing.
//!
//! # Writes whose outcome is unknown
//!
//! A write that times out may still land. The writer then keeps the
//! number: its next write tries the same number again. If that finds its
//! own earlier segment, the next one written says the earlier segment
//! "voids": it does not count, because its caller was told it failed.

pub mod fenced_queue;
pub mod objects;
pub mod ops;
pub mod replica;
pub mod s3;
pub mod segment;

use std::sync::Arc;

use objects::{Created, LogObjects, ObjectsError};
use segment::{Frame, Header, Kind};

/// Where a state log is: `s3://bucket/prefix`, `file:///path` or an
/// absolute path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateUrl {
    Files(std::path::PathBuf),
    S3 { bucket: String, prefix: String },
}

impl StateUrl {
    pub fn parse(url: &str) -> Result<Self, String> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(format!("{url:?} names no bucket (s3://BUCKET/PREFIX)"));
            }
            return Ok(Self::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
            });
        }
        let path = url.strip_prefix("file://").unwrap_or(url);
        if url.contains("://") && !url.starts_with("file://") {
            return Err(format!(
                "{url:?} is not a state URL this server knows: s3://BUCKET/PREFIX, \
                 file:///PATH or an absolute path"
            ));
        }
        let path = std::path::PathBuf::from(path);
        if !path.is_absolute() {
            return Err(format!("{url:?} is not an absolute path"));
        }
        Ok(Self::Files(path))
    }
}

/// The name of segment `seq`.
pub fn segment_name(seq: u64) -> String {
    format!("log/{seq:020}")
}

/// The number of a segment's name.
fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("log/")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Why the log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Objects(#[from] ObjectsError),
    /// An object that is not a segment of this log, or one that is damaged.
    #[error("{name} in the state log: {why}")]
    Refused { name: String, why: String },
}

/// Why a segment was not written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    /// Another server wrote segment `seq`: it has taken the log over, and
    /// this one may write no more.
    #[error(
        "this server no longer owns its state log: another server ({writer}) took it over \
         (segment {seq}); it changes nothing from now on"
    )]
    Fenced { writer: String, seq: u64 },
    /// The store failed; the write may or may not have landed, and does
    /// not count either way.
    #[error("the state log write failed: {0}")]
    Failed(ObjectsError),
}

/// A segment as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub seq: u64,
    pub kind: Kind,
    pub frames: Vec<Frame>,
}

/// What a conditional write at one number found.
enum Slot {
    Ours,
    /// One of this writer's own earlier writes, reported failed, landed.
    OursBefore,
    Theirs(String),
}

/// One server's handle on a state log.
pub struct Log {
    objects: Arc<dyn LogObjects>,
    /// This process's name in the segments it writes.
    writer: String,
    /// The number the next segment is written at.
    next: u64,
    /// The oldest number that may still exist.
    first: u64,
    /// Own segments that landed after their write was reported failed.
    voids: Vec<u64>,
    fenced: Option<AppendError>,
}

impl Log {
    pub fn new(objects: Arc<dyn LogObjects>) -> Self {
        Self {
            objects,
            writer: writer_name(),
            next: 0,
            first: 0,
            voids: Vec::new(),
            fenced: None,
        }
    }

    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// Why this server may no longer write, once it found out.
    #[cfg(test)]
    pub fn fenced(&self) -> Option<&AppendError> {
        self.fenced.as_ref()
    }

    /// The segments that count, from the last snapshot on, and sets the
    /// next number past the last segment.
    pub async fn read(&mut self) -> Result<Vec<Replayed>, ReadError> {
        // A segment can vanish between the listing and its read when
        // another server's snapshot deletes it: list again, a few times.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.read_once().await? {
                Some(all) => {
                    self.first = all.first().map_or(0, |(h, _)| h.seq);
                    self.next = all.last().map_or(0, |(h, _)| h.seq + 1);
                    if let Some(n) = missing(&all) {
                        return Err(ReadError::Refused {
                            name: format!("{}/{}", self.objects.url(), segment_name(n)),
                            why: format!("segment {n} is missing"),
                        });
                    }
                    return Ok(counting(all));
                }
                None if attempts < 5 => continue,
                None => {
                    return Err(ReadError::Refused {
                        name: self.objects.url(),
                        why: "its segments kept changing while it was read: \
                              is another server compacting it?"
                            .into(),
                    });
                }
            }
        }
    }

    /// Every segment, or `None` if one listed is gone.
    async fn read_once(&self) -> Result<Option<Vec<(Header, Vec<Frame>)>>, ReadError> {
        let mut all = Vec::new();
        for name in self.objects.list("log").await? {
            let refused = |why: String| ReadError::Refused {
                name: format!("{}/{name}", self.objects.url()),
                why,
            };
            let seq = parse_name(&name)
                .ok_or_else(|| refused("not a segment name (log/ and 20 digits)".into()))?;
            let Some(bytes) = self.objects.get(&name, segment::MAX_SEGMENT_BYTES).await? else {
                return Ok(None);
            };
            let (header, frames) = segment::decode(&bytes).map_err(|e| refused(e.0))?;
            if header.seq != seq {
                return Err(refused(format!("its header says segment {}", header.seq)));
            }
            all.push((header, frames));
        }
        Ok(Some(all))
    }

    /// Writes the whole state as the next segment, after [`Log::read`]:
    /// this server becomes the log's writer. Older segments are deleted
    /// after. `Ok(false)`: another server wrote since the read; read again.
    pub async fn take_over(&mut self, frames: &[Frame]) -> Result<bool, AppendError> {
        match self.write(Kind::Snapshot, frames).await {
            Ok(seq) => {
                self.drop_before(seq).await;
                Ok(true)
            }
            Err(AppendError::Fenced { .. }) => {
                self.fenced = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the whole state as the next segment and deletes the older
    /// ones, so that the log stays the size of what is open.
    pub async fn compact(&mut self, frames: &[Frame]) -> Result<(), AppendError> {
        let seq = self.write(Kind::Snapshot, frames).await?;
        self.drop_before(seq).await;
        Ok(())
    }

    /// Appends one store write's changes.
    pub async fn append(&mut self, frames: &[Frame]) -> Result<u64, AppendError> {
        self.write(Kind::Changes, frames).await
    }

    /// Whether another server has written past this one (checked without
    /// writing, for readiness): fenced if so.
    pub async fn probe(&mut self) -> Result<(), AppendError> {
        if let Some(f) = &self.fenced {
            return Err(f.clone());
        }
        let name = segment_name(self.next);
        if !self
            .objects
            .exists(&name)
            .await
            .map_err(AppendError::Failed)?
        {
            return Ok(());
        }
        match self.slot_owner(self.next).await? {
            Slot::Theirs(writer) => Err(self.fence(writer, self.next)),
            _ => Ok(()),
        }
    }

    /// The segments written since the last snapshot (this one's count).
    #[cfg(test)]
    pub fn since_snapshot(&self) -> u64 {
        self.next - self.first
    }

    async fn write(&mut self, kind: Kind, frames: &[Frame]) -> Result<u64, AppendError> {
        if let Some(f) = &self.fenced {
            return Err(f.clone());
        }
        loop {
            let seq = self.next;
            let header = Header {
                format: segment::FORMAT,
                seq,
                writer: self.writer.clone(),
                kind,
                voids: self.voids.clone(),
            };
            match self.create(seq, segment::encode(&header, frames)).await? {
                Slot::Ours => {
                    self.voids.clear();
                    self.next = seq + 1;
                    return Ok(seq);
                }
                Slot::OursBefore => {
                    self.voids.push(seq);
                    self.next = seq + 1;
                }
                Slot::Theirs(writer) => return Err(self.fence(writer, seq)),
            }
        }
    }

    async fn create(&self, seq: u64, bytes: Vec<u8>) -> Result<Slot, AppendError> {
        let name = segment_name(seq);
        match self.objects.create(&name, bytes).await {
            Ok(Created::Created) => Ok(Slot::Ours),
            Ok(Created::Exists) => self.slot_owner(seq).await,
            Err(e) => Err(AppendError::Failed(e)),
        }
    }

    /// Who wrote segment `seq`, which exists: its header is read, not the
    /// segment (a snapshot can be large).
    async fn slot_owner(&self, seq: u64) -> Result<Slot, AppendError> {
        let name = segment_name(seq);
        let bytes = self
            .objects
            .get_start(&name, segment::MAX_START_BYTES)
            .await
            .map_err(AppendError::Failed)?;
        let writer = match bytes.as_deref().map(segment::decode_header) {
            Some(Ok(h)) => h.writer,
            Some(Err(e)) => format!("unknown: {e}"),
            // Gone again: only a snapshot deletes, and only another
            // writer's snapshot can be past this one's last segment.
            None => "unknown: a segment deleted by a newer snapshot".into(),
        };
        Ok(match writer == self.writer {
            true => Slot::OursBefore,
            false => Slot::Theirs(writer),
        })
    }

    fn fence(&mut self, writer: String, seq: u64) -> AppendError {
        let e = AppendError::Fenced { writer, seq };
        self.fenced = Some(e.clone());
        e
    }

    /// Deletes the segments before `seq` (a snapshot), oldest first; one
    /// that fails stays for the next snapshot to delete.
    async fn drop_before(&mut self, seq: u64) {
        let names: Vec<String> = (self.first..seq).map(segment_name).collect();
        match self.objects.delete_many(names).await {
            Ok(()) => self.first = seq,
            Err(e) => {
                tracing::warn!(error = %e, "state log: could not delete the segments a snapshot replaced; the next snapshot tries again");
            }
        }
    }
}

/// The first number missing from the last snapshot on (before it,
/// segments may be left by a deletion a crash cut short, in any order).
fn missing(all: &[(Header, Vec<Frame>)]) -> Option<u64> {
    let start = all
        .iter()
        .rposition(|(h, _)| h.kind == Kind::Snapshot)
        .unwrap_or(0);
    all[start..]
        .windows(2)
        .find(|w| w[1].0.seq != w[0].0.seq + 1)
        .map(|w| w[0].0.seq + 1)
}

/// The segments that count: not voided by a later segment of the same
/// writer, from the last snapshot on.
fn counting(all: Vec<(Header, Vec<Frame>)>) -> Vec<Replayed> {
    let voided: std::collections::HashSet<(String, u64)> = all
        .iter()
        .flat_map(|(h, _)| h.voids.iter().map(|&v| (h.writer.clone(), v)))
        .collect();
    let kept: Vec<Replayed> = all
        .into_iter()
        .filter(|(h, _)| !voided.contains(&(h.writer.clone(), h.seq)))
        .map(|(h, frames)| Replayed {
            seq: h.seq,
            kind: h.kind,
            frames,
        })
        .collect();
    let start = kept
        .iter()
        .rposition(|r| r.kind == Kind::Snapshot)
        .unwrap_or(0);
    kept.into_iter().skip(start).collect()
}

/// A name no other process is likely to have: host, process id, start
/// time and a random number.
fn writer_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(now);
    h.write_u32(std::process::id());
    format!("{host}/{}/{now}/{:016x}", std::process::id(), h.finish())
}

#[cfg(test)]
mod tests;
