"""``rejectPayloadErrors`` end to end: a poison message (a body the table's
payload cannot decode) on a moto queue with a redrive policy is left out of
every micro-batch and handed back to SQS at each commit, until SQS moves it
to the dead-letter queue after ``maxReceiveCount`` receives, while every
other message lands in the sink exactly once. Real PySpark, the real server
binary, moto (which implements the redrive policy). The read side alone is
tested in test_stream_limits.py."""

from __future__ import annotations

import json
import uuid
from typing import List

from support import PAYLOAD_TOML, run_available_now

MAX_RECEIVE_COUNT = 2


def redriven_queue(moto) -> tuple:
    """A queue whose messages move to a fresh dead-letter queue after
    MAX_RECEIVE_COUNT receives: (queue URL, DLQ URL)."""
    name = f"reject-{uuid.uuid4().hex[:10]}"
    dlq = moto.sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    arn = moto.sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": str(MAX_RECEIVE_COUNT)})
    attrs = {"VisibilityTimeout": "600", "RedrivePolicy": policy}
    return moto.sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"], dlq


def test_a_poison_message_reaches_the_dlq_and_every_other_message_lands_once(spark, moto, start_server, tmp_path):
    qurl, dlq = redriven_queue(moto)
    good = [json.dumps({"n": i}) for i in range(8)]
    poison = "not json {"
    assert moto.send(qurl, good + [poison]) == 9
    config = tmp_path / "server.toml"
    config.write_text(PAYLOAD_TOML.format(queue_url=qurl))
    server = start_server(moto, {}, "--config", str(config))

    landed: List[str] = []
    errors: List[str] = []

    def sink(df, batch_id: int) -> None:
        rows = df.select("body", "payload_error").collect()
        landed.extend(r.body for r in rows)
        errors.extend(r.payload_error for r in rows if r.payload_error is not None)

    runs = 0
    # Each run hands the poison message back; SQS moves it after
    # MAX_RECEIVE_COUNT receives, so a few runs are enough (one run may
    # receive it more than once: it is visible again at once).
    while moto.counts(dlq)["visible"] == 0 and runs < 2 * MAX_RECEIVE_COUNT + 2:
        stream = (
            spark.readStream.format("sqs-flight")
            .option("url", server.url)
            .option("table", "events")
            .option("partitions", "1")
            .option("maxWaitMs", "500")
            .option("rejectPayloadErrors", "true")
            .load()
        )
        run_available_now(stream.writeStream.foreachBatch(sink), tmp_path / "ck")
        runs += 1

    assert runs >= 1
    assert [m["body"] for m in moto.receive_all(dlq, expect=1)] == [poison], "the poison message is in the DLQ"
    assert sorted(landed) == sorted(good), "every other message landed exactly once"
    assert errors == [], "no row with a payload error reached the sink"
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 0}
