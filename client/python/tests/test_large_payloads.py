"""Large payloads: the SQS Extended Client format against the Python
extended client library (PyPI ``amazon-sqs-extended-client``). What it
sends, small and over 1 MiB, is read as its payloads through pyarrow.flight
and through Spark (managed mode, ``largePayloads``), exactly once, a pointer
whose object is gone kept as a row with ``payload_error``; what sqs-flight's
DoPut offloads to S3, the library reads back as the original bodies. Real
server; moto serves both S3 and SQS."""

from __future__ import annotations

import json
import uuid
from typing import Dict, List, Tuple

import boto3
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import sqs_flight
from sqs_flight.client import SqsFlightError
from sqs_flight.managed import table_name_for
from sqs_flight.spark import Options
from sqs_flight.spark.driver import connect

from conftest import poll
from support import run_available_now

POINTER_CLASS = "software.amazon.payloadoffloading.PayloadS3Pointer"
KIB = 1024


def payload(tag: str, size: int) -> str:
    """A JSON body of about ``size`` bytes, with a character of several
    UTF-8 bytes, so that bytes and not characters must match."""
    head = json.dumps({"tag": tag, "text": "é€"}, ensure_ascii=False)[:-1]
    return head + ', "pad": "' + "x" * max(0, size - len(head.encode()) - 12) + '"}'


class Payloads:
    """A bucket in moto and the extended client that offloads to it."""

    def __init__(self, moto, bucket: str):
        self.moto = moto
        self.bucket = bucket
        self.s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
        self.s3.create_bucket(Bucket=bucket)
        # The library makes its S3 client with the SQS client, from the
        # environment alone (it takes no endpoint): set only for that moment,
        # so that the servers of these tests reach S3 by their own settings.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("AWS_ENDPOINT_URL_S3", moto.endpoint)
            from sqs_extended_client import SQSExtendedClientSession

            self.sqs = SQSExtendedClientSession(region_name="us-east-1").client("sqs", endpoint_url=moto.endpoint)
        self.sqs.large_payload_support = bucket

    def keys(self) -> List[str]:
        return [o["Key"] for o in self.s3.list_objects_v2(Bucket=self.bucket).get("Contents", [])]

    def receive(self, queue: str, n: int) -> List[Tuple[str, Dict[str, str]]]:
        """``(body, attributes)`` of ``n`` messages, as the library reads them."""
        got: List[Tuple[str, Dict[str, str]]] = []
        for _ in range(20):
            out = self.sqs.receive_message(
                QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
            )
            for m in out.get("Messages", []):
                got.append((m["Body"], {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}))
            if len(got) >= n:
                break
        return got

    def send(self, queue: str, bodies: List[str]) -> Dict[str, str]:
        """``{message id: body}`` of what the extended client sent."""
        return {self.sqs.send_message(QueueUrl=queue, MessageBody=b)["MessageId"]: b for b in bodies}

    def produce(self, queue: str) -> Tuple[Dict[str, str], Dict[str, str]]:
        """Sends small, offloaded (over 256 KiB) and over-1-MiB payloads, and
        two whose S3 object is deleted before any read: ``(sent, gone)``,
        each ``{message id: body as sent}``."""
        gone = self.send(queue, [payload(f"gone-{i}", 300 * KIB) for i in range(2)])
        deleted = self.keys()
        assert len(deleted) == 2
        for key in deleted:
            self.s3.delete_object(Bucket=self.bucket, Key=key)
        sizes = [200] * 4 + [100 * KIB, 300 * KIB, 900 * KIB] + [1536 * KIB, 3 * 1024 * KIB]
        sent = self.send(queue, [payload(f"p{i}", size) for i, size in enumerate(sizes)])
        assert len(self.keys()) == 4, "the library offloaded the four bodies over 256 KiB"
        return sent, gone


@pytest.fixture
def payloads(moto) -> Payloads:
    return Payloads(moto, f"payloads-{uuid.uuid4().hex[:10]}")


def check_rows(rows: List[Dict], sent: Dict[str, str], gone: Dict[str, str], bucket: str) -> None:
    """Every message exactly once: payloads in ``body``, byte for byte; a
    pointer to a deleted object keeps its pointer and says why."""
    ids = [r["message_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a message came twice"
    assert set(ids) == set(sent) | set(gone), "the rows are the messages sent, none missing, none other"
    for r in rows:
        if r["message_id"] in sent:
            assert r["body"].encode() == sent[r["message_id"]].encode(), r["message_id"]
            assert r["payload_error"] is None, r["payload_error"]
        else:
            pointer = json.loads(r["body"])
            assert pointer[0] == POINTER_CLASS and pointer[1]["s3BucketName"] == bucket, r["body"]
            assert pointer[1]["s3Key"] in r["payload_error"], "a missing object is said so, by its key"


def read_once(url: str, table: str, consumer: str) -> List[Dict]:
    """Plain pyarrow.flight: plan, DoGet, commit, until a batch is empty."""
    client = flight.FlightClient(url)
    rows: List[Dict] = []
    try:
        for _ in range(20):
            cmd = {"table": table, "consumer": consumer, "partitions": 1, "max_wait_ms": 500}
            info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(cmd)))
            got = [r for ep in info.endpoints for r in client.do_get(ep.ticket).read_all().to_pylist()]
            commit = dict(table=table, consumer=consumer, batch=json.loads(info.app_metadata)["batch"])
            answer = json.loads(
                next(iter(client.do_action(flight.Action("commit", json.dumps(commit).encode())))).body.to_pybytes()
            )
            assert answer["deleted"] == len(got), answer
            rows += got
            if not got:
                return rows
    finally:
        client.close()
    pytest.fail("the queue did not run dry in 20 batches")


def test_extended_client_messages_are_read_through_flight_as_their_payloads_exactly_once(
    payloads, moto, start_server, tmp_path
):
    queue = moto.new_queue("lp-read")
    sent, gone = payloads.produce(queue)
    config = tmp_path / "server.toml"
    config.write_text(f'[tables.lp]\nqueue_url = "{queue}"\nreceivers = 1\n\n[tables.lp.large_payloads]\nread = true\n')
    server = start_server(moto, {}, "--config", str(config), "--s3-endpoint", moto.endpoint)

    rows = read_once(server.url, "lp", "flight")

    check_rows(rows, sent, gone, payloads.bucket)
    for r in rows:
        # Dropped with the pointer; a row that keeps its pointer keeps it too.
        reserved = "ExtendedPayloadSize" in dict(r["message_attributes"])
        assert reserved == (r["message_id"] in gone), r
    assert moto.counts(queue) == {"visible": 0, "in_flight": 0}, "every row's message was deleted once"


def test_extended_client_messages_are_read_through_spark_in_managed_mode(spark, payloads, moto, tmp_path):
    queue = moto.new_queue("lp-spark")
    sent, gone = payloads.produce(queue)
    state = tmp_path / "state"
    options = {
        "queueUrl": queue,
        "sqsEndpoint": moto.endpoint,
        "s3Endpoint": moto.endpoint,
        "region": "us-east-1",
        "stateDir": str(state),
        "largePayloads": "true",
        "largePayloadBucket": payloads.bucket,
        "rejectPayloadErrors": "true",
    }
    rows: List[Dict] = []

    def collect(df, batch_id: int) -> None:
        rows.extend(r.asDict() for r in df.select("message_id", "body", "payload_error").collect())

    reader = spark.readStream.format("sqs-flight").options(**options)
    # moto's ReceiveMessage is not atomic (conftest.start_server): one receiver.
    stream = reader.option("partitions", "1").option("receiversPerPartition", "1").option("maxWaitMs", "500")
    run_available_now(stream.load().writeStream.foreachBatch(collect), tmp_path / "ck")

    check_rows(rows, sent, {}, payloads.bucket)
    # rejectPayloadErrors: the pointers whose object is gone went back to SQS,
    # as they came, and only they. A receive of the batch read ahead that
    # was still long-polling when the run stopped may have taken them again:
    # it hands them back when it ends (docs/protocol.md, rule 7).
    expected = {"visible": len(gone), "in_flight": 0}
    poll("the rejected pointers back in the queue", lambda: moto.counts(queue) == expected, 10)
    for m in moto.receive_all(queue, len(gone), delete=True):
        assert json.loads(m["body"])[1]["s3BucketName"] == payloads.bucket and "ExtendedPayloadSize" in m["attributes"]

    # largePayloadBucket: the Spark sink, through the managed server's table,
    # offloads what is over 256 KiB, and the library reads it back.
    managed = json.loads((state / "managed.json").read_text())
    back = [payload("small", 100), payload("big", 1536 * KIB)]
    before = set(payloads.keys())
    (
        spark.createDataFrame([(b,) for b in back], "body string")
        .write.format("sqs-flight")
        .mode("append")
        .option("url", managed["url"])
        .option("token", managed["token"])
        .option("table", table_name_for(queue))
        .save()
    )
    assert len(set(payloads.keys()) - before) == 1, "the big body went to S3"
    assert sorted(b for b, _ in payloads.receive(queue, 2)) == sorted(back)
    # The table is served one way: a query that asks otherwise is refused.
    with pytest.raises(SqsFlightError, match='option "largePayloads" true, not false'):
        connect(Options.parse(dict(options, largePayloads="false"), "spark-{table}"))


def test_what_sqs_flight_writes_is_read_back_by_the_extended_client(payloads, moto, start_server, tmp_path):
    queue = moto.new_queue("lp-write")
    config = tmp_path / "server.toml"
    config.write_text(
        f'[tables.out]\nqueue_url = "{queue}"\n\n'
        f'[tables.out.large_payloads]\nbucket = "{payloads.bucket}"\nprefix = "in/"\n'
    )
    server = start_server(moto, {}, "--config", str(config), "--s3-endpoint", moto.endpoint)
    sizes = [100, 200 * KIB, 300 * KIB, 1536 * KIB, 5 * 1024 * KIB]
    bodies = [payload(f"w{i}", size) for i, size in enumerate(sizes)]
    attributes = pa.array([[("n", str(i))] for i in range(len(bodies))], pa.map_(pa.string(), pa.string()))

    assert sqs_flight.write(server.url, "out", pa.table({"body": bodies, "message_attributes": attributes})) == 5

    keys = payloads.keys()
    assert len(keys) == 3 and all(k.startswith("in/") for k in keys), "the three bodies over 256 KiB are in S3"
    got = payloads.receive(queue, len(bodies))
    assert sorted(got) == sorted((b, {"n": str(i)}) for i, b in enumerate(bodies))


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("largePayloads", "yes", "option 'largePayloads' must be true or false, got 'yes'"),
        ("largePayloadBucket", "s3://payloads/in", "option 'largePayloadBucket' must be an S3 bucket name"),
        ("largePayloadBucket", "Payloads", "option 'largePayloadBucket' must be an S3 bucket name"),
        ("s3Endpoint", "127.0.0.1:9000", "option 's3Endpoint' must be an http:// or https:// URL"),
    ],
)
def test_a_bad_large_payload_option_is_refused_by_name(option: str, value: str, says: str):
    with pytest.raises(SqsFlightError) as e:
        Options.parse({"queueUrl": "https://sqs.us-east-1.amazonaws.com/1/q", option: value}, "spark-{table}")
    assert e.value.code == "INVALID_ARGUMENT" and says in str(e.value), e.value
    with pytest.raises(SqsFlightError, match=f'option "{option}" is for managed mode'):
        Options.parse({"url": "grpc://127.0.0.1:1", "table": "t", option: "true"}, "spark-{table}")
