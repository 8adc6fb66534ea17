"""The sqs-flight sink: ``df.write`` and ``df.writeStream`` with format
``sqs-flight`` (DoPut from the executors), real PySpark in local mode, the
real server binary, rustack as SQS; what they send is read back through the
sqs-flight source. Also the round trip from the Rust CLI's ``send``."""

from __future__ import annotations

import json
import subprocess
from typing import Dict, List

import pytest

from conftest import cli_bin
from support import run_available_now


@pytest.fixture
def sink(rustack, start_server):
    """A fresh empty rustack queue behind a server, as table ``out``."""
    qurl = rustack.new_queue("sink")
    server = start_server(rustack, {"out": qurl})
    return rustack, qurl, server.url


def writer(df, url: str, table: str = "out"):
    return df.write.format("sqs-flight").mode("append").option("url", url).option("table", table)


def read_back(spark, url: str, table: str = "out", n: int = 1000):
    """Every message of ``table``, read (and deleted) through the sqs-flight
    source in one batch read."""
    df = (
        spark.read.format("sqs-flight")
        .option("url", url)
        .option("table", table)
        .option("consumer", "check")
        .option("commit", "true")
        .option("maxMessagesPerPartition", str(n))
        .option("maxWaitMs", "1000")
        .load()
    )
    return df.select("message_id", "body", "message_attributes").collect()


def test_batch_write_sends_every_row_and_the_source_reads_them_back(spark, sink):
    emu, qurl, url = sink
    df = (
        spark.range(400)
        .repartition(4)
        .selectExpr(
            "to_json(named_struct('order', id)) AS body",
            "map('parity', IF(id % 2 = 0, 'even', 'odd')) AS message_attributes",
            "CAST(0 AS INT) AS delay_seconds",
        )
    )
    writer(df, url).save()
    assert emu.counts(qurl) == {"visible": 400, "in_flight": 0}

    rows = read_back(spark, url)
    assert len(rows) == 400 and len({r.message_id for r in rows}) == 400
    got = {json.loads(r.body)["order"]: r.message_attributes for r in rows}
    assert got == {i: {"parity": "even" if i % 2 == 0 else "odd"} for i in range(400)}
    assert emu.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_stream_write_from_a_rate_source_sends_each_micro_batch_once(spark, sink, tmp_path):
    emu, qurl, url = sink
    ck = tmp_path / "ck"

    def run() -> None:
        # rate-micro-batch makes exactly rowsPerBatch rows per micro-batch, and
        # AvailableNow runs one micro-batch; the second run continues from the
        # checkpoint with the next 150 values.
        rate = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", "150")
            .option("numPartitions", "2")
            .load()
            .selectExpr("concat('rate-', value) AS body", "map('value', CAST(value AS STRING)) AS message_attributes")
        )
        sink_ = rate.writeStream.format("sqs-flight").option("url", url).option("table", "out")
        query = run_available_now(sink_, ck)
        assert query.exception() is None

    run()
    assert emu.counts(qurl) == {"visible": 150, "in_flight": 0}
    run()
    assert emu.counts(qurl) == {"visible": 300, "in_flight": 0}

    rows = read_back(spark, url)
    assert sorted(r.body for r in rows) == sorted(f"rate-{i}" for i in range(300))
    assert all(r.message_attributes == {"value": r.body[len("rate-") :]} for r in rows)
    assert emu.counts(qurl) == {"visible": 0, "in_flight": 0}


def _error(action) -> str:
    with pytest.raises(Exception) as err:
        action()
    return str(err.value)


def test_the_sink_refuses_a_dataframe_it_cannot_send_before_sending_anything(spark, sink, tmp_path):
    emu, qurl, url = sink
    good = spark.range(3).selectExpr("CAST(id AS STRING) AS body")

    extra = _error(lambda: writer(good.selectExpr("body", "1 AS n", "'x' AS note"), url).save())
    assert "column(s) 'n', 'note' are not message fields" in extra and "df.select('body')" in extra
    no_body = _error(lambda: writer(good.selectExpr("body AS text"), url).save())
    assert "has no 'body' column" in no_body and "text" in no_body
    wrong = _error(lambda: writer(good.selectExpr("body", "'soon' AS delay_seconds"), url).save())
    assert "column 'delay_seconds' is string, expected an integer type" in wrong
    table = _error(lambda: writer(good, url, "nope").save())
    assert 'unknown table "nope"' in table and "out" in table
    overwrite = _error(lambda: writer(good, url).mode("overwrite").save())
    assert "a queue can only be appended to" in overwrite
    missing = _error(lambda: good.write.format("sqs-flight").mode("append").option("table", "out").save())
    assert 'option "url" is missing' in missing

    stream = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", "5")
        .load()
        .selectExpr("CAST(value AS STRING) AS body", "timestamp")
    )
    query_error = _error(
        lambda: run_available_now(
            stream.writeStream.format("sqs-flight").option("url", url).option("table", "out"), tmp_path / "ck"
        )
    )
    assert "column(s) 'timestamp' are not message fields" in query_error
    assert emu.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_a_row_sqs_cannot_take_fails_the_write_with_the_servers_message(spark, sink):
    emu, qurl, url = sink
    # One partition, so the rows before the bad one are known: 3 are sent.
    df = spark.createDataFrame([("a",), ("b",), ("c",), ("x" * ((1 << 20) + 1),), ("d",)], "body string").coalesce(1)
    message = _error(lambda: writer(df, url).save())
    assert "sqs-flight sink, Spark partition 0" in message
    assert "row 3: message is 1048577 bytes" in message and "above the SQS limit" in message
    assert "3 rows were sent before it" in message
    assert emu.counts(qurl) == {"visible": 3, "in_flight": 0}


def test_rows_sent_with_the_cli_are_read_once_by_the_spark_source(spark, sink, tmp_path):
    emu, qurl, url = sink
    lines = [{"body": json.dumps({"n": i}), "message_attributes": {"source": "cli", "n": str(i)}} for i in range(500)]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = subprocess.run(
        [cli_bin(), "--url", url, "send", "out", "--file", str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert emu.counts(qurl) == {"visible": 500, "in_flight": 0}

    seen: List[Dict] = []

    def collect(df, batch_id: int) -> None:
        seen.extend(r.asDict() for r in df.select("message_id", "body", "message_attributes").collect())

    stream = (
        spark.readStream.format("sqs-flight")
        .option("url", url)
        .option("table", "out")
        .option("maxRowsPerBatch", "200")
        .option("maxWaitMs", "500")
        .load()
    )
    run_available_now(stream.writeStream.foreachBatch(collect), tmp_path / "ck")

    assert len(seen) == 500 and len({r["message_id"] for r in seen}) == 500
    got = {json.loads(r["body"])["n"]: r["message_attributes"] for r in seen}
    assert got == {i: {"source": "cli", "n": str(i)} for i in range(500)}
    assert emu.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_rows_of_the_pyspark_40_stream_writer_become_arrow_batches():
    # pyspark 4.0 hands the stream writer Rows; 4.1+ (the suite's) Arrow batches.
    from pyspark.sql import Row
    from pyspark.sql.types import IntegerType, MapType, StringType, StructField, StructType

    from sqs_flight.spark import _rows_to_batches

    schema = StructType(
        [
            StructField("body", StringType()),
            StructField("delay_seconds", IntegerType()),
            StructField("message_attributes", MapType(StringType(), StringType())),
        ]
    )
    rows = [Row(body=f"b{i}", delay_seconds=i, message_attributes={"k": str(i)} if i % 2 else None) for i in range(5)]
    batches = list(_rows_to_batches(schema, iter(rows), 2))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    got = [r for b in batches for r in b.to_pylist()]
    assert got == [
        {"body": f"b{i}", "delay_seconds": i, "message_attributes": [("k", str(i))] if i % 2 else None}
        for i in range(5)
    ]
