"""Two builds of sqs-flight-server side by side: the server's CPU time per
message (utime + stime from /proc) for plan + read + commit of N messages
on rustack, one partition, alternating the binaries for ROUNDS rounds so a
busy machine slows both alike. For comparing build profiles (opt-level,
LTO) before the full figures 2 and 3 of scripts/bench.sh are run.

    .venv/bin/python benches/profile_ab.py BASELINE_BIN CANDIDATE_BIN [N [BODY_BYTES [ROUNDS]]]

Needs rustack (~/.cache/sqs-flight/rustack/bin/rustack, or SQSF_RUSTACK;
scripts/test.sh installs it) and boto3. rustack is started as figure 4's
script starts it (``spark_vs_boto3.start_rustack``), each server by the
Python package's launcher (``sqs_flight.serve``), from this checkout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import boto3

# Also puts this checkout's Python client first on the path, and the
# emulators' credentials in the environment.
from spark_vs_boto3 import start_rustack, start_server, stop

from sqs_flight.client import Client

RUSTACK = os.environ.get("SQSF_RUSTACK", str(Path.home() / ".cache/sqs-flight/rustack/bin/rustack"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one_run(binary: str, endpoint: str, queue: str, n: int) -> Tuple[int, float, float]:
    """(messages, server CPU seconds, wall seconds) of reading and committing the queue."""
    with start_server(binary, endpoint, {"t": queue}) as server:
        client = Client(server.url)
        cpu0, t0, got, batch = cpu_seconds(server.pid), time.monotonic(), 0, 0
        while got < n:
            batch += 1
            rows = client.read_batch("t", "ab", batch, partitions=1, max_messages=n, max_wait_ms=1000).num_rows
            client.commit("t", "ab", batch)
            got += rows
            if rows == 0:
                break
        result = (got, cpu_seconds(server.pid) - cpu0, time.monotonic() - t0)
        client.close()
        return result


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    bins = {"baseline": sys.argv[1], "candidate": sys.argv[2]}
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    results: Dict[str, List[Tuple[int, float, float]]] = {k: [] for k in bins}
    rustack, endpoint = start_rustack(RUSTACK)
    try:
        sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
        for r in range(rounds):
            for name, binary in bins.items():
                queue = sqs.create_queue(QueueName=f"ab-{name}-{r}")["QueueUrl"]
                for _ in range(0, n, 10):
                    entries = [{"Id": str(j), "MessageBody": "x" * size} for j in range(10)]
                    sqs.send_message_batch(QueueUrl=queue, Entries=entries)
                got, cpu, wall = one_run(binary, endpoint, queue, n)
                results[name].append((got, cpu, wall))
                print(f"round {r} {name}: {got} messages of {size} B, server CPU {cpu / got * 1e6:.1f} us/msg, "
                      f"{got / wall:,.0f} msg/s", flush=True)
    finally:
        stop(rustack)
    best = {k: min(cpu / got for got, cpu, _ in v) for k, v in results.items()}
    for k, v in results.items():
        print(f"{k}: best {best[k] * 1e6:.1f} us/msg, best {max(g / w for g, _, w in v):,.0f} msg/s ({bins[k]})")
    print(f"candidate / baseline, CPU per message: {best['candidate'] / best['baseline']:.2f}")


if __name__ == "__main__":
    main()
