#!/usr/bin/env bash
# The main job, on a fresh machine: build the server and the CLI, start the
# server on its embedded demo table (20 sample order events, no AWS needed),
# read a batch through Arrow Flight with the CLI, print it, commit it, and
# show the table's status afterwards.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sqs-flight/target}"
mkdir -p "$CARGO_TARGET_DIR"

echo "==> building sqs-flight-server and sqs-flight (debug; the first build takes a while)"
cargo build -p sqs-flight-server -p sqs-flight-client --bins
BIN="$CARGO_TARGET_DIR/debug"

OUT="$(mktemp -d)"
cleanup() {
    [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$OUT"
}
trap cleanup EXIT

echo "==> starting sqs-flight-server on the embedded demo table"
"$BIN/sqs-flight-server" --listen 127.0.0.1:0 >"$OUT/stdout" 2>"$OUT/stderr" &
SERVER_PID=$!
URL=""
for _ in $(seq 1 300); do
    URL="$(sed -n 's/^sqs-flight-server listening on //p' "$OUT/stdout")"
    [ -n "$URL" ] && break
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "the server exited:" >&2
        cat "$OUT/stderr" >&2
        exit 1
    fi
    sleep 0.1
done
[ -n "$URL" ] || { echo "the server did not start within 30 s" >&2; cat "$OUT/stderr" >&2; exit 1; }
echo "    listening on $URL"

echo "==> sqs-flight --url $URL tail demo --commit"
"$BIN/sqs-flight" --url "$URL" tail demo --commit

echo "==> sqs-flight --url $URL status demo"
"$BIN/sqs-flight" --url "$URL" status demo

echo "==> next: README.md's \"First steps\" runs the server and the CLI by hand (export PATH=\"$BIN:\$PATH\"; sqs-flight-server), then client/python/README.md goes on with Python, DuckDB, Polars and Spark"
