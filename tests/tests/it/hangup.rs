//! A DoGet cut by its client while ReceiveMessage calls are in flight:
//! what SQS handed those calls is either recorded in the ticket (and so
//! held by its consumer) or visible again at once, never hidden for a
//! visibility timeout (docs/protocol.md, "Receiving"); and the receive
//! loop stops at the hang-up, recording nothing that arrives after it.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use sqs_flight_server::sqs::{Received, SqsError};
use sqs_flight_tests::http::{get, metric};
use sqs_flight_tests::latency::LatencyProxy;
use sqs_flight_tests::moto;
use sqs_flight_tests::rustack::rustack;
use sqs_flight_tests::sqs::sqs_client;

use sqs_flight_tests::prelude::*;

/// Messages in the queue.
const MESSAGES: usize = 300;

/// ReceiveMessage calls in flight now (started, not yet come back).
#[derive(Default)]
struct InFlight(AtomicUsize);

impl ReceiveWatch for InFlight {
    fn before(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn after(&self, _got: &Result<Vec<Received>, SqsError>) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InFlight {
    fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// What the consumer `default` of table `t` holds, from `status`.
async fn held(f: &mut arrow_flight::FlightClient) -> i64 {
    let s = action_on(f, "status", &json!({"table": "t"}))
        .await
        .unwrap();
    s["tables"]["t"]["consumers"]["default"]["in_flight"]
        .as_i64()
        .unwrap_or_else(|| panic!("status names the consumer: {s}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doget_cut_with_receives_in_flight_leaves_in_flight_at_sqs_what_its_consumer_holds() {
    let direct = rustack().client().await;
    // A visibility timeout far past the test: a message a lost call took
    // stays hidden until the end.
    let attrs = [(QueueAttributeName::VisibilityTimeout, "600")];
    let url = moto::create_queue(&direct, "cut", &attrs).await;
    moto::send_bodies(&direct, &url, (0..MESSAGES).map(|i| format!("m{i:03}"))).await;
    // The server reaches rustack through 600 ms of round trip: a call cut
    // while its answer travels back has had its messages dequeued already.
    let rtt = Duration::from_millis(600);
    let proxy = LatencyProxy::start(rustack().addr(), rtt, Duration::ZERO)
        .await
        .expect("latency proxy");
    let through = sqs_client(&proxy.endpoint()).await;
    let calls = Arc::new(InFlight::default());
    let server = watched(&through, &url, Arc::clone(&calls)).await;
    let mut flight = server.client().await;
    let plan = json!({"table": "t", "partitions": 1, "receivers": 8,
                      "max_messages": MESSAGES, "max_wait_ms": 5000});
    let info = plan_on(&mut flight, &plan).await.unwrap();
    let ticket = tickets(&info).remove(0);

    // Read until several calls are in flight, then hang up.
    let mut reader = server.client().await;
    let mut stream = bounded(reader.do_get(ticket.clone())).await.unwrap();
    let mut streamed = 0;
    let cut = bounded(async {
        while let Some(b) = stream.try_next().await.unwrap() {
            streamed += b.num_rows();
            let now = calls.now();
            if streamed >= 40 && now >= 2 {
                return now;
            }
        }
        panic!("the stream ended before several calls were in flight");
    })
    .await;
    drop(stream);
    drop(reader);

    // The calls in flight at the cut come back within a round trip or two
    // (a call cut short never does: its wait ends at the deadline).
    let returned = poll(Duration::from_secs(15), async || calls.now(), |&n| n == 0)
        .await
        .is_ok();
    let settled = poll(
        Duration::from_secs(30),
        async || {
            (
                held(&mut flight).await,
                moto::queue_counts(&direct, &url).await.1,
            )
        },
        |(holds, hidden)| holds == hidden,
    )
    .await;
    let (Ok((holds, hidden)) | Err((holds, hidden))) = settled;
    assert!(
        settled.is_ok(),
        "{hidden} messages in flight at SQS, the consumer holds {holds} ({cut} calls were in \
         flight at the cut, {} never came back: returned {returned})",
        calls.now()
    );
    assert!(
        holds as usize >= streamed && (holds as usize) < MESSAGES,
        "the ticket holds {holds}: at least the {streamed} rows streamed, not the whole queue"
    );

    // The cut ticket replays what its consumer holds; the next batch gets
    // the rest: every message exactly once.
    let replay = bodies(&read_on(&mut flight, &ticket).await.unwrap());
    assert_eq!(replay.len() as i64, holds, "the replay is what is held");
    let done = action_on(
        &mut flight,
        "commit",
        &json!({"table": "t", "consumer": "default", "batch": 1}),
    )
    .await
    .unwrap();
    assert_eq!(done["deleted"], json!(holds), "{done}");
    let mut next = plan.clone();
    next["batch"] = json!(2);
    next["max_wait_ms"] = json!(1000);
    let info = plan_on(&mut flight, &next).await.unwrap();
    let rest = bodies(&read_on(&mut flight, &tickets(&info)[0]).await.unwrap());
    let all: Vec<&String> = replay.iter().chain(&rest).collect();
    let unique: HashSet<&&String> = all.iter().collect();
    assert_eq!(
        (all.len(), unique.len()),
        (MESSAGES, MESSAGES),
        "every message read once ({} held, {} in the next batch)",
        replay.len(),
        rest.len()
    );
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, (MESSAGES - replay.len()) as i64)
    );
    server.stop().await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_client_that_hangs_up_stops_the_receive_loop() {
    let (mut f, ops) = Fixture::metered(0, "hang-up", |_| {}).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 5000}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    let mut reader = f.server.client().await;
    bounded(async {
        let mut stream = reader.do_get(ticket.clone()).await.unwrap();
        // The schema arrives first; the receive loop is now long-polling.
        let wait = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
        assert!(wait.is_err(), "no rows from an empty queue");
        drop(stream);
    })
    .await;
    // The server sees the reset when it drops the stream (and with it the
    // receive loop): only then may a message arrive.
    let open = poll(
        STEP,
        async || metric(&get(ops, "/metrics").await.1, "sqsf_doget_streams_open"),
        |&open| open == Some(0.0),
    )
    .await;
    assert_eq!(open, Ok(Some(0.0)), "the server dropped the stream");
    moto::send_bodies(&f.sqs, &f.queue_url, ["late".to_string()]).await;
    // The receive call in flight at the hang-up is left to finish (its long
    // poll runs 5 s), and hands back what it brings. Had the loop kept
    // polling it would have recorded "late": once no call is in flight,
    // the registry holds nothing for the consumer.
    let consumer = poll(
        STEP,
        async || f.consumer("default").await,
        |c| c["receives_in_flight"] == json!(0),
    )
    .await
    .expect("the receive in flight at the hang-up ended");
    assert_eq!(
        consumer["in_flight"],
        json!(0),
        "nothing recorded after the hang-up: {consumer}"
    );
    // The read recorded nothing, so the ticket is still fresh: the next
    // read receives. ("late" itself may be held by moto's abandoned long
    // poll until its visibility timeout, so a new message is sent.)
    moto::send_bodies(&f.sqs, &f.queue_url, ["later".to_string()]).await;
    let next = f.read(&ticket).await.unwrap();
    assert!(
        bodies(&next).contains(&"later".to_string()),
        "{:?}",
        bodies(&next)
    );
}
