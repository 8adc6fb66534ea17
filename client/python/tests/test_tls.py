"""TLS and tokens end to end: the real server binary with ``--tls-cert``,
``--tls-key`` and ``--auth-token-file``, read through pyarrow.flight, the
``sqs_flight`` client and the Spark source.

The certificate is a fresh self-signed one for 127.0.0.1 and localhost, made
with the ``cryptography`` package (a dependency of moto[server], which the
test venv has).
"""

from __future__ import annotations

import json
from typing import List

import pyarrow.flight as flight
import pytest

import sqs_flight

from conftest import TOKEN


def test_the_server_advertises_grpc_tls(tls_server):
    assert tls_server["url"].startswith("grpc+tls://127.0.0.1:")


def test_pyarrow_reads_with_the_ca_and_the_token(tls_server):
    url, pem = tls_server["url"], tls_server["cert"].read_bytes()
    client = flight.FlightClient(url, tls_root_certs=pem)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    cmd = json.dumps({"table": "demo", "consumer": "pyarrow", "partitions": 1, "max_wait_ms": 300})
    info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd), options)
    assert all(loc.uri.decode().startswith("grpc+tls://") for ep in info.endpoints for loc in ep.locations)
    table = client.do_get(info.endpoints[0].ticket, options).read_all()
    assert table.num_rows == 20
    batch = json.loads(info.app_metadata)["batch"]
    action = flight.Action("commit", json.dumps({"table": "demo", "consumer": "pyarrow", "batch": batch}).encode())
    answer = json.loads(next(iter(client.do_action(action, options))).body.to_pybytes())
    assert answer["deleted"] == 20
    client.close()


def test_sqs_flight_client_with_ca_file_and_token_file(tls_server):
    url = tls_server["url"]
    with sqs_flight.Client(url, token_file=tls_server["token_file"], tls_root_certs=str(tls_server["cert"])) as c:
        assert c.tables() == ["demo"]
        t = c.read_batch("demo", "py-client", partitions=1, max_wait_ms=300)
        assert t.num_rows == 20
        assert c.commit("demo", "py-client", sqs_flight.batch_of(t))["deleted"] == 20
    # The PEM itself works as well as its path.
    with sqs_flight.Client(url, token=TOKEN, tls_root_certs=tls_server["cert"].read_bytes()) as c:
        assert c.tables() == ["demo"]


def test_wrong_or_missing_token_is_unauthenticated(tls_server):
    url, cert = tls_server["url"], str(tls_server["cert"])
    for token in (None, TOKEN + "x"):
        with sqs_flight.Client(url, token=token, tls_root_certs=cert) as c:
            with pytest.raises(sqs_flight.SqsFlightError) as err:
                c.tables()
            assert err.value.code == "UNAUTHENTICATED", (token, str(err.value))
            assert "auth token" in str(err.value)


def test_without_the_ca_the_certificate_is_refused(tls_server):
    with sqs_flight.Client(tls_server["url"], token=TOKEN) as c:
        with pytest.raises(sqs_flight.SqsFlightError) as err:
            c.tables()
    assert err.value.code == "UNAVAILABLE", str(err.value)


def test_handshake_with_the_token_as_payload(tls_server):
    class TokenAuth(flight.ClientAuthHandler):
        def __init__(self, token: bytes):
            super().__init__()
            self.token, self.answer = token, b""

        def authenticate(self, outgoing, incoming):
            outgoing.write(self.token)
            self.answer = incoming.read()

        def get_token(self):
            return b""

    client = flight.FlightClient(tls_server["url"], tls_root_certs=tls_server["cert"].read_bytes())
    good = TokenAuth(TOKEN.encode())
    client.authenticate(good)
    assert good.answer == TOKEN.encode()
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.authenticate(TokenAuth(b"nope"))
    client.close()


def test_bad_credential_options_are_named(tmp_path, tls_server):
    from sqs_flight.spark import Options

    base = {"url": tls_server["url"], "table": "demo"}
    parsed = Options.parse(
        {**base, "tokenFile": str(tls_server["token_file"]), "tlsRootCerts": str(tls_server["cert"])},
        "spark-{table}",
    )
    assert parsed.token == TOKEN
    assert parsed.tls_root_certs.startswith("-----BEGIN CERTIFICATE-----"), "the PEM travels, not the path"
    cases: List[tuple] = [
        ({"token": TOKEN, "tokenFile": str(tls_server["token_file"])}, "exclude each other"),
        ({"tokenFile": str(tmp_path / "missing")}, 'option "tokenFile"'),
        ({"tlsRootCerts": str(tmp_path / "missing.pem")}, 'option "tlsRootCerts"'),
        ({"tlsRootCerts": str(tls_server["token_file"])}, "no PEM certificate"),
    ]
    for options, words in cases:
        with pytest.raises(sqs_flight.SqsFlightError) as err:
            Options.parse({**base, **options}, "spark-{table}")
        assert words in str(err.value), (options, str(err.value))


def test_spark_batch_read_over_tls_with_a_token_file(spark, tls_server):
    df = (
        spark.read.format("sqs-flight")
        .option("url", tls_server["url"])
        .option("table", "demo")
        .option("tokenFile", str(tls_server["token_file"]))
        .option("tlsRootCerts", str(tls_server["cert"]))
        .option("maxWaitMs", "300")
        .option("commit", "true")
        .load()
    )
    assert len(df.collect()) == 20
