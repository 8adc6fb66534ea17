#!/usr/bin/env bash
# The project's formatting and lint checks, as CI runs them before the
# tests (.ci/run): `cargo fmt --check`, `cargo clippy --workspace
# --all-targets -- -D warnings` (in the same cargo target dir as
# scripts/test.sh: $CARGO_TARGET_DIR, default ~/.cache/sqs-flight/target),
# and ruff (pinned, installed into <repo>/.venv, created when missing):
# `ruff check` and `ruff format --check` on the Python package
# client/python. Exits non-zero at the first failure.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
RUFF_VERSION="0.17.6"
VENV="$REPO/.venv"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sqs-flight/target}"

start=$SECONDS
echo "==> cargo fmt --all --check"
cargo fmt --all --check
echo "==> cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "==> ruff $RUFF_VERSION on client/python"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || {
        rm -rf "$VENV"
        echo "python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2
        exit 1
    }
fi
if [ "$("$VENV/bin/ruff" --version 2>/dev/null)" != "ruff $RUFF_VERSION" ]; then
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "ruff==$RUFF_VERSION"
fi
"$VENV/bin/ruff" check client/python
"$VENV/bin/ruff" format --check client/python
echo "==> lint passed in $((SECONDS - start)) s"
