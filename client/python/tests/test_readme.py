"""The examples of README.md and client/python/README.md, run in the order
the docs give them, against one server started with no arguments.

The examples are read from the Markdown itself, so the docs and this test
cannot drift apart: every ``sh`` and ``python`` block runs, except one right
after a ``<!-- not run: REASON -->`` line, which says in the doc why (a real
queue, Databricks, the test suite itself). The ``sh`` blocks of a file run
as one ``bash -eo pipefail`` script with the binaries on the PATH; the
``python`` blocks of a file run one after another in one interpreter, like
cells of a notebook, so that a later block sees what an earlier one defined.
Two things are rewritten, and only these: the docs' server address
(``grpc://127.0.0.1:50051``, given to the CLI as ``SQSF_URL``) becomes the
test server's, and their scratch directory (``/tmp/sqs-flight-demo``) a
temporary one.

An example that leaves the table unusable for the next one (messages that
break a later query, a batch left in flight) fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List

import sqs_flight

from conftest import cli_bin

REPO = Path(__file__).resolve().parents[3]
DOCS = (REPO / "README.md", REPO / "client" / "python" / "README.md")
EXAMPLE = REPO / "client" / "python" / "examples" / "duckdb_polars.py"
DOC_URL = "grpc://127.0.0.1:50051"
DOC_DIR = "/tmp/sqs-flight-demo"
RUN = ("sh", "python")
NOT_RUN = "<!-- not run: "

# One exec'd block after another in one namespace; names the failing block.
RUNNER = r"""
import json, sys, traceback
namespace = {"__name__": "__main__"}
for where, code in json.load(open(sys.argv[1])):
    print(f"=== {where}", flush=True)
    try:
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"=== FAILED: {where}", flush=True)
        sys.exit(1)
"""


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, counted from 1
    lang: str
    code: str
    skip: str  # the doc's reason for not running it, or ""

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def blocks(doc: Path) -> List[Block]:
    """The fenced code blocks of ``doc``, in order."""
    out: List[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = lines.index("```", i + 1)
        before = lines[i - 1] if i > 0 else ""
        skip = before[len(NOT_RUN) :].rstrip(" ->") if before.startswith(NOT_RUN) else ""
        out.append(Block(doc, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", skip))
        i = end + 1
    return out


def runnable(doc: Path) -> List[Block]:
    return [b for b in blocks(doc) if b.lang in RUN and not b.skip]


def rewrite(code: str, url: str, scratch: Path) -> str:
    return code.replace(DOC_URL, url).replace(DOC_DIR, str(scratch))


def test_every_example_block_runs_or_says_why_not():
    for doc in DOCS:
        for b in blocks(doc):
            assert b.lang, f"{b.where}: a code block without a language"
            assert b.lang in RUN or b.lang in ("toml", "json"), f"{b.where}: unknown language {b.lang!r}"
            assert not b.skip.startswith("-->"), f"{b.where}: an empty reason"
    assert [b.lang for b in runnable(DOCS[0])] == ["sh"], "README.md: the CLI's first steps"
    assert len(runnable(DOCS[1])) >= 5, "client/python/README.md: Python, Writing, DuckDB, Spark"


def test_the_duckdb_block_is_the_example_file():
    block = next(b for b in runnable(DOCS[1]) if 'duckdb.sql("""' in b.code)
    example = [line.strip() for line in EXAMPLE.read_text().splitlines()]
    for line in block.code.splitlines():
        if line.strip() and not line.startswith(("import ", "URL, TABLE")):
            assert line.strip() in example, f"{block.where}: {line.strip()!r} is not in {EXAMPLE.name}"


def test_readme_examples_run_in_order_against_one_server(default_server, tmp_path):
    url = default_server.url
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cli = Path(cli_bin())
    env = {**os.environ, "SQSF_URL": url, "PATH": f"{cli.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SQSF_CONSUMER", None)

    # README.md: the CLI's first steps.
    (first_steps,) = runnable(DOCS[0])
    run = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", rewrite(first_steps.code, url, scratch)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, f"{first_steps.where}:\n{run.stdout}\n{run.stderr}"
    out = run.stdout.splitlines()
    assert out[0] == "demo", f"`sqs-flight tables` prints the demo table:\n{run.stdout}"
    assert "3 messages from table demo" in run.stderr, f"tail --limit 3:\n{run.stderr}"
    assert run.stderr.count("sent 1 message to demo") == 2, f"the two sends:\n{run.stderr}"
    _nothing_in_flight(url, first_steps.where)

    # client/python/README.md, block after block in one interpreter.
    cells = [(b.where, rewrite(b.code, url, scratch)) for b in runnable(DOCS[1])]
    script = tmp_path / "cells.json"
    script.write_text(json.dumps(cells))
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900
    )
    failed = re.search(r"=== FAILED: (\S+)", run.stdout)
    assert run.returncode == 0, (
        f"the example at {failed.group(1) if failed else '?'} failed:\n{run.stdout[-4000:]}\n{run.stderr[-6000:]}"
    )
    out = run.stdout
    # What the docs say these print.
    assert "{'committed_batch': 1, 'deleted': 22, 'expired': 0, 'rejected': 0}" in out, out
    (pandas_cell,) = [where for where, code in cells if "pd.DataFrame(" in code]
    assert cell_outputs(out)[pandas_cell] == "2", f"write() of the pandas frame returns 2:\n{out}"
    assert re.search(r"^duckdb: \[\('order_created', \d+, \d+\)", out, re.M), out
    assert re.search(r"^commit: \{'committed_batch': 1, 'deleted': \d+, 'expired': 0, 'rejected': 0\}", out, re.M), out
    assert "micro-batch 0: 400 messages" in out, out
    rows = int(re.search(r"^(\d+) rows in Parquet", out, re.M).group(1))
    assert rows >= 1000, out
    _nothing_in_flight(url, "client/python/README.md")


def cell_outputs(out: str) -> dict:
    """What each cell printed, by its ``where``, from the runner's
    ``=== where`` markers."""
    parts = re.split(r"^=== (\S+)\n", out, flags=re.M)
    return {where: text.strip() for where, text in zip(parts[1::2], parts[2::2])}


def _nothing_in_flight(url: str, after: str) -> None:
    """No consumer holds a message: the next example finds the table whole."""
    consumers = sqs_flight.status(url, "demo")["tables"]["demo"]["consumers"]
    holding = {name: c for name, c in consumers.items() if c["in_flight"] or c["open_batches"]}
    assert not holding, f"after {after}, consumers still hold messages: {holding}"
