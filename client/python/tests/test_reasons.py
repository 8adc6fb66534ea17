"""``SqsFlightError.reason``: the server's ``sqsf-reason`` (docs/protocol.md,
"Error reasons") on every refusal, and the client's own for the files it
reads; the branches that read it instead of the message's words."""

from __future__ import annotations

import pickle

import pytest

import sqs_flight
from sqs_flight.client import SqsFlightError, read_pem, read_token_file
from sqs_flight.spark import driver


@pytest.fixture
def server(moto, start_server):
    queue = moto.new_queue("reasons")
    missing = queue.rsplit("/", 1)[0] + "/no-such-queue"
    return start_server(moto, {"orders": queue, "gone": missing})


def refused(call) -> SqsFlightError:  # type: ignore[no-untyped-def]
    with pytest.raises(SqsFlightError) as e:
        call()
    return e.value


def test_the_servers_refusals_carry_their_reason(server):
    with sqsf_client(server) as c:
        cases = [
            (lambda: c.schema("nope"), "NOT_FOUND", "unknown_table"),
            (lambda: c.status("nope"), "NOT_FOUND", "unknown_table"),
            (lambda: c.plan("orders", "r", 1, max_bytes=1 << 40), "INVALID_ARGUMENT", "limit:max_bytes"),
            (lambda: c.plan("orders", "r", 1, max_bytes=0), "INVALID_ARGUMENT", "invalid_argument:max_bytes"),
            (lambda: c.status("gone"), "FAILED_PRECONDITION", "queue_not_found"),
        ]
        for call, code, reason in cases:
            e = refused(call)
            assert (e.code, e.reason) == (code, reason), e
        c.plan("orders", "r", 1, max_wait_ms=0)
        c.commit("orders", "r", 1)
        e = refused(lambda: c.plan("orders", "r", 1))
        assert (e.code, e.reason) == ("FAILED_PRECONDITION", "committed"), e


def sqsf_client(server) -> sqs_flight.Client:  # type: ignore[no-untyped-def]
    return sqs_flight.Client(server.url, timeout=60)


def test_no_server_no_reason():
    from conftest import free_port

    e = refused(lambda: sqs_flight.Client(f"grpc://127.0.0.1:{free_port()}", timeout=5).status())
    assert (e.code, e.reason) == ("UNAVAILABLE", None), e
    assert driver.unreachable(e)


def test_unreachable_is_a_reasonless_transport_failure_whatever_the_text():
    words = "UNAVAILABLE: failed to connect to all addresses; connection refused"
    assert driver.unreachable(SqsFlightError("UNAVAILABLE", words))
    # The server's own UNAVAILABLE is never the transport's, even when its
    # text names the same words (SQS's endpoint refused the connection).
    assert not driver.unreachable(SqsFlightError("UNAVAILABLE", words, reason="sqs_unavailable"))
    assert not driver.unreachable(SqsFlightError("UNAVAILABLE", words, reason="shutting_down"))
    assert not driver.unreachable(SqsFlightError("UNAVAILABLE", "the server went away"))
    assert not driver.unreachable(SqsFlightError("INTERNAL", words))


def test_the_reason_survives_pickling():
    e = SqsFlightError("INVALID_ARGUMENT", "plan command: field", sent=1, row=2, reason="limit:max_bytes")
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.code, str(back), back.sent, back.row, back.reason) == (
        SqsFlightError,
        "INVALID_ARGUMENT",
        "plan command: field",
        1,
        2,
        "limit:max_bytes",
    )
    assert pickle.loads(pickle.dumps(SqsFlightError("INTERNAL", "x"))).reason is None


def test_the_files_the_client_reads_have_their_own_reasons(tmp_path):
    assert refused(lambda: read_token_file(tmp_path / "missing")).reason == "token_file"
    (tmp_path / "empty").write_text("")
    assert refused(lambda: read_token_file(tmp_path / "empty")).reason == "token_file"
    assert refused(lambda: read_pem(str(tmp_path / "missing.pem"))).reason == "tls_root_certs"
    assert refused(lambda: read_pem(b"not a certificate")).reason == "tls_root_certs"


def test_the_spark_option_at_fault_is_told_by_the_reason(tmp_path):
    from sqs_flight.spark import Options

    base = {"url": "grpc://127.0.0.1:1", "table": "demo"}
    # The token file is read first: when both are missing, it is the one named.
    both = {"tokenFile": str(tmp_path / "token"), "tlsRootCerts": str(tmp_path / "token.pem")}
    e = refused(lambda: Options.parse({**base, **both}, "spark-{table}"))
    assert 'option "tokenFile"' in str(e), e
    (tmp_path / "token").write_text("t0ken")
    e = refused(lambda: Options.parse({**base, **both}, "spark-{table}"))
    assert 'option "tlsRootCerts"' in str(e), e
