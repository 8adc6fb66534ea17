"""The processes of managed servers (see :mod:`sqs_flight.managed`): which
one runs for a state directory, asked with ``server_info`` and, when it does
not answer, told by ``/proc``; stopping one only when it is confirmed to be
the recorded one; and starting one with the record's tables, token and port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

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


def is_recorded_process(state: Path, pid: int, start: Optional[str]) -> bool:
    """Whether ``pid`` is still the recorded server's process: it runs with
    the recorded start time, and its command line is an sqs-flight-server of
    this state directory. Needs ``/proc``; without it nothing is confirmed."""
    if pid <= 0 or not start or not pid_runs(pid) or process_start(pid) != start:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"sqs-flight-server" in cmdline and str(state / "registry").encode() in cmdline


def _signal_until_gone(pid: int, start: Optional[str]) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`, to a process
    confirmed to be ours (the start time is checked again before SIGKILL)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while pid_runs(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_runs(pid) and (start is None or process_start(pid) == start):
        os.kill(pid, signal.SIGKILL)


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
    is. Raises when one does not answer and cannot be told from another
    process that reuses its pid (no ``/proc``)."""
    ready = _read_json(state / "ready.json")
    candidates = []
    if ready.get("instance_id"):
        pid = int(ready.get("pid") or 0)
        start = record.get("pid_start") if pid == record.get("pid") else process_start(pid)
        candidates.append((ready.get("url"), ready["instance_id"], pid, start))
    if record.get("instance_id") and record.get("instance_id") != ready.get("instance_id"):
        candidates.append((record.get("url"), record["instance_id"], int(record.get("pid") or 0), record.get("pid_start")))
    gone = Found(None, 0, None, "no server was recorded")
    for url, instance_id, pid, start in candidates:
        try:
            info = _server_info(str(url), record["token"], cert_pem(state, record))
        except SqsFlightError as e:
            if not pid_runs(pid):
                gone = Found(None, pid, None, "its process has exited")
                continue
            why = f"its server_info call (no SQS call, {LIVENESS_TIMEOUT_S:g} s at most) failed: {e.code}: {e}"
            if is_recorded_process(state, pid, start):
                return Found(None, pid, start, why)
            if not _has_proc():
                raise SqsFlightError(
                    "FAILED_PRECONDITION",
                    f"the managed server in {state} (pid {pid}) does not answer and, without /proc, cannot be "
                    f"told from another process that reuses its pid, so it is not stopped: if pid {pid} is an "
                    f"sqs-flight-server, stop it yourself (kill {pid}); else remove {state / 'ready.json'}",
                ) from None
            gone = Found(None, 0, None, f"pid {pid} is now another process (not signalled)")
            continue
        if info.get("instance_id") == instance_id:
            pid = int(info.get("pid") or pid)
            return Found(info, pid, start if start else process_start(pid), "")
        gone = Found(None, 0, None, f"another server answers at {url} (instance {info.get('instance_id')})")
    return gone


def stop_found(state: Path, found: Found) -> None:
    if found.pid > 0 and (found.info is not None or is_recorded_process(state, found.pid, found.start)):
        _signal_until_gone(found.pid, found.start)


# -- starting --------------------------------------------------------------


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


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
    }
    try:
        return command(server_bin, flags=flags)
    except ServerError as e:
        raise SqsFlightError("FAILED_PRECONDITION", f"managed mode needs the server binary: {e}") from None


def _tables_toml(record: Dict[str, Any]) -> str:
    """The server's ``--config``: a ``[tables.NAME]`` per table, with the
    region a query gave for it (else the server takes the one in an Amazon
    SQS URL, else the AWS chain's), so one server reads queues of several
    regions. JSON strings are TOML basic strings."""
    regions = record.get("regions") or {}
    lines = ["# Written by sqs_flight.managed from managed.json; rewritten at each start."]
    for name, url in sorted(record["tables"].items()):
        lines += ["", f"[tables.{json.dumps(name)}]", f"queue_url = {json.dumps(url)}"]
        if regions.get(name):
            lines.append(f"region = {json.dumps(regions[name])}")
    return "\n".join(lines) + "\n"


def _server_env(record: Dict[str, Any]) -> Dict[str, str]:
    env = dict(os.environ)
    env["SQSF_AUTH_TOKEN"] = record["token"]
    env.setdefault("RUST_LOG", "info")
    for var in ("SQSF_TABLE", "SQSF_CONFIG", "SQSF_LISTEN", "SQSF_ADVERTISE", "SQSF_STATE_DIR",
                "SQSF_READY_FILE", "SQSF_TLS_CERT", "SQSF_TLS_KEY", "SQSF_TLS_SELF_SIGNED", "SQSF_AUTH_TOKEN_FILE"):
        env.pop(var, None)  # the record, not this process's environment, says what it serves
    return env


def _log_tail(state: Path, start_at: int) -> str:
    """The last lines of ``server.log`` from ``start_at`` on: one start's."""
    with open(state / "server.log", "rb") as f:
        f.seek(start_at)
        return "\n".join(f.read().decode(errors="replace").splitlines()[-20:])


def start(server_bin: Optional[str], state: Path, record: Dict[str, Any], bind: str) -> Dict[str, Any]:
    """Starts the server of ``record`` (its tables, token, endpoint) on
    ``bind``, on its recorded port when it is free; returns the record of
    what runs."""
    port = int(record.get("port") or 0)
    if port and not _port_free(bind, port):
        _log.warning("sqs-flight: port %d of the managed server in %s is taken; using a new one", port, state)
        port = 0
    if not port:
        # A free port chosen here, so that the server advertises it under the
        # driver's address (a server on 0.0.0.0:0 would advertise 0.0.0.0).
        with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as s:
            s.bind((bind, 0))
            port = s.getsockname()[1]
    # The token is on disk before the server exists: a driver that dies from
    # here on leaves a server the next one can ask (ready.json) and adopt.
    record = {k: v for k, v in record.items() if k not in ("pid", "pid_start", "instance_id", "url")}
    record["port"] = port
    _write_record(state, record)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state / "ready.json")  # a dead server's (its own was checked before)
    _write_private(state, TABLES_FILE, _tables_toml(record))
    argv = _command(server_bin, state, record, bind, port)
    log_fd = _open_private(state / "server.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(log_fd, "ab") as log:
        start_at = log.tell()
        try:
            launch = Launch(argv, _server_env(record), ready_file=state / "ready.json", stdout=log, stderr=log,
                            detach=True)
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
    new = dict(record, pid=proc.pid, pid_start=process_start(proc.pid), instance_id=ready["instance_id"],
               url=ready["url"])
    _write_record(state, new)
    _log.info("sqs-flight: started a managed server (pid %d) on %s for %s", proc.pid, new["url"], state)
    return new
