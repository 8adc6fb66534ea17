//! `sqs-flight send` against the server and moto: what arrives, what a bad
//! line or a refused row stops, and the exit statuses.

use serde_json::{Value, json};
use sqs_flight_tests::moto;

use sqs_flight_tests::cli::{sqs_flight, sqs_flight_with_stdin};
use sqs_flight_tests::prelude::*;

fn args<'a>(f: &'a Fixture, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--url", f.server.url.as_str()];
    v.extend_from_slice(rest);
    v
}

/// `tail --commit --format jsonl` of the whole table, as JSON rows; checks
/// that it left the queue empty.
async fn tail_all(f: &Fixture) -> Vec<Value> {
    let run = sqs_flight(&args(
        f,
        &[
            "tail",
            "t",
            "--commit",
            "--format",
            "jsonl",
            "--columns",
            "body,message_attributes",
            // One partition: moto may hand one message to two concurrent
            // receives, and this counts deliveries.
            "--partitions",
            "1",
            "--max-messages",
            "50",
            "--max-wait-ms",
            "300",
        ],
    ))
    .await;
    run.expect_code(0);
    assert_eq!(
        f.counts().await,
        (0, 0),
        "tail --commit emptied the queue: {run:#?}"
    );
    run.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

fn body_set(rows: &[Value]) -> Vec<String> {
    sorted(
        rows.iter()
            .map(|r| r["body"].as_str().unwrap().to_string())
            .collect(),
    )
}

#[tokio::test]
async fn json_lines_from_stdin_arrive_once_with_their_attributes() {
    let f = Fixture::standard(0).await;
    let mut input = String::new();
    for i in 0..23 {
        let line =
            json!({"body": format!("event-{i}"), "message_attributes": {"n": i, "src": "cli"}});
        input.push_str(&format!("{line}\n"));
        if i == 10 {
            input.push_str("   \n"); // blank lines are skipped
        }
    }
    let run = sqs_flight_with_stdin(
        &args(&f, &["send", "t", "--batch-rows", "7"]),
        Some(input.into_bytes()),
    )
    .await;
    run.expect_code(0);
    assert!(
        run.stderr.contains("sent 23 messages to t"),
        "the summary: {run:#?}"
    );
    assert_eq!(run.stdout, "", "stdout is for rows only");
    assert_eq!(f.counts().await, (23, 0));

    let rows = tail_all(&f).await;
    let expected: Vec<String> = sorted((0..23).map(|i| format!("event-{i}")).collect());
    assert_eq!(body_set(&rows), expected, "each message printed once");
    let seventh = rows.iter().find(|r| r["body"] == "event-7").unwrap();
    assert_eq!(
        seventh["message_attributes"],
        json!({"n": "7", "src": "cli"}),
        "attributes arrive as text"
    );
}

#[tokio::test]
async fn raw_lines_from_a_file_are_bodies_as_they_are() {
    let f = Fixture::standard(0).await;
    let lines = [
        "plain text",
        "{\"not\": \"a message object\"}",
        "  spaced  ",
    ];
    let (_scratch, file) = temp_file(
        "raw.txt",
        &format!("{}\r\n\n{}\n{}", lines[0], lines[1], lines[2]),
    );
    let run = sqs_flight(&args(
        &f,
        &["send", "t", "--raw", "--file", file.to_str().unwrap()],
    ))
    .await;
    run.expect_code(0);
    assert!(run.stderr.contains("sent 3 messages to t"), "{run:#?}");
    let rows = tail_all(&f).await;
    let expected: Vec<String> = sorted(lines.iter().map(|l| l.to_string()).collect());
    assert_eq!(body_set(&rows), expected);
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_bad_line_exits_7_naming_it_and_sends_nothing_of_its_batch() {
    let f = Fixture::standard(0).await;
    let mut lines: Vec<String> = (1..=10)
        .map(|i| json!({"body": format!("line-{i}")}).to_string())
        .collect();
    lines[7] = r#"{"body": "line-8", "colour": "red"}"#.to_string();
    let input = lines.join("\n");
    let run = sqs_flight_with_stdin(
        &args(&f, &["send", "t", "--batch-rows", "5"]),
        Some(input.into_bytes()),
    )
    .await;
    run.expect_code(7);
    assert!(
        run.stderr.contains("stdin: line 8: unknown field `colour`"),
        "names the line and the reason: {run:#?}"
    );
    assert!(
        run.stderr
            .contains("5 messages were sent from the lines before line 6, none from it on"),
        "{run:#?}"
    );
    assert_eq!(f.counts().await, (5, 0), "lines 1-5 only");
    let rows = tail_all(&f).await;
    let expected: Vec<String> = sorted((1..=5).map(|i| format!("line-{i}")).collect());
    assert_eq!(body_set(&rows), expected);

    let run = sqs_flight_with_stdin(
        &args(&f, &["send", "t"]),
        Some(b"{\"body\": \"ok\"}\nnot json at all\n".to_vec()),
    )
    .await;
    run.expect_code(7);
    assert!(run.stderr.contains("line 2: not JSON"), "{run:#?}");
    assert_eq!(
        f.counts().await,
        (0, 0),
        "nothing of the one batch was sent"
    );
}

#[tokio::test]
async fn a_refused_row_exits_4_naming_row_line_and_count() {
    let sqs = moto::moto().client().await;
    let url = moto::create_fifo_queue(
        &sqs,
        "clisend",
        &[(
            aws_sdk_sqs::types::QueueAttributeName::ContentBasedDeduplication,
            "true",
        )],
    )
    .await;
    let f = Fixture::serve(sqs, url, |_| {}, |_| {}).await;
    let input = [
        r#"{"body": "a", "message_group_id": "g"}"#,
        "",
        r#"{"body": "b", "message_group_id": "g"}"#,
        r#"{"body": "c", "message_group_id": "g"}"#,
        r#"{"body": "no group"}"#,
        r#"{"body": "d", "message_group_id": "g"}"#,
    ]
    .join("\n");
    let run = sqs_flight_with_stdin(&args(&f, &["send", "t"]), Some(input.into_bytes())).await;
    run.expect_code(4);
    assert!(
        run.stderr.contains("row 3: message_group_id is missing"),
        "the server's reason: {run:#?}"
    );
    assert!(
        run.stderr.contains("3 rows were sent before it"),
        "the count: {run:#?}"
    );
    assert!(
        run.stderr.contains("(that row is line 5 of stdin)"),
        "the input line, past the blank one: {run:#?}"
    );
    assert_eq!(f.counts().await, (3, 0));
}

#[tokio::test]
async fn unknown_tables_and_missing_files_exit_5_and_2() {
    let f = Fixture::standard(0).await;
    let run = sqs_flight_with_stdin(
        &args(&f, &["send", "nope"]),
        Some(b"{\"body\": \"x\"}\n".to_vec()),
    )
    .await;
    assert!(
        run.expect_code(5).stderr.contains("known tables: t"),
        "{run:#?}"
    );
    let run = sqs_flight(&args(
        &f,
        &["send", "t", "--file", "/nonexistent/messages.jsonl"],
    ))
    .await;
    assert!(
        run.expect_code(2)
            .stderr
            .contains("cannot read --file /nonexistent/messages.jsonl"),
        "{run:#?}"
    );
    let run = sqs_flight_with_stdin(&args(&f, &["send", "t"]), Some(Vec::new())).await;
    assert!(
        run.expect_code(0).stderr.contains("sent 0 messages to t"),
        "empty input: {run:#?}"
    );
    assert_eq!(f.counts().await, (0, 0));
}

/// Event JSON without a `body` key is the commonest first try of `send`:
/// the error names the line and the hint names `--raw`.
#[tokio::test]
async fn lines_without_body_get_a_hint_of_raw() {
    let f = Fixture::standard(0).await;
    let line = r#"{"event": "order_created", "order_id": 1, "amount_cents": 990}"#;
    let run = sqs_flight_with_stdin(&args(&f, &["send", "t"]), Some(line.into())).await;
    assert_eq!(
        run.expect_code(7).stderr,
        "sqs-flight: error: stdin: line 1: unknown field `amount_cents`, expected one of `body`, \
         `message_group_id`, `message_deduplication_id`, `delay_seconds`, `message_attributes`; \
         no message was sent\n  \
         hint: without --raw each line is a message object, {\"body\": \"...\"} with optional \
         message_group_id, message_deduplication_id, delay_seconds, message_attributes; \
         to send each line as it is as the body, add --raw\n",
        "{run:#?}"
    );
    let raw = sqs_flight_with_stdin(&args(&f, &["send", "t", "--raw"]), Some(line.into())).await;
    raw.expect_code(0);
    assert_eq!(f.counts().await, (1, 0), "the line, sent as it is");
}
