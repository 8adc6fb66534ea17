"""Starting ``sqs-flight-server``: the one launcher behind :func:`sqs_flight.serve`,
managed mode (:mod:`sqs_flight.managed`), the tests and the benchmarks.

:func:`command` builds the command line; :class:`Launch` starts the process
with ``--ready-file`` and learns where it listens from that file alone. The
server writes it atomically once it listens (JSON: ``url``, ``pid``,
``instance_id``, ``started_at``, ``listen``), so nothing parses its output.
A process that exits first, or is not ready in time, fails with its last
log lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

__all__ = ["Launch", "ServerError", "command", "server_bin"]

#: Seconds between two looks for the ready file.
POLL_S = 0.05

Output = Union[int, IO[Any], None]


class ServerError(RuntimeError):
    """The server could not be started, or stopped on its own."""

    def __init__(self, message: str, status: Optional[int] = None, log_tail: str = ""):
        super().__init__(message)
        #: The exit status of a server that did not start (None: unknown).
        self.status = status
        #: Its last log lines.
        self.log_tail = log_tail


def server_bin(explicit: Optional[str] = None) -> str:
    """The ``sqs-flight-server`` to run: ``explicit``, else
    ``$SQSF_SERVER_BIN``, else the one of the ``sqs-flight-server`` wheel."""
    if explicit:
        return explicit
    env = os.environ.get("SQSF_SERVER_BIN")
    if env:
        return env
    try:
        from sqs_flight_server import find_server_bin
    except ImportError:
        raise ServerError(
            'the sqs-flight-server binary is not installed: pip install "sqs-flight[server]" '
            "(or pass server_bin= / set SQSF_SERVER_BIN to a sqs-flight-server you built)"
        ) from None
    try:
        return find_server_bin()
    except FileNotFoundError as e:
        raise ServerError(str(e)) from None


def command(
    binary: Optional[str] = None,
    *,
    tables: Optional[Mapping[str, str]] = None,
    flags: Optional[Mapping[str, object]] = None,
    args: Iterable[object] = (),
) -> List[str]:
    """The server's command line: the binary (see :func:`server_bin`), each
    of ``flags`` whose value is not None, a ``--table NAME=URL`` per table,
    then ``args`` as they are."""
    argv = [server_bin(binary)]
    for flag, value in (flags or {}).items():
        if value is not None:
            argv += [flag, str(value)]
    for name, url in (tables or {}).items():
        if "=" in name:
            raise ValueError(f"table name {name!r} contains '=': table names are letters, digits, '_' and '-'")
        argv += ["--table", f"{name}={url}"]
    return argv + [str(a) for a in args]


class Launch:
    """One ``sqs-flight-server`` process being started: the constructor
    spawns it, :meth:`wait_ready` returns its ready file once it listens.

    - ``ready_file``: where the server writes it; None: a private
      temporary file, removed once read.
    - ``stdout``, ``stderr``: as for :class:`subprocess.Popen`.
    - ``detach``: the server runs in a session of its own and outlives this
      process (managed mode).
    - ``die_with_parent``: on Linux, the server gets SIGTERM when this
      process dies (:func:`sqs_flight.serve`).
    """

    def __init__(
        self,
        argv: List[str],
        env: Mapping[str, str],
        *,
        ready_file: Optional[Path] = None,
        stdout: Output = subprocess.DEVNULL,
        stderr: Output = subprocess.DEVNULL,
        detach: bool = False,
        die_with_parent: bool = False,
    ):
        self._temp: Optional[Path] = None
        if ready_file is None:
            self._temp = Path(tempfile.mkdtemp(prefix="sqs-flight-ready-"))
            ready_file = self._temp / "ready.json"
        self.ready_file = ready_file
        self.argv = [*argv, "--ready-file", str(self.ready_file)]
        kwargs: Dict[str, Any] = {"start_new_session": detach}
        if die_with_parent:
            kwargs.update(_dying_with_parent())
        try:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=dict(env), **kwargs
            )
        except OSError as e:
            self._remove_temp()
            raise ServerError(f"could not run {self.argv[0]}: {e}") from None

    def wait_ready(self, timeout: float, log_tail: Callable[[], str]) -> Dict[str, Any]:
        """The ready file the server wrote, once it listens. Raises
        :class:`ServerError` with ``log_tail()`` if it exits first or is not
        ready within ``timeout`` seconds (then it is killed)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                ready = self._ready()
                if ready.get("pid") == self.process.pid and ready.get("url"):
                    return ready
                status = self.process.poll()
                if status is not None:
                    tail = log_tail()
                    raise ServerError(
                        f"sqs-flight-server exited with status {status} before listening; its last log lines:\n{tail}",
                        status,
                        tail,
                    )
                if time.monotonic() > deadline:
                    self.process.kill()
                    self.process.wait()
                    tail = log_tail()
                    raise ServerError(
                        f"sqs-flight-server did not listen within {timeout:g} s; its last log lines:\n{tail}",
                        self.process.returncode,
                        tail,
                    )
                time.sleep(POLL_S)
        finally:
            self._remove_temp()

    def _ready(self) -> Dict[str, Any]:
        try:
            value = json.loads(self.ready_file.read_bytes())
        except (OSError, ValueError):  # not written yet (it is renamed into place whole)
            return {}
        return value if isinstance(value, dict) else {}

    def _remove_temp(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None


def _dying_with_parent() -> Dict[str, Any]:
    """Popen arguments that make the server die with this process, on Linux
    and from the main thread: PR_SET_PDEATHSIG fires when the spawning
    *thread* exits, and only the main thread lives as long as the process."""
    if sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread():
        return {"preexec_fn": _die_with_parent}
    return {}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
