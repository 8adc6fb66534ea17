"""The private state directory of a managed server (sqs_flight.managed):
created 0700, owned by this user, not writable by others, on a local
filesystem; its files opened without following links and replaced whole.

Another user who could create or write the directory could read the bearer
token, point the driver at another server, or overwrite files through
symlinks; a FUSE or network mount breaks the server's store and the lock in
silence. So the directory is checked each time it is used, and refused with
the fix."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from .client import SqsFlightError

__all__ = ["check_local_filesystem", "private_state_dir"]

_log = logging.getLogger("sqs_flight.managed")

#: Seconds to wait for another process's lock on the state directory.
LOCK_TIMEOUT_S = 120.0
#: Filesystems that cannot hold the server's store or the lock: FUSE (DBFS,
#: Unity Catalog volumes, s3fs...), network and shared ones.
_REMOTE_FS = ("fuse", "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre", "gpfs")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _filesystem_of(path: Path, mountinfo: Optional[str] = None) -> Optional[Tuple[str, str]]:
    """``(mount point, filesystem type)`` holding ``path``, from
    ``/proc/self/mountinfo`` (None without it)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    best: Optional[Tuple[str, str]] = None
    target = str(path)
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= len(best[0])):
            best = (mount, tail[0])
    return best


def check_local_filesystem(path: Path, mountinfo: Optional[str] = None) -> None:
    """Refuses a state directory on FUSE (``/dbfs``, ``/Volumes``), NFS or
    SMB: the server's store (redb) and the lock (``flock``) need a local
    filesystem, and such mounts break both in silence."""
    found = _filesystem_of(path, mountinfo)
    if found is None:
        return
    mount, fstype = found
    kind = fstype.split(".", 1)[0]
    if kind in _REMOTE_FS:
        raise SqsFlightError(
            "FAILED_PRECONDITION",
            f"managed mode: the state directory {path} is on {mount} ({fstype}), which cannot hold the "
            'server\'s store or its lock (they need a local filesystem): set the option "stateDir" to a '
            "directory on a local disk (the default, under the user's home, is one)",
        )


def private_state_dir(path: str) -> Path:
    """``path`` resolved, created 0700 if missing, and checked: owned by this
    user, not writable by group or others, on a local filesystem."""
    state = Path(path).expanduser().resolve()
    created = not state.exists()
    try:
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        if created:
            os.chmod(state, 0o700)  # whatever the umask
        st = os.stat(state)
    except OSError as e:
        raise SqsFlightError(
            "FAILED_PRECONDITION", f"managed mode: cannot create the state directory {state}: {e}"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise SqsFlightError("FAILED_PRECONDITION", f"managed mode: the state directory {state} is not a directory")
    if st.st_uid != os.geteuid():
        raise SqsFlightError(
            "FAILED_PRECONDITION",
            f"managed mode: the state directory {state} belongs to another user (uid {st.st_uid}), who could "
            f'read the token or replace the server: set the option "stateDir" to a directory of your own',
        )
    if st.st_mode & 0o022:
        raise SqsFlightError(
            "FAILED_PRECONDITION",
            f"managed mode: group or others can write the state directory {state} (mode "
            f"{oct(st.st_mode & 0o777)}), so they could replace the server's files: run chmod 700 {state}, "
            'or set the option "stateDir" to a private directory',
        )
    check_local_filesystem(state)
    return state


def _open_private(path: Path, flags: int) -> int:
    """``os.open`` that never follows a link at ``path``, mode 0600."""
    try:
        return os.open(path, flags | _O_NOFOLLOW, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SqsFlightError(
                "FAILED_PRECONDITION",
                f"managed mode: {path} is a symbolic link; the state directory's files are never followed "
                "through links: remove it",
            ) from None
        raise


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    fd = _open_private(state / "managed.lock", os.O_RDWR | os.O_CREAT)
    with os.fdopen(fd, "r+") as f:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SqsFlightError(
                        "UNAVAILABLE",
                        f"another process has held {state / 'managed.lock'} for {LOCK_TIMEOUT_S:g} s",
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        fd = _open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            value = json.loads(f.read())
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError) as e:
        _log.warning("sqs-flight: ignoring unreadable %s: %s", path, e)
        return {}


def _write_record(state: Path, record: Dict[str, Any]) -> None:
    """``managed.json``, replaced whole (see :func:`_write_private`)."""
    _write_private(state, "managed.json", json.dumps(record, indent=2, sort_keys=True))


def _write_private(state: Path, name: str, text: str) -> None:
    """``state/name`` replaced whole: a temp file created exclusively
    (never through a link, mode 0600), synced, renamed."""
    tmp = state / f"{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    fd = _open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, state / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
