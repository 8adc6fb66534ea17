"""Structured Streaming through the sqs-flight source: real PySpark in local
mode, the real server binary, rustack as SQS."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Dict, List

import pytest

import sqs_flight

from conftest import bodies
from support import QUERY_TIMEOUT_S, run_available_now, source, wait_for


def consumer_watermark(url: str, table: str, consumer: str):
    consumers = sqs_flight.status(url, table)["tables"][table]["consumers"]
    return consumers.get(consumer, {}).get("committed_batch")


@pytest.fixture
def loaded(rustack, start_server):
    """``loaded(n)``: a fresh rustack queue with n messages behind a server."""

    def make(n: int, tag: str = "m"):
        qurl = rustack.new_queue(tag)
        sent = bodies(n, tag)
        assert rustack.send(qurl, sent, threads=8) == n
        server = start_server(rustack, {"orders": qurl})
        return qurl, server.url, sent

    return make


def test_20000_messages_stream_into_parquet_exactly_once(spark, rustack, loaded, tmp_path):
    qurl, url, sent = loaded(20_000, "volume")
    out, ck = tmp_path / "out", tmp_path / "ck"
    started = time.monotonic()
    query = (
        source(spark, url, "orders", partitions=2, maxMessagesPerPartition=2500, maxWaitMs=500)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .start()
    )
    try:
        rows_in = lambda: sum(p["numInputRows"] for p in query.recentProgress)  # noqa: E731
        wait_for("20,000 rows in the sink", lambda: rows_in() >= 20_000, QUERY_TIMEOUT_S, query)
        # The last batch is deleted by the next latestOffset(start=last).
        wait_for("an empty queue", lambda: rustack.counts(qurl) == {"visible": 0, "in_flight": 0}, 120, query)
    finally:
        query.stop()
    print(f"20,000 messages streamed and deleted in {time.monotonic() - started:.1f} s")

    got = spark.read.parquet(str(out)).select("message_id", "body")
    assert got.count() == 20_000
    assert got.select("message_id").distinct().count() == 20_000
    assert sorted(r.body for r in got.collect()) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_query_killed_mid_batch_restarts_without_loss_or_duplicates(spark, rustack, loaded, tmp_path):
    qurl, url, sent = loaded(600, "restart")
    out, ck = tmp_path / "out", tmp_path / "ck"
    fail_in_batch = {1}

    def sink(df, batch_id: int) -> None:
        # Idempotent per micro-batch: a re-run replaces the batch's output.
        target = out / f"batch_id={batch_id}"
        shutil.rmtree(target, ignore_errors=True)
        if batch_id in fail_in_batch:
            df.limit(max(1, df.count() // 2)).write.parquet(str(target))
            fail_in_batch.clear()
            raise RuntimeError("sink dies half way through the batch")
        df.write.parquet(str(target))

    stream = source(spark, url, "orders", maxRowsPerBatch=200, maxWaitMs=500)
    with pytest.raises(Exception, match="sink dies half way"):
        run_available_now(stream.writeStream.foreachBatch(sink), ck)
    assert any((out / "batch_id=1").glob("*.parquet")), "the failed batch left partial output"
    assert consumer_watermark(url, "orders", "spark-orders") == 1, "only the first micro-batch is committed"
    assert rustack.counts(qurl)["in_flight"] > 0

    run_available_now(
        source(spark, url, "orders", maxRowsPerBatch=200, maxWaitMs=500).writeStream.foreachBatch(sink), ck
    )
    got = spark.read.parquet(str(out)).select("message_id", "body")
    assert got.count() == 600
    assert got.select("message_id").distinct().count() == 600
    assert sorted(r.body for r in got.collect()) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_foreach_batch_actions_see_identical_data(spark, rustack, loaded, tmp_path):
    qurl, url, sent = loaded(300, "twice")
    seen: List[Dict] = []

    def sink(df, batch_id: int) -> None:
        first = sorted((r.message_id, r.body) for r in df.collect())
        second = sorted((r.message_id, r.body) for r in df.select("message_id", "body").collect())
        seen.append({"first": first, "second": second, "count": df.count()})

    run_available_now(
        source(spark, url, "orders", maxRowsPerBatch=100, maxWaitMs=500).writeStream.foreachBatch(sink),
        tmp_path / "ck",
    )
    assert len(seen) >= 3
    for batch in seen:
        assert batch["first"] and batch["first"] == batch["second"]
        assert batch["count"] == len(batch["first"])
    assert sorted(body for b in seen for _, body in b["first"]) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_available_now_drains_the_queue_in_batches_capped_by_max_rows(spark, rustack, loaded, tmp_path):
    qurl, url, sent = loaded(450, "drain")
    sizes: List[int] = []

    def sink(df, batch_id: int) -> None:
        sizes.append(df.count())

    query = run_available_now(
        source(spark, url, "orders", maxRowsPerBatch=100, maxWaitMs=500).writeStream.foreachBatch(sink),
        tmp_path / "ck",
    )
    assert not query.isActive
    assert sum(sizes) == 450
    assert max(sizes) <= 100 and len(sizes) >= 5
    assert consumer_watermark(url, "orders", "spark-orders") == len(sizes)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}


def _traced_run(spark, url: str, tmp_path: Path, latest_commits: bool):
    """An AvailableNow run of the tracing source; returns (trace, per-batch checks)."""
    import tracing_source
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(tracing_source)
    spark.dataSource.register(tracing_source.TracingDataSource)
    trace, ck = tmp_path / "trace.jsonl", tmp_path / "ck"
    in_batch: List[Dict] = []

    def sink(df, batch_id: int) -> None:
        batches = {r.batch for r in df.select("batch").distinct().collect()}
        in_batch.append(
            {"batches": batches, "watermark": consumer_watermark(url, "orders", "spark-orders"), "rows": df.count()}
        )

    stream = source(
        spark,
        url,
        "orders",
        fmt="sqs-flight-traced",
        maxRowsPerBatch=100,
        maxWaitMs=500,
        traceFile=trace,
        checkpoint=ck,
        latestOffsetCommits=str(latest_commits).lower(),
    )
    run_available_now(stream.writeStream.foreachBatch(sink), ck)
    return tracing_source.read_trace(str(trace)), in_batch


def _check_no_early_delete(trace, in_batch) -> None:
    for entry in trace:
        if entry["server_after"] != entry["server_before"]:
            assert entry["in_spark_commit_log"], f"deleted before Spark committed it: {entry}"
    for batch in in_batch:
        assert batch["watermark"] is None or batch["watermark"] < min(batch["batches"]), batch


def test_latest_offset_commits_the_last_batch_and_only_after_spark_did(spark, rustack, loaded, tmp_path):
    qurl, url, _ = loaded(350, "proof")
    trace, in_batch = _traced_run(spark, url, tmp_path, latest_commits=True)
    last = max(max(b["batches"]) for b in in_batch)
    _check_no_early_delete(trace, in_batch)
    movers = [e for e in trace if e["server_after"] != e["server_before"]]
    assert movers and all(e["path"] == "latestOffset" for e in movers), trace
    assert movers[-1]["batch"] == last and movers[-1]["server_after"] == last
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_spark_commit_path_alone_deletes_all_but_the_last_batch(spark, rustack, loaded, tmp_path):
    qurl, url, _ = loaded(350, "commitpath")
    trace, in_batch = _traced_run(spark, url, tmp_path, latest_commits=False)
    last = max(max(b["batches"]) for b in in_batch)
    _check_no_early_delete(trace, in_batch)
    movers = [e for e in trace if e["server_after"] != e["server_before"]]
    assert movers and all(e["path"] == "commit" for e in movers), trace
    assert consumer_watermark(url, "orders", "spark-orders") == last - 1
    # What the latestOffset rule exists for: the run's last batch stays in flight.
    last_rows = next(b["rows"] for b in in_batch if max(b["batches"]) == last)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": last_rows}


def _backlog(progress) -> Dict:
    """The source's ``latestOffset`` of one progress, as a dict."""
    latest = progress["sources"][0]["latestOffset"]
    if latest is None:
        return {}
    return json.loads(latest) if isinstance(latest, str) else latest


def test_the_query_progress_shows_the_queues_backlog_and_0_once_drained(spark, loaded, tmp_path):
    qurl, url, sent = loaded(100, "backlog")
    seen: List[int] = []
    # An idle trigger reports its progress after this long (default 10 s).
    idle_interval = spark.conf.get("spark.sql.streaming.noDataProgressEventInterval")
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "500ms")
    try:
        query = (
            source(spark, url, "orders", maxRowsPerBatch=25, maxWaitMs=200)
            .writeStream.foreachBatch(lambda df, _id: seen.append(df.count()))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
    finally:
        spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", idle_interval)
    try:
        with_rows = lambda: [p for p in query.recentProgress if p["numInputRows"] > 0]  # noqa: E731
        wait_for("the first batch's progress", lambda: bool(with_rows()), query=query)
        first = with_rows()[0]
        latest = _backlog(first)
        # Before the first batch the queue held all 100 messages, visible.
        assert latest["approximate_backlog"] == 100, first
        assert latest["approximate_depth"] + latest["approximate_in_flight"] == 100, first
        assert latest["batch"] == json.loads(first["sources"][0]["endOffset"])["batch"], first
        wait_for(
            "the backlog drained to 0 in the progress",
            lambda: (
                sum(seen) == 100 and any(_backlog(p).get("approximate_backlog") == 0 for p in query.recentProgress[-3:])
            ),
            query=query,
        )
    finally:
        query.stop()
    assert sum(seen) == 100


def test_the_backlog_of_many_queries_costs_one_sqs_call_per_table(rustack, fault_proxy, start_server):
    from concurrent.futures import ThreadPoolExecutor

    from sqs_flight.spark.stream import BACKLOG_MAX_AGE_MS

    queue = rustack.new_queue("cached")
    rustack.send(queue, bodies(7, "cached"))
    proxy = fault_proxy(rustack, "duplicate-receives", share=0.0)  # no fault: it counts the calls
    server = start_server(proxy, {"orders": queue})
    calls = lambda: proxy.count("GetQueueAttributes", "calls")  # noqa: E731
    before = calls()

    def progress_status(_: int) -> int:  # what each query's reportLatestOffset asks
        answer = sqs_flight.status(server.url, "orders", max_age_ms=BACKLOG_MAX_AGE_MS)
        return answer["tables"]["orders"]["approximate_depth"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set(pool.map(progress_status, range(16))) == {7}
    assert calls() - before == 1, "16 progress reports at once, one GetQueueAttributes"
    # Without max_age_ms (the source's decision to plan a batch) it reads SQS each time.
    sqs_flight.status(server.url, "orders")
    sqs_flight.status(server.url, "orders")
    assert calls() - before == 3
