"""The mistakes a new user makes in the first hour, each answered with one
message that names the fix: a misspelled Spark option, Spark workers that
cannot import the package, an unreachable server, the URL forms the CLI
takes (the same rule in Python), a port already taken.

(The CLI's own hints, an unknown table in `sql` and `send` of lines without
a `body`, are tested with the CLI in tests/tests/it/cli.rs and cli_send.rs.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple

import pytest

import sqs_flight
from sqs_flight.client import check_url
from sqs_flight.spark import SqsFlightDataSource, WriteOptions

from conftest import cli_bin, free_port, server_bin

URL_FORMS = Path(__file__).resolve().parents[2] / "src" / "url_forms.txt"


def _url_forms() -> List[Tuple[str, str, str]]:
    """(input, "=>" or "!!", the URL dialled or a fragment of the error)."""
    cases = []
    for line in URL_FORMS.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sep = " => " if " => " in line else " !! "
        given, expected = line.split(sep)
        cases.append((given, sep.strip(), expected))
    return cases


@pytest.mark.parametrize("given,kind,expected", _url_forms())
def test_python_reads_a_url_as_the_rust_client_does(given, kind, expected):
    if kind == "=>":
        assert check_url(given) == expected
    else:
        with pytest.raises(sqs_flight.SqsFlightError) as e:
            check_url(given)
        assert expected in str(e.value) and str(e.value).startswith(f'invalid server URL "{given}": ')


def test_the_cli_and_python_take_the_same_urls_and_refuse_the_same_way(default_server):
    port = default_server.url.rsplit(":", 1)[1]
    forms = [
        f"127.0.0.1:{port}",
        f"http://127.0.0.1:{port}",
        f"grpc+tcp://127.0.0.1:{port}/",
        f"grpc://127.0.0.1:{port}",
        f"ftp://127.0.0.1:{port}",
        f"grpc://127.0.0.1:{port}/demo",
    ]
    for form in forms:
        run = subprocess.run([cli_bin(), "--url", form, "tables"], capture_output=True, text=True, timeout=60)
        try:
            got = sqs_flight.Client(form).tables()
        except sqs_flight.SqsFlightError as e:
            assert run.returncode == 2, f"{form}: Python refused it ({e}), the CLI did not: {run}"
            assert run.stderr.splitlines()[0] == f"sqs-flight: error: {e}", form
            continue
        assert run.returncode == 0 and run.stdout.split() == got == ["demo"], f"{form}: {run}"


def test_a_misspelled_spark_option_names_the_closest_one(spark, default_server):
    with pytest.raises(Exception) as e:
        (
            spark.read.format("sqs-flight")
            .option("url", default_server.url)
            .option("table", "demo")
            .option("maxMessagesPerPartiton", "5")
            .load()
            .collect()
        )
    message = str(e.value)
    assert (
        "sqs_flight.client.SqsFlightError: sqs-flight source: unknown option "
        '"maxmessagesperpartiton": did you mean "maxMessagesPerPartition"? The options are: url, '
        "table, consumer, partitions, maxMessagesPerPartition,"
    ) in message, message
    # The message is not buried under our own frames: one at most.
    traceback = message.split("Traceback (most recent call last):", 1)[1].split("SqsFlightError")[0]
    assert traceback.count('File "') <= 1, message
    assert sqs_flight.status(default_server.url, "demo")["tables"]["demo"]["consumers"] == {}, "nothing was read"


def test_a_misspelled_sink_option_names_the_closest_one():
    with pytest.raises(sqs_flight.SqsFlightError) as e:
        WriteOptions.parse({"url": "grpc://127.0.0.1:1", "tabel": "demo"})
    assert str(e.value).startswith('sqs-flight sink: unknown option "tabel": did you mean "table"? '), e.value


def test_a_spark_batch_read_leaves_no_consumer_behind(spark, default_server):
    rows = (
        spark.read.format("sqs-flight")
        .option("url", default_server.url)
        .option("table", "demo")
        .option("maxWaitMs", "300")
        .load()
        .count()
    )
    assert rows == 20
    table = sqs_flight.status(default_server.url, "demo")["tables"]["demo"]
    assert table["consumers"] == {}, "the released batch read is forgotten"
    assert table["approximate_in_flight"] == 0 and table["approximate_depth"] == 20


def test_an_unreachable_server_is_said_at_once_and_named_in_the_error(caplog):
    closed = f"grpc://127.0.0.1:{free_port()}"
    source = SqsFlightDataSource({"url": closed, "table": "demo", "reconnectSeconds": "1"})
    with caplog.at_level("WARNING", logger="sqs_flight.spark"), pytest.raises(sqs_flight.SqsFlightError) as e:
        source.schema()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"sqs-flight: schema: cannot reach the sqs-flight server at {closed}")
    assert warnings[0].endswith("trying again for up to 1 s (option reconnectSeconds; 0 fails at once)")
    assert str(e.value).startswith(f"cannot reach the sqs-flight server at {closed}")
    assert str(e.value).endswith("(option reconnectSeconds=1)"), e.value


def test_spark_workers_without_the_package_get_a_hint_of_pyspark_python(tmp_path):
    # `python3` on the PATH is an interpreter without this venv's packages,
    # as the system's is when a script runs as `.venv/bin/python job.py`.
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    (bare / "python3").chmod(0o755)
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent("""
        from pyspark.sql import SparkSession
        from sqs_flight.spark import SqsFlightDataSource

        spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
        try:
            spark.dataSource.register(SqsFlightDataSource)
        finally:
            spark.stop()
    """)
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = f"{bare}{os.pathsep}{env['PATH']}"
    run = subprocess.run([sys.executable, str(job)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run
    last = run.stderr.strip().splitlines()[-1]
    assert last == (
        f"sqs_flight.client.SqsFlightError: sqs-flight: Spark's Python workers run python3 "
        f"({bare / 'python3'}), which cannot import sqs_flight, so every read and write of format "
        "sqs-flight would fail there. Spark starts them with PYSPARK_PYTHON (default: python3 on the "
        f"PATH): set PYSPARK_PYTHON={sys.executable} (this interpreter, which has sqs_flight) before "
        f"the SparkSession is created, activate this venv, or install sqs-flight for python3 "
        f"({bare / 'python3'})"
    ), run.stderr[-3000:]


def test_a_busy_port_is_said_once_with_the_way_out(default_server):
    taken = default_server.url.split("://", 1)[1]
    env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    run = subprocess.run([server_bin(), "--listen", taken], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 1, run
    assert run.stderr.strip().splitlines()[-1] == (
        f"Error: cannot bind --listen {taken}: the address is already in use (is another "
        "sqs-flight-server running?); stop that process, or pass another address, e.g. --listen "
        "127.0.0.1:0 for any free port"
    ), run.stderr
    assert "Caused by" not in run.stderr and len(re.findall("in use", run.stderr)) == 1, run.stderr


def test_workers_python_that_exists_on_the_executors_only_is_left_to_spark(monkeypatch, caplog):
    # Spark's recipe for shipping an environment: PYSPARK_PYTHON names a
    # path inside an --archives archive, which a client-mode driver has not
    # unpacked. The check cannot run it: it warns and registers.
    from pyspark import SparkContext

    from sqs_flight import spark as source

    class Shipped:
        pythonExec = "./environment/bin/python"

    monkeypatch.setattr(SparkContext, "_active_spark_context", Shipped())
    source._CHECKED_PYTHONS.clear()
    with caplog.at_level("WARNING", logger="sqs_flight"):
        source.check_workers_python()  # no SqsFlightError
    (warning,) = [r.getMessage() for r in caplog.records if "cannot be run on the driver" in r.getMessage()]
    assert "./environment/bin/python" in warning and "--archives" in warning
