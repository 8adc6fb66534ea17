//! This server process's identity, and the ready file that publishes it.
//!
//! A pid alone cannot tell a program whether the process it started is still
//! the one behind that pid (pids are reused), and an RPC that reaches SQS
//! (`status`) cannot tell a dead server from a throttled queue. So each
//! process makes a random instance id at start and answers it, with its pid
//! and start time, from the `server_info` action without any SQS call. With
//! `--ready-file`, the same facts and the URL are written to a file once the
//! server listens (atomically: a private temp file, then a rename), so that a
//! program that starts the server, or one that finds a server whose starter
//! died, learns where it is and whose it is without parsing its log.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Bytes of randomness in an instance id (128 bits, hex in the id).
const INSTANCE_ID_BYTES: usize = 16;

/// The identity of this server process.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Instance {
    /// 32 hex digits, random, made at start.
    pub instance_id: String,
    pub pid: u32,
    /// The server's version (its crate version).
    pub version: &'static str,
    /// Unix seconds when the process made its identity (at start).
    pub started_at: u64,
}

impl Instance {
    /// A fresh identity. The id's randomness comes from the standard
    /// library's per-process hash keys, which it takes from the operating
    /// system's random source: no file to read, nothing that can fail.
    pub(crate) fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let pid = std::process::id();
        let mut id = String::with_capacity(2 * INSTANCE_ID_BYTES);
        for part in 0..INSTANCE_ID_BYTES / 8 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(pid);
            h.write_u128(now.as_nanos());
            h.write_usize(part);
            id.push_str(&format!("{:016x}", h.finish()));
        }
        Self {
            instance_id: id,
            pid,
            version: env!("CARGO_PKG_VERSION"),
            started_at: now.as_secs(),
        }
    }
}

impl Default for Instance {
    fn default() -> Self {
        Self::new()
    }
}

/// What `--ready-file` holds once the server listens.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ready {
    /// The location clients use (the advertised one).
    pub url: String,
    pub pid: u32,
    pub instance_id: String,
    pub started_at: u64,
    /// The bound socket address.
    pub listen: String,
}

/// Writes `ready` to `path` atomically: a temp file in the same directory,
/// created exclusively (never through a link) with mode 0600, synced, then
/// renamed over `path`.
pub(crate) fn write_ready_file(path: &Path, ready: &Ready) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let tmp: PathBuf = dir.unwrap_or(Path::new(".")).join(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        ready.pid,
        &ready.instance_id[..8.min(ready.instance_id.len())]
    ));
    let body = serde_json::to_vec_pretty(ready).map_err(std::io::Error::other)?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(&body)?;
            f.sync_all()
        });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Removes `path` if it still names `instance_id` (a newer server may have
/// replaced it); a missing or unreadable file is left alone.
pub(crate) fn remove_ready_file(path: &Path, instance_id: &str) {
    let Ok(text) = std::fs::read(path) else {
        return;
    };
    match serde_json::from_slice::<Ready>(&text) {
        Ok(r) if r.instance_id == instance_id => {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove the --ready-file");
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_are_random_hex_of_128_bits() {
        let (a, b) = (Instance::new(), Instance::new());
        assert_eq!(a.instance_id.len(), 32);
        assert!(a.instance_id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.instance_id, b.instance_id);
        assert_eq!(a.pid, std::process::id());
    }

    fn ready(id: &str) -> Ready {
        Ready {
            url: "grpc://127.0.0.1:1".into(),
            pid: 7,
            instance_id: id.into(),
            started_at: 1,
            listen: "127.0.0.1:1".into(),
        }
    }

    #[test]
    fn the_ready_file_is_private_replaced_whole_and_removed_only_by_its_server() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = crate::scratch::dir("ready");
        let dir = scratch.path().to_path_buf();
        let path = dir.join("ready.json");
        write_ready_file(&path, &ready("aaaaaaaaaa")).unwrap();
        write_ready_file(&path, &ready("bbbbbbbbbb")).unwrap();
        let back: Ready = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, ready("bbbbbbbbbb"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temp file left"
        );
        remove_ready_file(&path, "aaaaaaaaaa");
        assert!(path.exists(), "another instance's file is kept");
        remove_ready_file(&path, "bbbbbbbbbb");
        assert!(!path.exists());
    }
}
