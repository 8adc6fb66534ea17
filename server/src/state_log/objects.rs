//! Where the state log's objects live: a directory (a local disk, NFS, a
//! mounted volume) or an S3 prefix, behind the four calls the log needs.
//! The one that matters is [`LogObjects::create`]: it writes an object
//! only if none has that name, atomically, which is what makes one
//! server the log's only writer.

use std::io::Write;
use std::path::{Path, PathBuf};

use futures::FutureExt;
use futures::future::BoxFuture;

/// What [`LogObjects::create`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The object is ours.
    Created,
    /// An object of that name was there already; nothing was written.
    Exists,
}

/// A failed call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation} of {name} failed ({code}): {message}")]
pub struct ObjectsError {
    pub operation: &'static str,
    /// The object's (or the prefix's) full name.
    pub name: String,
    /// S3's error code, an HTTP status, or the I/O error's kind.
    pub code: String,
    pub message: String,
    /// The store refused for good (access denied, no such bucket), as
    /// opposed to failing for now (throttled, unreachable, timed out).
    pub refused: bool,
}

/// The calls the state log makes. Names are relative to the log's
/// place (`log/00000000000000000007`).
pub trait LogObjects: Send + Sync + 'static {
    /// Writes `bytes` as `name` unless an object of that name exists.
    fn create(&self, name: &str, bytes: Vec<u8>) -> BoxFuture<'_, Result<Created, ObjectsError>>;
    /// The object, `None` if there is none, refusing one over `max_bytes`.
    fn get(
        &self,
        name: &str,
        max_bytes: u64,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>>;
    /// At most the first `n` bytes of `name`, `None` if there is none.
    fn get_start(&self, name: &str, n: u64)
    -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>>;
    /// Whether `name` exists.
    fn exists(&self, name: &str) -> BoxFuture<'_, Result<bool, ObjectsError>>;
    /// The names under `dir/`, sorted.
    fn list(&self, dir: &str) -> BoxFuture<'_, Result<Vec<String>, ObjectsError>>;
    /// Removes `name`; no error if it is gone already.
    fn delete(&self, name: &str) -> BoxFuture<'_, Result<(), ObjectsError>>;
    /// Removes every one of `names`, in any order (S3: DeleteObjects, a
    /// request per 1,000); no error for one gone already.
    fn delete_many(&self, names: Vec<String>) -> BoxFuture<'_, Result<(), ObjectsError>> {
        async move {
            for name in names {
                self.delete(&name).await?;
            }
            Ok(())
        }
        .boxed()
    }
    /// The place, as a URL, for messages.
    fn url(&self) -> String;
}

/// A log in a directory: each object is written to a temporary file,
/// flushed to disk, then hard-linked to its name, which fails if the name
/// exists (atomic on local file systems and NFS). No locks, no mmap.
#[derive(Clone)]
pub struct Files {
    dir: PathBuf,
    /// Whether to link into place (tests turn it off, as a file system
    /// without hard links does).
    links: bool,
}

/// Whether `e` says the file system has no hard links.
fn no_links(e: &std::io::Error) -> bool {
    // EPERM (FUSE, some SMB), EOPNOTSUPP, EXDEV, EMLINK.
    matches!(
        e.kind(),
        std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::EXDEV | libc::EMLINK)
    )
}

impl Files {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir, links: true }
    }

    /// A directory log that writes as on a file system without hard links.
    #[cfg(test)]
    pub fn without_links(dir: PathBuf) -> Self {
        Self { dir, links: false }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn error(&self, operation: &'static str, path: &Path, e: std::io::Error) -> ObjectsError {
        let refused = matches!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
        );
        ObjectsError {
            operation,
            name: path.display().to_string(),
            code: format!("{:?}", e.kind()),
            message: e.to_string(),
            refused,
        }
    }

    /// The blocking part of [`LogObjects::create`].
    fn create_now(&self, name: &str, bytes: &[u8]) -> Result<Created, ObjectsError> {
        let path = self.path(name);
        let parent = path.parent().expect("a name has a directory").to_path_buf();
        private_dirs(&parent).map_err(|e| self.error("create", &parent, e))?;
        let tmp_dir = self.dir.join("tmp");
        private_dirs(&tmp_dir).map_err(|e| self.error("create", &tmp_dir, e))?;
        let tmp = tmp_dir.join(format!(
            "{}.{}.{}",
            name.replace('/', "_"),
            std::process::id(),
            unique()
        ));
        let written = (|| {
            let mut f = private_file(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(self.error("create", &tmp, e));
        }
        let linked = match self.links {
            true => std::fs::hard_link(&tmp, &path),
            false => Err(std::io::Error::from(std::io::ErrorKind::Unsupported)),
        };
        let _ = std::fs::remove_file(&tmp);
        let created = match linked {
            Err(e) if no_links(&e) => self.create_in_place(&path, bytes),
            other => other,
        };
        match created {
            Ok(()) => {
                // The new name is durable once its directory is.
                if let Ok(d) = std::fs::File::open(&parent) {
                    let _ = d.sync_all();
                }
                Ok(Created::Created)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Created::Exists),
            Err(e) => Err(self.error("create", &path, e)),
        }
    }

    /// Where a file system has no hard links (some FUSE mounts): the name
    /// is created exclusively (`O_EXCL`), then written and flushed. A
    /// reader may meet it half written (refused by its CRC, as damaged),
    /// only while it is being written or after a crash in that moment.
    fn create_in_place(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut f = private_file(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    }
}

/// Segments hold receipt handles: the directories the log makes are the
/// owner's alone (`0700`); those above them stay as they are.
fn private_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// A new file only its owner can read (`0600`), failing if `path` exists.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// A number no other call of this process gets.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Runs blocking file I/O off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ObjectsError> + Send + 'static,
) -> Result<T, ObjectsError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

impl LogObjects for Files {
    fn create(&self, name: &str, bytes: Vec<u8>) -> BoxFuture<'_, Result<Created, ObjectsError>> {
        let this = self.clone();
        let name = name.to_string();
        blocking(move || this.create_now(&name, &bytes)).boxed()
    }

    fn get(
        &self,
        name: &str,
        max_bytes: u64,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>> {
        let this = self.clone();
        let path = self.path(name);
        blocking(move || {
            let len = match std::fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(this.error("read", &path, e)),
            };
            if len > max_bytes {
                return Err(ObjectsError {
                    operation: "read",
                    name: path.display().to_string(),
                    code: "TooLarge".into(),
                    message: format!("{len} bytes, above {max_bytes}"),
                    refused: true,
                });
            }
            match std::fs::read(&path) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(this.error("read", &path, e)),
            }
        })
        .boxed()
    }

    fn get_start(
        &self,
        name: &str,
        n: u64,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>> {
        let this = self.clone();
        let path = self.path(name);
        blocking(move || {
            use std::io::Read;
            let mut start = Vec::new();
            let read = std::fs::File::open(&path).and_then(|f| f.take(n).read_to_end(&mut start));
            match read {
                Ok(_) => Ok(Some(start)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(this.error("read", &path, e)),
            }
        })
        .boxed()
    }

    fn exists(&self, name: &str) -> BoxFuture<'_, Result<bool, ObjectsError>> {
        let this = self.clone();
        let path = self.path(name);
        blocking(move || match std::fs::metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(this.error("stat", &path, e)),
        })
        .boxed()
    }

    fn list(&self, dir: &str) -> BoxFuture<'_, Result<Vec<String>, ObjectsError>> {
        let this = self.clone();
        let dir = dir.to_string();
        blocking(move || {
            let path = this.path(&dir);
            let entries = match std::fs::read_dir(&path) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(this.error("list", &path, e)),
            };
            let mut names = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| this.error("list", &path, e))?;
                names.push(format!("{dir}/{}", entry.file_name().to_string_lossy()));
            }
            names.sort();
            Ok(names)
        })
        .boxed()
    }

    fn delete(&self, name: &str) -> BoxFuture<'_, Result<(), ObjectsError>> {
        let this = self.clone();
        let path = self.path(name);
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(this.error("delete", &path, e)),
        })
        .boxed()
    }

    fn url(&self) -> String {
        format!("file://{}", self.dir.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_is_created_once() {
        let dir = crate::scratch::dir("log-files");
        created_once(Files::new(dir.path().to_path_buf())).await;
        let dir = crate::scratch::dir("log-files");
        created_once(Files::without_links(dir.path().to_path_buf())).await;
    }

    async fn created_once(files: Files) {
        assert_eq!(files.list("log").await.unwrap(), Vec::<String>::new());
        assert_eq!(files.get("log/1", 10).await.unwrap(), None);
        assert!(!files.exists("log/1").await.unwrap());
        let first = files.create("log/1", b"one".to_vec()).await.unwrap();
        let second = files.create("log/1", b"two".to_vec()).await.unwrap();
        assert_eq!((first, second), (Created::Created, Created::Exists));
        assert_eq!(files.get("log/1", 10).await.unwrap(), Some(b"one".to_vec()));
        assert_eq!(
            files.get_start("log/1", 2).await.unwrap(),
            Some(b"on".to_vec())
        );
        assert_eq!(files.get_start("log/2", 2).await.unwrap(), None);
        assert!(files.get("log/1", 2).await.unwrap_err().refused);
        assert!(files.exists("log/1").await.unwrap());
        files.create("log/0", vec![]).await.unwrap();
        assert_eq!(files.list("log").await.unwrap(), ["log/0", "log/1"]);
        files.delete("log/1").await.unwrap();
        files.delete("log/1").await.unwrap();
        assert_eq!(files.list("log").await.unwrap(), ["log/0"]);
        // Receipt handles are for the owner's eyes only.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| {
            std::fs::metadata(files.path(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(
            (mode("log"), mode("log/0"), mode("tmp")),
            (0o700, 0o600, 0o700)
        );
        // No temporary file is left behind.
        assert_eq!(files.list("tmp").await.unwrap(), Vec::<String>::new());
    }
}
