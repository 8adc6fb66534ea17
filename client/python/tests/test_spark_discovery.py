"""Format ``sqs-flight`` in a fresh SparkSession that registered nothing:
Spark 4 finds the installed module ``pyspark_sqs_flight`` and registers its
``DefaultSource`` by itself. And with a ``local[...]`` master and no
``SPARK_LOCAL_IP``, a managed server stays on loopback.

The fresh session runs in a child process (a JVM holds one SparkContext, and
the tests' own session registered the source), as a classic session and as
a Spark Connect one (``remote("local[2]")``, a local Connect server). That child has no
``SPARK_LOCAL_IP``; Spark itself is kept on loopback by its own settings
(``spark.driver.host``, ``spark.driver.bindAddress``), which the source does
not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

import pytest

from conftest import bodies
from support import record

CHILD_TIMEOUT_S = 600

# Runs in the child: a fresh session, no register call anywhere.
FRESH_SESSION = r"""
import json, sys
from pyspark.sql import SparkSession

args = json.loads(sys.argv[1])
builder = SparkSession.builder.remote("local[2]") if args["connect"] else SparkSession.builder.master("local[2]")
spark = (builder.appName("sqs-flight-discovery")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .getOrCreate())
out = {}

def drain(reader, name):
    query = (reader.load().writeStream.format("memory").queryName(name)
             .option("checkpointLocation", f"{args['tmp']}/ck-{name}").trigger(availableNow=True).start())
    assert query.awaitTermination(300), f"{name}: the AvailableNow query did not stop"
    return sorted(r.body for r in spark.sql(f"SELECT body FROM {name}").collect())

if args.get("url"):
    (spark.createDataFrame([(b,) for b in args["write"]], "body STRING")
        .write.format("sqs-flight").mode("append").option("url", args["url"]).option("table", "orders").save())
    out["read"] = drain(spark.readStream.format("sqs-flight").option("url", args["url"])
                        .option("table", "orders").option("maxWaitMs", "200"), "plain")
if args.get("queue"):
    out["managed"] = drain(spark.readStream.format("sqs-flight").option("queueUrl", args["queue"])
                           .option("sqsEndpoint", args["endpoint"]).option("region", "us-east-1")
                           .option("stateDir", args["state"]).option("maxWaitMs", "200"), "managed")
print("RESULT " + json.dumps(out), flush=True)
spark.stop()
"""


def fresh_session(tmp_path: Path, connect: bool, **args) -> Dict:
    """Runs FRESH_SESSION in a child with ``args``, a classic session or,
    with ``connect``, a Spark Connect one (``remote("local[2]")``: pyspark
    starts a local Connect server); its RESULT line."""
    args["connect"] = connect
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    run = subprocess.run(
        [sys.executable, "-c", FRESH_SESSION, json.dumps({"tmp": str(tmp_path), **args})],
        capture_output=True,
        text=True,
        env=env,
        timeout=CHILD_TIMEOUT_S,
        cwd=tmp_path,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, f"the fresh session failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.parametrize("connect", [False, True], ids=["classic", "connect"])
def test_a_fresh_session_writes_and_reads_sqs_flight_without_register(rustack, start_server, tmp_path, connect):
    queue = rustack.new_queue("discovered")
    server = start_server(rustack, {"orders": queue})
    sent = bodies(30, "discovered")
    got = fresh_session(tmp_path, connect, url=server.url, write=sent)
    assert got["read"] == sorted(sent)


def _listening(pid: int) -> Set[str]:
    """``address:port`` of every TCP socket that process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # TCP_LISTEN
                address, port = fields[1].split(":")
                found.add(f"{_address(address, width)}:{int(port, 16)}")
    return found


def _address(hexed: str, width: int) -> str:
    import ipaddress

    raw = bytes.fromhex(hexed)
    if width == 8:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


@pytest.mark.parametrize("connect", [False, True], ids=["classic", "connect"])
def test_a_local_master_keeps_the_managed_server_on_loopback(rustack, tmp_path, connect):
    queue = rustack.new_queue("local-managed")
    sent = bodies(20, "local")
    rustack.send(queue, sent)
    state = tmp_path / "state"
    got = fresh_session(tmp_path, connect, queue=queue, endpoint=rustack.endpoint, state=str(state))
    assert got["managed"] == sorted(sent)
    rec = record(state)
    assert rec["advertise"] == "127.0.0.1" and rec["tls"] is False, rec
    assert rec["url"] == f"grpc://127.0.0.1:{rec['port']}", rec
    listening = _listening(rec["pid"])
    assert f"127.0.0.1:{rec['port']}" in listening, listening
    assert all(a.startswith("127.0.0.1:") for a in listening), f"loopback only: {listening}"


# -- where the master comes from, and what a local one decides -------------

SUBMIT = ["/usr/bin/java", "-cp", "jars/*", "org.apache.spark.deploy.SparkSubmit"]


def test_spark_submits_arguments_give_the_master(tmp_path):
    from sqs_flight.spark.master import _submit_master

    assert _submit_master(SUBMIT + ["--conf", "spark.master=local[2]", "pyspark-shell"], {}) == "local[2]"
    both = SUBMIT + ["--master", "spark://h:7077", "--conf", "spark.master=local"]
    assert _submit_master(both, {}) == "spark://h:7077", "--master first"
    assert _submit_master(SUBMIT + ["--master=yarn", "pyspark-shell"], {}) == "yarn"
    assert _submit_master(SUBMIT + ["pyspark-shell"], {"MASTER": "k8s://h"}) == "k8s://h"
    (tmp_path / "spark-defaults.conf").write_text("# defaults\nspark.master   spark://p:7077\n")
    assert _submit_master(SUBMIT + ["pyspark-shell"], {"SPARK_CONF_DIR": str(tmp_path)}) == "spark://p:7077"
    assert _submit_master(SUBMIT + ["pyspark-shell"], {}) == "local[*]", "spark-submit's default"


def test_a_process_under_spark_submit_reads_its_master_from_proc(tmp_path):
    # bash stands in for the driver's JVM: its command line is spark-submit's,
    # and the Python below is its child, as Spark's Python workers are.
    probe = f"{sys.executable} -c 'from sqs_flight.spark.master import spark_master; print(spark_master())'; true"
    run = subprocess.run(
        ["bash", "-c", probe, *SUBMIT[3:], "--master", "local[3]", "pyspark-shell"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.stdout.strip() == "local[3]", run.stderr
    alone = subprocess.run(
        [sys.executable, "-c", "from sqs_flight.spark.master import spark_master; print(spark_master())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.stdout.strip() == "None", alone.stderr


def test_a_local_master_advertises_loopback_unless_told_otherwise(monkeypatch):
    from sqs_flight.managed import advertise_address
    from sqs_flight.spark.master import is_local

    assert all(map(is_local, ["local", "local[*]", "local[4]", "local[4,2]"]))
    assert not any(map(is_local, [None, "local-cluster[2,1,1024]", "yarn", "spark://h:7077", "k8s://h"]))
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("DB_DRIVER_IP", "10.9.8.7")
    assert advertise_address(None, "local[2]") == ("127.0.0.1", "loopback (Spark's master is local[2])")
    assert advertise_address(None, None) == ("10.9.8.7", "DB_DRIVER_IP"), "not local: as before"
    assert advertise_address("10.1.2.3", "local[2]") == ("10.1.2.3", 'option "advertiseHost"')
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.2")
    monkeypatch.delenv("DB_DRIVER_IP")
    assert advertise_address(None, "local[2]") == ("127.0.0.2", "SPARK_LOCAL_IP")
