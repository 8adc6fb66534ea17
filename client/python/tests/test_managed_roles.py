"""Managed mode's IAM role options: ``roleArn``, ``roleExternalId`` and
``roleSessionName`` are checked as STS takes them when the options are
parsed, recorded per table in ``managed.json``, and written to the
server's ``tables.toml`` as the table's ``role_arn``, ``role_external_id``
and ``role_session_name``. Parsing and recording start nothing; a managed server started with a
role reads a queue of the role's account (moto's STS and SQS: moto runs
a call signed by an assumed role in that role's account)."""

from __future__ import annotations

import os
import time

import pytest

from sqs_flight import managed
from sqs_flight.client import SqsFlightError
from sqs_flight.managed import ensure_server
from sqs_flight.managed_process import _tables_toml
from sqs_flight.spark import Options

from support import spec

QUEUE = "https://sqs.eu-west-1.amazonaws.com/210987654321/orders"
ROLE = "arn:aws:iam::210987654321:role/sqs-reader"


def parse(tmp_path, **options: str) -> Options:
    return Options.parse(dict({"queueUrl": QUEUE, "stateDir": str(tmp_path)}, **options), "spark-{table}")


def test_the_role_options_reach_the_managed_server_spec(tmp_path):
    o = parse(tmp_path, roleArn=ROLE, roleExternalId="ext:42/a", roleSessionName="audit-orders")
    assert o.managed is not None
    assert (o.managed.role_arn, o.managed.role_external_id, o.managed.role_session_name) == (
        ROLE,
        "ext:42/a",
        "audit-orders",
    )
    assert o.managed.role() == {"arn": ROLE, "external_id": "ext:42/a", "session_name": "audit-orders"}
    assert parse(tmp_path).managed.role() is None
    assert not (tmp_path / "managed.json").exists(), "parsing starts nothing"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"roleArn": "sqs-reader"}, 'option "roleArn" must be an IAM role ARN'),
        ({"roleArn": "arn:aws:iam::1234:role/r"}, 'option "roleArn" must be an IAM role ARN'),
        ({"roleArn": "arn:aws:iam::210987654321:user/u"}, 'option "roleArn" must be an IAM role ARN'),
        ({"roleArn": "arn:aws:iam::210987654321:role/"}, 'option "roleArn" must be an IAM role ARN'),
        ({"roleExternalId": "ext-42"}, 'option "roleExternalId" needs "roleArn"'),
        ({"roleSessionName": "s-1"}, 'option "roleSessionName" needs "roleArn"'),
        ({"roleArn": ROLE, "roleExternalId": "x"}, 'option "roleExternalId" must be 2 to 1224'),
        ({"roleArn": ROLE, "roleExternalId": "hush hush"}, 'option "roleExternalId" must be 2 to 1224'),
        ({"roleArn": ROLE, "roleSessionName": "a/b"}, 'option "roleSessionName" must be 2 to 64'),
        ({"roleArn": ROLE, "roleSessionName": "s" * 65}, 'option "roleSessionName" must be 2 to 64'),
    ],
)
def test_bad_role_options_are_refused_at_parse_time(tmp_path, options, message):
    with pytest.raises(SqsFlightError) as e:
        parse(tmp_path, **options)
    assert message in str(e.value)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "hush" not in str(e.value), "the external id is never quoted back"


def test_role_options_outside_managed_mode_are_refused():
    with pytest.raises(SqsFlightError, match='option "roleArn" is for managed mode: set "queueUrl"'):
        Options.parse({"url": "grpc://h:1", "table": "t", "roleArn": ROLE}, "spark-{table}")


def test_a_recorded_role_goes_into_the_servers_tables_toml(tmp_path):
    spec = parse(tmp_path, roleArn=ROLE, roleExternalId="ext-42").managed
    record = managed._record_table(tmp_path, {}, spec, write=False)
    assert record["roles"] == {"orders": {"arn": ROLE, "external_id": "ext-42"}}
    toml = _tables_toml(record)
    table = toml.split('[tables."orders"]', 1)[1]
    assert f'role_arn = "{ROLE}"' in table
    assert 'role_external_id = "ext-42"' in table
    assert "role_session_name" not in table, "the server's default, sqs-flight-<table>"
    plain = parse(tmp_path).managed
    assert "role_arn" not in _tables_toml(managed._record_table(tmp_path, {}, plain, write=False))


def test_another_role_for_a_recorded_table_is_refused_without_quoting_the_external_id(tmp_path):
    first = parse(tmp_path, roleArn=ROLE, roleExternalId="hush-one").managed
    record = dict(managed._record_table(tmp_path, {}, first, write=False), token="t")
    same = parse(tmp_path, roleArn=ROLE, roleExternalId="hush-one").managed
    managed._check_clashes(tmp_path, same, record)
    no_role_asked = parse(tmp_path).managed
    managed._check_clashes(tmp_path, no_role_asked, record)  # as recorded
    for other in (
        parse(tmp_path, roleArn=ROLE, roleExternalId="hush-two").managed,
        parse(tmp_path, roleArn="arn:aws:iam::210987654321:role/other").managed,
    ):
        with pytest.raises(SqsFlightError) as e:
            managed._check_clashes(tmp_path, other, record)
        assert "reads table 'orders' as role" in str(e.value)
        assert "hush" not in str(e.value)


def test_a_managed_server_reads_a_queue_of_another_account_as_the_role(moto, state, monkeypatch):
    import boto3

    import sqs_flight

    role = "arn:aws:iam::210987654321:role/managed-reader"
    sts = boto3.client("sts", endpoint_url=moto.endpoint, region_name="us-east-1")
    key = sts.assume_role(RoleArn=role, RoleSessionName="test-setup")["Credentials"]
    owner = boto3.client(
        "sqs",
        endpoint_url=moto.endpoint,
        region_name="us-east-1",
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
        aws_session_token=key["SessionToken"],
    )
    queue = owner.create_queue(QueueName=f"roles-managed-{os.getpid()}-{time.monotonic_ns()}")["QueueUrl"]
    owner.send_message(QueueUrl=queue, MessageBody="from 210987654321")
    with pytest.raises(Exception, match="NonExistentQueue|does not exist"):
        moto.sqs.get_queue_attributes(QueueUrl=queue)  # the driver's own identity cannot see it
    # The server inherits the driver's environment, AWS_ENDPOINT_URL_STS too.
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto.endpoint)
    running = ensure_server(spec(moto, state, queue, role_arn=role, role_external_id="ext-managed"))
    table = managed.table_name_for(queue)
    got = sqs_flight.read_batch(running.url, table, consumer="roles", token=running.token, max_wait_ms=500)
    assert got.column("body").to_pylist() == ["from 210987654321"]
    text = (state / "tables.toml").read_text()
    assert f'role_arn = "{role}"' in text and 'role_external_id = "ext-managed"' in text
    assert oct((state / "tables.toml").stat().st_mode & 0o777) == "0o600", "it holds the external id"
