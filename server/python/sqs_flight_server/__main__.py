"""``python -m sqs_flight_server ARGS``: runs the installed binary with ARGS."""

from __future__ import annotations

import sys

from ._find import BIN_NAME
from ._run import run


def main() -> int:
    return run(BIN_NAME, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
