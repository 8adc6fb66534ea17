"""Spark 4's automatic registration of the ``sqs-flight`` data source.

At the first data source call of a session, Spark 4 imports every
installed top-level module whose name starts with ``pyspark_`` and registers
its ``DefaultSource`` under the name that source gives (pyspark's
``sql/worker/lookup_data_sources.py``). This module is that hook, so
``spark.readStream.format("sqs-flight")`` and ``df.write.format("sqs-flight")``
work with no ``spark.dataSource.register(...)`` call: in classic Spark,
through Spark Connect, and in Spark Declarative Pipelines. Spark before 4.0
has no such lookup (nor the Python DataSource API).

Spark imports it in its Python workers, with the workers' interpreter
(``PYSPARK_PYTHON``): where that interpreter lacks ``sqs-flight``, the format
is not found (``DATA_SOURCE_NOT_FOUND``). ``register()`` names that fix
itself (see ``sqs_flight.spark.driver.check_workers_python``).

Spark's lookup imports every ``pyspark_*`` module in one loop, so an import
error here would hide every other such source too: a pyspark without the
Python DataSource API leaves ``DefaultSource`` undefined instead (Spark then
skips this module), and the reason is kept in ``IMPORT_ERROR``.
"""

from typing import Optional

#: Why ``DefaultSource`` is missing, if it is.
IMPORT_ERROR: Optional[ImportError] = None

try:
    from sqs_flight.spark.source import SqsFlightDataSource as DefaultSource
except ImportError as e:  # pragma: no cover - depends on the environment
    IMPORT_ERROR = e
else:
    __all__ = ["DefaultSource"]
