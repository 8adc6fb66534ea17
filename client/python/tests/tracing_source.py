"""A test-only subclass of the Spark source that records every commit the
reader makes: which path asked for it (Spark's ``commit(end)`` or the
``latestOffset(start)`` rule), whether the batch was already in the
checkpoint's commit log at that moment, and the server's watermark before and
after. It can also switch the latestOffset path off, to show what the
``commit(end)`` path alone leaves behind.

Spark pickles the data source into its Python workers, so the test registers
this module with cloudpickle by value (it is not installed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Set

from sqs_flight.spark import Options, SqsFlightDataSource, SqsFlightStreamReader


def spark_committed_batches(checkpoint: str) -> Set[int]:
    """Server batches whose micro-batch is in the checkpoint's commit log."""
    root = Path(checkpoint)
    done: Set[int] = set()
    commits = root / "commits"
    if not commits.is_dir():
        return done
    for entry in commits.iterdir():
        if entry.name.isdigit():
            lines = (root / "offsets" / entry.name).read_text().splitlines()
            done.add(int(json.loads(lines[-1])["batch"]))
    return done


class TracingStreamReader(SqsFlightStreamReader):
    def __init__(self, options: Options, schema, trace: str, checkpoint: str, latest_commits: bool):
        super().__init__(options, schema)
        self._trace = trace
        self._checkpoint = checkpoint
        self._latest_commits = latest_commits
        self._path: Optional[str] = None
        self._asked_by: Dict[int, Dict] = {}

    def latestOffset(self, start=None, limit=None):
        self._path = "latestOffset"
        try:
            return super().latestOffset(start, limit)
        finally:
            self._path = None

    def commit(self, end):
        self._path = "commit"
        try:
            super().commit(end)
        finally:
            self._path = None

    def _watermark(self) -> Optional[int]:
        return self._consumer_status().get("committed_batch")

    def _ask_commit(self, batch: int) -> None:
        # What the driver knew when it asked: the commit itself runs later,
        # on the commit thread, so an early delete could only come from here.
        entry = {
            "path": self._path,
            "batch": batch,
            "in_spark_commit_log": batch in spark_committed_batches(self._checkpoint),
        }
        if self._path == "latestOffset" and not self._latest_commits:
            watermark = self._watermark()
            self._write({**entry, "skipped": True, "server_before": watermark, "server_after": watermark})
            return
        if batch > self._asked:
            self._asked_by[batch] = entry
        super()._ask_commit(batch)

    def _commit(self, batch: int) -> None:
        entry = {**self._asked_by.pop(batch, {"batch": batch}), "server_before": self._watermark()}
        super()._commit(batch)
        entry["server_after"] = self._watermark()
        self._write(entry)

    def _write(self, entry: Dict) -> None:
        with open(self._trace, "a") as f:
            f.write(json.dumps(entry) + "\n")


class TracingDataSource(SqsFlightDataSource):
    """Format ``sqs-flight-traced``; extra options ``traceFile``,
    ``checkpoint`` and ``latestOffsetCommits`` (default true)."""

    extra_options = ("traceFile", "checkpoint", "latestOffsetCommits")

    @classmethod
    def name(cls) -> str:
        return "sqs-flight-traced"

    def streamReader(self, schema):
        return TracingStreamReader(
            Options.parse(self.options, "spark-{table}", self.extra_options),
            schema,
            self.options["traceFile"],
            self.options["checkpoint"],
            self.options.get("latestOffsetCommits", "true") == "true",
        )


def read_trace(path: str):
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
