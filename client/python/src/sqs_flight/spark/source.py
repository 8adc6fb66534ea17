"""The data source of format ``sqs-flight``: options in, readers and
writers out."""

from __future__ import annotations

from typing import Tuple

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from ..client import SqsFlightError
from . import driver
from .arrow import spark_schema
from .batch import SqsFlightBatchReader
from .entry import SparkEntryPoints
from .options import Options
from .sink import SqsFlightBatchWriter, SqsFlightStreamWriter, _writer_options
from .stream import SqsFlightStreamReader


class SqsFlightDataSource(SparkEntryPoints, DataSource):
    """Format ``sqs-flight``. Options: ``url``, ``table`` (required);
    ``consumer`` (stream default ``spark-<table>``, batch default
    ``spark-batch-<table>``), ``partitions``, ``maxMessagesPerPartition``,
    ``maxWaitMs``, ``maxBytesPerPartition``, ``maxDurationMs``,
    ``receiversPerPartition``, ``maxRowsPerBatch``, ``maxBytesPerBatch``,
    ``minRowsPerBatch`` with ``maxTriggerDelay`` (streaming read limits,
    pyspark >= 4.2), ``rejectPayloadErrors`` (streaming), ``token`` or
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
        # spark.dataSource.register() calls name() on the driver first, where
        # the workers' Python is checked. Spark 4's own lookup
        # (pyspark_sqs_flight) calls it in a worker, where there is no
        # SparkContext and nothing to check: that worker imported us.
        driver.check_workers_python()
        return "sqs-flight"

    def _read_options(self, default_consumer: str, streaming: bool = True) -> Options:
        """The options of a read, connected: in managed mode, its server is
        found or started here, on the driver, once per call of Spark's."""
        return driver.connect(Options.parse(self.options, default_consumer, self.extra_options, streaming=streaming))

    def schema(self) -> StructType:
        o = self._read_options("spark-{table}")
        return spark_schema(_table_schema(o))

    def streamReader(self, schema: StructType) -> SqsFlightStreamReader:
        o = self._read_options("spark-{table}")
        if o.reject_payload_errors:
            _table_schema(o)  # the table decides, whatever columns the query's schema keeps
        return SqsFlightStreamReader(o, schema)

    def reader(self, schema: StructType) -> SqsFlightBatchReader:
        return SqsFlightBatchReader(self._read_options("spark-batch-{table}", streaming=False), schema)

    def writer(self, schema: StructType, overwrite: bool) -> SqsFlightBatchWriter:
        return SqsFlightBatchWriter(_writer_options(self.options, schema, overwrite, self.extra_options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> SqsFlightStreamWriter:
        return SqsFlightStreamWriter(_writer_options(self.options, schema, overwrite, self.extra_options), schema)


def _table_schema(o: Options) -> pa.Schema:
    """The table's schema; refuses ``rejectPayloadErrors`` on a table
    without a ``payload_error`` column (a typed payload, or large payloads
    read): nothing would tell which rows to hand back."""
    schema = driver.reconnecting(o, "schema", lambda c: c.schema(o.table))
    if o.reject_payload_errors and "payload_error" not in schema.names:
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            (
                f'sqs-flight source: option "rejectPayloadErrors" needs a table with a typed payload or large '
                f'payloads read (a payload_error column), and table "{o.table}" has none: declare '
                f"[tables.{o.table}.payload] (or [tables.{o.table}.large_payloads] with read = true) in the "
                "server's configuration, or drop the option"
            ),
        )
    return schema
