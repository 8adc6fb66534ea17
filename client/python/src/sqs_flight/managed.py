"""Managed servers: the Spark source's driver side starts an sqs-flight server
for a queue itself, or reuses the one already running for its state
directory.

Spark starts a new Python process for a data source at each query start and
kills it at the query's stop, so a managed server is not a child of that
process: it runs in a session of its own, and the next process finds it
through files in the state directory, under an exclusive lock:

- ``managed.lock``: ``flock``-ed while a process checks, starts or stops the
  server;
- ``managed.json`` (mode 0600): SQS and S3 endpoints, tables (name -> queue URL),
  their regions, large-payload settings and IAM roles, and the server last started: its bearer token (a new
  one at each start, so that one that leaked dies with its server), pid,
  its start time (``/proc``), instance id, port, URL. Written *before* the
  server starts, so that a token is never lost with a driver that dies;
- ``tables.toml``: the server's ``--config``, made from ``managed.json`` at
  each start: a ``[tables.NAME]`` per table with the region and the IAM
  role a query gave for it, so that one server reads queues of several
  regions and accounts, and the ``[tables.NAME.large_payloads]`` its query
  asked for;
- ``ready.json``: written by the server itself (``--ready-file``) once it
  listens: URL, pid, instance id. A driver that died between starting the
  server and recording it leaves a server that the next one adopts;
- ``tls/``: the certificate a server off loopback makes for itself
  (``--tls-self-signed``); ``registry/``: the server's ``--state-dir``;
  ``server.log``: its log.

Whether the server lives is asked with the ``server_info`` action, which
answers from the server alone: throttling, an expired credential or a deleted
queue never make a healthy server look dead. The token goes to the recorded
URL only once the recorded process is confirmed (its pid runs as this user,
with the recorded start time and command line) and every socket listening on
the URL's port is one of its own (``/proc/net/tcp*`` inodes among its
``/proc/PID/fd`` links): another local user's listener on the port of a
server that exited gets nothing. Only the recorded pid is signalled, never
one that came over the wire, and it is checked again right before each
signal (through a pidfd where there is one).

The server binds the address it advertises, never every interface;
plaintext off loopback (``tls=False``) needs ``plaintext_off_loopback``
(the option ``serverPlaintextOffLoopback``). Its environment is the
driver's without any ``SQSF_*`` variable but its token.

One server per state directory serves every query and queue that uses it, a
table per queue URL. A queue it does not serve yet restarts it with one table
more, on the same port; ``python -m sqs_flight.managed drop --state-dir DIR
TABLE`` takes one out. A server that died (kill -9, OOM) is started again by
the next driver-side call, on the same port when it is free, so that
partitions planned before the crash still reach it. It exits by itself after
``--idle-exit`` seconds without a call (never while a batch is held).

This module keeps the record and decides; :mod:`sqs_flight.managed_process`
finds, stops and starts the processes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .client import Client, SqsFlightError
from .managed_process import (
    Found,
    cert_pem,
    find,
    is_recorded_process,
    pid_runs,
    process_start,
    start,
    stop_found,
)
from .state_dir import (  # noqa: F401 - check_local_filesystem: part of this module's surface
    _locked,
    _read_json,
    _write_record,
    check_local_filesystem,
    private_state_dir,
)

__all__ = [
    "ManagedServer",
    "Running",
    "advertise_address",
    "check_plaintext",
    "default_state_dir",
    "drop_table",
    "ensure_server",
    "process_runs",
    "stop_server",
    "table_name_for",
]

_log = logging.getLogger("sqs_flight.managed")

#: Seconds a managed server waits without a call before it exits.
DEFAULT_IDLE_EXIT_S = 600
#: Seconds the first call for a new table (is its queue there?) may take.
PROBE_TIMEOUT_S = 15.0
_NAME = re.compile(r"[^A-Za-z0-9_-]+")


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/sqs-flight/managed``, else
    ``~/.local/state/sqs-flight/managed``: private to the user (0700), on
    the home's local disk, never the shared temp directory (where another
    user could create it first and read the token)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "sqs-flight" / "managed")


def table_name_for(queue_url: str) -> str:
    """The table a managed server gives a queue: its name, with what table
    names cannot hold replaced (``orders.fifo`` -> ``orders_fifo``)."""
    name = queue_url.rstrip("/").rsplit("/", 1)[-1]
    name = _NAME.sub("_", name).strip("_")
    if not name:
        raise SqsFlightError("INVALID_ARGUMENT", f"queue URL {queue_url!r} names no queue")
    return name[:80]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _own_address() -> Optional[str]:
    """The address of the interface this host reaches the outside by: a UDP
    socket ``connect`` only picks the route (it sends nothing), else the
    address of the host's name; None when both give loopback or fail."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed by the default route, never sent to
        host = s.getsockname()[0]
        if host and not _is_loopback(host) and host != "0.0.0.0":
            return host
    with contextlib.suppress(OSError):
        host = socket.gethostbyname(socket.gethostname())
        if not _is_loopback(host):
            return host
    return None


def advertise_address(option: Optional[str] = None, local_master: Optional[str] = None) -> Tuple[str, str]:
    """``(host, where it came from)``: the address executors reach the
    driver's server by. The ``advertiseHost`` option; else, with a local
    master (``local_master``: Spark's executors run in the driver's JVM) and
    no ``SPARK_LOCAL_IP``, loopback; else Databricks' ``DB_DRIVER_IP``, else
    ``SPARK_LOCAL_IP`` (the address Spark itself binds the driver to), else
    this host's own address (the interface of its default route, as Spark
    finds it), else loopback."""
    if not option and local_master and not os.environ.get("SPARK_LOCAL_IP"):
        return "127.0.0.1", f"loopback (Spark's master is {local_master})"
    for value, source in (
        (option, 'option "advertiseHost"'),
        (os.environ.get("DB_DRIVER_IP"), "DB_DRIVER_IP"),
        (os.environ.get("SPARK_LOCAL_IP"), "SPARK_LOCAL_IP"),
    ):
        if value:
            return value, source
    own = _own_address()
    if own:
        return own, "this host's own address (its default route's interface)"
    return "127.0.0.1", "loopback (no address of this host other than loopback was found)"


@dataclasses.dataclass(frozen=True)
class ManagedServer:
    """What the driver side asks for: a server in ``state_dir`` that serves
    ``queue_url`` as ``table``. Plain data: it pickles with the options."""

    state_dir: str
    queue_url: str
    table: str
    sqs_endpoint: Optional[str] = None
    region: Optional[str] = None
    #: An S3-compatible endpoint for the objects of large payloads (the
    #: option ``s3Endpoint``); None: AWS's (or ``AWS_ENDPOINT_URL_S3``).
    s3_endpoint: Optional[str] = None
    #: Where the server keeps its state beside ``state_dir`` so that a
    #: server on a new cluster takes it over (the option ``stateUrl``).
    state_url: Optional[str] = None
    advertise_host: Optional[str] = None
    idle_exit: int = DEFAULT_IDLE_EXIT_S
    server_bin: Optional[str] = None
    #: TLS: None decides by the address (on off loopback, off on loopback).
    tls: Optional[bool] = None
    #: ``tls=False`` off loopback is refused unless this is set (the option
    #: ``serverPlaintextOffLoopback``): the token would cross the network
    #: in plaintext.
    plaintext_off_loopback: bool = False
    #: Where ``advertise_host`` came from, for the executors' error message.
    advertise_from: str = 'option "advertiseHost"'
    #: The table's ``[tables.NAME.large_payloads]``: ``read`` (option
    #: ``largePayloads``) and ``bucket`` (``largePayloadBucket``). None:
    #: what the table was recorded with (for a new table: no read, no bucket).
    large_payloads: Optional[bool] = None
    large_payload_bucket: Optional[str] = None
    #: The IAM role the table's queue is read as (options ``roleArn``,
    #: ``roleExternalId``, ``roleSessionName``: the table's ``role_arn``,
    #: ``role_external_id``, ``role_session_name``). None: the driver's own
    #: AWS identity, or the role the table was recorded with.
    role_arn: Optional[str] = None
    role_external_id: Optional[str] = None
    role_session_name: Optional[str] = None

    def role(self) -> Optional[Dict[str, str]]:
        """The role as ``managed.json`` records it (None: none asked)."""
        if not self.role_arn:
            return None
        keys = {"arn": self.role_arn, "external_id": self.role_external_id, "session_name": self.role_session_name}
        return {k: v for k, v in keys.items() if v}

    def host(self) -> str:
        return self.advertise_host or "127.0.0.1"

    def wants_tls(self) -> bool:
        return self.tls if self.tls is not None else not _is_loopback(self.host())


@dataclasses.dataclass
class Running:
    """A managed server found or started: where clients reach it."""

    url: str
    token: str
    pid: int
    instance_id: str = ""
    #: The PEM clients trust (the server's certificate) when it speaks TLS.
    tls_root_certs: Optional[str] = None
    #: The process's start time (``/proc``): with ``pid``, one process.
    pid_start: Optional[str] = None


def process_runs(running: Running) -> bool:
    """Whether the process of ``running`` still runs (a pid check, no RPC:
    cheap enough to poll; the same pid with another start time is another
    process)."""
    if not pid_runs(running.pid):
        return False
    return running.pid_start is None or process_start(running.pid) == running.pid_start


def _bind_host(advertise: str) -> str:
    """The address the server listens on: the one it advertises (a name is
    resolved to its first address), never every interface."""
    if advertise == "localhost":
        return "127.0.0.1"
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(advertise))
    try:
        return str(socket.getaddrinfo(advertise, None, proto=socket.IPPROTO_TCP)[0][4][0])
    except (OSError, IndexError) as e:
        raise SqsFlightError(
            "FAILED_PRECONDITION",
            f"managed mode: the advertised host {advertise!r} does not resolve ({e}): set the option "
            '"advertiseHost" to an address of the driver',
        ) from None


def check_plaintext(spec: ManagedServer) -> None:
    """Refuses ``serverTls=false`` off loopback without the option
    ``serverPlaintextOffLoopback=true``: the bearer token (and every
    message) would cross the network in plaintext."""
    host = spec.host()
    if spec.tls is False and not _is_loopback(host) and not spec.plaintext_off_loopback:
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f'managed mode: option "serverTls" is false and the server is advertised at {host} (not loopback, '
            f"from {spec.advertise_from}): the token and the messages would cross the network in plaintext. "
            'Drop "serverTls" (TLS with the server\'s own certificate is the default off loopback), or set '
            '"serverPlaintextOffLoopback" to true to accept plaintext',
        )


def large_payloads_of(record: Dict[str, Any], table: str) -> Dict[str, Any]:
    """The large-payload settings ``record`` keeps for ``table``: ``read``
    (bool) and ``bucket`` (absent: none)."""
    return dict({"read": False}, **(record.get("large_payloads") or {}).get(table, {}))


def _check_large_payloads(state: Path, spec: ManagedServer, record: Dict[str, Any]) -> None:
    """Refuses large-payload options that differ from those ``spec.table``
    was recorded with: its server reads the table one way for every query
    (restarting it for each would cut the other queries' streams, and two
    queries that disagree would restart it in turn)."""
    if spec.table not in (record.get("tables") or {}):
        return
    mine = large_payloads_of(record, spec.table)
    asked = {"read": spec.large_payloads, "bucket": spec.large_payload_bucket}
    for key, option in (("read", "largePayloads"), ("bucket", "largePayloadBucket")):
        if asked[key] is None or asked[key] == mine.get(key):
            continue
        shown = lambda v: "unset" if v is None else str(v).lower() if isinstance(v, bool) else v  # noqa: E731
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f'the managed server in {state} serves table {spec.table!r} with option "{option}" '
            f"{shown(mine.get(key))}, not {shown(asked[key])}: drop the option (or set it as recorded), use "
            f"another stateDir, or take the table out first (python -m sqs_flight.managed drop --state-dir "
            f"{state} {spec.table}, then stop the server: python -m sqs_flight.managed stop --state-dir {state})",
        )


def _check_clashes(state: Path, spec: ManagedServer, record: Dict[str, Any]) -> None:
    """Refuses what one server of ``record`` cannot also serve."""
    known = (record.get("tables") or {}).get(spec.table)
    if known is not None and known != spec.queue_url:
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f"the managed server in {state} serves table {spec.table!r} for {known}, not "
            f'{spec.queue_url}: give this queue another name with the option "table"',
        )
    endpoint = record.get("sqs_endpoint")
    if record.get("token") and (endpoint or None) != (spec.sqs_endpoint or None):
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f"the managed server in {state} talks to SQS at {endpoint or 'AWS'}, not "
            f"{spec.sqs_endpoint or 'AWS'}: use another stateDir for this endpoint",
        )
    s3 = record.get("s3_endpoint")
    if record.get("token") and (s3 or None) != (spec.s3_endpoint or None):
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f"the managed server in {state} reaches S3 at {s3 or 'AWS'}, not {spec.s3_endpoint or 'AWS'}: "
            'give every query of a stateDir the same "s3Endpoint", or use another stateDir',
        )
    url = record.get("state_url")
    if record.get("token") and (url or None) != (spec.state_url or None):
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f"the managed server in {state} keeps its state at {url or 'the driver only'}, not "
            f'{spec.state_url or "the driver only"}: give every query of a stateDir the same "stateUrl", '
            "or use another stateDir",
        )
    _check_role(state, spec, record)
    mine = (record.get("regions") or {}).get(spec.table)
    if spec.region and mine and mine != spec.region:
        raise SqsFlightError(
            "INVALID_ARGUMENT",
            f"the managed server in {state} reads table {spec.table!r} in region {mine}, not "
            f'{spec.region}: drop the option "region" (or set it to {mine}), or use another stateDir',
        )
    _check_large_payloads(state, spec, record)


def _check_role(state: Path, spec: ManagedServer, record: Dict[str, Any]) -> None:
    """Refuses a role other than the one ``spec.table`` was recorded with:
    its server reads the table as one identity for every query."""
    asked = spec.role()
    if asked is None or spec.table not in (record.get("tables") or {}):
        return
    mine = (record.get("roles") or {}).get(spec.table)
    if mine == asked:
        return
    # The external id is never quoted back: only whether it differs.
    shown = lambda r: "no role" if not r else f"role {r['arn']} (session {r.get('session_name', 'default')})"  # noqa: E731
    raise SqsFlightError(
        "INVALID_ARGUMENT",
        f"the managed server in {state} reads table {spec.table!r} as {shown(mine)}, not as {shown(asked)}"
        f"{' with another roleExternalId' if mine and mine.get('arn') == asked['arn'] else ''}: give every query "
        f"of the table the same role options, or use another stateDir",
    )


def _running(state: Path, record: Dict[str, Any]) -> Running:
    return Running(
        record["url"],
        record["token"],
        int(record["pid"]),
        record.get("instance_id", ""),
        cert_pem(state, record),
        record.get("pid_start"),
    )


def _probe_new_table(state: Path, running: Running, spec: ManagedServer) -> None:
    """The first call for a table just added: a queue that does not exist is
    taken out of ``managed.json`` again (the server keeps it until its next
    restart, harmlessly), so that it does not come back at every start."""
    try:
        with Client(
            running.url, token=running.token, timeout=PROBE_TIMEOUT_S, tls_root_certs=running.tls_root_certs
        ) as c:
            c.status(spec.table)
    except SqsFlightError as e:
        if e.reason == "queue_not_found":
            _forget_table(state, spec.table)
            raise SqsFlightError(
                "NOT_FOUND",
                f"{e}; the queue {spec.queue_url} is not kept in {state / 'managed.json'}",
                reason=e.reason,
            ) from None
        # Anything else (throttling, credentials) may pass: the query reports it.


def _forget_table(state: Path, table: str) -> Dict[str, Any]:
    record = _read_json(state / "managed.json")
    record["tables"] = {t: u for t, u in (record.get("tables") or {}).items() if t != table}
    record["regions"] = {t: r for t, r in (record.get("regions") or {}).items() if t != table}
    record["large_payloads"] = {t: p for t, p in (record.get("large_payloads") or {}).items() if t != table}
    record["roles"] = {t: r for t, r in (record.get("roles") or {}).items() if t != table}
    _write_record(state, record)
    return record


def ensure_server(spec: ManagedServer) -> Running:
    """The server of ``spec.state_dir``, serving ``spec.queue_url`` as
    ``spec.table``: the running one if it answers ``server_info`` and serves
    the queue, else one started (again) for it."""
    check_plaintext(spec)
    state = private_state_dir(spec.state_dir)
    with _locked(state):
        record = _read_json(state / "managed.json")
        _check_clashes(state, spec, record)
        found = find(state, record) if record.get("token") else Found(None, 0, None, "no server was recorded")
        host, tls = spec.host(), spec.wants_tls()
        same_address = record.get("advertise") == host and bool(record.get("tls")) == tls
        new_table = spec.table not in (record.get("tables") or {})
        if found.info is not None:
            if found.info.get("instance_id") != record.get("instance_id"):
                # Adopted: its starter died before recording it.
                _log.info("sqs-flight: adopting the managed server in %s (pid %d)", state, found.pid)
                ready = _read_json(state / "ready.json")
                record = dict(
                    record,
                    pid=found.pid,
                    pid_start=found.start,
                    url=ready.get("url"),
                    instance_id=found.info["instance_id"],
                )
                _write_record(state, record)
            if spec.table in (found.info.get("tables") or []) and same_address:
                running = _running(state, record)
                if new_table:  # served (adopted, or a queue found missing before), not recorded
                    _probe_new_table(state, running, spec)
                    _record_table(state, record, spec)
                return running
            why = (
                f"to add table {spec.table!r}"
                if same_address
                else (f"to serve at {host} ({'TLS' if tls else 'plaintext'})")
            )
            _log.info("sqs-flight: restarting the managed server in %s %s", state, why)
            stop_found(state, found)
        elif found.pid:
            stop_found(state, found)
            _log.warning(
                "sqs-flight: the managed server in %s (pid %d) is not usable: %s; starting it again",
                state,
                found.pid,
                found.why,
            )
        record = _record_table(state, record, spec, write=False)
        record.update(advertise=host, tls=tls)
        if not same_address:
            record.pop("port", None)
        try:
            running = _running(state, start(spec.server_bin, state, record, _bind_host(host)))
        except SqsFlightError:
            if new_table:  # a table the server refused must not block every later start
                _forget_table(state, spec.table)
            raise
        if new_table:
            _probe_new_table(state, running, spec)
        return running


def _record_table(state: Path, record: Dict[str, Any], spec: ManagedServer, write: bool = True) -> Dict[str, Any]:
    tables = dict(record.get("tables") or {}, **{spec.table: spec.queue_url})
    regions = dict(record.get("regions") or {})
    if spec.region:
        regions[spec.table] = spec.region
    large = dict(record.get("large_payloads") or {})
    asked = {"read": spec.large_payloads, "bucket": spec.large_payload_bucket}
    mine = dict(large_payloads_of(record, spec.table), **{k: v for k, v in asked.items() if v is not None})
    if mine != {"read": False}:
        large[spec.table] = mine
    roles = dict(record.get("roles") or {})
    if spec.role() is not None:
        roles[spec.table] = spec.role()
    record = dict(
        record,
        tables=tables,
        regions=regions,
        large_payloads=large,
        roles=roles,
        sqs_endpoint=spec.sqs_endpoint,
        s3_endpoint=spec.s3_endpoint,
        state_url=spec.state_url,
        idle_exit=spec.idle_exit,
    )
    if write:
        _write_record(state, record)
    return record


def stop_server(state_dir: str) -> bool:
    """Stops the managed server of ``state_dir`` if one runs and is
    confirmed to be its own; returns whether one was stopped."""
    state = private_state_dir(state_dir)
    with _locked(state):
        record = _read_json(state / "managed.json")
        if not record.get("token"):
            return False
        found = find(state, record)
        if not is_recorded_process(state, found.pid, found.start):
            return False
        stop_found(state, found)
        return True


def drop_table(state_dir: str, table: str) -> Dict[str, str]:
    """Takes ``table`` out of the managed server of ``state_dir`` (a queue
    that was deleted or misspelled): it is forgotten in ``managed.json``, so
    that no later start serves it. A running server is left alone (stopping
    it would cut every query's streams): it keeps the table, harmlessly,
    until it next restarts or exits when idle. Returns the tables left."""
    state = private_state_dir(state_dir)
    with _locked(state):
        record = _read_json(state / "managed.json")
        if table not in (record.get("tables") or {}):
            known = ", ".join(sorted(record.get("tables") or {})) or "none"
            raise SqsFlightError("NOT_FOUND", f"the managed server in {state} has no table {table!r} (tables: {known})")
        return dict(_forget_table(state, table)["tables"])


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m sqs_flight.managed drop|stop|show --state-dir DIR``."""
    parser = argparse.ArgumentParser(prog="python -m sqs_flight.managed", description=main.__doc__)
    parser.add_argument("command", choices=("drop", "stop", "show"))
    parser.add_argument("table", nargs="?", help="drop: the table to take out")
    parser.add_argument("--state-dir", default=default_state_dir())
    args = parser.parse_intermixed_args(argv)
    try:
        if args.command == "drop":
            if not args.table:
                parser.error("drop needs the TABLE")
            left = drop_table(args.state_dir, args.table)
            print(f"dropped {args.table}; tables left: {', '.join(sorted(left)) or 'none'}")
        elif args.command == "stop":
            print("stopped" if stop_server(args.state_dir) else "no managed server runs there")
        else:
            record = _read_json(private_state_dir(args.state_dir) / "managed.json")
            record.pop("token", None)
            print(json.dumps(record, indent=2, sort_keys=True))
    except SqsFlightError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
