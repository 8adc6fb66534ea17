"""Managed mode: ``.option("queueUrl", ...)`` with no ``url``. The Spark
source's driver side starts a server for the queue (the binary of the
server wheel), reuses it across queries, starts it again after a crash on
the same state directory and port, and the server exits by itself once the
queries are gone. Real PySpark in local mode, rustack as SQS."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Dict

import pytest

from sqs_flight.client import Client, SqsFlightError
from sqs_flight.managed import table_name_for
from sqs_flight.spark import Options
from sqs_flight.spark.driver import connect

from conftest import bodies
from support import QUERY_TIMEOUT_S, gone, record, run_available_now, wait_for


def managed_source(spark, rustack, queue_url: str, state_dir: Path, **options: str):
    reader = (
        spark.readStream.format("sqs-flight")
        .option("queueUrl", queue_url)
        .option("sqsEndpoint", rustack.endpoint)
        .option("region", "us-east-1")
        .option("stateDir", str(state_dir))
        .option("maxWaitMs", "500")
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def server_info(state_dir: Path) -> dict:
    """The recorded server's own answer (no SQS call): who runs."""
    rec = record(state_dir)
    pem = (state_dir / "tls" / "cert.pem").read_text() if rec.get("tls") else None
    with Client(rec["url"], token=rec["token"], tls_root_certs=pem, timeout=10) as c:
        return c._action("server_info", {})


def start_managed(rustack, queue: str, state_dir: Path, **options: str) -> dict:
    """Starts (or finds) the managed server the way a query's driver side
    does, before the query, and returns its record: a query that restarted
    it would leave another pid and instance id."""
    connect(
        Options.parse(
            {
                "queueUrl": queue,
                "sqsEndpoint": rustack.endpoint,
                "region": "us-east-1",
                "stateDir": str(state_dir),
                **options,
            },
            "spark-{table}",
        )
    )
    return record(state_dir)


def parquet_bodies(spark, out: Path):
    got = spark.read.parquet(str(out)).select("message_id", "body").collect()
    return [r.message_id for r in got], sorted(r.body for r in got)


def test_queue_url_alone_runs_a_server_on_the_driver_that_outlives_the_query(spark, rustack, tmp_path):
    queue = rustack.new_queue("managed")
    sent = bodies(300, "managed")
    rustack.send(queue, sent, threads=8)
    state, out = tmp_path / "state", tmp_path / "out"
    query = run_available_now(
        managed_source(spark, rustack, queue, state).writeStream.format("parquet").option("path", str(out)),
        tmp_path / "ck",
    )
    assert query.exception() is None
    ids, got = parquet_bodies(spark, out)
    assert got == sorted(sent) and len(set(ids)) == 300
    wait_for("an empty queue", lambda: rustack.counts(queue) == {"visible": 0, "in_flight": 0})

    first = record(state)
    table = table_name_for(queue)
    assert first["tables"] == {table: queue}
    assert first["url"] == f"grpc://127.0.0.1:{first['port']}"
    assert oct((state / "managed.json").stat().st_mode & 0o777) == "0o600", "the token file is private"
    # The query's Python process is gone; its server is not (own session).
    assert not gone(first["pid"], within=1), "the managed server died with the query"

    # A second query on the same state directory reuses it.
    more = bodies(50, "again")
    rustack.send(queue, more)
    out2 = tmp_path / "out2"
    run_available_now(
        managed_source(spark, rustack, queue, state).writeStream.format("parquet").option("path", str(out2)),
        tmp_path / "ck2",
    )
    assert parquet_bodies(spark, out2)[1] == sorted(more)
    assert record(state)["pid"] == first["pid"]
    assert server_info(state)["instance_id"] == first["instance_id"], "the same server, not a restart"
    os.kill(first["pid"], signal.SIGTERM)
    assert gone(first["pid"])


def test_a_killed_managed_server_is_started_again_on_its_port_and_nothing_is_lost_or_duplicated(
    spark, rustack, tmp_path
):
    queue = rustack.new_queue("managed-kill")
    table = table_name_for(queue)
    first_wave, second_wave = bodies(200, "before"), bodies(200, "after")
    rustack.send(queue, first_wave, threads=8)
    state = tmp_path / "state"
    # The sink holds the first batch with rows until told: the kill lands
    # while that batch is read and not committed (its messages in flight).
    held, go = threading.Event(), threading.Event()
    sink: Dict[int, list] = {}  # by batch id: a batch Spark runs again replaces its rows

    def write(df, batch_id: int) -> None:
        rows = [(r.message_id, r.body) for r in df.select("message_id", "body").collect()]
        sink[batch_id] = rows
        if rows and not held.is_set():
            held.set()
            go.wait(QUERY_TIMEOUT_S)

    query = (
        managed_source(spark, rustack, queue, state, maxMessagesPerPartition=50)
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_for("a batch held by the sink", held.is_set, QUERY_TIMEOUT_S, query)
        before = record(state)
        with Client(before["url"], token=before["token"], timeout=10) as c:
            consumers = c.status(table)["tables"][table]["consumers"]
        assert any(c["open_batches"] for c in consumers.values()), f"a batch is held at the kill: {consumers}"
        assert rustack.counts(queue)["in_flight"] > 0, "its messages are in flight at SQS at the kill"
        os.kill(before["pid"], signal.SIGKILL)
        assert gone(before["pid"])
        go.set()
        rustack.send(queue, second_wave, threads=8)
        rows_in = lambda: sum(len(r) for r in list(sink.values()))  # noqa: E731
        wait_for("both waves in the sink", lambda: rows_in() >= 400, QUERY_TIMEOUT_S, query)
        wait_for("an empty queue", lambda: rustack.counts(queue) == {"visible": 0, "in_flight": 0}, 120, query)
    finally:
        go.set()
        query.stop()
    after = record(state)
    assert after["pid"] != before["pid"], "a new server process"
    assert after["port"] == before["port"], "started again on the same port"
    # A new token for the new server (one that leaked dies with its
    # server): the batches planned after the restart carry it to the tasks.
    assert after["token"] != before["token"]
    got = [row for rows in sink.values() for row in rows]
    assert sorted(body for _, body in got) == sorted(first_wave + second_wave), "every message once"
    assert len({mid for mid, _ in got}) == len(got) == 400
    os.kill(after["pid"], signal.SIGTERM)


def test_the_managed_server_exits_by_itself_once_idle(spark, rustack, tmp_path):
    queue = rustack.new_queue("managed-idle")
    rustack.send(queue, bodies(20, "idle"))
    state = tmp_path / "state"
    # Long enough for the query to start on a loaded machine (an idle exit
    # before it would be a legitimate restart), short enough to wait for.
    before = start_managed(rustack, queue, state, serverIdleExitSeconds="30")
    run_available_now(
        managed_source(spark, rustack, queue, state, serverIdleExitSeconds=30)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out")),
        tmp_path / "ck",
    )
    after = record(state)
    # The query ran on the server it found: a restart (by the watchdog or a
    # failed liveness check) would have left another pid and instance id.
    assert (after["pid"], after["instance_id"]) == (before["pid"], before["instance_id"])
    assert server_info(state)["instance_id"] == before["instance_id"]
    assert gone(before["pid"], within=180), "the managed server did not exit once idle"
    assert rustack.counts(queue) == {"visible": 0, "in_flight": 0}, "it exited after the last commit"


def test_a_managed_server_survives_a_deleted_queue_and_serves_the_next_query(spark, rustack, tmp_path):
    kept, deleted = rustack.new_queue("managed-kept"), rustack.new_queue("managed-deleted")
    state = tmp_path / "state"
    start_managed(rustack, kept, state)
    before = start_managed(rustack, deleted, state)  # one restart, to add the second table
    rustack.sqs.delete_queue(QueueUrl=deleted)
    sent = bodies(30, "kept")
    rustack.send(kept, sent)
    out = tmp_path / "out"
    query = run_available_now(
        managed_source(spark, rustack, kept, state).writeStream.format("parquet").option("path", str(out)),
        tmp_path / "ck",
    )
    assert query.exception() is None
    assert parquet_bodies(spark, out)[1] == sorted(sent)
    after = record(state)
    assert (after["pid"], after["instance_id"]) == (before["pid"], before["instance_id"]), "reused, not restarted"


def test_spark_reads_through_the_managed_servers_own_tls_certificate(spark, rustack, tmp_path):
    queue = rustack.new_queue("managed-tls")
    sent = bodies(40, "tls")
    rustack.send(queue, sent)
    state, out = tmp_path / "state", tmp_path / "out"
    # serverTls forces the off-loopback path (a made certificate, TLS, its
    # PEM handed to the executors) on a loopback address.
    query = run_available_now(
        managed_source(spark, rustack, queue, state, serverTls="true")
        .writeStream.format("parquet")
        .option("path", str(out)),
        tmp_path / "ck",
    )
    assert query.exception() is None
    assert parquet_bodies(spark, out)[1] == sorted(sent)
    rec = record(state)
    assert rec["url"] == f"grpc+tls://127.0.0.1:{rec['port']}" and rec["tls"] is True
    assert oct((state / "tls" / "key.pem").stat().st_mode & 0o777) == "0o600"
    wait_for("an empty queue", lambda: rustack.counts(queue) == {"visible": 0, "in_flight": 0})


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q", "url": "grpc://h:1", "table": "t"},
            'options "queueUrl" and "url" exclude each other',
        ),
        (
            {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q", "token": "x"},
            'options "queueUrl" and "token" exclude each other',
        ),
        (
            {"url": "grpc://h:1", "table": "t", "stateDir": "/tmp/x"},
            'option "stateDir" is for managed mode: set "queueUrl"',
        ),
        ({"queueUrl": "sqs.eu-west-1.amazonaws.com/1/q"}, 'option "queueUrl" must be an SQS queue URL'),
        (
            {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q", "serverIdleExitSeconds": "0"},
            "option 'serverIdleExitSeconds' must be a positive whole number of seconds",
        ),
        ({"table": "t"}, 'or set "queueUrl" to an SQS queue URL'),
        (
            {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q", "stateUrl": "gs://bucket/x"},
            'option "stateUrl" must be s3://BUCKET/PREFIX, file:///PATH or an absolute path',
        ),
        (
            {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q", "stateUrl": "relative/dir"},
            'option "stateUrl" must be s3://BUCKET/PREFIX',
        ),
        (
            {"url": "grpc://h:1", "table": "t", "stateUrl": "s3://b/p"},
            'option "stateUrl" is for managed mode: set "queueUrl"',
        ),
    ],
)
def test_managed_options_are_checked_before_anything_starts(options, message, tmp_path):
    with pytest.raises(SqsFlightError) as e:
        Options.parse(
            dict(options, stateDir=options.get("stateDir", str(tmp_path))) if "queueUrl" in options else options,
            "spark-{table}",
        )
    assert message in str(e.value)
    assert e.value.code == "INVALID_ARGUMENT"
    assert not (tmp_path / "managed.json").exists(), "nothing was started"


def test_parsing_managed_options_starts_nothing(tmp_path):
    o = Options.parse(
        {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q", "stateDir": str(tmp_path)}, "spark-{table}"
    )
    assert o.url == "" and o.managed is not None and o.managed.table == "q"
    assert not (tmp_path / "managed.json").exists(), "parsing starts nothing: driver.connect does"


def test_a_table_name_clash_in_one_state_dir_is_refused(rustack, tmp_path):
    a = rustack.new_queue("clash")
    connect(
        Options.parse(
            {"queueUrl": a, "table": "orders", "stateDir": str(tmp_path), "sqsEndpoint": rustack.endpoint},
            "spark-{table}",
        )
    )
    pid = record(tmp_path)["pid"]
    try:
        b = rustack.new_queue("clash")
        with pytest.raises(SqsFlightError, match='give this queue another name with the option "table"'):
            connect(
                Options.parse(
                    {"queueUrl": b, "table": "orders", "stateDir": str(tmp_path), "sqsEndpoint": rustack.endpoint},
                    "spark-{table}",
                )
            )
        # Another name: the same server restarts with both tables, on its port.
        port = record(tmp_path)["port"]
        o = connect(
            Options.parse(
                {"queueUrl": b, "table": "orders2", "stateDir": str(tmp_path), "sqsEndpoint": rustack.endpoint},
                "spark-{table}",
            )
        )
        now = record(tmp_path)
        assert now["tables"] == {"orders": a, "orders2": b}
        assert now["port"] == port and o.url == now["url"]
        pid = now["pid"]
        assert set(o.client().status()["tables"]) == {"orders", "orders2"}
    finally:
        os.kill(pid, signal.SIGTERM)
        assert gone(pid)
