"""The options of the source and the sink: checked and turned into plain
data that pickles to the executors. Parsing starts nothing: in managed mode
the server is found or started afterwards, on the driver, by
:func:`sqs_flight.spark.driver.connect`. The only files read here are those
the options name (``tokenFile``, ``tlsRootCerts``), so that executors need
neither.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from .. import managed as _managed
from .. import writing
from .._plan_params import PLAN_PARAMS
from ..client import Client, SqsFlightError, check_url, read_pem, read_token_file
from ..secret_files import TOKEN_FILE
from . import driver
from .limits import DEFAULT_MAX_TRIGGER_DELAY_MS, BatchLimits

#: Seconds the stream reader's driver calls (status, plan, commit) keep trying
#: while the server cannot be reached, e.g. while it restarts on its
#: ``--state-dir``: option ``reconnectSeconds`` (0: fail at once).
DEFAULT_RECONNECT_S = 10


# option name -> plan field (the Flight surface's plan command), each a positive integer.
_LIMIT_OPTIONS = {p.spark_option: p.name for p in PLAN_PARAMS}


#: Options of managed mode: ``queueUrl`` instead of ``url`` starts (or
#: reuses) a server on the driver (sqs_flight.managed).
MANAGED_OPTIONS = (
    "queueUrl",
    "stateDir",
    "stateUrl",
    "advertiseHost",
    "serverIdleExitSeconds",
    "sqsEndpoint",
    "region",
    "serverTls",
    "serverPlaintextOffLoopback",
    "largePayloads",
    "largePayloadBucket",
    "s3Endpoint",
    "roleArn",
    "roleExternalId",
    "roleSessionName",
)

#: Options of streaming reads only: a batch read (``spark.read``) refuses them.
STREAM_OPTIONS = ("maxBytesPerBatch", "minRowsPerBatch", "maxTriggerDelay", "rejectPayloadErrors")

#: Every option of the source (reads) and of the sink (writes).
READ_OPTIONS = (
    "url",
    "table",
    "consumer",
    *_LIMIT_OPTIONS,
    "maxRowsPerBatch",
    *STREAM_OPTIONS,
    "token",
    "tokenFile",
    "timeoutSeconds",
    "readTimeoutSeconds",
    "reconnectSeconds",
    "tlsRootCerts",
    "commit",
    *MANAGED_OPTIONS,
)
WRITE_OPTIONS = ("url", "table", "token", "tokenFile", "timeoutSeconds", "tlsRootCerts", "batchRows")


# Options Spark itself may hand a data source (`load(path)`, `save(path)`,
# a streaming sink's checkpoint).
_SPARK_OPTIONS = ("path", "checkpointLocation")


def _bad_option(message: str) -> SqsFlightError:
    return SqsFlightError("INVALID_ARGUMENT", f"sqs-flight source: {message}")


def bad_sink(message: str) -> SqsFlightError:
    return SqsFlightError("INVALID_ARGUMENT", f"sqs-flight sink: {message}")


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


#: The source's ``readAhead`` unless set: on (the server's default is off,
#: for clients that do not plan batch after batch).
DEFAULT_READ_AHEAD = 1
#: The source's ``backlogMaxMessagesPerPartition`` unless set: a backlog of
#: 20,000 is one micro-batch of the default 2 partitions (the server's
#: default is off, for clients that expect ``max_messages`` as it is).
DEFAULT_BACKLOG_MAX_MESSAGES = 10_000
#: The source's ``receiveAtPlan`` unless set: on (the server's default is
#: off, for clients that may commit a batch without reading every
#: partition; Spark reads them all before it commits).
DEFAULT_RECEIVE_AT_PLAN = 1
#: Plan options that may be 0 (off).
_MAY_BE_OFF = {
    "read_ahead": "0 (off) or 1",
    "receive_at_plan": "0 (off) or 1",
    "backlog_max_messages": "0 (off) or a positive integer",
}


def _plan_option(options: Mapping[str, str], name: str, field: str) -> Optional[int]:
    """A plan option's value: a positive integer, or 0 too where it means off."""
    if field in _MAY_BE_OFF:
        return _int_option(options, name, 0, _MAY_BE_OFF[field])
    return _positive_int(options, name)


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
        which = "tokenFile" if token_file and e.reason == TOKEN_FILE else "tlsRootCerts"
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


# Spark's byte strings (``spark.sql.files.maxPartitionBytes``): binary units, 1k = 1024.
_SIZE = re.compile(r"([0-9]+)\s*([a-z]*)")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
}


def _byte_size(options: Mapping[str, str], name: str) -> Optional[int]:
    """Option ``name`` as bytes (None if unset): a whole number, with an
    optional unit as Spark's own size options take them (``64m``, ``1g``)."""
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    found = _SIZE.fullmatch(str(raw).strip().lower())
    if found is None or found.group(2) not in _SIZE_UNITS or int(found.group(1)) == 0:
        raise _bad_option(
            f"option {name!r} must be a size of at least 1 byte: a whole number of bytes, or one with a "
            f"unit k, m, g or t (1k = 1024 bytes) as Spark takes sizes, e.g. 64m or 1g; got {raw!r}"
        )
    return int(found.group(1)) * _SIZE_UNITS[found.group(2)]


# Durations as Kafka's source takes maxTriggerDelay (Spark's time strings):
# a whole number and a unit; without a unit, milliseconds.
_DURATION = re.compile(r"([0-9]+)\s*([a-z]*)")
_DURATION_UNITS_US = {
    "us": 1,
    "ms": 1000,
    "": 1000,
    "s": 10**6,
    "m": 60 * 10**6,
    "min": 60 * 10**6,
    "h": 3600 * 10**6,
    "d": 86400 * 10**6,
}


def _duration_ms(options: Mapping[str, str], name: str) -> Optional[int]:
    """Option ``name`` in milliseconds (None if unset): ``30s``, ``5m``,
    ``1h``, ``500ms`` (units us, ms, s, m or min, h, d; none: ms)."""
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    found = _DURATION.fullmatch(str(raw).strip().lower())
    if found is None or found.group(2) not in _DURATION_UNITS_US:
        raise _bad_option(
            f"option {name!r} must be a duration as Kafka's source takes it: a whole number with a unit "
            f"ms, s, m, h or d (30s, 5m, 1h, 500ms; no unit: milliseconds); got {raw!r}"
        )
    return int(found.group(1)) * _DURATION_UNITS_US[found.group(2)] // 1000


def _batch_limits(options: Mapping[str, str]) -> BatchLimits:
    """The options that bound a micro-batch, checked against each other."""
    max_rows, min_rows = _positive_int(options, "maxRowsPerBatch"), _positive_int(options, "minRowsPerBatch")
    delay = _duration_ms(options, "maxTriggerDelay")
    if delay is not None and min_rows is None:
        raise _bad_option(
            'option "maxTriggerDelay" is how long a trigger may wait for "minRowsPerBatch" messages: '
            'set "minRowsPerBatch" with it, or drop it'
        )
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise _bad_option(
            f'option "minRowsPerBatch" ({min_rows}) is above "maxRowsPerBatch" ({max_rows}): '
            "no micro-batch could hold the minimum"
        )
    return BatchLimits(  # max_rows: Options.max_rows_per_batch
        max_bytes=_byte_size(options, "maxBytesPerBatch"),
        min_rows=min_rows,
        max_trigger_delay_ms=DEFAULT_MAX_TRIGGER_DELAY_MS if delay is None else delay,
    )


def _flag(options: Mapping[str, str], name: str) -> bool:
    raw = str(options.get(name, "false")).strip().lower()
    if raw not in ("true", "false"):
        raise _bad_option(f"option {name!r} must be true or false, got {options.get(name)!r}")
    return raw == "true"


@dataclass(frozen=True)
class Options:
    """The validated options of one query; plain data, so it pickles."""

    #: The server; in managed mode empty until :func:`driver.connect` sets it.
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
    #: ``maxBytesPerBatch``, ``minRowsPerBatch`` and ``maxTriggerDelay``
    #: (streaming); with ``max_rows_per_batch``: :meth:`read_limits`.
    batch_limits: BatchLimits = BatchLimits()
    #: ``rejectPayloadErrors`` (streaming): rows whose payload did not decode
    #: are left out of the micro-batch and handed back to SQS at commit.
    reject_payload_errors: bool = False

    @classmethod
    def parse(
        cls, options: Mapping[str, str], default_consumer: str, extra: Tuple[str, ...] = (), *, streaming: bool = True
    ) -> "Options":
        """``extra``: options a subclass of the source reads itself;
        ``streaming`` False (a batch read) refuses :data:`STREAM_OPTIONS`.
        Starts nothing: see :func:`driver.connect`."""
        check_option_names(options, READ_OPTIONS + tuple(extra), _bad_option)
        if not streaming:
            for name in STREAM_OPTIONS:
                if options.get(name) not in (None, ""):
                    raise _bad_option(f'option "{name}" is for streaming reads (spark.readStream): drop it')
        spec = _managed_spec(options)
        url, table = options.get("url"), options.get("table")
        if spec is not None:
            table = spec.table
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
            if (value := _plan_option(options, name, field)) is not None
        )
        read_timeout = _positive_int(options, "readTimeoutSeconds")
        token, tls_root_certs = _credentials(options, _bad_option)
        batch_limits = _batch_limits(options)
        # The source's own defaults for what the options leave to the server.
        source_defaults = {
            # A stream plans batch after batch with the same options: the
            # server reads the next one while Spark works on this one. Not
            # with minRowsPerBatch, which waits for the queue's visible
            # depth to reach a count: what is read ahead leaves that count.
            "read_ahead": DEFAULT_READ_AHEAD if batch_limits.min_rows is None else 0,
            # A backlog in few micro-batches (each costs Spark a fixed price);
            # the server uses it only where max_messages is left to the default.
            "backlog_max_messages": DEFAULT_BACKLOG_MAX_MESSAGES,
            # The partitions receive while Spark plans the micro-batch and
            # launches its tasks, not when the tasks start.
            "receive_at_plan": DEFAULT_RECEIVE_AT_PLAN,
        }
        given = {field for field, _ in limits}
        limits += tuple((field, value) for field, value in source_defaults.items() if field not in given)
        return cls(
            url=_url_option(url, _bad_option) if spec is None else "",
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
            batch_limits=batch_limits,
            reject_payload_errors=_flag(options, "rejectPayloadErrors"),
        )

    def client(self) -> Client:
        """This process's client for these options, created on first use."""
        return driver.client(self)

    def plan_limits(self) -> Dict[str, int]:
        return dict(self.limits)

    def read_limits(self) -> BatchLimits:
        """Every option that bounds a micro-batch (``maxRowsPerBatch`` too)."""
        return dataclasses.replace(self.batch_limits, max_rows=self.max_rows_per_batch)


# S3's rule for bucket names: 3 to 63 lowercase letters, digits, dots and
# hyphens, a letter or digit at each end (and no "..", checked apart).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def _bucket_option(options: Mapping[str, str], name: str) -> Optional[str]:
    """Option ``name`` as an S3 bucket name (None if unset)."""
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    bucket = str(raw).strip()
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise _bad_option(
            f"option {name!r} must be an S3 bucket name (3 to 63 lowercase letters, digits, dots and hyphens, "
            f"e.g. my-payloads; no s3:// and no key prefix), got {raw!r}"
        )
    return bucket


def _endpoint_option(options: Mapping[str, str], name: str) -> Optional[str]:
    """Option ``name`` as an http(s) endpoint URL (None if unset)."""
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    if not str(raw).strip().startswith(("http://", "https://")):
        raise _bad_option(
            f"option {name!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:9000, got {raw!r}"
        )
    return str(raw).strip()


# STS's AssumeRole inputs, as the server checks them: a role ARN of any
# partition, an external id and a session name of STS's characters.
_ROLE_ARN = re.compile(r"arn:aws(-[a-z-]+)?:iam::[0-9]{12}:role/[A-Za-z0-9_+=,.@/-]*[A-Za-z0-9_+=,.@-]")
_EXTERNAL_ID = re.compile(r"[A-Za-z0-9_+=,.@:/-]{2,1224}")
_SESSION_NAME = re.compile(r"[A-Za-z0-9_+=,.@-]{2,64}")


def _role_options(options: Mapping[str, str]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """``roleArn``, ``roleExternalId``, ``roleSessionName``: the IAM role the
    managed server reads the queue as (its ``role_arn``...), each checked as
    STS takes it; the external id is never quoted back."""
    arn, external_id, session = (str(options.get(n) or "").strip() or None for n in _ROLE_OPTIONS)
    if arn is None:
        for name, value in zip(_ROLE_OPTIONS[1:], (external_id, session)):
            if value is not None:
                raise _bad_option(f'option "{name}" needs "roleArn" (the role it goes with)')
        return None, None, None
    if not _ROLE_ARN.fullmatch(arn) or len(arn) > 2048 or len(arn.rsplit("/", 1)[-1]) > 64:
        raise _bad_option(
            f'option "roleArn" must be an IAM role ARN, arn:aws:iam::<12-digit account>:role/<name>, got {arn!r}'
        )
    if external_id is not None and not _EXTERNAL_ID.fullmatch(external_id):
        raise _bad_option('option "roleExternalId" must be 2 to 1224 letters, digits and _+=,.@:/- (as STS takes it)')
    if session is not None and not _SESSION_NAME.fullmatch(session):
        raise _bad_option(
            f'option "roleSessionName" must be 2 to 64 letters, digits and _+=,.@- (as STS takes it), got {session!r}'
        )
    return arn, external_id, session


_ROLE_OPTIONS = ("roleArn", "roleExternalId", "roleSessionName")


def _state_url_option(options: Mapping[str, str]) -> Optional[str]:
    """``stateUrl``: where the managed server keeps its state so that a
    server on a new cluster takes it over (None: on the driver only)."""
    raw = options.get("stateUrl")
    if raw in (None, ""):
        return None
    url = str(raw).strip()
    if not url.startswith(("s3://", "file:///", "/")) or url == "s3://":
        raise _bad_option(
            f'option "stateUrl" must be s3://BUCKET/PREFIX, file:///PATH or an absolute path, got {url!r}'
        )
    return url


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
        raise _bad_option(
            f'option "queueUrl" must be an SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME), got {queue_url!r}'
        )
    try:
        table = str(options.get("table") or _managed.table_name_for(queue_url))
    except SqsFlightError as e:
        raise _bad_option(f'option "queueUrl": {e}') from None
    idle = _int_option(options, "serverIdleExitSeconds", 1, "a positive whole number of seconds")
    tls = None if options.get("serverTls") in (None, "") else _flag(options, "serverTls")
    role_arn, role_external_id, role_session_name = _role_options(options)
    spec = _managed.ManagedServer(
        state_dir=str(options.get("stateDir") or _managed.default_state_dir()),
        queue_url=queue_url,
        table=table,
        sqs_endpoint=options.get("sqsEndpoint") or None,
        s3_endpoint=_endpoint_option(options, "s3Endpoint"),
        state_url=_state_url_option(options),
        region=options.get("region") or None,
        advertise_host=options.get("advertiseHost") or None,  # else found by driver.connect
        idle_exit=idle or _managed.DEFAULT_IDLE_EXIT_S,
        tls=tls,
        plaintext_off_loopback=_flag(options, "serverPlaintextOffLoopback"),
        large_payloads=None if options.get("largePayloads") in (None, "") else _flag(options, "largePayloads"),
        large_payload_bucket=_bucket_option(options, "largePayloadBucket"),
        role_arn=role_arn,
        role_external_id=role_external_id,
        role_session_name=role_session_name,
    )
    if spec.advertise_host is not None:  # else checked once driver.connect finds the address
        try:
            _managed.check_plaintext(spec)
        except SqsFlightError as e:
            raise _bad_option(str(e).removeprefix("managed mode: ")) from None
    return spec


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
        check_option_names(options, WRITE_OPTIONS + tuple(extra), bad_sink)
        url, table = options.get("url"), options.get("table")
        if not url:
            raise bad_sink('option "url" is missing: set it to the server, e.g. grpc://127.0.0.1:50051')
        if not table:
            raise bad_sink('option "table" is missing: set it to a table the server serves')
        token, tls_root_certs = _credentials(options, bad_sink)
        return cls(
            url=_url_option(url, bad_sink),
            table=str(table),
            token=token,
            timeout=float(_positive_int(options, "timeoutSeconds") or 30),
            tls_root_certs=tls_root_certs,
            batch_rows=_positive_int(options, "batchRows") or writing.DEFAULT_BATCH_ROWS,
        )

    def client(self) -> Client:
        return driver.cached_client(self.url, self.token, self.timeout, self.read_timeout, self.tls_root_certs)
