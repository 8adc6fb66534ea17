"""The one exception of the sqs-flight client (re-exported by
:mod:`sqs_flight.client` and the package)."""

from __future__ import annotations

from typing import Optional


class SqsFlightError(Exception):
    """A failed sqs-flight call: ``code`` is the gRPC status name.

    ``reason`` says why, in a word a program may branch on (the message is
    for people, and its words may change): the server's ``sqsf-reason``
    (docs/protocol.md, "Error reasons"), such as ``"queue_not_found"`` or
    ``"limit:max_bytes"``; for a file the client itself could not use,
    ``"token_file"`` or ``"tls_root_certs"``; ``None`` when there is none
    (the call never reached the server, or the server refused it after its
    answer had started streaming, where pyarrow does not show the trailers).

    A failed write also says how far it got: ``sent`` is the number of rows
    that reached SQS before the failure (the server's count when it gave
    one), ``row`` the 0-based number, in the written stream, of the row the
    server refused, if one was.
    """

    # Tracebacks, logs and pickles name it where it was always defined and
    # documented (docs/troubleshooting.md), and where it is still exported.
    __module__ = "sqs_flight.client"

    def __init__(
        self,
        code: str,
        message: str,
        *,
        sent: Optional[int] = None,
        row: Optional[int] = None,
        reason: Optional[str] = None,
    ):
        super().__init__(message)
        self.code = code
        self.sent = sent
        self.row = row
        self.reason = reason

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Exception's own reduce passes only the message to __init__; an
        # error crossing processes (a pool, a Spark worker) keeps every field.
        return (_rebuild, (self.code, str(self), self.sent, self.row, self.reason))


def _rebuild(code: str, message: str, sent: Optional[int], row: Optional[int], reason: Optional[str]) -> SqsFlightError:
    return SqsFlightError(code, message, sent=sent, row=row, reason=reason)
