"""Managed mode trusts nothing it did not start: the token goes only to a
listener the recorded process owns, a signal only to the recorded process
(checked again right before it), each start makes a new token, plaintext
off loopback needs an option that says so, the server binds the address
it advertises, and it gets no stray ``SQSF_*`` variable of the driver.

The impostor is another process on the recorded port: a Flight server that
writes down every header it is sent and answers ``server_info`` with the
recorded instance id and the pid of a bystander process."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Set

import pytest

from sqs_flight import managed, managed_process
from sqs_flight.client import Client, SqsFlightError
from sqs_flight.managed import ensure_server
from sqs_flight.managed_process import Found, listener_not_owned

from conftest import Proc, wait_until
from support import gone, info, record, spec

IMPOSTOR = textwrap.dedent("""
    import json, sys
    import pyarrow.flight as fl

    port, headers_path, ready_path, answer = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

    class Record(fl.ServerMiddlewareFactory):
        def start_call(self, info, headers):
            seen = {k: [v if isinstance(v, str) else v.decode(errors="replace") for v in vs]
                    for k, vs in headers.items()}
            with open(headers_path, "a") as f:
                f.write(json.dumps({"method": str(info.method), "headers": seen}) + "\\n")
            return None

    class Impostor(fl.FlightServerBase):
        def do_action(self, context, action):
            yield fl.Result(answer.encode())

    server = Impostor(f"grpc://127.0.0.1:{port}", middleware={"record": Record()})
    with open(ready_path, "w") as f:
        f.write("listening")
    server.serve()
""")


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])


def stop(p: subprocess.Popen) -> None:
    p.kill()
    p.wait(timeout=30)


def listening_addresses(port: int) -> Set[str]:
    """The addresses of the TCP sockets that listen on ``port``, from
    ``/proc/net/tcp`` and ``tcp6`` (little-endian hex words)."""
    found = set()
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:
                continue
            raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8))
            found.add(str(ipaddress.ip_address(raw[:size])))
    return found


@pytest.mark.parametrize("how", ["exited when idle", "killed", "still exiting"])
def test_an_impostor_on_the_recorded_port_gets_no_token_and_nothing_is_signalled(moto, state, logs, how):
    queue = moto.new_queue("impostor")
    running = ensure_server(spec(moto, state, queue))
    stale = record(state)
    if how == "killed":
        os.kill(running.pid, 9)  # leaves ready.json behind
    else:
        managed.stop_server(str(state))  # as an idle exit: a clean exit, managed.json stays
    assert gone(running.pid)
    exiting = None
    if how == "still exiting":
        # The recorded process still runs (pid, start time and command line
        # its own) but no longer listens, as a server between closing its
        # listener and exiting: only the listener check keeps the token.
        exiting = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", "sqs-flight-server", str(state / "registry")]
        )
        stale.update(pid=exiting.pid, pid_start=managed.process_start(exiting.pid))
        (state / "managed.json").write_text(json.dumps(stale))
    # Another local user's process takes the recorded port; it answers
    # server_info as the recorded server would (but for the table, which
    # would make a driver restart it) and names a bystander's pid.
    bystander = sleeper()
    headers, ready = state.parent / "impostor-headers.jsonl", state.parent / "impostor-ready"
    answer = json.dumps({"instance_id": stale["instance_id"], "pid": bystander.pid, "tables": []})
    impostor = Proc(
        "impostor", [sys.executable, "-c", IMPOSTOR, str(stale["port"]), str(headers), str(ready), answer], logs
    )
    try:
        wait_until("the impostor", ready.exists, impostor)
        again = ensure_server(spec(moto, state, queue))
        assert bystander.poll() is None, "the pid a listener named was signalled"
        assert impostor.popen.poll() is None, "the impostor was signalled"
        seen = headers.read_text() if headers.exists() else ""
        assert stale["token"] not in seen and again.token not in seen, f"the impostor got a token: {seen}"
        assert "authorization" not in seen.lower(), seen
        assert again.pid not in (bystander.pid, impostor.popen.pid)
        assert again.url != stale["url"], "the new server is not where the impostor listens"
        assert info(again)["instance_id"] == again.instance_id
        if exiting is not None:
            assert gone(exiting.pid), "the recorded process, confirmed, is stopped"
    finally:
        impostor.stop()
        stop(bystander)
        if exiting is not None:
            stop(exiting)


def test_a_pid_told_by_a_listener_is_checked_again_right_before_the_signal(state):
    managed.private_state_dir(str(state))
    # Even with the command line a recorded server has, a process whose
    # start time is not the recorded one gets no signal, whatever answered.
    victim = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "sqs-flight-server", str(state / "registry")]
    )
    try:
        told = Found({"instance_id": "x", "pid": victim.pid, "tables": []}, victim.pid, "1", "")
        managed_process.stop_found(state, told)
        assert not gone(victim.pid, within=1), "signalled"
    finally:
        stop(victim)


def test_the_token_is_sent_only_to_a_listener_the_process_owns():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"grpc://127.0.0.1:{s.getsockname()[1]}"
        assert listener_not_owned(os.getpid(), url) is None
        other = sleeper()
        try:
            why = listener_not_owned(other.pid, url)
            assert why and f"another process than pid {other.pid} listens" in why, why
        finally:
            stop(other)
    assert "nothing listens" in listener_not_owned(os.getpid(), url)


def test_each_start_makes_a_new_token_and_the_last_one_is_refused(moto, state):
    a, b = moto.new_queue("token-a"), moto.new_queue("token-b")
    first = ensure_server(spec(moto, state, a))
    assert ensure_server(spec(moto, state, a)).token == first.token, "a running server keeps its token"
    managed.stop_server(str(state))
    assert gone(first.pid)
    second = ensure_server(spec(moto, state, a))
    third = ensure_server(spec(moto, state, b))  # a restart, to add a table
    assert len({first.token, second.token, third.token}) == 3
    assert record(state)["token"] == third.token
    for old in (first.token, second.token):
        with pytest.raises(SqsFlightError) as e:
            with Client(third.url, token=old, timeout=5) as c:
                c._action("server_info", {})
        assert e.value.code == "UNAUTHENTICATED", e.value


def test_the_server_gets_no_stray_sqsf_variable_of_the_driver(moto, state, monkeypatch):
    monkeypatch.setenv("SQSF_STRAY_FOR_TEST", "from the driver")
    monkeypatch.setenv("SQSF_AUTH_TOKEN", "the driver's own")
    monkeypatch.setenv("AWS_STRAY_FOR_TEST", "kept")
    running = ensure_server(spec(moto, state, moto.new_queue("env")))
    raw = Path(f"/proc/{running.pid}/environ").read_bytes().split(b"\0")
    env = dict(kv.decode().split("=", 1) for kv in raw if kv)
    assert sorted(k for k in env if k.startswith("SQSF_")) == ["SQSF_AUTH_TOKEN"], env.keys()
    assert env["SQSF_AUTH_TOKEN"] == running.token
    assert env["AWS_STRAY_FOR_TEST"] == "kept" and env["AWS_ACCESS_KEY_ID"] == os.environ["AWS_ACCESS_KEY_ID"]


@pytest.fixture
def own_address() -> str:
    """This host's address off loopback (the sandbox's own interface; the
    server listens there only for the test, with a token of its own)."""
    own = managed._own_address()
    assert own is not None, (
        "this test needs an address of this host off loopback (an interface such as eth0 "
        "with an IPv4 address); give the host one"
    )
    return own


def test_plaintext_off_loopback_needs_its_option_and_the_server_binds_the_advertised_address(moto, state, own_address):
    queue = moto.new_queue("plain")
    plain = spec(moto, state, queue, advertise_host=own_address, tls=False)
    with pytest.raises(SqsFlightError) as e:
        ensure_server(plain)
    assert e.value.code == "INVALID_ARGUMENT" and '"serverPlaintextOffLoopback" to true' in str(e.value), e.value
    assert not state.exists(), "nothing was started"
    running = ensure_server(dataclasses.replace(plain, plaintext_off_loopback=True))
    port = record(state)["port"]
    assert running.url == f"grpc://{own_address}:{port}"
    assert listening_addresses(port) == {own_address}, "the advertised address only, not every interface"
    assert info(running)["pid"] == running.pid
    # TLS (the default off loopback) binds the advertised address too.
    tls = ensure_server(spec(moto, state, queue, advertise_host=own_address))
    port = record(state)["port"]
    assert tls.url == f"grpc+tls://{own_address}:{port}" and listening_addresses(port) == {own_address}


def test_bind_address_is_the_advertised_one():
    assert managed._bind_host("10.0.0.7") == "10.0.0.7"
    assert managed._bind_host("localhost") == "127.0.0.1" and managed._bind_host("::1") == "::1"
    with pytest.raises(SqsFlightError, match="does not resolve"):
        managed._bind_host("no-such-host.invalid")


@pytest.mark.parametrize(
    "extra, refused",
    [
        ({"serverTls": "false"}, True),
        ({"serverTls": "false", "serverPlaintextOffLoopback": "true"}, False),
        ({}, False),  # TLS
        ({"serverTls": "false", "advertiseHost": "127.0.0.1"}, False),  # loopback
    ],
)
def test_the_plaintext_option_is_checked_when_options_are_parsed(extra, refused, tmp_path):
    from sqs_flight.spark import Options

    options = {
        "queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q",
        "stateDir": str(tmp_path),
        "advertiseHost": "10.1.2.3",
        **extra,
    }
    if refused:
        with pytest.raises(SqsFlightError, match='set "serverPlaintextOffLoopback" to true') as e:
            Options.parse(options, "spark-{table}")
        assert e.value.code == "INVALID_ARGUMENT"
    else:
        o = Options.parse(options, "spark-{table}")
        assert o.managed.plaintext_off_loopback == (extra.get("serverPlaintextOffLoopback") == "true")
    with pytest.raises(SqsFlightError, match='"serverPlaintextOffLoopback" is for managed mode'):
        Options.parse({"url": "grpc://h:1", "table": "t", "serverPlaintextOffLoopback": "true"}, "c")


def test_a_task_planned_before_a_restart_is_told_the_token_changed(tmp_path, monkeypatch):
    from pyspark.sql.types import StructType

    from sqs_flight.spark import FlightPartition, Options, SqsFlightStreamReader

    o = Options.parse(
        {
            "queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q",
            "stateDir": str(tmp_path),
            "advertiseHost": "127.0.0.1",
        },
        "spark-{table}",
    )
    reader = SqsFlightStreamReader.__new__(SqsFlightStreamReader)  # executor side: no watchdog
    reader._o, reader._schema = o, StructType([])

    def refused(partition):
        raise SqsFlightError("UNAUTHENTICATED", "DoGet refused by grpc://127.0.0.1:1: invalid bearer token")

    monkeypatch.setattr(reader, "_batches", refused)
    with pytest.raises(SqsFlightError) as e:
        list(reader.read(FlightPartition(b"ticket", ("grpc://127.0.0.1:1",), "an old token")))
    assert e.value.code == "UNAUTHENTICATED"
    assert "started again since this batch was planned" in str(e.value) and "restart the query" in str(e.value)
