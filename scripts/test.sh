#!/usr/bin/env bash
# The project's whole test command. Runnable on a fresh machine from any
# working directory:
#   - creates <repo>/.venv (python3 -m venv) and installs the SQS emulator
#     moto[server]==5.2.5 into it (skipped when already at that version);
#   - builds and runs every Rust test (debug) with a cargo target dir outside
#     the clone ($CARGO_TARGET_DIR, default ~/.cache/sqs-flight/target),
#     reused between runs;
#   - runs the Python client tests (python_tests): installs pinned pyspark
#     4.3.0 (with pipelines), pandas<3, pyarrow, duckdb, polars, pytest, the
#     ADBC Flight SQL driver, the SQS Extended Client library and
#     ./client/python into the same venv, installs the rustack SQS emulator
#     into ~/.cache/sqs-flight/rustack when missing (about 8 min cold),
#     packs the debug server binary cargo built into a wheel and installs it
#     into the venv, and runs pytest (two xdist workers) in client/python/tests against the
#     binary that wheel installed (real PySpark local mode, Java 17), a
#     pip-only venv among them; installs Debian's prometheus (apt-get) when
#     it is missing, for the Grafana dashboard's test;
#   - checks the release workflow with actionlint (scripts/lint_workflows.sh).
# Exits non-zero if any step fails.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

MOTO_VERSION="5.2.5"
VENV="$REPO/.venv"

SCRIPT_START=$SECONDS
step_start=$SECONDS
step() {
    step_start=$SECONDS
    echo "==> $*"
}
step_done() {
    echo "==> $1 done in $((SECONDS - step_start)) s (total $((SECONDS - SCRIPT_START)) s)"
}

python_env() {
    step "Python environment ($VENV)"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "creating $VENV"
        if ! python3 -m venv "$VENV"; then
            rm -rf "$VENV"
            echo "python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2
            return 1
        fi
    fi
    local have
    have="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null || true)"
    if [ "$have" = "$MOTO_VERSION" ] && [ -x "$VENV/bin/moto_server" ]; then
        echo "moto $have already installed"
    else
        echo "installing moto[server]==$MOTO_VERSION (found: ${have:-none})"
        "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet \
            "moto[server]==$MOTO_VERSION"
        "$VENV/bin/moto_server" --help >/dev/null
        echo "moto $MOTO_VERSION installed"
    fi
    export SQSF_MOTO_SERVER="$VENV/bin/moto_server"
    step_done "Python environment"
}

rust_tests() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sqs-flight/target}"
    mkdir -p "$CARGO_TARGET_DIR"
    # Four tests at a time on any machine (SQSF_TEST_THREADS=N for N): the
    # integration tests mostly wait on moto and the servers they start (the
    # `it` binary: 213 s at cargo's one per core, 112-121 s at 4 on two
    # cores). (RUST_TEST_THREADS, not --test-threads: the criterion
    # benches, run once each as tests, take no such flag.)
    step "cargo test --workspace --all-targets (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    export RUST_TEST_THREADS="${SQSF_TEST_THREADS:-4}"
    cargo test --workspace --all-targets
    step_done "cargo test"
}

# The SQS emulator of the Spark and volume tests (moto slows down with queue
# length). Installed once into $RUSTACK_ROOT and reused; its own cargo target
# dir keeps it out of the workspace's.
RUSTACK_VERSION="0.12.0"
RUSTACK_ROOT="$HOME/.cache/sqs-flight/rustack"
rustack_install() {
    step "rustack $RUSTACK_VERSION ($RUSTACK_ROOT)"
    if [ -x "$RUSTACK_ROOT/bin/rustack" ] &&
        grep -q "rustack-cli $RUSTACK_VERSION" "$RUSTACK_ROOT/.crates.toml" 2>/dev/null; then
        echo "rustack $RUSTACK_VERSION already installed"
    else
        CARGO_TARGET_DIR="$HOME/.cache/sqs-flight/rustack-build" \
            cargo install "rustack-cli@$RUSTACK_VERSION" --no-default-features --features sqs \
            --root "$RUSTACK_ROOT"
    fi
    export SQSF_RUSTACK="$RUSTACK_ROOT/bin/rustack"
    step_done "rustack"
}

# The client's Python dependencies, pinned. pyspark 4.3.0 is a 456 MB sdist
# (the Spark jars): the bulk of a cold install (about 3.5 min in all).
PYTHON_TEST_DEPS=(
    "pyspark[pipelines]==4.3.0"
    "pandas==2.3.3"
    "pyarrow==26.0.1"
    "duckdb==2.0.1"
    "polars==2.1.0"
    "pytest==9.2.0"
    # Two pytest workers, each running whole files (-n 2 --dist loadfile).
    "pytest-xdist==3.8.0"
    # Flight SQL from Python, Polars and DuckDB (tests/test_flight_sql.py).
    "adbc-driver-flightsql==1.13.0"
    "adbc-driver-manager==1.13.0"
    # The Python SQS Extended Client, the other end of large payloads
    # (tests/test_large_payloads.py); boto3 comes with moto.
    "amazon-sqs-extended-client==1.0.1"
)
python_deps() {
    step "Python client dependencies"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "${PYTHON_TEST_DEPS[@]}"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps \
        --force-reinstall ./client/python
    "$VENV/bin/python" -c 'import pyspark, sqs_flight; print("pyspark", pyspark.__version__, "sqs_flight", sqs_flight.__version__)'
    step_done "Python client dependencies"
}

# The server as a wheel, installed into the venv: the Python tests run the
# binary that wheel installed, so the packaging is tested too. The wheel
# packs the debug binary `cargo test` built (scripts/pack_server_wheel.py,
# maturin's layout): maturin would compile the server and its dependencies
# once more for the server crate's own feature set (4.5 min cold). The
# release wheels come from maturin (scripts/wheel.sh).
server_wheel() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sqs-flight/target}"
    step "server wheel (debug build of cargo test) into $VENV"
    local out="$CARGO_TARGET_DIR/wheels" bin="$CARGO_TARGET_DIR/debug/sqs-flight-server"
    rm -rf "$out"
    if [ ! -x "$bin" ]; then
        echo "no $bin: cargo test --workspace --all-targets builds it (rust_tests runs first)" >&2
        return 1
    fi
    local whl
    whl="$("$VENV/bin/python" scripts/pack_server_wheel.py "$bin" "$out")"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps --force-reinstall "$whl"
    export SQSF_SERVER_WHEEL="$whl"
    SQSF_SERVER_BIN="$("$VENV/bin/python" -c 'import sqs_flight_server as s; print(s.find_server_bin())')"
    export SQSF_SERVER_BIN
    "$SQSF_SERVER_BIN" --version
    "$VENV/bin/sqs-flight" --version
    step_done "server wheel"
}

# The Grafana dashboard's test (client/python/tests/test_dashboard.py) runs
# every panel's query through a real Prometheus: Debian's package, installed
# here when missing (as root, or through sudo).
prometheus_install() {
    step "prometheus"
    if command -v prometheus >/dev/null 2>&1; then
        prometheus --version 2>&1 | head -n 1
    else
        local sudo=()
        if [ "$(id -u)" -ne 0 ]; then
            if ! command -v sudo >/dev/null 2>&1; then
                echo "prometheus not found, and installing it needs root: apt-get install --no-install-recommends prometheus" >&2
                return 1
            fi
            sudo=(sudo)
        fi
        if ! command -v apt-get >/dev/null 2>&1; then
            echo "prometheus not found and no apt-get: install Prometheus 2.x so that \`prometheus\` is on PATH" >&2
            return 1
        fi
        echo "installing prometheus (apt-get install --no-install-recommends prometheus)"
        "${sudo[@]}" apt-get update -qq
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
        prometheus --version 2>&1 | head -n 1
    fi
    step_done "prometheus"
}

# Python/pytest suite of the client (client/python): PySpark in local mode
# against the real server binary, moto and rustack (the fixtures start them).
python_tests() {
    if ! command -v java >/dev/null 2>&1; then
        echo "java not found: the Spark tests need Java 17 (apt-get install openjdk-17-jre-headless)" >&2
        return 1
    fi
    rustack_install
    prometheus_install
    python_deps
    server_wheel
    # Figure 4's bench scripts run only under scripts/bench.sh: here they
    # must at least compile.
    "$VENV/bin/python" -m py_compile benches/*.py
    step "Python tests"
    local rc=0
    # Two workers, each taking whole files: the Spark tests wait on their
    # queries and servers as much as they compute (255 tests: 683 s in one
    # process, 453 s in two on two cores). Each worker starts its own moto,
    # rustack and Spark session. SQSF_PYTEST_WORKERS=0 runs them in one.
    local workers="${SQSF_PYTEST_WORKERS:-2}" parallel=()
    if [ "$workers" != "0" ]; then
        parallel=(-n "$workers" --dist loadfile)
    fi
    "$VENV/bin/python" -m pytest client/python/tests -p no:cacheprovider --durations=15 \
        "${parallel[@]}" || rc=$?
    if [ "$rc" -eq 5 ]; then
        echo "pytest collected no tests (exit 5): failing" >&2
        return 1
    elif [ "$rc" -ne 0 ]; then
        echo "pytest failed (exit $rc)" >&2
        return "$rc"
    fi
    step_done "Python tests"
}

workflow_lint() {
    step "actionlint on .github/workflows"
    scripts/lint_workflows.sh
    step_done "actionlint"
}

python_env
workflow_lint
rustack_install   # the Rust volume tests use it too
rust_tests
python_tests
echo "==> all tests passed in $((SECONDS - SCRIPT_START)) s"
