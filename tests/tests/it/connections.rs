//! Connection hygiene on the Flight port: caps on the connections open per
//! client address and in total, and a deadline for a connection's first
//! bytes. A connection that never speaks, or only sends its preface and
//! answers pings, gives way to one that does; one with a call open or the
//! token is kept over those. The servers serve the in-memory demo table:
//! no SQS emulator is needed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use arrow_flight::FlightClient;
use futures::TryStreamExt;
use sqs_flight_server::Config;
use sqs_flight_tests::closed::{ClosedConnections, until_closed};
use sqs_flight_tests::h2raw::RawH2;
use sqs_flight_tests::server::TestServer;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use sqs_flight_tests::prelude::{STEP, bounded, poll};

const TOKEN: &str = "s3cret";
/// The address the clients that never speak connect from.
const IDLE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// The address of the client that speaks, when it is another one.
const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Long enough that no connection of a test is closed by the deadline.
const NO_DEADLINE: Duration = Duration::from_secs(3600);

/// A server of the demo table that needs [`TOKEN`], with `tweak` applied.
async fn demo_server(tweak: impl FnOnce(&mut Config)) -> TestServer {
    TestServer::in_memory("demo", 20, |c| {
        c.auth_token = Some(TOKEN.into());
        tweak(c);
    })
    .await
}

/// `n` TCP connections to `addr` from `from` that send nothing.
async fn silent_connections(n: usize, from: IpAddr, addr: SocketAddr) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        conns.push(bounded(socket.connect(addr)).await.expect("TCP connect"));
    }
    conns
}

/// `n` silent connections from [`IDLE`] to a server that keeps `cap` of
/// them, once those over the cap are closed: the count of the closed ones.
async fn past_the_cap(server: &TestServer, n: usize, cap: usize) -> ClosedConnections {
    let closed = ClosedConnections::watch(silent_connections(n, IDLE, server.addr).await);
    closed
        .at_least(n - cap, STEP, "the connections over the cap are closed")
        .await;
    closed
}

/// A Flight client with the token, connecting from `from`.
async fn client_from(server: &TestServer, from: IpAddr) -> FlightClient {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .local_address(Some(from))
        .connect_timeout(Duration::from_secs(5));
    let mut client = FlightClient::new(bounded(endpoint.connect()).await.expect("connect"));
    client
        .add_header("authorization", &format!("Bearer {TOKEN}"))
        .unwrap();
    client
}

/// The tables ListFlights names.
async fn list_flights(client: &mut FlightClient) -> usize {
    let stream = bounded(client.list_flights("")).await.expect("ListFlights");
    let infos: Vec<_> = bounded(stream.try_collect()).await.expect("its answer");
    infos.len()
}

#[tokio::test]
async fn silent_connections_over_the_per_client_cap_are_closed_and_list_flights_still_works() {
    let (cap, n) = (8, 20);
    let server = demo_server(|c| {
        c.max_connections_per_client = cap;
        c.preface_timeout = NO_DEADLINE;
    })
    .await;
    let over = n - cap as usize;
    let closed = past_the_cap(&server, n, cap as usize).await;
    // Another address is not held back by them...
    assert_eq!(
        list_flights(&mut client_from(&server, OTHER).await).await,
        1
    );
    assert_eq!(closed.count(), over, "only those over the cap");
    // ...nor is theirs: a connection that speaks takes the place of the
    // oldest one that never did.
    assert_eq!(list_flights(&mut client_from(&server, IDLE).await).await, 1);
    closed
        .at_least(over + 1, STEP, "a silent connection made room")
        .await;
    server.stop().await;
}

#[tokio::test]
async fn silent_connections_over_the_global_cap_give_way_to_a_client_that_speaks() {
    let (cap, n) = (6, 15);
    let server = demo_server(|c| {
        c.max_connections = cap;
        c.preface_timeout = NO_DEADLINE;
    })
    .await;
    let over = n - cap as usize;
    let closed = past_the_cap(&server, n, cap as usize).await;
    assert_eq!(
        list_flights(&mut client_from(&server, OTHER).await).await,
        1
    );
    closed
        .at_least(over + 1, STEP, "a silent connection made room")
        .await;
    server.stop().await;
}

#[tokio::test]
async fn a_connection_that_never_sends_its_preface_is_closed_after_the_deadline() {
    let server = demo_server(|c| c.preface_timeout = Duration::from_secs(1)).await;
    let mut conns = silent_connections(2, OTHER, server.addr).await;
    // One sends nothing, the other only part of the HTTP/2 preface.
    conns[1].write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    for conn in &mut conns {
        bounded(until_closed(conn)).await;
    }
    let mut client = client_from(&server, OTHER).await;
    assert_eq!(list_flights(&mut client).await, 1);
    server.stop().await;
}

/// `n` raw HTTP/2 connections from `from`, each served (the server sent
/// its SETTINGS): they sent the preface and answer pings, and make no call.
async fn served_connections(n: usize, from: IpAddr, addr: SocketAddr) -> Vec<RawH2> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut conn = bounded(RawH2::connect(from, addr)).await.expect("connect");
        bounded(conn.served()).await;
        conns.push(conn);
    }
    conns
}

/// Waits (up to [`STEP`]) until one of `conns` is closed; its index.
async fn one_closed(conns: &[RawH2]) -> usize {
    let closed = poll(
        STEP,
        async || conns.iter().position(RawH2::is_closed),
        Option::is_some,
    );
    let closed = closed.await.expect("a connection made room");
    closed.expect("checked by the poll")
}

#[tokio::test]
async fn connections_that_sent_their_preface_and_make_no_call_give_way_to_a_client_that_calls() {
    // The default deployment: no token, every client on 127.0.0.1.
    let cap = 8;
    let server = demo_server(|c| {
        c.auth_token = None;
        c.max_connections_per_client = cap;
    })
    .await;
    let conns = served_connections(cap as usize, OTHER, server.addr).await;
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        list_flights(&mut client_from(&server, OTHER).await).await
    });
    assert_eq!(
        answered.await.expect("a new client is answered promptly"),
        1
    );
    assert_eq!(
        one_closed(&conns).await,
        0,
        "the one idle for the longest time gave way"
    );
    assert_eq!(
        conns.iter().filter(|c| c.is_closed()).count(),
        1,
        "one connection made room for the new client's one"
    );
    drop(conns);
    server.stop().await;
}

#[tokio::test]
async fn connections_with_a_call_open_or_the_token_are_kept_over_idle_unauthenticated_ones() {
    let cap = 3;
    let server = demo_server(|c| {
        c.max_connections_per_client = cap;
        c.preface_timeout = NO_DEADLINE;
    })
    .await;
    const LIST_ACTIONS: &str = "/arrow.flight.protocol.FlightService/ListActions";
    // The oldest: a client that made a call with the token, now idle.
    let mut conns = served_connections(1, OTHER, server.addr).await;
    let call = conns[0].open_call(LIST_ACTIONS, Some(TOKEN)).await;
    conns[0].send_empty_message(call).await;
    bounded(conns[0].until(|s| s.streams.get(&call).is_some_and(|st| st.ended))).await;
    // Then one with a health Watch stream open (no token needed)...
    conns.extend(served_connections(1, OTHER, server.addr).await);
    let watch = conns[1]
        .open_call("/grpc.health.v1.Health/Watch", None)
        .await;
    conns[1].send_empty_message(watch).await;
    bounded(conns[1].until(|s| s.streams.get(&watch).is_some_and(|st| st.headers))).await;
    // ...and one that sent its preface and nothing else, the newest.
    conns.extend(served_connections(1, OTHER, server.addr).await);
    // A new connection gives it way.
    let newcomer = served_connections(1, OTHER, server.addr).await;
    assert_eq!(
        one_closed(&conns).await,
        2,
        "the idle unauthenticated connection gave way, not the older ones"
    );
    assert!(!newcomer[0].is_closed());
    drop((conns, newcomer));
    server.stop().await;
}
