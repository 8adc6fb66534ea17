"""The driver side of the source: where a query's server is reached.

- :func:`connect`: the one place a read's driver side finds or starts its
  managed server (once per data source call and reader), and
  :func:`revive` / :class:`Watchdog`, which start it again if it dies;
- this process's clients, one per server and credentials (readers are
  pickled, clients are not: executors make their own here too);
- :func:`reconnecting`: driver calls tried again while the server cannot
  be reached;
- :func:`check_workers_python`: Spark's Python workers can import
  ``sqs_flight``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, TypeVar

from .. import managed as _managed
from ..client import Client, SqsFlightError
from .master import is_local, spark_master

if TYPE_CHECKING:
    from .options import Options

_log = logging.getLogger("sqs_flight.spark")

T = TypeVar("T")


# gRPC's words for "no server there" or "the server went away mid-call". They
# classify only an UNAVAILABLE without a reason: one the server sends itself
# (SQS unreachable after its own retries, the server shutting down) carries
# its reason (docs/protocol.md, "Error reasons") and is not retried here,
# whatever its text says. (An UNAVAILABLE the server sent after a DoGet had
# started streaming reaches pyarrow without its trailers, so without a
# reason: it is retried if its text names one of these, which is harmless,
# as every call retried is safe to repeat.)
_TRANSPORT_ERRORS = (
    "failed to connect to all addresses",
    "connection refused",
    "socket closed",
    "connection reset",
    "broken pipe",
)


_CLIENTS: Dict[Tuple[Any, ...], Client] = {}
_CLIENTS_LOCK = threading.Lock()
#: Managed servers this process found or started, by state directory.
_MANAGED: Dict[str, _managed.Running] = {}


def connect(o: Options) -> Options:
    """``o`` with the server it reads from: in managed mode the one found or
    started for it (the only place the driver side starts one), its URL,
    token and certificate; otherwise ``o`` itself. Without ``advertiseHost``,
    a local master (:mod:`~sqs_flight.spark.master`) keeps the server on
    loopback, in plaintext, unless ``SPARK_LOCAL_IP`` says otherwise."""
    spec = o.managed
    if spec is None:
        return o
    if spec.advertise_host is None:
        master = spark_master()
        host, source = _managed.advertise_address(None, master if is_local(master) else None)
        spec = dataclasses.replace(spec, advertise_host=host, advertise_from=source)
    running = _ensure(spec)
    # The managed server's own token and, off loopback, its certificate.
    return dataclasses.replace(
        o, url=running.url, token=running.token, tls_root_certs=running.tls_root_certs, managed=spec
    )


def revive(o: Options) -> None:
    """Managed mode: starts the server again if it died (no-op otherwise)."""
    if o.managed is not None:
        _ensure(o.managed)


def _ensure(spec: _managed.ManagedServer) -> _managed.Running:
    running = _managed.ensure_server(spec)
    _MANAGED[spec.state_dir] = running
    return running


def client(o: Options) -> Client:
    """This process's client for ``o``; in managed mode, for the server as
    this process last found it (started again on another port or address,
    with a new token)."""
    running = _MANAGED.get(o.managed.state_dir) if o.managed is not None else None
    if running is not None:
        return cached_client(running.url, running.token, o.timeout, o.read_timeout, running.tls_root_certs)
    return cached_client(o.url, o.token, o.timeout, o.read_timeout, o.tls_root_certs)


def current_token(o: Options) -> Optional[str]:
    """The token of ``o``'s server as this process last found it: in
    managed mode each server start makes a new one, which the partitions
    planned from then on carry to the executors."""
    running = _MANAGED.get(o.managed.state_dir) if o.managed is not None else None
    return running.token if running is not None else o.token


def cached_client(
    url: str, token: Optional[str], timeout: float, read_timeout: Optional[float], tls_root_certs: Optional[str]
) -> Client:
    """One cached client per worker process and server: readers are pickled, clients are not."""
    key = (url, token, timeout, read_timeout, tls_root_certs)
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            found = Client(url, token=token, timeout=timeout, read_timeout=read_timeout, tls_root_certs=tls_root_certs)
            _CLIENTS[key] = found
        return found


def unreachable(error: SqsFlightError) -> bool:
    """The call failed because no server answered (not because one refused):
    UNAVAILABLE, no reason from a server, and gRPC's words for a transport
    failure."""
    if error.code != "UNAVAILABLE" or error.reason is not None:
        return False
    words = str(error).lower()
    return any(t in words for t in _TRANSPORT_ERRORS)


def reconnecting(o: Options, what: str, call: Callable[[Client], T], revive_dead: bool = True) -> T:
    """``call(o.client())``, tried again with capped backoff (0.1 s doubling
    to 1 s) for up to ``o.reconnect`` seconds while the server cannot be
    reached. Only for calls that are safe to repeat: schema, status, commit,
    and plans of a given batch. In managed mode, :func:`revive` runs before
    each new try: it starts the server again if it died; an UNAUTHENTICATED
    answer is tried once more after it (another driver restarted the
    server, with a new token, to add a table). ``revive_dead=False`` (a
    stopping query): a dead server is waited for, never started again.

    The first failure is logged at once (a warning: without a logging
    setup, on the stderr of the driver's Python worker, which Spark shows),
    naming the server and how long it is tried, so that a wrong url does not
    look like a hang; the error that ends the wait says so too."""
    seconds = o.reconnect
    started = time.monotonic()
    deadline = started + seconds
    delay = 0.1
    refreshed = False
    while True:
        try:
            return call(o.client())
        except SqsFlightError as e:
            if o.managed is not None and e.code == "UNAUTHENTICATED" and not refreshed and revive_dead:
                refreshed = True
                revive(o)
                continue
            if not unreachable(e):
                raise
            if time.monotonic() + delay > deadline:
                if seconds <= 0:
                    raise
                raise SqsFlightError(
                    e.code,
                    f"{e}; tried for {time.monotonic() - started:.0f} s (option reconnectSeconds={seconds:g})",
                ) from None
            if delay == 0.1:
                _log.warning(
                    "sqs-flight: %s: %s; trying again for up to %g s (option reconnectSeconds; 0 fails at once)",
                    what,
                    e,
                    seconds,
                )
            _log.debug("sqs-flight: %s: server unreachable, trying again in %.1f s: %s", what, delay, e)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            if revive_dead:
                revive(o)


class Watchdog:
    """Managed mode, on the driver: starts the server again as soon as it
    dies, while the query runs, so that tasks reading tickets planned before
    the crash find it (on the same port) when Spark retries them."""

    PERIOD_S = 1.0

    def __init__(self, options: Options):
        self._o = options
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqs-flight-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        spec = self._o.managed
        assert spec is not None
        while not self._stop.wait(self.PERIOD_S):
            running = _MANAGED.get(spec.state_dir)
            if running is not None and _managed.process_runs(running):
                continue
            try:
                _ensure(spec)
            except Exception as e:  # the next driver call reports it
                _log.warning("sqs-flight: could not start the managed server again: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


_CHECKED_PYTHONS: Dict[str, bool] = {}


def check_workers_python() -> None:
    """Refuses, with the fix, a Spark whose Python workers cannot import
    ``sqs_flight``; warns, and lets Spark decide, when their interpreter
    cannot be run here (``PYSPARK_PYTHON=./environment/bin/python`` with
    ``--archives``, Spark's recipe for shipping an environment, names a path
    that exists on the executors only).

    Spark runs a data source in Python worker processes started with
    ``PYSPARK_PYTHON`` (default: ``python3`` on the PATH), not with the
    interpreter of the driver's script: a venv's ``.venv/bin/python job.py``
    without the venv activated gives them the system's Python, and every
    read fails there, after seconds, with ``ModuleNotFoundError: No module
    named 'sqs_flight'`` deep in a Spark error. Checked when the source is
    registered by hand, on the driver of a classic (non-Connect) session; a
    worker interpreter that is this one, or that finds the package, passes.
    Spark 4's own registration (:mod:`pyspark_sqs_flight`) runs in those
    workers: with the wrong interpreter it finds no source, and Spark says
    ``DATA_SOURCE_NOT_FOUND`` at the first plan instead (the README says
    what that means)."""
    try:
        from pyspark import SparkContext
    except ImportError:  # pragma: no cover - pyspark is imported above
        return
    sc = SparkContext._active_spark_context
    python = getattr(sc, "pythonExec", None) if sc is not None else None
    if not python:
        return
    path = shutil.which(python)
    if path is not None and os.path.abspath(path) == os.path.abspath(sys.executable):
        return
    if path is None:
        _log.warning(
            "sqs-flight: Spark's Python workers run %s, which cannot be run on the driver to check that "
            "it can import sqs_flight (an interpreter shipped with --archives is fine); if reads fail "
            "with \"No module named 'sqs_flight'\", install sqs-flight in that environment",
            python,
        )
        return
    if python not in _CHECKED_PYTHONS:
        _CHECKED_PYTHONS[python] = _finds_package(path)
    if not _CHECKED_PYTHONS[python]:
        where = f"{python} ({path})" if path and path != python else python
        raise SqsFlightError(
            "FAILED_PRECONDITION",
            f"sqs-flight: Spark's Python workers run {where}, which cannot import sqs_flight, so "
            "every read and write of format sqs-flight would fail there. Spark starts them with "
            "PYSPARK_PYTHON (default: python3 on the PATH): set "
            f"PYSPARK_PYTHON={sys.executable} (this interpreter, which has sqs_flight) before the "
            f"SparkSession is created, activate this venv, or install sqs-flight for {where}",
        )


def _finds_package(python: Optional[str]) -> bool:
    """Whether the interpreter at ``python`` can import sqs_flight; an
    interpreter that cannot be run or checked is given the benefit of the
    doubt (Spark's own error follows if it cannot either)."""
    if python is None:
        return True
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sqs_flight') else 3)"
    try:
        run = subprocess.run([python, "-c", probe], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return True
    return run.returncode != 3
