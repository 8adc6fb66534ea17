"""The stream reader's read limits in real Structured Streaming queries:
PySpark local mode, the real server binary, rustack as SQS.
``minRowsPerBatch`` with ``maxTriggerDelay`` on a trickling queue,
``maxBytesPerBatch``, ``Trigger.AvailableNow`` with a minimum, and the
options' errors as a query shows them. The reader-level rules, with the
test's clock, are in test_stream_limits.py."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List

import pytest

from conftest import bodies
from support import QUERY_TIMEOUT_S, _load_error, message_bytes, run_available_now, source, wait_for

MIN_ROWS, DELAY_S = 25, 8


@pytest.fixture
def queue(rustack, start_server):
    qurl = rustack.new_queue("limits")
    server = start_server(rustack, {"orders": qurl})
    return qurl, server.url


def traced_source(spark, url: str, trace, **options: Any):
    import limits_trace_source
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(limits_trace_source)
    spark.dataSource.register(limits_trace_source.LimitsTraceDataSource)
    return source(spark, url, "orders", fmt="sqs-flight-limits-traced", traceFile=str(trace), **options)


def test_min_rows_on_a_trickle_waits_for_the_minimum_or_the_delay(spark, rustack, queue, tmp_path):
    from limits_trace_source import read_trace

    qurl, url = queue
    trace = tmp_path / "trace.jsonl"
    batches: List[List[str]] = []  # bodies per micro-batch, in batch id order
    sink = lambda df, batch_id: batches.append([r.body for r in df.select("body").collect()])  # noqa: E731
    # A partition reads for a second at most, so that the slow trickle does
    # not keep one batch open (it brings a message every long poll).
    stream = traced_source(
        spark, url, trace, minRowsPerBatch=MIN_ROWS, maxTriggerDelay=f"{DELAY_S}s", maxWaitMs=100, maxDurationMs=1000
    )
    query = stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")).start()
    sent: List[str] = []
    landed = lambda: sum(len(b) for b in batches)  # noqa: E731
    try:
        wait_for("the query's first progress", lambda: query.lastProgress is not None, QUERY_TIMEOUT_S, query)
        sent += bodies(3, "first")  # fewer than the minimum: through once the delay has passed
        rustack.send(qurl, sent)
        wait_for("the first messages in the sink", lambda: landed() == len(sent), QUERY_TIMEOUT_S, query)
        # Right after a batch, a quick trickle reaches the minimum within the
        # delay; a slow one (2 messages a second, 16 in 8 s) does not.
        for i, (count, pause) in enumerate([(10, 0.3)] * 10 + [(1, 0.5)] * 40):
            sent += bodies(count, f"trickle-{i}")
            rustack.send(qurl, sent[-count:])
            time.sleep(pause)
        wait_for("the trickle in the sink", lambda: landed() == len(sent), QUERY_TIMEOUT_S, query)
        wait_for("an empty queue", lambda: rustack.counts(qurl) == {"visible": 0, "in_flight": 0}, 120, query)
    finally:
        query.stop()

    got = [body for batch in batches for body in batch]
    assert sorted(got) == sorted(sent), "nothing lost, nothing read twice"
    entries = [e for e in read_trace(str(trace)) if e.get("depth")]
    for e in entries:  # the rule, from what each trigger saw
        advanced = e["end"] > e["start"]
        assert advanced == e["admitted"], e
        if advanced and e["depth"] < MIN_ROWS:
            assert e["waited_after_s"] >= DELAY_S, f"planned under the minimum before the delay: {e}"
        if not advanced:
            assert e["depth"] < MIN_ROWS and e["waited_before_s"] < DELAY_S, f"waited for nothing: {e}"
    # Spark runs its first micro-batch at the initial offset: an empty one,
    # for which nothing was planned.
    batches = [b for b in batches if b]
    planned = [e for e in entries if e["end"] > e["start"]]
    assert len(planned) == len(batches), "one planned batch per micro-batch"
    for batch, e in zip(batches, planned):
        if len(batch) < MIN_ROWS:
            assert e["depth"] < MIN_ROWS and e["waited_after_s"] >= DELAY_S, (len(batch), e)
    assert any(e["admitted"] and e["depth"] >= MIN_ROWS and e["waited_after_s"] < DELAY_S for e in entries), (
        "the minimum let a batch through before the delay (the quick trickle)"
    )
    assert any(len(b) < MIN_ROWS for b in batches[1:]), "batches after the delay (the slow trickle)"
    assert any(not e["admitted"] for e in entries), "some triggers waited"


def _columns(df) -> List[Dict]:
    picked = df.select(
        "message_id",
        "body",
        "md5_of_body",
        "sender_id",
        "message_group_id",
        "message_deduplication_id",
        "sequence_number",
        "message_attributes",
        "partition",
    )
    return [{**r.asDict(), "message_attributes": list((r.message_attributes or {}).items())} for r in picked.collect()]


def test_max_bytes_per_batch_caps_every_micro_batch(spark, rustack, queue, tmp_path):
    qurl, url = queue
    sent = [json.dumps({"n": i, "pad": "x" * 1000}) for i in range(60)] + ["z" * 6000]
    assert rustack.send(qurl, sent) == len(sent)
    cap, share = 8192, 4096  # 8k over the default 2 partitions
    seen: List[List[Dict]] = []
    run_available_now(
        source(spark, url, "orders", maxBytesPerBatch="8k", maxWaitMs=300).writeStream.foreachBatch(
            lambda df, batch_id: seen.append(_columns(df))
        ),
        tmp_path / "ck",
    )
    for rows in seen:
        sizes = [message_bytes(r) for r in rows]
        for part in {r["partition"] for r in rows}:
            mine = [message_bytes(r) for r in rows if r["partition"] == part]
            assert sum(mine) <= share or len(mine) == 1, f"partition {part} over its share: {mine}"
        assert sum(sizes) <= 2 * max(share, max(sizes)), "the documented bound"
        if max(sizes) <= share:
            assert sum(sizes) <= cap
    assert sorted(r["body"] for rows in seen for r in rows) == sorted(sent), "every message once"
    assert len(seen) >= 61 * 1040 // cap, "about 7 messages of 1 kB per micro-batch at most"
    assert any(len(rows) > 1 for rows in seen)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_available_now_with_min_rows_does_not_wait(spark, rustack, queue, tmp_path):
    qurl, url = queue
    sent = bodies(40, "now")
    rustack.send(qurl, sent)
    got: List[str] = []
    run_available_now(
        source(
            spark, url, "orders", minRowsPerBatch=1000, maxTriggerDelay="1h", maxWaitMs=300
        ).writeStream.foreachBatch(lambda df, batch_id: got.extend(r.body for r in df.select("body").collect())),
        tmp_path / "ck",
    )
    assert sorted(got) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_limit_option_errors_fail_the_query_at_start(spark, queue):
    _, url = queue
    base = {"url": url, "table": "orders"}
    size = _load_error(spark, True, {**base, "maxBytesPerBatch": "1.5g"})
    assert "option 'maxBytesPerBatch' must be a size of at least 1 byte" in size and "'1.5g'" in size
    duration = _load_error(spark, True, {**base, "minRowsPerBatch": "10", "maxTriggerDelay": "5 minutes"})
    assert "option 'maxTriggerDelay' must be a duration as Kafka's source takes it" in duration
    alone = _load_error(spark, True, {**base, "maxTriggerDelay": "30s"})
    assert 'option "maxTriggerDelay" is how long a trigger may wait for "minRowsPerBatch" messages' in alone
    reject = _load_error(spark, True, {**base, "rejectPayloadErrors": "true"})
    assert 'option "rejectPayloadErrors" needs a table with a typed payload' in reject
    assert 'table "orders" has none' in reject
    batch = _load_error(spark, False, {**base, "minRowsPerBatch": "10"})
    assert 'option "minRowsPerBatch" is for streaming reads (spark.readStream): drop it' in batch


def test_reject_payload_errors_on_a_table_without_payload_fails_with_a_given_schema(spark, queue, tmp_path):
    _, url = queue
    df = (
        spark.readStream.format("sqs-flight")
        .schema("message_id string, body string")
        .option("url", url)
        .option("table", "orders")
        .option("rejectPayloadErrors", "true")
        .load()
    )
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(Exception, match='option "rejectPayloadErrors" needs a table with a typed payload'):
        query.awaitTermination(120)
    assert not query.isActive
