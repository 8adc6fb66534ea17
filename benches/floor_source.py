"""The floor of figure 4: a PySpark Python streaming data source (format
``floor-sqs``) whose ``read()`` does no I/O at all. It yields rows that the
sqs-flight server produced once, before the run, from an Arrow IPC file.

Spark drives it exactly like the two sources it is measured beside: the
same number of micro-batches, partitions and rows per partition, the same
columns, the same noop sink. Its wall clock is what Spark itself costs on
this machine (query start, offset and commit logs, planning, Python
workers, Arrow to rows). No source that reads SQS can finish faster, so
``boto3 time / floor time`` bounds the ratio any source can reach here.

Options: ``rowsFile`` (an Arrow IPC stream of one partition's rows),
``partitions``, ``batches`` (micro-batches to produce).
"""

from __future__ import annotations

from typing import Iterator, List, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType


def _rows(path: str) -> pa.Table:
    with pa.OSFile(path, "rb") as f:
        return pa.ipc.open_stream(f).read_all()


class FloorPartition(InputPartition):
    def __init__(self, index: int):
        self.index = index


class FloorStreamReader(DataSourceStreamReader):
    def __init__(self, options, schema: StructType):
        self.rows_file = options["rowsFile"]
        self.partitions_n = int(options.get("partitions", "2"))
        self.batches = int(options["batches"])
        self.schema = schema
        self.current = 0

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: Optional[dict] = None, limit=None) -> dict:
        if self.current < self.batches:
            self.current += 1
        return {"batch": self.current}

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        if end["batch"] <= start["batch"]:
            return []
        return [FloorPartition(i) for i in range(self.partitions_n)]

    def read(self, partition: FloorPartition) -> Iterator[pa.RecordBatch]:
        from sqs_flight.spark import arrow_schema, conform

        target = arrow_schema(self.schema)
        table = _rows(self.rows_file).select(target.names).combine_chunks()
        for batch in table.to_batches():
            yield conform(batch, target)  # as the sqs-flight source hands its rows to Spark

    def commit(self, end: dict) -> None:
        pass


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "floor-sqs"

    def schema(self) -> StructType:
        from sqs_flight.spark import spark_schema

        return spark_schema(_rows(self.options["rowsFile"]).schema)

    def streamReader(self, schema: StructType) -> FloorStreamReader:
        return FloorStreamReader(self.options, schema)
