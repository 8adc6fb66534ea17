"""``spark.read.format("sqs-flight")``: one batch, released (a peek) by
default or committed with ``commit=true``; and bad options that must fail at
start with a message that says what to fix."""

from __future__ import annotations

import pytest

import sqs_flight

from conftest import bodies, free_port
from support import _load_error


@pytest.fixture
def loaded(rustack, start_server):
    qurl = rustack.new_queue("batch")
    sent = bodies(120, "batch")
    assert rustack.send(qurl, sent) == 120
    server = start_server(rustack, {"orders": qurl})
    return qurl, server.url, sent


def batch_read(spark, url: str, **options: str):
    reader = spark.read.format("sqs-flight").option("url", url).option("table", "orders")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_batch_read_peeks_by_default(spark, rustack, loaded):
    qurl, url, sent = loaded
    df = batch_read(spark, url, maxMessagesPerPartition=100, maxWaitMs=500)
    first = sorted((r.body, r.message_id, r.receive_count) for r in df.collect())
    assert [body for body, _, _ in first] == sorted(sent)
    second = sorted(
        (r.body, r.message_id, r.receive_count) for r in df.select("body", "message_id", "receive_count").collect()
    )
    assert second == first, "a second action sees the same rows, not a new receive"
    assert rustack.counts(qurl) == {"visible": 120, "in_flight": 0}
    consumers = sqs_flight.status(url, "orders")["tables"]["orders"]["consumers"]
    assert "spark-batch-orders" not in consumers, "a released peek leaves no consumer behind"

    again = batch_read(spark, url, maxMessagesPerPartition=100, maxWaitMs=500)
    assert sorted(r.body for r in again.collect()) == [body for body, _, _ in first]


def test_batch_read_with_commit_deletes_what_it_read(spark, rustack, loaded):
    qurl, url, sent = loaded
    df = batch_read(spark, url, commit="true", consumer="once", maxMessagesPerPartition=100, maxWaitMs=500)
    assert sorted(r.body for r in df.collect()) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}
    consumer = sqs_flight.status(url, "orders")["tables"]["orders"]["consumers"]["once"]
    assert consumer["committed_batch"] == 1


@pytest.mark.parametrize("stream", [True, False], ids=["readStream", "read"])
def test_bad_options_fail_at_start_saying_what_to_fix(spark, rustack, loaded, stream):
    _, url, _ = loaded
    assert 'option "url" is missing' in _load_error(spark, stream, {"table": "orders"})
    assert 'option "table" is missing' in _load_error(spark, stream, {"url": url})
    unknown = _load_error(spark, stream, {"url": url, "table": "nope"})
    assert 'unknown table "nope"' in unknown and "orders" in unknown
    dead = f"grpc://127.0.0.1:{free_port()}"
    unreachable = _load_error(spark, stream, {"url": dead, "table": "orders", "timeoutSeconds": "5"})
    assert f"cannot reach the sqs-flight server at {dead}" in unreachable
    bad_number = _load_error(spark, stream, {"url": url, "table": "orders", "partitions": "two"})
    assert "option 'partitions' must be a positive integer" in bad_number
    bad_url = _load_error(spark, stream, {"url": "ftp://x", "table": "orders"})
    assert 'sqs-flight source: option "url": invalid server URL "ftp://x": unsupported scheme "ftp"' in bad_url


def test_a_query_with_a_given_schema_fails_at_start_on_an_unknown_table(spark, loaded, tmp_path):
    _, url, _ = loaded
    schema = "message_id string, body string"
    df = spark.readStream.format("sqs-flight").schema(schema).option("url", url).option("table", "nope").load()
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(Exception, match='unknown table "nope"'):
        query.awaitTermination(120)
    assert not query.isActive


def test_token_option_reaches_the_server(spark, rustack, start_server):
    qurl = rustack.new_queue("token")
    sent = bodies(5, "token")
    rustack.send(qurl, sent)
    server = start_server(rustack, {"orders": qurl}, "--auth-token", "s3cret")
    refused = _load_error(spark, False, {"url": server.url, "table": "orders"})
    assert "UNAUTHENTICATED" in refused or "auth token" in refused
    df = batch_read(spark, server.url, token="s3cret", commit="true", maxWaitMs=500)
    assert sorted(r.body for r in df.collect()) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}
