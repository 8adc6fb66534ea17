"""The sqs-flight server binary, installed by pip.

The wheel puts ``sqs-flight-server`` into the environment's scripts
directory; :func:`find_server_bin` finds it wherever pip put it (a venv, the
user scheme, ``--prefix`` or ``--target`` installs)::

    import subprocess, sqs_flight_server
    subprocess.run([sqs_flight_server.find_server_bin(), "--help"])

``python -m sqs_flight_server ARGS`` runs it with ``ARGS``. The same binary
is the command-line client when started as ``sqs-flight``: the wheel
installs an ``sqs-flight`` script that does so. To start a server
from Python and stop it with the interpreter, use ``sqs_flight.serve``.
"""

from __future__ import annotations

from ._find import BIN_NAME, ServerBinaryNotFound, find_server_bin
from ._run import CLI_NAME

__all__ = ["BIN_NAME", "CLI_NAME", "ServerBinaryNotFound", "find_server_bin"]
