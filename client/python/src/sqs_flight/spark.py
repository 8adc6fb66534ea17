"""A PySpark data source (format ``sqs-flight``) that reads SQS through an
sqs-flight server, for Structured Streaming, Spark Declarative Pipelines /
Databricks DLT, and one-off batch reads.

    from sqs_flight.spark import SqsFlightDataSource
    spark.dataSource.register(SqsFlightDataSource)
    df = (spark.readStream.format("sqs-flight")
          .option("url", "grpc://127.0.0.1:50051").option("table", "orders")
          .load())

# How a micro-batch maps to the server

* Offsets are ``{"batch": n}``: a micro-batch ending at ``n`` reads the
  server batch ``n`` of the query's consumer. ``initialOffset`` is the
  consumer's committed batch (``status``), or 0.
* ``latestOffset(start)`` returns ``start + 1`` only when the table has
  visible messages (no empty micro-batches), after planning that batch with
  the limits that ``ReadMaxRows`` allows (so a restart replays the same plan).
* ``partitions(start, end)`` is GetFlightInfo for batch ``end``: one
  partition per endpoint, holding the ticket bytes and location strings. A
  batch the server has released meanwhile (consumer lease, restart) replays
  empty: its messages are back in the queue for later batches.
* ``read(partition)`` runs on an executor and DoGets the ticket. A ticket is
  a repeatable read, so task retries and every action of a ``foreachBatch``
  DataFrame see the same rows. No receipt handle ever reaches Spark.
* ``commit(end)`` runs on the driver and sends DoAction ``commit``.
* While the server cannot be reached (a restart on its ``--state-dir``),
  the driver's status, plan and commit calls try again for up to
  ``reconnectSeconds`` (default 10; they are all safe to repeat) before the
  query fails. A read cut by a restart fails its task, and Spark's task
  retry replays the ticket.

Spark calls ``commit(end_N)`` only when it plans batch N+1, never for the last
batch of a run; but it calls ``latestOffset(start=X)`` only once the batch
ending at X is in the checkpoint's commit log. So ``latestOffset`` also
commits ``start``: that is what deletes the last batch of an AvailableNow
run. Commit is idempotent, so doing it twice is harmless.

Commits run in the background, one at a time and in order, on a thread of
the driver's Python process: the deletes of batch N overlap the planning and
reading of batch N+1 instead of holding up the next trigger. A commit is
only ever asked for a batch already in Spark's commit log, so running it
later never deletes early. A commit that fails is raised by the reader's
next call (the query fails one trigger later than it would have). When
``latestOffset`` finds no new batch it waits for the commits asked so far,
so a run that ends there (AvailableNow, an idle stream) leaves nothing in
flight. A query stopped, or a driver that dies, while a commit runs leaves
that batch in flight, as a stop leaves the last batch of a run: the
restarted query commits it from ``latestOffset(start)``, as long as it
comes back within the server's consumer lease.

Each streaming query needs its own ``consumer`` (default ``spark-<table>``):
two queries sharing one would commit each other's batches.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import itertools
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import pyarrow as pa
import pyarrow.compute as pc

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.types import (
        ByteType,
        DataType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructType,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sqs_flight.spark needs pyspark >= 4.0 (the Python DataSource API): "
        "pip install 'sqs-flight[spark]'"
    ) from e

from . import managed as _managed
from . import writing
from .client import Client, Endpoint, SqsFlightError, check_url, read_pem, read_token_file

try:  # pyspark >= 4.1: the stream writer gets Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    _STREAM_WRITER_BASE: type = DataSourceStreamArrowWriter
except ImportError:  # pyspark 4.0: rows, turned into Arrow here
    DataSourceStreamArrowWriter = None  # type: ignore[assignment,misc]
    _STREAM_WRITER_BASE = DataSourceStreamWriter

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    _STREAM_BASES: Tuple[type, ...] = (DataSourceStreamReader, SupportsTriggerAvailableNow)
except ImportError:  # pyspark 4.0 / 4.1: latestOffset() takes no argument
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    _STREAM_BASES = (DataSourceStreamReader,)

__all__ = [
    "SqsFlightDataSource",
    "SqsFlightStreamReader",
    "SqsFlightBatchReader",
    "SqsFlightBatchWriter",
    "SqsFlightStreamWriter",
    "FlightPartition",
    "SentMessage",
]

_log = logging.getLogger("sqs_flight.spark")

#: Partitions used with ``maxRowsPerBatch`` when the ``partitions`` option is unset.
DEFAULT_PARTITIONS = 2

#: Seconds the stream reader's driver calls (status, plan, commit) keep trying
#: while the server cannot be reached, e.g. while it restarts on its
#: ``--state-dir``: option ``reconnectSeconds`` (0: fail at once).
DEFAULT_RECONNECT_S = 10

# gRPC's words for "no server there" or "the server went away mid-call". An
# UNAVAILABLE the server sends itself (SQS unreachable after the server's own
# retries) is not retried here, unless its text happens to name one of these:
# harmless, as every call retried is safe to repeat.
_TRANSPORT_ERRORS = (
    "failed to connect to all addresses",
    "connection refused",
    "socket closed",
    "connection reset",
    "broken pipe",
)

# option name -> plan field (the Flight surface's plan command), each a positive integer.
_LIMIT_OPTIONS = {
    "partitions": "partitions",
    "maxMessagesPerPartition": "max_messages",
    "maxWaitMs": "max_wait_ms",
    "maxBytesPerPartition": "max_bytes",
    "maxDurationMs": "max_duration_ms",
    "receiversPerPartition": "receivers",
}


#: Options of managed mode: ``queueUrl`` instead of ``url`` starts (or
#: reuses) a server on the driver (sqs_flight.managed).
MANAGED_OPTIONS = (
    "queueUrl", "stateDir", "advertiseHost", "serverIdleExitSeconds", "sqsEndpoint", "region", "serverTls",
)

#: Every option of the source (reads) and of the sink (writes).
READ_OPTIONS = (
    "url", "table", "consumer", *_LIMIT_OPTIONS, "maxRowsPerBatch", "token", "tokenFile",
    "timeoutSeconds", "readTimeoutSeconds", "reconnectSeconds", "tlsRootCerts", "commit",
    *MANAGED_OPTIONS,
)
WRITE_OPTIONS = ("url", "table", "token", "tokenFile", "timeoutSeconds", "tlsRootCerts", "batchRows")

# Options Spark itself may hand a data source (`load(path)`, `save(path)`,
# a streaming sink's checkpoint).
_SPARK_OPTIONS = ("path", "checkpointLocation")


def _bad_option(message: str) -> SqsFlightError:
    return SqsFlightError("INVALID_ARGUMENT", f"sqs-flight source: {message}")


def check_option_names(options: Mapping[str, str], known: Tuple[str, ...], bad: Any) -> None:
    """Refuses an option the source or sink does not know, naming the
    closest known one, as Spark's own sources do: a misspelled limit would
    otherwise be ignored and the default used in silence. Spark hands the
    names lowercased, so they are compared without case."""
    names = {k.lower(): k for k in known}
    allowed = set(names) | {k.lower() for k in _SPARK_OPTIONS}
    for key in sorted(str(k) for k in options.keys()):
        if key.lower() in allowed:
            continue
        close = difflib.get_close_matches(key.lower(), list(names), n=1, cutoff=0.6)
        suggestion = f'did you mean "{names[close[0]]}"? ' if close else ""
        raise bad(f'unknown option "{key}": {suggestion}The options are: {", ".join(known)}')


def _int_option(options: Mapping[str, str], name: str, minimum: int, phrase: str) -> Optional[int]:
    """Option ``name`` as an integer of at least ``minimum`` (None if unset);
    anything else is refused as not being ``phrase``."""
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise _bad_option(f"option {name!r} must be {phrase}, got {raw!r}") from None
    if value < minimum:
        raise _bad_option(f"option {name!r} must be {phrase}, got {value}")
    return value


def _positive_int(options: Mapping[str, str], name: str) -> Optional[int]:
    return _int_option(options, name, 1, "a positive integer")


def _credentials(options: Mapping[str, str], bad: Any) -> Tuple[Optional[str], Optional[str]]:
    """``(token, tls_root_certs PEM text)`` from the ``token`` or
    ``tokenFile`` and ``tlsRootCerts`` options. The files are read here, on
    the driver, so that executors need neither file: the token and the PEM
    travel in the pickled options, like ``token`` always did."""
    token, token_file = options.get("token") or None, options.get("tokenFile") or None
    if token and token_file:
        raise bad('options "token" and "tokenFile" exclude each other: set one')
    try:
        if token_file:
            token = read_token_file(str(token_file))
        pem = read_pem(options.get("tlsRootCerts") or None)
    except SqsFlightError as e:
        which = "tokenFile" if token_file and "token file" in str(e) else "tlsRootCerts"
        raise bad(f'option "{which}": {e}') from None
    return token, pem.decode() if pem else None


def _url_option(url: Any, bad: Any) -> str:
    """The ``url`` option, by the URL rule of the whole project (check_url)."""
    try:
        return check_url(str(url))
    except SqsFlightError as e:
        raise bad(f'option "url": {e}') from None


def _seconds(options: Mapping[str, str], name: str, default: float) -> float:
    value = _int_option(options, name, 0, "a whole number of seconds >= 0")
    return default if value is None else float(value)


def _unreachable(error: SqsFlightError) -> bool:
    """The call failed because no server answered (not because one refused)."""
    return error.code == "UNAVAILABLE" and any(t in str(error).lower() for t in _TRANSPORT_ERRORS)


def _reconnecting(seconds: float, what: str, call: Any, revive: Any = None) -> Any:
    """``call()``, tried again with capped backoff (0.1 s doubling to 1 s)
    for up to ``seconds`` while the server cannot be reached. Only for calls
    that are safe to repeat: schema, status, commit, and plans of a given batch.
    ``revive()`` (managed mode) runs before each new try: it starts the
    server again if it died.

    The first failure is logged at once (a warning: without a logging
    setup, on the stderr of the driver's Python worker, which Spark shows),
    naming the server and how long it is tried, so that a wrong url does not
    look like a hang; the error that ends the wait says so too."""
    started = time.monotonic()
    deadline = started + seconds
    delay = 0.1
    while True:
        try:
            return call()
        except SqsFlightError as e:
            if not _unreachable(e):
                raise
            if time.monotonic() + delay > deadline:
                if seconds <= 0:
                    raise
                raise SqsFlightError(
                    e.code, f"{e}; tried for {time.monotonic() - started:.0f} s "
                    f"(option reconnectSeconds={seconds:g})",
                ) from None
            if delay == 0.1:
                _log.warning(
                    "sqs-flight: %s: %s; trying again for up to %g s (option reconnectSeconds; "
                    "0 fails at once)", what, e, seconds,
                )
            _log.debug("sqs-flight: %s: server unreachable, trying again in %.1f s: %s", what, delay, e)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            if revive is not None:
                revive()


def _flag(options: Mapping[str, str], name: str) -> bool:
    raw = str(options.get(name, "false")).strip().lower()
    if raw not in ("true", "false"):
        raise _bad_option(f"option {name!r} must be true or false, got {options.get(name)!r}")
    return raw == "true"


@dataclass(frozen=True)
class Options:
    """The validated options of one query; plain data, so it pickles."""

    url: str
    table: str
    consumer: str
    limits: Tuple[Tuple[str, int], ...]
    max_rows_per_batch: Optional[int]
    token: Optional[str]
    timeout: float
    read_timeout: Optional[float]
    tls_root_certs: Optional[str]
    commit: bool
    reconnect: float = DEFAULT_RECONNECT_S
    #: Managed mode: the server this query's driver side runs (or reuses).
    managed: Optional[_managed.ManagedServer] = None

    @classmethod
    def parse(cls, options: Mapping[str, str], default_consumer: str, extra: Tuple[str, ...] = ()) -> "Options":
        """``extra``: options a subclass of the source reads itself."""
        check_option_names(options, READ_OPTIONS + tuple(extra), _bad_option)
        spec = _managed_spec(options)
        url, table = options.get("url"), options.get("table")
        if spec is not None:
            running = _ensure(spec)
            url, table = running.url, spec.table
        else:
            for name in MANAGED_OPTIONS[1:]:
                if options.get(name):
                    raise _bad_option(f'option "{name}" is for managed mode: set "queueUrl" with it, or drop it')
        if not url:
            raise _bad_option(
                'option "url" is missing: set it to the server, e.g. grpc://127.0.0.1:50051, or set '
                '"queueUrl" to an SQS queue URL and the source runs a server on the driver'
            )
        if not table:
            raise _bad_option('option "table" is missing: set it to a table the server serves')
        limits = tuple(
            (field, value)
            for name, field in _LIMIT_OPTIONS.items()
            if (value := _positive_int(options, name)) is not None
        )
        read_timeout = _positive_int(options, "readTimeoutSeconds")
        token, tls_root_certs = _credentials(options, _bad_option)
        if spec is not None:
            # The managed server's own token and, off loopback, its certificate.
            token, tls_root_certs = running.token, running.tls_root_certs
        return cls(
            url=_url_option(url, _bad_option),
            table=str(table),
            consumer=str(options.get("consumer") or default_consumer.format(table=table)),
            limits=limits,
            max_rows_per_batch=_positive_int(options, "maxRowsPerBatch"),
            token=token,
            timeout=float(_positive_int(options, "timeoutSeconds") or 30),
            read_timeout=float(read_timeout) if read_timeout else None,
            tls_root_certs=tls_root_certs,
            commit=_flag(options, "commit"),
            reconnect=_seconds(options, "reconnectSeconds", DEFAULT_RECONNECT_S),
            managed=spec,
        )

    def client(self) -> Client:
        """This process's client for these options, created on first use."""
        if self.managed is not None:
            running = _MANAGED.get(self.managed.state_dir)
            if running is not None and (running.url, running.tls_root_certs) != (self.url, self.tls_root_certs):
                # Started again on another port (its own was taken) or address.
                return _client(dataclasses.replace(self, url=running.url, tls_root_certs=running.tls_root_certs))
        return _client(self)

    def revive(self) -> None:
        """Managed mode: starts the server again if it died (no-op otherwise)."""
        if self.managed is not None:
            _ensure(self.managed)

    def plan_limits(self) -> Dict[str, int]:
        return dict(self.limits)


_CLIENTS: Dict[Tuple[Any, ...], Client] = {}
_CLIENTS_LOCK = threading.Lock()
#: Managed servers this process found or started, by state directory.
_MANAGED: Dict[str, _managed.Running] = {}


def _managed_spec(options: Mapping[str, str]) -> Optional[_managed.ManagedServer]:
    """The managed server ``queueUrl`` asks for (None without it)."""
    queue_url = options.get("queueUrl")
    if not queue_url:
        return None
    for clash in ("url", "token", "tokenFile", "tlsRootCerts"):
        if options.get(clash):
            raise _bad_option(
                f'options "queueUrl" and "{clash}" exclude each other: "queueUrl" runs a server on the '
                f'driver (with a token of its own); "url" reaches a server you run'
            )
    queue_url = str(queue_url)
    if not queue_url.startswith(("https://", "http://")):
        raise _bad_option(f'option "queueUrl" must be an SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME), got {queue_url!r}')
    try:
        table = str(options.get("table") or _managed.table_name_for(queue_url))
    except SqsFlightError as e:
        raise _bad_option(f'option "queueUrl": {e}') from None
    idle = _int_option(options, "serverIdleExitSeconds", 1, "a positive whole number of seconds")
    tls = None if options.get("serverTls") in (None, "") else _flag(options, "serverTls")
    host, source = _managed.advertise_address(options.get("advertiseHost") or None)
    return _managed.ManagedServer(
        state_dir=str(options.get("stateDir") or _managed.default_state_dir()),
        queue_url=queue_url,
        table=table,
        sqs_endpoint=options.get("sqsEndpoint") or None,
        region=options.get("region") or None,
        advertise_host=host,
        idle_exit=idle or _managed.DEFAULT_IDLE_EXIT_S,
        tls=tls,
        advertise_from=source,
    )


def _ensure(spec: _managed.ManagedServer) -> _managed.Running:
    running = _managed.ensure_server(spec)
    _MANAGED[spec.state_dir] = running
    return running


def _client(o: Options) -> Client:
    """One cached client per worker process: readers are pickled, clients are not."""
    key = (o.url, o.token, o.timeout, o.read_timeout, o.tls_root_certs)
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            found = Client(
                o.url, token=o.token, timeout=o.timeout, read_timeout=o.read_timeout,
                tls_root_certs=o.tls_root_certs,
            )
            _CLIENTS[key] = found
        return found


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
    registered, on the driver of a classic (non-Connect) session; a worker
    interpreter that is this one, or that finds the package, passes."""
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
            "with \"No module named 'sqs_flight'\", install sqs-flight in that environment", python,
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


def spark_type(arrow: pa.DataType) -> DataType:
    """The Spark type of an Arrow type of a table, payload types included.

    Spark has no unsigned integers: uint8, uint16 and uint32 widen to the
    next signed type and uint64 becomes decimal(20, 0). Timestamps become
    ``timestamp`` (with a time zone) or ``timestamp_ntz`` (without), in
    microseconds: nanoseconds are truncated. Nested structs, lists and maps
    are mapped field by field.
    """
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import ArrayType, DecimalType, StructField

    if pa.types.is_struct(arrow):
        return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in arrow])
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return ArrayType(spark_type(arrow.value_type), arrow.value_field.nullable)
    if pa.types.is_map(arrow):
        return MapType(spark_type(arrow.key_type), spark_type(arrow.item_type), arrow.item_field.nullable)
    unsigned = {
        pa.uint8(): ShortType(),
        pa.uint16(): IntegerType(),
        pa.uint32(): LongType(),
        pa.uint64(): DecimalType(20, 0),
    }
    if arrow in unsigned:
        return unsigned[arrow]
    return from_arrow_type(arrow)


def spark_schema(arrow: pa.Schema) -> StructType:
    """The Spark schema of a table's Arrow schema (see :func:`spark_type`)."""
    from pyspark.sql.types import StructField

    return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in arrow])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects back from ``read`` (us timestamps, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # pyspark 4.0 has no timezone argument (and uses UTC)
        return to_arrow_schema(schema)


#: Rows and bytes handed to Spark per Arrow batch. The server streams each
#: receive of ten as soon as it has it; Spark and the cast to its schema pay
#: per batch, so a task joins them before handing them over.
SPARK_BATCH_ROWS = 8192
SPARK_BATCH_BYTES = 16 << 20


def rebatch(
    batches: Iterator[pa.RecordBatch], rows: int = SPARK_BATCH_ROWS, nbytes: int = SPARK_BATCH_BYTES
) -> Iterator[pa.RecordBatch]:
    """``batches`` joined, in order, into batches of at least ``rows`` rows
    or ``nbytes`` bytes (the last may be smaller); empty batches are dropped."""
    pending: List[pa.RecordBatch] = []
    held_rows = held_bytes = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        pending.append(batch)
        held_rows += batch.num_rows
        held_bytes += batch.nbytes
        if held_rows >= rows or held_bytes >= nbytes:
            yield _join(pending)
            pending, held_rows, held_bytes = [], 0, 0
    if pending:
        yield _join(pending)


def _join(batches: List[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    if hasattr(pa, "concat_batches"):  # pyarrow >= 19
        return pa.concat_batches(batches)
    joined = pa.Table.from_batches(batches).combine_chunks().to_batches()
    return joined[0]


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast column by column (by name) to ``target``."""
    columns = []
    for field in target:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            raise SqsFlightError(
                "INVALID_ARGUMENT",
                f"column {field.name!r} of the query schema is not in the table "
                f"(columns: {', '.join(batch.schema.names)})",
            )
        # Spark keeps microseconds: nanosecond timestamps are truncated, not refused.
        options = pc.CastOptions(field.type, allow_time_truncate=True)
        columns.append(pc.cast(batch.column(index), options=options))
    return pa.RecordBatch.from_arrays(columns, schema=target)


class FlightPartition(InputPartition):
    """One endpoint of a planned batch: ticket bytes and location strings."""

    def __init__(self, ticket: bytes, locations: Tuple[str, ...]):
        self.ticket = ticket
        self.locations = tuple(locations)

    def endpoint(self) -> Endpoint:
        return Endpoint(self.ticket, self.locations)


class RowsPartition(InputPartition):
    """Rows already read by the batch reader on the driver (Arrow IPC bytes)."""

    def __init__(self, ipc: bytes):
        self.ipc = ipc


def _batch(offset: Optional[Mapping[str, Any]]) -> int:
    return int((offset or {}).get("batch", 0))


class SqsFlightStreamReader(*_STREAM_BASES):  # type: ignore[misc]
    """The streaming reader; see the module doc for the offset rules."""

    def __init__(self, options: Options, schema: StructType):
        self._o = options
        self._schema = schema
        self._limits: Dict[int, Dict[str, int]] = {}
        self._committed = 0  # done (written by the commit thread)
        self._asked = 0  # handed to the commit thread
        self._commits: Optional[ThreadPoolExecutor] = None
        self._pending: List[Future] = []
        self._available_now_left: Optional[int] = None
        self._legacy_last: Optional[int] = None
        self._watch: Optional[_Watchdog] = _Watchdog(options) if options.managed is not None else None

    def __getstate__(self) -> Dict[str, Any]:
        # The commit thread, its futures and the watchdog stay in the driver's process.
        state = dict(self.__dict__)
        state["_commits"], state["_pending"], state["_watch"] = None, [], None
        return state

    # -- driver side ----------------------------------------------------

    def _table_status(self) -> Dict[str, Any]:
        o = self._o
        answer = _reconnecting(o.reconnect, "status", lambda: o.client().status(o.table), o.revive)
        return answer["tables"][self._o.table]

    def _consumer_status(self) -> Dict[str, Any]:
        return self._table_status().get("consumers", {}).get(self._o.consumer, {})

    def _commit(self, batch: int) -> None:
        """The commit itself (DoAction ``commit``); runs on the commit thread."""
        if batch <= self._committed:
            return
        o = self._o
        _reconnecting(
            o.reconnect, f"commit of batch {batch}", lambda: o.client().commit(o.table, o.consumer, batch), o.revive
        )
        self._committed = batch

    def _ask_commit(self, batch: int) -> None:
        """Commits ``batch`` in the background, after every commit asked
        before it. Raises the error of an earlier commit that failed."""
        self._raise_failed()
        if batch <= self._asked:
            return
        self._asked = batch
        for b in [b for b in self._limits if b <= batch]:
            del self._limits[b]  # Spark plans no committed batch again
        if self._commits is None:
            self._commits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqs-flight-commit")
        self._pending.append(self._commits.submit(self._commit, batch))

    def _raise_failed(self) -> None:
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for f in done:
            if f.exception() is not None:
                self._asked = self._committed  # asked again, it is tried again
                raise f.exception()  # type: ignore[misc]

    def wait_for_commits(self) -> None:
        """Blocks until every commit asked so far is done; raises the first
        that failed. ``stop()`` calls it."""
        for f in self._pending:
            f.exception()  # waits; each commit is bounded by the client's timeouts
        self._raise_failed()

    def _plan_limits(self, limit: Any) -> Dict[str, int]:
        limits = self._o.plan_limits()
        if ReadMaxRows is None or not isinstance(limit, ReadMaxRows):
            return limits
        rows = max(1, int(limit.max_rows))
        parts = min(limits.get("partitions", DEFAULT_PARTITIONS), rows)
        per = rows // parts
        limits["partitions"] = parts
        limits["max_messages"] = min(limits.get("max_messages", per), per)
        return limits

    def _plan(self, batch: int, limits: Dict[str, int]):
        self._limits[batch] = limits
        o = self._o
        return _reconnecting(
            o.reconnect,
            f"plan of batch {batch}",
            lambda: o.client().plan(o.table, o.consumer, batch, **limits),
            o.revive,
        )

    def initialOffset(self) -> dict:
        return {"batch": self._consumer_status().get("committed_batch") or 0}

    def getDefaultReadLimit(self) -> Any:
        if self._o.max_rows_per_batch is not None:
            return ReadMaxRows(self._o.max_rows_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Every micro-batch reads at least one message while the table is not
        # empty, so this many batches drain what is there now and a producer
        # that never stops cannot keep the run going for ever.
        self._available_now_left = int(self._table_status()["approximate_depth"])

    def latestOffset(self, start: Optional[dict] = None, limit: Any = None) -> dict:
        if start is None:  # pyspark < 4.2 calls latestOffset() with no argument
            return self._latest_legacy()
        last = _batch(start)
        if last > 0:
            self._ask_commit(last)  # Spark has the batch ending at `start` in its commit log
        if (self._available_now_left is not None and self._available_now_left <= 0) or int(
            self._table_status()["approximate_depth"]
        ) == 0:
            self.wait_for_commits()  # no batch to overlap with: a run that ends here leaves nothing in flight
            return start
        self._plan(last + 1, self._plan_limits(limit))
        if self._available_now_left is not None:
            self._available_now_left -= 1
        return {"batch": last + 1}

    def _latest_legacy(self) -> dict:
        """pyspark 4.0/4.1: no start is given, so the server's record is the start.

        Spark asks for the next offset only after the batch it got last from
        this reader is in its commit log, so that batch is committed here.
        """
        table = self._table_status()
        consumer = table.get("consumers", {}).get(self._o.consumer, {})
        base = max(
            consumer.get("last_planned_batch") or 0,
            consumer.get("committed_batch") or 0,
            self._legacy_last or 0,  # the server forgets released batches; Spark does not
        )
        if self._legacy_last is not None:
            self._ask_commit(self._legacy_last)
        if int(table["approximate_depth"]) == 0:
            self.wait_for_commits()
            return {"batch": base}
        self._plan(base + 1, self._o.plan_limits())
        self._legacy_last = base + 1
        return {"batch": base + 1}

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        batches = range(_batch(start) + 1, _batch(end) + 1)
        if not batches:
            return []
        # latestOffset plans every batch before Spark logs its offset, so a
        # batch the server no longer holds was released (consumer lease
        # expired, server restarted without --state-dir) after a crash. Its
        # messages are back in the queue: planning it again would receive new
        # ones under a micro-batch the sink may already have committed, and
        # they would be deleted unseen. Read nothing for it instead; later
        # batches read those messages again (at-least-once).
        open_batches = set(self._consumer_status().get("open_batches") or [])
        parts: List[InputPartition] = []
        for batch in batches:
            if batch not in open_batches:
                _log.warning(
                    "sqs-flight: batch %d of consumer %r on table %r was released before Spark "
                    "committed it; it replays empty and its messages are read again later",
                    batch, self._o.consumer, self._o.table,
                )
                continue
            plan = self._plan(batch, self._limits.get(batch, self._o.plan_limits()))
            parts.extend(FlightPartition(e.ticket, e.locations) for e in plan.endpoints)
        return parts

    def commit(self, end: dict) -> None:
        self._ask_commit(_batch(end))

    def stop(self) -> None:
        # No release: an uncommitted batch must replay after a restart, and
        # the server's consumer lease returns its messages if none comes.
        try:
            self.wait_for_commits()
        finally:
            if self._watch is not None:
                self._watch.stop()
                self._watch = None
            if self._commits is not None:
                self._commits.shutdown(wait=True)
                self._commits = None

    # -- executor side --------------------------------------------------

    def read(self, partition: FlightPartition) -> Iterator[pa.RecordBatch]:
        target = arrow_schema(self._schema)
        # A server being started again (managed mode's watchdog, a restart on
        # --state-dir) is waited for, but only before the first row: rows
        # already handed to Spark cannot be taken back, so a read cut half
        # way fails its task and Spark's retry replays the ticket.
        deadline = time.monotonic() + self._o.reconnect
        delay = 0.1
        while True:
            started = False
            try:
                for batch in rebatch(self._o.client().stream(partition.endpoint())):
                    started = True
                    yield conform(batch, target)
                return
            except SqsFlightError as e:
                if started or not _unreachable(e):
                    raise
                if time.monotonic() + delay > deadline:
                    raise self._unreachable_hint(e) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _unreachable_hint(self, e: SqsFlightError) -> SqsFlightError:
        """Managed mode: an executor that cannot reach the driver's server is
        told which address it tried, where that came from, and the fix."""
        spec = self._o.managed
        if spec is None:
            return e
        return SqsFlightError(
            e.code,
            f"{e}; this executor could not reach the managed server at {self._o.client().url} (host "
            f"{spec.host()}, from {spec.advertise_from}): set the option \"advertiseHost\" to an address of "
            "the driver that executors can reach (and let the port through)",
        )


class _Watchdog:
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


class SqsFlightBatchReader(DataSourceReader):
    """``spark.read``: reads one batch on the driver, then releases it (a peek)
    or, with ``commit=true``, commits it.

    Spark gives a batch reader no hook that runs after every task, so the
    batch is read whole while planning and handed to the tasks as Arrow bytes:
    every action on the DataFrame sees the same rows. Keep it for peeks and
    small reads; stream for volume.
    """

    def __init__(self, options: Options, schema: StructType):
        self._o = options
        self._schema = schema

    def partitions(self) -> List[InputPartition]:
        o = self._o
        client = o.client()
        plan = client.plan(o.table, o.consumer, None, **o.plan_limits())
        tables = client.read_plan(plan)
        if o.commit:
            client.commit(o.table, o.consumer, plan.batch)
        else:
            client.release(o.table, o.consumer)
        return [RowsPartition(_ipc(t)) for t in tables if t.num_rows] or [RowsPartition(b"")]

    def read(self, partition: RowsPartition) -> Iterator[pa.RecordBatch]:
        if not partition.ipc:
            return
        target = arrow_schema(self._schema)
        with pa.ipc.open_stream(partition.ipc) as reader:
            for batch in reader:
                if batch.num_rows:
                    yield conform(batch, target)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


# -- the sink -------------------------------------------------------------

#: The DataFrame columns the sink sends, and the Spark types each may have.
_WRITE_TYPES: Dict[str, Tuple[type, ...]] = {
    writing.BODY: (StringType,),
    writing.GROUP: (StringType,),
    writing.DEDUP: (StringType,),
    writing.DELAY: (ByteType, ShortType, IntegerType, LongType),
    writing.ATTRIBUTES: (MapType,),
}
_WRITE_TYPE_NAMES = {
    writing.BODY: "string",
    writing.GROUP: "string",
    writing.DEDUP: "string",
    writing.DELAY: "an integer type",
    writing.ATTRIBUTES: "map<string, string>",
}


def _bad_sink(message: str) -> SqsFlightError:
    return SqsFlightError("INVALID_ARGUMENT", f"sqs-flight sink: {message}")


def _type_ok(name: str, dt: DataType) -> bool:
    if not isinstance(dt, _WRITE_TYPES[name]):
        return False
    if isinstance(dt, MapType):
        return isinstance(dt.keyType, StringType) and isinstance(dt.valueType, StringType)
    return True


def check_write_schema(schema: StructType) -> None:
    """Refuses, naming them, DataFrame columns the sink cannot send: it needs
    ``body`` (string) and takes only the other DoPut columns."""
    names = [f.name for f in schema.fields]
    if writing.BODY not in names:
        raise _bad_sink(
            f"the DataFrame has no {writing.BODY!r} column (string), the message body; its columns: "
            f"{', '.join(names) or 'none'}. Build one, e.g. "
            "df.selectExpr(\"to_json(struct(*)) AS body\")"
        )
    unknown = [n for n in names if n not in _WRITE_TYPES]
    if unknown:
        raise _bad_sink(
            f"column(s) {', '.join(repr(n) for n in unknown)} are not message fields: the sink "
            f"sends only {', '.join(writing.COLUMNS)}; select those first, e.g. "
            f"df.select({', '.join(repr(n) for n in names if n in _WRITE_TYPES)})"
        )
    for f in schema.fields:
        if not _type_ok(f.name, f.dataType):
            raise _bad_sink(
                f"column {f.name!r} is {f.dataType.simpleString()}, expected {_WRITE_TYPE_NAMES[f.name]}"
            )


@dataclass(frozen=True)
class WriteOptions:
    """The validated options of a write; plain data, so it pickles."""

    url: str
    table: str
    token: Optional[str]
    timeout: float
    tls_root_certs: Optional[str]
    batch_rows: int
    read_timeout: Optional[float] = None  # DoPut runs as long as the data takes

    @classmethod
    def parse(cls, options: Mapping[str, str], extra: Tuple[str, ...] = ()) -> "WriteOptions":
        check_option_names(options, WRITE_OPTIONS + tuple(extra), _bad_sink)
        url, table = options.get("url"), options.get("table")
        if not url:
            raise _bad_sink('option "url" is missing: set it to the server, e.g. grpc://127.0.0.1:50051')
        if not table:
            raise _bad_sink('option "table" is missing: set it to a table the server serves')
        token, tls_root_certs = _credentials(options, _bad_sink)
        return cls(
            url=_url_option(url, _bad_sink),
            table=str(table),
            token=token,
            timeout=float(_positive_int(options, "timeoutSeconds") or 30),
            tls_root_certs=tls_root_certs,
            batch_rows=_positive_int(options, "batchRows") or writing.DEFAULT_BATCH_ROWS,
        )

    def client(self) -> Client:
        return _client(self)  # type: ignore[arg-type]


@dataclass
class SentMessage(WriterCommitMessage):
    """What one task sent: its partition and the number of messages."""

    partition: Optional[int]
    sent: int


def _partition_id() -> Optional[int]:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() if ctx is not None else None
    except Exception:  # pragma: no cover - outside a task
        return None


def _send(o: WriteOptions, batches: Iterator[pa.RecordBatch]) -> SentMessage:
    """One DoPut of this task's rows; a refusal names the Spark partition."""
    partition = _partition_id()
    batches = (b for b in batches if b.num_rows)
    first = next(batches, None)
    if first is None:
        return SentMessage(partition, 0)
    reader = pa.RecordBatchReader.from_batches(first.schema, itertools.chain([first], batches))
    try:
        sent = o.client().write(o.table, reader, batch_rows=o.batch_rows)
    except SqsFlightError as e:
        raise SqsFlightError(
            e.code, f"sqs-flight sink, Spark partition {partition}: {e} (rows are numbered within "
            "the partition; the rows sent before it stay in the queue)", sent=e.sent, row=e.row,
        ) from None
    return SentMessage(partition, sent)


def _rows_to_batches(schema: StructType, rows: Iterator[Any], size: int) -> Iterator[pa.RecordBatch]:
    """Spark Rows (pyspark 4.0's stream writer) as Arrow batches of ``size`` rows."""
    target = arrow_schema(schema)
    names = schema.fieldNames()
    chunk: List[Any] = []

    def batch() -> pa.RecordBatch:
        columns = {n: [r[i] for r in chunk] for i, n in enumerate(names)}
        if writing.ATTRIBUTES in columns:
            columns[writing.ATTRIBUTES] = [
                None if m is None else list(m.items()) for m in columns[writing.ATTRIBUTES]
            ]
        return pa.RecordBatch.from_pydict(columns, schema=target)

    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield batch()
            chunk = []
    if chunk:
        yield batch()


def _writer_options(
    options: Mapping[str, str], schema: StructType, overwrite: bool, extra: Tuple[str, ...] = ()
) -> WriteOptions:
    """Checks a write before any task starts: options, columns, mode, table."""
    o = WriteOptions.parse(options, extra)
    if overwrite:
        raise _bad_sink(
            "a queue can only be appended to: use mode \"append\" (batch) or output mode "
            "\"append\"/\"update\" (streaming); the sink never deletes messages"
        )
    check_write_schema(schema)
    o.client().schema(o.table)  # NOT_FOUND, naming the known tables, before any task runs
    return o


class SqsFlightBatchWriter(DataSourceArrowWriter):
    """``df.write.format("sqs-flight")``: each task sends its rows in one DoPut.

    SQS has no transactions: ``commit`` and ``abort`` cannot undo what a task
    sent, and a retried task sends its partition again (at-least-once).
    """

    def __init__(self, options: WriteOptions, schema: StructType):
        self._o = options
        self._schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessage:
        return _send(self._o, iterator)

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        sent = sum(m.sent for m in messages if isinstance(m, SentMessage))
        _log.info("sqs-flight sink: %d messages sent to table %r", sent, self._o.table)

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        sent = sum(m.sent for m in messages if isinstance(m, SentMessage))
        _log.warning(
            "sqs-flight sink: write to table %r aborted; %d messages of the tasks that finished "
            "were sent and stay in the queue", self._o.table, sent,
        )


class SqsFlightStreamWriter(_STREAM_WRITER_BASE):  # type: ignore[misc,valid-type]
    """``df.writeStream.format("sqs-flight")``: each task of a micro-batch
    sends its rows in one DoPut. A micro-batch that is replayed (a failure
    before Spark logged it as committed) is sent again: at-least-once; on a
    FIFO queue a ``message_deduplication_id`` derived from the data drops
    replays within SQS's 5-minute window.
    """

    def __init__(self, options: WriteOptions, schema: StructType):
        self._o = options
        self._schema = schema

    def write(self, iterator: Iterator[Any]) -> SentMessage:
        if DataSourceStreamArrowWriter is None:  # pyspark 4.0: Rows
            iterator = _rows_to_batches(self._schema, iterator, self._o.batch_rows)
        return _send(self._o, iterator)

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        sent = sum(m.sent for m in messages if isinstance(m, SentMessage))
        _log.info("sqs-flight sink: micro-batch %d sent %d messages to table %r", batchId, sent, self._o.table)

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        sent = sum(m.sent for m in messages if isinstance(m, SentMessage))
        _log.warning(
            "sqs-flight sink: micro-batch %d to table %r aborted; %d messages of the tasks that "
            "finished were sent and stay in the queue", batchId, self._o.table, sent,
        )


class SqsFlightDataSource(DataSource):
    """Format ``sqs-flight``. Options: ``url``, ``table`` (required);
    ``consumer`` (stream default ``spark-<table>``, batch default
    ``spark-batch-<table>``), ``partitions``, ``maxMessagesPerPartition``,
    ``maxWaitMs``, ``maxBytesPerPartition``, ``maxDurationMs``,
    ``receiversPerPartition``, ``maxRowsPerBatch`` (streaming, pyspark >= 4.2), ``token`` or
    ``tokenFile``, ``timeoutSeconds``, ``readTimeoutSeconds``,
    ``reconnectSeconds`` (streaming: how long driver calls wait out an
    unreachable server, default 10), ``tlsRootCerts`` (the CA of a
    ``grpc+tls://`` server: a PEM file, read on the driver, or the PEM
    text), and for
    batch reads ``commit`` (default false: release, a peek)."""

    #: Options a subclass reads itself, on top of the source's own: known
    #: to the check that refuses misspelled options.
    extra_options: Tuple[str, ...] = ()

    @classmethod
    def name(cls) -> str:
        # spark.dataSource.register() calls name() on the driver first.
        check_workers_python()
        return "sqs-flight"

    def schema(self) -> StructType:
        o = Options.parse(self.options, "spark-{table}", self.extra_options)
        return spark_schema(_reconnecting(o.reconnect, "schema", lambda: o.client().schema(o.table), o.revive))

    def streamReader(self, schema: StructType) -> SqsFlightStreamReader:
        return SqsFlightStreamReader(Options.parse(self.options, "spark-{table}", self.extra_options), schema)

    def reader(self, schema: StructType) -> SqsFlightBatchReader:
        return SqsFlightBatchReader(Options.parse(self.options, "spark-batch-{table}", self.extra_options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> SqsFlightBatchWriter:
        return SqsFlightBatchWriter(_writer_options(self.options, schema, overwrite, self.extra_options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> SqsFlightStreamWriter:
        return SqsFlightStreamWriter(_writer_options(self.options, schema, overwrite, self.extra_options), schema)


def _short_traceback(method: Any) -> Any:
    """``method``, raising an :class:`SqsFlightError` with no traceback of
    ours. Spark shows a Python error as ``Failed to create Python data
    source instance: Traceback ...`` followed by the frames and, last, the
    message: an error of ours names the fix in that message, so the frames
    that lead to it only push it down the screen."""

    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from method(*args, **kwargs)
            except SqsFlightError as error:
                raise error.with_traceback(None) from None

        return generator

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except SqsFlightError as error:
            raise error.with_traceback(None) from None

    return call


for _cls, _methods in (
    (SqsFlightDataSource, ("schema", "reader", "streamReader", "writer", "streamWriter")),
    (SqsFlightStreamReader, ("initialOffset", "latestOffset", "partitions", "commit", "read",
                             "prepareForTriggerAvailableNow")),
    (SqsFlightBatchReader, ("partitions", "read")),
    (SqsFlightBatchWriter, ("write",)),
    (SqsFlightStreamWriter, ("write",)),
):
    for _name in _methods:
        setattr(_cls, _name, _short_traceback(getattr(_cls, _name)))
