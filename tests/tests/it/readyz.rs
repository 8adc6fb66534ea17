//! `/readyz` answers from the server's periodic check of the queues: no
//! request (none needs a token) makes an SQS call, and a queue that does
//! not answer is named without SQS's error text.

use std::time::{Duration, Instant};

use sqs_flight_server::testing::{DEPTH_POLL_INTERVAL, READY_CHECK_INTERVAL};
use sqs_flight_tests::faults::{CALLS, FaultProxy, Faults};
use sqs_flight_tests::moto::{self, moto};

use sqs_flight_tests::http::get;
use sqs_flight_tests::prelude::{Fixture, STEP, poll};

const GET_ATTRIBUTES: &str = "GetQueueAttributes";

/// A server of a moto queue through a fault proxy, with its operations port.
async fn proxied() -> (FaultProxy, Fixture, std::net::SocketAddr) {
    let direct = moto().client().await;
    let url = moto::create_queue(&direct, "readyz", &[]).await;
    let proxy = FaultProxy::start(&moto().endpoint, 30).await;
    let sqs = moto::sqs_client(&proxy.endpoint).await;
    let (f, ops) = Fixture::serve_with_metrics(sqs, url).await;
    (proxy, f, ops)
}

#[tokio::test]
async fn readyz_hammered_makes_at_most_one_sqs_call_per_table_per_check_interval() {
    let (proxy, _f, ops) = proxied().await;
    assert_eq!(get(ops, "/readyz").await, (200, "ready\n".to_string()));
    let (before, start) = (proxy.count(GET_ATTRIBUTES, CALLS), Instant::now());
    let n = 60;
    for _ in 0..n {
        assert_eq!(get(ops, "/readyz").await.0, 200);
    }
    let calls = proxy.count(GET_ATTRIBUTES, CALLS) - before;
    // One table: one call per readiness check and per depth poll (each
    // started within the time the requests took, or just before).
    let elapsed = start.elapsed();
    let per = |interval: Duration| (elapsed.as_secs_f64() / interval.as_secs_f64()).ceil() as u64;
    let allowed = per(READY_CHECK_INTERVAL) + 1 + per(DEPTH_POLL_INTERVAL) + 1;
    assert!(
        calls <= allowed,
        "{n} requests of /readyz over {elapsed:?} made {calls} GetQueueAttributes calls (at most {allowed})"
    );
}

#[tokio::test]
async fn readyz_names_a_table_whose_queue_fails_without_sqs_error_text() {
    let (proxy, _f, ops) = proxied().await;
    proxy.set(Faults::none().refuse(GET_ATTRIBUTES, "", "AccessDenied"));
    let last = poll(
        STEP,
        async || get(ops, "/readyz").await,
        |(status, _)| *status == 503,
    );
    let (Ok((status, body)) | Err((status, body))) = last.await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body, "not ready\ntable t: SQS not reachable (see the server log)\n",
        "the table is named, SQS's answer is not"
    );
}
