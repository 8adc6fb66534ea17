//! The `sqs-flight` binary against the server and moto: what it prints,
//! what it leaves in the queue, and its exit statuses.

use serde_json::{Value, json};
use sqs_flight_tests::moto;

use sqs_flight_tests::cli::{demo_server, run_cli, sqs_flight};
use sqs_flight_tests::prelude::*;

/// The flags that make batches small and quick on moto. One partition and
/// one receiver: moto can hand one message to two concurrent receives,
/// which would show as a duplicate that real SQS (almost) never produces.
const SMALL: [&str; 8] = [
    "--partitions",
    "1",
    "--receivers",
    "1",
    "--max-messages",
    "8",
    "--max-wait-ms",
    "300",
];

fn args<'a>(f: &'a Fixture, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--url", f.server.url.as_str()];
    v.extend_from_slice(rest);
    v
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

fn expected(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i}")).collect()
}

#[tokio::test]
async fn tail_commit_prints_each_message_once_and_empties_the_queue() {
    let f = Fixture::standard(18).await;
    let mut a = args(&f, &["tail", "t", "--commit", "--format", "jsonl"]);
    a.extend(SMALL);
    let run = sqs_flight(&a).await;
    run.expect_code(0);
    let rows = json_lines(&run.stdout);
    let got: Vec<String> = rows
        .iter()
        .map(|r| r["body"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        sorted(got),
        sorted(expected(18)),
        "each message once: {run:#?}"
    );
    assert!(rows[0]["message_id"].is_string() && rows[0]["sent_timestamp"].is_string());
    assert!(
        run.stderr.contains("18 messages from table t") && run.stderr.contains("18 deleted"),
        "{run:#?}"
    );
    assert_eq!(f.counts().await, (0, 0), "the queue is empty");
}

#[tokio::test]
async fn tail_peek_is_the_default_and_leaves_the_queue_full() {
    let f = Fixture::standard(9).await;
    let mut a = args(&f, &["tail", "t", "--format", "body"]);
    a.extend(SMALL);
    let run = sqs_flight(&a).await;
    run.expect_code(0);
    let got: Vec<String> = run.stdout.lines().map(str::to_string).collect();
    assert_eq!(sorted(got), sorted(expected(9)), "{run:#?}");
    assert!(
        run.stderr.contains("9 released back to the queue"),
        "{run:#?}"
    );
    assert_eq!(f.counts().await, (9, 0), "every message visible again");

    let run = sqs_flight(&args(
        &f,
        &[
            "tail",
            "t",
            "--peek",
            "--format",
            "csv",
            "--columns",
            "body",
        ],
    ))
    .await;
    run.expect_code(0);
    assert_eq!(run.stdout.lines().next(), Some("body"));
    assert_eq!(run.stdout.lines().count(), 10, "{run:#?}");
    assert_eq!(f.counts().await, (9, 0));
}

#[tokio::test]
async fn tail_limit_never_deletes_more_than_it_prints() {
    let f = Fixture::standard(10).await;
    let run = sqs_flight(&args(
        &f,
        &[
            "tail",
            "t",
            "--commit",
            "--limit",
            "3",
            "--format",
            "body",
            "--max-wait-ms",
            "300",
        ],
    ))
    .await;
    run.expect_code(0);
    assert_eq!(run.stdout.lines().count(), 3, "{run:#?}");
    assert_eq!(
        f.counts().await,
        (7, 0),
        "exactly the printed messages were deleted"
    );
}

#[tokio::test]
async fn sql_aggregate_over_a_json_field_then_commit() {
    let f = Fixture::standard(0).await;
    let kinds = ["paid", "shipped"];
    let bodies = (0..7).map(|i| json!({"event": kinds[i % 2], "cents": 100 * i}).to_string());
    moto::send_bodies(&f.sqs, &f.queue_url, bodies).await;
    let query = "SELECT json_get_str(body, 'event') AS event, count(*) AS n, \
                 sum(json_get_int(body, 'cents')) AS cents FROM t GROUP BY 1 ORDER BY 1";

    let mut a = args(&f, &["sql", query, "--format", "csv"]);
    a.extend(SMALL);
    let peek = sqs_flight(&a).await;
    peek.expect_code(0);
    assert_eq!(
        f.counts().await,
        (7, 0),
        "peeking leaves the queue full: {peek:#?}"
    );

    let mut a = args(&f, &["sql", query, "--format", "csv", "--commit"]);
    // One partition and one receiver, as SMALL says why; room for all 7.
    a.extend([
        "--partitions",
        "1",
        "--receivers",
        "1",
        "--max-messages",
        "50",
        "--max-wait-ms",
        "300",
    ]);
    let run = sqs_flight(&a).await;
    run.expect_code(0);
    assert_eq!(
        run.stdout, "event,n,cents\npaid,4,1200\nshipped,3,900\n",
        "{run:#?}"
    );
    assert!(run.stderr.contains("7 deleted"), "{run:#?}");
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn the_readme_demo_prints_twenty_messages_and_exits_zero() {
    let server = demo_server().await;
    let run = sqs_flight(&["--url", &server.url, "tail", "demo", "--commit"]).await;
    run.expect_code(0);
    let rows: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains("order_id"))
        .collect();
    assert_eq!(rows.len(), 20, "{run:#?}");
    // Partitions stream side by side, so rows come in no fixed order: check
    // that each of the 20 seeded orders is printed exactly once.
    let mut orders: Vec<u64> = rows
        .iter()
        .map(|row| {
            assert!(row.contains("demo-"), "a demo message id: {row}");
            let at = row.find(r#""order_id":"#).expect("an order_id") + 11;
            let digits: String = row[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().expect("a numeric order_id")
        })
        .collect();
    orders.sort_unstable();
    assert_eq!(orders, (1000..1020).collect::<Vec<u64>>(), "{run:#?}");
    assert!(
        rows.iter()
            .any(|r| r.contains(r#""event":"order_created""#))
    );
    assert!(
        run.stdout.lines().next().unwrap().starts_with("+--"),
        "a table: {run:#?}"
    );
    let again = sqs_flight(&["--url", &server.url, "tail", "demo", "--commit"]).await;
    again.expect_code(0);
    assert_eq!(again.stdout, "", "committed messages are gone");
    server.stop().await;
}

#[tokio::test]
async fn tables_schema_and_status() {
    let f = Fixture::standard(2).await;
    let run = sqs_flight(&args(&f, &["tables"])).await;
    assert_eq!(run.expect_code(0).stdout, "t\n");
    let run = sqs_flight(&args(&f, &["schema", "t"])).await;
    assert!(
        run.expect_code(0).stdout.starts_with("message_id "),
        "{run:#?}"
    );
    let run = sqs_flight(&args(&f, &["status", "t", "--json"])).await;
    let status: Value = serde_json::from_str(&run.expect_code(0).stdout).unwrap();
    assert_eq!(status["tables"]["t"]["approximate_depth"], 2);
}

#[tokio::test]
async fn status_shows_the_age_of_the_oldest_message_a_consumer_holds() {
    let mut f = Fixture::standard(2).await;
    let plan = json!({"table": "t", "consumer": "lagging", "partitions": 1, "max_wait_ms": 300});
    let info = f.plan(plan).await.unwrap();
    assert_eq!(
        f.read_all(&info)
            .await
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        2
    );
    let run = sqs_flight(&args(&f, &["status", "t"])).await;
    let stdout = &run.expect_code(0).stdout;
    let line = stdout
        .lines()
        .find(|l| l.contains("consumer lagging:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("holding 2 messages, oldest message "),
        "{line}"
    );
    assert!(line.ends_with(" old"), "{line}");
    let run = sqs_flight(&args(&f, &["status", "t", "--json"])).await;
    let status: Value = serde_json::from_str(&run.expect_code(0).stdout).unwrap();
    let age = &status["tables"]["t"]["consumers"]["lagging"]["oldest_age_ms"];
    assert!(age.is_u64(), "{status}");
}

/// The server binary is the CLI when started under the name `sqs-flight`:
/// how the server wheel ships the CLI (its `sqs-flight` script), and what a
/// symlink of that name gives a plain binary.
#[tokio::test]
async fn the_server_binary_started_as_sqs_flight_is_the_cli() {
    let f = Fixture::standard(2).await;
    let dir = temp_dir("multicall");
    let link = dir.path().join("sqs-flight");
    std::os::unix::fs::symlink(sqs_flight_tests::server_process::server_binary(), &link).unwrap();

    let tables = run_cli(link.clone(), &args(&f, &["tables"]), None).await;
    let version = run_cli(link, &["--version"], None).await;
    assert_eq!(tables.expect_code(0).stdout, "t\n");
    let expected = format!("sqs-flight {}\n", env!("CARGO_PKG_VERSION"));
    assert_eq!(version.expect_code(0).stdout, expected);
}

#[tokio::test]
async fn bad_arguments_exit_2_and_say_what_to_fix() {
    let f = Fixture::standard(1).await;
    let run = sqs_flight(&args(&f, &["tail"])).await;
    assert!(run.expect_code(2).stderr.contains("<TABLE>"), "{run:#?}");
    let run = sqs_flight(&args(&f, &["tail", "t", "--commit", "--peek"])).await;
    assert!(
        run.expect_code(2).stderr.contains("cannot be used with"),
        "{run:#?}"
    );
    let run = sqs_flight(&args(&f, &["tail", "t", "--columns", "nope"])).await;
    assert!(
        run.expect_code(2)
            .stderr
            .contains("unknown column \"nope\""),
        "{run:#?}"
    );
    let run = sqs_flight(&args(&f, &["sql", "SELEC 1"])).await;
    assert!(run.expect_code(2).stderr.contains("the query"), "{run:#?}");
    let run = sqs_flight(&["--url", "ftp://x", "tables"]).await;
    assert!(
        run.expect_code(2).stderr.contains("grpc://HOST:PORT"),
        "{run:#?}"
    );
    assert_eq!(f.counts().await, (1, 0), "nothing was read");
}

#[tokio::test]
async fn refused_and_unknown_exit_4_and_5() {
    let f = Fixture::standard(1).await;
    let run = sqs_flight(&args(&f, &["tail", "t", "--partitions", "1000"])).await;
    assert!(
        run.expect_code(4).stderr.contains("`partitions`"),
        "{run:#?}"
    );
    let run = sqs_flight(&args(&f, &["schema", "nope"])).await;
    let stderr = &run.expect_code(5).stderr;
    assert!(
        stderr.contains("\"nope\"") && stderr.contains("known tables: t"),
        "{run:#?}"
    );
}

#[tokio::test]
async fn an_unknown_table_gets_the_same_answer_from_sql_as_from_tail() {
    let f = Fixture::standard(1).await;
    let tail = sqs_flight(&args(&f, &["tail", "orders"])).await;
    let sql = sqs_flight(&args(&f, &["sql", "SELECT count(*) FROM orders"])).await;
    let expected = "sqs-flight: error: not found: unknown table \"orders\" (known tables: t)\n  \
                    hint: `sqs-flight tables` lists the tables of the server\n";
    assert_eq!(tail.expect_code(5).stderr, expected, "{tail:#?}");
    assert_eq!(sql.expect_code(5).stderr, expected, "{sql:#?}");
    assert_eq!(f.counts().await, (1, 0), "nothing was read");
}

#[tokio::test]
async fn unreachable_server_exits_3_with_a_hint() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("grpc://{}", closed.local_addr().unwrap());
    drop(closed);
    let run = sqs_flight(&["--url", &url, "tail", "t", "--commit"]).await;
    let stderr = &run.expect_code(3).stderr;
    assert!(
        stderr.contains(&format!("cannot reach the sqs-flight server at {url}")),
        "{run:#?}"
    );
    assert!(stderr.contains("SQSF_URL"), "{run:#?}");
}

#[tokio::test]
async fn a_server_with_a_token_needs_it_and_gets_it_from_token() {
    let sqs = moto::moto().client().await;
    let queue = moto::create_queue(&sqs, "cli-auth", &[]).await;
    moto::send_bodies(&sqs, &queue, ["hello".to_string()]).await;
    let f = Fixture::serve(
        sqs,
        queue,
        |_| {},
        |c| {
            c.auth_token = Some("s3cret".into());
        },
    )
    .await;
    let run = sqs_flight(&args(&f, &["tables"])).await;
    let stderr = &run.expect_code(6).stderr;
    assert!(
        stderr.contains("--token") && stderr.contains("SQSF_TOKEN"),
        "{run:#?}"
    );
    let run = sqs_flight(&args(&f, &["--token", "wrong", "tables"])).await;
    run.expect_code(6);
    let mut a = args(
        &f,
        &[
            "--token", "s3cret", "tail", "t", "--commit", "--format", "body",
        ],
    );
    a.extend(SMALL);
    let run = sqs_flight(&a).await;
    assert_eq!(run.expect_code(0).stdout, "hello\n");
    assert_eq!(f.counts().await, (0, 0));
}
