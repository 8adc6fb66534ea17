"""Managed servers: the Spark source's driver side starts an sqs-flight server
for a queue itself, or reuses the one already running for its state
directory.

Spark starts a new Python process for a data source at each query start and
kills it at the query's stop, so a managed server is not a child of that
process: it runs in a session of its own, and the next process finds it
through files in the state directory, under an exclusive lock:

- ``managed.lock``: ``flock``-ed while a process checks, starts or restarts
  the server;
- ``managed.json`` (mode 0600): the server's pid, port, URL, bearer token,
  SQS endpoint and tables (name -> queue URL);
- ``registry/``: the server's ``--state-dir`` (a replay after a restart is
  exact); ``server.log``: its log.

One server per state directory serves every query and queue that uses it, a
table per queue URL. A queue it does not serve yet restarts it with one
table more, on the same port. A server that died (kill -9, OOM) is started
again by the next driver-side call, on the same port when it is free, so
that partitions planned before the crash still reach it. It exits by itself
after ``--idle-exit`` seconds without a call (never while a batch is held).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from .client import Client, SqsFlightError

__all__ = ["ManagedServer", "Running", "default_state_dir", "ensure_server", "server_alive", "table_name_for"]

_log = logging.getLogger("sqs_flight.managed")

#: Seconds a managed server waits without a call before it exits.
DEFAULT_IDLE_EXIT_S = 600
#: Seconds to wait for the lock, for a server to listen, and for one to stop.
LOCK_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_NAME = re.compile(r"[^A-Za-z0-9_-]+")


def default_state_dir() -> str:
    """``<tmp>/sqs-flight-<user>``: fine for trying things, a poor choice in
    production (a reboot or a tmp cleaner loses what the server holds)."""
    user = os.environ.get("USER") or str(os.getuid())
    return str(Path(tempfile.gettempdir()) / f"sqs-flight-{_NAME.sub('_', user)}")


def table_name_for(queue_url: str) -> str:
    """The table a managed server gives a queue: its name, with what table
    names cannot hold replaced (``orders.fifo`` -> ``orders_fifo``)."""
    name = queue_url.rstrip("/").rsplit("/", 1)[-1]
    name = _NAME.sub("_", name).strip("_")
    if not name:
        raise SqsFlightError("INVALID_ARGUMENT", f"queue URL {queue_url!r} names no queue")
    return name[:80]


@dataclasses.dataclass(frozen=True)
class ManagedServer:
    """What the driver side asks for: a server in ``state_dir`` that serves
    ``queue_url`` as ``table``. Plain data: it pickles with the options."""

    state_dir: str
    queue_url: str
    table: str
    sqs_endpoint: Optional[str] = None
    region: Optional[str] = None
    advertise_host: Optional[str] = None
    idle_exit: int = DEFAULT_IDLE_EXIT_S
    server_bin: Optional[str] = None


@dataclasses.dataclass
class Running:
    """A managed server found or started: where clients reach it."""

    url: str
    token: str
    pid: int


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child, not reaped) is not a server
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def server_alive(pid: int) -> bool:
    """Whether ``pid`` is (still) an sqs-flight-server, not a recycled pid
    (no RPC: a pid check)."""
    if not _alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the pid
    return b"sqs-flight-server" in cmdline


def _answers(url: str, token: str) -> bool:
    try:
        Client(url, token=token, timeout=5).status()
        return True
    except SqsFlightError:
        return False


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    with open(state / "managed.lock", "a+") as f:
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


def _read_record(state: Path) -> Dict[str, Any]:
    try:
        return json.loads((state / "managed.json").read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        _log.warning("sqs-flight: ignoring unreadable %s: %s", state / "managed.json", e)
        return {}


def _write_record(state: Path, record: Dict[str, Any]) -> None:
    tmp = state / "managed.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state / "managed.json")


def _advertise_host(spec: ManagedServer) -> str:
    """The address executors reach the driver by: the ``advertiseHost``
    option, else Databricks' ``DB_DRIVER_IP``, else loopback (a local
    master: executors on this machine)."""
    return spec.advertise_host or os.environ.get("DB_DRIVER_IP") or "127.0.0.1"


def _bind_host(advertise: str) -> str:
    return "127.0.0.1" if advertise in ("127.0.0.1", "localhost") else "0.0.0.0"


def _server_bin(spec: ManagedServer) -> str:
    from .serve import _server_bin as find  # same lookup as serve(): wheel, SQSF_SERVER_BIN

    try:
        return find(spec.server_bin)
    except Exception as e:  # ServerError
        raise SqsFlightError("FAILED_PRECONDITION", f"managed mode needs the server binary: {e}") from None


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while server_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if server_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _start(spec: ManagedServer, state: Path, record: Dict[str, Any]) -> Dict[str, Any]:
    """Starts the server of ``record`` (its tables, token, endpoint), on its
    recorded port when it is free; returns the record of what runs."""
    advertise = _advertise_host(spec)
    bind = _bind_host(advertise)
    port = int(record.get("port") or 0)
    if port and not _port_free(bind, port):
        _log.warning("sqs-flight: port %d of the managed server in %s is taken; using a new one", port, state)
        port = 0
    if not port:
        # A free port chosen here, so that the server advertises it under the
        # driver's address (a server on 0.0.0.0:0 would advertise 0.0.0.0).
        with socket.socket() as s:
            s.bind((bind, 0))
            port = s.getsockname()[1]
    argv = [
        _server_bin(spec),
        "--listen", f"{bind}:{port}",
        "--advertise", f"grpc://{advertise}:{port}",
        "--state-dir", str(state / "registry"),
        "--idle-exit", str(int(record["idle_exit"])),
    ]
    for name, url in sorted(record["tables"].items()):
        argv += ["--table", f"{name}={url}"]
    if record.get("sqs_endpoint"):
        argv += ["--sqs-endpoint", record["sqs_endpoint"]]
    env = dict(os.environ)
    env["SQSF_AUTH_TOKEN"] = record["token"]
    env.setdefault("RUST_LOG", "info")
    if record.get("region"):
        env["AWS_REGION"] = record["region"]
    for var in ("SQSF_TABLE", "SQSF_CONFIG", "SQSF_LISTEN", "SQSF_ADVERTISE", "SQSF_STATE_DIR"):
        env.pop(var, None)  # the record, not this process's environment, says what it serves
    log_path = state / "server.log"
    with open(log_path, "ab") as log:
        start_at = log.tell()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    url = None
    while url is None:
        with open(log_path, "rb") as f:
            f.seek(start_at)
            for line in f.read().decode(errors="replace").splitlines():
                if "sqs-flight-server listening on " in line:
                    url = line.split("listening on ", 1)[1].split()[0]
                    break
        if url is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                with open(log_path, "rb") as f:
                    f.seek(start_at)
                    tail = "\n".join(f.read().decode(errors="replace").splitlines()[-20:])
                raise SqsFlightError(
                    "UNAVAILABLE",
                    f"the managed sqs-flight-server in {state} did not start (exit {proc.poll()}); "
                    f"its last log lines:\n{tail}",
                )
            time.sleep(0.05)
    new = dict(record, pid=proc.pid, port=port, url=url)
    _write_record(state, new)
    _log.info("sqs-flight: started a managed server (pid %d) on %s for %s", proc.pid, url, state)
    return new


def ensure_server(spec: ManagedServer) -> Running:
    """The server of ``spec.state_dir``, serving ``spec.queue_url`` as
    ``spec.table``: the running one if it answers and serves the queue,
    else one started (again) for it."""
    state = Path(spec.state_dir).expanduser().resolve()
    state.mkdir(parents=True, exist_ok=True)
    with _locked(state):
        record = _read_record(state)
        tables: Dict[str, str] = dict(record.get("tables") or {})
        known = tables.get(spec.table)
        if known is not None and known != spec.queue_url:
            raise SqsFlightError(
                "INVALID_ARGUMENT",
                f"the managed server in {state} serves table {spec.table!r} for {known}, not "
                f"{spec.queue_url}: give this queue another name with the option \"table\"",
            )
        endpoint = record.get("sqs_endpoint")
        if record and (endpoint or None) != (spec.sqs_endpoint or None):
            raise SqsFlightError(
                "INVALID_ARGUMENT",
                f"the managed server in {state} talks to SQS at {endpoint or 'AWS'}, not "
                f"{spec.sqs_endpoint or 'AWS'}: use another stateDir for this endpoint",
            )
        pid = int(record.get("pid") or 0)
        running = pid > 0 and server_alive(pid) and _answers(record["url"], record["token"])
        if running and known is not None:
            return Running(record["url"], record["token"], pid)
        if running:
            _log.info("sqs-flight: restarting the managed server in %s to add table %r", state, spec.table)
            _stop(pid)
        elif pid:
            if server_alive(pid):
                _stop(pid)  # alive but not answering: replaced
            _log.warning("sqs-flight: the managed server in %s (pid %d) is gone; starting it again", state, pid)
        tables[spec.table] = spec.queue_url
        record = dict(
            record,
            tables=tables,
            token=record.get("token") or secrets.token_urlsafe(24),
            sqs_endpoint=spec.sqs_endpoint,
            region=spec.region or record.get("region"),
            idle_exit=spec.idle_exit,
        )
        new = _start(spec, state, record)
        return Running(new["url"], new["token"], int(new["pid"]))
