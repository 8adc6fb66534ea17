"""The server's reasons: why it refused a call, as a word a program may
branch on (docs/protocol.md, "Error reasons").

The server sends the reason as the ``sqsf-reason`` trailer (and, for a
failed DoPut, ``sqsf-rows-sent`` and ``sqsf-row``). pyarrow does not
put trailers on the exceptions it raises, but hands those of a call whose
answer is only trailers (every refusal before the answer starts streaming:
a plan, a schema, an action, a ticket refused at once) to a client
middleware as its headers; :class:`ReasonCatcher` keeps them for the thread
that made the call, which reads them when it converts the exception.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

import pyarrow.flight as flight

#: The trailer that carries the reason.
HEADER = "sqsf-reason"
#: The trailer of a failed DoPut: rows sent before the failure, whole call.
ROWS_SENT_HEADER = "sqsf-rows-sent"
#: The trailer of a failed DoPut: the row that was the reason, from 0.
ROW_HEADER = "sqsf-row"


class _Seen:
    """What the last call one thread started said in its trailers."""

    reason: Optional[str] = None
    rows_sent: Optional[int] = None
    row: Optional[int] = None


def _text(headers: Dict[str, List[Any]], name: str) -> Optional[str]:
    values = headers.get(name)
    if not values:
        return None
    value = values[0]
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _count(headers: Dict[str, List[Any]], name: str) -> Optional[int]:
    text = _text(headers, name)
    return int(text) if text is not None and text.isdigit() else None


class _Call(flight.ClientMiddleware):
    def __init__(self, seen: _Seen):
        self._seen = seen

    def received_headers(self, headers: Dict[str, List[Any]]) -> None:
        reason = _text(headers, HEADER)
        if reason is not None:
            self._seen.reason = reason
        rows_sent, row = _count(headers, ROWS_SENT_HEADER), _count(headers, ROW_HEADER)
        if rows_sent is not None:
            self._seen.rows_sent = rows_sent
        if row is not None:
            self._seen.row = row


class ReasonCatcher(flight.ClientMiddlewareFactory):
    """A client middleware that keeps each thread's last ``sqsf-reason``."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _seen(self) -> _Seen:
        seen = getattr(self._local, "seen", None)
        if seen is None:
            seen = self._local.seen = _Seen()
        return seen

    def start_call(self, info: Any) -> _Call:
        # Called on the calling thread; the call's headers may arrive on
        # another, so the call keeps this thread's record itself.
        seen = self._seen()
        seen.reason = seen.rows_sent = seen.row = None
        return _Call(seen)

    def last(self) -> Optional[str]:
        """The reason of the last call this thread started, if it had one."""
        return self._seen().reason

    def last_put(self) -> Tuple[Optional[int], Optional[int]]:
        """The rows sent and the failing row of the last failed DoPut this
        thread started (``sqsf-rows-sent``, ``sqsf-row``), where it said."""
        seen = self._seen()
        return seen.rows_sent, seen.row
