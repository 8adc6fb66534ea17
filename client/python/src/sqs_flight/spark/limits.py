"""Read limits of the stream reader: what one micro-batch may hold and how
much the queue must hold before one is planned.

* ``maxRowsPerBatch`` (Spark's ``ReadMaxRows``) and ``maxBytesPerBatch``
  (``ReadMaxBytes``) cap a batch: they become the plan's ``partitions``,
  ``max_messages`` and ``max_bytes`` (both per partition, so each is the
  cap divided by the partitions, rounded down).
* ``minRowsPerBatch`` (``ReadMinRows``) with ``maxTriggerDelay``: Kafka's
  ``minOffsetsPerTrigger`` / ``maxTriggerDelay``. A trigger plans no batch
  while the table's approximate depth (the ``status`` action) is below the
  minimum, unless ``maxTriggerDelay`` has passed since the last batch this
  reader planned (or since it started). ``Trigger.AvailableNow`` never waits.

A Python source hands Spark one :class:`ReadLimit` (there is no composite
one), and Spark passes ``latestOffset`` either that same limit or
``ReadAllAvailable`` (``Trigger.Once``). So :meth:`BatchLimits.read_limit`
names one of the options' limits, and :meth:`BatchLimits.under` reads "the
same limit" as "every limit the options set", as Kafka's source combines
them; ``ReadAllAvailable`` ignores them all, as Spark asks; any other limit
Spark passes is honoured alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from .._plan_params import PLAN_PARAMS
from ..client import SqsFlightError

try:  # pyspark >= 4.2
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
except ImportError:  # pyspark 4.0 / 4.1: no read limits
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
try:
    from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMinRows
except ImportError:
    ReadMaxBytes = ReadMinRows = None  # type: ignore[assignment,misc]

#: ``maxTriggerDelay`` when unset: 15 minutes, as Kafka's source.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

#: Partitions used with ``maxRowsPerBatch`` or ``maxBytesPerBatch`` when the
#: ``partitions`` option is unset: the server's built-in default.
DEFAULT_PARTITIONS = next(p.default for p in PLAN_PARAMS if p.name == "partitions")


@dataclass(frozen=True)
class BatchLimits:
    """The options that bound a micro-batch; plain data, so it pickles."""

    max_rows: Optional[int] = None
    max_bytes: Optional[int] = None
    min_rows: Optional[int] = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS

    def read_limit(self) -> Any:
        """The one limit ``getDefaultReadLimit`` gives Spark."""
        if self.max_rows is not None:
            return ReadMaxRows(self.max_rows)
        if self.max_bytes is not None and ReadMaxBytes is not None:
            return ReadMaxBytes(self.max_bytes)
        if self.min_rows is not None and ReadMinRows is not None:
            return ReadMinRows(self.min_rows)
        return ReadAllAvailable()

    def under(self, limit: Any) -> "BatchLimits":
        """The limits that apply when Spark passes ``limit`` to ``latestOffset``."""
        if ReadAllAvailable is None or isinstance(limit, ReadAllAvailable):
            return BatchLimits()
        if limit == self.read_limit():
            return self
        if isinstance(limit, ReadMaxRows):
            return BatchLimits(max_rows=int(limit.max_rows))
        if ReadMaxBytes is not None and isinstance(limit, ReadMaxBytes):
            return BatchLimits(max_bytes=int(limit.max_bytes))
        if ReadMinRows is not None and isinstance(limit, ReadMinRows):
            return BatchLimits(min_rows=int(limit.min_rows), max_trigger_delay_ms=self.max_trigger_delay_ms)
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f"sqs-flight source: Spark asked for the read limit {limit!r}, which it cannot honour "
            "(it knows ReadAllAvailable, ReadMaxRows, ReadMaxBytes and ReadMinRows)",
        )

    def plan(self, base: Dict[str, int]) -> Dict[str, int]:
        """``base`` (the per-partition plan options) with the caps applied:
        ``partitions`` (default 2, at most the cap), and per partition the
        cap divided by the partitions, or the option's own value if lower."""
        limits = dict(base)
        caps = {"max_messages": self.max_rows, "max_bytes": self.max_bytes}
        caps = {field: max(1, int(cap)) for field, cap in caps.items() if cap is not None}
        if not caps:
            return limits
        parts = min(limits.get("partitions", DEFAULT_PARTITIONS), *caps.values())
        limits["partitions"] = parts
        for field, cap in caps.items():
            limits[field] = min(limits.get(field, cap // parts), cap // parts)
        return limits


class TriggerDelay:
    """``minRowsPerBatch``'s wait, on the driver: whether a trigger may plan
    a batch now. Measured on this process's monotonic clock from the last
    batch planned, or from the reader's start."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._since = clock()

    def admits(self, limits: BatchLimits, depth: int, available_now: bool) -> bool:
        """Whether a trigger that sees ``depth`` visible messages plans a batch."""
        if limits.min_rows is None or available_now or depth >= limits.min_rows:
            return True
        return self.waited_s() * 1000 >= limits.max_trigger_delay_ms

    def waited_s(self) -> float:
        """Seconds since the last batch planned (or the reader's start)."""
        return self._clock() - self._since

    def planned(self) -> None:
        self._since = self._clock()
