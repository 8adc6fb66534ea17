"""Typed payloads in Spark: a table declared with a payload schema in the
server's TOML has a ``payload`` struct column (and ``payload_error``) in the
sqs-flight source's schema, taken from the server's GetSchema; a Structured
Streaming query selects ``payload.*`` fields. Real server, moto, PySpark."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Dict, List

import pyarrow as pa
import pytest
from pyspark.sql.functions import col
from pyspark.sql.types import (
    ArrayType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sqs_flight.spark import spark_type

from support import run_available_now

PAYLOAD_TOML = """
[tables.events]
queue_url = "{queue_url}"
receivers = 1  # moto: see conftest.start_server
[tables.events.payload]
fields = [
  {{ name = "user", type = "utf8" }},
  {{ name = "n", type = "int64" }},
  {{ name = "big", type = "uint64" }},
  {{ name = "at", type = "timestamp", unit = "ms", timezone = "UTC" }},
  {{ name = "local", type = "timestamp", unit = "ns" }},
  {{ name = "day", type = "date32" }},
  {{ name = "tags", type = "list", item = {{ type = "utf8" }} }},
  {{ name = "geo", type = "struct", fields = [
      {{ name = "lat", type = "float64" }},
      {{ name = "zone", type = "uint8" }},
  ] }},
]
"""


def event(i: int) -> str:
    return json.dumps(
        {
            "user": f"u{i}",
            "n": i,
            "big": 2**64 - 1 - i,
            "at": f"2026-01-0{1 + i % 9}T10:00:00Z",
            "local": "2026-03-01T08:30:00.123456789",
            "day": "2026-02-03",
            "tags": ["a", f"t{i}"],
            "geo": {"lat": i / 2, "zone": i},
            "ignored": "fields the schema does not name are dropped",
        }
    )


BAD = {
    "not json {": "body is not a JSON object",
    '{"user": "x", "n": "seven"}': 'failed to parse "seven" as Int64',
    "[1, 2]": "body is not a JSON object",
}


@pytest.fixture
def events(moto, start_server, tmp_path):
    qurl = moto.new_queue("payload")
    good = [event(i) for i in range(8)]
    assert moto.send(qurl, good + list(BAD)) == len(good) + len(BAD)
    config = tmp_path / "server.toml"
    config.write_text(PAYLOAD_TOML.format(queue_url=qurl))
    server = start_server(moto, {}, "--config", str(config))
    return moto, qurl, server.url


def test_a_stream_selects_payload_fields_and_bad_bodies_carry_an_error(spark, events, tmp_path):
    moto, qurl, url = events
    stream = (
        spark.readStream.format("sqs-flight")
        .option("url", url)
        .option("table", "events")
        .option("partitions", "1")
        .option("maxWaitMs", "500")
        .load()
    )
    payload = stream.schema["payload"].dataType
    assert payload == StructType(
        [
            StructField("user", StringType()),
            StructField("n", LongType()),
            StructField("big", DecimalType(20, 0)),
            StructField("at", TimestampType()),
            StructField("local", TimestampNTZType()),
            StructField("day", DateType()),
            StructField("tags", ArrayType(StringType())),
            StructField("geo", StructType([StructField("lat", DoubleType()), StructField("zone", ShortType())])),
        ]
    )
    assert stream.schema["payload_error"].dataType == StringType()

    rows: List[Dict] = []

    def collect(df, batch_id: int) -> None:
        picked = df.select(
            "body",
            "payload.user",
            "payload.n",
            "payload.big",
            col("payload.at").cast("long").alias("at_epoch_s"),
            "payload.local",
            "payload.day",
            "payload.tags",
            "payload.geo.lat",
            "payload.geo.zone",
            "payload",
            "payload_error",
        )
        rows.extend(r.asDict() for r in picked.collect())

    run_available_now(stream.writeStream.foreachBatch(collect), tmp_path / "ck")

    assert len(rows) == 8 + len(BAD)
    by_body = {r["body"]: r for r in rows}
    for i in range(8):
        r = by_body[event(i)]
        assert r["payload_error"] is None
        assert (r["user"], r["n"], r["big"]) == (f"u{i}", i, Decimal(2**64 - 1 - i))
        at = dt.datetime(2026, 1, 1 + i % 9, 10, 0, tzinfo=dt.timezone.utc)
        assert r["at_epoch_s"] == int(at.timestamp())
        assert r["local"] == dt.datetime(2026, 3, 1, 8, 30, 0, 123456)  # ns truncated to us
        assert (r["day"], r["tags"], r["lat"], r["zone"]) == (dt.date(2026, 2, 3), ["a", f"t{i}"], i / 2, i)
    for body, reason in BAD.items():
        r = by_body[body]
        assert r["payload"] is None and r["user"] is None
        assert reason in r["payload_error"], r["payload_error"]
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 0}, "bad bodies are committed like the rest"


def test_arrow_types_map_to_spark_types_spark_can_hold():
    assert spark_type(pa.uint8()) == ShortType()
    assert spark_type(pa.uint16()) == IntegerType()
    assert spark_type(pa.uint32()) == LongType()
    assert spark_type(pa.uint64()) == DecimalType(20, 0)
    assert spark_type(pa.timestamp("s", "Europe/Paris")) == TimestampType()
    assert spark_type(pa.timestamp("ns")) == TimestampNTZType()
    nested = pa.struct([("xs", pa.list_(pa.struct([("u", pa.uint32())]))), ("m", pa.map_(pa.string(), pa.uint16()))])
    assert spark_type(nested) == StructType(
        [
            StructField("xs", ArrayType(StructType([StructField("u", LongType())]))),
            StructField("m", MapType(StringType(), IntegerType())),
        ]
    )
