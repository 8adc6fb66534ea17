//! AWS credentials never leave the server: the real binary runs with a
//! distinctive access key and secret, logs at DEBUG (its own and the AWS
//! SDK's), and serves a plan, reads, a status, a commit and a read of a
//! missing queue, then stops; neither its log nor any answer contains
//! them.

use std::time::Duration;

use serde_json::json;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::ServerProcess;

use sqs_flight_tests::prelude::{action_on, connect, plan_on, read_on, tickets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_credentials_appear_in_no_log_line_and_no_answer() {
    let key_id = format!("AKIASQSF{}", std::process::id());
    let secret = format!("sqsf-secret-{}-do-not-print", std::process::id());
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "secrets", 5).await;
    let missing = queue_url.replace("secrets", "missing-queue");
    let tables = format!("t={queue_url},gone={missing}");
    let env = [
        ("AWS_ACCESS_KEY_ID", key_id.as_str()),
        ("AWS_SECRET_ACCESS_KEY", secret.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("RUST_LOG", "debug"),
    ];
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--table",
        &tables,
        "--sqs-endpoint",
        &moto().endpoint,
    ];
    let server = ServerProcess::start_with_env(&args, &env);
    let mut flight = connect(&server.url).await;
    let mut answers: Vec<String> = Vec::new();

    let cmd = json!({"table": "t", "consumer": "c", "partitions": 1, "max_wait_ms": 300});
    let info = plan_on(&mut flight, &cmd).await.unwrap();
    answers.push(format!("{info:?}"));
    for t in tickets(&info) {
        let batches = read_on(&mut flight, &t).await.unwrap();
        answers.push(format!("{batches:?}"));
    }
    for (kind, body) in [
        ("status", json!({"table": "t"})),
        ("commit", json!({"table": "t", "consumer": "c", "batch": 1})),
    ] {
        let answer = action_on(&mut flight, kind, &body).await.unwrap();
        answers.push(answer.to_string());
    }
    // A call that fails inside the SDK: its error travels to the client.
    let cmd = json!({"table": "gone", "consumer": "c", "partitions": 1, "max_wait_ms": 300});
    let info = plan_on(&mut flight, &cmd).await.unwrap();
    for t in tickets(&info) {
        let err = read_on(&mut flight, &t)
            .await
            .expect_err("reading a missing queue fails");
        answers.push(format!("{err:?}"));
    }
    // The server's last line says it stopped: stderr, collected by a
    // thread line by line, then holds every line it wrote.
    drop(flight);
    server.signal(libc::SIGTERM);
    assert!(
        server.wait_for_log("sqs-flight server stopped", Duration::from_secs(15)),
        "the server stops on SIGTERM:\n{}",
        server.log()
    );
    let log = server.log();
    assert!(
        log.contains("DEBUG"),
        "the server logged at DEBUG, so the scan means something:\n{log}"
    );
    for (name, value) in [("access key id", &key_id), ("secret key", &secret)] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(value.as_str())).collect();
        assert!(
            lines.is_empty(),
            "the {name} appears in the server's log:\n{}",
            lines.join("\n")
        );
        for a in &answers {
            assert!(
                !a.contains(value.as_str()),
                "the {name} appears in an answer: {a}"
            );
        }
    }
}
