"""The files a client reads its credentials from: the bearer token and the
PEM roots a ``grpc+tls://`` server's certificate is checked against
(re-exported by :mod:`sqs_flight.client`)."""

from __future__ import annotations

import os
from typing import Optional, Union

from .errors import SqsFlightError

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"

#: The :attr:`SqsFlightError.reason` of a token file that cannot be used.
TOKEN_FILE = "token_file"
#: The :attr:`SqsFlightError.reason` of TLS root certificates that cannot be used.
TLS_ROOT_CERTS = "tls_root_certs"


def read_pem(certs: Union[str, bytes, "os.PathLike[str]", None]) -> Optional[bytes]:
    """The PEM bytes of ``tls_root_certs``: PEM given as bytes or as text
    (starting with ``-----BEGIN``), or read from a file path. Refused, naming
    the file, when it is unreadable or holds no certificate."""
    if not certs:
        return None
    if isinstance(certs, bytes):
        pem, source = certs, "tls_root_certs"
    elif isinstance(certs, str) and certs.lstrip().startswith("-----BEGIN"):
        pem, source = certs.encode(), "tls_root_certs"
    else:
        path = os.fspath(certs)
        try:
            with open(path, "rb") as f:
                pem = f.read()
        except OSError as e:
            raise SqsFlightError(
                "INVALID_ARGUMENT", f"cannot read tls root certs {path!r}: {e}", reason=TLS_ROOT_CERTS
            ) from None
        source = f"tls root certs {path!r}"
    if _PEM_CERT not in pem:
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f"{source}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            reason=TLS_ROOT_CERTS,
        )
    return pem


def read_token_file(path: Union[str, "os.PathLike[str]"]) -> str:
    """The token in the file at ``path``, without its trailing line break."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise SqsFlightError("INVALID_ARGUMENT", f"cannot read token file {path!r}: {e}", reason=TOKEN_FILE) from None
    if not token:
        raise SqsFlightError("INVALID_ARGUMENT", f"token file {path!r} is empty", reason=TOKEN_FILE)
    return token
