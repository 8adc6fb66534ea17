"""The Spark Declarative Pipelines example (examples/pipeline) run with the
real ``spark-pipelines run`` CLI against rustack through the server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import bodies

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pipeline"
RUN_TIMEOUT_S = 600

# pyspark 4.3.0's CLI: the pipeline run completes, then the Spark Connect
# client chokes on the Python accumulator metrics the data source's tasks
# report and exits 1. Spark's bug, not the pipeline's; see the README.
KNOWN_CLI_FAILURE = "[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__"


def test_pipeline_example_fills_its_streaming_table(rustack, start_server, tmp_path):
    cli = Path(sys.executable).parent / "spark-pipelines"
    if not cli.exists():
        pytest.fail(f"{cli} is missing: pip install 'pyspark[pipelines]==4.3.0'", pytrace=False)
    qurl = rustack.new_queue("pipeline")
    sent = bodies(700, "pipeline")
    assert rustack.send(qurl, sent) == 700
    server = start_server(rustack, {"orders": qurl})

    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project)
    spec = project / "spark-pipeline.yml"
    text = spec.read_text().replace("grpc://127.0.0.1:50051", server.url)
    spec.write_text(text.replace("storage: pipeline-storage", f"storage: file://{project}/pipeline-storage"))

    run = subprocess.run(
        [str(cli), "run", "--spec", str(spec)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    output = run.stdout + run.stderr
    (tmp_path / "spark-pipelines.log").write_text(output)
    assert "Run is COMPLETED" in output, output[-4000:]
    if run.returncode != 0:
        assert KNOWN_CLI_FAILURE in output, output[-4000:]
        warnings.warn(
            f"spark-pipelines exited {run.returncode} after a completed run: {KNOWN_CLI_FAILURE}", stacklevel=1
        )

    table = pq.read_table(project / "spark-warehouse" / "orders_raw")
    assert table.num_rows == 700
    assert len(set(table.column("message_id").to_pylist())) == 700
    assert sorted(table.column("body").to_pylist()) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}
