//! The server's own files, checked before it trusts them.
//!
//! The state directory holds every receipt handle a consumer has not yet
//! committed, `--tls-self-signed DIR` the TLS key, and a token file or a
//! TOML file with `auth_token` the bearer token. Another local user who
//! could write one of them, or any directory above the first two, could
//! replace the store, the key or the token; one who could read a secret
//! could act as any client. So, as ssh's `StrictModes` and the Python
//! client's state directory do (`sqs_flight/state_dir.py`), at start:
//!
//! - a path is resolved first (symbolic links followed once, by
//!   [`canonicalize`](std::fs::canonicalize)); the real path is checked and
//!   then used, so a link cannot be turned elsewhere after the check;
//! - a private directory ([`private_dir`]) belongs to this process's
//!   effective user and is not writable by group or others; made `0700`
//!   when missing;
//! - every directory above it belongs to root or to that user and is not
//!   writable by group or others, except a sticky directory owned by root
//!   (such as `/tmp`): there others can add entries but cannot move or
//!   remove the ones below it, which the same rule makes root's or the
//!   user's;
//! - a secret file ([`read_secret`], [`check_secret`]) belongs to the user
//!   and only the user can read or write it (`0600` or `0400`); a file of
//!   root's may also be readable by its group (as PostgreSQL allows for its
//!   key: a group such as `ssl-cert` or a container's `fsGroup` shares it),
//!   never by others;
//! - a file the server makes ([`open_private`]) is created `0600`, whatever
//!   the umask, never through a link; an existing one of the user's with
//!   looser bits is tightened to `0600` (and logged): servers before this
//!   check created `registry.redb` `0644`, and the directory above it was
//!   already private.
//!
//! Each refusal names the path and the command that fixes it.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The uid whose files the server trusts beside root's.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why a path is not trusted, with the fix.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// Its owner or permissions let another user change (or read) it.
    #[error("{problem}: {fix}")]
    Unsafe { problem: String, fix: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> PathError + '_ {
    move |source| PathError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn refuse(problem: String, fix: String) -> PathError {
    PathError::Unsafe { problem, fix }
}

/// `mode`'s permission bits as `chmod` writes them (`0755`).
fn mode_text(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// `path` as a directory only this user can change: resolved, made `0700`
/// (and its missing parents) when missing, and checked with every
/// directory above it (see the [module docs](self)). Returns the real path.
pub fn private_dir(path: &Path) -> Result<PathBuf, PathError> {
    let real = match path.canonicalize() {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_private_dir(path)?,
        Err(e) => return Err(io_error(path)(e)),
    };
    check_parents(&real)?;
    check_own_dir(&real, &std::fs::metadata(&real).map_err(io_error(&real))?)?;
    Ok(real)
}

/// Makes the missing part of `path` (mode `0700`) below its nearest
/// existing ancestor, once that ancestor and the directories above it are
/// checked: nothing is made in a directory another user controls.
fn create_private_dir(path: &Path) -> Result<PathBuf, PathError> {
    let path = std::path::absolute(path).map_err(io_error(path))?;
    let existing = path
        .ancestors()
        .skip(1)
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"));
    let base = existing.canonicalize().map_err(io_error(existing))?;
    let rest = path.strip_prefix(existing).unwrap_or(&path);
    let target = base.join(rest);
    check_ancestors(&base, &target, euid())?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&target)
        .map_err(io_error(&target))?;
    target.canonicalize().map_err(io_error(&target))
}

/// Every directory above `real` (a resolved path): root's or this user's,
/// and not writable by group or others unless it is a sticky directory of
/// root's.
pub fn check_parents(real: &Path) -> Result<(), PathError> {
    match real.parent() {
        Some(parent) => check_ancestors(parent, real, euid()),
        None => Ok(()),
    }
}

/// `start` and every directory above it, as [`check_parents`] says, for
/// the user `me`; `below` is what they hold (named in the message).
fn check_ancestors(start: &Path, below: &Path, me: u32) -> Result<(), PathError> {
    for dir in start.ancestors() {
        let meta = std::fs::metadata(dir).map_err(io_error(dir))?;
        ancestor_problem(dir, below, meta.uid(), meta.mode(), me)?;
    }
    Ok(())
}

/// The rule of one directory `dir` above `below`, whose owner is `uid`.
fn ancestor_problem(
    dir: &Path,
    below: &Path,
    uid: u32,
    mode: u32,
    me: u32,
) -> Result<(), PathError> {
    if uid != 0 && uid != me {
        return Err(refuse(
            format!(
                "{} (above {}) belongs to another user (uid {uid}), who could move what is below \
                 it aside and put something else in its place",
                dir.display(),
                below.display()
            ),
            "use a directory whose parents belong to you or to root".into(),
        ));
    }
    let sticky_of_root = uid == 0 && mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky_of_root {
        return Err(refuse(
            format!(
                "group or others can write {} (mode {}, above {}), so they could move what is \
                 below it aside and put something else in its place",
                dir.display(),
                mode_text(mode),
                below.display()
            ),
            format!(
                "run chmod go-w {}, or use a directory whose parents only you or root can write",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// `dir` itself: a directory of this user's that group and others cannot
/// write.
fn check_own_dir(dir: &Path, meta: &Metadata) -> Result<(), PathError> {
    if !meta.is_dir() {
        return Err(refuse(
            format!("{} is not a directory", dir.display()),
            "give a directory".into(),
        ));
    }
    check_owner(dir, meta)?;
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(
            format!(
                "group or others can write {} (mode {}), so they could replace the files in it",
                dir.display(),
                mode_text(meta.mode())
            ),
            format!("run chmod 700 {}", dir.display()),
        ));
    }
    Ok(())
}

/// `path` belongs to this process's effective user.
fn check_owner(path: &Path, meta: &Metadata) -> Result<(), PathError> {
    let me = euid();
    if meta.uid() != me {
        return Err(refuse(
            format!(
                "{} belongs to another user (uid {}), who could replace or read it",
                path.display(),
                meta.uid()
            ),
            format!(
                "run chown {me} {}, or use one of your own (the server runs as uid {me})",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// A file of this user's or root's that group and others cannot write (a
/// certificate).
pub fn check_owned_file(path: &Path, meta: &Metadata) -> Result<(), PathError> {
    if meta.uid() != 0 {
        check_owner(path, meta)?;
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(
            format!(
                "group or others can write {} (mode {})",
                path.display(),
                mode_text(meta.mode())
            ),
            format!("run chmod go-w {}", path.display()),
        ));
    }
    Ok(())
}

/// A file holding a secret (a token, a key): this user's and readable by
/// nobody else, or root's and readable by its group at most.
pub fn check_secret(path: &Path, meta: &Metadata) -> Result<(), PathError> {
    secret_problem(path, meta.uid(), meta.mode(), euid())
}

/// The rule of [`check_secret`] for a file of `uid` read by the user `me`.
fn secret_problem(path: &Path, uid: u32, mode: u32, me: u32) -> Result<(), PathError> {
    let open_bits = if uid == me {
        0o077
    } else if uid == 0 {
        0o027
    } else {
        return Err(refuse(
            format!(
                "{} holds a secret and belongs to another user (uid {uid}), who could change it",
                path.display()
            ),
            format!(
                "run chown {me} {} and chmod 600 {0}, or use a file of your own",
                path.display()
            ),
        ));
    };
    if mode & open_bits != 0 {
        return Err(refuse(
            format!(
                "{} holds a secret and group or others can read or write it (mode {})",
                path.display(),
                mode_text(mode)
            ),
            format!("run chmod 600 {}", path.display()),
        ));
    }
    Ok(())
}

/// The text of the file at `path` and what it was when read: resolved,
/// then opened once, so that the checks apply to the file that was read.
pub fn read_checked(path: &Path) -> std::io::Result<(String, Metadata)> {
    let mut file = File::open(path.canonicalize()?)?;
    let meta = file.metadata()?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok((text, meta))
}

/// The text of the secret file at `path`, once [`check_secret`] passes.
pub fn read_secret(path: &Path) -> Result<String, PathError> {
    let (text, meta) = read_checked(path).map_err(io_error(path))?;
    check_secret(path, &meta)?;
    Ok(text)
}

/// Opens (creating if missing) the file `path` in a checked private
/// directory for reading and writing: created `0600`, never through a
/// link, this user's, tightened to `0600` if it was looser.
pub fn open_private(path: &Path) -> Result<File, PathError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse(
                format!("{} is a symbolic link", path.display()),
                format!(
                    "remove it: the server's files are never opened through links (rm {})",
                    path.display()
                ),
            ),
            _ => io_error(path)(e),
        })?;
    let meta = file.metadata().map_err(io_error(path))?;
    check_owner(path, &meta)?;
    if !meta.is_file() {
        return Err(refuse(
            format!("{} is not a regular file", path.display()),
            "remove it".into(),
        ));
    }
    if meta.mode() & 0o7777 != 0o600 {
        tracing::warn!(path = %path.display(), mode = %mode_text(meta.mode()),
            "the file holds receipts or secrets: permissions tightened to 0600");
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io_error(path))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{chown, symlink};

    use super::*;

    /// A user the tests run beside ("nobody").
    const OTHER: u32 = 65534;

    /// A directory under the temp dir, removed at drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("sqsf-secure-{name}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    fn refusal(r: Result<impl std::fmt::Debug, PathError>) -> String {
        match r {
            Err(e @ PathError::Unsafe { .. }) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_directory_is_made_0700_and_an_own_0755_one_is_taken() {
        let scratch = Scratch::new("make");
        let made = private_dir(&scratch.0.join("a/b")).unwrap();
        assert_eq!(made, scratch.0.join("a/b").canonicalize().unwrap());
        assert_eq!(mode(&made), 0o700);
        assert_eq!(mode(&scratch.0.join("a")), 0o700, "its missing parent too");
        let own = scratch.0.join("own");
        std::fs::create_dir(&own).unwrap();
        chmod(&own, 0o755);
        private_dir(&own).expect("only group and others' write is refused");
    }

    #[test]
    fn a_directory_of_another_user_or_writable_by_others_is_refused() {
        let scratch = Scratch::new("own");
        let dir = scratch.0.join("state");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o700);
        chown(&dir, Some(OTHER), None).unwrap();
        let e = refusal(private_dir(&dir));
        assert!(
            e.contains("belongs to another user (uid 65534)") && e.contains("chown"),
            "{e}"
        );
        chown(&dir, Some(euid()), None).unwrap();
        chmod(&dir, 0o777);
        let e = refusal(private_dir(&dir));
        assert!(
            e.contains(&format!("run chmod 700 {}", dir.display())),
            "{e}"
        );
        // A link is followed to the real directory, which is checked.
        chmod(&dir, 0o700);
        chown(&dir, Some(OTHER), None).unwrap();
        let link = scratch.0.join("link");
        symlink(&dir, &link).unwrap();
        let e = refusal(private_dir(&link));
        assert!(e.contains("uid 65534"), "{e}");
    }

    #[test]
    fn every_parent_is_checked_as_ssh_strict_modes_does() {
        let scratch = Scratch::new("parents");
        let parent = scratch.0.join("p");
        let dir = parent.join("state");
        std::fs::create_dir_all(&dir).unwrap();
        chmod(&dir, 0o700);
        // A parent anyone can write: the 0700 directory could be swapped.
        chmod(&parent, 0o777);
        let e = refusal(private_dir(&dir));
        assert!(
            e.contains(&format!("run chmod go-w {}", parent.display())),
            "{e}"
        );
        assert!(e.contains("above"), "{e}");
        // Nor is anything made below it.
        let e = refusal(private_dir(&parent.join("new")));
        assert!(e.contains("chmod go-w"), "{e}");
        assert!(!parent.join("new").exists());
        // A parent of another user's, however tight.
        chmod(&parent, 0o755);
        chown(&parent, Some(OTHER), None).unwrap();
        let e = refusal(private_dir(&dir));
        assert!(e.contains("uid 65534") && e.contains("parents"), "{e}");
        // A sticky directory of root's (as /tmp) may be writable by all.
        chown(&parent, Some(0), None).unwrap();
        chmod(&parent, 0o1777);
        private_dir(&dir).expect("below a sticky directory of root's");
        // Not a sticky one of another user's.
        chown(&parent, Some(OTHER), None).unwrap();
        refusal(private_dir(&dir));
    }

    #[test]
    fn the_rules_for_a_user_other_than_root() {
        let (p, below) = (Path::new("/x"), Path::new("/x/y"));
        let me = 1000;
        ancestor_problem(p, below, 0, 0o755, me).unwrap();
        ancestor_problem(p, below, me, 0o700, me).unwrap();
        ancestor_problem(p, below, 0, 0o1777, me).unwrap();
        refusal(ancestor_problem(p, below, me, 0o1777, me));
        refusal(ancestor_problem(p, below, 1001, 0o755, me));
        refusal(ancestor_problem(p, below, 0, 0o775, me));
        // A secret of root's may be shared with its group, never with others.
        secret_problem(p, 0, 0o640, me).unwrap();
        refusal(secret_problem(p, 0, 0o644, me));
        refusal(secret_problem(p, 0, 0o660, me));
        secret_problem(p, me, 0o400, me).unwrap();
        refusal(secret_problem(p, me, 0o640, me));
        refusal(secret_problem(p, 1001, 0o600, me));
    }

    #[test]
    fn a_secret_readable_by_others_or_of_another_user_is_refused() {
        let scratch = Scratch::new("secret");
        let file = scratch.0.join("token");
        std::fs::write(&file, "tok").unwrap();
        chmod(&file, 0o644);
        let e = refusal(read_secret(&file));
        assert!(
            e.contains(&format!("run chmod 600 {}", file.display())),
            "{e}"
        );
        assert!(e.contains("mode 0644"), "{e}");
        chmod(&file, 0o600);
        assert_eq!(read_secret(&file).unwrap(), "tok");
        chown(&file, Some(OTHER), None).unwrap();
        let e = refusal(read_secret(&file));
        assert!(
            e.contains("another user (uid 65534)") && e.contains("chown"),
            "{e}"
        );
        assert!(matches!(
            read_secret(&scratch.0.join("missing")),
            Err(PathError::Io { .. })
        ));
    }

    #[test]
    fn a_made_file_is_0600_a_loose_one_tightened_a_link_refused() {
        let scratch = Scratch::new("made");
        let path = scratch.0.join("registry.redb");
        drop(open_private(&path).unwrap());
        assert_eq!(mode(&path), 0o600, "whatever the umask");
        chmod(&path, 0o644);
        drop(open_private(&path).unwrap());
        assert_eq!(mode(&path), 0o600, "tightened");
        chown(&path, Some(OTHER), None).unwrap();
        assert!(refusal(open_private(&path)).contains("uid 65534"));
        let link = scratch.0.join("link.redb");
        symlink(scratch.0.join("elsewhere"), &link).unwrap();
        let e = refusal(open_private(&link));
        assert!(e.contains("symbolic link"), "{e}");
        assert!(
            !scratch.0.join("elsewhere").exists(),
            "nothing made through the link"
        );
    }
}
