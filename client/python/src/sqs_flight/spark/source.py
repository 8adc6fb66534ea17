"""The data source of format ``sqs-flight``: options in, readers and
writers out."""

from __future__ import annotations

from typing import Tuple

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

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
        driver.check_workers_python()
        return "sqs-flight"

    def _read_options(self, default_consumer: str) -> Options:
        """The options of a read, connected: in managed mode, its server is
        found or started here, on the driver, once per call of Spark's."""
        return driver.connect(Options.parse(self.options, default_consumer, self.extra_options))

    def schema(self) -> StructType:
        o = self._read_options("spark-{table}")
        return spark_schema(driver.reconnecting(o, "schema", lambda c: c.schema(o.table)))

    def streamReader(self, schema: StructType) -> SqsFlightStreamReader:
        return SqsFlightStreamReader(self._read_options("spark-{table}"), schema)

    def reader(self, schema: StructType) -> SqsFlightBatchReader:
        return SqsFlightBatchReader(self._read_options("spark-batch-{table}"), schema)

    def writer(self, schema: StructType, overwrite: bool) -> SqsFlightBatchWriter:
        return SqsFlightBatchWriter(_writer_options(self.options, schema, overwrite, self.extra_options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> SqsFlightStreamWriter:
        return SqsFlightStreamWriter(_writer_options(self.options, schema, overwrite, self.extra_options), schema)
