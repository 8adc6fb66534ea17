#!/usr/bin/env bash
# Builds the two Python wheels users install into dist/:
#   - sqs_flight_server-<v>-py3-none-manylinux_*_<arch>.whl: the server binary
#     (server/pyproject.toml; maturin, bindings "bin"; release, stripped);
#   - sqs_flight-<v>-py3-none-any.whl: the pure-Python client and Spark source.
# `pip install dist/*.whl` then gives `sqs-flight-server`, `sqs_flight.serve`
# and the Spark source's managed mode.
#
#   scripts/wheel.sh                      # this machine's architecture
#   scripts/wheel.sh --target aarch64-unknown-linux-gnu --zig
#                                         # Graviton (Databricks arm nodes): see
#                                         # docs/installation.md for what it needs
#
# Extra arguments go to `maturin build`. The release build uses its own
# cargo target dir ($SQSF_WHEEL_TARGET_DIR, default
# ~/.cache/sqs-flight/target-release) and maturin from the repo's .venv
# (installed when missing). A cold release build takes 10-20 minutes on two
# cores.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
MATURIN_VERSION="1.16.0"
VENV="$REPO/.venv"
OUT="$REPO/dist"
export CARGO_TARGET_DIR="${SQSF_WHEEL_TARGET_DIR:-$HOME/.cache/sqs-flight/target-release}"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
have="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("maturin"))' 2>/dev/null || true)"
if [ "$have" != "$MATURIN_VERSION" ]; then
    echo "==> installing maturin==$MATURIN_VERSION into $VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "maturin==$MATURIN_VERSION"
fi
mkdir -p "$OUT"
rm -f "$OUT"/sqs_flight_server-*.whl "$OUT"/sqs_flight-*.whl

echo "==> server wheel (release, CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
"$VENV/bin/maturin" build --release --manifest-path server/Cargo.toml --out "$OUT" "$@"

echo "==> client wheel"
"$VENV/bin/python" -m pip wheel --disable-pip-version-check --quiet --no-deps \
    --wheel-dir "$OUT" ./client/python

echo "==> built:"
ls -l "$OUT"/*.whl
