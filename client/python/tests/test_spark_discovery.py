"""Format ``sqs-flight`` in a fresh SparkSession that registered nothing:
Spark 4 finds the installed module ``pyspark_sqs_flight`` and registers its
``DefaultSource`` by itself.

The fresh session runs in a child process (a JVM holds one SparkContext, and
the tests' own session registered the source). That child has no
``SPARK_LOCAL_IP``; Spark itself is kept on loopback by its own settings
(``spark.driver.host``, ``spark.driver.bindAddress``), which the source does
not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

from conftest import bodies

CHILD_TIMEOUT_S = 600

# Runs in the child: a fresh session, no register call anywhere.
FRESH_SESSION = r"""
import json, sys
from pyspark.sql import SparkSession

args = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[2]").appName("sqs-flight-discovery")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
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


def fresh_session(tmp_path: Path, **args) -> Dict:
    """Runs FRESH_SESSION in a child with ``args``; its RESULT line."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    run = subprocess.run([sys.executable, "-c", FRESH_SESSION, json.dumps({"tmp": str(tmp_path), **args})],
                         capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S, cwd=tmp_path)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, f"the fresh session failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_a_fresh_session_writes_and_reads_sqs_flight_without_register(rustack, start_server, tmp_path):
    queue = rustack.new_queue("discovered")
    server = start_server(rustack, {"orders": queue})
    sent = bodies(30, "discovered")
    got = fresh_session(tmp_path, url=server.url, write=sent)
    assert got["read"] == sorted(sent)
