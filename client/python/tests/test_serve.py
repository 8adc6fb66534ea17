"""The server wheel and ``sqs_flight.serve``: the binary pip installed is the
one the tests run, it is found wherever pip puts it, and a server started
from Python listens, serves, logs to Python logging, and stops with its
handle, its ``with`` block, or the interpreter (even a killed one)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import sqs_flight
from sqs_flight.serve import Server, ServerError, serve

from conftest import bodies, server_bin
from support import BOUND_S, gone

#: The interpreter the test venv was made from.
BASE_PYTHON = getattr(sys, "_base_executable", None) or sys.executable


def wheel() -> Path:
    path = os.environ.get("SQSF_SERVER_WHEEL")
    if not path or not Path(path).is_file():
        pytest.fail(
            f"SQSF_SERVER_WHEEL={path!r} is not the server wheel: build it with "
            "`maturin build --manifest-path server/Cargo.toml --out DIR` and set "
            "SQSF_SERVER_WHEEL to the .whl (scripts/test.sh does this)",
            pytrace=False,
        )
    return Path(path)


def test_the_tests_run_the_binary_the_wheel_installed():
    from sqs_flight_server import find_server_bin

    found = find_server_bin()
    assert Path(found).parent == Path(sysconfig.get_path("scripts")), found
    assert os.path.samefile(found, server_bin()), (
        f"the tests run {server_bin()}, not the wheel's {found}: scripts/test.sh sets "
        "SQSF_SERVER_BIN from the installed wheel"
    )
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=BOUND_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sqs-flight-server", sqs_flight.__version__]
    via_module = subprocess.run(
        [sys.executable, "-m", "sqs_flight_server", "--version"], capture_output=True, text=True, timeout=BOUND_S
    )
    assert via_module.stdout == out.stdout, via_module.stderr


@pytest.mark.parametrize("how", ["--target", "--prefix"])
def test_the_binary_is_found_in_target_and_prefix_installs(tmp_path, how):
    dest = tmp_path / "install"
    # --ignore-installed: pip would otherwise skip the package the venv has.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--ignore-installed",
            how,
            str(dest),
            str(wheel()),
        ],
        check=True,
        timeout=120,
    )
    if how == "--target":
        site = dest
    else:
        (site,) = dest.glob("lib/python*/site-packages")
    probe = "import sqs_flight_server; print(sqs_flight_server.find_server_bin())"
    # The interpreter this venv was made from, isolated (-I): neither the
    # venv's package nor its scripts directory, only what is under dest.
    out = subprocess.run(
        [BASE_PYTHON, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {probe}"],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == dest / "bin" / "sqs-flight-server"


def test_a_missing_binary_names_where_it_looked(tmp_path):
    # The package without its binary: what a broken install looks like.
    dest = tmp_path / "install"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(dest),
            str(wheel()),
        ],
        check=True,
        timeout=120,
    )
    (dest / "bin" / "sqs-flight-server").unlink()
    code = (
        f"import sys; sys.path.insert(0, {str(dest)!r}); import sqs_flight_server\n"
        "try:\n    sqs_flight_server.find_server_bin()\n"
        "except sqs_flight_server.ServerBinaryNotFound as e:\n    print(e)\n"
    )
    out = subprocess.run([BASE_PYTHON, "-I", "-c", code], capture_output=True, text=True, timeout=BOUND_S)
    assert "is not installed in any of" in out.stdout, out
    assert str(dest / "bin") in out.stdout
    assert "pip install --force-reinstall sqs-flight-server" in out.stdout


def test_serve_reads_and_commits_a_queue_and_logs_to_python(rustack, caplog):
    queue = rustack.new_queue("serve")
    rustack.send(queue, bodies(25, "serve"))
    caplog.set_level(logging.INFO, logger="sqs_flight.server")
    with serve({"orders": queue}, sqs_endpoint=rustack.endpoint, region="us-east-1") as server:
        assert isinstance(server, Server) and server.running()
        assert server.url.startswith("grpc://127.0.0.1:"), server.url
        t = sqs_flight.read_batch(server.url, "orders", consumer="serve-test", max_wait_ms=500)
        assert sorted(t.column("body").to_pylist()) == sorted(bodies(25, "serve"))
        sqs_flight.commit(server.url, "orders", "serve-test", sqs_flight.batch_of(t))
        pid = server.pid
    assert not server.running() and server.process.returncode == 0
    assert gone(pid)
    assert rustack.counts(queue) == {"visible": 0, "in_flight": 0}
    logged = [r.getMessage() for r in caplog.records if r.name == "sqs_flight.server"]
    assert any("table ready" in m and "table=orders" in m for m in logged), logged
    assert any("signal received" in m for m in logged), logged
    levels = {r.levelno for r in caplog.records if "no --auth-token" in r.getMessage()}
    assert levels == {logging.WARNING}, "the server's WARN lines are Python warnings"


def test_serve_without_tables_serves_the_demo_table_and_stop_is_idempotent():
    server = serve()
    try:
        t = sqs_flight.read_batch(server.url, "demo", consumer="serve-demo")
        assert t.num_rows > 0
    finally:
        assert server.stop() == 0
    assert server.stop() == 0
    assert not server.running()


def test_a_server_that_exits_at_once_raises_with_its_last_log_lines():
    with pytest.raises(ServerError) as e:
        serve({"orders": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"}, args=["--no-such-flag"])
    text = str(e.value)
    assert "exited with status 2 before listening" in text
    assert "unexpected argument '--no-such-flag'" in text


def test_a_missing_binary_is_a_server_error_naming_it(tmp_path):
    with pytest.raises(ServerError, match="could not run"):
        serve(server_bin=str(tmp_path / "no-such-server"))


def test_the_token_is_required_and_stays_off_the_command_line():
    with serve(token="s3cret-token") as server:
        assert not any("s3cret-token" in a for a in server.args)
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert b"s3cret-token" not in cmdline
        with pytest.raises(sqs_flight.SqsFlightError) as refused:
            sqs_flight.read_batch(server.url, "demo", consumer="no-token")
        assert refused.value.code == "UNAUTHENTICATED", refused.value
        assert "requires an `authorization: Bearer TOKEN` header" in str(refused.value)
        t = sqs_flight.read_batch(server.url, "demo", consumer="with-token", token="s3cret-token")
        assert t.num_rows > 0


@pytest.mark.parametrize("ending", ["exits", "is killed"])
def test_the_server_stops_when_the_interpreter(ending, tmp_path):
    """A script that starts a server and never stops it: the server goes
    with it, at a normal exit (atexit) and when the script is killed (the
    server then gets SIGTERM with its log pipes gone, and must still stop)."""
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import sqs_flight
        server = sqs_flight.serve(server_bin={server_bin()!r})
        open({str(pid_file)!r}, "w").write(str(server.pid))
        if {ending == "is killed"!r}:
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pid = int(pid_file.read_text())
    assert gone(pid), f"server {pid} outlived its interpreter ({ending}): {out.stderr}"
