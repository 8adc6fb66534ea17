"""The stream reader's read limits (``maxBytesPerBatch``, ``minRowsPerBatch``
with ``maxTriggerDelay``) and ``rejectPayloadErrors``' read side, called
directly the way Spark's driver and executors call them, against moto
through the real server; and the options' parsing. The clock of
``maxTriggerDelay`` is the test's, so no assertion depends on timing. The
Spark runs in test_spark_limits.py show the same rules end to end."""

from __future__ import annotations

import json
from typing import Dict, List

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    ReadMinRows,
)

import sqs_flight
from sqs_flight.spark import Options, SqsFlightStreamReader, spark_schema
from sqs_flight.spark.limits import BatchLimits

from conftest import bodies
from support import PAYLOAD_TOML, message_bytes

URL = "grpc://127.0.0.1:1"  # parsing connects to nothing


class Clock:
    """The reader's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(moto, start_server):
    qurl = moto.new_queue("limits")
    server = start_server(moto, {"orders": qurl})
    clock = Clock()

    def reader(**options: str) -> SqsFlightStreamReader:
        opts = {"url": server.url, "table": "orders", "partitions": "1", "maxWaitMs": "300", **options}
        schema = spark_schema(sqs_flight.client(server.url).schema("orders"))
        return SqsFlightStreamReader(Options.parse(opts, "spark-{table}"), schema, clock=clock)

    return moto, qurl, server.url, reader, clock


def read_rows(r: SqsFlightStreamReader, start: dict, end: dict) -> List[Dict]:
    return [row for p in r.partitions(start, end) for b in r.read(p) for row in b.to_pylist()]


def planned(url: str):
    return (
        sqs_flight.status(url, "orders")["tables"]["orders"]["consumers"]
        .get("spark-orders", {})
        .get("last_planned_batch")
    )


# -- minRowsPerBatch and maxTriggerDelay -----------------------------------


def test_min_rows_skips_triggers_until_the_queue_holds_the_minimum(setup):
    moto, qurl, url, reader, _ = setup
    r = reader(minRowsPerBatch="5", maxTriggerDelay="1h")
    limit = r.getDefaultReadLimit()
    assert limit == ReadMinRows(5)
    moto.send(qurl, bodies(3, "few"))
    start = {"batch": 0}
    assert r.latestOffset(start, limit) == start, "3 visible of 5: no batch"
    assert planned(url) is None, "a skipped trigger plans nothing"
    moto.send(qurl, bodies(2, "more"))
    end = r.latestOffset(start, limit)
    assert end == {"batch": 1}
    assert sorted(row["body"] for row in read_rows(r, start, end)) == sorted(bodies(3, "few") + bodies(2, "more"))


def test_max_trigger_delay_plans_a_short_batch_once_it_passed_since_the_last_batch(setup):
    moto, qurl, _, reader, clock = setup
    r = reader(minRowsPerBatch="5", maxTriggerDelay="30s")
    limit = r.getDefaultReadLimit()
    moto.send(qurl, bodies(2, "first"))
    start = {"batch": 0}
    clock.now += 29.9
    assert r.latestOffset(start, limit) == start, "29.9 s since the reader started: still waiting"
    clock.now += 0.1
    first = r.latestOffset(start, limit)
    assert first == {"batch": 1}, "30 s passed: a batch of fewer than the minimum"
    assert len(read_rows(r, start, first)) == 2

    moto.send(qurl, bodies(2, "second"))
    clock.now += 29.9
    assert r.latestOffset(first, limit) == first, "the delay counts from the last batch"
    clock.now += 0.1
    second = r.latestOffset(first, limit)
    assert second == {"batch": 2}
    assert sorted(row["body"] for row in read_rows(r, first, second)) == sorted(bodies(2, "second"))


def test_min_rows_max_rows_and_max_bytes_apply_together(setup):
    moto, qurl, _, reader, _ = setup
    r = reader(minRowsPerBatch="3", maxTriggerDelay="1h", maxRowsPerBatch="4", maxBytesPerBatch="1m")
    limit = r.getDefaultReadLimit()
    assert limit == ReadMaxRows(4), "one limit stands for all three"
    moto.send(qurl, bodies(2, "few"))
    start = {"batch": 0}
    assert r.latestOffset(start, limit) == start, "the minimum holds under ReadMaxRows too"
    moto.send(qurl, bodies(8, "more"))
    offset, sizes = start, []
    while (end := r.latestOffset(offset, limit)) != offset:
        sizes.append(len(read_rows(r, offset, end)))
        offset = end
    assert sizes == [4, 4], "capped at 4; the last 2 wait for the minimum of 3"


def test_an_empty_table_gives_no_batch_even_after_the_delay(setup):
    _, _, url, reader, clock = setup
    r = reader(minRowsPerBatch="5", maxTriggerDelay="500ms")
    clock.now += 3600
    assert r.latestOffset({"batch": 0}, r.getDefaultReadLimit()) == {"batch": 0}
    assert planned(url) is None


def test_available_now_never_waits_for_the_minimum(setup):
    moto, qurl, _, reader, _ = setup
    r = reader(minRowsPerBatch="100", maxTriggerDelay="1h")
    moto.send(qurl, bodies(3, "now"))
    r.prepareForTriggerAvailableNow()
    start = {"batch": 0}
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"batch": 1}
    assert len(read_rows(r, start, end)) == 3


def test_read_all_available_ignores_every_limit_of_the_options(setup):
    moto, qurl, _, reader, _ = setup
    r = reader(minRowsPerBatch="100", maxTriggerDelay="1h", maxBytesPerBatch="1", maxRowsPerBatch="100")
    moto.send(qurl, bodies(4, "once"))
    start = {"batch": 0}
    end = r.latestOffset(start, ReadAllAvailable())  # Trigger.Once
    assert end == {"batch": 1}
    assert len(read_rows(r, start, end)) == 4, "no minimum, no byte cap"


def test_legacy_pyspark_refuses_min_rows_and_applies_max_bytes(setup):
    moto, qurl, _, reader, _ = setup
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        reader(minRowsPerBatch="5").latestOffset()  # how pyspark 4.0 / 4.1 call it
    assert err.value.code == "INVALID_ARGUMENT"
    assert '"minRowsPerBatch" needs pyspark >= 4.2' in str(err.value)

    moto.send(qurl, ["x" * 1000 for _ in range(5)])
    r = reader(maxBytesPerBatch="2500")  # one partition: at most 2 messages of about 1.1 kB
    end = r.latestOffset()
    got = read_rows(r, {"batch": 0}, end)
    assert len(got) == 2 and sum(message_bytes(row) for row in got) <= 2500


# -- maxBytesPerBatch --------------------------------------------------------


def test_max_bytes_caps_each_partition_at_its_share_and_loses_nothing(setup):
    moto, qurl, _, reader, _ = setup
    sent = [json.dumps({"n": i, "pad": "x" * 900}) for i in range(30)]
    moto.send(qurl, sent)
    r = reader(partitions="2", maxBytesPerBatch="5000")  # 2500 bytes per partition
    assert r.getDefaultReadLimit() == ReadMaxBytes(5000)
    offset, got = {"batch": 0}, []
    while (end := r.latestOffset(offset, r.getDefaultReadLimit())) != offset:
        rows = read_rows(r, offset, end)
        for part in {row["partition"] for row in rows}:
            assert sum(message_bytes(row) for row in rows if row["partition"] == part) <= 2500
        assert 0 < sum(message_bytes(row) for row in rows) <= 5000
        got.extend(rows)
        offset = end
    assert sorted(row["body"] for row in got) == sorted(sent), "every message once"
    assert len({row["message_id"] for row in got}) == 30
    assert offset["batch"] >= 30 // 4, "at most 2 messages of about 1 kB per partition"


def test_a_message_larger_than_the_share_is_read_alone_in_its_partition(setup):
    moto, qurl, _, reader, _ = setup
    big = ["y" * 4000 + str(i) for i in range(3)]
    moto.send(qurl, big)
    # The partitions receive one after another, at their reads: receiving at
    # the plan would run both at once, and which of them finds the messages
    # the other hands back would be a race.
    r = reader(partitions="2", maxBytesPerBatch="5000", receiveAtPlan="0")
    end = r.latestOffset({"batch": 0}, r.getDefaultReadLimit())
    rows = read_rows(r, {"batch": 0}, end)
    # The first message of a partition is always kept: the documented bound
    # is partitions x max(share, largest message), here 2 x about 4.1 kB.
    assert sorted(row["partition"] for row in rows) == [0, 1]
    assert sum(message_bytes(row) for row in rows) <= 2 * max(2500, max(message_bytes(row) for row in rows))


def test_max_bytes_above_the_server_limit_names_the_option(setup):
    moto, qurl, _, reader, _ = setup
    moto.send(qurl, bodies(1))
    r = reader(partitions="2", maxBytesPerBatch="1g")
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        r.latestOffset({"batch": 0}, r.getDefaultReadLimit())
    assert err.value.code == "INVALID_ARGUMENT"
    assert "above the limit 268435456" in str(err.value)
    assert "option maxBytesPerBatch 1073741824 over 2 partitions asks 536870912 bytes per partition" in str(err.value)


# -- how the options' limits combine ------------------------------------------


def test_the_default_read_limit_stands_for_every_option_and_other_limits_alone():
    both = BatchLimits(max_rows=100, max_bytes=1 << 20, min_rows=10, max_trigger_delay_ms=2000)
    assert both.read_limit() == ReadMaxRows(100)
    assert both.under(ReadMaxRows(100)) == both, "the limit Spark was given: every option applies"
    assert both.under(ReadAllAvailable()) == BatchLimits(), "Trigger.Once: none applies"
    assert both.under(ReadMaxRows(7)) == BatchLimits(max_rows=7), "another limit is honoured alone"
    assert both.under(ReadMinRows(3)) == BatchLimits(min_rows=3, max_trigger_delay_ms=2000)
    assert both.plan({}) == {"partitions": 2, "max_messages": 50, "max_bytes": 1 << 19}
    assert both.plan({"partitions": 4, "max_bytes": 1000}) == {"partitions": 4, "max_messages": 25, "max_bytes": 1000}
    assert BatchLimits(max_bytes=1).plan({"partitions": 8}) == {"partitions": 1, "max_bytes": 1}
    assert BatchLimits(min_rows=5).read_limit() == ReadMinRows(5)
    assert BatchLimits(min_rows=5).plan({"max_wait_ms": 9}) == {"max_wait_ms": 9}, "a minimum caps nothing"
    with pytest.raises(sqs_flight.SqsFlightError, match="ReadMaxFiles"):
        both.under(ReadMaxFiles(3))


# -- option parsing -----------------------------------------------------------


def parse(**options: str) -> Options:
    return Options.parse({"url": URL, "table": "orders", **options}, "spark-{table}")


def refused(**options: str) -> str:
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        parse(**options)
    assert err.value.code == "INVALID_ARGUMENT"
    return str(err.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("100", 100),
        ("64m", 64 << 20),
        ("1g", 1 << 30),
        ("1G", 1 << 30),
        ("10kb", 10 << 10),
        ("512 MB", 512 << 20),
        ("7b", 7),
        ("2t", 2 << 40),
    ],
)
def test_max_bytes_per_batch_takes_bytes_and_spark_size_units(text, expected):
    assert parse(maxBytesPerBatch=text).batch_limits.max_bytes == expected


@pytest.mark.parametrize("text", ["1.5g", "0", "0m", "-1", "64x", "m", "64 m b", "1e6"])
def test_bad_sizes_are_refused_naming_the_option(text):
    message = refused(maxBytesPerBatch=text)
    assert "option 'maxBytesPerBatch' must be a size of at least 1 byte" in message and repr(text) in message


@pytest.mark.parametrize(
    "text, ms",
    [
        ("30s", 30_000),
        ("5m", 300_000),
        ("5min", 300_000),
        ("1h", 3_600_000),
        ("500ms", 500),
        ("250", 250),
        ("1d", 86_400_000),
        ("1500us", 1),
        ("0s", 0),
    ],
)
def test_max_trigger_delay_takes_durations_as_kafka_does(text, ms):
    assert parse(minRowsPerBatch="10", maxTriggerDelay=text).batch_limits.max_trigger_delay_ms == ms


def test_max_trigger_delay_defaults_to_fifteen_minutes_as_kafka():
    assert parse(minRowsPerBatch="10").batch_limits.max_trigger_delay_ms == 15 * 60 * 1000


@pytest.mark.parametrize("text", ["5 minutes", "1.5s", "-1s", "s", "10sec", "PT5M"])
def test_bad_durations_are_refused_naming_the_option(text):
    message = refused(minRowsPerBatch="10", maxTriggerDelay=text)
    assert "option 'maxTriggerDelay' must be a duration as Kafka's source takes it" in message
    assert repr(text) in message


def test_option_combinations_that_cannot_work_are_refused():
    assert 'option "maxTriggerDelay" is how long a trigger may wait for "minRowsPerBatch" messages' in refused(
        maxTriggerDelay="30s"
    )
    assert 'option "minRowsPerBatch" (500) is above "maxRowsPerBatch" (100)' in refused(
        minRowsPerBatch="500", maxRowsPerBatch="100"
    )
    assert "option 'minRowsPerBatch' must be a positive integer, got 0" in refused(minRowsPerBatch="0")
    assert "option 'rejectPayloadErrors' must be true or false, got 'yes'" in refused(rejectPayloadErrors="yes")


@pytest.mark.parametrize(
    "name, value",
    [
        ("maxBytesPerBatch", "1m"),
        ("minRowsPerBatch", "5"),
        ("rejectPayloadErrors", "true"),
    ],
)
def test_batch_reads_refuse_the_streaming_options(name, value):
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        Options.parse({"url": URL, "table": "orders", name: value}, "spark-batch-{table}", streaming=False)
    assert f'option "{name}" is for streaming reads (spark.readStream): drop it' in str(err.value)


# -- rejectPayloadErrors: the read side ---------------------------------------


def test_reject_payload_errors_leaves_undecodable_rows_out_of_every_read(moto, start_server, tmp_path):
    qurl = moto.new_queue("reject-read")
    good = [json.dumps({"n": i}) for i in range(6)]
    poison = ["not json {", '{"n": "seven"}']
    moto.send(qurl, good + poison)
    config = tmp_path / "server.toml"
    config.write_text(PAYLOAD_TOML.format(queue_url=qurl))
    server = start_server(moto, {}, "--config", str(config))
    schema = spark_schema(sqs_flight.client(server.url).schema("events"))
    opts = {"url": server.url, "table": "events", "partitions": "1", "maxWaitMs": "300"}
    r = SqsFlightStreamReader(Options.parse({**opts, "rejectPayloadErrors": "true"}, "spark-{table}"), schema)
    end = r.latestOffset({"batch": 0}, ReadAllAvailable())
    (partition,) = r.partitions({"batch": 0}, end)
    first = [b for b in r.read(partition)]
    assert sorted(v for b in first for v in b.column("body").to_pylist()) == sorted(good)
    assert all(b.column("payload_error").null_count == b.num_rows for b in first)
    replay = [b for b in r.read(partition)]  # a task retried: the ticket replays
    assert pa.Table.from_batches(replay).equals(pa.Table.from_batches(first)), "the same rows left out"

    plain = SqsFlightStreamReader(Options.parse(opts, "spark-{table}"), schema)
    assert sum(b.num_rows for b in plain.read(partition)) == 8, "without the option every row is kept"


def test_the_stream_asks_for_read_ahead_receive_at_plan_and_backlog_sizing_unless_told_otherwise():
    base = {"url": "grpc://127.0.0.1:1", "table": "orders"}
    plan = lambda **o: Options.parse({**base, **o}, "spark-{table}").plan_limits()  # noqa: E731
    assert plan() == {"read_ahead": 1, "backlog_max_messages": 10_000, "receive_at_plan": 1}
    assert plan(readAhead="0", backlogMaxMessagesPerPartition="0", receiveAtPlan="0") == {
        "read_ahead": 0,
        "backlog_max_messages": 0,
        "receive_at_plan": 0,
    }
    # minRowsPerBatch counts the queue's visible depth, which read-ahead would empty.
    assert plan(minRowsPerBatch="5")["read_ahead"] == 0
    assert plan(minRowsPerBatch="5", readAhead="1")["read_ahead"] == 1
    for bad in ("-1", "x"):  # 2 passes here and the server refuses it at the plan (limit 1)
        with pytest.raises(sqs_flight.SqsFlightError) as e:
            plan(readAhead=bad)
        assert e.value.code == "INVALID_ARGUMENT" and "readAhead" in str(e.value)
