"""``Client.commit(reject=...)`` against moto through the real server: the
rejected message goes back to SQS, to the dead-letter queue once its
redrive policy's maxReceiveCount is reached; everything else is deleted
once; a reject the server cannot do changes nothing.

Reads use one partition (see test_helpers.py: moto's receives are not
atomic)."""

from __future__ import annotations

import json
from typing import Dict, List, Tuple

import pytest

import sqs_flight
from sqs_flight.client import Client, SqsFlightError

MAX_RECEIVE = 2


@pytest.fixture
def poison_queue(moto, start_server) -> Tuple[object, str, str, Client]:
    dlq = moto.new_queue("dlq")
    arn = moto.sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    name = "poison-" + dlq.rsplit("-", 1)[-1]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": MAX_RECEIVE})
    attrs = {"VisibilityTimeout": "600", "RedrivePolicy": policy}
    url = moto.sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
    server = start_server(moto, {"orders": url})
    client = Client(server.url)
    yield moto, url, dlq, client
    client.close()


def read(client: Client, batch: int) -> List[Dict[str, object]]:
    table = client.read_batch("orders", "etl", batch, partitions=1, max_messages=100, max_wait_ms=300)
    return table.select(["message_id", "body", "receive_count"]).to_pylist()


def test_a_rejected_poison_message_reaches_the_dlq_and_the_rest_is_deleted_once(poison_queue):
    moto, url, dlq, client = poison_queue
    assert moto.send(url, ["poison"]) == 1
    sent: List[str] = []
    deleted: List[str] = []
    for run in range(1, MAX_RECEIVE + 2):
        fresh = [f"run{run}-m{i}" for i in range(4)]
        assert moto.send(url, fresh) == 4
        sent += fresh
        rows = read(client, run)
        poison = [r for r in rows if r["body"] == "poison"]
        if run <= MAX_RECEIVE:
            assert [r["receive_count"] for r in poison] == [run]
        else:
            assert poison == [], "moved to the dead-letter queue"
        answer = client.commit("orders", "etl", run, reject=[r["message_id"] for r in poison])
        assert answer == {"committed_batch": run, "deleted": 4, "expired": 0, "rejected": len(poison)}
        deleted += [r["body"] for r in rows if r["body"] != "poison"]
    assert sorted(deleted) == sorted(sent), "every other message deleted exactly once"
    assert moto.counts(url) == {"visible": 0, "in_flight": 0}
    assert [m["body"] for m in moto.receive_all(dlq, expect=2)] == ["poison"]


def test_a_reject_the_server_cannot_do_changes_nothing(poison_queue):
    moto, url, _, client = poison_queue
    assert moto.send(url, ["a", "b", "c"]) == 3
    rows = read(client, 1)
    with pytest.raises(SqsFlightError) as refused:
        client.commit("orders", "etl", 1, reject=[rows[0]["message_id"], "no-such-id"])
    assert refused.value.code == "INVALID_ARGUMENT"
    assert '"no-such-id"' in str(refused.value)
    assert moto.counts(url) == {"visible": 0, "in_flight": 3}
    with pytest.raises(SqsFlightError) as refused:
        client.commit("orders", "etl", 1, reject=[rows[0]["message_id"]], reject_delay_seconds=43_201)
    assert "reject_delay_seconds" in str(refused.value)
    with pytest.raises(TypeError):
        client.commit("orders", "etl", 1, reject=rows[0]["message_id"])  # type: ignore[arg-type]
    assert client.status("orders")["tables"]["orders"]["consumers"]["etl"]["committed_batch"] is None

    # A delay with nothing to reject is not sent: the plain commit works.
    answer = client.commit("orders", "etl", 1, reject=[], reject_delay_seconds=30)
    assert answer == {"committed_batch": 1, "deleted": 3, "expired": 0, "rejected": 0}


def test_a_delayed_reject_stays_hidden(poison_queue):
    moto, url, _, client = poison_queue
    assert moto.send(url, ["later"]) == 1
    rows = read(client, 1)
    answer = client.commit("orders", "etl", 1, reject=[rows[0]["message_id"]], reject_delay_seconds=600)
    assert answer["rejected"] == 1
    assert moto.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
    assert moto.counts(url) == {"visible": 0, "in_flight": 1}
    consumer = client.status("orders")["tables"]["orders"]["consumers"]["etl"]
    assert consumer["rejected"] == 1


def test_the_module_level_commit_rejects_too(poison_queue):
    moto, url, _, client = poison_queue
    assert moto.send(url, ["keep", "back"]) == 2
    rows = read(client, 1)
    back = [r["message_id"] for r in rows if r["body"] == "back"]
    answer = sqs_flight.commit(client.url, "orders", "etl", 1, reject=back, reject_delay_seconds=600)
    assert answer == {"committed_batch": 1, "deleted": 1, "expired": 0, "rejected": 1}
    assert moto.counts(url) == {"visible": 0, "in_flight": 1}, "given back, hidden for the delay"
