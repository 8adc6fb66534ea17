#!/usr/bin/env bash
# The benchmarks of issues 6 and 14, all of them, with one command:
#
#   scripts/bench.sh            # the full run (about 20-30 min after the build)
#   scripts/bench.sh --quick    # small counts: checks that every figure runs
#   scripts/bench.sh --publish  # then records the run in benches/ (below)
#
# It builds with the wheels' `dist` profile, so the figures are those of the
# code users install (niced, in its own target dir, default
# ~/.cache/sqs-flight/target-release; override with SQSF_BENCH_TARGET_DIR),
# installs rustack 0.12.0 into ~/.cache/sqs-flight/rustack when missing
# (as scripts/test.sh does), then runs:
#   1    criterion micro benchmarks (benches/benches/conversion.rs)
#   2-7  sqs-flight-bench e2e (benches/src) on rustack: figures 5 and 7 at
#        0 and 20 ms of added round trip, figure 3 also at 50 ms (0 ms:
#        loopback; above: both sides through the same latency proxy); 3m,
#        figure 3's latency hiding on the in-memory backend with a
#        simulated round trip (rtt_ms) at figure 3's RTTs
#   4    benches/spark_vs_boto3.py with the repo's .venv at 0, 20 and 50 ms
#        (skipped, with the reason, when the venv has no pyspark; boto3 is
#        installed when missing)
#   8    benches/spark_drains.py, the same way: the Spark source draining a
#        backlog with its defaults and with one big batch, against one big
#        batch on loopback, at 0, 20 and 50 ms
#   9    benches/state_url_drains.py, the same way: the defaults' drain with
#        --state-url on moto's S3 (at 0, 20 and 50 ms) against the same
#        drain without it, and the state log's S3 requests per 1,000 messages
# Each part writes its figures as JSON (bench-results/conversion.json,
# e2e.json, spark.json, drains.json, stateurl.json); `sqs-flight-bench collect` folds them into
# bench-results/results.json with the commit, date and machine, and renders
# bench-results/results.md from that JSON. Charts: bench-results/fig3.svg
# and fig4.svg (messages/s against the RTT). Two runs side by side:
#   sqs-flight-bench compare OLD/results.json bench-results/results.json
# Every figure shows ours beside a baseline measured in the same run, the
# ratio, and the issue's target; every row names its RTT. Extra arguments
# for the e2e binary can be passed in SQSF_BENCH_E2E_ARGS (e.g. "--figures
# 3,5 --reps 3"), the RTTs in SQSF_BENCH_RTT_MS, SQSF_BENCH_FIG3_RTT_MS and
# SQSF_BENCH_FIG4_RTT_MS; the parts to run in SQSF_BENCH_PARTS (default
# "criterion,e2e,spark,drains,stateurl"); a line about the run for its summary (e.g. what
# else the machine was doing) in SQSF_BENCH_NOTE. --publish then runs
# `sqs-flight-bench publish`: the JSON is copied to
# benches/results/DATE-COMMIT.json, the charts beside it, and
# benches/RESULTS.md is rendered from that copy (commit the three).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

QUICK=0
PUBLISH=0
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        --publish) PUBLISH=1 ;;
        -h | --help)
            sed -n '2,35p' "$0"
            exit 0
            ;;
        *)
            echo "unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

TARGET="${SQSF_BENCH_TARGET_DIR:-$HOME/.cache/sqs-flight/target-release}"
OUT="$REPO/bench-results"
RUSTACK_VERSION="0.12.0"
RUSTACK_ROOT="$HOME/.cache/sqs-flight/rustack"
VENV="$REPO/.venv"
START=$SECONDS
mkdir -p "$OUT"
RTT_MS="${SQSF_BENCH_RTT_MS:-0,20}"
FIG3_RTT_MS="${SQSF_BENCH_FIG3_RTT_MS:-0,20,50}"
# Figure 4's targets are set at 20 ms (>= 3x) and 50 ms (>= 5x).
FIG4_RTT_MS="${SQSF_BENCH_FIG4_RTT_MS:-0,20,50}"
PARTS=",${SQSF_BENCH_PARTS:-criterion,e2e,spark,drains,stateurl},"
NOTES=()
if [ -n "${SQSF_BENCH_NOTE:-}" ]; then NOTES+=("$SQSF_BENCH_NOTE"); fi
if [ -n "${SQSF_BENCH_E2E_ARGS:-}" ]; then
    NOTES+=("sqs-flight-bench e2e ran with the extra arguments \`$SQSF_BENCH_E2E_ARGS\`")
fi
# Whether the part named $1 is to run.
wanted() { case "$PARTS" in *",$1,"*) return 0 ;; *) return 1 ;; esac }
# The same, and a skipped part is noted in the run.
part() {
    wanted "$1" && return 0
    echo "$1 skipped (SQSF_BENCH_PARTS=${SQSF_BENCH_PARTS:-})"
    NOTES+=("$1 not run (SQSF_BENCH_PARTS=${SQSF_BENCH_PARTS:-})")
    return 1
}
rm -f "$OUT"/results.md "$OUT"/results.json "$OUT"/conversion.json "$OUT"/e2e.json \
    "$OUT"/spark.json "$OUT"/drains.json "$OUT"/stateurl.json "$OUT"/fig3.svg "$OUT"/fig4.svg

say() { echo "==> [$((SECONDS - START)) s] $*"; }
FAILED=()

say "rustack $RUSTACK_VERSION"
if [ -x "$RUSTACK_ROOT/bin/rustack" ] &&
    grep -q "rustack-cli $RUSTACK_VERSION" "$RUSTACK_ROOT/.crates.toml" 2>/dev/null; then
    echo "rustack $RUSTACK_VERSION already installed"
else
    CARGO_TARGET_DIR="$HOME/.cache/sqs-flight/rustack-build" nice -n 19 \
        cargo install "rustack-cli@$RUSTACK_VERSION" --no-default-features --features sqs \
        --root "$RUSTACK_ROOT"
fi
RUSTACK="$RUSTACK_ROOT/bin/rustack"

say "dist build, the wheels' profile (CARGO_TARGET_DIR=$TARGET, nice -n 19)"
export CARGO_TARGET_DIR="$TARGET"
nice -n 19 cargo build --profile dist -p sqs-flight-server -p sqs-flight-benches --bins
# criterion builds in the bench profile: a second build, only when it runs.
if wanted criterion; then
    nice -n 19 cargo bench -p sqs-flight-benches --bench conversion --no-run
fi
SERVER_BIN="$TARGET/dist/sqs-flight-server"
BENCH_BIN="$TARGET/dist/sqs-flight-bench"

say "figure 1: criterion (message -> Arrow conversion)"
if part criterion; then
    rm -rf "$TARGET/criterion"
    CRITERION_ARGS=()
    if [ "$QUICK" = 1 ]; then
        CRITERION_ARGS=(--warm-up-time 0.2 --measurement-time 0.5 --sample-size 10)
    fi
    if cargo bench -p sqs-flight-benches --bench conversion -- "${CRITERION_ARGS[@]}"; then
        "$BENCH_BIN" criterion-summary --dir "$TARGET/criterion" --out "$OUT/conversion.json" >/dev/null
    else
        FAILED+=("criterion")
    fi
fi

say "figures 2, 3, 3m, 5, 6, 7: sqs-flight-bench e2e (rustack $RUSTACK_VERSION; RTT $RTT_MS ms, figures 3 and 3m $FIG3_RTT_MS ms)"
E2E_ARGS=(--rtt-ms "$RTT_MS" --fig3-rtt-ms "$FIG3_RTT_MS")
if [ "$QUICK" = 1 ]; then
    E2E_ARGS+=(--messages 2000 --reps 1 --commit-messages 4000 --memory-counts 2000,4000
        --latency-messages 50)
fi
# shellcheck disable=SC2206 # word splitting of the extra arguments is wanted
E2E_ARGS+=(${SQSF_BENCH_E2E_ARGS:-})
if part e2e && ! "$BENCH_BIN" e2e --rustack "$RUSTACK" --server-bin "$SERVER_BIN" \
    --out "$OUT/e2e.json" "${E2E_ARGS[@]}"; then
    FAILED+=("e2e")
fi

# Runs the Spark figure $2 (part $1) with benches/$3, writing $OUT/$1.json;
# the remaining arguments are its --quick counts. Needs the venv's pyspark
# and pyarrow (boto3 is installed when missing); without them the figure is
# skipped and the run says so.
spark_figure() {
    local name="$1" figure="$2" script="$3"
    shift 3
    if ! part "$name"; then
        return
    fi
    if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import pyspark, pyarrow' 2>/dev/null; }; then
        local note="figure $figure skipped: $VENV has no pyspark/pyarrow (scripts/test.sh installs them)"
        echo "$note"
        NOTES+=("$note")
        return
    fi
    if ! "$VENV/bin/python" -c 'import boto3' 2>/dev/null; then
        "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet boto3
    fi
    local args=()
    if [ "$QUICK" = 1 ]; then
        args=("$@")
    fi
    if ! timeout 3600 "$VENV/bin/python" "benches/$script" --server-bin "$SERVER_BIN" \
        --bench-bin "$BENCH_BIN" --rustack "$RUSTACK" --rtt-ms "$FIG4_RTT_MS" \
        --out "$OUT/$name.json" "${args[@]}"; then
        FAILED+=("$name")
    fi
}

say "figure 4: Spark sqs-flight source vs boto3 reader (RTT $FIG4_RTT_MS ms)"
spark_figure spark 4 spark_vs_boto3.py --messages 2000 --per-partition 500
say "figure 8: Spark drains, defaults and one big batch against one big batch on loopback (RTT $FIG4_RTT_MS ms)"
spark_figure drains 8 spark_drains.py --messages 2000 --warm 200
say "figure 9: what --state-url costs a Spark drain (S3 RTT $FIG4_RTT_MS ms)"
spark_figure stateurl 9 state_url_drains.py --messages 2000

say "writing $OUT/results.json and results.md"
DIRTY="$(git diff --quiet HEAD -- server schemas benches 2>/dev/null || echo ' (with uncommitted changes)')"
COLLECT_ARGS=(--dir "$OUT" --commit "$(git rev-parse --short HEAD)$DIRTY"
    --date "$(date -u '+%Y-%m-%d %H:%M UTC')"
    --mode "$([ "$QUICK" = 1 ] && echo 'quick (small counts, not for the record)' || echo 'full')"
    --toolchain "$(rustc --version); dist profile (the wheels')"
    --sqs-server "rustack $RUSTACK_VERSION on 127.0.0.1 (figures 3-7); at an RTT above 0 ms every timed SQS call of both sides goes through sqs-flight-bench's latency proxy (figure 3: $FIG3_RTT_MS ms; figure 4: $FIG4_RTT_MS ms; figures 5, 7: $RTT_MS ms)")
for failed in "${FAILED[@]}"; do
    COLLECT_ARGS+=(--failed "$failed: see the output of scripts/bench.sh")
done
for note in "${NOTES[@]}"; do
    COLLECT_ARGS+=(--note "$note")
done
"$BENCH_BIN" collect "${COLLECT_ARGS[@]}" \
    "$OUT/conversion.json" "$OUT/e2e.json" "$OUT/spark.json" "$OUT/drains.json" \
    "$OUT/stateurl.json"

say "done in $((SECONDS - START)) s: $OUT/results.json and $OUT/results.md"
if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "failed parts: ${FAILED[*]}$([ "$PUBLISH" = 1 ] && echo " (so not published)")" >&2
    exit 1
fi
if [ "$PUBLISH" = 1 ]; then
    PUBLISH_ARGS=()
    if [ "$QUICK" = 1 ]; then PUBLISH_ARGS=(--allow-quick); fi
    "$BENCH_BIN" publish "$OUT/results.json" --benches "$REPO/benches" "${PUBLISH_ARGS[@]}"
fi
