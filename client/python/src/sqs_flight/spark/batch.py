"""The batch reader of format ``sqs-flight`` (``spark.read``)."""

from __future__ import annotations

from typing import Iterator, List

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .arrow import arrow_schema, conform
from .entry import SparkEntryPoints
from .options import Options


class RowsPartition(InputPartition):
    """Rows already read by the batch reader on the driver (Arrow IPC bytes)."""

    def __init__(self, ipc: bytes):
        self.ipc = ipc


class SqsFlightBatchReader(SparkEntryPoints, DataSourceReader):
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
        # One batch and done: nothing to read ahead for.
        plan = client.plan(o.table, o.consumer, None, **{**o.plan_limits(), "read_ahead": 0})
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
