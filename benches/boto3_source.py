"""The baseline of figure 4: a PySpark Python streaming data source (format
``boto3-sqs``) that calls boto3 in ``read()``, the way SQS sources are
commonly written without a server in between.

Each micro-batch has ``partitions`` partitions; ``read()`` runs on an
executor, receives up to ``maxMessagesPerPartition`` messages with
``receive_message(MaxNumberOfMessages=10)`` (every attribute, as the
sqs-flight server asks for) and deletes each receive with
``delete_message_batch`` right away: at-most-once, the very problem
sqs-flight solves, but the fastest thing a boto3 reader can do.
``latestOffset`` moves on while the queue reports visible messages.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

SCHEMA = StructType(
    [
        StructField("message_id", StringType(), False),
        StructField("body", StringType(), False),
        StructField("sent_timestamp", LongType(), True),
        StructField("receive_count", IntegerType(), True),
    ]
)


def _client(endpoint: Optional[str]):
    import boto3

    return boto3.client("sqs", endpoint_url=endpoint or None, region_name="us-east-1")


class Boto3Partition(InputPartition):
    def __init__(self, index: int):
        self.index = index


class Boto3StreamReader(DataSourceStreamReader):
    def __init__(self, options):
        self.queue_url = options["queueUrl"]
        self.endpoint = options.get("endpoint")
        self.partitions_n = int(options.get("partitions", "2"))
        self.per_partition = int(options.get("maxMessagesPerPartition", "1000"))
        self.current = 0
        self._sqs = None

    def __getstate__(self):
        # The driver's boto3 client (locks inside) stays on the driver.
        state = dict(self.__dict__)
        state["_sqs"] = None
        return state

    @property
    def sqs(self):
        if self._sqs is None:
            self._sqs = _client(self.endpoint)
        return self._sqs

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: Optional[dict] = None, limit=None) -> dict:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        if int(attrs["ApproximateNumberOfMessages"]) > 0:
            self.current += 1
        return {"batch": self.current}

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        if end["batch"] <= start["batch"]:
            return []
        return [Boto3Partition(i) for i in range(self.partitions_n)]

    def read(self, partition: Boto3Partition) -> Iterator[Tuple]:
        sqs = _client(self.endpoint)
        got = 0
        while got < self.per_partition:
            out = sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, self.per_partition - got),
                WaitTimeSeconds=0,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            messages = out.get("Messages", [])
            if not messages:
                return
            for m in messages:
                a = m.get("Attributes", {})
                yield (
                    m["MessageId"],
                    m["Body"],
                    int(a["SentTimestamp"]) if "SentTimestamp" in a else None,
                    int(a["ApproximateReceiveCount"]) if "ApproximateReceiveCount" in a else None,
                )
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            got += len(messages)

    def commit(self, end: dict) -> None:
        pass


class Boto3SqsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "boto3-sqs"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> Boto3StreamReader:
        return Boto3StreamReader(self.options)
