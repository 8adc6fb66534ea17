"""The pip-only path: a fresh venv holding only the two wheels (and pyarrow,
the client's one dependency), no cargo target dir and no Rust toolchain on
PATH, starts ``serve()``, reads and commits a batch, and runs the CLI that
the server wheel installs.

The server wheel is the one the test command packed from its debug build
(``$SQSF_SERVER_WHEEL``); the client wheel is built here from
``client/python``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pyarrow
import pytest

from conftest import bodies

REPO = Path(__file__).resolve().parents[3]

# Runs inside the fresh venv: the server found by sqs_flight_server alone.
SCRIPT = r"""
import json, os, subprocess, sys
import sqs_flight, sqs_flight_server

queue, endpoint = sys.argv[1], sys.argv[2]
found = sqs_flight_server.find_server_bin()
with sqs_flight.serve({"orders": queue}, sqs_endpoint=endpoint, region="us-east-1") as server:
    t = sqs_flight.read_batch(server.url, "orders", consumer="pip")
    done = sqs_flight.commit(server.url, "orders", "pip", sqs_flight.batch_of(t))
    tables = subprocess.run(["sqs-flight", "--url", server.url, "tables"],
                            capture_output=True, text=True, timeout=60)
version = subprocess.run(["sqs-flight", "--version"], capture_output=True, text=True, timeout=60)
print(json.dumps({
    "server_bin": found,
    "bodies": sorted(t.column("body").to_pylist()),
    "deleted": done["deleted"],
    "tables": [tables.returncode, tables.stdout, tables.stderr],
    "version": [version.returncode, version.stdout, version.stderr],
}))
"""


def _server_wheel() -> Path:
    wheel = os.environ.get("SQSF_SERVER_WHEEL")
    if not wheel or not Path(wheel).is_file():
        pytest.fail(
            "SQSF_SERVER_WHEEL must name the server wheel (scripts/test.sh packs it: "
            "scripts/pack_server_wheel.py $CARGO_TARGET_DIR/debug/sqs-flight-server OUT)"
        )
    return Path(wheel)


def _run(args, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def pip_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pip-only")
    wheels = root / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--disable-pip-version-check",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(wheels),
            str(REPO / "client" / "python"),
        ]
    )
    (client_wheel,) = wheels.glob("sqs_flight-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    # pyarrow pinned to this environment's, which pip has in its cache.
    _run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            str(client_wheel),
            str(_server_wheel()),
            f"pyarrow=={pyarrow.__version__}",
        ]
    )
    return venv


def _bare_env(venv: Path, home: Path) -> Dict[str, str]:
    """Only the venv on PATH, no SQSF_* variable, no cargo."""
    env = {
        "PATH": str(venv / "bin"),
        "HOME": str(home),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    assert shutil.which("cargo", path=env["PATH"]) is None
    return env


def test_pip_only_venv_serves_reads_commits_and_has_the_cli(pip_venv, moto, tmp_path):
    queue = moto.new_queue("pip")
    sent = bodies(5, "pip")
    moto.send(queue, sent)
    out = _run(
        [str(pip_venv / "bin" / "python"), "-c", SCRIPT, queue, moto.endpoint],
        env=_bare_env(pip_venv, tmp_path),
        cwd=tmp_path,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])

    assert Path(result["server_bin"]).parent == pip_venv / "bin"
    assert result["bodies"] == sorted(sent)
    assert result["deleted"] == 5
    assert moto.counts(queue) == {"visible": 0, "in_flight": 0}
    code, stdout, stderr = result["tables"]
    assert code == 0, stderr
    assert stdout.split() == ["orders"]
    code, stdout, stderr = result["version"]
    assert code == 0, stderr
    assert stdout.strip() == f"sqs-flight {_version()}"


def _version() -> str:
    import tomllib

    return tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]


# Runs inside the fresh venv, which has no pyspark: what Spark 4's lookup
# (pyspark's sql/worker/lookup_data_sources.py) sees of the wheel.
LOOKUP = r"""
import json, pkgutil
found = sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_"))
import pyspark_sqs_flight
print(json.dumps({"found": found, "default": hasattr(pyspark_sqs_flight, "DefaultSource"),
                  "error": str(pyspark_sqs_flight.IMPORT_ERROR)}))
"""


def test_the_client_wheel_ships_pyspark_sqs_flight_at_the_top_level(pip_venv, tmp_path):
    out = _run([str(pip_venv / "bin" / "python"), "-c", LOOKUP], env=_bare_env(pip_venv, tmp_path), cwd=tmp_path)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["found"] == ["pyspark_sqs_flight"], "a top-level module, as Spark's lookup finds them"
    # Without pyspark it imports, with no DefaultSource: Spark's lookup
    # imports every pyspark_* module in one loop, and must not fail on it.
    assert result["default"] is False and "pyspark" in result["error"], result
