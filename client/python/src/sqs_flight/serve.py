"""Start an sqs-flight server from Python: for notebooks, DuckDB and Polars
scripts, and tests.

::

    import sqs_flight

    with sqs_flight.serve({"orders": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"}) as server:
        t = sqs_flight.read_batch(server.url, "orders", consumer="etl")

The binary comes from the ``sqs-flight-server`` wheel (``pip install
"sqs-flight[server]"``), or from ``server_bin=`` / ``$SQSF_SERVER_BIN``. The
server listens on a free loopback port unless told otherwise, its log goes to
the ``sqs_flight.server`` logger, and it stops on :meth:`Server.stop`, at the
end of a ``with`` block, or when the interpreter exits.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Deque, Dict, Iterable, List, Mapping, Optional

__all__ = ["Server", "ServerError", "serve"]

LOG = logging.getLogger("sqs_flight.server")
# A library logs; the application decides where to (logging.basicConfig()).
LOG.addHandler(logging.NullHandler())

#: Seconds :func:`serve` waits for the server to listen by default.
DEFAULT_STARTUP_TIMEOUT_S = 60.0
#: Seconds :meth:`Server.stop` waits after SIGTERM before it kills.
DEFAULT_STOP_TIMEOUT_S = 15.0
#: Log lines kept for the message of a server that failed.
LOG_TAIL_LINES = 40

_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
}
_LEVEL = re.compile(r"\b(TRACE|DEBUG|INFO|WARN|ERROR)\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ServerError(RuntimeError):
    """The server could not be started, or stopped on its own."""


def _server_bin(explicit: Optional[str]) -> str:
    if explicit:
        return explicit
    env = os.environ.get("SQSF_SERVER_BIN")
    if env:
        return env
    try:
        from sqs_flight_server import find_server_bin
    except ImportError:
        raise ServerError(
            "the sqs-flight-server binary is not installed: pip install \"sqs-flight[server]\" "
            "(or pass server_bin= / set SQSF_SERVER_BIN to a sqs-flight-server you built)"
        ) from None
    try:
        return find_server_bin()
    except FileNotFoundError as e:
        raise ServerError(str(e)) from None


class Server:
    """A running ``sqs-flight-server`` child process. Use :func:`serve`."""

    def __init__(self, args: List[str], env: Dict[str, str], startup_timeout: float):
        self.args = list(args)
        self._tail: Deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._lock = threading.Lock()
        self._stopped = False
        self.url: str = ""
        kwargs = {}
        if sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread():
            # The server dies with this process even when it is killed
            # (PR_SET_PDEATHSIG fires when the spawning *thread* exits: only
            # the main thread lives as long as the process).
            kwargs["preexec_fn"] = _die_with_parent
        try:
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                **kwargs,
            )
        except OSError as e:
            raise ServerError(f"could not run {self.args[0]}: {e}") from None
        self._stderr = threading.Thread(target=self._pump_log, name="sqs-flight-server log", daemon=True)
        self._stderr.start()
        listening = threading.Event()
        self._stdout = threading.Thread(
            target=self._read_stdout, args=(listening,), name="sqs-flight-server stdout", daemon=True
        )
        self._stdout.start()
        atexit.register(self.stop)
        deadline = time.monotonic() + startup_timeout
        while not listening.wait(0.05):
            if self.process.poll() is not None:
                self._stdout.join(1)
                if self.url:
                    break
                self._stderr.join(2)
                self._forget()
                raise ServerError(
                    f"sqs-flight-server exited with status {self.process.returncode} before listening; "
                    f"its last log lines:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"sqs-flight-server did not listen within {startup_timeout:g} s; "
                    f"its last log lines:\n{self.log_tail()}"
                )
        LOG.info("sqs-flight-server (pid %d) listening on %s", self.process.pid, self.url)

    def _read_stdout(self, listening: threading.Event) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").strip()
            # The first line: "sqs-flight-server listening on grpc://HOST:PORT".
            if not self.url and "listening on " in line:
                self.url = line.split("listening on ", 1)[1].split()[0]
                listening.set()
            elif line:
                self._log(line)

    def _pump_log(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            line = _ANSI.sub("", raw.decode(errors="replace")).rstrip()
            if line:
                self._log(line)

    def _log(self, line: str) -> None:
        with self._lock:
            self._tail.append(line)
        m = _LEVEL.search(line[:60])
        LOG.log(_LEVELS[m.group(1)] if m else logging.INFO, "%s", line)

    def log_tail(self) -> str:
        """The server's last log lines (stderr, and stdout past the first line)."""
        with self._lock:
            return "\n".join(self._tail) or "(no output)"

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        """Whether the process is still running."""
        return self.process.poll() is None

    def check(self) -> None:
        """Raises :class:`ServerError` if the server has stopped on its own."""
        if self.process.poll() is not None and not self._stopped:
            raise ServerError(
                f"sqs-flight-server (pid {self.pid}) exited with status {self.process.returncode}; "
                f"its last log lines:\n{self.log_tail()}"
            )

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> Optional[int]:
        """Stops the server (SIGTERM: open streams get its grace period; then
        SIGKILL after ``timeout`` seconds) and returns its exit status.
        Stopping twice is harmless."""
        with self._lock:
            first = not self._stopped
            self._stopped = True
        if first and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                LOG.warning("sqs-flight-server (pid %d) ignored SIGTERM for %g s: killing it", self.pid, timeout)
                self.process.kill()
                self.process.wait()
        self._forget()
        return self.process.returncode

    def _forget(self) -> None:
        atexit.unregister(self.stop)
        for t in (self._stdout, self._stderr):
            if t is not threading.current_thread():
                t.join(5)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running() else f"exited {self.process.returncode}"
        return f"<sqs_flight.Server {self.url or '?'} pid={self.pid} {state}>"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def serve(
    tables: Optional[Mapping[str, str]] = None,
    *,
    sqs_endpoint: Optional[str] = None,
    region: Optional[str] = None,
    state_dir: Optional[str] = None,
    listen: str = "127.0.0.1:0",
    advertise: Optional[str] = None,
    token: Optional[str] = None,
    config: Optional[str] = None,
    consumer_lease_seconds: Optional[int] = None,
    metrics_listen: Optional[str] = None,
    args: Iterable[str] = (),
    server_bin: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
) -> Server:
    """Starts ``sqs-flight-server`` and returns once it listens.

    - ``tables``: table name -> SQS queue URL. None (and no ``config``): the
      server's embedded ``demo`` table.
    - ``sqs_endpoint``: an SQS-compatible endpoint (LocalStack, moto,
      rustack, ElasticMQ) instead of AWS's. ``region``: ``AWS_REGION`` of the
      server; credentials come from the standard AWS chain of this process's
      environment.
    - ``state_dir``: the server's ``--state-dir``: a replay after a restart
      is exact.
    - ``listen``: default a free loopback port; ``advertise``: the location
      put into endpoints when clients reach the server by another address.
    - ``token``: every RPC must carry it (passed in the environment, never
      on the command line).
    - ``config``: a TOML file with per-table options; ``args``: any other
      server flags, as on its command line.

    Raises :class:`ServerError` with the server's last log lines if it exits
    before it listens. The returned :class:`Server` has ``.url``.
    """
    argv = [_server_bin(server_bin), "--listen", listen]
    for name, url in (tables or {}).items():
        if "=" in name:
            raise ValueError(f"table name {name!r} contains '=': table names are letters, digits, '_' and '-'")
        argv += ["--table", f"{name}={url}"]
    optional = {
        "--sqs-endpoint": sqs_endpoint,
        "--state-dir": state_dir,
        "--advertise": advertise,
        "--config": config,
        "--consumer-lease": consumer_lease_seconds,
        "--metrics-listen": metrics_listen,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    argv += [str(a) for a in args]
    child_env = dict(os.environ if env is None else env)
    if region is not None:
        child_env["AWS_REGION"] = region
    if token is not None:
        child_env["SQSF_AUTH_TOKEN"] = token
    child_env.setdefault("RUST_LOG", "info")
    return Server(argv, child_env, startup_timeout)
