"""The stream reader as pyspark 4.0 / 4.1 drive it: ``latestOffset()`` with no
argument (no admission control, no start offset). The calls are made in the
order those versions make them, against moto through the real server; the
installed pyspark (4.2+) is only used for its type conversions."""

from __future__ import annotations

import pytest

import sqs_flight
from sqs_flight.spark import Options, SqsFlightStreamReader, spark_schema

from conftest import bodies


@pytest.fixture
def reader(moto, start_server):
    qurl = moto.new_queue("legacy")
    server = start_server(moto, {"orders": qurl})
    options = Options.parse(
        {"url": server.url, "table": "orders", "partitions": "1", "maxWaitMs": "300"}, "spark-{table}"
    )
    schema = spark_schema(sqs_flight.client(server.url).schema("orders"))
    return moto, qurl, server.url, SqsFlightStreamReader(options, schema)


def read_all(reader, start, end):
    rows = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            rows.extend(batch.column(batch.schema.get_field_index("body")).to_pylist())
    return rows


def test_legacy_latest_offset_plans_then_commits_on_the_next_call(reader):
    moto, qurl, url, r = reader
    assert r.initialOffset() == {"batch": 0}
    assert r.latestOffset() == {"batch": 0}, "an empty table gives no new offset"

    sent = bodies(25, "legacy")
    moto.send(qurl, sent)
    end = r.latestOffset()
    assert end == {"batch": 1}
    assert sorted(read_all(r, {"batch": 0}, end)) == sorted(sent)
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 25}, "nothing is deleted before Spark asks again"

    # Spark asks for the next offset once batch 1 is in its commit log.
    assert r.latestOffset() == {"batch": 1}
    r.wait_for_commits()  # the commit runs on the reader's commit thread
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 0}
    consumers = sqs_flight.status(url, "orders")["tables"]["orders"]["consumers"]
    assert consumers["spark-orders"]["committed_batch"] == 1


def test_legacy_restart_resumes_after_the_server_record(reader):
    moto, qurl, url, r = reader
    moto.send(qurl, bodies(5, "first"))
    assert r.latestOffset() == {"batch": 1}
    read_all(r, {"batch": 0}, {"batch": 1})
    r.commit({"batch": 1})
    r.stop()

    # A new driver (restart): its reader starts from what the server knows.
    fresh = SqsFlightStreamReader(r._o, r._schema)
    assert fresh.initialOffset() == {"batch": 1}
    assert fresh.latestOffset() == {"batch": 1}
    moto.send(qurl, bodies(3, "second"))
    assert fresh.latestOffset() == {"batch": 2}
    assert sorted(read_all(fresh, {"batch": 1}, {"batch": 2})) == sorted(bodies(3, "second"))
