//! `--idle-exit`: the real server binary exits by itself once no RPC came
//! for the period, but never while a consumer holds uncommitted batches
//! within its lease.

use std::time::Duration;

use serde_json::json;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::ServerProcess;

use crate::support::{action_on, connect, plan_on, read_on, server_process_on_moto, tickets};

/// Bound of every wait for an exit (not a timing assertion).
const EXIT_BOUND: Duration = Duration::from_secs(60);
/// How long a server that must stay is watched: several --idle-exit periods.
const STAYS_FOR: Duration = Duration::from_secs(4);

fn start(queue_url: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--idle-exit", "1"];
    args.extend_from_slice(extra);
    server_process_on_moto(queue_url, &args)
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

/// Watches `server` for [`STAYS_FOR`]: panics if it exits.
fn assert_stays(server: &mut ServerProcess, why: &str) {
    let until = std::time::Instant::now() + STAYS_FOR;
    while std::time::Instant::now() < until {
        if let Some(status) = server.exited() {
            panic!("the server exited ({status}) {why}:\n{}", server.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_exits_by_itself_with_status_0() {
    let sqs = moto().client().await;
    let queue_url = moto::create_queue(&sqs, "idle", &[]).await;
    let server = start(&queue_url, &[]);
    assert!(
        server.wait_for_log("exits after this long without an RPC", EXIT_BOUND),
        "the server says it will exit when idle:\n{}",
        server.log()
    );
    assert!(
        server.wait_for_log("no RPC for the --idle-exit period", EXIT_BOUND),
        "the server says why it exits:\n{}",
        server.log()
    );
    let status = server.wait_exit(EXIT_BOUND).expect("it exits by itself");
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_stays_while_a_batch_is_uncommitted_and_exits_after_the_commit() {
    let sqs = moto().client().await;
    let queue_url = moto::create_queue(&sqs, "idle-held", &[]).await;
    moto::send_bodies(&sqs, &queue_url, (0..5).map(|i| format!("m{i}"))).await;
    let mut server = start(&queue_url, &[]);
    assert_eq!(read_batch_one(&server.url).await, 5);
    assert_stays(&mut server, "while consumer c held batch 1 uncommitted");
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
    let status = server
        .wait_exit(EXIT_BOUND)
        .expect("it exits after the commit");
    assert!(status.success(), "{status}");
    assert_eq!(moto::queue_counts(&sqs, &queue_url).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_lease_ran_out_no_longer_keeps_it() {
    let sqs = moto().client().await;
    let queue_url = moto::create_queue(&sqs, "idle-lease", &[]).await;
    moto::send_bodies(&sqs, &queue_url, (0..3).map(|i| format!("m{i}"))).await;
    let server = start(&queue_url, &["--consumer-lease", "2"]);
    assert_eq!(read_batch_one(&server.url).await, 3);
    // The lease runs out 2 s after the last call: the batch is released
    // (its messages visible again) and the server may go.
    let status = server
        .wait_exit(EXIT_BOUND)
        .expect("it exits once the lease ran out");
    assert!(status.success(), "{status}");
    assert_eq!(moto::queue_counts(&sqs, &queue_url).await, (3, 0));
}
