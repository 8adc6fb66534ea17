"""The Grafana dashboard (deploy/grafana/sqs-flight.json) against a real
Prometheus: a server reads, commits, rejects, releases and loses a queue
under a held batch, Prometheus (Debian's ``prometheus`` package) scrapes it
every second, and every query of every panel, its variables filled in as
Grafana fills them, must return data through ``/api/v1/query``.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import sqs_flight

from conftest import Emulator, Proc, free_port, wait_until

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "sqs-flight.json"
# What Grafana puts for $__rate_interval: longer than the test, so that
# every sample the test made is in the window.
RATE_INTERVAL = "5m"
SCRAPE_TIMEOUT_S = 60.0


def prometheus_bin() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail(
            "prometheus not found on PATH: apt-get install --no-install-recommends prometheus "
            "(scripts/test.sh does this)",
            pytrace=False,
        )
    return exe


class Prometheus:
    """A Prometheus on a free loopback port, scraping one target every second."""

    def __init__(self, target: str, tmp: Path, logs: Path):
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: sqs-flight\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.url = f"http://127.0.0.1:{free_port()}"
        args = [
            prometheus_bin(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
        ]
        self.proc = Proc("prometheus", args, logs)

    def wait_ready(self) -> None:
        wait_until("prometheus", lambda: _get(f"{self.url}/-/ready")[0] == 200, self.proc)

    def api(self, path: str, **params: str) -> Any:
        status, body = _get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", f"{path} {params}: {body}"
        return answer["data"]

    def query(self, expr: str) -> List[Dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def last_scrape(self) -> float:
        """The time of the newest sample of the server's scrape (0 before one)."""
        got = self.query("timestamp(sqsf_registry_messages)")
        return float(got[0]["value"][1]) if got else 0.0

    def wait_scraped_after(self, since: float) -> float:
        """Waits for a scrape that started after ``since`` (epoch seconds)."""
        done: List[float] = []

        def scraped() -> bool:
            done[:] = [self.last_scrape()]
            return done[0] > since

        wait_until("a Prometheus scrape", scraped, self.proc, SCRAPE_TIMEOUT_S)
        return done[0]


def _get(url: str) -> Tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def prometheus(tmp_path: Path, logs: Path) -> Iterator[Callable[[str], Prometheus]]:
    started: List[Prometheus] = []

    def start(target: str) -> Prometheus:
        started.append(Prometheus(target, tmp_path, logs))
        started[-1].wait_ready()
        return started[-1]

    yield start
    for p in started:
        p.proc.stop()


def panel_queries(dashboard: Dict[str, Any]) -> Iterator[Tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel, rows included."""
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            yield panel["title"], target["refId"], target["expr"]


def fill(expr: str, tables: List[str]) -> str:
    """``expr`` with the dashboard's variables as Grafana fills them: a
    multi-value ``$table`` as a regex alternation, ``$__rate_interval``."""
    values = {
        "table": "(" + "|".join(sorted(tables)) + ")",
        "__rate_interval": RATE_INTERVAL,
        "__interval": "1s",
    }
    for name, value in values.items():
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in expr, f"a variable the test does not know: {expr}"
    return expr


def metric_value(metrics_url: str, series: str) -> float:
    _, text = _get(metrics_url)
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["table"]["definition"] == "label_values(sqsf_queue_depth, table)"
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]
    queries = list(panel_queries(dashboard))
    assert len(queries) >= 15, queries
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_panel_returns_data_from_a_real_prometheus(
    moto: Emulator, start_server: Callable[..., Any], prometheus: Callable[[str], Prometheus]
) -> None:
    orders = moto.new_queue("orders")
    # A short visibility timeout: the heartbeat extends the held batch
    # within a second or two, then fails once the queue is gone.
    doomed = moto.new_queue("doomed", visibility_timeout=4)
    metrics_at = f"127.0.0.1:{free_port()}"
    server = start_server(moto, {"orders": orders, "doomed": doomed}, "--metrics-listen", metrics_at)
    prom = prometheus(metrics_at)
    client = sqs_flight.Client(server.url, timeout=60)
    one = {"partitions": 1, "max_wait_ms": 500}

    # First activity: every series the panels rate exists before the second.
    moto.send(orders, [f"o{i}" for i in range(6)])
    moto.send(doomed, [f"d{i}" for i in range(6)])
    assert client.read_batch("orders", "app", **one).num_rows == 6
    assert client.commit("orders", "app", 1)["deleted"] == 6
    assert client.read_batch("doomed", "held", max_messages=3, **one).num_rows == 3
    assert client.read_batch("doomed", "let-go", **one).num_rows == 3
    prom.wait_scraped_after(time.time())

    # Second: more received, deleted, one rejected, a release, and a queue
    # deleted under a held batch (SQS errors, failed heartbeat rounds).
    moto.send(orders, [f"p{i}" for i in range(6)])
    second = client.read_batch("orders", "app", **one)
    assert second.num_rows == 6
    poison = second.column("message_id")[0].as_py()
    done = client.commit("orders", "app", 2, reject=[poison])
    assert done["deleted"] == 5, done
    assert client.release("doomed", "let-go")["released"] == 3
    moto.sqs.delete_queue(QueueUrl=doomed)
    failures = 'sqsf_heartbeat_failures_total{table="doomed"}'
    wait_until(
        "a failed heartbeat round on the deleted queue",
        lambda: metric_value(f"http://{metrics_at}/metrics", failures) >= 1,
        server.proc,
    )
    # Two scrapes after it all, so that every new series has two samples.
    prom.wait_scraped_after(prom.wait_scraped_after(time.time()))

    tables = prom.api("label/table/values", **{"match[]": "sqsf_queue_depth"})
    assert sorted(tables) == ["doomed", "orders"], tables
    dashboard = json.loads(DASHBOARD.read_text())
    empty = []
    for title, ref, expr in panel_queries(dashboard):
        result = prom.query(fill(expr, tables))
        values = [float(r["value"][1]) for r in result]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{title} ({ref}): {fill(expr, tables)} -> {result}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
