"""Runs the installed binary under a name: ``sqs-flight-server`` (the
server) or ``sqs-flight`` (the same binary as the command-line client)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List

from ._find import ServerBinaryNotFound, find_server_bin

#: The name under which the server binary is the command-line client.
CLI_NAME = "sqs-flight"


def run(name: str, args: List[str]) -> int:
    """Runs the binary with ``argv[0] = name`` and ``args``: on POSIX in place
    of this process, so signals and the exit status are the binary's own."""
    try:
        binary = find_server_bin()
    except ServerBinaryNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if os.name == "posix":
        os.execv(binary, [name, *args])
    return subprocess.call([name, *args], executable=binary)


def cli() -> int:
    """``sqs-flight ARGS``: the command-line client."""
    return run(CLI_NAME, sys.argv[1:])
