"""Managed servers without Spark: ``sqs_flight.managed`` as the Spark
source's driver side calls it, against the real server binary and moto.

What is asserted is what a process can observe: which pid serves, whether
a process got a signal, a file's mode, what ``managed.json`` keeps."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sqs_flight import managed
from sqs_flight.client import Client, SqsFlightError
from sqs_flight.managed import ManagedServer, ensure_server

from conftest import poll, server_bin
from support import gone, info, record, spec


def test_server_info_answers_who_runs_without_sqs(moto, state):
    queue = moto.new_queue("info")
    running = ensure_server(spec(moto, state, queue))
    got = info(running)
    assert got["pid"] == running.pid and got["instance_id"] == running.instance_id
    assert len(got["instance_id"]) == 32 and got["tables"] == [managed.table_name_for(queue)]
    with pytest.raises(SqsFlightError) as e:  # authenticated like every call
        with Client(running.url, timeout=5) as c:
            c._action("server_info", {})
    assert e.value.code == "UNAUTHENTICATED", e.value
    with pytest.raises(SqsFlightError) as e:
        with Client(running.url, token=running.token, timeout=5) as c:
            c._action("server_info", {"table": "x"})
    assert e.value.code == "INVALID_ARGUMENT" and "server_info takes an empty body" in str(e.value), e.value
    rec = record(state)
    assert rec["pid_start"] == managed.process_start(running.pid), "the process's start time is recorded"
    ready = json.loads((state / "ready.json").read_text())
    assert (ready["pid"], ready["instance_id"], ready["url"]) == (running.pid, running.instance_id, running.url)
    assert oct((state / "ready.json").stat().st_mode & 0o777) == "0o600"
    assert managed.stop_server(str(state))
    assert gone(running.pid)
    assert not (state / "ready.json").exists(), "a clean exit removes the ready file"


def test_a_deleted_queue_does_not_restart_a_healthy_server(moto, state):
    a, b = moto.new_queue("stay"), moto.new_queue("deleted")
    first = ensure_server(spec(moto, state, a))
    second = ensure_server(spec(moto, state, b))  # restarts once, to add b
    moto.sqs.delete_queue(QueueUrl=b)
    for queue in (a, b, a):
        again = ensure_server(spec(moto, state, queue))
        assert (again.pid, again.instance_id) == (second.pid, second.instance_id), "reused, not restarted"
    assert second.pid != first.pid


def test_a_queue_that_does_not_exist_is_not_kept(moto, state):
    good = moto.new_queue("good")
    ensure_server(spec(moto, state, good))
    missing = good.rsplit("/", 1)[0] + "/no-such-queue"
    with pytest.raises(SqsFlightError) as e:
        ensure_server(spec(moto, state, missing))
    assert e.value.code == "NOT_FOUND" and "is not kept in" in str(e.value), e.value
    assert record(state)["tables"] == {managed.table_name_for(good): good}
    pid = record(state)["pid"]
    # The next query of the good queue reuses the server; the bad one fails
    # again the same way, without a restart.
    assert ensure_server(spec(moto, state, good)).pid == pid
    with pytest.raises(SqsFlightError, match="is not kept in"):
        ensure_server(spec(moto, state, missing))
    assert record(state)["pid"] == pid


def test_drop_forgets_a_table_and_the_next_start_serves_the_others(moto, state):
    a, b = moto.new_queue("keep"), moto.new_queue("drop")
    ensure_server(spec(moto, state, a))
    running = ensure_server(spec(moto, state, b))
    cli = subprocess.run(
        [sys.executable, "-m", "sqs_flight.managed", "drop", "--state-dir", str(state), managed.table_name_for(b)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert record(state)["tables"] == {managed.table_name_for(a): a}
    assert not gone(running.pid, within=1), "a running server is left alone"
    managed.stop_server(str(state))
    assert gone(running.pid)
    again = ensure_server(spec(moto, state, a))
    assert info(again)["tables"] == [managed.table_name_for(a)]
    with pytest.raises(SqsFlightError) as e:
        managed.drop_table(str(state), "nope")
    assert e.value.code == "NOT_FOUND"


def test_a_region_per_table_and_a_conflicting_one_is_refused(moto, state):
    import boto3

    import sqs_flight

    a = moto.new_queue("region")
    moto.sqs.send_message(QueueUrl=a, MessageBody="in us-east-1")
    running = ensure_server(spec(moto, state, a, region="us-east-1"))
    assert record(state)["regions"] == {managed.table_name_for(a): "us-east-1"}
    with pytest.raises(SqsFlightError, match="reads table .* in region us-east-1, not eu-west-1"):
        ensure_server(spec(moto, state, a, region="eu-west-1"))
    assert record(state)["regions"] == {managed.table_name_for(a): "us-east-1"}, "nothing recorded for a refusal"
    # moto keeps queues per region: this one exists only in eu-west-1, so the
    # server reads it only if it signs that table's calls for eu-west-1.
    eu = boto3.client("sqs", endpoint_url=moto.endpoint, region_name="eu-west-1")
    b = eu.create_queue(QueueName=f"region-eu-{os.getpid()}-{time.monotonic_ns()}")["QueueUrl"]
    eu.send_message(QueueUrl=b, MessageBody="in eu-west-1")
    running = ensure_server(spec(moto, state, b, region="eu-west-1"))
    assert record(state)["regions"] == {managed.table_name_for(a): "us-east-1", managed.table_name_for(b): "eu-west-1"}
    for queue, body in ((a, "in us-east-1"), (b, "in eu-west-1")):
        got = sqs_flight.read_batch(
            running.url, managed.table_name_for(queue), consumer="region", token=running.token, max_wait_ms=500
        )
        assert got.column("body").to_pylist() == [body], queue
    assert ensure_server(spec(moto, state, a)).pid == running.pid  # no region given: the recorded one


def test_an_orphan_server_whose_starter_died_is_adopted(moto, state):
    queue = moto.new_queue("orphan")
    running = ensure_server(spec(moto, state, queue))
    rec = record(state)
    # As if the driver died between starting the server and recording it:
    # managed.json has the token, not the server.
    for key in ("pid", "pid_start", "instance_id", "url"):
        rec.pop(key)
    (state / "managed.json").write_text(json.dumps(rec))
    again = ensure_server(spec(moto, state, queue))
    assert (again.pid, again.instance_id) == (running.pid, running.instance_id), "adopted, not a second server"
    assert record(state)["instance_id"] == running.instance_id


@pytest.mark.parametrize("impostor_kind", ["foreign command line", "recorded command line, other start time"])
def test_a_reused_pid_is_never_signalled(moto, state, impostor_kind):
    queue = moto.new_queue("reused")
    running = ensure_server(spec(moto, state, queue))
    old_start = record(state)["pid_start"]
    managed.stop_server(str(state))
    assert gone(running.pid)
    # Another process now has the recorded pid's place (pids are reused):
    # one that calls itself sqs-flight-server; the second even names this
    # state directory, but started at another time than the recorded one.
    if impostor_kind == "foreign command line":
        argv = ["bash", "-c", "exec -a sqs-flight-server sleep 120"]
    else:
        argv = [sys.executable, "-c", "import time; time.sleep(120)", "sqs-flight-server", str(state / "registry")]
    impostor = subprocess.Popen(argv)
    try:
        poll("the impostor's start time", lambda: managed.process_start(impostor.pid) is not None, 10)
        rec = record(state)
        start = managed.process_start(impostor.pid) if impostor_kind == "foreign command line" else old_start
        rec.update(pid=impostor.pid, pid_start=start)
        (state / "managed.json").write_text(json.dumps(rec))
        (state / "ready.json").write_text(
            json.dumps({"url": rec["url"], "pid": impostor.pid, "instance_id": rec["instance_id"]})
        )
        again = ensure_server(spec(moto, state, queue))
        assert again.pid != impostor.pid
        assert impostor.poll() is None, "the process that reuses the pid got no signal"
    finally:
        impostor.kill()
        impostor.wait()


def test_a_hung_server_confirmed_by_pid_start_and_command_line_is_replaced(moto, state):
    queue = moto.new_queue("hung")
    running = ensure_server(spec(moto, state, queue))
    os.kill(running.pid, signal.SIGSTOP)  # it runs, and answers nothing
    try:
        t0 = time.monotonic()
        again = ensure_server(spec(moto, state, queue))
        assert again.pid != running.pid
        assert gone(running.pid), "the recorded server, confirmed, was stopped"
        assert time.monotonic() - t0 < 120
    finally:
        try:
            os.kill(running.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


DRIVER = textwrap.dedent("""
    import json, sys
    from sqs_flight.managed import ManagedServer, ensure_server
    spec = ManagedServer(**json.loads(sys.argv[1]))
    r = ensure_server(spec)
    print(json.dumps([r.pid, r.instance_id]))
""")


def test_two_drivers_starting_at_once_end_with_one_server(moto, state):
    queue = moto.new_queue("two")
    args = json.dumps(
        {
            "state_dir": str(state),
            "queue_url": queue,
            "table": managed.table_name_for(queue),
            "sqs_endpoint": moto.endpoint,
            "server_bin": server_bin(),
            "advertise_host": "127.0.0.1",
        }
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DRIVER, args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    (a, b) = [tuple(json.loads(o.strip().splitlines()[-1])) for o, _ in outs]
    assert a == b, "both drivers use the one server"
    assert record(state)["pid"] == a[0]


def test_the_default_state_dir_is_private(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    default = Path(managed.default_state_dir())
    assert default == tmp_path / "xdg" / "sqs-flight" / "managed"
    managed.private_state_dir(str(default))
    assert oct(default.stat().st_mode & 0o777) == "0o700"


def test_a_state_dir_others_can_write_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(SqsFlightError, match=r"group or others can write .* run chmod 700") as e:
        managed.private_state_dir(str(open_dir))
    assert e.value.code == "FAILED_PRECONDITION"
    assert list(open_dir.iterdir()) == [], "nothing was written there"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_state_dir_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(SqsFlightError, match="belongs to another user"):
        managed.private_state_dir(str(theirs))


def test_a_symlinked_server_log_is_not_followed(moto, state, tmp_path):
    managed.private_state_dir(str(state))
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (state / "server.log").symlink_to(target)
    with pytest.raises(SqsFlightError, match="server.log is a symbolic link"):
        ensure_server(spec(moto, state, moto.new_queue("link")))
    assert target.read_text() == "precious\n", "nothing written through the link"


def test_a_state_dir_on_fuse_or_nfs_is_refused():
    mountinfo = textwrap.dedent("""\
        22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
        40 22 0:40 / /dbfs rw,nosuid shared:2 - fuse /dev/fuse rw
        41 22 0:41 / /mnt/nfs rw shared:3 - nfs4 srv:/x rw
    """)
    for path in ("/dbfs/sqs-flight/orders", "/mnt/nfs/state"):
        with pytest.raises(SqsFlightError, match="cannot hold the server's store or its lock"):
            managed.check_local_filesystem(Path(path), mountinfo)
    managed.check_local_filesystem(Path("/home/me/state"), mountinfo)
    managed.check_local_filesystem(Path("/dbfsx/state"), mountinfo)


def test_the_advertised_address_and_where_it_came_from(monkeypatch):
    for var in ("DB_DRIVER_IP", "SPARK_LOCAL_IP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.7")
    assert managed.advertise_address(None) == ("10.0.0.7", "SPARK_LOCAL_IP")
    monkeypatch.setenv("DB_DRIVER_IP", "10.0.0.8")
    assert managed.advertise_address(None) == ("10.0.0.8", "DB_DRIVER_IP")
    assert managed.advertise_address("driver.example") == ("driver.example", 'option "advertiseHost"')
    monkeypatch.delenv("DB_DRIVER_IP")
    monkeypatch.delenv("SPARK_LOCAL_IP")
    host, source = managed.advertise_address(None)
    assert host and source
    assert managed._bind_host("10.0.0.7") == "10.0.0.7", "the advertised address, not every interface"
    assert managed._bind_host("127.0.0.1") == "127.0.0.1" and managed._bind_host("localhost") == "127.0.0.1"
    assert ManagedServer("s", "q", "t", advertise_host="10.0.0.7").wants_tls()
    assert not ManagedServer("s", "q", "t", advertise_host="127.0.0.1").wants_tls()


def test_tls_forced_on_loopback_makes_reuses_and_hands_out_the_certificate(moto, state):
    queue = moto.new_queue("tls")
    running = ensure_server(spec(moto, state, queue, tls=True))
    assert running.url.startswith("grpc+tls://127.0.0.1:")
    assert running.tls_root_certs and "BEGIN CERTIFICATE" in running.tls_root_certs
    assert oct((state / "tls" / "key.pem").stat().st_mode & 0o777) == "0o600"
    assert info(running)["pid"] == running.pid, "a client that trusts the handed-out PEM gets in"
    with pytest.raises(SqsFlightError):
        with Client(running.url, token=running.token, timeout=5) as c:  # the system's roots: refused
            c._action("server_info", {})
    pem = running.tls_root_certs
    managed.stop_server(str(state))
    again = ensure_server(spec(moto, state, queue, tls=True))
    assert again.pid != running.pid and again.tls_root_certs == pem, "the certificate is reused"


def test_an_executor_that_cannot_reach_the_managed_server_is_told_the_address_and_the_option(tmp_path):
    from sqs_flight.spark import Options, SqsFlightStreamReader

    spec = ManagedServer(
        state_dir=str(tmp_path),
        queue_url="https://sqs.eu-west-1.amazonaws.com/1/q",
        table="q",
        advertise_host="10.1.2.3",
        advertise_from="SPARK_LOCAL_IP",
    )
    options = Options(
        url="grpc://10.1.2.3:4000",
        table="q",
        consumer="c",
        limits=(),
        max_rows_per_batch=None,
        token="t",
        timeout=1,
        read_timeout=None,
        tls_root_certs=None,
        commit=False,
        managed=spec,
    )
    reader = SqsFlightStreamReader.__new__(SqsFlightStreamReader)  # executor side: no watchdog
    reader._o = options
    error = reader._unreachable_hint(SqsFlightError("UNAVAILABLE", "cannot reach the sqs-flight server"))
    assert error.code == "UNAVAILABLE"
    assert str(error).endswith(
        "this executor could not reach the managed server at grpc://10.1.2.3:4000 (host 10.1.2.3, from "
        'SPARK_LOCAL_IP): set the option "advertiseHost" to an address of the driver that executors can '
        "reach (and let the port through)"
    ), error


def test_a_table_the_server_refuses_is_not_kept_and_later_starts_work(moto, state):
    good = moto.new_queue("good")
    bad = dataclasses.replace(spec(moto, state, moto.new_queue("bad")), table="x" * 300)  # too long a name
    with pytest.raises(SqsFlightError, match="did not start"):
        ensure_server(bad)
    assert "x" * 300 not in record(state)["tables"]
    assert ensure_server(spec(moto, state, good)).pid > 0
