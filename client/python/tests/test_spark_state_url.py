"""Managed mode with ``stateUrl``: a query restarted as on a new cluster
(its managed server killed, its ``stateDir`` abandoned, a new one given,
the same checkpoint and ``stateUrl``) lands every message exactly once in
a sink that skips a batch id it has written, as Delta's does. Real PySpark
in local mode, moto as SQS and S3 (the state log's bucket)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Dict, List, Tuple

import boto3
import pytest

from conftest import bodies
from support import QUERY_TIMEOUT_S, gone, record, run_available_now, wait_for

N = 600
VISIBILITY_S = 15


def managed(spark, moto, queue: str, state_dir: Path, state_url: str):
    return (
        spark.readStream.format("sqs-flight")
        .option("queueUrl", queue)
        .option("sqsEndpoint", moto.endpoint)
        .option("s3Endpoint", moto.endpoint)
        .option("region", "us-east-1")
        .option("stateDir", str(state_dir))
        .option("stateUrl", state_url)
        .option("maxWaitMs", "500")
        # moto's ReceiveMessage is not atomic (conftest.start_server): one receiver.
        .option("partitions", "1")
        .option("receiversPerPartition", "1")
        .option("maxMessagesPerPartition", "100")
        .load()
    )


class Sink:
    """Rows by batch id; a batch id written once is skipped after."""

    def __init__(self) -> None:
        self.batches: Dict[int, List[Tuple[str, str]]] = {}

    def write(self, df, batch_id: int) -> None:
        if batch_id in self.batches:
            return
        self.batches[batch_id] = [(r.message_id, r.body) for r in df.select("message_id", "body").collect()]

    def rows(self) -> List[Tuple[str, str]]:
        return [row for rows in list(self.batches.values()) for row in rows]


def kill_server(state_dir: Path) -> None:
    """Kills the managed server; its directory is left as it is, abandoned
    as a cluster that goes leaves its disk. The first run's reader, in
    this process, must not start it again: it would take the stateUrl
    over from the server of the second run."""
    pid = record(state_dir)["pid"]
    os.kill(pid, signal.SIGKILL)
    assert gone(pid)


@pytest.mark.parametrize("stop", ["between_triggers", "after_the_sink_wrote"])
def test_a_query_restarted_on_a_new_state_dir_with_its_state_url_lands_every_message_once(
    spark, moto, tmp_path, stop: str
):
    # Short enough that what a receive cut by the kill took (never
    # recorded, so a redelivery, not a loss) comes back during the test.
    queue = moto.new_queue("state-url", visibility_timeout=VISIBILITY_S)
    sent = bodies(N, "state-url")
    moto.send(queue, sent, threads=8)
    bucket = f"state-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    state_url = f"s3://{bucket}/checkpoints/orders/sqs-flight"
    checkpoint = tmp_path / "ck"
    sink = Sink()
    first_dir = tmp_path / "first"

    class Crash(Exception):
        pass

    def write(df, batch_id: int) -> None:
        sink.write(df, batch_id)
        # The driver dies right after the sink wrote a batch: Spark's commit
        # log never records it, and the server goes with the driver.
        if stop == "after_the_sink_wrote" and len(sink.rows()) >= 200:
            kill_server(first_dir)
            raise Crash("the driver dies here")

    query = (
        managed(spark, moto, queue, first_dir, state_url)
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        if stop == "between_triggers":
            wait_for("200 rows in the sink", lambda: len(sink.rows()) >= 200, QUERY_TIMEOUT_S, query)
        else:
            with pytest.raises(Exception, match="the driver dies here"):
                query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        query.stop()
    if stop == "between_triggers":
        kill_server(first_dir)
    landed = len(sink.rows())
    assert 200 <= landed < N, f"the first run stopped part way: {landed}"

    # A new cluster: a new stateDir, the same checkpoint and stateUrl.
    second_dir = tmp_path / "second"
    # AvailableNow stops at the backlog it saw at its start: run it again
    # until the messages a cut receive took are back and read.
    deadline = time.monotonic() + 10 * VISIBILITY_S
    while True:
        query = managed(spark, moto, queue, second_dir, state_url).writeStream.foreachBatch(sink.write)
        run_available_now(query, checkpoint)
        if len(sink.rows()) >= N or time.monotonic() > deadline:
            break
        time.sleep(1)
    got = sink.rows()
    assert len({mid for mid, _ in got}) == len(got), "no message twice in the sink"
    assert sorted(body for _, body in got) == sorted(sent), "every message once"
    assert moto.counts(queue) == {"visible": 0, "in_flight": 0}
    os.kill(record(second_dir)["pid"], signal.SIGTERM)
