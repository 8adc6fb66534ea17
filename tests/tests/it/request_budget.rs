//! `max_buffered_request_bytes`: request messages begun and never finished
//! hold at most that much, whoever sends them; past it a message is refused
//! with RESOURCE_EXHAUSTED and the server goes on serving.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use sqs_flight_tests::server::TestServer;

use sqs_flight_tests::prelude::{action_on, bounded, poll};

const MIB: u64 = 1 << 20;
/// Bytes each unfinished message sends: 3.5 MiB.
const PART: usize = 7 << 19;

/// An HTTP/2 connection of its own, whose socket is shut down when it is
/// dropped (hyper keeps a connection open while a request body is unsent).
struct Conn {
    sender: http2::SendRequest<PartialBody>,
    socket: std::net::TcpStream,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

async fn connect(addr: SocketAddr) -> Conn {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tcp = tcp.into_std().expect("a std socket");
    let socket = tcp.try_clone().expect("a second handle");
    let tcp = tokio::net::TcpStream::from_std(tcp).expect("a tokio socket");
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    Conn { sender, socket }
}

type PartialBody =
    StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// A DoPut body that says its message is `declared` bytes long, sends
/// `sent` of them, and then neither finishes nor ends.
fn partial_message(declared: u32, sent: usize) -> PartialBody {
    let first = futures::stream::iter([Ok(Frame::data(message(declared, sent)))]);
    StreamBody::new(first.chain(futures::stream::pending()).boxed())
}

/// A DoPut body of one whole message of `len` bytes that are no FlightData.
fn whole_message(len: u32) -> PartialBody {
    let data = message(len, len as usize);
    StreamBody::new(futures::stream::iter([Ok(Frame::data(data))]).boxed())
}

fn message(declared: u32, sent: usize) -> Bytes {
    let mut data = vec![0u8];
    data.extend_from_slice(&declared.to_be_bytes());
    data.resize(5 + sent, 0x2a);
    Bytes::from(data)
}

/// The gRPC status code a whole message of `len` bytes gets on a
/// connection of its own.
async fn code_of_whole(addr: SocketAddr, len: u32) -> String {
    let mut conn = connect(addr).await;
    let answer = bounded(start_put(&mut conn, addr, whole_message(len)))
        .await
        .expect("the task")
        .expect("an answer with a gRPC status");
    answer.split(' ').next().unwrap_or_default().to_string()
}

/// Starts a DoPut whose one message never finishes; the answer (the
/// refusal, for a message over the budget) when it comes.
fn start_put(
    conn: &mut Conn,
    addr: SocketAddr,
    body: PartialBody,
) -> tokio::task::JoinHandle<Option<String>> {
    let request = hyper::Request::post(format!(
        "http://{addr}/arrow.flight.protocol.FlightService/DoPut"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(body)
    .expect("a request");
    let answer = conn.sender.send_request(request);
    tokio::spawn(async move {
        let response = answer.await.ok()?;
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap_or("").to_string())
        };
        Some(format!(
            "{} {}",
            header("grpc-status")?,
            header("grpc-message").unwrap_or_default()
        ))
    })
}

#[tokio::test]
async fn unfinished_messages_hold_at_most_the_budget_and_the_server_serves_on() {
    let s = TestServer::in_memory("q", 0, |c| {
        c.max_request_bytes = 4 * MIB;
        c.max_buffered_request_bytes = 8 * MIB;
    })
    .await;

    // Three unfinished messages of 3.5 MiB: any two fit in the 8 MiB, the
    // three do not. Whichever comes last is refused; the others wait.
    let mut conns = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let mut conn = connect(s.addr).await;
        answers.push(start_put(
            &mut conn,
            s.addr,
            partial_message(4_000_000, PART),
        ));
        conns.push(conn);
    }
    let (first, _, waiting) = bounded(futures::future::select_all(answers)).await;
    let answer = first
        .expect("the task")
        .expect("an answer with a gRPC status");
    assert!(
        answer.starts_with("8 ") && answer.contains("max_buffered_request_bytes"),
        "RESOURCE_EXHAUSTED naming the limit, got {answer:?}"
    );
    for answer in &waiting {
        assert!(
            !answer.is_finished(),
            "the held messages wait for their end"
        );
    }

    let mut flight = s.client().await;
    let status = action_on(&mut flight, "status", &json!({"table": "q"}))
        .await
        .expect("the server answers at the budget");
    assert_eq!(status["tables"]["q"]["approximate_depth"], 0);

    // A whole message of 3.5 MiB is refused too while they hold the budget
    // (the refusal came with more than 4.5 MiB held by the others)...
    assert_eq!(code_of_whole(s.addr, PART as u32).await, "8");
    // ...and, their clients gone, passes the budget (to be refused as no
    // FlightData, INVALID_ARGUMENT or INTERNAL, but not for the budget).
    drop((conns, waiting));
    let within = std::time::Duration::from_secs(5);
    let code = poll(
        within,
        async || code_of_whole(s.addr, PART as u32).await,
        |c| c != "8",
    );
    assert!(
        code.await.is_ok(),
        "the bytes of the dropped calls were not freed"
    );
    bounded(s.stop()).await;
}
