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
import subprocess
import threading
from typing import IO, Deque, Dict, Iterable, List, Mapping, Optional

from .launch import Launch, ServerError, command

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


class Server:
    """A running ``sqs-flight-server`` child process. Use :func:`serve`."""

    def __init__(self, args: List[str], env: Dict[str, str], startup_timeout: float):
        self._tail: Deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._lock = threading.Lock()
        self._stopped = False
        launch = Launch(args, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, die_with_parent=True)
        self.args, self.process = launch.argv, launch.process
        self._pumps = [
            threading.Thread(target=self._pump_log, args=(stream,), name=f"sqs-flight-server {name}", daemon=True)
            for name, stream in (("log", self.process.stderr), ("stdout", self.process.stdout))
        ]
        for pump in self._pumps:
            pump.start()
        atexit.register(self.stop)
        try:
            self.url: str = launch.wait_ready(startup_timeout, self._last_lines)["url"]
        except ServerError:
            self.stop()
            raise
        LOG.info("sqs-flight-server (pid %d) listening on %s", self.process.pid, self.url)

    def _last_lines(self) -> str:
        """The log tail of a server that did not start, once its output is read."""
        for pump in self._pumps:
            pump.join(2)
        return self.log_tail()

    def _pump_log(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = _ANSI.sub("", raw.decode(errors="replace")).rstrip()
            if line:
                self._log(line)

    def _log(self, line: str) -> None:
        with self._lock:
            self._tail.append(line)
        m = _LEVEL.search(line[:60])
        LOG.log(_LEVELS[m.group(1)] if m else logging.INFO, "%s", line)

    def log_tail(self) -> str:
        """The server's last log lines (stderr and stdout)."""
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
        for t in self._pumps:
            if t is not threading.current_thread():
                t.join(5)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running() else f"exited {self.process.returncode}"
        return f"<sqs_flight.Server {self.url or '?'} pid={self.pid} {state}>"


def serve(
    tables: Optional[Mapping[str, str]] = None,
    *,
    sqs_endpoint: Optional[str] = None,
    s3_endpoint: Optional[str] = None,
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
      environment. ``s3_endpoint``: an S3-compatible endpoint for the
      objects of tables with ``large_payloads`` (moto serves S3 and SQS on
      one port).
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
    flags = {
        "--listen": listen,
        "--sqs-endpoint": sqs_endpoint,
        "--s3-endpoint": s3_endpoint,
        "--state-dir": state_dir,
        "--advertise": advertise,
        "--config": config,
        "--consumer-lease": consumer_lease_seconds,
        "--metrics-listen": metrics_listen,
    }
    argv = command(server_bin, tables=tables, flags=flags, args=args)
    child_env = dict(os.environ if env is None else env)
    if region is not None:
        child_env["AWS_REGION"] = region
    if token is not None:
        child_env["SQSF_AUTH_TOKEN"] = token
    child_env.setdefault("RUST_LOG", "info")
    return Server(argv, child_env, startup_timeout)
