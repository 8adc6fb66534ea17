//! Flight SQL within its limits: a query that would run for hours runs on
//! threads of its own, so the queue work (ListActions, a DoGet of a queue
//! table, a commit) answers while it runs; it ends with DEADLINE_EXCEEDED
//! at `--sql-query-timeout`, or RESOURCE_EXHAUSTED past
//! `--sql-memory-limit`, and stops when its client goes away; the server
//! answers the next query; SIGTERM stops the real binary within its grace
//! period whatever a query does.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use serde_json::json;
use sqs_flight_tests::server_process::ServerProcess;
use tonic::Code;

use sqs_flight_tests::flight_sql::{code, fetch, sql_client, ticket};
use sqs_flight_tests::http::{get, metric};
use sqs_flight_tests::prelude::*;

/// Bound on one call of the queue surface while a heavy query runs (the
/// machine is shared; the calls took well under a second when measured).
const CALL_BOUND: Duration = Duration::from_secs(5);
/// Bound on a state change the test waits for (the gauge, an exit).
const WAIT_BOUND: Duration = Duration::from_secs(30);

/// `(VALUES (0), (1), ... (n-1))`.
fn values(n: usize) -> String {
    let rows: Vec<String> = (0..n).map(|i| format!("({i})")).collect();
    format!("(VALUES {})", rows.join(", "))
}

/// A sum over the cross join of four 1,000-row lists: 10^12 rows, hours of
/// CPU, little memory.
fn endless_query() -> String {
    let v = values(1000);
    format!(
        "SELECT sum(a.column1 + b.column1 + c.column1 + d.column1) AS s \
         FROM {v} a, {v} b, {v} c, {v} d"
    )
}

/// Waits (bounded) until `sqsf_sql_queries_running` is `want`.
async fn wait_running(ops: SocketAddr, want: f64) {
    let running = async || metric(&get(ops, "/metrics").await.1, "sqsf_sql_queries_running");
    let now = poll(WAIT_BOUND, running, |now| *now == Some(want)).await;
    assert_eq!(now, Ok(Some(want)), "sql_queries_running");
}

/// A server on a moto queue of `n` messages with SQL limits set by `sql`,
/// and its metrics address.
async fn serve(
    n: usize,
    sql: impl FnOnce(&mut sqs_flight_server::config::sql::SqlConfig),
) -> (Fixture, SocketAddr) {
    Fixture::metered(n, "sql-limits", |c| sql(&mut c.sql)).await
}

/// Times `call`, asserting it answers within [`CALL_BOUND`].
async fn timed<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    let begun = Instant::now();
    let out = tokio::time::timeout(CALL_BOUND, call)
        .await
        .unwrap_or_else(|_| panic!("{what} got no answer within {CALL_BOUND:?} during the query"));
    eprintln!(
        "during the heavy query: {what} answered in {:?}",
        begun.elapsed()
    );
    out
}

/// `SELECT count(*) FROM t`, to show the server answers the next query.
async fn count_rows(url: &str) -> i64 {
    let mut sql = sql_client(url).await;
    let info = bounded(sql.execute("SELECT count(*) FROM t".into(), None))
        .await
        .unwrap();
    let (_, batches) = fetch(&mut sql, &info).await.unwrap();
    let n = batches[0].column(0);
    arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(n.as_ref()).value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_query_ends_at_its_time_limit_while_the_queue_work_answers() {
    let limit = Duration::from_secs(8);
    let (mut f, ops) = serve(3, |s| s.query_timeout = limit).await;
    let mut sql = sql_client(&f.server.url).await;
    let info = bounded(sql.execute(endless_query(), None)).await.unwrap();
    let begun = Instant::now();
    let heavy = tokio::spawn(async move { fetch(&mut sql, &info).await.map(|_| ()) });
    wait_running(ops, 1.0).await;

    let actions = timed("ListActions", async {
        f.flight
            .list_actions()
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
    })
    .await;
    assert!(!actions.unwrap().is_empty());
    let cmd = json!({"table": "t", "consumer": "c", "batch": 1, "partitions": 1,
        "max_wait_ms": 300});
    let info = timed("GetFlightInfo", f.plan(cmd)).await.unwrap();
    let rows = timed("DoGet of the queue table", f.read_all(&info)).await;
    assert_eq!(bodies(&rows).len(), 3);
    let committed = timed("commit", f.commit("c", 1)).await;
    assert_eq!(committed["deleted"], 3, "{committed}");
    assert!(
        begun.elapsed() < limit,
        "the calls above ran while the query did ({:?})",
        begun.elapsed()
    );

    let ended = bounded(heavy).await.unwrap().unwrap_err();
    let took = begun.elapsed();
    let (got, message) = code(ended);
    assert_eq!(got, Code::DeadlineExceeded, "{message}");
    assert!(
        message.contains("--sql-query-timeout") && message.contains("8 s"),
        "{message}"
    );
    assert!(
        took < limit + Duration::from_secs(20),
        "ended after {took:?}"
    );
    eprintln!("the endless query ended after {took:?} (limit {limit:?})");
    wait_running(ops, 0.0).await;
    assert_eq!(count_rows(&f.server.url).await, 0, "the next query answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_the_memory_limit_is_refused_and_the_next_query_answers() {
    let (f, ops) = serve(2, |s| s.memory_limit = 4 << 20).await;
    let mut sql = sql_client(&f.server.url).await;
    let v = values(1000);
    let q = format!("SELECT a.column1 * 1000 + b.column1 AS n FROM {v} a, {v} b ORDER BY n DESC");
    let result = match bounded(sql.execute(q, None)).await {
        Ok(info) => fetch(&mut sql, &info).await.map(|_| ()),
        Err(e) => Err(e),
    };
    let (got, message) = code(result.unwrap_err());
    assert_eq!(got, Code::ResourceExhausted, "{message}");
    assert!(
        message.contains("--sql-memory-limit") && message.contains("4.0 MiB"),
        "{message}"
    );
    wait_running(ops, 0.0).await;
    assert_eq!(count_rows(&f.server.url).await, 2, "the next query answers");
    assert_eq!(f.counts().await, (2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_query_stops_when_its_client_goes_away() {
    let (f, ops) = serve(0, |s| s.query_timeout = Duration::from_secs(3600)).await;
    let mut sql = sql_client(&f.server.url).await;
    let info = bounded(sql.execute(endless_query(), None)).await.unwrap();
    let stream = bounded(sql.do_get(ticket(&info))).await.unwrap();
    wait_running(ops, 1.0).await;
    drop(stream);
    drop(sql);
    // Counted until the query's task is dropped: it no longer runs.
    wait_running(ops, 0.0).await;
    assert_eq!(count_rows(&f.server.url).await, 0, "the next query answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_past_the_cap_are_refused_until_one_ends() {
    let (mut f, ops) = serve(0, |s| {
        s.query_timeout = Duration::from_secs(3600);
        s.max_statements = 1;
    })
    .await;
    let mut sql = sql_client(&f.server.url).await;
    let info = bounded(sql.execute(endless_query(), None)).await.unwrap();
    let stream = bounded(sql.do_get(ticket(&info))).await.unwrap();
    wait_running(ops, 1.0).await;

    // Planning is a statement too: its worker would be the second.
    let mut other = sql_client(&f.server.url).await;
    let refused = bounded(other.execute("SELECT 1".into(), None)).await;
    let (got, message) = code(refused.map(|_| ()).unwrap_err());
    assert_eq!(got, Code::ResourceExhausted, "{message}");
    assert!(
        message.contains("--sql-max-statements") && message.contains("1 Flight SQL statements"),
        "{message}"
    );
    let listed = bounded(f.flight.list_actions()).await;
    assert!(
        listed.is_ok(),
        "the plain Flight surface answers at the cap"
    );

    drop(stream);
    drop(sql);
    wait_running(ops, 0.0).await;
    assert_eq!(count_rows(&f.server.url).await, 0, "a slot is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_within_its_grace_period_during_an_endless_query() {
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--shutdown-grace",
        "2",
        "--sql-query-timeout",
        "3600",
    ];
    let server = ServerProcess::start(&args);
    let mut sql = sql_client(&server.url).await;
    let info = bounded(sql.execute(endless_query(), None)).await.unwrap();
    // The DoGet answers once the query runs (its first batch is hours away).
    let mut stream = bounded(sql.do_get(ticket(&info))).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(1), stream.try_next()).await;
    assert!(first.is_err(), "the query was still running: {first:?}");
    let signalled = Instant::now();
    server.signal(libc::SIGTERM);
    let exited = server.wait_exit(WAIT_BOUND);
    let took = signalled.elapsed();
    assert!(exited.is_some(), "still running {took:?} after SIGTERM");
    // 2 s of grace, 1 s for cut streams, the rest slack for a loaded machine.
    assert!(took < Duration::from_secs(15), "stopped after {took:?}");
    eprintln!("SIGTERM during an endless query: exited after {took:?} ({exited:?})");
    drop(stream);
}
