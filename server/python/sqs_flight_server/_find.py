"""Finds the ``sqs-flight-server`` binary this package was installed with."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional

BIN_NAME = "sqs-flight-server" + (sysconfig.get_config_var("EXE") or "")


class ServerBinaryNotFound(FileNotFoundError):
    """The wheel's binary is in none of the places pip puts scripts."""


def _user_scripts() -> Optional[str]:
    try:
        scheme = sysconfig.get_preferred_scheme("user")
    except (AttributeError, KeyError):  # Python < 3.10
        scheme = "nt_user" if os.name == "nt" else "posix_user"
    try:
        return sysconfig.get_path("scripts", scheme=scheme)
    except KeyError:
        return None


def _install_root(package: Path) -> List[Path]:
    """Scripts directories implied by where the package itself lies:
    ``<prefix>/lib/pythonX.Y/site-packages/sqs_flight_server`` (``pip install
    --prefix``) gives ``<prefix>/bin``, and ``<target>/sqs_flight_server``
    (``pip install --target``) gives ``<target>/bin``."""
    found = []
    site = package.parent
    if (
        site.name == "site-packages"
        and site.parent.name.lower().startswith("python")
        and site.parent.parent.name in ("lib", "lib64")
    ):
        found.append(site.parent.parent.parent / "bin")
    found.append(site / "bin")
    return found


def candidates() -> List[Path]:
    """Every directory searched, in order, without duplicates."""
    dirs: List[Optional[str | Path]] = [
        sysconfig.get_path("scripts"),
        sysconfig.get_path("scripts", vars={"base": sys.base_prefix}),
        _user_scripts(),
        *_install_root(Path(__file__).resolve().parent),
    ]
    seen: List[Path] = []
    for d in dirs:
        if d and Path(d) not in seen:
            seen.append(Path(d))
    return seen


def find_server_bin() -> str:
    """The path of the installed ``sqs-flight-server`` binary.

    Raises :class:`ServerBinaryNotFound`, naming every place it looked, when
    the wheel's binary is missing (a broken or partial install)."""
    dirs = candidates()
    for d in dirs:
        path = d / BIN_NAME
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    looked = "\n".join(f"  - {d}" for d in dirs)
    raise ServerBinaryNotFound(
        f"the {BIN_NAME} binary of the sqs-flight-server package is not installed "
        f"in any of:\n{looked}\nreinstall it: pip install --force-reinstall sqs-flight-server"
    )
