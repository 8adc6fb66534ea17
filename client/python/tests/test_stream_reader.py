"""The stream reader's offset rules (pyspark >= 4.2 API), called directly the
way Spark's driver calls them, against moto through the real server. The
Spark runs in test_spark_stream.py show the same rules end to end."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

import sqs_flight
from sqs_flight.spark import Options, SqsFlightStreamReader, spark_schema
from sqs_flight.spark.stream import RECEIVES_WAIT_MARGIN_S

from conftest import bodies, poll


@pytest.fixture
def setup(moto, start_server):
    qurl = moto.new_queue("reader")
    server = start_server(moto, {"orders": qurl})

    def reader(**options: str) -> SqsFlightStreamReader:
        opts = {"url": server.url, "table": "orders", "partitions": "1", "maxWaitMs": "300", **options}
        schema = spark_schema(sqs_flight.client(server.url).schema("orders"))
        return SqsFlightStreamReader(Options.parse(opts, "spark-{table}"), schema)

    return moto, qurl, server.url, reader


def rows(r: SqsFlightStreamReader, start: dict, end: dict) -> int:
    return sum(b.num_rows for p in r.partitions(start, end) for b in r.read(p))


def consumer(url: str) -> dict:
    return sqs_flight.status(url, "orders")["tables"]["orders"]["consumers"].get("spark-orders", {})


def test_an_empty_table_gives_no_new_offset_and_plans_nothing(setup):
    _, _, url, reader = setup
    r = reader()
    start = r.initialOffset()
    assert start == {"batch": 0}
    assert r.latestOffset(start, ReadAllAvailable()) == start
    assert r.partitions(start, start) == []
    assert consumer(url).get("last_planned_batch") is None


def test_read_max_rows_caps_the_planned_batch(setup):
    moto, qurl, _, reader = setup
    moto.send(qurl, bodies(20))
    r = reader(maxRowsPerBatch="5")
    assert r.getDefaultReadLimit() == ReadMaxRows(5)
    end = r.latestOffset({"batch": 0}, ReadMaxRows(5))
    assert end == {"batch": 1}
    assert rows(r, {"batch": 0}, end) == 5


def test_latest_offset_commits_its_start_and_nothing_newer(setup):
    moto, qurl, url, reader = setup
    moto.send(qurl, bodies(12))
    r = reader(maxMessagesPerPartition="6", readAhead="0", receiveAtPlan="0")
    first = r.latestOffset({"batch": 0}, ReadAllAvailable())
    assert rows(r, {"batch": 0}, first) == 6
    second = r.latestOffset(first, ReadAllAvailable())
    assert second == {"batch": 2}
    r.wait_for_commits()  # the commit runs on the reader's commit thread
    assert consumer(url)["committed_batch"] == 1
    assert moto.counts(qurl) == {"visible": 6, "in_flight": 0}, "batch 1 deleted, batch 2 not yet read"
    assert rows(r, first, second) == 6
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 6}, "batch 2 stays until Spark commits it"


def test_by_default_a_trigger_s_batch_is_received_at_its_plan_and_its_tasks_stream_that(setup):
    moto, qurl, url, reader = setup
    moto.send(qurl, bodies(12))
    r = reader(maxMessagesPerPartition="6", readAhead="0")
    first = r.latestOffset({"batch": 0}, ReadAllAvailable())
    # No task has read yet: the plan's own receive took the batch's 6.
    poll("the plan's receive", lambda: moto.counts(qurl) == {"visible": 6, "in_flight": 6}, 20)
    (partition,) = r.partitions({"batch": 0}, first)
    read = [b for b in r.read(partition)]
    assert sum(b.num_rows for b in read) == 6
    replay = [b for b in r.read(partition)]
    assert pa.Table.from_batches(replay).equals(pa.Table.from_batches(read)), "a retried task replays them"
    r.latestOffset(first, ReadAllAvailable())  # commits batch 1
    r.wait_for_commits()
    assert consumer(url)["committed_batch"] == 1


@pytest.fixture
def counted(moto, fault_proxy, start_server):
    """A reader of 4 messages on moto, reached through sqsf-fault-proxy
    (no fault: it counts the calls), and the GetQueueAttributes count."""
    qurl = moto.new_queue("reader-calls")
    moto.send(qurl, bodies(4))
    proxy = fault_proxy(moto, "duplicate-receives", share=0.0)
    server = start_server(proxy, {"orders": qurl})
    opts = {"url": server.url, "table": "orders", "partitions": "1", "maxWaitMs": "300"}
    schema = spark_schema(sqs_flight.client(server.url).schema("orders"))
    r = SqsFlightStreamReader(Options.parse(opts, "spark-{table}"), schema)
    return r, lambda: proxy.count("GetQueueAttributes", "calls")


def test_partitions_reads_the_consumer_s_record_without_an_sqs_call(counted):
    r, calls = counted
    end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    assert end == {"batch": 1}
    before = calls()
    (partition,) = r.partitions({"batch": 0}, end)
    assert calls() == before, "between Spark's planning and its tasks, no GetQueueAttributes round trip"
    assert sum(b.num_rows for b in r.read(partition)) == 4


def test_an_available_now_run_counts_from_the_depth_initial_offset_read(counted):
    r, calls = counted
    before = calls()
    r.initialOffset()
    r.prepareForTriggerAvailableNow()
    assert calls() - before == 1, "one GetQueueAttributes for both"
    assert r._available_now_left == 4


def read_ahead(url: str, n: int, timeout: float = 20) -> None:
    """Waits until the consumer's batch received ahead holds ``n`` messages."""
    poll(f"{n} messages read ahead", lambda: consumer(url).get("read_ahead") == n, timeout)


def test_by_default_the_next_batch_is_read_ahead_and_a_trigger_plans_it_though_the_queue_shows_nothing(setup):
    moto, qurl, url, reader = setup
    moto.send(qurl, bodies(12))
    r = reader(maxMessagesPerPartition="6")
    first = r.latestOffset({"batch": 0}, ReadAllAvailable())
    assert rows(r, {"batch": 0}, first) == 6
    # Batch 2 is received once batch 1's partition has: SQS shows nothing visible.
    read_ahead(url, 6)
    assert consumer(url)["read_ahead_batch"] == 2 and consumer(url)["read_ahead"] == 6
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 12}
    second = r.latestOffset(first, ReadAllAvailable())
    assert second == {"batch": 2}, "the messages read ahead are waiting: the trigger plans"
    r.wait_for_commits()
    assert rows(r, first, second) == 6
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 6}, "batch 1 deleted, batch 2 held"


def batch_one_read_and_the_next_read_ahead(setup):
    """18 messages; batch 1 (6) planned and read, batch 2 (6) read ahead:
    the reader and batch 1's end offset."""
    moto, qurl, url, reader = setup
    moto.send(qurl, bodies(18))
    r = reader(maxMessagesPerPartition="6")
    first = r.latestOffset({"batch": 0}, ReadAllAvailable())
    assert rows(r, {"batch": 0}, first) == 6
    read_ahead(url, 6)
    return r, first


def test_a_release_of_the_read_ahead_only_keeps_the_open_batch(setup):
    moto, qurl, url, reader = setup
    r, _ = batch_one_read_and_the_next_read_ahead(setup)
    assert moto.counts(qurl) == {"visible": 6, "in_flight": 12}
    sqs_flight.client(url).release("orders", r._o.consumer, read_ahead_only=True)
    assert moto.counts(qurl) == {"visible": 12, "in_flight": 6}, "batch 1 stays for a restart to replay"
    assert consumer(url)["open_batches"] == [1] and consumer(url).get("read_ahead_batch") is None


def test_a_stopped_query_gives_back_its_read_ahead_and_keeps_its_open_batch(setup):
    moto, qurl, url, reader = setup
    r, first = batch_one_read_and_the_next_read_ahead(setup)
    r.stop()
    assert moto.counts(qurl) == {"visible": 12, "in_flight": 6}, "what was read ahead is visible again"
    assert consumer(url)["open_batches"] == [1] and consumer(url).get("read_ahead_batch") is None
    # The restarted query replays batch 1 and reads the rest once.
    again = reader(maxMessagesPerPartition="6")
    assert rows(again, {"batch": 0}, first) == 6, "batch 1 replays"
    second = again.latestOffset(first, ReadAllAvailable())
    assert second == {"batch": 2}
    assert rows(again, first, second) == 6


def test_available_now_stops_even_when_messages_keep_coming(setup):
    moto, qurl, _, reader = setup
    moto.send(qurl, bodies(2, "before"))
    r = reader(maxRowsPerBatch="1")
    r.prepareForTriggerAvailableNow()
    offset = {"batch": 0}
    for expected in (1, 2):
        end = r.latestOffset(offset, ReadMaxRows(1))
        assert end == {"batch": expected}
        assert rows(r, offset, end) == 1
        moto.send(qurl, bodies(3, f"during-{expected}"))
        offset = end
    assert r.latestOffset(offset, ReadMaxRows(1)) == offset, "no batch beyond what was there at the start"


def test_a_batch_released_before_spark_committed_it_replays_empty_and_loses_nothing(setup):
    moto, qurl, url, reader = setup
    sent = bodies(8, "released")
    moto.send(qurl, sent)
    r = reader()
    end = r.latestOffset({"batch": 0}, ReadAllAvailable())
    assert rows(r, {"batch": 0}, end) == 8
    # The driver dies before Spark commits batch 1, and stays away past the
    # consumer lease: the server releases the batch (as `release` does).
    sqs_flight.release(url, "orders", "spark-orders")

    restarted = reader()
    assert restarted.partitions({"batch": 0}, end) == [], "no new receive under the old micro-batch"
    following = restarted.latestOffset(end, ReadAllAvailable())
    assert following == {"batch": 2}
    got = [b for p in restarted.partitions(end, following) for b in restarted.read(p)]
    assert sorted(v for b in got for v in b.column(b.schema.get_field_index("body")).to_pylist()) == sorted(sent)


def test_the_first_read_hands_spark_the_partition_in_one_batch(setup):
    moto, qurl, _, reader = setup
    sent = bodies(45, "rebatch")
    assert moto.send(qurl, sent) == 45
    r = reader(maxMessagesPerPartition="45")
    end = r.latestOffset({"batch": 0}, ReadAllAvailable())
    (partition,) = r.partitions({"batch": 0}, end)
    # The first read: the server streams each receive (at most ten rows) as
    # it comes; the reader joins them before Spark sees them.
    got = list(r.read(partition))
    assert [b.num_rows for b in got] == [45]
    assert sorted(got[0].column("body").to_pylist()) == sorted(sent)


def test_rebatch_keeps_order_and_cuts_by_rows_and_bytes():
    import pyarrow as pa

    from sqs_flight.spark import rebatch

    def batch(start: int, n: int) -> pa.RecordBatch:
        return pa.record_batch({"n": list(range(start, start + n)), "s": ["x" * 100] * n})

    parts = [batch(0, 3), batch(3, 0), batch(3, 4), batch(7, 5), batch(12, 1)]
    by_rows = list(rebatch(iter(parts), rows=6))
    assert [b.num_rows for b in by_rows] == [7, 6]
    assert [v for b in by_rows for v in b.column("n").to_pylist()] == list(range(13))
    # Each batch holds about 100 B per row: 3 + 4 rows pass 500 B, so do 5.
    by_bytes = list(rebatch(iter(parts), rows=1000, nbytes=500))
    assert [b.num_rows for b in by_bytes] == [7, 5, 1]
    assert list(rebatch(iter([batch(0, 0)]))) == []


def test_receivers_per_partition_reaches_the_plan_and_bad_values_are_refused(setup):
    moto, qurl, url, reader = setup
    moto.send(qurl, bodies(30))
    # One receiver: moto's receive is not atomic (see conftest.start_server);
    # the server refusing 129 below shows the option reaches the plan.
    r = reader(receiversPerPartition="1", maxMessagesPerPartition="30")
    end = r.latestOffset({"batch": 0}, ReadAllAvailable())
    assert rows(r, {"batch": 0}, end) == 30
    with pytest.raises(sqs_flight.SqsFlightError) as zero:
        reader(receiversPerPartition="0")
    assert zero.value.code == "INVALID_ARGUMENT" and "receiversPerPartition" in str(zero.value)
    moto.send(qurl, bodies(5))
    over = reader(receiversPerPartition="129")
    with pytest.raises(sqs_flight.SqsFlightError) as limit:
        over.latestOffset(end, ReadAllAvailable())  # plans the next batch
    assert limit.value.code == "INVALID_ARGUMENT"
    assert "`receivers`" in str(limit.value) and "128" in str(limit.value)


# -- receives in flight (unit: the reader's count of what waits) ------------


def scripted_reader(answers, **options: str) -> SqsFlightStreamReader:
    """A reader whose status answers are ``answers`` in turn, the last
    one for ever: (visible depth, read_ahead, receives_in_flight)."""
    opts = {"url": "grpc://127.0.0.1:9", "table": "orders", **options}
    r = SqsFlightStreamReader(Options.parse(opts, "spark-{table}"), StructType())
    calls = []

    def status():
        depth, ahead, receiving = answers[min(len(calls), len(answers) - 1)]
        calls.append(time.monotonic())
        return {
            "approximate_depth": depth,
            "approximate_in_flight": 0,
            "consumers": {"spark-orders": {"read_ahead": ahead, "receives_in_flight": receiving}},
        }

    r._table_status = status  # type: ignore[method-assign]
    r.status_calls = calls  # type: ignore[attr-defined]
    return r


def test_messages_taken_by_a_receive_in_flight_are_waited_for():
    # Nothing visible and nothing read ahead, but a receive of the
    # consumer's has taken messages: the count waits for its answer.
    r = scripted_reader([(0, 0, 1), (0, 0, 1), (0, 4, 0)], maxWaitMs="1000")
    assert r._waiting(r._table_status()) == 4
    assert len(r.status_calls) == 3


def test_nothing_in_flight_answers_at_once():
    r = scripted_reader([(0, 0, 0), (0, 4, 0)])
    assert r._waiting(r._table_status()) == 0
    assert len(r.status_calls) == 1, "no receive in flight: nothing to wait for"
    r = scripted_reader([(3, 0, 2)])
    assert r._waiting(r._table_status()) == 3, "messages visible: no wait"


def test_a_receive_that_never_answers_is_waited_for_a_bounded_time():
    r = scripted_reader([(0, 0, 1)], maxWaitMs="1")
    began = time.monotonic()
    assert r._waiting(r._table_status()) == 0
    waited = time.monotonic() - began
    assert waited >= RECEIVES_WAIT_MARGIN_S, "the idle wait and the margin"
    assert waited < RECEIVES_WAIT_MARGIN_S + 5, "and not much more"
