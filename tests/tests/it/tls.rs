//! TLS and bearer tokens on the Flight endpoint, and the bounded graceful
//! shutdown of the real server binary.
//!
//! The transport tests serve the embedded in-memory demo table (20 sample
//! messages), so they need no SQS emulator; the certificate is a fresh
//! self-signed one for 127.0.0.1 and localhost, made with rcgen.

use std::path::PathBuf;
use std::time::Duration;

use arrow_flight::FlightClient;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::TryStreamExt;
use sqs_flight_client::send::batch_from_text_lines;
use sqs_flight_client::{Client, Error, PlanOptions};
use sqs_flight_server::config::{Cli, Config, TlsFiles};
use sqs_flight_tests::server::{TestServer, unused_sqs};
use sqs_flight_tests::server_process::ServerProcess;
use tonic::Code;

use sqs_flight_tests::prelude::{TempDir, bounded, poll, temp_dir};

const TOKEN: &str = "s3cret-token";

/// A self-signed certificate and its key, written to a directory of their own.
struct Pki {
    dir: TempDir,
    cert: PathBuf,
    key: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = temp_dir(&format!("tls-{name}"));
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
                .expect("self-signed certificate");
        let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, signing_key.serialize_pem()).unwrap();
        Self {
            dir,
            cert: cert_path,
            key: key_path,
        }
    }

    fn files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// A server of the demo table, with TLS when `pki` is given and the token.
async fn demo_server(pki: Option<&Pki>, token: Option<&str>) -> TestServer {
    TestServer::in_memory("demo", 20, |c| {
        c.tls = pki.map(Pki::files);
        c.auth_token = token.map(str::to_string);
    })
    .await
}

fn options(consumer: &str) -> PlanOptions {
    PlanOptions::consumer(consumer)
        .partitions(1)
        .max_messages(100)
        .max_wait(Duration::from_millis(200))
}

async fn tls_client(server: &TestServer, pki: &Pki, token: Option<&str>) -> Client {
    let mut builder = Client::builder(server.url.clone()).ca_certificate_file(&pki.cert);
    if let Some(t) = token {
        builder = builder.bearer_token(t);
    }
    bounded(builder.connect())
        .await
        .expect("TLS client with the CA connects")
}

#[tokio::test]
async fn tls_client_with_the_ca_reads_and_commits_a_batch() {
    let pki = Pki::new("read");
    let server = demo_server(Some(&pki), None).await;
    assert!(server.url.starts_with("grpc+tls://"), "{}", server.url);
    let client = tls_client(&server, &pki, None).await;
    let plan = bounded(client.plan("demo", &options("tls"))).await.unwrap();
    assert_eq!(plan.endpoints.len(), 1);
    assert!(
        plan.endpoints[0]
            .locations
            .iter()
            .all(|l| l.starts_with("grpc+tls://")),
        "endpoints advertise the TLS scheme: {:?}",
        plan.endpoints[0].locations
    );
    let rows = bounded(client.read_batch(&plan)).await.unwrap();
    let n: usize = rows.iter().map(|b| b.num_rows()).sum();
    assert_eq!(n, 20, "the demo table's 20 messages over TLS");
    let committed = bounded(client.commit("demo", "tls", plan.batch))
        .await
        .unwrap();
    assert_eq!(
        (committed.committed_batch, committed.deleted),
        (plan.batch, 20)
    );
    server.stop().await;
}

#[tokio::test]
async fn plaintext_client_cannot_talk_to_a_tls_server() {
    let pki = Pki::new("plain");
    let server = demo_server(Some(&pki), None).await;
    let plain_url = format!("grpc://{}", server.addr);
    // Connecting may or may not succeed (TCP does); no call may.
    let outcome = async {
        let client = Client::builder(plain_url)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        client.tables().await
    };
    let err = tokio::time::timeout(Duration::from_secs(30), outcome)
        .await
        .expect("a plaintext call to a TLS port fails instead of hanging")
        .expect_err("a plaintext client must not get an answer from a TLS server");
    assert!(
        matches!(err, Error::Connect { .. } | Error::Unavailable { .. }),
        "a transport failure, not a server answer: {err:?}"
    );
    println!("a plaintext client to a TLS server gets: {err}");
    server.stop().await;
}

#[tokio::test]
async fn tls_client_without_the_ca_is_refused_the_self_signed_certificate() {
    let pki = Pki::new("noca");
    let server = demo_server(Some(&pki), None).await;
    let err = bounded(
        Client::builder(server.url.clone())
            .connect_timeout(Duration::from_secs(5))
            .connect(),
    )
    .await
    .expect_err("the system roots do not trust a self-signed certificate");
    match &err {
        Error::Connect { reason, .. } => assert!(
            reason.contains("certificate") || reason.contains("UnknownIssuer"),
            "the reason names the certificate problem: {reason}"
        ),
        other => panic!("expected a connect error, got {other:?}"),
    }
    // A CA file that is not a certificate is named at connect.
    let err = bounded(
        Client::builder(server.url.clone())
            .ca_certificate_file(&pki.key)
            .connect(),
    )
    .await
    .expect_err("a key is not a CA certificate");
    assert!(
        matches!(&err, Error::InvalidConfig { reason, .. } if reason.contains("key.pem")),
        "{err:?}"
    );
    server.stop().await;
}

/// Every RPC kind of the server, through the Rust client (and a raw Flight
/// client for ListActions), answering Ok(()) or the call's error code.
async fn every_rpc(
    client: &Client,
    raw: &mut FlightClient,
) -> Vec<(&'static str, Result<(), Code>)> {
    let code = |e: Error| e.code().unwrap_or(Code::Unknown);
    let mut out = Vec::new();
    out.push((
        "Handshake",
        client.handshake().await.map(drop).map_err(code),
    ));
    out.push(("ListFlights", client.tables().await.map(drop).map_err(code)));
    out.push((
        "GetSchema",
        client.schema("demo").await.map(drop).map_err(code),
    ));
    let plan = client.plan("demo", &options("auth")).await;
    out.push((
        "GetFlightInfo",
        plan.as_ref().map(drop).map_err(|e| code(e.clone())),
    ));
    out.push((
        "DoAction status",
        client.status(None).await.map(drop).map_err(code),
    ));
    out.push((
        "ListActions",
        match raw.list_actions().await {
            Ok(s) => s
                .try_collect::<Vec<_>>()
                .await
                .map(drop)
                .map_err(|e| tonic::Status::from(e).code()),
            Err(e) => Err(tonic::Status::from(e).code()),
        },
    ));
    let put = client
        .send(
            "demo",
            futures::stream::iter([batch_from_text_lines(["x"])]),
        )
        .await;
    out.push(("DoPut", put.map(drop).map_err(|e| code(e.error))));
    out
}

/// A raw Flight client on `server` over TLS, sending `header` as
/// `authorization` when given.
async fn raw_client(server: &TestServer, pki: &Pki, header: Option<&str>) -> FlightClient {
    let ca = std::fs::read(&pki.cert).unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", server.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("raw TLS connection");
    let mut client = FlightClient::new_from_inner(FlightServiceClient::new(channel));
    if let Some(h) = header {
        client
            .add_header("authorization", h)
            .expect("valid header value");
    }
    client
}

#[tokio::test]
async fn every_rpc_needs_the_token_when_the_server_has_one() {
    let pki = Pki::new("token");
    let server = demo_server(Some(&pki), Some(TOKEN)).await;

    for (who, token) in [("no token", None), ("wrong token", Some("s3cret-tokem"))] {
        let client = tls_client(&server, &pki, token).await;
        let header = token.map(|t| format!("Bearer {t}"));
        let mut raw = raw_client(&server, &pki, header.as_deref()).await;
        let answers = bounded(every_rpc(&client, &mut raw)).await;
        assert_eq!(answers.len(), 7);
        for (rpc, answer) in answers {
            assert_eq!(answer, Err(Code::Unauthenticated), "{who}: {rpc}");
        }
        // DoGet of a real ticket, and a commit, without the token.
        let right = tls_client(&server, &pki, Some(TOKEN)).await;
        let plan = bounded(right.plan("demo", &options(who))).await.unwrap();
        let read = bounded(async {
            match client.read(&plan.endpoints[0]).await {
                Ok(s) => s.try_collect::<Vec<_>>().await.map(drop),
                Err(e) => Err(e),
            }
        })
        .await;
        assert_eq!(
            read.map_err(|e| e.code()),
            Err(Some(Code::Unauthenticated)),
            "{who}: DoGet"
        );
        let commit = bounded(client.commit("demo", who, plan.batch)).await;
        assert_eq!(
            commit.map(drop).map_err(|e| e.code()),
            Err(Some(Code::Unauthenticated)),
            "{who}: DoAction commit"
        );
        // The refused calls changed nothing: the batch is still open.
        let status = bounded(right.status(Some("demo"))).await.unwrap();
        let consumer = &status.tables["demo"].consumers[who];
        assert_eq!(consumer.committed_batch, None, "{who}");
        bounded(right.release("demo", who)).await.unwrap();
    }

    let client = tls_client(&server, &pki, Some(TOKEN)).await;
    let mut raw = raw_client(&server, &pki, Some(&format!("Bearer {TOKEN}"))).await;
    for (rpc, answer) in bounded(every_rpc(&client, &mut raw)).await {
        assert_eq!(answer, Ok(()), "right token: {rpc}");
    }
    assert_eq!(
        bounded(client.handshake()).await.unwrap(),
        TOKEN.as_bytes(),
        "Handshake answers with the token"
    );
    let plan = bounded(client.plan("demo", &options("right")))
        .await
        .unwrap();
    let rows = bounded(client.read_batch(&plan)).await.unwrap();
    assert!(!rows.is_empty());
    bounded(client.commit("demo", "right", plan.batch))
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn handshake_takes_the_token_as_payload_or_header() {
    let pki = Pki::new("handshake");
    let server = demo_server(Some(&pki), Some(TOKEN)).await;
    // Payload only, no header: arrow-flight's FlightClient::handshake.
    let mut raw = raw_client(&server, &pki, None).await;
    let answer = bounded(raw.handshake(TOKEN.as_bytes().to_vec())).await;
    assert_eq!(answer.unwrap(), TOKEN.as_bytes());
    // Header only, empty payload.
    let mut raw = raw_client(&server, &pki, Some(&format!("Bearer {TOKEN}"))).await;
    let answer = bounded(raw.handshake(Vec::new())).await;
    assert_eq!(answer.unwrap(), TOKEN.as_bytes());
    // Neither, or a wrong one.
    for (header, payload) in [(None, ""), (None, "s3cret"), (Some("Bearer nope"), "")] {
        let mut raw = raw_client(&server, &pki, header).await;
        let err = bounded(raw.handshake(payload.as_bytes().to_vec()))
            .await
            .expect_err("handshake without the token");
        assert_eq!(
            tonic::Status::from(err).code(),
            Code::Unauthenticated,
            "{header:?} {payload:?}"
        );
    }
    server.stop().await;

    // A server without a token: every handshake succeeds, with an empty answer.
    let open = demo_server(Some(&pki), None).await;
    let mut raw = raw_client(&open, &pki, None).await;
    assert_eq!(
        bounded(raw.handshake(Vec::new())).await.unwrap(),
        b"".as_slice()
    );
    open.stop().await;
}

#[tokio::test]
async fn token_file_on_the_server_and_the_client() {
    let pki = Pki::new("tokenfile");
    let file = pki.dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    // Only its owner may read it: the server refuses a token others can read.
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let cli = <Cli as clap::Parser>::try_parse_from([
        "sqs-flight-server",
        "--listen",
        "127.0.0.1:0",
        "--auth-token-file",
        file.to_str().unwrap(),
        "--tls-cert",
        pki.cert.to_str().unwrap(),
        "--tls-key",
        pki.key.to_str().unwrap(),
    ])
    .unwrap();
    let config = Config::try_from(cli).expect("config with a token file");
    let server = TestServer::start(config, unused_sqs()).await;

    let with_file = bounded(
        Client::builder(server.url.clone())
            .ca_certificate_file(&pki.cert)
            .bearer_token_file(&file)
            .connect(),
    )
    .await
    .unwrap();
    assert_eq!(bounded(with_file.tables()).await.unwrap(), ["demo"]);
    let wrong = tls_client(&server, &pki, Some(&format!("{TOKEN}x"))).await;
    assert_eq!(
        bounded(wrong.tables()).await.unwrap_err().code(),
        Some(Code::Unauthenticated),
        "the server holds the file's token, not any token"
    );
    let empty = pki.dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let err = bounded(
        Client::builder(server.url.clone())
            .ca_certificate_file(&pki.cert)
            .bearer_token_file(&empty)
            .connect(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig { reason, .. } if reason.contains("empty")),
        "{err:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn sigterm_cuts_an_open_stream_after_the_grace_period_and_exits_0() {
    let pki = Pki::new("shutdown");
    let grace = 2;
    let grace_arg = grace.to_string();
    let server = ServerProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--shutdown-grace",
        &grace_arg,
        "--tls-cert",
        pki.cert.to_str().unwrap(),
        "--tls-key",
        pki.key.to_str().unwrap(),
    ]);
    assert!(server.url.starts_with("grpc+tls://"), "{}", server.url);
    let client = bounded(
        Client::builder(server.url.clone())
            .ca_certificate_file(&pki.cert)
            .connect(),
    )
    .await
    .unwrap();
    // A DoGet that stays open: after the 20 demo messages it waits up to
    // 20 s for more, far past the grace period.
    let long = PlanOptions::consumer("long")
        .partitions(1)
        .max_messages(1000)
        .max_wait(Duration::from_secs(20))
        .max_duration(Duration::from_secs(120));
    let plan = bounded(client.plan("demo", &long)).await.unwrap();
    let mut stream = bounded(client.read(&plan.endpoints[0])).await.unwrap();
    let first = bounded(stream.try_next()).await.unwrap();
    assert!(
        first.is_some_and(|b| b.num_rows() > 0),
        "the stream is open and has rows"
    );

    server.signal(libc::SIGTERM);
    // The stream ends (cleanly or cut) instead of waiting its 20 s out.
    let rest = tokio::time::timeout(Duration::from_secs(60), async {
        let mut n = 0usize;
        while let Ok(Some(b)) = stream.try_next().await {
            n += b.num_rows();
        }
        n
    })
    .await;
    assert!(rest.is_ok(), "the open stream ended after SIGTERM");
    let (status, log) = exit_of(server, Duration::from_secs(grace + 60)).await;
    assert_eq!(status, Some(0), "exit status; log:\n{log}");
    assert!(log.contains("SIGTERM"), "the signal is logged:\n{log}");
    assert!(
        log.contains("grace period is over"),
        "the cut of the open stream is logged:\n{log}"
    );
}

#[tokio::test]
async fn sigterm_without_open_streams_exits_0_and_says_so() {
    let server = ServerProcess::start(&["--listen", "127.0.0.1:0", "--shutdown-grace", "30"]);
    let client = bounded(Client::connect(server.url.clone())).await.unwrap();
    assert_eq!(bounded(client.tables()).await.unwrap(), ["demo"]);
    server.signal(libc::SIGTERM);
    let (status, log) = exit_of(server, Duration::from_secs(90)).await;
    assert_eq!(status, Some(0), "exit status; log:\n{log}");
    assert!(
        log.contains("every open call finished within the grace period"),
        "{log}"
    );
}

/// Waits (up to `deadline`, a test timeout, not a measurement) for the
/// server to log that it stopped and to exit: its exit code (`None` when it
/// had to be killed) and its log.
async fn exit_of(server: ServerProcess, deadline: Duration) -> (Option<i32>, String) {
    let until = std::time::Instant::now() + deadline;
    let stopped = |log: &String| log.contains("sqs-flight server stopped");
    let (Ok(log) | Err(log)) = poll(deadline, async || server.log(), stopped).await;
    tokio::task::spawn_blocking(move || {
        let status = server.wait_exit(until.saturating_duration_since(std::time::Instant::now()));
        (status.map(|s| s.code().unwrap_or(-1)), log)
    })
    .await
    .expect("waiting thread")
}

#[tokio::test]
async fn cli_takes_the_ca_and_a_token_file() {
    use sqs_flight_tests::cli::sqs_flight;
    let pki = Pki::new("cli");
    let server = demo_server(Some(&pki), Some(TOKEN)).await;
    let token_file = pki.dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let (url, ca, tokens) = (
        server.url.clone(),
        pki.cert.to_str().unwrap().to_string(),
        token_file.to_str().unwrap().to_string(),
    );
    let run = sqs_flight(&[
        "--url",
        &url,
        "--tls-ca",
        &ca,
        "--token-file",
        &tokens,
        "tables",
    ])
    .await;
    run.expect_code(0);
    assert_eq!(run.stdout.trim(), "demo");
    // The earlier flag name still works.
    let run = sqs_flight(&["--url", &url, "--ca-cert", &ca, "--token", TOKEN, "tables"]).await;
    run.expect_code(0);

    let run = sqs_flight(&["--url", &url, "--token-file", &tokens, "tables"]).await;
    run.expect_code(3);
    assert!(
        run.stderr.contains("--tls-ca"),
        "the hint names --tls-ca: {run:#?}"
    );
    let run = sqs_flight(&["--url", &url, "--tls-ca", &ca, "tables"]).await;
    run.expect_code(6);
    let plain = format!("grpc://{}", server.addr);
    let run = sqs_flight(&["--url", &plain, "--token", TOKEN, "tables"]).await;
    assert_ne!(run.code, 0, "{run:#?}");
    assert!(
        run.stderr.contains("grpc+tls://"),
        "the hint names grpc+tls://: {run:#?}"
    );
    server.stop().await;
}
