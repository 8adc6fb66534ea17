//! `--idle-exit`: the real server binary exits by itself once no
//! authenticated RPC came for the period and no stream is open, but never
//! while authenticated calls keep coming, a stream (Flight SQL's included)
//! is open, or a consumer holds uncommitted batches within its lease; calls
//! without the token do not keep it.
//!
//! Bounds are generous: the idle periods are several seconds, so that a
//! loaded machine's pauses do not make a server exit before a test's first
//! call, and the watches that a server stays last more than the period.

use std::time::Duration;

use arrow_flight::FlightClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use serde_json::json;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::ServerProcess;
use tokio_util::sync::CancellationToken;

use sqs_flight_tests::prelude::{
    action_on, bounded, connect, plan_on, poll, read_on, server_process_on_moto, status, tickets,
};

/// Bound of every wait for an exit (not a timing assertion).
const EXIT_BOUND: Duration = Duration::from_secs(60);
/// The --idle-exit period of most tests, in seconds.
const IDLE: &str = "5";
/// How long a server that must stay is watched: more than two periods.
const STAYS_FOR: Duration = Duration::from_secs(12);
/// The bearer token of the servers that check one.
const TOKEN: &str = "idle-s3cret";

fn start(queue_url: &str, idle: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--idle-exit", idle];
    args.extend_from_slice(extra);
    server_process_on_moto(queue_url, &args)
}

/// A server with a token, on a fresh empty queue.
async fn start_with_token(idle: &str, extra: &[&str]) -> ServerProcess {
    let sqs = moto().client().await;
    let queue_url = moto::create_queue(&sqs, "idle-auth", &[]).await;
    let mut args = vec!["--auth-token", TOKEN];
    args.extend_from_slice(extra);
    start(&queue_url, idle, &args)
}

/// A Flight client that sends `header` as `authorization`, if any.
async fn client_with(url: &str, header: Option<&str>) -> FlightClient {
    let mut flight = connect(url).await;
    if let Some(h) = header {
        flight.add_header("authorization", h).expect("ASCII header");
    }
    flight
}

/// Plans batch 1 of consumer `c` (one partition, one receiver: moto) and
/// reads it; the rows read.
async fn read_batch_one(url: &str) -> usize {
    let mut flight = connect(url).await;
    let cmd = json!({"table": "t", "consumer": "c", "batch": 1, "partitions": 1,
        "receivers": 1, "max_wait_ms": 500});
    let info = plan_on(&mut flight, &cmd).await.expect("plan");
    let mut rows = 0;
    for t in tickets(&info) {
        let batches = read_on(&mut flight, &t).await.expect("DoGet");
        rows += batches.iter().map(|b| b.num_rows()).sum::<usize>();
    }
    rows
}

/// Panics if `server` has exited.
fn assert_alive(server: &mut ServerProcess, why: &str) {
    if let Some(status) = server.exited() {
        panic!("the server exited ({status}) {why}:\n{}", server.log());
    }
}

/// Watches `server` for `period` (without blocking the runtime): panics if
/// it exits.
async fn assert_stays(server: &mut ServerProcess, period: Duration, why: &str) {
    let exited = poll(period, async || server.exited(), Option::is_some).await;
    if let Ok(Some(status)) = exited {
        panic!("the server exited ({status}) {why}:\n{}", server.log());
    }
}

/// Waits (off the runtime) for `server` to exit with status 0.
async fn assert_exits_cleanly(server: ServerProcess, why: &str) {
    let status = tokio::task::spawn_blocking(move || server.wait_exit(EXIT_BOUND))
        .await
        .expect("the wait ran");
    let status = status.unwrap_or_else(|| panic!("it did not exit within {EXIT_BOUND:?} {why}"));
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_stays_for_its_period_then_exits_with_status_0() {
    let sqs = moto().client().await;
    let queue_url = moto::create_queue(&sqs, "idle", &[]).await;
    let mut server = start(&queue_url, IDLE, &[]);
    // Half the period from when it said it listens: it cannot be due yet.
    assert_stays(
        &mut server,
        Duration::from_millis(2500),
        "before its idle period",
    )
    .await;
    assert_exits_cleanly(server, "once idle").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_calls_keep_it_up_past_the_period() {
    let mut server = start_with_token("4", &[]).await;
    let mut flight = client_with(&server.url, Some(&format!("Bearer {TOKEN}"))).await;
    let until = tokio::time::Instant::now() + STAYS_FOR;
    while tokio::time::Instant::now() < until {
        assert_alive(&mut server, "while authenticated calls came every 500 ms");
        let actions = bounded(flight.list_actions()).await.expect("ListActions");
        let _: Vec<_> = bounded(actions.try_collect()).await.expect("the actions");
        // Pacing, not a wait: a call every 500 ms is what must keep it up.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(flight);
    assert_exits_cleanly(server, "once the calls stopped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_token_do_not_keep_it_up() {
    let server = start_with_token("3", &[]).await;
    let stop = CancellationToken::new();
    let refused = tokio::spawn(knock_without_the_token(server.url.clone(), stop.clone()));
    assert_exits_cleanly(server, "while only calls without the token came").await;
    stop.cancel();
    let refused = refused.await.expect("the caller ran");
    assert!(refused >= 3, "calls without the token were made: {refused}");
}

/// Calls without the token, a wrong one, and a Handshake with a wrong
/// payload, every 200 ms until `stop` or the server goes away; how many
/// were refused as UNAUTHENTICATED.
async fn knock_without_the_token(url: String, stop: CancellationToken) -> usize {
    let mut none = client_with(&url, None).await;
    let mut wrong = client_with(&url, Some("Bearer wrong")).await;
    let mut refused = 0;
    while !stop.is_cancelled() {
        let calls = [
            none.list_actions().await.map(drop),
            wrong.list_actions().await.map(drop),
            none.handshake("not-the-token").await.map(drop),
        ];
        for result in calls {
            match result.map_err(status) {
                Err(s) if s.code() == tonic::Code::Unauthenticated => refused += 1,
                Err(_) => return refused, // the server has gone
                Ok(()) => panic!("a call without the token was served"),
            }
        }
        // Pacing, not a wait: refused calls keep coming all along.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_flight_sql_stream_holds_it_past_the_period() {
    // The grace period of 1 s would cut the stream soon after an exit.
    let mut server = start_with_token("3", &["--shutdown-grace", "1"]).await;
    let channel = tonic::transport::Endpoint::from_shared(server.url.replace("grpc://", "http://"))
        .expect("a valid URL")
        .connect()
        .await
        .expect("connect");
    let mut sql = FlightSqlServiceClient::new(channel);
    sql.set_header("authorization", format!("Bearer {TOKEN}"));
    // 30 rows of 1 MB: far more than the HTTP/2 windows hold, so the
    // server's stream stays open while the client does not read.
    let rows = (1..=30).map(|n| format!("({n})")).collect::<Vec<_>>();
    let query = format!(
        "SELECT n, repeat('x', 1000000) AS s FROM (VALUES {}) AS v(n)",
        rows.join(",")
    );
    let info = bounded(sql.execute(query, None)).await.expect("execute");
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    let mut stream = bounded(sql.do_get(ticket)).await.expect("DoGet");
    let first = bounded(stream.try_next()).await.expect("a first batch");
    let mut read = first.map_or(0, |b| b.num_rows());
    assert_stays(
        &mut server,
        Duration::from_secs(10),
        "while a Flight SQL stream was open",
    )
    .await;
    while let Some(batch) = bounded(stream.try_next())
        .await
        .expect("the rest of the stream")
    {
        assert_eq!(batch.column(1).len(), batch.num_rows());
        read += batch.num_rows();
    }
    assert_eq!(read, 30, "the whole result came");
    drop(stream);
    drop(sql);
    let mut flight = client_with(&server.url, Some(&format!("Bearer {TOKEN}"))).await;
    bounded(flight.list_actions())
        .await
        .map(drop)
        .expect("a new call is served after the stream");
    drop(flight);
    assert_exits_cleanly(server, "once the stream had ended").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_stays_while_a_batch_is_uncommitted_and_exits_after_the_commit() {
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "idle-held", 5).await;
    let mut server = start(&queue_url, IDLE, &[]);
    assert_eq!(read_batch_one(&server.url).await, 5);
    assert_stays(
        &mut server,
        STAYS_FOR,
        "while consumer c held batch 1 uncommitted",
    )
    .await;
    let mut flight = connect(&server.url).await;
    let out = action_on(
        &mut flight,
        "commit",
        &json!({"table": "t", "consumer": "c", "batch": 1}),
    )
    .await
    .expect("commit");
    assert_eq!(out["deleted"], 5, "{out}");
    drop(flight);
    assert_exits_cleanly(server, "after the commit").await;
    assert_eq!(moto::queue_counts(&sqs, &queue_url).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_lease_ran_out_no_longer_keeps_it() {
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "idle-lease", 3).await;
    let server = start(&queue_url, IDLE, &["--consumer-lease", "2"]);
    assert_eq!(read_batch_one(&server.url).await, 3);
    // The lease runs out 2 s after the last call: the batch is released
    // (its messages visible again) and the server may go.
    assert_exits_cleanly(server, "once the lease ran out").await;
    assert_eq!(moto::queue_counts(&sqs, &queue_url).await, (3, 0));
}
