"""The stream reader of format ``sqs-flight`` (``spark.readStream``).

# How a micro-batch maps to the server

* Offsets are ``{"batch": n}``: a micro-batch ending at ``n`` reads the
  server batch ``n`` of the query's consumer. ``initialOffset`` is the
  consumer's committed batch (``status``), or 0.
* ``latestOffset(start, limit)`` returns ``start + 1`` only when the table
  has visible messages (no empty micro-batches) and, with
  ``minRowsPerBatch``, enough of them or after ``maxTriggerDelay``; it plans
  that batch first, with the caps that ``limit`` allows (so a restart
  replays the same plan). :mod:`~sqs_flight.spark.limits` says how the read
  limits combine.
* ``partitions(start, end)`` is GetFlightInfo for batch ``end``: one
  partition per endpoint, holding the ticket bytes and location strings. A
  batch the server has released meanwhile (consumer lease, restart) replays
  empty: its messages are back in the queue for later batches.
* ``read(partition)`` runs on an executor and DoGets the ticket. A ticket is
  a repeatable read, so task retries and every action of a ``foreachBatch``
  DataFrame see the same rows. No receipt handle ever reaches Spark.
* ``reportLatestOffset()`` (pyspark >= 4.2; older ones never call it)
  gives Spark's progress (``latestOffset`` of the source in
  ``StreamingQueryProgress``, the UI, listeners) the queue's backlog:
  ``{"batch": n, "approximate_backlog": v + f, "approximate_depth": v,
  "approximate_in_flight": f}``, ``n`` the last batch planned, ``v`` and
  ``f`` the queue's visible and in-flight counts from ``status`` with
  ``max_age_ms`` (:data:`BACKLOG_MAX_AGE_MS`): the server reads SQS for
  them at most once per table in that time, whatever the number of
  queries. In flight counts the batch being read and any commit not done
  yet, so a drained queue shows 0 from the next trigger on. Spark only
  shows this offset; ``partitions`` and ``commit`` never get it.
* ``commit(end)`` runs on the driver and sends DoAction ``commit``. With
  ``rejectPayloadErrors``, ``read`` leaves out the rows whose
  ``payload_error`` is set and the commit hands them back to SQS
  (``reject_payload_errors``) instead of deleting them, so a queue's redrive
  policy moves them to its dead-letter queue.
* While the server cannot be reached (a restart on its ``--state-dir``),
  the driver's status, plan and commit calls try again for up to
  ``reconnectSeconds`` (default 10; they are all safe to repeat) before the
  query fails. A read cut by a restart fails its task, and Spark's task
  retry replays the ticket.

Spark calls ``commit(end_N)`` only when it plans batch N+1, never for the last
batch of a run; but it calls ``latestOffset(start=X)`` only once the batch
ending at X is in the checkpoint's commit log. So ``latestOffset`` also
commits ``start``: that is what deletes the last batch of an AvailableNow
run. Commit is idempotent, so doing it twice is harmless.

Commits run in the background, one at a time and in order, on a thread of
the driver's Python process: the deletes of batch N overlap the planning and
reading of batch N+1 instead of holding up the next trigger. A commit is
only ever asked for a batch already in Spark's commit log, so running it
later never deletes early. A commit that fails is raised by the reader's
next call (the query fails one trigger later than it would have). When
``latestOffset`` finds no new batch it waits for the commits asked so far,
so a run that ends there (AvailableNow, an idle stream) leaves nothing in
flight. A query stopped, or a driver that dies, while a commit runs leaves
that batch in flight, as a stop leaves the last batch of a run: the
restarted query commits it from ``latestOffset(start)``, as long as it
comes back within the server's consumer lease.

Each streaming query needs its own ``consumer`` (default ``spark-<table>``):
two queries sharing one would commit each other's batches.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..client import Endpoint, SqsFlightError
from . import driver
from .arrow import arrow_schema, conform, rebatch, without_payload_errors
from .entry import SparkEntryPoints
from .limits import DEFAULT_PARTITIONS, BatchLimits, TriggerDelay
from .options import Options

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    _STREAM_BASES: Tuple[type, ...] = (DataSourceStreamReader, SupportsTriggerAvailableNow)
except ImportError:  # pyspark 4.0 / 4.1: latestOffset() takes no argument
    _STREAM_BASES = (DataSourceStreamReader,)

_log = logging.getLogger("sqs_flight.spark")

# The server's reasons for a plan whose `max_bytes` it refuses: above its
# --limit-max-bytes, or 0 (docs/protocol.md, "Error reasons").
_MAX_BYTES_REFUSED = ("limit:max_bytes", "invalid_argument:max_bytes")

__all__ = ["BACKLOG_MAX_AGE_MS", "DEFAULT_PARTITIONS", "FlightPartition", "SqsFlightStreamReader"]

#: How old the queue counts of ``reportLatestOffset`` may be (``status``'s
#: ``max_age_ms``): at most one GetQueueAttributes per table this often for
#: the progress of every query.
BACKLOG_MAX_AGE_MS = 5000
#: How old the queue counts of a ``status`` call that reads only the
#: consumer's record may be: the largest ``max_age_ms`` the server takes.
CONSUMER_STATUS_MAX_AGE_MS = 60_000
#: How old the depth a Trigger.AvailableNow run counts its batches from may
#: be: the read of ``initialOffset()`` just before serves, one SQS round
#: trip less at the start of every run.
AVAILABLE_NOW_MAX_AGE_MS = 1000

#: The server's largest ``max_wait_ms`` (``--limit-max-wait-ms``' default),
#: the idle wait assumed of a batch planned without the option ``maxWaitMs``.
LARGEST_MAX_WAIT_MS = 20_000
#: Added to the idle wait when a trigger waits for the consumer's receives
#: in flight (``receives_in_flight``), and the polling interval.
RECEIVES_WAIT_MARGIN_S = 2.0
RECEIVES_POLL_S = 0.05


class FlightPartition(InputPartition):
    """One endpoint of a planned batch: ticket bytes and location strings;
    in managed mode the token of the server that planned it (each start of
    a managed server makes a new one)."""

    def __init__(self, ticket: bytes, locations: Tuple[str, ...], token: Optional[str] = None):
        self.ticket = ticket
        self.locations = tuple(locations)
        self.token = token

    def endpoint(self) -> Endpoint:
        return Endpoint(self.ticket, self.locations)


def _batch(offset: Optional[Mapping[str, Any]]) -> int:
    return int((offset or {}).get("batch", 0))


class SqsFlightStreamReader(SparkEntryPoints, *_STREAM_BASES):  # type: ignore[misc]
    """The streaming reader; see the module doc for the offset rules."""

    def __init__(self, options: Options, schema: StructType, clock: Callable[[], float] = time.monotonic):
        self._o = options
        self._schema = schema
        self._limits: Dict[int, Dict[str, int]] = {}
        self._committed = 0  # done (written by the commit thread)
        self._asked = 0  # handed to the commit thread
        self._commits: Optional[ThreadPoolExecutor] = None
        self._pending: List[Future] = []
        self._available_now_left: Optional[int] = None
        self._legacy_last: Optional[int] = None
        self._latest: Optional[int] = None  # the end offset latestOffset gave last
        self._delay = TriggerDelay(clock)
        # Started by the first call of a running query (initialOffset,
        # latestOffset), not here: Spark also makes readers it never runs
        # nor stops, in Python workers it keeps, where a watchdog would
        # keep a managed server alive after its query.
        self._watch: Optional[driver.Watchdog] = None
        # Set by stop(): from then on a dead managed server stays dead (a
        # server started by a query going away could take over the
        # stateUrl of the cluster that replaces it).
        self._stopping = False

    def __getstate__(self) -> Dict[str, Any]:
        # The commit thread, its futures and the watchdog stay in the driver's process.
        state = dict(self.__dict__)
        state["_commits"], state["_pending"], state["_watch"] = None, [], None
        return state

    # -- driver side ----------------------------------------------------

    def _table_status(self, max_age_ms: Optional[int] = None) -> Dict[str, Any]:
        o = self._o
        answer = driver.reconnecting(o, "status", lambda c: c.status(o.table, max_age_ms=max_age_ms))
        return answer["tables"][self._o.table]

    def _consumer_status(self) -> Dict[str, Any]:
        """The consumer's record, which ``status`` always answers as it is
        now: only the queue counts, which these callers do not use, may be
        :data:`CONSUMER_STATUS_MAX_AGE_MS` old (no GetQueueAttributes round
        trip between Spark's planning and its tasks)."""
        status = self._table_status(max_age_ms=CONSUMER_STATUS_MAX_AGE_MS)
        return status.get("consumers", {}).get(self._o.consumer, {})

    def _commit(self, batch: int) -> None:
        """The commit itself (DoAction ``commit``); runs on the commit thread."""
        if batch <= self._committed:
            return
        o = self._o
        if o.reject_payload_errors:  # rows read() left out go back to SQS
            commit = lambda c: c.commit(o.table, o.consumer, batch, reject_payload_errors=True)  # noqa: E731
        else:
            commit = lambda c: c.commit(o.table, o.consumer, batch)  # noqa: E731
        answer = driver.reconnecting(o, f"commit of batch {batch}", commit, revive_dead=not self._stopping)
        if answer.get("rejected"):
            _log.info(
                "sqs-flight: commit of batch %d of %r handed %d messages whose payload did not decode "
                "back to SQS (rejectPayloadErrors)",
                batch,
                o.table,
                answer["rejected"],
            )
        self._committed = batch

    def _ask_commit(self, batch: int) -> None:
        """Commits ``batch`` in the background, after every commit asked
        before it. Raises the error of an earlier commit that failed."""
        self._raise_failed()
        if batch <= self._asked:
            return
        self._asked = batch
        for b in [b for b in self._limits if b <= batch]:
            del self._limits[b]  # Spark plans no committed batch again
        if self._commits is None:
            self._commits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqs-flight-commit")
        self._pending.append(self._commits.submit(self._commit, batch))

    def _raise_failed(self) -> None:
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for f in done:
            if f.exception() is not None:
                self._asked = self._committed  # asked again, it is tried again
                raise f.exception()  # type: ignore[misc]

    def wait_for_commits(self) -> None:
        """Blocks until every commit asked so far is done; raises the first
        that failed. ``stop()`` calls it."""
        for f in self._pending:
            f.exception()  # waits; each commit is bounded by the client's timeouts
        self._raise_failed()

    def _plan(self, batch: int, limits: Dict[str, int]):
        self._limits[batch] = limits
        o = self._o
        try:
            return driver.reconnecting(
                o, f"plan of batch {batch}", lambda c: c.plan(o.table, o.consumer, batch, **limits)
            )
        except SqsFlightError as e:
            cap, share = o.batch_limits.max_bytes, limits.get("max_bytes")
            from_cap = cap is not None and share is not None and share != o.plan_limits().get("max_bytes")
            if not from_cap or e.reason not in _MAX_BYTES_REFUSED:
                raise
            raise SqsFlightError(
                e.code,
                (
                    f"{e} (option maxBytesPerBatch {cap} over {limits.get('partitions')} partitions asks "
                    f'{share} bytes per partition: lower it, raise "partitions", or the server\'s '
                    "--limit-max-bytes)"
                ),
                reason=e.reason,
            ) from None

    def _watching(self) -> None:
        """Managed mode: starts the watchdog, once, unless stopping."""
        if self._watch is None and self._o.managed is not None and not self._stopping:
            self._watch = driver.Watchdog(self._o)

    def initialOffset(self) -> dict:
        self._watching()
        return {"batch": self._consumer_status().get("committed_batch") or 0}

    def getDefaultReadLimit(self) -> Any:
        return self._o.read_limits().read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        # Every micro-batch reads at least one message while the table is not
        # empty, so this many batches drain what is there now and a producer
        # that never stops cannot keep the run going for ever.
        # The depth when the run starts: initialOffset(), just before, read it
        # (at most AVAILABLE_NOW_MAX_AGE_MS ago, or this reads it now).
        self._available_now_left = self._waiting(self._table_status(max_age_ms=AVAILABLE_NOW_MAX_AGE_MS))

    def latestOffset(self, start: Optional[dict] = None, limit: Any = None) -> dict:
        self._watching()
        if start is None:  # pyspark < 4.2 calls latestOffset() with no argument
            return self._latest_legacy()
        last = _batch(start)
        if last > 0:
            self._ask_commit(last)  # Spark has the batch ending at `start` in its commit log
        limits = self._o.read_limits().under(limit)
        if not self._admits(limits):
            self.wait_for_commits()  # no batch to overlap with: a run that ends here leaves nothing in flight
            self._latest = last
            return start
        self._plan(last + 1, limits.plan(self._o.plan_limits()))
        self._delay.planned()
        if self._available_now_left is not None:
            self._available_now_left -= 1
        self._latest = last + 1
        return {"batch": last + 1}

    def reportLatestOffset(self) -> Optional[dict]:
        """The queue's backlog, for Spark's progress (see the module doc);
        None (Spark shows null) before the first ``latestOffset`` or when
        the status call fails: a progress report never fails the query, and
        is not tried again (``reconnectSeconds`` is for the calls that
        plan)."""
        if self._latest is None:
            return None
        o = self._o
        try:
            table = o.client().status(o.table, max_age_ms=BACKLOG_MAX_AGE_MS)["tables"][o.table]
        except SqsFlightError as e:
            _log.debug("sqs-flight: no backlog for the progress of %r: %s", o.table, e)
            return None
        visible, in_flight = int(table["approximate_depth"]), int(table["approximate_in_flight"])
        return {
            "batch": self._latest,
            "approximate_backlog": visible + in_flight,
            "approximate_depth": visible,
            "approximate_in_flight": in_flight,
        }

    def _admits(self, limits: BatchLimits) -> bool:
        """Whether this trigger plans a batch: the table has visible messages
        (no empty micro-batches), an AvailableNow run has batches left, and
        ``minRowsPerBatch`` is met or has waited ``maxTriggerDelay``."""
        available_now = self._available_now_left is not None
        if available_now and self._available_now_left <= 0:  # type: ignore[operator]
            return False
        depth = self._waiting(self._table_status())
        return depth > 0 and self._delay.admits(limits, depth, available_now)

    def _waiting(self, table: Mapping[str, Any]) -> int:
        """Messages waiting for this consumer: the queue's visible ones and
        those the server read ahead of its next plan (SQS counts those in
        flight).

        Both can be 0 while a ReceiveMessage call of the consumer's is in
        flight (``receives_in_flight``: a receive of the batch read ahead,
        or calls a first read left in flight when it ended at its caps,
        which hand back what they bring): what they took is in neither
        count yet. Then the answer waits for them, at most the batch's idle
        wait and a margin (:data:`RECEIVES_WAIT_MARGIN_S`), so a trigger does
        not conclude that a busy queue is empty; on an idle queue the batch
        read ahead costs that wait once after each batch (the next trigger
        finds it received and empty)."""
        deadline: Optional[float] = None
        while True:
            consumer = table.get("consumers", {}).get(self._o.consumer, {})
            waiting = int(table["approximate_depth"]) + int(consumer.get("read_ahead") or 0)
            if waiting > 0 or not consumer.get("receives_in_flight"):
                return waiting
            now = time.monotonic()
            if deadline is None:
                wait_ms = self._o.plan_limits().get("max_wait_ms", LARGEST_MAX_WAIT_MS)
                deadline = now + wait_ms / 1000 + RECEIVES_WAIT_MARGIN_S
            if now >= deadline:
                return waiting
            time.sleep(RECEIVES_POLL_S)
            table = self._table_status()

    def _latest_legacy(self) -> dict:
        """pyspark 4.0/4.1: no start is given, so the server's record is the start.

        Spark asks for the next offset only after the batch it got last from
        this reader is in its commit log, so that batch is committed here.
        """
        if self._o.batch_limits.min_rows is not None:
            raise SqsFlightError(
                "INVALID_ARGUMENT",
                (
                    'sqs-flight source: option "minRowsPerBatch" needs pyspark >= 4.2: this pyspark calls '
                    "latestOffset() without a start offset or read limit, so the source cannot tell a "
                    "Trigger.AvailableNow run (which must not wait) from a waiting trigger"
                ),
            )
        table = self._table_status()
        consumer = table.get("consumers", {}).get(self._o.consumer, {})
        base = max(
            consumer.get("last_planned_batch") or 0,
            consumer.get("committed_batch") or 0,
            self._legacy_last or 0,  # the server forgets released batches; Spark does not
        )
        if self._legacy_last is not None:
            self._ask_commit(self._legacy_last)
        if self._waiting(table) == 0:
            self.wait_for_commits()
            return {"batch": base}
        # maxBytesPerBatch needs nothing of Spark: it applies here too.
        self._plan(base + 1, BatchLimits(max_bytes=self._o.batch_limits.max_bytes).plan(self._o.plan_limits()))
        self._legacy_last = base + 1
        return {"batch": base + 1}

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        batches = range(_batch(start) + 1, _batch(end) + 1)
        if not batches:
            return []
        # latestOffset plans every batch before Spark logs its offset, so a
        # batch the server no longer holds was released (consumer lease
        # expired, server restarted without --state-dir) after a crash. Its
        # messages are back in the queue: planning it again would receive new
        # ones under a micro-batch the sink may already have committed, and
        # they would be deleted unseen. Read nothing for it instead; later
        # batches read those messages again (at-least-once).
        open_batches = set(self._consumer_status().get("open_batches") or [])
        parts: List[InputPartition] = []
        for batch in batches:
            if batch not in open_batches:
                _log.warning(
                    "sqs-flight: batch %d of consumer %r on table %r was released before Spark "
                    "committed it; it replays empty and its messages are read again later",
                    batch,
                    self._o.consumer,
                    self._o.table,
                )
                continue
            plan = self._plan(batch, self._limits.get(batch, self._o.plan_limits()))
            token = driver.current_token(self._o) if self._o.managed is not None else None
            parts.extend(FlightPartition(e.ticket, e.locations, token) for e in plan.endpoints)
        return parts

    def commit(self, end: dict) -> None:
        self._ask_commit(_batch(end))

    def stop(self) -> None:
        # The open batches stay: an uncommitted batch must replay after a
        # restart, and the server's consumer lease returns its messages if
        # none comes. The batch read ahead was never planned by Spark: it is
        # given back now, so that other readers of the queue do not wait for
        # the lease. A receive of it still long-polling hands back what it
        # brings when it ends; until then the server counts it in
        # `receives_in_flight`, which a restart's first trigger waits for.
        self._stopping = True
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        try:
            self.wait_for_commits()
            self._give_back_read_ahead()
        finally:
            if self._commits is not None:
                self._commits.shutdown(wait=True)
                self._commits = None

    def _give_back_read_ahead(self) -> None:
        """``release`` with ``read_ahead_only``, once, best effort: a server
        that cannot be reached gives the batch back at its lease's end."""
        o = self._o
        if not o.plan_limits().get("read_ahead"):
            return
        try:
            o.client().release(o.table, o.consumer, read_ahead_only=True)
        except SqsFlightError as e:
            _log.info(
                "sqs-flight: could not give back the batch read ahead for consumer %r of %r (%s); "
                "the server gives it back when the consumer's lease ends",
                o.consumer,
                o.table,
                e,
            )

    # -- executor side --------------------------------------------------

    def read(self, partition: FlightPartition) -> Iterator[pa.RecordBatch]:
        target = arrow_schema(self._schema)
        # A server being started again (managed mode's watchdog, a restart on
        # --state-dir) is waited for, but only before the first row: rows
        # already handed to Spark cannot be taken back, so a read cut half
        # way fails its task and Spark's retry replays the ticket.
        deadline = time.monotonic() + self._o.reconnect
        delay = 0.1
        while True:
            started = False
            try:
                for batch in rebatch(self._batches(partition)):
                    started = True
                    yield conform(batch, target)
                return
            except SqsFlightError as e:
                if self._o.managed is not None and e.code == "UNAUTHENTICATED":
                    raise self._restarted_hint(e) from None
                if started or not driver.unreachable(e):
                    raise
                if time.monotonic() + delay > deadline:
                    raise self._unreachable_hint(e) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _batches(self, partition: FlightPartition) -> Iterator[pa.RecordBatch]:
        """The ticket's rows; with ``rejectPayloadErrors``, those whose
        payload decoded (a replay leaves out the same rows)."""
        o, token = self._o, getattr(partition, "token", None)
        client = (
            o.client()
            if token is None
            else driver.cached_client(o.url, token, o.timeout, o.read_timeout, o.tls_root_certs)
        )
        batches = client.stream(partition.endpoint())
        if not self._o.reject_payload_errors:
            return batches
        return (without_payload_errors(b) for b in batches)

    @staticmethod
    def _restarted_hint(e: SqsFlightError) -> SqsFlightError:
        """Managed mode: a task whose batch was planned before the server
        was started again (each start makes a new token) is told so."""
        return SqsFlightError(
            e.code,
            f"{e}; the managed server was started again since this batch was planned (after a crash or an "
            "idle exit, or by another query adding a table), with a new token: restart the query, which "
            "plans the batch again and replays its rows",
        )

    def _unreachable_hint(self, e: SqsFlightError) -> SqsFlightError:
        """Managed mode: an executor that cannot reach the driver's server is
        told which address it tried, where that came from, and the fix."""
        spec = self._o.managed
        if spec is None:
            return e
        return SqsFlightError(
            e.code,
            f"{e}; this executor could not reach the managed server at {self._o.client().url} (host "
            f'{spec.host()}, from {spec.advertise_from}): set the option "advertiseHost" to an address of '
            "the driver that executors can reach (and let the port through)",
        )
