"""``sqs_flight.write`` / ``Client.write``: rows of pyarrow, Polars, DuckDB
and pandas data sent through the real server's DoPut into moto, checked by
receiving them from moto directly (boto3), not through sqs-flight."""

from __future__ import annotations

import json
from collections import defaultdict

import pyarrow as pa
import pytest

import sqs_flight
from sqs_flight import writing


@pytest.fixture
def queues(moto, start_server):
    std = moto.new_queue("write")
    fifo = moto.new_fifo_queue("write")
    server = start_server(moto, {"orders": std, "ordered": fifo})
    return moto, std, fifo, server.url


def by_body(messages):
    return {m["body"]: m["attributes"] for m in messages}


def test_write_sends_a_pyarrow_table_with_its_attributes(queues):
    moto, std, _, url = queues
    bodies = [json.dumps({"order": i}) for i in range(25)]
    attrs = pa.array([[("n", str(i)), ("kind", "order")] for i in range(25)], pa.map_(pa.string(), pa.string()))
    data = pa.table({"body": bodies, "message_attributes": attrs, "delay_seconds": pa.array([0] * 25, pa.int32())})

    assert sqs_flight.write(url, "orders", data) == 25

    got = moto.receive_all(std, 25)
    assert len(got) == 25
    assert by_body(got) == {b: {"n": str(i), "kind": "order"} for i, b in enumerate(bodies)}
    assert moto.counts(std) == {"visible": 0, "in_flight": 25}


def test_write_sends_a_polars_frame(queues):
    import polars as pl

    moto, std, _, url = queues
    df = pl.DataFrame(
        {
            "body": [f"polars-{i}" for i in range(20)],
            # Polars has no map type: a list of {key, value} structs stands for one.
            "message_attributes": [[{"key": "i", "value": str(i)}] if i % 2 else None for i in range(20)],
            "delay_seconds": [0] * 20,  # Int64
        }
    )
    assert pa.RecordBatchReader.from_stream(df).schema.field("body").type == pa.string_view()

    assert sqs_flight.write(url, "orders", df) == 20

    got = by_body(moto.receive_all(std, 20))
    assert got == {f"polars-{i}": ({"i": str(i)} if i % 2 else {}) for i in range(20)}


def test_client_write_sends_a_duckdb_result(queues):
    import duckdb

    moto, std, _, url = queues
    result = duckdb.sql(
        "SELECT 'duck-' || i AS body, map(['square'], [(i * i)::VARCHAR]) AS message_attributes FROM range(20) t(i)"
    )
    with sqs_flight.Client(url) as client:
        assert client.write("orders", result) == 20

    got = by_body(moto.receive_all(std, 20))
    assert got == {f"duck-{i}": {"square": str(i * i)} for i in range(20)}


def test_write_sends_a_pandas_frame_with_dict_attributes(queues):
    import pandas as pd

    moto, std, _, url = queues
    df = pd.DataFrame(
        {
            "body": ["p0", "p1", "p2"],
            "delay_seconds": [0, None, 0],  # float64 with a NaN, as pandas makes it
            "message_attributes": [{"a": "x", "b": None}, {"a": None, "b": "y"}, None],
        },
        index=[10, 11, 12],  # not sent
    )
    assert sqs_flight.write(url, "orders", df) == 3
    assert by_body(moto.receive_all(std, 3)) == {"p0": {"a": "x"}, "p1": {"b": "y"}, "p2": {}}


def test_delay_seconds_reaches_sqs(queues):
    moto, std, _, url = queues
    data = pa.table({"body": ["later", "now"], "delay_seconds": pa.array([900, None], pa.int64())})
    assert sqs_flight.write(url, "orders", data) == 2
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
    attrs = moto.sqs.get_queue_attributes(QueueUrl=std, AttributeNames=names)["Attributes"]
    # 900 s is longer than any test run: "later" is still delayed when asked.
    assert {k: int(v) for k, v in attrs.items()} == {names[0]: 1, names[1]: 1}
    assert [m["body"] for m in moto.receive_all(std, 1)] == ["now"]


def test_write_to_a_fifo_table_keeps_each_groups_order(queues):
    moto, _, fifo, url = queues
    rows = [{"body": f"e{i}", "message_group_id": f"g{i % 3}", "message_deduplication_id": f"d{i}"} for i in range(30)]
    assert sqs_flight.write(url, "ordered", pa.Table.from_pylist(rows), batch_rows=7) == 30

    got = moto.receive_all(fifo, 30, delete=True)
    per_group = defaultdict(list)
    for m in got:
        per_group[m["group"]].append(m["body"])
    assert dict(per_group) == {f"g{g}": [f"e{i}" for i in range(g, 30, 3)] for g in range(3)}


def test_an_oversized_row_stops_the_write_after_the_rows_before_it(queues):
    moto, std, _, url = queues
    bodies = [f"ok-{i}" for i in range(5)] + ["x" * ((1 << 20) + 1)] + [f"late-{i}" for i in range(3)]
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        sqs_flight.write(url, "orders", pa.table({"body": bodies}))
    e = err.value
    assert e.code == "INVALID_ARGUMENT"
    assert "row 5: message is 1048577 bytes" in str(e) and "above the SQS limit" in str(e)
    assert "5 rows were sent before it" in str(e)
    assert (e.row, e.sent) == (5, 5)
    assert sorted(m["body"] for m in moto.receive_all(std, 5)) == [f"ok-{i}" for i in range(5)]
    assert moto.counts(std) == {"visible": 0, "in_flight": 5}, "nothing after the bad row was sent"


def test_a_fifo_row_without_group_id_stops_the_write(queues):
    moto, _, fifo, url = queues
    groups = ["g"] * 12 + [None] + ["g"] * 2
    data = pa.table({"body": [f"f{i}" for i in range(15)], "message_group_id": groups})
    with pytest.raises(sqs_flight.SqsFlightError) as err:
        sqs_flight.write(url, "ordered", data, batch_rows=5)
    e = err.value
    assert e.code == "INVALID_ARGUMENT"
    assert "row 12: message_group_id is missing" in str(e) and "12 rows were sent before it" in str(e)
    assert (e.row, e.sent) == (12, 12)
    assert [m["body"] for m in moto.receive_all(fifo, 12, delete=True)] == [f"f{i}" for i in range(12)]
    assert moto.counts(fifo) == {"visible": 0, "in_flight": 0}, "nothing after the bad row was sent"


def test_bad_input_is_refused_before_anything_is_sent(queues):
    moto, std, _, url = queues
    with pytest.raises(sqs_flight.SqsFlightError) as unknown:
        sqs_flight.write(url, "orders", pa.table({"body": ["a"], "extra": [1]}))
    assert unknown.value.code == "INVALID_ARGUMENT" and "unknown column `extra`" in str(unknown.value)
    assert unknown.value.sent == 0

    with pytest.raises(sqs_flight.SqsFlightError) as no_body:
        sqs_flight.write(url, "orders", pa.table({"text": ["a"]}))
    assert "needs a `body` column" in str(no_body.value)

    with pytest.raises(sqs_flight.SqsFlightError) as table:
        sqs_flight.write(url, "nope", ["a"])
    assert table.value.code == "NOT_FOUND" and 'unknown table "nope"' in str(table.value)

    with pytest.raises(sqs_flight.SqsFlightError) as fraction:
        sqs_flight.write(url, "orders", pa.table({"body": ["a"], "delay_seconds": [1.5]}))
    assert "must hold whole seconds" in str(fraction.value) and fraction.value.sent == 0

    with pytest.raises(TypeError, match="cannot send a builtins.dict"):
        sqs_flight.write(url, "orders", {"body": "a"})
    assert moto.counts(std) == {"visible": 0, "in_flight": 0}


def test_a_list_of_strings_is_a_list_of_bodies(queues):
    moto, std, _, url = queues
    assert sqs_flight.write(url, "orders", ["one", "two", "three"]) == 3
    assert sorted(m["body"] for m in moto.receive_all(std, 3)) == ["one", "three", "two"]


# -- no server: how input is shaped and cut ------------------------------


def test_batches_are_cut_by_rows_and_by_bytes():
    batch = pa.record_batch({"body": [f"{i:04d}" for i in range(2500)]})
    assert [b.num_rows for b in writing.chunks(batch, 1000, 1 << 30)] == [1000, 1000, 500]
    big = pa.record_batch({"body": ["x" * 1000] * 64})
    sizes = [b.num_rows for b in writing.chunks(big, 1000, 16_500)]
    assert sum(sizes) == 64 and max(sizes) == 16
    pieces = list(writing.chunks(batch, 1000, 1 << 30))
    assert pa.Table.from_batches(pieces).column("body").to_pylist() == batch.column("body").to_pylist()


def test_attribute_shapes_become_a_map_of_strings():
    lists = pa.array(
        [[{"key": "a", "value": "1"}], None, [], [{"key": "b", "value": None}]],
        pa.large_list(pa.struct([("key", pa.string_view()), ("value", pa.string_view())])),
    )
    got = writing.normalize(pa.record_batch({"body": ["w", "x", "y", "z"], "message_attributes": lists}))
    assert got.schema.field("message_attributes").type == writing.ATTRIBUTES_TYPE
    assert got.column("message_attributes").to_pylist() == [[("a", "1")], None, [], [("b", None)]]
    sliced = writing.normalize(pa.record_batch({"body": ["w", "x", "y", "z"], "message_attributes": lists}).slice(3))
    assert sliced.column("message_attributes").to_pylist() == [[("b", None)]]

    structs = pa.array([{"a": "1", "b": None}, None])
    got = writing.normalize(pa.record_batch({"body": ["x", "y"], "message_attributes": structs}))
    assert got.column("message_attributes").to_pylist() == [[("a", "1")], None]

    with pytest.raises(ValueError, match="must be a map of strings"):
        writing.normalize(pa.record_batch({"body": ["x"], "message_attributes": [1]}))
