"""Spark's master, as the driver side of the source sees it: whether Spark
runs in local mode, where a managed server stays on loopback.

The source's driver side runs in Spark's Python worker processes, not in the
process that built the SparkSession, so there is usually no active
SparkContext to ask. Those workers are children of the driver's JVM (classic
Spark, and the Spark Connect server, pipelines included), started by
``spark-submit`` with the session's configuration on its command line. So
the master is, in order:

1. the active SparkContext's ``master``, where there is one;
2. the driver JVM's ``spark-submit`` arguments, read from ``/proc`` (the
   nearest ancestor process running ``org.apache.spark.deploy.SparkSubmit``):
   ``--master``, else ``--conf spark.master=``, else ``spark.master`` of its
   properties file (``--properties-file``, else ``spark-defaults.conf`` of
   its ``SPARK_CONF_DIR`` or ``SPARK_HOME/conf``), else its ``MASTER``
   variable, else ``local[*]`` (spark-submit's own default);
3. unknown (None): a driver not started by spark-submit (Databricks), or no
   ``/proc``.

A JVM keeps the master it was started with: a second SparkContext with
another master in the same Python process (and JVM) is not seen.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional

SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"
#: Ancestors looked at: a worker forked by pyspark's daemon is two below the JVM.
_MAX_DEPTH = 8
_LOCAL = re.compile(r"local(\[[^\]]*\])?")


def is_local(master: Optional[str]) -> bool:
    """``local`` or ``local[...]``: Spark's executors run in the driver's JVM."""
    return master is not None and _LOCAL.fullmatch(master.strip()) is not None


def spark_master() -> Optional[str]:
    """Spark's master as seen from this process; None when unknown."""
    try:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
    except ImportError:  # pragma: no cover - the source needs pyspark
        sc = None
    if sc is not None:
        return sc.master
    pid = _spark_submit_ancestor(os.getpid())
    return None if pid is None else _submit_master(_cmdline(pid), _environ(pid))


def _spark_submit_ancestor(pid: int) -> Optional[int]:
    for _ in range(_MAX_DEPTH):
        pid = _parent(pid)
        if pid is None or pid <= 1:
            return None
        if SPARK_SUBMIT in _cmdline(pid):
            return pid
    return None


def _parent(pid: int) -> Optional[int]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> List[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(v.split("=", 1) for v in raw.split("\0") if "=" in v)


def _submit_master(args: List[str], env: Dict[str, str]) -> str:
    """The master spark-submit resolves from its arguments, its properties
    file and its environment."""
    args = args[args.index(SPARK_SUBMIT) + 1 :]
    options: Dict[str, str] = {}
    confs: Dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            i += 1
        elif arg in ("--master", "--conf", "-c", "--properties-file") and i + 1 < len(args):
            name, value = arg, args[i + 1]
            i += 2
        else:
            i += 1
            continue
        if name in ("--conf", "-c") and "=" in value:
            key, conf = value.split("=", 1)
            confs[key.strip()] = conf
        else:
            options[name] = value
    if "--master" in options:
        return options["--master"]
    if "spark.master" in confs:
        return confs["spark.master"]
    from_file = _properties(options.get("--properties-file"), env).get("spark.master")
    return from_file or env.get("MASTER") or "local[*]"


def _properties(path: Optional[str], env: Dict[str, str]) -> Dict[str, str]:
    if path is None:
        home = env.get("SPARK_HOME")
        conf_dir = env.get("SPARK_CONF_DIR") or (str(Path(home) / "conf") if home else None)
        if conf_dir is None:
            return {}
        path = str(Path(conf_dir) / "spark-defaults.conf")
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return {}
    found: Dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = re.split(r"\s*=\s*|\s+", line, maxsplit=1)
        if len(parts) == 2:
            found[parts[0]] = parts[1].strip()
    return found
