//! SQL cannot end the process that holds the receipts: statements that
//! exhaust memory outside DataFusion's pool (a `repeat` of 10^14
//! characters), overflow a stack (deep nesting), make rows without end
//! (`WITH RECURSIVE`), or multiply peeks into gigabytes each answer
//! RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED or INVALID_ARGUMENT naming the
//! limit, while the real server binary keeps its pid, answers an
//! authenticated ListFlights and the next query, and leaves no message in
//! flight. A worker killed in the middle of its peek has the peek released
//! at once.

use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_flight::FlightClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;

use sqs_flight_tests::flight_sql::{code, fetch, ticket};
use sqs_flight_tests::prelude::*;

const TOKEN: &str = "bomb-squad";
/// Messages in the queue.
const MESSAGES: usize = 3;

/// The real server on a queue of [`MESSAGES`] messages, with a token, a
/// 64 MiB pool per query and `timeout` seconds per statement.
async fn serve(name: &str, timeout: &str) -> (ServerProcess, aws_sdk_sqs::Client, String) {
    let sqs = moto().client().await;
    let url = moto::queue_holding(&sqs, name, MESSAGES).await;
    let args = [
        "--auth-token",
        TOKEN,
        "--sql-memory-limit",
        "64MiB",
        "--sql-query-timeout",
        timeout,
    ];
    (server_process_on_moto(&url, &args), sqs, url)
}

async fn sql_client(url: &str) -> FlightSqlServiceClient<Channel> {
    let mut sql = sqs_flight_tests::flight_sql::sql_client(url).await;
    sql.set_header("authorization", format!("Bearer {TOKEN}"));
    sql
}

/// Runs `query` to its end: the rows, or the status it failed with.
async fn run(url: &str, query: String) -> Result<usize, (Code, String)> {
    let mut sql = sql_client(url).await;
    let info = bounded(sql.execute(query, None)).await.map_err(code)?;
    let (_, batches) = fetch(&mut sql, &info).await.map_err(code)?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// The server is the same process, answers an authenticated ListFlights
/// and counts every message of the table, none left in flight.
async fn assert_alive(server: &mut ServerProcess, pid: u32, sqs: &aws_sdk_sqs::Client, url: &str) {
    assert!(
        server.exited().is_none(),
        "the server exited:\n{}",
        server.log()
    );
    assert_eq!(server.pid(), pid);
    let mut flight: FlightClient = connect(&server.url).await;
    flight
        .add_header("authorization", &format!("Bearer {TOKEN}"))
        .expect("ASCII header");
    let flights: Vec<_> = bounded(async { flight.list_flights(vec![]).await?.try_collect().await })
        .await
        .expect("ListFlights answers");
    assert_eq!(flights.len(), 1, "{flights:?}");
    let mut sql = sql_client(&server.url).await;
    let info = bounded(sql.execute("SELECT count(DISTINCT message_id) FROM t".into(), None))
        .await
        .expect("the next query plans");
    let (_, batches) = fetch(&mut sql, &info).await.expect("the next query runs");
    let n = batches[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(n, MESSAGES as i64, "the next query sees every message");
    assert_eq!(moto::queue_counts(sqs, url).await, (MESSAGES as i64, 0));
}

/// `(VALUES (0), ... (n-1))`.
fn values(n: usize) -> String {
    let rows: Vec<String> = (0..n).map(|i| format!("({i})")).collect();
    format!("(VALUES {})", rows.join(", "))
}

/// The bombs: each statement and the statuses it may end with.
fn bombs() -> Vec<(&'static str, String, &'static [Code])> {
    let exhausted: &[Code] = &[Code::ResourceExhausted];
    let nested = format!("SELECT {}1{}", "(".repeat(100_000), ")".repeat(100_000));
    let terms = format!(
        "SELECT {}",
        std::iter::repeat_n("1", 200_000)
            .collect::<Vec<_>>()
            .join("+")
    );
    let in_list: Vec<String> = (0..200_000).map(|i| format!("'b{i}'")).collect();
    let v = values(1000);
    vec![
        (
            "repeat folded to 10^14 characters",
            "SELECT length(repeat(arrow_cast('x','LargeUtf8'), 100000000000000))".into(),
            exhausted,
        ),
        (
            "lpad of 2*10^9 over the peeked rows",
            "SELECT length(lpad(body, 2000000000)) FROM t".into(),
            exhausted,
        ),
        (
            "100,000 nested parentheses",
            nested,
            &[Code::InvalidArgument, Code::ResourceExhausted],
        ),
        (
            "1+1+... of 200,000 terms",
            terms,
            &[Code::InvalidArgument, Code::ResourceExhausted],
        ),
        (
            "an unbounded WITH RECURSIVE",
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) \
             SELECT count(*) FROM r"
                .into(),
            &[Code::InvalidArgument],
        ),
        (
            "array_repeat of 10^12",
            "SELECT cardinality(array_repeat(1, 1000000000000))".into(),
            &[Code::InvalidArgument],
        ),
        (
            "an IN list of 200,000 strings over values repeated",
            format!(
                "SELECT count(*) FROM t, {v} v WHERE repeat(body, 100000000) IN ({})",
                in_list.join(",")
            ),
            // Within the worker's memory on a quiet machine: it may finish.
            &[Code::Ok, Code::ResourceExhausted, Code::DeadlineExceeded],
        ),
        (
            "string_agg over a cross join of the peek",
            format!(
                "SELECT length(string_agg(repeat(a.body, 1000000), ',')) \
                 FROM t a, {v} b"
            ),
            &[Code::ResourceExhausted, Code::DeadlineExceeded],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_of_the_bomb_list_ends_the_server() {
    let (mut server, sqs, url) = serve("sql-bombs", "30").await;
    let pid = server.pid();
    assert_alive(&mut server, pid, &sqs, &url).await;
    for (what, query, allowed) in bombs() {
        let outcome = run(&server.url, query).await;
        eprintln!("{what}: {outcome:?}");
        let (got, message) = match outcome {
            Ok(_) => (Code::Ok, String::new()),
            Err(e) => e,
        };
        assert!(allowed.contains(&got), "{what}: {got:?} {message}");
        if got != Code::InvalidArgument && got != Code::Ok {
            assert!(
                message.contains("--sql-memory-limit") || message.contains("--sql-query-timeout"),
                "{what}: the message names the limit: {message}"
            );
        }
        assert_alive(&mut server, pid, &sqs, &url).await;
    }
}

/// The pids of the processes `pid` started (every thread's children).
fn children(pid: u32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_during_its_peek_has_the_peek_released_at_once() {
    let (mut server, sqs, url) = serve("sql-killed", "120").await;
    let pid = server.pid();
    let mut sql = sql_client(&server.url).await;
    // Asks for more messages than the queue has: the peek waits 20 s for
    // them, holding the three it has in flight.
    let query = "SELECT count(*) FROM peek('t', 100, 1, 20000)".to_string();
    let info = bounded(sql.execute(query, None)).await.expect("plans");
    let running = tokio::spawn(async move { sql.do_get(ticket(&info)).await.map(|_| ()) });
    poll(
        STEP,
        async || moto::queue_counts(&sqs, &url).await == (0, MESSAGES as i64),
        |&ok| ok,
    )
    .await
    .expect("the peek holds every message");
    let workers = children(pid);
    assert_eq!(
        workers.len(),
        1,
        "one worker runs the statement: {workers:?}"
    );
    // SAFETY: a signal to the worker process this test's server started.
    unsafe { libc::kill(workers[0], libc::SIGKILL) };
    let ended = bounded(running).await.expect("joined").unwrap_err();
    let (got, message) = code(ended);
    assert_eq!(got, Code::ResourceExhausted, "{message}");
    assert!(message.contains("signal 9"), "{message}");
    // Long before the peek's 20 s wait would have ended by itself.
    let released = poll(
        Duration::from_secs(10),
        async || moto::queue_counts(&sqs, &url).await,
        |c| *c == (MESSAGES as i64, 0),
    )
    .await;
    assert!(
        released.is_ok(),
        "the killed worker's peek was not released: {released:?}"
    );
    assert_alive(&mut server, pid, &sqs, &url).await;
}
