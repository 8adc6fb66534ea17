"""The processes of managed servers (see :mod:`sqs_flight.managed`): which
one runs for a state directory, asked with ``server_info`` and, when it does
not answer, told by ``/proc``; sending the token only to a listener the
recorded process owns; signalling only the recorded process, checked again
right before each signal; and starting one with the record's tables and
port, a new token, and no ``SQSF_*`` variable of the driver's but that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from .client import Client, SqsFlightError
from .launch import Launch, ServerError, command
from .state_dir import _open_private, _read_json, _write_private, _write_record

_log = logging.getLogger("sqs_flight.managed")

#: Seconds to wait for a server to listen, and for one to stop.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
#: Seconds the liveness call (``server_info``, no SQS call) may take.
LIVENESS_TIMEOUT_S = 5.0
#: The server's ``--config`` in the state directory: its tables and their regions.
TABLES_FILE = "tables.toml"
#: The kernel's tables of TCP sockets (IPv4, IPv6), and the state of one
#: that listens (``TCP_LISTEN``).
_PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN = "0A"
#: Bytes of randomness in a managed server's bearer token (made anew at
#: each start).
TOKEN_BYTES = 32


# -- processes -------------------------------------------------------------


def _proc_stat(pid: int) -> Optional[List[str]]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> Optional[str]:
    """The start time of ``pid`` (``/proc/PID/stat`` field 22, clock ticks
    since boot): with the pid, it names one process, never a later one that
    reuses the pid. None without ``/proc`` or for no such process."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _proc_stat(pid)
    return not (fields and fields[0] == "Z")  # a zombie (an unreaped child) is not a server


def _has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def _proc_uid(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def is_recorded_process(state: Path, pid: int, start: Optional[str]) -> bool:
    """Whether ``pid`` is still the recorded server's process: it runs as
    this user with the recorded start time, and its command line is an
    sqs-flight-server of this state directory. Needs ``/proc``; without it
    nothing is confirmed."""
    if pid <= 0 or not start or not pid_runs(pid) or process_start(pid) != start:
        return False
    if _proc_uid(pid) != os.geteuid():
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"sqs-flight-server" in cmdline and str(state / "registry").encode() in cmdline


def _listening_inodes(port: int) -> Set[int]:
    """The inodes of the TCP sockets that listen on ``port``, whatever their
    address, IPv4 and IPv6 (``/proc/net/tcp*``: this network namespace's,
    the one a connection from this process reaches)."""
    inodes: Set[int] = set()
    for table in _PROC_NET_TCP:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:  # tcp6 without IPv6
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            with contextlib.suppress(ValueError, IndexError):
                if int(fields[1].rsplit(":", 1)[1], 16) == port and int(fields[9]):
                    inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> Set[int]:
    """The inodes of the sockets ``pid`` holds (its ``/proc/PID/fd`` links
    ``socket:[INODE]``); raises OSError when they cannot be read (another
    user's process, or one gone)."""
    inodes: Set[int] = set()
    with os.scandir(f"/proc/{pid}/fd") as entries:
        for entry in entries:
            try:
                target = os.readlink(entry.path)
            except OSError:  # a descriptor closed meanwhile
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(int(target[8:-1]))
    return inodes


def listener_not_owned(pid: int, url: str) -> Optional[str]:
    """None when every socket listening on the port of ``url`` is one of
    ``pid``'s own (and there is one); else why not. Checked before the
    token is sent to ``url``: another local user's process listening on a
    recorded port after its server exited never receives it."""
    try:
        port = urllib.parse.urlsplit(url).port
    except ValueError:
        port = None
    if not port:
        return f"the recorded URL {url!r} names no port"
    listening = _listening_inodes(port)
    if not listening:
        return f"nothing listens on port {port}"
    try:
        own = _socket_inodes(pid)
    except OSError as e:
        return f"the sockets of pid {pid} cannot be read ({e.strerror})"
    foreign = listening - own
    if foreign:
        return f"another process than pid {pid} listens on port {port} (socket inodes {sorted(foreign)})"
    return None


def _signal_recorded(state: Path, pid: int, start: Optional[str], sig: int) -> bool:
    """Sends ``sig`` to ``pid`` only if, right before, it is still the
    recorded process (:func:`is_recorded_process`); returns whether it was
    sent. A pidfd, opened before the check, makes the check and the signal
    about one process even if the pid is reused in between (Linux 5.3 and
    later; elsewhere the check runs right before ``kill``)."""
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    try:
        if not is_recorded_process(state, pid, start):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _signal_until_gone(state: Path, pid: int, start: Optional[str]) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`, each sent only
    while ``pid`` is confirmed to be the recorded server."""
    if not _signal_recorded(state, pid, start, signal.SIGTERM):
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while pid_runs(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_runs(pid):
        _signal_recorded(state, pid, start, signal.SIGKILL)


# -- the server ------------------------------------------------------------


def _server_info(url: str, token: str, pem: Optional[str]) -> Dict[str, Any]:
    """The server's ``server_info`` (no SQS call); raises SqsFlightError."""
    with Client(url, token=token, timeout=LIVENESS_TIMEOUT_S, tls_root_certs=pem) as c:
        return c._action("server_info", {})


def cert_pem(state: Path, record: Dict[str, Any]) -> Optional[str]:
    """The PEM clients trust: ``tls/ca.pem`` when the operator put one
    there (a certificate a CA signed), else the server's ``tls/cert.pem``."""
    if not record.get("tls"):
        return None
    for name in ("ca.pem", "cert.pem"):
        with contextlib.suppress(FileNotFoundError):
            fd = _open_private(state / "tls" / name, os.O_RDONLY)
            with os.fdopen(fd, "r") as f:
                return f.read()
    return None


@dataclasses.dataclass
class Found:
    """What runs for a state directory, as far as it can be told."""

    info: Optional[Dict[str, Any]]  # server_info, when the recorded server answered
    pid: int
    start: Optional[str]
    why: str  # why it is not usable, when it is not


def find(state: Path, record: Dict[str, Any]) -> Found:
    """The server ``ready.json`` names (the last one started; also when its
    starter died before recording it), else the recorded one, asked who it
    is. The token is sent only to a process confirmed to be that server
    (:func:`is_recorded_process`) that owns every socket listening on its
    port (:func:`listener_not_owned`); the pid is always the recorded one,
    never one a listener answers. Raises when a recorded pid runs and
    cannot be told from another process (no ``/proc``)."""
    ready = _read_json(state / "ready.json")
    candidates = []
    if ready.get("instance_id"):
        pid = int(ready.get("pid") or 0)
        start = record.get("pid_start") if pid == record.get("pid") else process_start(pid)
        candidates.append((ready.get("url"), ready["instance_id"], pid, start))
    if record.get("instance_id") and record.get("instance_id") != ready.get("instance_id"):
        candidates.append(
            (record.get("url"), record["instance_id"], int(record.get("pid") or 0), record.get("pid_start"))
        )
    gone = Found(None, 0, None, "no server was recorded")
    for url, instance_id, pid, start in candidates:
        if pid <= 0 or not pid_runs(pid):
            gone = Found(None, pid, None, "its process has exited")
            continue
        if not _has_proc():
            raise SqsFlightError(
                "FAILED_PRECONDITION",
                f"the managed server in {state} (pid {pid}) cannot be told from another process that reuses "
                f"its pid or its port without /proc, so it is neither sent the token nor stopped: if pid {pid} "
                f"is an sqs-flight-server, stop it yourself (kill {pid}); else remove {state / 'ready.json'}",
            )
        if not is_recorded_process(state, pid, start):
            gone = Found(None, 0, None, f"pid {pid} is now another process (not signalled)")
            continue
        not_owned = listener_not_owned(pid, str(url))
        if not_owned is not None:
            # Ours, but not what answers at its URL: no token is sent there.
            return Found(None, pid, start, f"{url} is not its own listener: {not_owned}; the token is not sent there")
        try:
            info = _server_info(str(url), record["token"], cert_pem(state, record))
        except SqsFlightError as e:
            return Found(
                None,
                pid,
                start,
                f"its server_info call (no SQS call, {LIVENESS_TIMEOUT_S:g} s at most) failed: {e.code}: {e}",
            )
        if info.get("instance_id") == instance_id:
            return Found(info, pid, start, "")
        gone = Found(None, 0, None, f"another server answers at {url} (instance {info.get('instance_id')})")
    return gone


def stop_found(state: Path, found: Found) -> None:
    """Stops the process of ``found``, checked again before each signal."""
    if found.pid > 0:
        _signal_until_gone(state, found.pid, found.start)


# -- starting --------------------------------------------------------------


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _port_free(host: str, port: int) -> bool:
    with socket.socket(_family(host)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _free_port(host: str, advertise: str) -> int:
    """A free port on ``host``, chosen here so that the server advertises
    it under the driver's address; refused, with the fix, when ``host`` is
    not an address of this host."""
    with socket.socket(_family(host)) as s:
        try:
            s.bind((host, 0))
        except OSError as e:
            raise SqsFlightError(
                "FAILED_PRECONDITION",
                f"managed mode: the server listens on the address it advertises, {host} (advertised host "
                f"{advertise}), which this host cannot listen on ({e.strerror}): set the option "
                '"advertiseHost" to an address of the driver',
            ) from None
        return int(s.getsockname()[1])


def _command(server_bin: Optional[str], state: Path, record: Dict[str, Any], bind: str, port: int) -> List[str]:
    host = record["advertise"]
    scheme = "grpc+tls" if record["tls"] else "grpc"
    shown = f"[{host}]" if ":" in host else host
    flags = {
        "--listen": f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}",
        "--advertise": f"{scheme}://{shown}:{port}",
        "--state-dir": state / "registry",
        "--idle-exit": int(record["idle_exit"]),
        "--tls-self-signed": state / "tls" if record["tls"] else None,
        "--config": state / TABLES_FILE if record["tables"] else None,
        "--sqs-endpoint": record.get("sqs_endpoint") or None,
        "--s3-endpoint": record.get("s3_endpoint") or None,
        "--state-url": record.get("state_url") or None,
    }
    try:
        return command(server_bin, flags=flags)
    except ServerError as e:
        raise SqsFlightError("FAILED_PRECONDITION", f"managed mode needs the server binary: {e}") from None


def _tables_toml(record: Dict[str, Any]) -> str:
    """The server's ``--config``: a ``[tables.NAME]`` per table, with the
    region and the IAM role a query gave for it (else the server takes the one in an Amazon
    SQS URL, else the AWS chain's), so one server reads queues of several
    regions, and its ``large_payloads`` when a query set them. JSON strings
    are TOML basic strings."""
    regions = record.get("regions") or {}
    large = record.get("large_payloads") or {}
    roles = record.get("roles") or {}
    lines = ["# Written by sqs_flight.managed from managed.json; rewritten at each start."]
    for name, url in sorted(record["tables"].items()):
        lines += ["", f"[tables.{json.dumps(name)}]", f"queue_url = {json.dumps(url)}"]
        if regions.get(name):
            lines.append(f"region = {json.dumps(regions[name])}")
        lines += _role_toml(roles.get(name) or {})
        lines += _large_payloads_toml(name, large.get(name) or {})
    return "\n".join(lines) + "\n"


def _role_toml(role: Dict[str, str]) -> List[str]:
    """The table's ``role_arn``, ``role_external_id`` and
    ``role_session_name`` (the options ``roleArn``...) that are set."""
    keys = (("arn", "role_arn"), ("external_id", "role_external_id"), ("session_name", "role_session_name"))
    return [f"{key} = {json.dumps(role[field])}" for field, key in keys if role.get(field)]


def _large_payloads_toml(table: str, settings: Dict[str, Any]) -> List[str]:
    """``[tables.NAME.large_payloads]``: ``read`` (the Spark option
    ``largePayloads``), ``bucket`` (``largePayloadBucket``: DoPut offloads
    large bodies there); nothing when neither is set."""
    if not settings.get("read") and not settings.get("bucket"):
        return []
    lines = ["", f"[tables.{json.dumps(table)}.large_payloads]", f"read = {str(bool(settings.get('read'))).lower()}"]
    if settings.get("bucket"):
        lines.append(f"bucket = {json.dumps(settings['bucket'])}")
    return lines


def _server_env(record: Dict[str, Any]) -> Dict[str, str]:
    """The driver's environment (``AWS_*``, ``RUST_LOG``, proxies...)
    without a single one of its ``SQSF_*`` variables: the server's only one
    is its token, ``SQSF_AUTH_TOKEN``; the record, not whatever this
    process carries, says what it serves."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQSF_")}
    env["SQSF_AUTH_TOKEN"] = record["token"]
    env.setdefault("RUST_LOG", "info")
    return env


def _log_tail(state: Path, start_at: int) -> str:
    """The last lines of ``server.log`` from ``start_at`` on: one start's."""
    with open(state / "server.log", "rb") as f:
        f.seek(start_at)
        return "\n".join(f.read().decode(errors="replace").splitlines()[-20:])


def start(server_bin: Optional[str], state: Path, record: Dict[str, Any], bind: str) -> Dict[str, Any]:
    """Starts the server of ``record`` (its tables, endpoint) on ``bind``,
    on its recorded port when it is free, with a new token; returns the
    record of what runs."""
    port = int(record.get("port") or 0)
    if port and not _port_free(bind, port):
        _log.warning("sqs-flight: port %d of the managed server in %s is taken; using a new one", port, state)
        port = 0
    if not port:
        port = _free_port(bind, record["advertise"])
    # The token is on disk before the server exists: a driver that dies from
    # here on leaves a server the next one can ask (ready.json) and adopt.
    record = {k: v for k, v in record.items() if k not in ("pid", "pid_start", "instance_id", "url")}
    record["port"] = port
    # A token of its own for each server: one that leaked dies with it.
    record["token"] = secrets.token_urlsafe(TOKEN_BYTES)
    _write_record(state, record)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state / "ready.json")  # a dead server's (its own was checked before)
    _write_private(state, TABLES_FILE, _tables_toml(record))
    argv = _command(server_bin, state, record, bind, port)
    log_fd = _open_private(state / "server.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(log_fd, "ab") as log:
        start_at = log.tell()
        try:
            launch = Launch(
                argv, _server_env(record), ready_file=state / "ready.json", stdout=log, stderr=log, detach=True
            )
            ready = launch.wait_ready(START_TIMEOUT_S, lambda: _log_tail(state, start_at))
        except ServerError as e:
            if e.status is None:  # it could not be run at all
                raise SqsFlightError("FAILED_PRECONDITION", f"managed mode needs the server binary: {e}") from None
            raise SqsFlightError(
                "UNAVAILABLE",
                f"the managed sqs-flight-server in {state} did not start (exit {e.status}); "
                f"its last log lines:\n{e.log_tail}",
            ) from None
    proc = launch.process
    new = dict(
        record, pid=proc.pid, pid_start=process_start(proc.pid), instance_id=ready["instance_id"], url=ready["url"]
    )
    _write_record(state, new)
    _log.info("sqs-flight: started a managed server (pid %d) on %s for %s", proc.pid, new["url"], state)
    return new
