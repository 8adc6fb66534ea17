"""The end-to-end fault run (issue 9): a Structured Streaming query (the
sqs-flight source, a parquet sink with a checkpoint) consumes 50,000
messages from a rustack queue while the test

* kills the server with SIGKILL at seeded random points, each at a moment
  when the consumer has a batch planned and not yet committed, and starts it
  again on the same port with the same ``--state-dir`` (the query keeps its
  ``url``): down 0.2-2 s, or 8 s once;
* fails a seeded share of Spark tasks on their first attempt (a test-only
  subclass of the source's reader; ``local[2,4]`` lets each task try 4
  times), half of them after the task has already handed rows to the sink;
* restarts the query from its checkpoint whenever it dies: that is what an
  operator does, and it must lose nothing. The driver's calls wait out a
  short outage (``reconnectSeconds``, default 10 s) and a task cut by a kill
  is retried, but the 8 s outage outlasts a task's 4 attempts, so the query
  usually dies there.

At the end every message id sent is in the sink, the queue is empty, and the
sink holds no receive twice. A message that SQS delivered again (a receive in
flight when the server was killed never reached the store, so its messages
come back after the visibility timeout) is counted and printed: such a
receive never reached the sink, so it is usually not even a duplicate row.

A JVM holds one Spark master and the shared ``spark`` fixture is
``local[2]`` (no task retries), so the Spark side runs in a child process:
this file run as a script (see ``query_app``). The test is the operator: it
owns the server, the kills, and the stop signal.

Knobs (environment): ``SQSF_FAULT_SEED`` (default 9), ``SQSF_FAULT_MESSAGES``
(default 50000).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pyarrow as pa
import pytest

from sqs_flight.client import SqsFlightError
from sqs_flight.spark import Options, SqsFlightDataSource, SqsFlightStreamReader

SEED = int(os.environ.get("SQSF_FAULT_SEED", "9"))
MESSAGES = int(os.environ.get("SQSF_FAULT_MESSAGES", "50000"))
KILLS = 4
#: One kill keeps the server down this long: longer than a task's 4
#: immediate attempts last, so a query reading then dies and is restarted
#: from its checkpoint (a driver call waits it out: reconnectSeconds is 10).
#: The others are down for 0.2-2 s.
LONG_OUTAGE_S = 8.0
#: Short, so that messages of a receive lost in a kill come back within the run.
VISIBILITY_TIMEOUT_S = 15
#: Share of tickets whose first task attempt is failed on purpose.
TASK_FAIL_SHARE = 0.25
TASK_ATTEMPTS = 4
PARTITIONS = 2
MAX_MESSAGES_PER_PARTITION = 1000
#: Bound on the whole consumption, kills and redeliveries included.
DEADLINE_S = 420
MAX_QUERY_RESTARTS = 40


# -- the Spark side (child process) --------------------------------------


class InjectedTaskFailure(RuntimeError):
    pass


class FaultyStreamReader(SqsFlightStreamReader):
    """The real reader, except that the first attempt of a seeded share of
    tickets fails: before reading, or after handing its first Arrow batch to
    Spark. Each injected failure leaves a marker file (executors are other
    processes)."""

    def __init__(self, options: Options, schema, markers: str, seed: int, share: float):
        super().__init__(options, schema)
        self._markers = markers
        self._seed = seed
        self._share = share

    def read(self, partition) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        digest = hashlib.sha256(f"{self._seed}:".encode() + partition.ticket).digest()
        doomed = int.from_bytes(digest[:8], "big") / 2**64 < self._share
        if ctx is None or ctx.attemptNumber() != 0 or not doomed:
            yield from super().read(partition)
            return
        late = digest[8] % 2 == 1
        if late:
            first = next(iter(super().read(partition)), None)
            if first is not None:
                yield first
        where = "after its first rows" if late else "before reading"
        name = f"stage{ctx.stageId()}-part{ctx.partitionId()}-{'late' if late else 'early'}-{uuid.uuid4().hex[:8]}"
        Path(self._markers, name).touch()
        raise InjectedTaskFailure(f"injected task failure {where} (attempt 0, stage {ctx.stageId()})")


class FaultyDataSource(SqsFlightDataSource):
    """Format ``sqs-flight-faulty``: the source with injected task failures;
    extra options ``faultMarkers``, ``faultSeed``, ``faultShare``."""

    extra_options = ("faultMarkers", "faultSeed", "faultShare")

    @classmethod
    def name(cls) -> str:
        return "sqs-flight-faulty"

    def streamReader(self, schema):
        return FaultyStreamReader(
            Options.parse(self.options, "spark-{table}", self.extra_options),
            schema,
            self.options["faultMarkers"],
            int(self.options["faultSeed"]),
            float(self.options["faultShare"]),
        )


def _why(error: BaseException) -> str:
    """The line that says why a query died, out of Spark's wrapped traceback."""
    text = str(error)
    found = re.findall(r"(?:SqsFlightError|InjectedTaskFailure): [^\n]*", text)
    where = re.search(r"\[(PYTHON_[A-Z_]+)\]", text)
    if found:
        return (f"{where.group(1)}: " if where else "") + found[-1].split(" SQLSTATE")[0]
    return " ".join(text.split())[:300]


def query_app(config_file: str) -> None:
    """The Spark application: runs the query, restarting it from its
    checkpoint whenever it dies, until the stop file appears; then reads the
    sink (through its metadata log, as any reader of a file sink must) and
    writes what it found to the result file."""
    cfg = json.loads(Path(config_file).read_text())
    from conftest import new_spark_session

    spark = new_spark_session(f"local[2,{TASK_ATTEMPTS}]")
    spark.dataSource.register(FaultyDataSource)
    stop = Path(cfg["stop_file"])
    restarts: List[str] = []

    def log(message: str) -> None:
        print(f"[query-app {time.strftime('%H:%M:%S')}] {message}", flush=True)

    def start():
        return (
            spark.readStream.format("sqs-flight-faulty")
            .option("url", cfg["url"])
            .option("table", "orders")
            .option("partitions", str(PARTITIONS))
            .option("maxMessagesPerPartition", str(MAX_MESSAGES_PER_PARTITION))
            .option("maxWaitMs", "500")
            .option("faultMarkers", cfg["markers"])
            .option("faultSeed", str(cfg["seed"]))
            .option("faultShare", str(TASK_FAIL_SHARE))
            .load()
            .writeStream.format("parquet")
            .option("path", cfg["out"])
            .option("checkpointLocation", cfg["checkpoint"])
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    while not stop.exists():
        try:
            query = start()  # load() asks the server for the schema
        except Exception as e:
            reason = _why(e)
            restarts.append(reason)
            log(f"query did not start ({reason}); trying again")
            time.sleep(1)
            continue
        log(f"query started (run {len(restarts) + 1})")
        while query.isActive and not stop.exists():
            try:
                query.awaitTermination(0.5)
            except Exception:  # the query failed: query.exception() below says why
                break
        if query.isActive:
            query.stop()
            break
        error = query.exception()
        reason = _why(error)
        restarts.append(reason)
        log(f"query died ({reason}); restarting it from the checkpoint")
        if len(restarts) > MAX_QUERY_RESTARTS:
            log("too many query restarts; giving up")
            break
        time.sleep(1)

    rows = spark.read.parquet(cfg["out"]).select("message_id", "receive_count", "batch", "partition", "body")
    result = {
        "query_restarts": restarts,
        "rows": [[r.message_id, r.receive_count, r.batch, r.partition, r.body] for r in rows.collect()],
    }
    Path(cfg["result"]).write_text(json.dumps(result))
    log(f"sink read: {len(result['rows'])} rows")
    spark.stop()


if __name__ == "__main__":
    query_app(sys.argv[1])


# -- the operator (the test) ----------------------------------------------


def _await(what: str, check, deadline: float, app, pause: float = 0.25) -> None:
    from conftest import poll  # here: this file is also the query app, run without the tests' setup

    poll(
        what,
        check,
        max(0.0, deadline - time.monotonic()),
        died=app.exited,
        detail=lambda: app.log_tail(60),
        pause=pause,
        max_pause=pause,
    )


def _consumer(url: str) -> Dict[str, Any]:
    import sqs_flight

    try:
        tables = sqs_flight.status(url, "orders")["tables"]
        return tables["orders"]["consumers"].get("spark-orders", {})
    except Exception:  # the server is starting: no status yet
        return {}


# -- the driver's reconnect (option reconnectSeconds) ----------------------


class _ScriptedClient:
    """Stands in for the Flight client: ``status`` raises the scripted errors
    in turn (``_FOREVER``: connection refused on every call), then answers."""

    def __init__(self, errors):
        self.errors = list(errors)
        self.calls = 0

    def status(self, table, max_age_ms=None):
        self.calls += 1
        if self.errors:
            error = self.errors[0] if self.errors[0] is _FOREVER else self.errors.pop(0)
            raise _REFUSED if error is _FOREVER else error
        return {"tables": {table: {"approximate_depth": 0, "consumers": {}}}}

    def schema(self, table):
        self.status(table)  # the same scripted errors, then an answer
        return pa.schema([("message_id", pa.string()), ("body", pa.string())])


_FOREVER = object()
_REFUSED = SqsFlightError(
    "UNAVAILABLE",
    "cannot reach the sqs-flight server at grpc://127.0.0.1:1 (failed to connect to all "
    "addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused)",
)
_CUT = SqsFlightError(
    "UNAVAILABLE", "DoAction status failed on grpc://127.0.0.1:1: UNAVAILABLE: Stream removed (Socket closed)"
)


def _scripted_reader(monkeypatch, errors, **options: str) -> Tuple[SqsFlightStreamReader, _ScriptedClient]:
    fake = _ScriptedClient(errors)
    monkeypatch.setattr(Options, "client", lambda self: fake)
    o = Options.parse({"url": "grpc://127.0.0.1:1", "table": "orders", **options}, "spark-{table}")
    return SqsFlightStreamReader(o, None), fake


def test_reconnect_option_defaults_to_ten_seconds_and_refuses_bad_values():
    parse = lambda **o: Options.parse({"url": "grpc://h:1", "table": "t", **o}, "c")  # noqa: E731
    assert parse().reconnect == 10.0
    assert parse(reconnectSeconds="0").reconnect == 0.0
    assert parse(reconnectSeconds="3").reconnect == 3.0
    for bad in ("-1", "soon", "1.5"):
        with pytest.raises(SqsFlightError, match="reconnectSeconds") as err:
            parse(reconnectSeconds=bad)
        assert err.value.code == "INVALID_ARGUMENT"


def test_driver_calls_try_again_while_the_server_cannot_be_reached(monkeypatch):
    reader, fake = _scripted_reader(monkeypatch, [_REFUSED, _CUT, _REFUSED], reconnectSeconds="30")
    assert reader.initialOffset() == {"batch": 0}
    assert fake.calls == 4


def test_the_schema_asked_at_query_start_waits_for_the_server_too(monkeypatch):
    fake = _ScriptedClient([_REFUSED, _CUT])
    monkeypatch.setattr(Options, "client", lambda self: fake)
    source = SqsFlightDataSource({"url": "grpc://127.0.0.1:1", "table": "orders", "reconnectSeconds": "30"})
    assert source.schema().fieldNames() == ["message_id", "body"]
    assert fake.calls == 3
    fake = _ScriptedClient([_FOREVER])
    monkeypatch.setattr(Options, "client", lambda self: fake)
    source = SqsFlightDataSource({"url": "grpc://127.0.0.1:1", "table": "orders", "reconnectSeconds": "0"})
    with pytest.raises(SqsFlightError, match="cannot reach"):
        source.schema()
    assert fake.calls == 1


def test_reconnect_is_bounded_and_zero_fails_at_once(monkeypatch):
    reader, fake = _scripted_reader(monkeypatch, [_FOREVER], reconnectSeconds="0")
    with pytest.raises(SqsFlightError, match="cannot reach"):
        reader.initialOffset()
    assert fake.calls == 1
    reader, fake = _scripted_reader(monkeypatch, [_FOREVER], reconnectSeconds="1")
    with pytest.raises(SqsFlightError, match="cannot reach"):
        reader.initialOffset()
    assert 1 < fake.calls < 10  # 0.1 + 0.2 + 0.4 s of backoff fit in the second, not more


def test_errors_the_server_sends_are_not_retried(monkeypatch):
    sqs_down = SqsFlightError(
        "UNAVAILABLE",
        "DoAction status failed on grpc://h:1: UNAVAILABLE: SQS "
        "ReceiveMessage failed after 5 attempts: ServiceUnavailable",
    )
    precondition = SqsFlightError("FAILED_PRECONDITION", "batch 3 of consumer c is committed (watermark 5)")
    for error in (sqs_down, precondition):
        reader, fake = _scripted_reader(monkeypatch, [error], reconnectSeconds="30")
        with pytest.raises(SqsFlightError) as err:
            reader.initialOffset()
        assert err.value is error and fake.calls == 1


@pytest.mark.parametrize("state", ["state_dir", "state_url"])
def test_a_reader_rides_through_a_kill_9_and_restart_of_the_server(moto, start_server, tmp_path, caplog, state):
    """The real thing: a batch is planned, the server is killed, and the
    driver's next calls (partitions, then commit) wait for the restarted
    server on the same port instead of failing the query. The restarted
    server has the same state dir, or (``state_url``, a server started
    on another host) a new empty one and the same ``--state-url``."""
    import threading

    import boto3
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    import sqs_flight
    from sqs_flight.spark import spark_schema

    from conftest import bodies, free_port

    qurl = moto.new_queue("reconnect")
    moto.send(qurl, bodies(3))
    shared: Tuple[str, ...] = ()
    if state == "state_url":
        bucket = f"reconnect-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        shared = ("--state-url", f"s3://{bucket}/stream", "--s3-endpoint", moto.endpoint)
    args = (moto, {"orders": qurl}, "--state-dir", str(tmp_path / "state"), *shared)
    listen = f"127.0.0.1:{free_port()}"
    server = start_server(*args, listen=listen)
    if state == "state_url":
        args = (moto, {"orders": qurl}, "--state-dir", str(tmp_path / "elsewhere"), *shared)
    # The plan receives nothing (receiveAtPlan 0): a receive in flight when
    # the server dies would hide the batch's messages until their
    # visibility timeout, and the read after the restart would find none.
    options = {
        "url": server.url,
        "table": "orders",
        "partitions": "1",
        "maxWaitMs": "300",
        "reconnectSeconds": "30",
        "receiveAtPlan": "0",
    }
    reader = SqsFlightStreamReader(
        Options.parse(options, "spark-{table}"), spark_schema(sqs_flight.client(server.url).schema("orders"))
    )
    end = reader.latestOffset({"batch": 0}, ReadAllAvailable())
    assert end == {"batch": 1}

    server.proc.popen.kill()
    server.proc.popen.wait(timeout=10)
    restarted = threading.Event()

    def restart() -> None:
        time.sleep(1.5)
        start_server(*args, listen=listen)
        restarted.set()

    threading.Thread(target=restart, daemon=True).start()
    with caplog.at_level("WARNING", logger="sqs_flight.spark"):
        parts = reader.partitions({"batch": 0}, end)
    assert restarted.is_set(), "partitions() returned before the server was back"
    assert any("trying again for up to 30 s (option reconnectSeconds" in r.getMessage() for r in caplog.records)
    assert sum(b.num_rows for p in parts for b in reader.read(p)) == 3
    reader.commit(end)
    reader.stop()  # waits for the commit thread
    assert moto.counts(qurl) == {"visible": 0, "in_flight": 0}


def _restored(server_log: str) -> Tuple[int, int]:
    """(batches, messages) a server says it restored from --state-dir."""
    found = re.search(r"restored open batches.* batches=(\d+) messages=(\d+)", server_log)
    assert found, f"a restarted server did not restore its registry:\n{server_log[-2000:]}"
    return int(found.group(1)), int(found.group(2))


def _commits(server_log: str) -> Tuple[int, int]:
    """(deleted, expired) summed over a server's commit log lines."""
    pairs = [(int(d), int(e)) for d, e in re.findall(r" deleted=(\d+) expired=(\d+)", server_log)]
    return sum(d for d, _ in pairs), sum(e for _, e in pairs)


def test_fault_run_loses_nothing(rustack, start_server, logs, tmp_path):
    from conftest import Proc, bodies, free_port

    rng = random.Random(SEED)  # kill points and outages
    jitter = random.Random(SEED + 1)  # the moment within a batch (how many draws depends on timing)
    queue = rustack.new_queue("fault", visibility_timeout=VISIBILITY_TIMEOUT_S)
    sent_ids: List[str] = []
    sent_bodies = bodies(MESSAGES, "fault")
    started = time.monotonic()
    assert rustack.send(queue, sent_bodies, threads=8, ids=sent_ids) == MESSAGES
    assert len(set(sent_ids)) == MESSAGES
    print(f"\n{MESSAGES} messages sent in {time.monotonic() - started:.1f} s (seed {SEED})")

    state = tmp_path / "state"
    listen = f"127.0.0.1:{free_port()}"
    server_args = (rustack, {"orders": queue}, "--state-dir", str(state))
    server = start_server(*server_args, listen=listen)
    servers = [server]
    url = server.url

    markers = tmp_path / "task-failures"
    markers.mkdir()
    stop, result = tmp_path / "stop", tmp_path / "result.json"
    config = tmp_path / "app.json"
    config.write_text(
        json.dumps(
            {
                "url": url,
                "out": str(tmp_path / "out"),
                "checkpoint": str(tmp_path / "ck"),
                "markers": str(markers),
                "seed": SEED,
                "stop_file": str(stop),
                "result": str(result),
            }
        )
    )
    app = Proc("fault-query", [sys.executable, __file__, str(config)], logs)
    deadline = time.monotonic() + DEADLINE_S
    kills: List[str] = []
    try:
        consumed = lambda: MESSAGES - rustack.counts(queue)["visible"]  # noqa: E731
        long_outage = rng.randrange(KILLS)
        for i, point in enumerate(sorted(rng.uniform(0.05, 0.85) for _ in range(KILLS))):
            _await(f"{point:.0%} of the queue received", lambda p=point: consumed() >= p * MESSAGES, deadline, app)
            while True:  # a random moment at which a batch is planned and not yet committed
                _await("an open batch", lambda: bool(_consumer(url).get("open_batches")), deadline, app, 0.05)
                time.sleep(jitter.uniform(0.0, 0.8))
                before = _consumer(url)
                if before.get("open_batches"):
                    break
            counts = rustack.counts(queue)
            server.proc.popen.kill()
            server.proc.popen.wait(timeout=10)
            server.proc.stop()
            down = LONG_OUTAGE_S if i == long_outage else rng.uniform(0.2, 2.0)
            kills.append(
                f"kill {len(kills) + 1} at {point:.0%} of the queue received, down {down:.1f} s: "
                f"open batches {before.get('open_batches')}, committed {before.get('committed_batch')}, "
                f"queue {counts}"
            )
            print(kills[-1])
            time.sleep(down)
            server = start_server(*server_args, listen=listen)
            servers.append(server)

        def drained() -> bool:
            return rustack.counts(queue) == {"visible": 0, "in_flight": 0}

        _await("an empty queue", drained, deadline, app, 1.0)
        time.sleep(3)  # settle: nothing comes back
        _await("an empty queue after the settle period", drained, deadline, app, 1.0)
        elapsed = time.monotonic() - started
        stop.touch()
        app.popen.wait(timeout=180)
    finally:
        stop.touch()
        if app.popen.poll() is None:
            app.popen.terminate()
        app.stop()
    assert app.popen.returncode == 0, f"the query app failed:\n{app.log_tail(60)}"
    out = json.loads(result.read_text())

    rows = out["rows"]
    restarts = out["query_restarts"]
    task_failures = len(list(markers.iterdir()))
    by_id = Counter(r[0] for r in rows)
    receives = Counter((r[0], r[1], r[2], r[3]) for r in rows)
    lost = set(sent_ids) - set(by_id)
    unknown = set(by_id) - set(sent_ids)
    duplicate_rows = len(rows) - len(by_id)
    same_receive = sum(n - 1 for n in receives.values() if n > 1)
    redelivered = {r[0] for r in rows if (r[1] or 1) > 1}
    for key, n in sorted(receives.items()):
        if n > 1:
            print(
                f"the same receive {n} times: message_id={key[0]} receive_count={key[1]} batch={key[2]} "
                f"partition={key[3]}"
            )
    for mid, n in sorted(by_id.items()):
        if n > 1:
            seen = sorted((r[1], r[2], r[3]) for r in rows if r[0] == mid)
            print(f"redelivered and read {n} times: message_id={mid} (receive_count, batch, partition)={seen}")
    for i, reason in enumerate(restarts, 1):
        print(f"query restart {i}: {reason}")
    restored = [_restored(s.proc.log.read_text(errors="replace")) for s in servers[1:]]
    deleted, expired = map(sum, zip(*(_commits(s.proc.log.read_text(errors="replace")) for s in servers)))
    print(
        f"the {len(restored)} restarted servers restored (batches, messages) {restored}; "
        f"commits deleted {deleted} messages and reported {expired} expired receipts"
    )
    print(
        f"messages={MESSAGES} kills={len(kills)} task_failures={task_failures} "
        f"query_restarts={len(restarts)} lost={len(lost)} duplicate_rows={duplicate_rows} "
        f"redeliveries={len(redelivered)}"
    )
    print(
        f"(seed {SEED}, {elapsed:.0f} s from the first send to the settled empty queue; redeliveries: "
        f"messages whose row has receive_count > 1, i.e. an earlier receive of theirs never reached the "
        f"sink, e.g. one in flight at a kill)"
    )

    assert not lost, f"{len(lost)} messages sent are not in the sink, e.g. {sorted(lost)[:5]}"
    assert not unknown, f"the sink holds ids never sent: {sorted(unknown)[:5]}"
    assert same_receive == 0, "a receive reached the sink twice (see the lines above)"
    assert sorted({r[4] for r in rows}) == sorted(sent_bodies)
    assert len(kills) >= 3
    assert task_failures > 0, "no task failure was injected: the run tested less than it says"
    assert len(restarts) <= MAX_QUERY_RESTARTS
    assert rustack.counts(queue) == {"visible": 0, "in_flight": 0}
