#!/usr/bin/env bash
# The project's whole test command. Runnable on a fresh machine from any
# working directory:
#   - creates <repo>/.venv (python3 -m venv) and installs the SQS emulator
#     moto[server]==5.2.5 into it (skipped when already at that version);
#   - builds and runs every Rust test (debug) with a cargo target dir outside
#     the clone ($CARGO_TARGET_DIR, default ~/.cache/sqs-flight/target),
#     reused between runs;
#   - runs the Python client tests (python_tests; empty for now).
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
    step "cargo test --workspace --all-targets (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    cargo test --workspace --all-targets
    step_done "cargo test"
}

# Python/pytest suite of the client (client/python). Placeholder: the
# dependencies (pyspark, ...) get installed here once the suite exists.
python_tests() {
    step "Python tests"
    if [ -d client/python/tests ]; then
        local rc=0
        # TODO: install the client package and its test dependencies
        # (pyspark, ...) into $VENV here.
        "$VENV/bin/python" -m pytest client/python/tests || rc=$?
        if [ "$rc" -eq 5 ]; then
            echo "pytest collected no tests (exit 5): failing" >&2
            return 1
        elif [ "$rc" -ne 0 ]; then
            echo "pytest failed (exit $rc)" >&2
            return "$rc"
        fi
    else
        echo "no client/python/tests yet: nothing to run"
    fi
    step_done "Python tests"
}

python_env
rust_tests
python_tests
echo "==> all tests passed in $((SECONDS - SCRIPT_START)) s"
