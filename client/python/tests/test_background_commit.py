"""The stream reader's commit thread, against a scripted client whose commit
blocks until the test lets it go. That the commits delete what they should
from a real queue is shown by the Spark runs in test_spark_stream.py
(rustack) and test_stream_reader.py (moto)."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from sqs_flight.client import SqsFlightError
from sqs_flight.spark import Options, SqsFlightStreamReader

WAIT_S = 30.0  # only ever reached if the reader is wrong


class _GatedClient:
    """status and plan answer at once; each commit waits for ``gate``."""

    def __init__(self, fail_first_commit: bool = False, depth: int = 5):
        self.depth = depth
        self.gate = threading.Event()
        self.started = threading.Event()
        self.commits: List[int] = []
        self.finished: List[int] = []
        self.running = 0
        self.most_running = 0
        self.fail_first_commit = fail_first_commit
        self._lock = threading.Lock()
        #: ``release`` calls, as (read_ahead_only, commits finished by then).
        self.released: List[Any] = []

    def status(self, table: str, max_age_ms: Optional[int] = None) -> Dict[str, Any]:
        return {"tables": {table: {"approximate_depth": self.depth, "consumers": {}}}}

    def plan(self, table: str, consumer: str, batch: int, **limits: Any) -> Any:
        return object()

    def release(self, table: str, consumer: str, read_ahead_only: bool = False) -> Dict[str, Any]:
        self.released.append((read_ahead_only, list(self.finished)))
        return {}

    def commit(self, table: str, consumer: str, batch: int) -> Dict[str, Any]:
        with self._lock:
            self.commits.append(batch)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        self.started.set()
        try:
            assert self.gate.wait(WAIT_S), "the test never let the commit go"
            if self.fail_first_commit and len(self.commits) == 1:
                raise SqsFlightError("INTERNAL", "commit of batch 1 not done: disk full; nothing was deleted")
            self.finished.append(batch)
            return {"committed_batch": batch, "deleted": 5, "expired": 0}
        finally:
            with self._lock:
                self.running -= 1


@pytest.fixture
def gated(monkeypatch):
    def make(**kwargs: Any):
        fake = _GatedClient(**kwargs)
        monkeypatch.setattr(Options, "client", lambda self: fake)
        o = Options.parse({"url": "grpc://127.0.0.1:1", "table": "orders", "reconnectSeconds": "0"}, "spark-{table}")
        return SqsFlightStreamReader(o, None), fake

    return make


def test_latest_offset_plans_the_next_batch_while_the_last_one_commits(gated):
    reader, fake = gated()
    assert reader.latestOffset({"batch": 1}, ReadAllAvailable()) == {"batch": 2}
    assert fake.started.wait(WAIT_S), "the commit of batch 1 was never sent"
    assert fake.finished == [], "latestOffset returned while the commit of batch 1 was held"
    fake.gate.set()
    reader.wait_for_commits()
    assert fake.finished == [1]


def test_commits_run_one_at_a_time_in_the_order_asked(gated):
    reader, fake = gated()
    reader.latestOffset({"batch": 1}, ReadAllAvailable())
    reader.commit({"batch": 2})
    reader.commit({"batch": 2})  # asked twice: sent once
    reader.commit({"batch": 3})
    assert fake.started.wait(WAIT_S)
    fake.gate.set()
    reader.wait_for_commits()
    assert fake.finished == [1, 2, 3]
    assert fake.most_running == 1


def test_stop_waits_for_the_commits_asked(gated):
    reader, fake = gated()
    reader.commit({"batch": 4})
    assert fake.started.wait(WAIT_S)
    stopper = threading.Thread(target=reader.stop)
    stopper.start()
    stopper.join(0.5)
    assert stopper.is_alive(), "stop() returned with a commit still held"
    fake.gate.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert fake.finished == [4]
    assert fake.released == [(True, [4])], "then the batch read ahead is given back, the open ones kept"


def test_latest_offset_with_nothing_new_waits_for_the_commits(gated):
    reader, fake = gated(depth=0)
    answer: List[dict] = []
    asker = threading.Thread(target=lambda: answer.append(reader.latestOffset({"batch": 1}, ReadAllAvailable())))
    asker.start()
    assert fake.started.wait(WAIT_S)
    asker.join(0.5)
    assert asker.is_alive(), "latestOffset found no new batch and returned with the commit of batch 1 held"
    fake.gate.set()
    asker.join(WAIT_S)
    assert answer == [{"batch": 1}] and fake.finished == [1]


def test_a_failed_commit_is_raised_and_asked_again_is_sent_again(gated):
    reader, fake = gated(fail_first_commit=True)
    reader.commit({"batch": 1})
    fake.gate.set()
    with pytest.raises(SqsFlightError, match="disk full"):
        reader.wait_for_commits()
    reader.wait_for_commits()  # raised once, not again
    reader.commit({"batch": 1})
    reader.wait_for_commits()
    assert fake.commits == [1, 1] and fake.finished == [1]


def test_a_failed_commit_fails_the_next_latest_offset(gated):
    reader, fake = gated(fail_first_commit=True)
    reader.commit({"batch": 1})
    fake.gate.set()
    for f in list(reader._pending):
        f.exception()  # wait for the commit thread without taking its error
    with pytest.raises(SqsFlightError, match="disk full"):
        reader.latestOffset({"batch": 1}, ReadAllAvailable())
