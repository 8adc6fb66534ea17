"""The sink of format ``sqs-flight``: ``df.write`` and ``df.writeStream``
send each task's rows in one DoPut, after the columns, the mode and the
table are checked on the driver."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import ByteType, DataType, IntegerType, LongType, MapType, ShortType, StringType, StructType

from .. import writing
from ..client import SqsFlightError
from .arrow import arrow_schema
from .entry import SparkEntryPoints
from .options import WriteOptions, bad_sink

try:  # pyspark >= 4.1: the stream writer gets Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    _STREAM_WRITER_BASE: type = DataSourceStreamArrowWriter
except ImportError:  # pyspark 4.0: rows, turned into Arrow here
    DataSourceStreamArrowWriter = None  # type: ignore[assignment,misc]
    _STREAM_WRITER_BASE = DataSourceStreamWriter

_log = logging.getLogger("sqs_flight.spark")


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
        raise bad_sink(
            f"the DataFrame has no {writing.BODY!r} column (string), the message body; its columns: "
            f"{', '.join(names) or 'none'}. Build one, e.g. "
            'df.selectExpr("to_json(struct(*)) AS body")'
        )
    unknown = [n for n in names if n not in _WRITE_TYPES]
    if unknown:
        raise bad_sink(
            f"column(s) {', '.join(repr(n) for n in unknown)} are not message fields: the sink "
            f"sends only {', '.join(writing.COLUMNS)}; select those first, e.g. "
            f"df.select({', '.join(repr(n) for n in names if n in _WRITE_TYPES)})"
        )
    for f in schema.fields:
        if not _type_ok(f.name, f.dataType):
            raise bad_sink(f"column {f.name!r} is {f.dataType.simpleString()}, expected {_WRITE_TYPE_NAMES[f.name]}")


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
            e.code,
            f"sqs-flight sink, Spark partition {partition}: {e} (rows are numbered within "
            "the partition; the rows sent before it stay in the queue)",
            sent=e.sent,
            row=e.row,
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
            columns[writing.ATTRIBUTES] = [None if m is None else list(m.items()) for m in columns[writing.ATTRIBUTES]]
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
        raise bad_sink(
            'a queue can only be appended to: use mode "append" (batch) or output mode '
            '"append"/"update" (streaming); the sink never deletes messages'
        )
    check_write_schema(schema)
    o.client().schema(o.table)  # NOT_FOUND, naming the known tables, before any task runs
    return o


class SqsFlightBatchWriter(SparkEntryPoints, DataSourceArrowWriter):
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
            "were sent and stay in the queue",
            self._o.table,
            sent,
        )


class SqsFlightStreamWriter(SparkEntryPoints, _STREAM_WRITER_BASE):  # type: ignore[misc,valid-type]
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
            "finished were sent and stay in the queue",
            batchId,
            self._o.table,
            sent,
        )
