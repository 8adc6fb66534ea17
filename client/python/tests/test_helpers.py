"""The plain helpers (read_batch, commit, release, status) and the DuckDB and
Polars recipes of the README, against moto through the real server.

Reads use one partition: moto's ReceiveMessage is not atomic, and two
concurrent receives now and then get the same message (SQS's at-least-once,
but it would make exact counts flaky). The Spark tests run on rustack."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import sqs_flight

from conftest import bodies


@pytest.fixture
def queue(moto, start_server):
    url = moto.new_queue("helpers")
    sent = bodies(30, "helpers")
    assert moto.send(url, sent) == 30
    server = start_server(moto, {"orders": url})
    return moto, url, server.url, sent


def test_read_batch_returns_every_message_and_replays_until_commit(queue):
    moto, qurl, url, sent = queue
    table = sqs_flight.read_batch(url, "orders", "etl", partitions=1, max_messages=100, max_wait_ms=300)
    assert sorted(table.column("body").to_pylist()) == sorted(sent)
    batch = sqs_flight.batch_of(table)
    assert set(table.column("batch").to_pylist()) == {batch}

    again = sqs_flight.read_batch(url, "orders", "etl", batch=batch)
    assert again.column("message_id").to_pylist() == table.column("message_id").to_pylist()
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 30}

    answer = sqs_flight.commit(url, "orders", "etl", batch)
    assert answer == {"committed_batch": batch, "deleted": 30, "expired": 0, "rejected": 0}
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 0}


def test_release_makes_the_batch_visible_again(queue):
    moto, qurl, url, sent = queue
    first = sqs_flight.read_batch(url, "orders", "peek", partitions=1, max_messages=100, max_wait_ms=300)
    assert first.num_rows == 30
    assert sqs_flight.release(url, "orders", "peek") == {"released": 30}
    assert moto.counts(qurl) == {"visible": 30, "in_flight": 0}

    second = sqs_flight.read_batch(url, "orders", "peek", partitions=1, max_messages=100, max_wait_ms=300)
    assert sorted(second.column("message_id").to_pylist()) == sorted(first.column("message_id").to_pylist())
    assert set(second.column("receive_count").to_pylist()) == {2}


def test_status_reports_the_consumer_watermark(queue):
    _, _, url, _ = queue
    table = sqs_flight.read_batch(url, "orders", "w", partitions=1, max_messages=100, max_wait_ms=300)
    batch = sqs_flight.batch_of(table)
    before = sqs_flight.status(url, "orders")["tables"]["orders"]["consumers"]["w"]
    assert before["open_batches"] == [batch] and before["in_flight"] == 30
    assert before["committed_batch"] is None
    sqs_flight.commit(url, "orders", "w", batch)
    after = sqs_flight.status(url)["tables"]["orders"]["consumers"]["w"]
    assert after["committed_batch"] == batch and after["in_flight"] == 0


def test_duckdb_queries_a_batch(queue):
    duckdb = _need("duckdb")
    _, _, url, sent = queue
    orders = sqs_flight.read_batch(url, "orders", "duck", partitions=1, max_messages=100, max_wait_ms=300)
    rows = duckdb.sql("SELECT CAST(json_extract(body, '$.n') AS INTEGER) AS n FROM orders ORDER BY n").fetchall()
    assert [r[0] for r in rows] == sorted(json.loads(b)["n"] for b in sent)
    assert sqs_flight.commit(url, "orders", "duck", sqs_flight.batch_of(orders))["deleted"] == 30


def test_polars_reads_a_batch(queue):
    pl = _need("polars")
    _, _, url, sent = queue
    table = sqs_flight.read_batch(url, "orders", "polars", partitions=1, max_messages=100, max_wait_ms=300)
    df = pl.from_arrow(table)
    ns = df.select(pl.col("body").str.json_path_match("$.n").cast(pl.Int64).alias("n")).sort("n")
    assert ns["n"].to_list() == sorted(json.loads(b)["n"] for b in sent)
    assert df.schema["sent_timestamp"] == pl.Datetime("ms", "UTC")


def test_errors_name_the_problem(queue):
    _, _, url, _ = queue
    with pytest.raises(sqs_flight.SqsFlightError) as unknown:
        sqs_flight.read_batch(url, "nope", "x")
    assert unknown.value.code == "NOT_FOUND" and "nope" in str(unknown.value)

    table = sqs_flight.read_batch(url, "orders", "c", partitions=1, max_messages=100, max_wait_ms=300)
    sqs_flight.commit(url, "orders", "c", sqs_flight.batch_of(table))
    with pytest.raises(sqs_flight.SqsFlightError) as committed:
        sqs_flight.read_batch(url, "orders", "c", batch=sqs_flight.batch_of(table))
    assert committed.value.code == "FAILED_PRECONDITION" and "watermark" in str(committed.value)

    with pytest.raises(sqs_flight.SqsFlightError) as bad:
        sqs_flight.read_batch(url, "orders", "c", partitions=100000)
    assert bad.value.code == "INVALID_ARGUMENT" and "partitions" in str(bad.value)


def test_unreachable_server_says_so():
    from conftest import free_port

    url = f"grpc://127.0.0.1:{free_port()}"
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        sqs_flight.Client(url, timeout=5).status()
    assert err.value.code == "UNAVAILABLE"
    assert "cannot reach the sqs-flight server" in str(err.value) and url in str(err.value)


def test_batch_of_refuses_a_foreign_table():
    with pytest.raises(ValueError, match="read_batch"):
        sqs_flight.batch_of(pa.table({"a": [1]}))


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        pytest.fail(f"{module} is not installed: pip install {module}", pytrace=False)


def test_auth_token_is_sent_and_its_absence_is_named(moto, start_server):
    qurl = moto.new_queue("auth")
    moto.send(qurl, bodies(3, "auth"))
    server = start_server(moto, {"orders": qurl}, "--auth-token", "s3cret")
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        sqs_flight.status(server.url)
    assert err.value.code == "UNAUTHENTICATED" and "auth token" in str(err.value)
    table = sqs_flight.read_batch(server.url, "orders", "a", token="s3cret", partitions=1, max_wait_ms=300)
    assert table.num_rows == 3
    assert sqs_flight.commit(server.url, "orders", "a", sqs_flight.batch_of(table), token="s3cret")["deleted"] == 3


def test_an_unreachable_sqs_is_told_apart_from_an_unreachable_server(start_server):
    from conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    server = start_server(None, {"orders": f"{dead}/000000000000/orders"}, "--sqs-endpoint", dead)
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        sqs_flight.Client(server.url, timeout=120).status("orders")
    assert err.value.code == "UNAVAILABLE"
    assert "SQS" in str(err.value) and "cannot reach the sqs-flight server" not in str(err.value)


def test_an_error_keeps_its_name_and_every_field_across_processes():
    import pickle

    from sqs_flight.client import SqsFlightError

    e = pickle.loads(pickle.dumps(SqsFlightError("INVALID_ARGUMENT", "bad row", sent=3, row=4)))
    assert (type(e), e.code, str(e), e.sent, e.row) == (SqsFlightError, "INVALID_ARGUMENT", "bad row", 3, 4)
    assert f"{type(e).__module__}.{type(e).__qualname__}" == "sqs_flight.client.SqsFlightError"
