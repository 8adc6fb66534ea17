"""The server's reasons: why it refused a call, as a word a program may
branch on (docs/protocol.md, "Error reasons").

The server sends the reason as the ``sqsf-reason`` trailer. pyarrow does not
put trailers on the exceptions it raises, but hands those of a call whose
answer is only trailers (every refusal before the answer starts streaming:
a plan, a schema, an action, a ticket refused at once) to a client
middleware as its headers; :class:`ReasonCatcher` keeps them for the thread
that made the call, which reads them when it converts the exception.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import pyarrow.flight as flight

#: The trailer that carries the reason.
HEADER = "sqsf-reason"


class _Seen:
    """The reason of the last call one thread started."""

    reason: Optional[str] = None


class _Call(flight.ClientMiddleware):
    def __init__(self, seen: _Seen):
        self._seen = seen

    def received_headers(self, headers: Dict[str, List[Any]]) -> None:
        values = headers.get(HEADER)
        if values:
            value = values[0]
            self._seen.reason = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


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
        seen.reason = None
        return _Call(seen)

    def last(self) -> Optional[str]:
        """The reason of the last call this thread started, if it had one."""
        return self._seen().reason
