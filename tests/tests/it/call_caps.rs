//! Every call counts, whatever its RPC: calls that send headers and no
//! body, and health Watch streams (which need no token), are capped per
//! connection and per client address, and a call's one request message
//! has a deadline. Meanwhile another client's ListFlights is answered. The
//! servers serve the in-memory demo table.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use arrow_flight::FlightClient;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sqs_flight_server::config::DEFAULT_MAX_CALLS_PER_CONNECTION;
use sqs_flight_server::testing::{NARROW_CALLS_PER_CONNECTION, ROOMY_CONNECTIONS};
use sqs_flight_tests::h2raw::{REFUSED_STREAM, RawH2};
use sqs_flight_tests::server::TestServer;
use sqs_flight_tests::server_process::status_kib;

use sqs_flight_tests::prelude::{bounded, poll};

const TOKEN: &str = "s3cret";
const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const GET_FLIGHT_INFO: &str = "/arrow.flight.protocol.FlightService/GetFlightInfo";
const WATCH: &str = "/grpc.health.v1.Health/Watch";
/// How long another client's call may take while the hostile calls run.
const PROMPT: Duration = Duration::from_secs(5);

/// Another client's ListFlights, on a connection of its own from the same
/// address, answered within [`PROMPT`].
async fn list_flights_promptly(server: &TestServer, token: Option<&str>) {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_timeout(PROMPT);
    let answered = tokio::time::timeout(PROMPT, async {
        let mut client = FlightClient::new(endpoint.connect().await.expect("connect"));
        if let Some(token) = token {
            client
                .add_header("authorization", &format!("Bearer {token}"))
                .unwrap();
        }
        let infos: Vec<_> = client
            .list_flights("")
            .await
            .expect("ListFlights")
            .try_collect()
            .await
            .expect("its answer");
        infos.len()
    });
    let tables = answered
        .await
        .expect("another client's ListFlights answered promptly");
    assert_eq!(tables, 1);
}

type Body = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// A body that sends nothing and never ends.
fn no_body() -> Body {
    StreamBody::new(futures::stream::pending().boxed())
}

/// One empty gRPC message, then the end: a health request for the server.
fn empty_message() -> Body {
    let message = Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]));
    StreamBody::new(futures::stream::iter([Ok(message)]).boxed())
}

/// A hyper HTTP/2 connection (it answers the server's pings).
async fn hyper_conn(addr: SocketAddr) -> http2::SendRequest<Body> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    sender
}

/// A call's answer once its response headers came: `"CODE MESSAGE"` for
/// a status in them (a call refused or ended at once), `"open"` for a
/// stream under way, which `held` keeps open until dropped.
struct Answer {
    status: String,
    _held: Option<hyper::Response<hyper::body::Incoming>>,
}

/// Starts a call to `path`; its [`Answer`] once the response headers come.
fn start_call(
    sender: &mut http2::SendRequest<Body>,
    addr: SocketAddr,
    path: &str,
    body: Body,
) -> tokio::task::JoinHandle<Answer> {
    let request = hyper::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .expect("a request");
    let answer = sender.send_request(request);
    tokio::spawn(async move {
        let response = answer.await.expect("response headers");
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap_or("").to_string())
        };
        match header("grpc-status") {
            Some(code) => Answer {
                status: format!("{code} {}", header("grpc-message").unwrap_or_default()),
                _held: None,
            },
            None => Answer {
                status: "open".to_string(),
                _held: Some(response),
            },
        }
    })
}

/// How many of `answers` start with `prefix`.
fn count(answers: &[String], prefix: &str) -> usize {
    answers.iter().filter(|a| a.starts_with(prefix)).count()
}

/// The statuses of `answers`.
fn statuses(answers: &[Answer]) -> Vec<String> {
    answers.iter().map(|a| a.status.clone()).collect()
}

#[tokio::test]
async fn calls_without_a_body_are_capped_per_client_and_end_at_the_body_deadline() {
    // The default deployment (no token), small caps and deadline.
    let (per_client, timeout) = (12u32, Duration::from_secs(4));
    let server = TestServer::in_memory("demo", 20, |c| {
        c.max_calls_per_client = per_client;
        c.request_body_timeout = timeout;
    })
    .await;
    // One raw connection fills the client's allowance with calls that send
    // headers only...
    let mut raw = bounded(RawH2::connect(LOCAL, server.addr)).await.unwrap();
    bounded(raw.served()).await;
    let mut streams = Vec::new();
    for _ in 0..per_client {
        streams.push(raw.open_call(GET_FLIGHT_INFO, None).await);
    }
    // ...a second connection gets its own first 8 calls past it, and no
    // more: the rest are refused at once.
    let mut sender = hyper_conn(server.addr).await;
    let tries = 12;
    let answers: Vec<_> = (0..tries)
        .map(|_| start_call(&mut sender, server.addr, GET_FLIGHT_INFO, no_body()))
        .collect();
    let refused = tries - 8;
    let early = poll(
        PROMPT,
        async || answers.iter().filter(|a| a.is_finished()).count(),
        |&n| n >= refused,
    );
    assert!(
        early.await.is_ok(),
        "calls past max_calls_per_client are refused at once"
    );
    // Another client is answered while they are all open.
    list_flights_promptly(&server, None).await;
    // At the deadline every call without a body ends.
    let ended = tokio::time::timeout(
        timeout * 4,
        futures::future::join_all(answers.into_iter().map(|a| async { a.await.unwrap() })),
    );
    let answers = statuses(&ended.await.expect("every call ends at the body deadline"));
    assert_eq!(count(&answers, "8 "), refused, "{answers:#?}");
    for answer in answers.iter().filter(|a| a.starts_with("8 ")) {
        assert!(answer.contains("max_calls_per_client"), "{answer}");
    }
    let expired: Vec<_> = answers.iter().filter(|a| a.starts_with("4 ")).collect();
    assert_eq!(expired.len(), tries - refused, "{answers:#?}");
    assert!(
        expired.iter().all(|a| a.contains("request_body_timeout")),
        "{expired:#?}"
    );
    bounded(raw.until(|s| {
        streams
            .iter()
            .all(|id| s.streams.get(id).is_some_and(|st| st.ended))
    }))
    .await;
    drop((raw, sender));
    server.stop().await;
}

#[tokio::test]
async fn streams_past_max_calls_per_connection_are_refused_by_http2() {
    let per_connection = 4u32;
    let server =
        TestServer::in_memory("demo", 20, |c| c.max_calls_per_connection = per_connection).await;
    // A client that ignores the server's SETTINGS_MAX_CONCURRENT_STREAMS.
    let mut raw = bounded(RawH2::connect(LOCAL, server.addr)).await.unwrap();
    bounded(raw.served()).await;
    let mut streams = Vec::new();
    for _ in 0..per_connection + 2 {
        streams.push(raw.open_call(GET_FLIGHT_INFO, None).await);
    }
    let (within, over) = streams.split_at(per_connection as usize);
    let reset = |s: &sqs_flight_tests::h2raw::Seen, id: &u32| {
        s.streams.get(id).and_then(|st| st.reset) == Some(REFUSED_STREAM)
    };
    let refused = tokio::time::timeout(PROMPT, raw.until(|s| over.iter().all(|id| reset(s, id))));
    refused
        .await
        .expect("the streams past the cap are reset (REFUSED_STREAM)");
    for id in within {
        assert_eq!(raw.stream(*id).reset, None, "stream {id} is within the cap");
    }
    list_flights_promptly(&server, None).await;
    drop(raw);
    server.stop().await;
}

#[tokio::test]
async fn a_clients_connections_past_the_first_few_carry_few_calls_each() {
    let timeout = Duration::from_secs(3);
    let server = TestServer::in_memory("demo", 20, |c| c.request_body_timeout = timeout).await;
    let connect = async || {
        let mut raw = bounded(RawH2::connect(LOCAL, server.addr)).await.unwrap();
        bounded(raw.served()).await;
        raw
    };
    // The client's first connections carry max_calls_per_connection calls.
    let mut roomy = Vec::new();
    for _ in 0..ROOMY_CONNECTIONS {
        let raw = connect().await;
        assert_eq!(
            raw.max_concurrent_streams(),
            Some(DEFAULT_MAX_CALLS_PER_CONNECTION)
        );
        roomy.push(raw);
    }
    // The ones it opens beside them a few: the calls past those are reset
    // by HTTP/2 (REFUSED_STREAM) before any reaches the server's services,
    // however many connections open how many calls.
    let (conns, per) = (60, 64u32);
    let mut narrow = Vec::new();
    for _ in 0..conns {
        let mut raw = connect().await;
        assert_eq!(
            raw.max_concurrent_streams(),
            Some(NARROW_CALLS_PER_CONNECTION)
        );
        for _ in 0..per {
            raw.open_call(GET_FLIGHT_INFO, None).await;
        }
        narrow.push(raw);
    }
    let ids = |n: u32| (0..n).map(|k| 2 * k + 1).collect::<Vec<_>>();
    let reset = |s: &sqs_flight_tests::h2raw::Seen, id: &u32| {
        s.streams.get(id).and_then(|st| st.reset) == Some(REFUSED_STREAM)
    };
    let mut within = ids(per);
    let over = within.split_off(NARROW_CALLS_PER_CONNECTION as usize);
    for raw in &mut narrow {
        bounded(raw.until(|s| over.iter().all(|id| reset(s, id)))).await;
    }
    // Another client from the same address is answered meanwhile.
    list_flights_promptly(&server, None).await;
    // The calls within the narrow cap were served: each ends at the body
    // deadline (the server then resets its half-open request side), none
    // is refused.
    for raw in &mut narrow {
        let ended = |s: &sqs_flight_tests::h2raw::Seen| {
            within
                .iter()
                .all(|id| s.streams.get(id).is_some_and(|st| st.ended))
        };
        tokio::time::timeout(timeout * 4, raw.until(ended))
            .await
            .expect("the calls within the cap end at the body deadline");
        for id in &within {
            let seen = raw.stream(*id);
            assert_ne!(seen.reset, Some(REFUSED_STREAM), "stream {id}: {seen:?}");
        }
    }
    // A roomy connection still carries more calls than a narrow one.
    let first = &mut roomy[0];
    let more = ids(2 * NARROW_CALLS_PER_CONNECTION);
    for _ in &more {
        first.open_call(GET_FLIGHT_INFO, None).await;
    }
    let ended = |s: &sqs_flight_tests::h2raw::Seen| {
        more.iter().all(|id| {
            s.streams
                .get(id)
                .is_some_and(|st| st.ended || st.reset.is_some())
        })
    };
    tokio::time::timeout(timeout * 4, first.until(ended))
        .await
        .expect("the calls end at the body deadline");
    for id in &more {
        let seen = first.stream(*id);
        assert!(seen.ended, "stream {id}: {seen:?}");
        assert_ne!(seen.reset, Some(REFUSED_STREAM), "stream {id}: {seen:?}");
    }
    // Once the client's connections are closed, a new one is roomy again.
    drop((roomy, narrow));
    let again = poll(
        PROMPT,
        async || connect().await.max_concurrent_streams(),
        |n| *n == Some(DEFAULT_MAX_CALLS_PER_CONNECTION),
    );
    assert!(
        again.await.is_ok(),
        "a client with no connection open is roomy again"
    );
    server.stop().await;
}

#[tokio::test]
async fn unauthenticated_health_watch_streams_are_capped_per_client() {
    let per_client = 12u32;
    let server = TestServer::in_memory("demo", 20, |c| {
        c.auth_token = Some(TOKEN.into());
        c.max_calls_per_client = per_client;
    })
    .await;
    // Watch streams need no token: one connection opens more than the
    // client's allowance of them.
    let mut sender = hyper_conn(server.addr).await;
    let tries = 20;
    let mut answers = Vec::new();
    for _ in 0..tries {
        let answer = start_call(&mut sender, server.addr, WATCH, empty_message());
        // In order, so that the first ones are those held.
        answers.push(bounded(answer).await.unwrap());
    }
    let held = answers;
    let answers = statuses(&held);
    assert_eq!(count(&answers, "open"), per_client as usize, "{answers:#?}");
    let refused: Vec<_> = answers.iter().filter(|a| a.starts_with("8 ")).collect();
    assert_eq!(refused.len(), tries - per_client as usize, "{answers:#?}");
    assert!(
        refused.iter().all(|a| a.contains("max_calls_per_client")),
        "{refused:#?}"
    );
    // Another client, from the same address, is answered meanwhile.
    list_flights_promptly(&server, Some(TOKEN)).await;
    drop((held, sender));
    server.stop().await;
}

/// A measurement, not a check (its figures are in docs/operations.md,
/// "Limits"): the real server with its defaults (no token), under 256
/// connections from one address each opening 511 calls that send headers
/// only, then 256 x 511 unauthenticated health Watch streams; how long
/// another client's ListFlights takes meanwhile. Run it with `--ignored
/// --nocapture`.
#[tokio::test]
#[ignore = "a measurement: prints the server's memory under floods of calls"]
async fn call_flood_memory() {
    let server =
        sqs_flight_tests::server_process::ServerProcess::start(&["--listen", "127.0.0.1:0"]);
    let addr: SocketAddr = server
        .url
        .trim_start_matches("grpc://")
        .parse()
        .expect("an address");
    let probe = TestServerAddr(addr);
    probe.list_flights().await;
    let before = status_kib(server.pid(), "VmRSS:") / 1024;
    for (what, path, body) in [
        ("GetFlightInfo, headers only", GET_FLIGHT_INFO, false),
        ("health Watch", WATCH, true),
    ] {
        let mut conns = Vec::new();
        for _ in 0..256 {
            let mut raw = bounded(RawH2::connect(LOCAL, addr)).await.unwrap();
            bounded(raw.served()).await;
            for _ in 0..511 {
                let id = raw.open_call(path, None).await;
                if body {
                    raw.send_empty_message(id).await;
                }
            }
            conns.push(raw);
        }
        let (opened, refused) = settled(&conns).await;
        let started = std::time::Instant::now();
        probe.list_flights().await;
        let waited = started.elapsed();
        println!(
            "{what}: {opened} calls held, {refused} refused; VmRSS {before} MiB before, {} MiB \
             with them; another client's ListFlights took {waited:?}",
            status_kib(server.pid(), "VmRSS:") / 1024
        );
        drop(conns);
    }
}

/// [`held_and_refused`] once the server has answered what it refuses: the
/// counts no longer change for half a second. Which calls it refuses
/// depends on more than the caps (every connection may open a few, and a
/// connection refused many times in a row is closed), so the wait is for
/// the answers to stop, not for a count; a measurement, so past 20 s it
/// takes what it saw.
async fn settled(conns: &[RawH2]) -> (usize, usize) {
    let steady_for = Duration::from_millis(500);
    let (mut last, mut since) = (None, tokio::time::Instant::now());
    let seen = poll(
        Duration::from_secs(20),
        async || {
            let now = held_and_refused(conns);
            if last != Some(now) {
                (last, since) = (Some(now), tokio::time::Instant::now());
            }
            (now, since.elapsed())
        },
        |&(_, steady)| steady >= steady_for,
    )
    .await;
    seen.unwrap_or_else(|last_seen| last_seen).0
}

/// Of the 511 calls opened on each of `conns`: how many the server still
/// holds, and how many it ended or reset.
fn held_and_refused(conns: &[RawH2]) -> (usize, usize) {
    let (mut held, mut refused) = (0, 0);
    for raw in conns {
        for id in (1..1022).step_by(2) {
            let seen = raw.stream(id);
            if seen.ended || seen.reset.is_some() {
                refused += 1;
            } else {
                held += 1;
            }
        }
    }
    (held, refused)
}

/// The Flight address of a server process.
struct TestServerAddr(SocketAddr);

impl TestServerAddr {
    async fn list_flights(&self) {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.0))
            .unwrap()
            .connect_timeout(PROMPT);
        let channel = bounded(endpoint.connect()).await.expect("connect");
        let mut client = FlightClient::new(channel);
        let infos: Vec<_> = bounded(client.list_flights(""))
            .await
            .expect("ListFlights")
            .try_collect()
            .await
            .expect("its answer");
        assert_eq!(infos.len(), 1);
    }
}
