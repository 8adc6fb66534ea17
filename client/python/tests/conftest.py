"""Fixtures: every process the tests need, started here on free loopback
ports, waited for with bounded timeouts, and stopped at the end.

Paths come from the environment that scripts/test.sh sets, with the same
defaults it uses:

* ``SQSF_SERVER_BIN``  the sqs-flight-server binary (cargo build -p sqs-flight-server)
* ``SQSF_MOTO_SERVER`` moto_server (pip install 'moto[server]==5.2.5')
* ``SQSF_RUSTACK``     rustack (cargo install rustack-cli@0.12.0 --no-default-features --features sqs)
* ``SQSF_FAULT_PROXY`` the Rust harness's fault proxy, ``sqsf-fault-proxy``
  (``cargo test --workspace`` builds it into ``$CARGO_TARGET_DIR/debug``)

A missing one fails the tests that need it with the command that installs it.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

import pytest

from sqs_flight import managed
from sqs_flight.launch import Launch, ServerError, command

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# The tests talk to emulators only: never let a real credential through.
os.environ.update(AWS_ENV)
os.environ.pop("AWS_SESSION_TOKEN", None)
os.environ.pop("AWS_PROFILE", None)
# Spark's Python workers must run this interpreter (it has sqs_flight).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# Spark (and a managed server's advertised address) on loopback only: the
# tests never listen on or send to another interface. The off-loopback path
# of managed mode (TLS) is forced with its option instead.
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

CACHE = Path.home() / ".cache" / "sqs-flight"
READY_TIMEOUT_S = 60.0


def _required(env: str, default: Optional[Path], install: str) -> str:
    path = os.environ.get(env) or (str(default) if default else None)
    if not path or not os.access(path, os.X_OK):
        pytest.fail(
            f"{env}={path!r} is not an executable: {install} (scripts/test.sh does this)",
            pytrace=False,
        )
    return path


def server_bin() -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))
    return _required(
        "SQSF_SERVER_BIN",
        target / "debug" / "sqs-flight-server",
        "build it with `cargo build -p sqs-flight-server` and set SQSF_SERVER_BIN",
    )


def cli_bin() -> str:
    """The ``sqs-flight`` CLI binary (``SQSF_CLI_BIN``)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))
    return _required(
        "SQSF_CLI_BIN",
        target / "debug" / "sqs-flight",
        "build it with `cargo build -p sqs-flight-client --bin sqs-flight` and set SQSF_CLI_BIN",
    )


def fault_proxy_bin() -> str:
    """The ``sqsf-fault-proxy`` binary of the Rust test harness (tests/src/bin)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))
    return _required(
        "SQSF_FAULT_PROXY",
        target / "debug" / "sqsf-fault-proxy",
        "`cargo test --workspace` builds it into $CARGO_TARGET_DIR/debug; or set SQSF_FAULT_PROXY",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(
    what: str,
    check: Callable[[], object],
    timeout: float,
    *,
    died: Optional[Callable[[], Optional[str]]] = None,
    detail: Optional[Callable[[], str]] = None,
    pause: float = 0.02,
    max_pause: float = 0.5,
    errors_are_not_yet: bool = False,
    fail: bool = True,
) -> bool:
    """The tests' one way to wait: calls ``check`` until it returns
    something true, sleeping ``pause`` (doubled after each try, up to
    ``max_pause``) in between. After ``timeout`` seconds it fails the test
    (``detail()`` appended), or with ``fail=False`` returns False. It fails
    at once when ``died()`` names a reason (the process or query waited on
    is gone). With ``errors_are_not_yet`` an exception from ``check`` (a
    server not listening yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        if died is not None and (reason := died()) is not None:
            pytest.fail(f"{reason} while waiting for {what}", pytrace=False)
        try:
            if check():
                return True
        except Exception:
            if not errors_are_not_yet:
                raise
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, max_pause)
    if not fail:
        return False
    tail = f":\n{detail()}" if detail is not None else ""
    pytest.fail(f"timed out after {timeout} s waiting for {what}{tail}", pytrace=False)


def wait_until(what: str, check: Callable[[], bool], proc: "Proc", timeout: float = READY_TIMEOUT_S) -> None:
    """Polls ``check`` until it holds, the process dies, or ``timeout`` passes."""
    poll(what, check, timeout, died=proc.exited, detail=proc.log_tail, errors_are_not_yet=True)


class Proc:
    """A child process whose output goes to a log file; stopped by stop()."""

    def __init__(self, name: str, args: List[str], log_dir: Path, env: Optional[Dict[str, str]] = None):
        self.name = name
        self.log = log_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self._out = open(self.log, "wb")
        self.popen = self._spawn(args, {**os.environ, **(env or {})})

    def _spawn(self, args: List[str], env: Dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(args, stdout=self._out, stderr=self._out, env=env)

    def exited(self) -> Optional[str]:
        """None while the process runs, else how it ended, with its log's tail."""
        code = self.popen.poll()
        return None if code is None else f"{self.name} exited with {code}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 30) -> str:
        self._out.flush()
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._out.close()


class ServerProc(Proc):
    """sqs-flight-server, started by the package's one launcher: it learns
    where the server listens from the server's ready file."""

    def _spawn(self, args: List[str], env: Dict[str, str]) -> subprocess.Popen:
        self.launch = Launch(args, env, stdout=self._out, stderr=self._out)
        return self.launch.process

    def wait_ready(self) -> str:
        """The server's URL; raises ServerError with its log tail if it does not listen."""
        return self.launch.wait_ready(READY_TIMEOUT_S, self.log_tail)["url"]


class Emulator:
    """An SQS emulator on loopback, with a boto3 client for setup and checks."""

    def __init__(self, name: str, proc: Proc, endpoint: str):
        import boto3

        self.name = name
        self.proc = proc
        self.endpoint = endpoint
        self.sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")

    def new_queue(self, prefix: str = "q", visibility_timeout: int = 600) -> str:
        """A fresh queue; the long visibility timeout makes an undeleted
        message show up as in flight instead of coming back during a test."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        attrs = {"VisibilityTimeout": str(visibility_timeout)}
        return self.sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]

    def new_fifo_queue(self, prefix: str = "q", visibility_timeout: int = 600) -> str:
        """A fresh FIFO queue with content-based deduplication."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}.fifo"
        attrs = {
            "VisibilityTimeout": str(visibility_timeout),
            "FifoQueue": "true",
            "ContentBasedDeduplication": "true",
        }
        return self.sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]

    def receive_all(self, queue_url: str, expect: int, delete: bool = False, timeout: float = 60) -> List[Dict]:
        """Receives every message up to ``expect``, leaving them in flight or,
        with ``delete`` (needed on FIFO queues, whose groups stay locked while
        a message is in flight), deleting them: dicts of ``body``,
        ``attributes`` ({name: string value}) and ``group`` (FIFO), in receive
        order. Stops at ``expect`` or after three empty receives in a row."""
        got: List[Dict] = []
        empty, deadline = 0, time.monotonic() + timeout
        while len(got) < expect and empty < 3 and time.monotonic() < deadline:
            out = self.sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["MessageGroupId"],
            )
            messages = out.get("Messages", [])
            empty = 0 if messages else empty + 1
            for m in messages:
                got.append(
                    {
                        "body": m["Body"],
                        "attributes": {k: v.get("StringValue") for k, v in m.get("MessageAttributes", {}).items()},
                        "group": m.get("Attributes", {}).get("MessageGroupId"),
                    }
                )
            if delete and messages:
                entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
                self.sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
        return got

    def send(self, queue_url: str, bodies: Iterable[str], threads: int = 4, ids: Optional[List[str]] = None) -> int:
        """Sends ``bodies`` with SendMessageBatch (10 per call); returns how many.
        With ``ids``, the MessageId of every message sent is appended to it."""
        bodies = list(bodies)
        chunks = [bodies[i : i + 10] for i in range(0, len(bodies), 10)]

        def send_chunk(chunk: List[str]) -> int:
            entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk)]
            out = self.sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
            assert not out.get("Failed"), out.get("Failed")
            if ids is not None:
                ids.extend(m["MessageId"] for m in out["Successful"])  # list.extend is atomic
            return len(out["Successful"])

        with ThreadPoolExecutor(max_workers=threads) as pool:
            return sum(pool.map(send_chunk, chunks))

    def counts(self, queue_url: str) -> Dict[str, int]:
        """Visible and in-flight counts as the emulator reports them."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attrs = self.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
        return {"visible": int(attrs[names[0]]), "in_flight": int(attrs[names[1]])}


def _moto_ready(sqs) -> Callable[[], bool]:
    return lambda: isinstance(sqs.list_queues(), dict)


@pytest.fixture(scope="session")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session", autouse=True)
def no_managed_server_left(tmp_path_factory) -> Iterable[None]:
    """Managed servers the tests cause (Spark's managed mode runs them in
    sessions of their own, to outlive a query) are stopped at the end, not
    left waiting for their idle exit: every state directory is under the
    session's temporary directory (tests pass ``stateDir``; the default one
    is moved there with ``XDG_STATE_HOME``), and each one with a
    ``managed.json`` has its server stopped, if it is still its own."""
    base = tmp_path_factory.getbasetemp()
    os.environ["XDG_STATE_HOME"] = str(base / "xdg-state")
    yield
    from sqs_flight.managed import stop_server

    for record in base.rglob("managed.json"):
        try:
            stop_server(str(record.parent))
        except Exception as e:  # one that cannot be stopped must not hide the others
            print(f"could not stop the managed server of {record.parent}: {e}", file=sys.stderr)


@pytest.fixture(scope="session")
def moto(logs) -> Iterable[Emulator]:
    exe = (
        os.environ.get("SQSF_MOTO_SERVER")
        or shutil.which("moto_server")
        or str(Path(sys.executable).parent / "moto_server")
    )
    exe = _required("SQSF_MOTO_SERVER", Path(exe), "pip install 'moto[server]==5.2.5'")
    port = free_port()
    proc = Proc("moto", [exe, "-H", "127.0.0.1", "-p", str(port)], logs)
    try:
        emu = Emulator("moto", proc, f"http://127.0.0.1:{port}")
        wait_until("moto_server", _moto_ready(emu.sqs), proc)
        yield emu
    finally:
        proc.stop()


def _rustack_ready(endpoint: str) -> Callable[[], bool]:
    def check() -> bool:
        with urllib.request.urlopen(f"{endpoint}/_localstack/health", timeout=2) as r:
            services = json.loads(r.read()).get("services", {})
            return services.get("sqs") == "running"

    return check


@pytest.fixture(scope="session")
def rustack(logs) -> Iterable[Emulator]:
    exe = _required(
        "SQSF_RUSTACK",
        CACHE / "rustack" / "bin" / "rustack",
        "cargo install rustack-cli@0.12.0 --no-default-features --features sqs --root ~/.cache/sqs-flight/rustack",
    )
    port = free_port()
    # rustack answers 503 past 256 connections or 128 requests at once; SQS
    # has no such limit near there, and 32 receivers per
    # partition with a commit's 128 batch calls can reach it.
    budgets = logs / "rustack-budgets.yaml"
    budgets.write_text("budgets:\n  connections: 4096\n  requests: 4096\n")
    env = {
        "GATEWAY_LISTEN": f"127.0.0.1:{port}",
        "SERVICES": "sqs",
        "LOG_LEVEL": "warn",
        "RUSTACK_CONFIG": str(budgets),
    }
    proc = Proc("rustack", [exe], logs, env)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_until("rustack", _rustack_ready(endpoint), proc)
        yield Emulator("rustack", proc, endpoint)
    finally:
        proc.stop()


class ProxyProc(Proc):
    """A process that runs until its stdin closes (``sqsf-fault-proxy``)."""

    def _spawn(self, args: List[str], env: Dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=self._out, stderr=self._out, env=env)


class FaultProxy:
    """``sqsf-fault-proxy`` in front of an emulator. It stands in for the
    emulator where a server is started (``start_server(proxy, ...)``): it
    has its ``name`` and its own ``endpoint``."""

    def __init__(self, emulator: Emulator, proc: Proc, endpoint: str):
        self.name = emulator.name
        self.proc = proc
        self.endpoint = endpoint

    def counts(self) -> Dict[str, Dict[str, int]]:
        """What the proxy counted: ``{operation: {kind: n}}`` (tests/src/faults.rs)."""
        with urllib.request.urlopen(f"{self.endpoint}/counts", timeout=10) as r:
            return json.loads(r.read())

    def count(self, operation: str, kind: str) -> int:
        return self.counts().get(operation, {}).get(kind, 0)

    def total(self, kind: str) -> int:
        """``kind`` counted over every operation."""
        return sum(kinds.get(kind, 0) for kinds in self.counts().values())


@pytest.fixture
def fault_proxy(logs) -> Iterable[Callable[..., FaultProxy]]:
    """``fault_proxy(emulator, rule, share=0.3, seed=1)``: the fault proxy
    with one of its at-least-once rules (``duplicate-receives`` or
    ``redeliver-deleted``) in front of ``emulator``; stopped at the end."""
    started: List[Proc] = []

    def start(emulator: Emulator, rule: str, share: float = 0.3, seed: int = 1) -> FaultProxy:
        args = [
            fault_proxy_bin(),
            "--upstream",
            emulator.endpoint,
            "--rule",
            rule,
            "--share",
            str(share),
            "--seed",
            str(seed),
        ]
        proc = ProxyProc("fault-proxy", args, logs)
        started.append(proc)
        listening = lambda: "listening on " in proc.log.read_text()  # noqa: E731
        wait_until("sqsf-fault-proxy", listening, proc)
        line = next(x for x in proc.log.read_text().splitlines() if x.startswith("listening on "))
        return FaultProxy(emulator, proc, line.removeprefix("listening on ").strip())

    yield start
    for proc in started:
        proc.stop()


class Server:
    """A running sqs-flight-server."""

    def __init__(self, proc: Proc, url: str):
        self.proc = proc
        self.url = url


def launch_server(args: List[str], logs: Path, env: Optional[Dict[str, str]] = None) -> Server:
    """sqs-flight-server run with ``args`` (the binary first); the test fails,
    with the server's log, if it does not listen."""
    proc = ServerProc("server", args, logs, {"RUST_LOG": "info", **(env or {})})
    try:
        return Server(proc, proc.wait_ready())
    except ServerError as e:
        proc.stop()
        pytest.fail(f"sqs-flight-server did not start: {e}", pytrace=False)


@pytest.fixture
def start_server(logs) -> Iterable[Callable[..., Server]]:
    """``start_server(emulator, {table: queue_url}, *extra_args, listen="127.0.0.1:0")``.

    A fixed ``listen`` port (to restart a server where its clients expect it)
    is retried for a few seconds while the old socket still holds it."""
    started: List[Proc] = []

    def start(emulator: Optional[Emulator], tables: Dict[str, str], *extra: str, listen: str = "127.0.0.1:0") -> Server:
        flags = {"--listen": listen, "--sqs-endpoint": emulator.endpoint if emulator is not None else None}
        if emulator is not None and emulator.name == "moto" and tables:
            # moto's ReceiveMessage is not atomic: two calls in flight at once
            # now and then get the same message, a duplicate real SQS (almost)
            # never makes. Tests on moto count exactly, so their tables read
            # with one receiver per partition; those on rustack keep the
            # default (several).
            config = logs / f"tables-{uuid.uuid4().hex[:10]}.toml"
            config.write_text(
                "".join(f'[tables."{name}"]\nqueue_url = "{url}"\nreceivers = 1\n' for name, url in tables.items())
            )
            flags["--config"], tables = str(config), {}
        args = command(server_bin(), tables=tables, flags=flags, args=extra)
        deadline = time.monotonic() + 15
        while True:
            proc = ServerProc("server", args, logs, {"RUST_LOG": "info"})
            started.append(proc)
            try:
                return Server(proc, proc.wait_ready())
            except ServerError as e:
                bound = not listen.endswith(":0")
                if not (bound and "in use" in e.log_tail and time.monotonic() < deadline):
                    pytest.fail(f"sqs-flight-server did not start: {e}", pytrace=False)
            time.sleep(0.2)

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def default_server(logs) -> Iterable[Server]:
    """A server started with no arguments (but the launcher's
    ``--ready-file``), as the READMEs start it: the embedded demo table.
    Only its port is not the default (SQSF_LISTEN, a variable, not an
    argument), so that a server already on 50051 cannot get in the way."""
    server = launch_server([server_bin()], logs, {"SQSF_LISTEN": "127.0.0.1:0"})
    try:
        yield server
    finally:
        server.proc.stop()


# TLS and a token (test_tls.py, test_flight_sql.py): ``tls_server`` requires TOKEN.
TOKEN = "py-s3cret"


def _self_signed(dir_: Path) -> tuple:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        pytest.fail(
            "the cryptography package is missing: pip install 'moto[server]==5.2.5' (it brings it)", pytrace=False
        )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = dir_ / "cert.pem", dir_ / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path, logs) -> Iterable[dict]:
    """The demo table served with TLS and a token read from a file."""
    cert, key = _self_signed(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # the server refuses a token file others can read
    args = [
        server_bin(),
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--auth-token-file",
        str(token_file),
    ]
    server = launch_server(args, logs)
    try:
        yield {"url": server.url, "cert": cert, "token_file": token_file, "proc": server.proc}
    finally:
        server.proc.stop()


@pytest.fixture
def state(tmp_path):
    """A state directory whose server is stopped at the end of the test."""
    path = tmp_path / "state"
    yield path
    if (path / "managed.json").exists():
        managed.stop_server(str(path))


@pytest.fixture(scope="session")
def spark():
    try:
        from pyspark.sql import SparkSession  # noqa: F401
    except ImportError:
        pytest.fail("pyspark is not installed: pip install 'pyspark[pipelines]==4.3.0' 'pandas<3'", pytrace=False)
    session = new_spark_session()
    yield session
    session.stop()


def new_spark_session(master: str = "local[2]"):
    """The tests' Spark session (the source registered). ``local[N,F]`` lets
    each task try F times; a JVM holds one master, so a test that needs
    another runs its Spark side in a child process (test_fault_run.py)."""
    from pyspark.sql import SparkSession

    from sqs_flight.spark import SqsFlightDataSource

    session = (
        SparkSession.builder.master(master)
        .appName("sqs-flight-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(SqsFlightDataSource)
    return session


def bodies(n: int, tag: str = "m") -> List[str]:
    """``n`` distinct JSON bodies."""
    return [json.dumps({"tag": tag, "n": i}) for i in range(n)]
