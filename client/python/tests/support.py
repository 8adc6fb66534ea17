"""Helpers shared by several test files: plain functions and constants,
imported by name (``from support import ...``). Shared fixtures are in
conftest.py, which pytest loads by itself; this module may import from
conftest, conftest never imports it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, Optional

import pytest

from sqs_flight import managed
from sqs_flight.client import Client
from sqs_flight.managed import ManagedServer

from conftest import poll, server_bin

# -- Structured Streaming queries (test_spark_*.py) ---------------------------

QUERY_TIMEOUT_S = 600


def wait_for(what: str, check: Callable[[], bool], timeout: float = 120, query=None) -> None:
    """Polls ``check`` until it holds; fails on timeout or when ``query`` dies."""

    def died() -> Optional[str]:
        failed = query.exception() if query is not None else None
        return None if failed is None else f"query failed ({failed})"

    poll(what, check, timeout, died=died, pause=0.25, max_pause=0.25)


def source(spark, url: str, table: str, fmt: str = "sqs-flight", **options: str):
    reader = spark.readStream.format(fmt).option("url", url).option("table", table)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def run_available_now(query_builder, checkpoint: Path):
    query = query_builder.trigger(availableNow=True).option("checkpointLocation", str(checkpoint)).start()
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        pytest.fail(f"an AvailableNow query did not stop within {QUERY_TIMEOUT_S} s")
    return query


def _load_error(spark, stream: bool, options: dict) -> str:
    reader = spark.readStream if stream else spark.read
    reader = reader.format("sqs-flight")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as err:
        df = reader.load()
        if not stream:
            df.collect()
    return str(err.value)


# -- Processes ----------------------------------------------------------------

BOUND_S = 30


def gone(pid: int, within: float = BOUND_S) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within the bound."""

    def ended() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        return state == "Z"

    return poll(f"process {pid} to exit", ended, within, pause=0.05, max_pause=0.05, fail=False)


# -- Read limits and payloads (test_stream_limits.py, test_spark_*.py) --------


def message_bytes(row: Dict) -> int:
    """A message's size as the server counts it against ``max_bytes``
    (schemas/src/message.rs ``size``): ids, body, digest, attributes."""
    text = [
        "message_id",
        "body",
        "md5_of_body",
        "sender_id",
        "message_group_id",
        "message_deduplication_id",
        "sequence_number",
    ]
    size = sum(len((row[c] or "").encode()) for c in text)
    return size + sum(len(k.encode()) + len((v or "").encode()) for k, v in row["message_attributes"] or [])


PAYLOAD_TOML = """
[tables.events]
queue_url = "{queue_url}"
receivers = 1  # moto: see conftest.start_server
[tables.events.payload]
fields = [{{ name = "n", type = "int64" }}]
"""


# -- Managed servers (test_managed*.py, test_spark_managed.py, test_spark_discovery.py)


def spec(moto, state: Path, queue: str, **kw) -> ManagedServer:
    kw.setdefault("advertise_host", "127.0.0.1")
    return ManagedServer(
        state_dir=str(state),
        queue_url=queue,
        table=managed.table_name_for(queue),
        sqs_endpoint=moto.endpoint,
        server_bin=server_bin(),
        **kw,
    )


def record(state: Path) -> dict:
    return json.loads((state / "managed.json").read_text())


def info(running) -> dict:
    with Client(running.url, token=running.token, tls_root_certs=running.tls_root_certs) as c:
        return c._action("server_info", {})
