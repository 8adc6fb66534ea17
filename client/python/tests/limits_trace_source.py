"""A test-only subclass of the Spark source whose stream reader records, for
every ``latestOffset`` call that found messages (and the first), what ``minRowsPerBatch``
decided from: the table's approximate depth it saw, the seconds since its
last batch (its own clock, read just before and just after it decided), the
limit Spark passed, and whether it planned a batch. The reader runs in the driver's Python
worker, so the record goes to a JSON-lines file (option ``traceFile``).

Spark pickles the data source into its Python workers, so the test registers
this module with cloudpickle by value (it is not installed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from sqs_flight.spark import Options, SqsFlightDataSource, SqsFlightStreamReader


class LimitsTraceReader(SqsFlightStreamReader):
    def __init__(self, options: Options, schema: Any, trace: str):
        super().__init__(options, schema)
        self._trace = trace
        self._seen: Dict[str, Any] = {}

    def _table_status(self, max_age_ms: Optional[int] = None) -> Dict[str, Any]:
        status = super()._table_status(max_age_ms)
        self._seen["depth"] = int(status["approximate_depth"])
        return status

    def _admits(self, limits: Any) -> bool:
        # The reader's own reading of its clock lies between these two.
        before = self._delay.waited_s()
        admitted = super()._admits(limits)
        after = self._delay.waited_s()
        self._seen.update(
            waited_before_s=before,
            waited_after_s=after,
            min_rows=limits.min_rows,
            delay_s=limits.max_trigger_delay_ms / 1000,
            admitted=admitted,
        )
        return admitted

    def latestOffset(self, start: Any = None, limit: Any = None) -> Any:
        self._seen = {}
        end = super().latestOffset(start, limit)
        if self._seen.get("depth") or not Path(self._trace).exists():  # the first call shows the query runs
            with open(self._trace, "a") as f:
                f.write(
                    json.dumps(
                        {**self._seen, "start": start["batch"], "end": end["batch"], "limit": type(limit).__name__}
                    )
                    + "\n"
                )
        return end


class LimitsTraceDataSource(SqsFlightDataSource):
    """Format ``sqs-flight-limits-traced``; extra option ``traceFile``."""

    extra_options = ("traceFile",)

    @classmethod
    def name(cls) -> str:
        return "sqs-flight-limits-traced"

    def streamReader(self, schema: Any) -> LimitsTraceReader:
        o = self._read_options("spark-{table}")
        return LimitsTraceReader(o, schema, self.options["traceFile"])


def read_trace(path: str) -> List[Dict[str, Any]]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
