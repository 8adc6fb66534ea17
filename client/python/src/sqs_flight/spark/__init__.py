"""A PySpark data source (format ``sqs-flight``) that reads SQS through an
sqs-flight server, for Structured Streaming, Spark Declarative Pipelines /
Databricks DLT, and one-off batch reads.

    df = (spark.readStream.format("sqs-flight")
          .option("url", "grpc://127.0.0.1:50051").option("table", "orders")
          .load())

Spark 4 registers it by itself through the top-level module
:mod:`pyspark_sqs_flight` (its ``DefaultSource``); where Spark does not,
``spark.dataSource.register(SqsFlightDataSource)`` does, and checks that
Spark's Python workers can import this package (:func:`check_workers_python`).

# Layout

* :mod:`~sqs_flight.spark.source`: the data source, options in, readers
  and writers out;
* :mod:`~sqs_flight.spark.options`: the options, checked into plain data
  that pickles (parsing starts nothing);
* :mod:`~sqs_flight.spark.driver`: the driver side: the managed server,
  started in one place (``connect``), its watchdog, the clients, calls
  tried again while the server is unreachable, the workers' Python check;
* :mod:`~sqs_flight.spark.master`: Spark's master as the driver side sees
  it (a local one keeps a managed server on loopback);
* :mod:`~sqs_flight.spark.stream`: the stream reader, its offsets and its
  commit thread (the module doc says how a micro-batch maps to the server);
* :mod:`~sqs_flight.spark.limits`: the stream reader's read limits (caps
  of a micro-batch, the minimum it waits for) and how they combine;
* :mod:`~sqs_flight.spark.batch`: the batch reader;
* :mod:`~sqs_flight.spark.sink`: the sink's checks and both writers;
* :mod:`~sqs_flight.spark.arrow`: Spark types, and the batches handed to Spark;
* :mod:`~sqs_flight.spark.entry`: short tracebacks on what Spark calls.
"""

from __future__ import annotations

try:
    import pyspark.sql.datasource  # noqa: F401 - the Python DataSource API, needed by every module here
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sqs_flight.spark needs pyspark >= 4.0 (the Python DataSource API): pip install 'sqs-flight[spark]'"
    ) from e

# The names tests and programs import from sqs_flight.spark, beside the
# data source's classes in __all__ (re-exports: ruff's F401 is off here).
from .arrow import SPARK_BATCH_BYTES, SPARK_BATCH_ROWS, arrow_schema, conform, rebatch, spark_schema, spark_type
from .batch import RowsPartition, SqsFlightBatchReader
from .driver import _CHECKED_PYTHONS, check_workers_python
from .options import (
    DEFAULT_RECONNECT_S,
    MANAGED_OPTIONS,
    READ_OPTIONS,
    WRITE_OPTIONS,
    Options,
    WriteOptions,
    check_option_names,
)
from .sink import SentMessage, SqsFlightBatchWriter, SqsFlightStreamWriter, _rows_to_batches, check_write_schema
from .source import SqsFlightDataSource
from .stream import DEFAULT_PARTITIONS, FlightPartition, SqsFlightStreamReader

__all__ = [
    "SqsFlightDataSource",
    "SqsFlightStreamReader",
    "SqsFlightBatchReader",
    "SqsFlightBatchWriter",
    "SqsFlightStreamWriter",
    "FlightPartition",
    "SentMessage",
]
