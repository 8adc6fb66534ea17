use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::objects::Files;
use super::*;

/// A directory log whose creates can be made to land and then report a
/// failure (a PutObject that timed out after S3 stored it), or fail
/// without landing.
struct Faulty {
    inner: Files,
    land_then_fail: AtomicBool,
    fail: AtomicBool,
}

impl Faulty {
    fn new(dir: &std::path::Path) -> Arc<Self> {
        Arc::new(Self {
            inner: Files::new(dir.to_path_buf()),
            land_then_fail: AtomicBool::new(false),
            fail: AtomicBool::new(false),
        })
    }
}

fn timed_out(name: &str) -> ObjectsError {
    ObjectsError {
        operation: "create",
        name: name.into(),
        code: "TimedOut".into(),
        message: "injected".into(),
        refused: false,
    }
}

impl LogObjects for Faulty {
    fn create(&self, name: &str, bytes: Vec<u8>) -> BoxFuture<'_, Result<Created, ObjectsError>> {
        let name = name.to_string();
        async move {
            if self.fail.load(Ordering::SeqCst) {
                return Err(timed_out(&name));
            }
            let created = self.inner.create(&name, bytes).await?;
            if self.land_then_fail.swap(false, Ordering::SeqCst) {
                return Err(timed_out(&name));
            }
            Ok(created)
        }
        .boxed()
    }
    fn get(&self, name: &str, max: u64) -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>> {
        self.inner.get(name, max)
    }
    fn get_start(
        &self,
        name: &str,
        n: u64,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>> {
        self.inner.get_start(name, n)
    }
    fn exists(&self, name: &str) -> BoxFuture<'_, Result<bool, ObjectsError>> {
        self.inner.exists(name)
    }
    fn list(&self, dir: &str) -> BoxFuture<'_, Result<Vec<String>, ObjectsError>> {
        self.inner.list(dir)
    }
    fn delete(&self, name: &str) -> BoxFuture<'_, Result<(), ObjectsError>> {
        self.inner.delete(name)
    }
    fn url(&self) -> String {
        self.inner.url()
    }
}

fn frame(text: &str) -> Frame {
    Frame {
        json: text.as_bytes().to_vec(),
        blob: text.as_bytes().to_vec(),
    }
}

/// The frames' text, segment by segment.
fn texts(replayed: &[Replayed]) -> Vec<Vec<String>> {
    replayed
        .iter()
        .map(|r| {
            r.frames
                .iter()
                .map(|f| String::from_utf8(f.json.clone()).unwrap())
                .collect()
        })
        .collect()
}

fn files_log(dir: &std::path::Path) -> Log {
    Log::new(Arc::new(Files::new(dir.to_path_buf())))
}

#[tokio::test]
async fn appends_read_back_in_order_by_a_new_server() {
    let dir = crate::scratch::dir("log");
    let mut a = files_log(dir.path());
    assert_eq!(a.read().await.unwrap(), vec![]);
    assert!(a.take_over(&[]).await.unwrap());
    a.append(&[frame("1"), frame("2")]).await.unwrap();
    a.append(&[frame("3")]).await.unwrap();
    let mut b = files_log(dir.path());
    let read = b.read().await.unwrap();
    assert_eq!(texts(&read), [vec![], vec!["1", "2"], vec!["3"]]);
    assert_eq!(read[0].kind, Kind::Snapshot);
    assert_eq!(read[1].frames[0].blob, b"1");
}

#[tokio::test]
async fn a_server_taken_over_is_fenced_at_its_next_write() {
    let dir = crate::scratch::dir("log");
    let mut old = files_log(dir.path());
    old.read().await.unwrap();
    assert!(old.take_over(&[]).await.unwrap());
    old.append(&[frame("old")]).await.unwrap();
    assert!(old.probe().await.is_ok());

    let mut new = files_log(dir.path());
    let read = new.read().await.unwrap();
    assert_eq!(texts(&read), [vec![], vec!["old"]]);
    assert!(new.take_over(&[frame("state")]).await.unwrap());

    // The old server finds out without writing, and at its next write.
    assert!(matches!(old.probe().await, Err(AppendError::Fenced { .. })));
    let mut old_again = files_log(dir.path());
    old_again.read().await.unwrap();
    old_again.take_over(&[]).await.unwrap();
    let err = old.append(&[frame("late")]).await.unwrap_err();
    assert!(matches!(err, AppendError::Fenced { .. }), "{err}");
    // Fenced for good: no later write is tried.
    assert!(old.fenced().is_some());
    assert!(old.append(&[]).await.is_err());

    let mut reader = files_log(dir.path());
    let texts = texts(&reader.read().await.unwrap());
    assert!(!texts.concat().contains(&"late".to_string()), "{texts:?}");
}

#[tokio::test]
async fn a_takeover_that_races_a_write_reads_again() {
    let dir = crate::scratch::dir("log");
    let mut old = files_log(dir.path());
    old.read().await.unwrap();
    old.take_over(&[]).await.unwrap();
    let mut new = files_log(dir.path());
    new.read().await.unwrap();
    // The old server writes between the new one's read and its takeover.
    old.append(&[frame("between")]).await.unwrap();
    assert!(!new.take_over(&[frame("stale")]).await.unwrap());
    let read = new.read().await.unwrap();
    assert_eq!(texts(&read).last().unwrap(), &["between"]);
    assert!(new.take_over(&[frame("state")]).await.unwrap());
    assert!(old.append(&[]).await.is_err());
}

#[tokio::test]
async fn a_write_reported_failed_that_landed_does_not_count() {
    let dir = crate::scratch::dir("log");
    let faulty = Faulty::new(dir.path());
    let mut log = Log::new(faulty.clone());
    log.read().await.unwrap();
    log.take_over(&[]).await.unwrap();
    faulty.land_then_fail.store(true, Ordering::SeqCst);
    assert!(matches!(
        log.append(&[frame("lost")]).await,
        Err(AppendError::Failed(_))
    ));
    faulty.fail.store(true, Ordering::SeqCst);
    assert!(log.append(&[frame("failed")]).await.is_err());
    faulty.fail.store(false, Ordering::SeqCst);
    log.append(&[frame("kept")]).await.unwrap();
    assert!(log.fenced().is_none());

    let mut reader = files_log(dir.path());
    let read = reader.read().await.unwrap();
    assert_eq!(texts(&read), [vec![], vec!["kept"]]);
    // The landed one is there, and voided by the next.
    let files = Files::new(dir.path().to_path_buf());
    assert_eq!(
        files.list("log").await.unwrap(),
        [segment_name(0), segment_name(1), segment_name(2)]
    );
    let second = files.get(&segment_name(2), 1 << 20).await.unwrap().unwrap();
    assert_eq!(segment::decode_header(&second).unwrap().voids, [1]);
}

#[tokio::test]
async fn a_snapshot_deletes_what_it_replaces() {
    let dir = crate::scratch::dir("log");
    let mut log = files_log(dir.path());
    log.read().await.unwrap();
    log.take_over(&[]).await.unwrap();
    for i in 0..5 {
        log.append(&[frame(&i.to_string())]).await.unwrap();
    }
    assert_eq!(log.since_snapshot(), 6);
    log.compact(&[frame("all")]).await.unwrap();
    assert_eq!(log.since_snapshot(), 1);
    let files = Files::new(dir.path().to_path_buf());
    assert_eq!(files.list("log").await.unwrap(), [segment_name(6)]);
    let mut reader = files_log(dir.path());
    assert_eq!(texts(&reader.read().await.unwrap()), [vec!["all"]]);
    // A segment a cut deletion left before the snapshot is passed over.
    let stale = segment::encode(
        &Header {
            format: segment::FORMAT,
            seq: 2,
            writer: "w".into(),
            kind: Kind::Changes,
            voids: vec![],
        },
        &[frame("stale")],
    );
    files.create(&segment_name(2), stale).await.unwrap();
    let mut reader = files_log(dir.path());
    assert_eq!(texts(&reader.read().await.unwrap()), [vec!["all"]]);
}

#[tokio::test]
async fn foreign_damaged_or_missing_segments_are_refused_by_name() {
    let dir = crate::scratch::dir("log");
    let mut log = files_log(dir.path());
    log.read().await.unwrap();
    log.take_over(&[]).await.unwrap();
    log.append(&[frame("1")]).await.unwrap();
    let files = Files::new(dir.path().to_path_buf());

    files.create("log/notes.txt", b"hi".to_vec()).await.unwrap();
    let err = files_log(dir.path()).read().await.unwrap_err().to_string();
    assert!(
        err.contains("log/notes.txt") && err.contains("not a segment name"),
        "{err}"
    );
    files.delete("log/notes.txt").await.unwrap();

    let path = dir.path().join(segment_name(1));
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len() / 2;
    bytes[n] ^= 1;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let err = files_log(dir.path()).read().await.unwrap_err().to_string();
    assert!(
        err.contains(&segment_name(1)) && err.contains("CRC"),
        "{err}"
    );

    // A gap in the numbers: segment 1 gone, 2 there.
    std::fs::remove_file(&path).unwrap();
    let seg2 = segment::encode(
        &Header {
            format: segment::FORMAT,
            seq: 2,
            writer: "x".into(),
            kind: Kind::Changes,
            voids: vec![],
        },
        &[],
    );
    files.create(&segment_name(2), seg2).await.unwrap();
    let err = files_log(dir.path()).read().await.unwrap_err().to_string();
    assert!(err.contains("segment 1 is missing"), "{err}");
}

#[test]
fn state_urls_parse() {
    assert_eq!(
        StateUrl::parse("s3://bucket/a/b/").unwrap(),
        StateUrl::S3 {
            bucket: "bucket".into(),
            prefix: "a/b".into()
        }
    );
    assert_eq!(
        StateUrl::parse("file:///var/lib/x").unwrap(),
        StateUrl::Files("/var/lib/x".into())
    );
    assert_eq!(
        StateUrl::parse("/Volumes/main/x").unwrap(),
        StateUrl::Files("/Volumes/main/x".into())
    );
    for bad in ["s3://", "gs://b/p", "relative/dir", "file://rel"] {
        assert!(StateUrl::parse(bad).is_err(), "{bad}");
    }
}
