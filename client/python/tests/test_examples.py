"""The README's DuckDB / Polars example script, run as written against a
server serving its in-memory demo table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "duckdb_polars.py"


def test_duckdb_polars_example_runs_and_commits(start_server):
    server = start_server(None, {}, "--demo-messages", "30")
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), server.url, "demo"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "batch 1: 30 messages"
    # The demo's events cycle created / paid / shipped: 10 of each in 30.
    assert lines[1].startswith("duckdb: [('order_created', 10, ") and "('order_paid', 10, " in lines[1]
    assert lines[2] == "polars: order_paid events: 10"
    assert lines[3] == "commit: {'committed_batch': 1, 'deleted': 30, 'expired': 0, 'rejected': 0}"
