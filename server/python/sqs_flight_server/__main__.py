"""``python -m sqs_flight_server ARGS``: runs the installed binary with ARGS."""

from __future__ import annotations

import os
import subprocess
import sys

from ._find import ServerBinaryNotFound, find_server_bin


def main() -> int:
    try:
        binary = find_server_bin()
    except ServerBinaryNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if os.name == "posix":
        os.execv(binary, [binary, *sys.argv[1:]])
    return subprocess.call([binary, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
