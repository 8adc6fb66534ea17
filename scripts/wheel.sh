#!/usr/bin/env bash
# Builds the wheels users install into dist/ and smoke-tests each:
#   - sqs_flight-<v>-py3-none-any.whl: the pure-Python client and Spark source;
#   - sqs_flight_server-<v>-py3-none-manylinux2014_<arch>...whl for x86_64 and
#     aarch64 (Graviton): the server binary, which is also the `sqs-flight`
#     CLI, built with maturin's zig linker against glibc 2.17, so that pip
#     takes it on Amazon Linux 2 and 2023, EMR, Databricks and Ubuntu 18.04+.
#
#   scripts/wheel.sh                     # every wheel (two cold release builds)
#   scripts/wheel.sh --arch x86_64       # one architecture (also: aarch64)
#   scripts/wheel.sh --arch native       # this machine's libc, no zig: quickest
#   scripts/wheel.sh --arch none --sdist # the client wheel and both sdists only
#   --no-client                          # no client wheel
#
# Needs the Rust targets (`rustup target add aarch64-unknown-linux-gnu`);
# installs maturin, ziglang and auditwheel into the repo's .venv when
# missing. The smoke test of an aarch64 wheel runs its binary under
# qemu-aarch64-static (Debian: qemu-user-static libc6-arm64-cross
# libgcc-s1-arm64-cross) and fails, saying so, when that is missing.
# Builds use the `dist` profile (Cargo.toml) in their own cargo target dir,
# $SQSF_WHEEL_TARGET_DIR (default ~/.cache/sqs-flight/target-release).
# The release workflow (.github/workflows/release.yml) runs this script.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
MATURIN_VERSION="1.16.0"
ZIG_VERSION="0.17.1"
AUDITWHEEL_VERSION="6.8.2"
BUILD_VERSION="1.6.1"
MANYLINUX="manylinux2014"
VENV="$REPO/.venv"
OUT="$REPO/dist"
export CARGO_TARGET_DIR="${SQSF_WHEEL_TARGET_DIR:-$HOME/.cache/sqs-flight/target-release}"

usage() {
    sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

archs=(x86_64 aarch64)
client=1
sdist=0
while [ $# -gt 0 ]; do
    case "$1" in
        --arch)
            [ $# -ge 2 ] || { usage >&2; exit 2; }
            case "$2" in
                x86_64 | aarch64 | native) archs=("$2") ;;
                none) archs=() ;;
                *) echo "unknown --arch '$2' (x86_64, aarch64, native or none)" >&2; exit 2 ;;
            esac
            shift 2
            ;;
        --no-client) client=0; shift ;;
        --sdist) sdist=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

SECONDS=0
say() { echo "==> [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }

pip_tool() { # pip_tool PACKAGE VERSION
    local have
    have="$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true)"
    if [ "$have" != "$2" ]; then
        say "installing $1==$2 into $VENV"
        "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "$1==$2"
    fi
}

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
pip_tool maturin "$MATURIN_VERSION"
pip_tool auditwheel "$AUDITWHEEL_VERSION"
for arch in "${archs[@]}"; do
    [ "$arch" = native ] || pip_tool ziglang "$ZIG_VERSION"
done
[ "$sdist" = 0 ] || pip_tool build "$BUILD_VERSION"
mkdir -p "$OUT"

# The smoke test: the wheel installs into a fresh venv, and both of its
# programs answer --version with nothing but that venv on PATH.
smoke_native() { # smoke_native WHEEL
    local venv
    venv="$(mktemp -d)"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps "$1"
    env -i HOME="$HOME" PATH="$venv/bin" "$venv/bin/sqs-flight-server" --version
    env -i HOME="$HOME" PATH="$venv/bin" "$venv/bin/sqs-flight" --version
    rm -rf "$venv"
}

smoke_aarch64() { # smoke_aarch64 WHEEL: the binary under QEMU, with the arm64 glibc
    local qemu sysroot=/usr/aarch64-linux-gnu dir
    qemu="$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)"
    if [ -z "$qemu" ] || [ ! -e "$sysroot/lib/ld-linux-aarch64.so.1" ]; then
        echo "cannot run the aarch64 binary: install qemu-user-static, libc6-arm64-cross and libgcc-s1-arm64-cross" >&2
        return 1
    fi
    dir="$(mktemp -d)"
    "$VENV/bin/python" -m zipfile -e "$1" "$dir"
    local bin
    bin="$(ls "$dir"/*.data/scripts/sqs-flight-server)"
    chmod +x "$bin" # zipfile -e drops the mode bits pip would set
    "$qemu" -L "$sysroot" "$bin" --version
    "$qemu" -L "$sysroot" -0 sqs-flight "$bin" --version
    rm -rf "$dir"
}

build_server() { # build_server ARCH
    local arch="$1" args=(--profile dist --manifest-path server/Cargo.toml --out "$OUT")
    if [ "$arch" != native ]; then
        args+=(--target "$arch-unknown-linux-gnu" --zig --compatibility "$MANYLINUX")
        # maturin's zig needs `python -m ziglang` of the venv.
        export PATH="$VENV/bin:$PATH"
    fi
    say "server wheel for $arch (cargo target dir $CARGO_TARGET_DIR; a cold build takes 45 minutes or more on two cores)"
    local machine="$arch"
    [ "$arch" != native ] || machine="$(uname -m)"
    rm -f "$OUT"/sqs_flight_server-*"$machine".whl
    "$VENV/bin/maturin" build "${args[@]}"
    local wheel
    wheel="$(ls -t "$OUT"/sqs_flight_server-*"$machine".whl | head -n 1)"
    say "auditwheel show $(basename "$wheel")"
    "$VENV/bin/auditwheel" show "$wheel"
    say "smoke test of $(basename "$wheel")"
    local smoke=smoke_native
    if [ "$arch" = aarch64 ] && [ "$(uname -m)" != aarch64 ]; then
        smoke=smoke_aarch64
    fi
    if ! "$smoke" "$wheel"; then
        echo "the smoke test of $(basename "$wheel") failed (above)" >&2
        return 1
    fi
}

for arch in "${archs[@]}"; do
    build_server "$arch"
done

if [ "$client" = 1 ]; then
    say "client wheel"
    rm -f "$OUT"/sqs_flight-*.whl
    "$VENV/bin/python" -m pip wheel --disable-pip-version-check --quiet --no-deps \
        --wheel-dir "$OUT" ./client/python
fi
if [ "$sdist" = 1 ]; then
    say "sdists"
    rm -f "$OUT"/*.tar.gz
    "$VENV/bin/maturin" sdist --manifest-path server/Cargo.toml --out "$OUT"
    "$VENV/bin/python" -m build --sdist --outdir "$OUT" client/python
fi

say "built:"
ls -l "$OUT"
