"""sqs-flight for Python: Amazon SQS queues read as Arrow tables through an
sqs-flight server (pyarrow.flight), with deletes gated on your commit.

One-call helpers for DuckDB, Polars and pandas::

    import sqs_flight
    t = sqs_flight.read_batch("grpc://127.0.0.1:50051", "orders", consumer="etl")
    ...                                   # process t (a pyarrow.Table)
    sqs_flight.commit("grpc://127.0.0.1:50051", "orders", "etl", sqs_flight.batch_of(t))

Writing sends each row of a table (a ``body`` column, optionally
``message_group_id``, ``message_deduplication_id``, ``delay_seconds``,
``message_attributes``) as one SQS message::

    n = sqs_flight.write("grpc://127.0.0.1:50051", "orders", polars_df)

A server of your own, from the ``sqs-flight-server`` wheel (``pip install
"sqs-flight[server]"``), stopped with the ``with`` block or the interpreter::

    with sqs_flight.serve({"orders": queue_url}) as server:
        t = sqs_flight.read_batch(server.url, "orders", consumer="etl")

Re-reading the same batch (``batch=`` the same number) replays the same rows
until it is committed; nothing leaves SQS before the commit. The Spark source
is :class:`sqs_flight.spark.SqsFlightDataSource`.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Sequence, Tuple

import pyarrow as pa

from .client import (
    DEFAULT_CONSUMER,
    DEFAULT_TIMEOUT_S,
    Client,
    Endpoint,
    Plan,
    SqsFlightError,
    batch_of,
)
from .serve import Server, ServerError, serve
from .writing import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS

__all__ = [
    "Client",
    "Endpoint",
    "Plan",
    "Server",
    "ServerError",
    "SqsFlightError",
    "batch_of",
    "client",
    "commit",
    "read_batch",
    "release",
    "serve",
    "status",
    "write",
]

__version__ = "0.1.0"

_CACHE: Dict[Tuple[Any, ...], Client] = {}
_CACHE_LOCK = threading.Lock()


def client(
    url: str,
    *,
    token: Optional[str] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    read_timeout: Optional[float] = None,
    tls_root_certs: Optional[str] = None,
) -> Client:
    """A :class:`Client` for ``url``, shared by every call with the same settings."""
    key = (url, token, timeout, read_timeout, tls_root_certs)
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is None:
            found = Client(
                url,
                token=token,
                timeout=timeout,
                read_timeout=read_timeout,
                tls_root_certs=tls_root_certs,
            )
            _CACHE[key] = found
        return found


def read_batch(
    url: str,
    table: str,
    consumer: str = DEFAULT_CONSUMER,
    batch: Optional[int] = None,
    *,
    token: Optional[str] = None,
    **limits: Any,
) -> pa.Table:
    """Reads one batch of ``table`` for ``consumer`` into a pyarrow Table.

    ``batch=None`` plans the consumer's next batch; ``limits`` are
    ``partitions``, ``max_messages`` (per partition), ``max_wait_ms``,
    ``max_bytes``, ``max_duration_ms``, ``receivers`` (ReceiveMessage calls
    in flight per partition). The messages stay invisible in SQS
    until :func:`commit` (or come back after :func:`release`).
    """
    return client(url, token=token).read_batch(table, consumer, batch, **limits)


def commit(
    url: str,
    table: str,
    consumer: str,
    batch: int,
    *,
    token: Optional[str] = None,
    reject: Optional[Sequence[str]] = None,
    reject_delay_seconds: Optional[int] = None,
    reject_payload_errors: bool = False,
) -> Dict[str, Any]:
    """Deletes what ``consumer`` read in batches <= ``batch``, but for what
    it gives back to SQS (see :meth:`Client.commit`):
    ``{"committed_batch", "deleted", "expired", "rejected"}``."""
    return client(url, token=token).commit(
        table,
        consumer,
        batch,
        reject=reject,
        reject_delay_seconds=reject_delay_seconds,
        reject_payload_errors=reject_payload_errors,
    )


def release(url: str, table: str, consumer: str, *, token: Optional[str] = None) -> Dict[str, Any]:
    """Makes every uncommitted message of ``consumer`` visible again: ``{"released"}``."""
    return client(url, token=token).release(table, consumer)


def status(
    url: str, table: Optional[str] = None, *, token: Optional[str] = None, max_age_ms: Optional[int] = None
) -> Dict[str, Any]:
    """The server's status (depth, in-flight and consumers per table); with
    ``max_age_ms``, queue counts up to that old, answered without an SQS call."""
    return client(url, token=token).status(table, max_age_ms=max_age_ms)


def write(
    url: str,
    table: str,
    data: Any,
    token: Optional[str] = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> int:
    """Sends each row of ``data`` to ``table`` as one SQS message; returns
    how many were sent.

    ``data``: a pyarrow Table / RecordBatch / RecordBatchReader, anything with
    ``__arrow_c_stream__`` (a Polars DataFrame, a DuckDB result), a pandas
    DataFrame, or a list of body strings. Columns: ``body`` (required),
    ``message_group_id``, ``message_deduplication_id``, ``delay_seconds``,
    ``message_attributes``. A row SQS cannot take raises
    :class:`SqsFlightError` with the server's message, ``.row`` and
    ``.sent`` (the rows before it were sent). See :meth:`Client.write`.
    """
    return client(url, token=token).write(table, data, batch_rows=batch_rows, batch_bytes=batch_bytes)
