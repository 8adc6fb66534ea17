//! Connection hygiene on the `--metrics-listen` port: caps on its
//! connections (and so on its file descriptors, a small share of the
//! limit), a deadline and a size bound for a request's header. However
//! that port is flooded, the Flight port and a fresh `/healthz` are
//! answered. The servers serve the in-memory demo table.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::FlightClient;
use futures::TryStreamExt;
use sqs_flight_server::Config;
use sqs_flight_tests::closed::{ClosedConnections, until_closed};
use sqs_flight_tests::http::get;
use sqs_flight_tests::server::TestServer;
use sqs_flight_tests::server_process::status_kib;
use sqs_flight_tests::server_process::{ServerProcess, server_binary};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use sqs_flight_tests::prelude::{bounded, free_addr};

/// What "answered promptly" means for another client's call while the
/// metrics port is flooded.
const PROMPT: Duration = Duration::from_secs(5);
/// How long a test waits for the server to close connections.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// The start of a `GET /metrics` whose header never ends.
const UNFINISHED: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: flood\r\n";

/// A server of the demo table with a metrics port, `tweak` applied, once
/// that port answers: the server and the metrics port's address.
async fn demo_server(tweak: impl FnOnce(&mut Config)) -> (TestServer, SocketAddr) {
    let ops = free_addr();
    let server = TestServer::in_memory("demo", 20, |c| {
        c.metrics_listen = Some(ops);
        tweak(c);
    })
    .await;
    // The port is bound as the server starts: `get` retries until then.
    assert_eq!(bounded(get(ops, "/healthz")).await.0, 200);
    (server, ops)
}

/// `n` connections to `addr` that each sent `head` and wait.
async fn unfinished_requests(n: usize, addr: SocketAddr, head: &[u8]) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut conn = bounded(TcpStream::connect(addr)).await.expect("connect");
        // The server may already have closed it to make room.
        let _ = conn.write_all(head).await;
        conns.push(conn);
    }
    conns
}

/// `GET path` answered within [`PROMPT`]: its status.
async fn prompt_get(addr: SocketAddr, path: &'static str) -> u16 {
    let got = tokio::time::timeout(PROMPT, get(addr, path)).await;
    got.unwrap_or_else(|_| panic!("GET {path} not answered within {PROMPT:?}"))
        .0
}

/// A new Flight client's ListFlights at `url` (`grpc://` or `http://`),
/// connection included, answered within [`PROMPT`]: the tables named.
async fn prompt_list_flights(url: &str) -> usize {
    let uri = url.replace("grpc://", "http://");
    let listed = tokio::time::timeout(PROMPT, async {
        let channel = tonic::transport::Endpoint::from_shared(uri)
            .expect("a valid URL")
            .connect()
            .await
            .expect("connect");
        let mut client = FlightClient::new(channel);
        let stream = client.list_flights("").await.expect("ListFlights");
        let infos: Vec<_> = stream.try_collect().await.expect("its answer");
        infos.len()
    });
    listed
        .await
        .unwrap_or_else(|_| panic!("ListFlights not answered within {PROMPT:?}"))
}

/// The server binary started under `ulimit -n fds`, with `args`.
fn server_under_ulimit(fds: u32, args: &[&str]) -> ServerProcess {
    let bin = server_binary().to_str().expect("a UTF-8 path").to_string();
    let script = format!("ulimit -n {fds} && exec \"$0\" \"$@\"");
    let mut all = vec!["-c", script.as_str(), bin.as_str()];
    all.extend_from_slice(args);
    ServerProcess::start_bin(Path::new("/bin/sh"), &all, &[])
}

#[tokio::test]
async fn unfinished_requests_over_the_cap_give_way_and_a_fresh_healthz_is_answered() {
    let (cap, n) = (4, 12);
    let (server, ops) = demo_server(|c| {
        c.metrics_max_connections_per_client = cap;
        c.metrics_header_timeout = Duration::from_secs(3600);
    })
    .await;
    let over = n - cap as usize;
    let closed = ClosedConnections::watch(unfinished_requests(n, ops, UNFINISHED).await);
    closed
        .at_least(over, CLOSE_WAIT, "the connections over the cap are closed")
        .await;
    assert_eq!(closed.count(), over, "only those over the cap");
    // A fresh request takes the place of the longest-idle one.
    assert_eq!(prompt_get(ops, "/healthz").await, 200);
    closed
        .at_least(over + 1, CLOSE_WAIT, "an unfinished request made room")
        .await;
    assert_eq!(prompt_list_flights(&server.url).await, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_flood_of_unfinished_metrics_requests_leaves_the_flight_port_its_descriptors() {
    // 256 descriptors: the Flight port may use 192, the metrics port 16.
    let ops = free_addr();
    let ops_arg = ops.to_string();
    let server = server_under_ulimit(
        256,
        &["--listen", "127.0.0.1:0", "--metrics-listen", &ops_arg],
    );
    let flood = unfinished_requests(300, ops, UNFINISHED).await;
    assert_eq!(prompt_list_flights(&server.url).await, 1);
    assert_eq!(prompt_get(ops, "/healthz").await, 200);
    let closed = ClosedConnections::watch(flood);
    closed
        .at_least(
            300 - 16,
            CLOSE_WAIT,
            "the flood beyond the metrics port's share is closed",
        )
        .await;
    assert_eq!(prompt_list_flights(&server.url).await, 1);
    drop(server);
}

#[tokio::test]
async fn a_request_whose_header_comes_too_slowly_is_closed() {
    let (server, ops) = demo_server(|c| c.metrics_header_timeout = Duration::from_secs(1)).await;
    // One sends nothing at all.
    let mut silent = bounded(TcpStream::connect(ops)).await.unwrap();
    // The other sends a header line every 200 ms, never the end.
    let mut slow = bounded(TcpStream::connect(ops)).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let mut buf = [0u8; 256];
    let mut closed = false;
    for _ in 0..50 {
        if slow.write_all(b"X-Slow: a\r\n").await.is_err() {
            closed = true;
            break;
        }
        let read = tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buf)).await;
        if matches!(read, Ok(Ok(0) | Err(_))) {
            closed = true;
            break;
        }
        assert!(read.is_err(), "no answer to a header that has not ended");
    }
    assert!(
        closed,
        "a header still coming after 10 s is closed (timeout 1 s)"
    );
    tokio::time::timeout(CLOSE_WAIT, until_closed(&mut silent))
        .await
        .expect("a connection that sends nothing is closed at the header timeout");
    assert_eq!(prompt_get(ops, "/healthz").await, 200);
    server.stop().await;
}

#[tokio::test]
async fn a_header_larger_than_the_bound_is_refused() {
    let (server, ops) = demo_server(|_| {}).await;
    let mut conn = bounded(TcpStream::connect(ops)).await.unwrap();
    let mut request =
        b"GET /healthz HTTP/1.1\r\nHost: big\r\nConnection: close\r\nX-Big: ".to_vec();
    request.extend(std::iter::repeat_n(b'a', 64 << 10));
    request.extend_from_slice(b"\r\n\r\n");
    let (mut read, mut write) = conn.split();
    let (_, answer) = tokio::join!(write.write_all(&request), async {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(CLOSE_WAIT, read.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "the connection is closed");
        answer
    });
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431 "),
        "refused with 431 or closed: {answer}"
    );
    assert_eq!(prompt_get(ops, "/healthz").await, 200);
    server.stop().await;
}

#[tokio::test]
async fn connections_holding_large_unfinished_headers_hold_little_memory() {
    let ops = free_addr();
    let ops_arg = ops.to_string();
    let server = ServerProcess::start(&["--listen", "127.0.0.1:0", "--metrics-listen", &ops_arg]);
    assert_eq!(prompt_get(ops, "/healthz").await, 200);
    let before = status_kib(server.pid(), "VmRSS:");
    // 300 connections of 380 KiB of header that never ends.
    let mut head = UNFINISHED.to_vec();
    head.extend_from_slice(b"X-Big: ");
    head.extend(std::iter::repeat_n(b'a', 380 << 10));
    let head = Arc::new(head);
    let mut senders = JoinSet::new();
    for _ in 0..300 {
        let head = Arc::clone(&head);
        senders.spawn(async move {
            let mut conn = TcpStream::connect(ops).await.ok()?;
            // Refused or closed part way: the server read no more.
            let sent = tokio::time::timeout(CLOSE_WAIT, conn.write_all(&head)).await;
            let _ = sent;
            Some(conn)
        });
    }
    let conns: Vec<_> = bounded(senders.join_all()).await;
    assert_eq!(prompt_list_flights(&server.url).await, 1);
    let after = status_kib(server.pid(), "VmRSS:");
    let grown_mib = after.saturating_sub(before) / 1024;
    println!(
        "300 unfinished 380 KiB headers: VmRSS {} MiB before, {} MiB after",
        before / 1024,
        after / 1024
    );
    assert!(
        grown_mib < 16,
        "VmRSS {} MiB before, {} MiB after: +{grown_mib} MiB",
        before / 1024,
        after / 1024
    );
    drop(conns);
    drop(server);
}
