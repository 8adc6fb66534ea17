#!/usr/bin/env python3
"""Packs an ``sqs-flight-server`` binary that cargo already built into a wheel
laid out as maturin lays out the release wheels (``server/pyproject.toml``):
the ``sqs_flight_server`` package, the binary and the ``sqs-flight`` script in
``<name>-<version>.data/scripts/``, and the metadata of ``[project]``.

The test command uses it for the debug wheel of its Python tests, so that the
server is compiled once, by ``cargo test``: maturin would compile the server
and its dependencies again with the server crate's own feature set (about
4.5 minutes on a cold two-core machine). The wheel is tagged
``linux_<arch>``: it is for this machine, not for publishing (release wheels
come from ``scripts/wheel.sh``).

    scripts/pack_server_wheel.py BINARY OUT_DIR
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import List, Tuple

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "server"


def _version() -> str:
    cargo = tomllib.loads((REPO / "Cargo.toml").read_text())
    return cargo["workspace"]["package"]["version"]


def _metadata(project: dict, version: str, readme: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project['description']}",
        f"License: {project['license']['text']}",
        f"Requires-Python: {project['requires-python']}",
        *(f"Classifier: {c}" for c in project.get("classifiers", [])),
        *(f"Project-URL: {k}, {v}" for k, v in project.get("urls", {}).items()),
        "Description-Content-Type: text/markdown; charset=UTF-8; variant=GFM",
    ]
    return "\n".join(lines) + "\n\n" + readme


def _binary_bytes(binary: Path, strip: bool) -> bytes:
    """The binary, stripped of its symbols as maturin's ``strip = true``
    does (when binutils' ``strip`` is there)."""
    tool = shutil.which("strip") if strip else None
    if tool is None:
        return binary.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / binary.name
        shutil.copyfile(binary, copy)
        subprocess.run([tool, str(copy)], check=True)
        return copy.read_bytes()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def pack(binary: Path, out: Path) -> Path:
    pyproject = tomllib.loads((SERVER / "pyproject.toml").read_text())
    project, maturin = pyproject["project"], pyproject["tool"]["maturin"]
    name = project["name"].replace("-", "_")
    version = _version()
    tag = f"py3-none-linux_{platform.machine()}"
    dist_info = f"{name}-{version}.dist-info"
    scripts = f"{name}-{version}.data/scripts"

    files: List[Tuple[str, bytes, int]] = []  # (name in the wheel, bytes, mode)
    module = SERVER / maturin["python-source"] / maturin["module-name"]
    for path in sorted(module.rglob("*.py")):
        files.append((f"{module.name}/{path.relative_to(module)}", path.read_bytes(), 0o644))
    files.append((f"{scripts}/{binary.name}", _binary_bytes(binary, maturin.get("strip", False)), 0o755))
    data = SERVER / maturin["data"] / "scripts"
    for path in sorted(data.iterdir()):
        files.append((f"{scripts}/{path.name}", path.read_bytes(), 0o755))
    readme = (SERVER / project["readme"]).read_text()
    files.append((f"{dist_info}/METADATA", _metadata(project, version, readme).encode(), 0o644))
    wheel = f"Wheel-Version: 1.0\nGenerator: sqs-flight pack_server_wheel\nRoot-Is-Purelib: false\nTag: {tag}\n"
    files.append((f"{dist_info}/WHEEL", wheel.encode(), 0o644))

    record = [_record_line(n, d) for n, d, _ in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))

    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name}-{version}-{tag}.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as whl:
        for n, d, mode in files:
            info = zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, d)
    target.write_bytes(buffer.getvalue())
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary", type=Path, help="the sqs-flight-server binary cargo built")
    parser.add_argument("out", type=Path, help="directory for the wheel")
    args = parser.parse_args()
    if not args.binary.is_file():
        print(f"error: {args.binary} is not a file: build it first (cargo build -p sqs-flight-server)", file=sys.stderr)
        return 2
    print(pack(args.binary, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
