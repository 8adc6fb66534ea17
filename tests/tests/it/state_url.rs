//! The registry's state in object storage (`--state-url`), on moto's S3:
//! a server killed after its consumer read a batch, and a new server on
//! the same URL with no state directory at all, replays that batch's rows,
//! commits it and drains the rest with no message twice, and deletes
//! again, never delivers, what the killed server committed and SQS
//! handed out once more; an older server
//! still running (or paused with SIGSTOP across the takeover) is fenced
//! and changes nothing; a URL that cannot be used fails the start naming
//! it.

use std::collections::BTreeSet;
use std::time::Duration;

use arrow_flight::{FlightClient, FlightInfo};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::json;
use sqs_flight_tests::faults::{Fault, FaultProxy, Faults, REDELIVERED, REDELIVERED_RECEIPT};
use sqs_flight_tests::http::get;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::prelude::{
    action_on, bodies, bounded, connect, free_addr, message_ids, plan_on, poll, read_on, reason,
    server_process_on_moto, tickets,
};
use sqs_flight_tests::process::die_with_parent;
use sqs_flight_tests::s3::{create_bucket, s3_client};
use sqs_flight_tests::server_process::{ServerProcess, server_binary, server_process_via};

const RECEIVE: &str = "ReceiveMessage";
const DELETE: &str = "DeleteMessageBatch";

/// Long enough that what a killed server held stays hidden for the test.
const VISIBILITY: &str = "120";

fn start(queue_url: &str, state_url: &str) -> ServerProcess {
    start_with(queue_url, state_url, &moto().endpoint, &[])
}

/// A server of `queue_url` on `state_url`, its S3 calls to `s3_endpoint`,
/// with `extra` flags.
fn start_with(
    queue_url: &str,
    state_url: &str,
    s3_endpoint: &str,
    extra: &[&str],
) -> ServerProcess {
    let mut args = vec!["--state-url", state_url, "--s3-endpoint", s3_endpoint];
    args.extend_from_slice(extra);
    server_process_on_moto(queue_url, &args)
}

async fn plan(flight: &mut FlightClient, batch: u64) -> Result<FlightInfo, tonic::Status> {
    let cmd = json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 2,
        "max_wait_ms": 300, "max_messages": 10});
    plan_on(flight, &cmd).await
}

/// (message id, body) of every row of `info`, ticket by ticket.
async fn read_batch(flight: &mut FlightClient, info: &FlightInfo) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    // One ticket at a time: moto may hand a message to two concurrent receives.
    for t in tickets(info) {
        let batches = read_on(flight, &t).await.expect("DoGet");
        out.push(
            message_ids(&batches)
                .into_iter()
                .zip(bodies(&batches))
                .collect(),
        );
    }
    out
}

async fn commit(flight: &mut FlightClient, batch: u64) -> Result<serde_json::Value, tonic::Status> {
    action_on(
        flight,
        "commit",
        &json!({"table": "t", "consumer": "c", "batch": batch}),
    )
    .await
}

/// A queue of `n` messages hidden for [`VISIBILITY`] once received, and
/// a fresh bucket's URL.
async fn queue_and_url(name: &str, n: usize) -> (aws_sdk_sqs::Client, String, String) {
    let sqs = moto().client().await;
    let attrs = [(QueueAttributeName::VisibilityTimeout, VISIBILITY)];
    let queue_url = moto::create_queue(&sqs, name, &attrs).await;
    moto::send_bodies(&sqs, &queue_url, (0..n).map(|i| format!("m{i}"))).await;
    let bucket = create_bucket(&s3_client(&moto().endpoint), name).await;
    (sqs, queue_url, format!("s3://{bucket}/streams/{name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_the_same_url_and_no_directory_replays_commits_and_drains_after_kill_9() {
    let (sqs, queue_url, url) = queue_and_url("state-url-kill", 30).await;

    let first = start(&queue_url, &url);
    let mut flight = connect(&first.url).await;
    let info = plan(&mut flight, 1).await.expect("plan");
    let before = read_batch(&mut flight, &info).await;
    let read_n: usize = before.iter().map(Vec::len).sum();
    assert!(read_n > 0, "the first server read messages");
    first.kill9();

    let second = start(&queue_url, &url);
    assert!(
        second.wait_for_log("taken over", Duration::from_secs(20)),
        "the new server says it took the state over:\n{}",
        second.log()
    );
    let mut flight = connect(&second.url).await;
    let again = plan(&mut flight, 1).await.expect("plan batch 1 again");
    assert_eq!(tickets(&again), tickets(&info), "batch 1 keeps its plan");
    let replay = read_batch(&mut flight, &again).await;
    assert_eq!(replay, before, "each ticket replays its rows, in order");
    let answer = commit(&mut flight, 1).await.expect("commit batch 1");
    assert_eq!(answer["deleted"], json!(read_n), "{answer}");

    // Drain the rest: every message exactly once.
    let mut seen: Vec<String> = before.concat().into_iter().map(|(id, _)| id).collect();
    for batch in 2..20 {
        let info = plan(&mut flight, batch).await.expect("plan");
        let rows = read_batch(&mut flight, &info).await.concat();
        commit(&mut flight, batch).await.expect("commit");
        seen.extend(rows.into_iter().map(|(id, _)| id));
        if moto::queue_counts(&sqs, &queue_url).await == (0, 0) {
            break;
        }
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no message delivered twice");
    assert_eq!(seen.len(), 30, "every message delivered");
    assert_eq!(moto::queue_counts(&sqs, &queue_url).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_server_paused_across_a_takeover_is_fenced_and_changes_nothing() {
    let (sqs, queue_url, url) = queue_and_url("state-url-fence", 20).await;

    let ops = free_addr();
    let ops_arg = ops.to_string();
    let old = start_with(
        &queue_url,
        &url,
        &moto().endpoint,
        &["--metrics-listen", &ops_arg],
    );
    let mut old_flight = connect(&old.url).await;
    let info = plan(&mut old_flight, 1).await.expect("plan");
    let before = read_batch(&mut old_flight, &info).await;
    let read_n: usize = before.iter().map(Vec::len).sum();
    assert!(read_n > 0);

    old.signal(libc::SIGSTOP);
    let new = start(&queue_url, &url);
    assert!(
        new.wait_for_log("taken over", Duration::from_secs(20)),
        "{}",
        new.log()
    );
    old.signal(libc::SIGCONT);
    let counts = moto::queue_counts(&sqs, &queue_url).await;

    // The older server refuses to commit or plan, naming why.
    let refused = commit(&mut old_flight, 1).await.expect_err("fenced commit");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
    assert_eq!(reason(&refused), Some("fenced"), "{refused}");
    // The new server's segment header was read (a ranged GetObject): the
    // message names its writer.
    assert!(
        refused.message().contains("another server (") && !refused.message().contains("unknown"),
        "{refused}"
    );
    let refused = plan(&mut old_flight, 2).await.expect_err("fenced plan");
    assert_eq!(reason(&refused), Some("fenced"), "{refused}");
    assert_eq!(
        moto::queue_counts(&sqs, &queue_url).await,
        counts,
        "the fenced server deleted and gave back nothing"
    );
    assert!(
        old.wait_for_log("FENCED", Duration::from_secs(5)),
        "{}",
        old.log()
    );
    let readyz = poll(
        Duration::from_secs(20),
        async || get(ops, "/readyz").await,
        |(code, body)| *code == 503 && body.contains("fenced"),
    )
    .await;
    assert!(
        readyz.is_ok(),
        "/readyz says the server is fenced: {readyz:?}"
    );

    // The new one serves the batch and commits it.
    let mut flight = connect(&new.url).await;
    let again = plan(&mut flight, 1).await.expect("plan");
    assert_eq!(read_batch(&mut flight, &again).await, before);
    let answer = commit(&mut flight, 1).await.expect("commit");
    assert_eq!(answer["deleted"], json!(read_n), "{answer}");
    assert_eq!(
        moto::queue_counts(&sqs, &queue_url).await,
        (20 - read_n as i64, 0)
    );
}

/// SQS may hand out a message again after a delete succeeded (here the
/// fault proxy redelivers every deleted message once). A message the
/// killed server committed is in the dedup window the new server read
/// from the log: deleted again, never delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_committed_before_a_takeover_and_delivered_again_is_deleted_not_read() {
    let (sqs, queue_url, url) = queue_and_url("state-url-window", 6).await;
    let proxy = FaultProxy::start(&moto().endpoint, 7).await;
    proxy.set(Faults::none().redeliver_deleted(1.0));
    let through_proxy = || {
        let args = ["--state-url", &url, "--s3-endpoint", &moto().endpoint];
        server_process_via(&proxy.endpoint, &queue_url, &args)
    };

    let first = through_proxy();
    let mut flight = connect(&first.url).await;
    let info = plan(&mut flight, 1).await.expect("plan");
    assert_eq!(read_batch(&mut flight, &info).await.concat().len(), 6);
    commit(&mut flight, 1).await.expect("commit");
    assert_eq!(moto::queue_counts(&sqs, &queue_url).await, (0, 0));
    first.kill9();

    let second = through_proxy();
    let mut flight = connect(&second.url).await;
    let info = plan(&mut flight, 2).await.expect("plan");
    let again = read_batch(&mut flight, &info).await.concat();
    assert_eq!(proxy.count(RECEIVE, REDELIVERED), 6, "{}", proxy.report());
    assert!(again.is_empty(), "committed, then read again: {again:?}");
    assert_eq!(
        proxy.count(DELETE, REDELIVERED_RECEIPT),
        6,
        "each deleted again:\n{}",
        proxy.report()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_directory_url_replays_after_kill_9() {
    let (_sqs, queue_url, _) = queue_and_url("state-url-path", 10).await;
    let scratch = sqs_flight_tests::prelude::temp_dir("state-url-path");
    let url = format!("file://{}", scratch.path().join("log").display());

    let first = start(&queue_url, &url);
    let mut flight = connect(&first.url).await;
    let info = plan(&mut flight, 1).await.expect("plan");
    let before = read_batch(&mut flight, &info).await;
    first.kill9();

    let second = start(&queue_url, &url);
    let mut flight = connect(&second.url).await;
    let again = plan(&mut flight, 1).await.expect("plan");
    assert_eq!(read_batch(&mut flight, &again).await, before);
    commit(&mut flight, 1).await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_url_that_cannot_be_used_fails_the_start_naming_it() {
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "state-url-bad", 1).await;
    let url = "s3://no-such-bucket-sqsf/x";
    let mut cmd = std::process::Command::new(server_binary());
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--sqs-endpoint",
        &moto().endpoint,
    ])
    .args(["--table", &format!("t={queue_url}")])
    .args(["--state-url", url, "--s3-endpoint", &moto().endpoint])
    .envs(sqs_flight_tests::moto::AWS_ENV.iter().copied())
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    die_with_parent(&mut cmd);
    let out = bounded(tokio::task::spawn_blocking(move || cmd.output()))
        .await
        .unwrap()
        .expect("run the server");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {log}");
    assert!(
        log.contains(url) && log.contains("NoSuchBucket"),
        "the error names the URL and the cause:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_s3_failing_a_read_streams_nothing_and_a_commit_deletes_nothing_until_it_is_back() {
    let (sqs, queue_url, url) = queue_and_url("state-url-s3-down", 40).await;
    let proxy = FaultProxy::start(&moto().endpoint, 3).await;
    let server = start_with(
        &queue_url,
        &url,
        &proxy.endpoint,
        &["--sqs-max-attempts", "2"],
    );
    let mut flight = connect(&server.url).await;
    let info = plan(&mut flight, 1).await.expect("plan");
    let read_n: usize = read_batch(&mut flight, &info).await.concat().len();
    assert!(read_n > 0);
    let unread = plan(&mut flight, 2).await.expect("plan batch 2");

    // S3 answers every write with 500.
    proxy.set(Faults::of(&[Fault::InternalError]).on("S3.PUT", 1.0));
    let counts = moto::queue_counts(&sqs, &queue_url).await;
    let refused = commit(&mut flight, 1)
        .await
        .expect_err("no commit without its record");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
    assert_eq!(reason(&refused), Some("state_unavailable"), "{refused}");
    let refused = plan(&mut flight, 3)
        .await
        .expect_err("no plan without its record");
    assert_eq!(reason(&refused), Some("state_unavailable"), "{refused}");
    // A first read receives, cannot record, and streams no row.
    let ticket = tickets(&unread)[0].clone();
    let refused = read_on(&mut flight, &ticket)
        .await
        .expect_err("no rows without their record");
    assert_eq!(reason(&refused), Some("state_unavailable"), "{refused}");
    assert_eq!(
        moto::queue_counts(&sqs, &queue_url).await.1,
        counts.1,
        "nothing deleted, and what the failed read took is handed back"
    );

    proxy.set(Faults::none());
    let answer = commit(&mut flight, 1)
        .await
        .expect("commit once S3 is back");
    assert_eq!(answer["deleted"], json!(read_n), "{answer}");
    let rows = read_batch(&mut flight, &unread).await.concat();
    assert!(!rows.is_empty(), "the read receives once S3 is back");
}

/// A measurement, not a check: the state log's S3 requests per 1,000
/// messages, and the drain's time beside the same drain without
/// `--state-url`, draining as the Spark source does (plan, read each
/// ticket, commit); SQS on rustack, S3 on moto through the counting proxy.
/// `cargo test -p sqs-flight-tests --test it state_url::s3_requests -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn s3_requests_per_1000_messages() {
    let n = 5_000;
    let (without, _) = timed_drain(n, false).await;
    let (with, proxy) = timed_drain(n, true).await;
    let per_1000 =
        |op: &str| proxy.count(op, sqs_flight_tests::faults::CALLS) as f64 * 1000.0 / n as f64;
    println!(
        "{n} messages: {without:.2} s without --state-url, {with:.2} s with it (ratio {:.2}); \
         S3 requests per 1,000 messages: PUT {:.1}, GET {:.1}, HEAD {:.1}, DELETE {:.1}, POST {:.1}",
        without / with,
        per_1000("S3.PUT"),
        per_1000("S3.GET"),
        per_1000("S3.HEAD"),
        per_1000("S3.DELETE"),
        per_1000("S3.POST"),
    );
}

/// Drains `n` messages from rustack, with the state log on moto behind a
/// proxy or without one: the seconds, and the proxy.
async fn timed_drain(n: usize, state_url: bool) -> (f64, FaultProxy) {
    let rustack = sqs_flight_tests::rustack::rustack();
    let sqs = rustack.client().await;
    let queue_url = moto::queue_holding(&sqs, "state-url-cost", n).await;
    let bucket = create_bucket(&s3_client(&moto().endpoint), "state-url-cost").await;
    let proxy = FaultProxy::start(&moto().endpoint, 5).await;
    let url = format!("s3://{bucket}/cost");
    let args: &[&str] = match state_url {
        true => &["--state-url", &url, "--s3-endpoint", &proxy.endpoint],
        false => &[],
    };
    let server = server_process_via(&rustack.endpoint, &queue_url, args);
    let mut flight = connect(&server.url).await;
    proxy.clear_counts();
    let start = std::time::Instant::now();
    let mut rows = 0;
    for batch in 1.. {
        let cmd = json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 2,
            "max_messages": 1000, "max_wait_ms": 300});
        let info = plan_on(&mut flight, &cmd).await.expect("plan");
        let got = read_batch(&mut flight, &info).await.concat().len();
        commit(&mut flight, batch).await.expect("commit");
        rows += got;
        if got == 0 || rows >= n {
            break;
        }
    }
    assert_eq!(rows, n);
    (start.elapsed().as_secs_f64(), proxy)
}
