"""A streaming table fed by an SQS queue through sqs-flight.

Each pipeline update runs the flow with Trigger.AvailableNow: it drains what
the queue holds in as many micro-batches as the limits need, and the server
deletes each batch only once the pipeline's checkpoint has committed it.
`spark` is provided by spark-pipelines.
"""

from pyspark import pipelines as dp
from pyspark.sql import functions as F

URL = spark.conf.get("sqs_flight.url")  # noqa: F821
TABLE = spark.conf.get("sqs_flight.table")  # noqa: F821


@dp.table(comment="Raw SQS messages of the orders queue, one row per message")
def orders_raw():
    return (
        spark.readStream.format("sqs-flight")  # noqa: F821
        .option("url", URL)
        .option("table", TABLE)
        # One consumer per streaming table: its batches are committed by this flow only.
        .option("consumer", "pipeline-orders_raw")
        .option("maxRowsPerBatch", "5000")
        .load()
        .withColumn("ingested_at", F.current_timestamp())
    )
