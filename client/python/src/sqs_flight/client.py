"""A thin pyarrow.flight client for the sqs-flight surface (the top-level
README's "The Flight surface").

Every call is one standard Flight RPC with a JSON body: GetFlightInfo plans a
batch, DoGet reads one ticket (a repeatable read), DoAction ``commit``,
``release`` and ``status`` do the rest. Errors come back as
:class:`SqsFlightError` with the gRPC code and the server's own message, which
names the field or the value at fault.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import pyarrow as pa
import pyarrow.flight as flight

from . import writing
from ._plan_params import PLAN_PARAMS
from .errors import SqsFlightError
from .reasons import ReasonCatcher
from .secret_files import read_pem, read_token_file

#: The consumer the server uses when a command names none.
DEFAULT_CONSUMER = "default"

#: Seconds a unary RPC (plan, commit, release, status, schema) may take.
DEFAULT_TIMEOUT_S = 30.0

#: The plan fields a caller may set; the server's table config fills the rest.
PLAN_LIMITS = tuple(p.name for p in PLAN_PARAMS)

#: Schema metadata keys that :func:`read_batch` puts on the tables it returns.
META_TABLE = b"sqs_flight.table"
META_CONSUMER = b"sqs_flight.consumer"
META_BATCH = b"sqs_flight.batch"

_SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")

#: The port of an sqs-flight server when the URL names none.
DEFAULT_PORT = 50051

# The URL rule of the Rust client and CLI (client/src/url.rs), case for
# case (client/src/url_forms.txt): scheme -> TLS or not.
_URL_SCHEMES = {"grpc": False, "grpc+tcp": False, "http": False, "grpc+tls": True, "https": True}

# pyarrow raises FlightError subclasses, but inside some processes (Spark's
# Python workers) the same status surfaces as a plain OSError.
_FLIGHT_ERRORS = (flight.FlightError, pa.ArrowException, OSError)

# pyarrow spells the gRPC status in the message; the server's text follows.
_CODE_PREFIXES = (
    ("invalid argument", "INVALID_ARGUMENT"),
    ("precondition failed", "FAILED_PRECONDITION"),
    ("not found", "NOT_FOUND"),
    ("unauthenticated", "UNAUTHENTICATED"),
    ("unavailable", "UNAVAILABLE"),
    ("timed out", "DEADLINE_EXCEEDED"),
    ("internal", "INTERNAL"),
)


@dataclass(frozen=True)
class Endpoint:
    """One partition of a planned batch: picklable, unlike Flight objects."""

    ticket: bytes
    locations: Tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """A planned batch: GetFlightInfo's answer."""

    table: str
    consumer: str
    batch: int
    endpoints: Tuple[Endpoint, ...]


def check_url(url: Optional[str]) -> str:
    """The Flight URL (``grpc://HOST:PORT`` or ``grpc+tls://HOST:PORT``) of
    ``url``, by the same rule as the ``sqs-flight`` CLI: ``grpc://``,
    ``grpc+tcp://``, ``http://`` and a bare ``HOST[:PORT]`` are plaintext,
    ``grpc+tls://`` and ``https://`` TLS; the port defaults to 50051."""
    if not url:
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            "no server url: pass the sqs-flight server's address, e.g. grpc://127.0.0.1:50051",
        )

    def invalid(reason: str) -> SqsFlightError:
        return SqsFlightError("INVALID_ARGUMENT", f"invalid server URL {json.dumps(url)}: {reason}")

    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "grpc", url
    if scheme not in _URL_SCHEMES:
        raise invalid(f"unsupported scheme {json.dumps(scheme)}; use grpc://HOST:PORT or grpc+tls://HOST:PORT")
    authority = rest[:-1] if rest.endswith("/") else rest
    if not authority or any(c in authority for c in "/?#@ "):
        raise invalid("expected HOST:PORT after the scheme, e.g. grpc://127.0.0.1:50051")
    host, colon, port = authority.rpartition(":")
    if colon and not (authority.endswith("]") and host.startswith("[")):
        if not (port.isascii() and port.isdigit() and int(port) <= 65535):
            raise invalid("the port is not a number")
    else:
        authority = f"{authority}:{DEFAULT_PORT}"
    return f"{'grpc+tls' if _URL_SCHEMES[scheme] else 'grpc'}://{authority}"


def _code_of(error: Exception) -> Tuple[str, str]:
    text = str(error)
    lowered = text.lower()
    for phrase, code in _CODE_PREFIXES:
        if f"returned {phrase} error" in lowered:
            detail = text.split("with message: ", 1)[-1]
            for tail in (". gRPC client debug context:", ". Detail:"):
                detail = detail.split(tail, 1)[0]
            return code, detail.strip()
    if isinstance(error, flight.FlightUnavailableError):
        return "UNAVAILABLE", text
    if isinstance(error, flight.FlightTimedOutError):
        return "DEADLINE_EXCEEDED", text
    return "UNKNOWN", text


def _translate(url: str, what: str, error: Exception, reason: Optional[str] = None) -> SqsFlightError:
    code, detail = _code_of(error)
    # gRPC's own words when no connection could be made; an UNAVAILABLE from
    # the server itself (SQS unreachable) carries the server's message.
    transport = ("failed to connect to all addresses", "dns resolution failed")
    if code == "UNAVAILABLE" and any(t in detail.lower() for t in transport):
        message = (
            f"cannot reach the sqs-flight server at {url} ({detail}): "
            "check the url and that sqs-flight-server is running"
        )
    elif code == "UNAUTHENTICATED":
        message = f"{what} refused by {url}: {detail} (pass the server's auth token)"
    else:
        message = f"{what} failed on {url}: {code}: {detail}"
    return SqsFlightError(code, message, reason=reason)


class Client:
    """A connection to one sqs-flight server.

    ``token`` is sent as ``authorization: Bearer TOKEN`` (or ``token_file``,
    a file holding it, is read once here). For a ``grpc+tls://`` server whose
    certificate a private CA signed (or a self-signed one), ``tls_root_certs``
    is that CA: a PEM file's path, or the PEM itself (bytes, or text starting
    with ``-----BEGIN``); without it the system's roots are trusted. Unary calls
    time out after ``timeout`` seconds; a DoGet is bounded by the batch's own
    ``max_wait_ms`` / ``max_duration_ms`` and, when set, ``read_timeout``.
    """

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        read_timeout: Optional[float] = None,
        tls_root_certs: Union[str, bytes, "os.PathLike[str]", None] = None,
        token_file: Union[str, "os.PathLike[str]", None] = None,
    ):
        self.url = check_url(url)
        if token and token_file:
            raise SqsFlightError("INVALID_ARGUMENT", "pass token or token_file, not both")
        self._token = read_token_file(token_file) if token_file else token
        self._timeout = timeout
        self._read_timeout = read_timeout
        self._root_certs = read_pem(tls_root_certs)
        self._clients: Dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        self._reasons = ReasonCatcher()

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------

    def _flight(self, location: Optional[str] = None) -> flight.FlightClient:
        target = location if location and location.startswith(_SCHEMES) else self.url
        with self._lock:
            client = self._clients.get(target)
            if client is None:
                kwargs = {"tls_root_certs": self._root_certs} if self._root_certs else {}
                client = flight.FlightClient(target, middleware=[self._reasons], **kwargs)
                self._clients[target] = client
            return client

    def _error(self, url: str, what: str, error: Exception) -> SqsFlightError:
        """``error`` of the call this thread just made, with its reason."""
        return _translate(url, what, error, self._reasons.last())

    def _options(self, timeout: Optional[float]) -> flight.FlightCallOptions:
        headers = []
        if self._token:
            headers.append((b"authorization", f"Bearer {self._token}".encode()))
        return flight.FlightCallOptions(timeout=timeout, headers=headers)

    def _action(self, kind: str, body: Dict[str, Any]) -> Dict[str, Any]:
        action = flight.Action(kind, json.dumps(body).encode())
        try:
            results = list(self._flight().do_action(action, self._options(self._timeout)))
        except _FLIGHT_ERRORS as e:
            raise self._error(self.url, f"DoAction {kind}", e) from None
        if not results:
            raise SqsFlightError("INTERNAL", f"DoAction {kind} on {self.url} returned no result")
        return json.loads(results[0].body.to_pybytes())

    # -- the surface ----------------------------------------------------

    def tables(self) -> List[str]:
        """The table names the server serves (ListFlights)."""
        try:
            infos = self._flight().list_flights(options=self._options(self._timeout))
            return [info.descriptor.path[0].decode() for info in infos]
        except _FLIGHT_ERRORS as e:
            raise self._error(self.url, "ListFlights", e) from None

    def schema(self, table: str) -> pa.Schema:
        """The Arrow schema of ``table`` (GetSchema)."""
        descriptor = flight.FlightDescriptor.for_path(table)
        try:
            return self._flight().get_schema(descriptor, self._options(self._timeout)).schema
        except _FLIGHT_ERRORS as e:
            raise self._error(self.url, f"GetSchema of table {table!r}", e) from None

    def plan(self, table: str, consumer: str = DEFAULT_CONSUMER, batch: Optional[int] = None, **limits: Any) -> Plan:
        """Plans a batch (GetFlightInfo); planning it again returns the same tickets.

        ``limits`` are the plan fields of the Flight surface (``partitions``,
        ``max_messages``, ``max_wait_ms``, ``max_bytes``, ``max_duration_ms``,
        ``receivers``);
        ``None`` values are left to the table's configuration.
        """
        command = {"table": table, "consumer": consumer}
        if batch is not None:
            command["batch"] = batch
        command.update({k: v for k, v in limits.items() if v is not None})
        descriptor = flight.FlightDescriptor.for_command(json.dumps(command).encode())
        try:
            info = self._flight().get_flight_info(descriptor, self._options(self._timeout))
        except _FLIGHT_ERRORS as e:
            raise self._error(self.url, f"planning a batch of table {table!r}", e) from None
        meta = json.loads(info.app_metadata) if info.app_metadata else {}
        endpoints = tuple(
            Endpoint(e.ticket.ticket, tuple(loc.uri.decode() for loc in e.locations)) for e in info.endpoints
        )
        return Plan(table, meta.get("consumer", consumer), int(meta.get("batch", batch or 0)), endpoints)

    def stream(self, endpoint: Endpoint) -> Iterator[pa.RecordBatch]:
        """DoGets one ticket, yielding its record batches (possibly none)."""
        location = endpoint.locations[0] if endpoint.locations else None
        try:
            reader = self._flight(location).do_get(flight.Ticket(endpoint.ticket), self._options(self._read_timeout))
            for chunk in reader:
                yield chunk.data
        except _FLIGHT_ERRORS as e:
            raise self._error(location or self.url, "DoGet", e) from None

    def read_endpoint(self, endpoint: Endpoint) -> pa.Table:
        """Reads one ticket whole; the schema is sent even when it has no rows."""
        location = endpoint.locations[0] if endpoint.locations else None
        try:
            reader = self._flight(location).do_get(flight.Ticket(endpoint.ticket), self._options(self._read_timeout))
            return reader.read_all()
        except _FLIGHT_ERRORS as e:
            raise self._error(location or self.url, "DoGet", e) from None

    def read_plan(self, plan: Plan) -> List[pa.Table]:
        """Reads every endpoint of ``plan`` in parallel, one table each."""
        if len(plan.endpoints) <= 1:
            return [self.read_endpoint(e) for e in plan.endpoints]
        with ThreadPoolExecutor(max_workers=len(plan.endpoints)) as pool:
            return list(pool.map(self.read_endpoint, plan.endpoints))

    def read_batch(
        self, table: str, consumer: str = DEFAULT_CONSUMER, batch: Optional[int] = None, **limits: Any
    ) -> pa.Table:
        """Plans (or looks up) a batch and reads all its partitions into one table.

        The result carries the batch in its schema metadata (see
        :func:`batch_of`), so it can be committed once it is processed.
        """
        plan = self.plan(table, consumer, batch, **limits)
        parts = self.read_plan(plan)
        result = pa.concat_tables(parts) if parts else self.schema(table).empty_table()
        meta = dict(result.schema.metadata or {})
        meta.update(
            {
                META_TABLE: plan.table.encode(),
                META_CONSUMER: plan.consumer.encode(),
                META_BATCH: str(plan.batch).encode(),
            }
        )
        return result.replace_schema_metadata(meta)

    def write(
        self,
        table: str,
        data: Any,
        *,
        batch_rows: int = writing.DEFAULT_BATCH_ROWS,
        batch_bytes: int = writing.DEFAULT_BATCH_BYTES,
    ) -> int:
        """Sends every row of ``data`` to ``table`` as one SQS message (DoPut);
        returns how many were sent.

        ``data`` is a pyarrow Table, RecordBatch or RecordBatchReader, anything
        with ``__arrow_c_stream__`` (Polars, DuckDB), a pandas DataFrame, or a
        list of body strings, with a ``body`` column and optionally
        ``message_group_id``, ``message_deduplication_id``, ``delay_seconds``
        and ``message_attributes`` (see :mod:`sqs_flight.writing`). It goes in
        one DoPut call, cut into batches of at most ``batch_rows`` rows and
        ``batch_bytes`` bytes; the server confirms each batch once SQS has it.

        A row SQS can never take (empty or oversized body, no group id on a
        FIFO queue, ...) stops the write there: :class:`SqsFlightError` with
        the server's message, ``.row`` and ``.sent`` (the rows before it were
        sent: SQS has no transactions).
        """
        if batch_rows < 1 or batch_bytes < 1:
            raise ValueError("batch_rows and batch_bytes must be positive")
        reader = writing.as_reader(data)
        what = f"DoPut to table {table!r}"
        sent = 0
        try:
            schema = writing.prepared_schema(reader.schema)
        except ValueError as e:
            raise SqsFlightError("INVALID_ARGUMENT", f"{what}: {e}; nothing was sent", sent=0) from None
        descriptor = flight.FlightDescriptor.for_path(table)
        try:
            writer, results = self._flight().do_put(descriptor, schema, self._options(self._read_timeout))
        except _FLIGHT_ERRORS as e:
            raise self._write_error(what, e, sent) from None
        try:
            for batch in writing.prepared(reader, batch_rows, batch_bytes):
                writer.write_batch(batch)
                answer = results.read()
                if answer is None:
                    break  # the server ended the call; close() raises its status
                sent += writing.parse_sent(answer)
            writer.done_writing()
            writer.close()
        except ValueError as e:
            if isinstance(e, pa.ArrowException):  # ArrowInvalid is a ValueError
                raise self._write_error(what, _status_of_close(writer, e), sent) from None
            _cancel(writer)
            raise SqsFlightError("INVALID_ARGUMENT", f"{what}: {e}; {_rows_sent(sent)} before it", sent=sent) from None
        except _FLIGHT_ERRORS as e:
            raise self._write_error(what, _status_of_close(writer, e), sent) from None
        except BaseException:
            _cancel(writer)
            raise
        return sent

    def _write_error(self, what: str, error: Exception, sent: int) -> SqsFlightError:
        out = self._error(self.url, what, error)
        rows_sent, row = self._reasons.last_put()
        out.sent = sent if rows_sent is None else rows_sent
        out.row = row
        return out

    def commit(
        self,
        table: str,
        consumer: str,
        batch: int,
        *,
        reject: Optional[Sequence[str]] = None,
        reject_delay_seconds: Optional[int] = None,
        reject_payload_errors: bool = False,
    ) -> Dict[str, Any]:
        """Deletes every message of ``consumer`` read in batches <= ``batch``,
        except those it gives back to SQS: the message ids in ``reject`` and,
        with ``reject_payload_errors``, every row whose ``payload_error`` is set.
        They are visible again after ``reject_delay_seconds`` (0 to 43200,
        default 0), with a higher receive count, so a redrive policy moves a
        poison message to its dead-letter queue. Answers ``{"committed_batch",
        "deleted", "expired", "rejected"}``. An id the consumer does not hold
        in an open batch <= ``batch`` fails with INVALID_ARGUMENT and nothing
        changes. The reject keys are sent only when there is something to
        reject."""
        body: Dict[str, Any] = {"table": table, "consumer": consumer, "batch": int(batch)}
        if isinstance(reject, (str, bytes)):
            raise TypeError("reject takes a list of message ids, not one string")
        if reject:
            body["reject"] = list(reject)
        if reject_payload_errors:
            body["reject_payload_errors"] = True
        if reject_delay_seconds is not None and (reject or reject_payload_errors):
            body["reject_delay_seconds"] = int(reject_delay_seconds)
        return self._action("commit", body)

    def release(self, table: str, consumer: str, read_ahead_only: bool = False) -> Dict[str, Any]:
        """Makes every uncommitted message of ``consumer`` visible again now;
        with ``read_ahead_only``, only those of its batch received ahead (its
        open batches stay, to replay)."""
        body: Dict[str, Any] = {"table": table, "consumer": consumer}
        if read_ahead_only:
            body["read_ahead_only"] = True
        return self._action("release", body)

    def status(self, table: Optional[str] = None, max_age_ms: Optional[int] = None) -> Dict[str, Any]:
        """The server's ``status``: depth, in-flight and consumers per table.
        With ``max_age_ms``, queue counts the server read from SQS that long
        ago or less are answered again without an SQS call."""
        body: Dict[str, Any] = {} if table is None else {"table": table}
        if max_age_ms is not None:
            body["max_age_ms"] = int(max_age_ms)
        return self._action("status", body)


def _rows_sent(n: int) -> str:
    return "1 row was sent" if n == 1 else f"{n} rows were sent"


def _status_of_close(writer: Any, error: Exception) -> Exception:
    """The call's own status: after the server ends a DoPut with an error,
    writing raises a transport error and ``close()`` the server's status."""
    try:
        writer.close()
    except _FLIGHT_ERRORS as status:
        return status
    return error


def _cancel(writer: Any) -> None:
    """Ends a DoPut the client gives up on, without waiting for the server."""
    try:
        writer.close()
    except Exception:
        pass


def batch_of(table: pa.Table) -> int:
    """The batch number :func:`read_batch` stored on ``table``."""
    meta = table.schema.metadata or {}
    if META_BATCH not in meta:
        raise ValueError("this table was not returned by sqs_flight.read_batch: it names no batch")
    return int(meta[META_BATCH])
