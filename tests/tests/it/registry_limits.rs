//! The registry's caps against a server on moto: consumers
//! (`max_consumers`), open batches per consumer
//! (`max_open_batches_per_consumer`) and tickets (`max_tickets`). A plan
//! past one is refused with RESOURCE_EXHAUSTED naming the setting and
//! leaves nothing behind; the server goes on serving the consumers it
//! holds; a released consumer keeps its metric series until, idle past its
//! lease, it is evicted to make room for a new consumer. Past the budget
//! of messages the registry holds (`registry_max_messages`) a read is
//! refused until a commit frees it.

use futures::TryStreamExt;
use serde_json::{Value, json};
use sqs_flight_tests::moto;
use sqs_flight_tests::server_process::status_kib;

use sqs_flight_tests::http::get;
use sqs_flight_tests::prelude::*;

fn plan_cmd(consumer: &str, batch: u64, partitions: u64) -> Value {
    json!({"table": "t", "consumer": consumer, "batch": batch, "partitions": partitions,
           "max_wait_ms": 0})
}

/// The message of a plan refused with RESOURCE_EXHAUSTED.
async fn refused(f: &mut Fixture, cmd: Value) -> String {
    match f.plan(cmd.clone()).await {
        Err(s) if s.code() == tonic::Code::ResourceExhausted => s.message().to_string(),
        Err(s) => panic!("{cmd} refused otherwise: {s}"),
        Ok(_) => panic!("{cmd} was planned"),
    }
}

async fn consumers(f: &mut Fixture) -> Value {
    let s = f.action("status", json!({"table": "t"})).await.unwrap();
    s["tables"]["t"]["consumers"].clone()
}

#[tokio::test]
async fn a_flood_of_consumers_past_max_consumers_is_refused_and_the_server_still_serves() {
    let (mut f, _) = Fixture::metered(3, "caps", |c| c.max_consumers = 5).await;
    let info = f.plan(plan_cmd("keeper", 1, 1)).await.unwrap();
    assert_eq!(bodies(&f.read_all(&info).await).len(), 3);
    let mut refusals = 0;
    for i in 0..50 {
        match f.plan(plan_cmd(&format!("flood-{i}"), 1, 2)).await {
            Ok(_) => assert!(i < 4, "consumer {} of 5 planned", i + 2),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s}");
                assert!(s.message().contains("max_consumers"), "{s}");
                refusals += 1;
            }
        }
    }
    assert_eq!(refusals, 46);
    let held = consumers(&mut f).await;
    assert_eq!(held.as_object().unwrap().len(), 5, "{held}");
    let listed: Vec<_> = bounded(f.flight.list_flights(bytes::Bytes::new()))
        .await
        .expect("ListFlights")
        .try_collect()
        .await
        .expect("ListFlights stream");
    assert_eq!(listed.len(), 1);
    assert_eq!(f.commit("keeper", 1).await["deleted"], 3);
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn open_batches_and_tickets_past_their_caps_are_refused_until_one_is_committed() {
    let (mut f, _) = Fixture::metered(0, "caps", |c| {
        c.max_open_batches_per_consumer = 2;
        c.max_tickets = 6;
    })
    .await;
    f.plan(plan_cmd("a", 1, 2)).await.unwrap();
    f.plan(plan_cmd("a", 2, 2)).await.unwrap();
    let m = refused(&mut f, plan_cmd("a", 3, 2)).await;
    assert!(m.contains("max_open_batches_per_consumer"), "{m}");
    assert_eq!(consumers(&mut f).await["a"]["open_batches"], json!([1, 2]));

    let m = refused(&mut f, plan_cmd("b", 1, 3)).await;
    assert!(m.contains("max_tickets"), "{m}");
    assert_eq!(consumers(&mut f).await.get("b"), None, "no consumer made");

    f.commit("a", 1).await;
    f.plan(plan_cmd("a", 3, 2))
        .await
        .expect("room again after a commit");
    f.plan(plan_cmd("b", 1, 2))
        .await
        .expect("tickets freed by the commit");
}

/// The lines of /metrics that are series of `consumer`.
async fn series_of(ops: std::net::SocketAddr, consumer: &str) -> Vec<String> {
    let label = format!("consumer=\"{consumer}\"");
    let text = get(ops, "/metrics").await.1;
    text.lines()
        .filter(|l| l.contains(&label))
        .map(str::to_string)
        .collect()
}

/// Plans and reads `consumer`'s batch `batch` (2 partitions of at most 5
/// messages): the rows read.
async fn plan_read(f: &mut Fixture, consumer: &str, batch: u64) -> usize {
    let cmd = json!({"table": "t", "consumer": consumer, "batch": batch, "partitions": 2,
                     "max_messages": 5, "max_wait_ms": 300});
    let info = f.plan(cmd).await.unwrap();
    let read = bodies(&f.read_all(&info).await).len();
    assert!(read > 0, "{consumer} read messages");
    read
}

/// Releases `consumer`'s open batches; how many messages it gave back.
async fn release(f: &mut Fixture, consumer: &str) -> u64 {
    let body = json!({"table": "t", "consumer": consumer});
    let out = f.action("release", body).await.expect("release");
    out["released"].as_u64().unwrap()
}

/// Release keeps a consumer's metric series (a dashboard's released
/// messages panel reads them) and frees what the registry held for it: its
/// entry and its tickets, which the next consumer takes. The series go when
/// an idle consumer, past its lease, gives its place to a new one at
/// `max_consumers`.
#[tokio::test]
async fn release_keeps_the_series_and_evicting_an_idle_consumer_removes_them() {
    let lease = std::time::Duration::from_secs(2);
    let (mut f, ops) = Fixture::metered(30, "caps", |c| {
        c.max_consumers = 1;
        c.max_tickets = 2;
        c.consumer_lease = lease;
    })
    .await;
    // Each consumer takes the one place and both tickets: the next one is
    // planned only if the release freed them.
    for name in ["c0", "c1", "c2"] {
        let read = plan_read(&mut f, name, 1).await;
        // (A lease that ran out first has released them already.)
        let released = release(&mut f, name).await;
        assert!(released == read as u64 || released == 0, "{name}");
        let series = series_of(ops, name).await;
        let total =
            format!(r#"sqsf_messages_released_total{{table="t",consumer="{name}"}} {read}"#);
        assert!(
            series.contains(&total),
            "{name} keeps its series: {series:?}"
        );
    }
    assert_eq!(consumers(&mut f).await, json!({}), "released, forgotten");
    assert_eq!(f.counts().await.1, 0, "every read message released");

    // A consumer that committed is kept for its watermark after a release.
    plan_read(&mut f, "kept", 1).await;
    f.commit("kept", 1).await;
    let read = plan_read(&mut f, "kept", 2).await;
    release(&mut f, "kept").await;
    assert!(consumers(&mut f).await.get("kept").is_some());
    let total = format!(r#"sqsf_messages_released_total{{table="t",consumer="kept"}} {read}"#);
    assert!(series_of(ops, "kept").await.contains(&total));
    // Idle past its lease, it gives its place, and its series, to the next.
    let next = async || f.plan(plan_cmd("next", 1, 2)).await.map(drop);
    let planned = poll(lease * 10, next, Result::is_ok).await;
    assert!(planned.is_ok(), "refused while kept was idle: {planned:?}");
    let held = consumers(&mut f).await;
    assert_eq!(
        held.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["next"],
        "{held}"
    );
    let left = series_of(ops, "kept").await;
    assert!(left.is_empty(), "eviction removes the series: {left:?}");
}

/// A measurement, not a check (its figure is in docs/operations.md,
/// "Limits"): the real server with its default caps under 20,000 consumers
/// each planning 64 partitions. Run it with `--ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement: prints the server's memory under a flood of plans"]
async fn plan_flood_memory() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "flood", &[]).await;
    let server = server_process_on_moto(&url, &[]);
    let mut flight = connect(&server.url).await;
    plan_on(&mut flight, &plan_cmd("first", 1, 1))
        .await
        .unwrap();
    let before = status_kib(server.pid(), "VmRSS:");
    let (mut planned, mut refused) = (0, 0);
    for i in 0..20_000 {
        match plan_on(&mut flight, &plan_cmd(&format!("flood-{i}"), 1, 64)).await {
            Ok(_) => planned += 1,
            Err(s) if s.code() == tonic::Code::ResourceExhausted => refused += 1,
            Err(s) => panic!("{s}"),
        }
    }
    let after = status_kib(server.pid(), "VmRSS:");
    println!(
        "plans: {planned} made, {refused} refused; VmRSS {} MiB before, {} MiB after (+{} MiB)",
        before / 1024,
        after / 1024,
        (after - before) / 1024
    );
    let listed: Vec<_> = bounded(flight.list_flights(bytes::Bytes::new()))
        .await
        .expect("ListFlights")
        .try_collect()
        .await
        .expect("ListFlights stream");
    assert_eq!(listed.len(), 1);
}

#[tokio::test]
async fn past_the_registry_budget_a_read_is_refused_with_resource_exhausted() {
    let sqs = moto::moto().client().await;
    let url = moto::queue_holding(&sqs, "budget", 12).await;
    let mut f = Fixture::serve(
        sqs,
        url,
        |_| {},
        |c| {
            c.registry_max_messages = 5;
        },
    )
    .await;
    let cmd = |batch: u64| json!({"table": "t", "batch": batch, "partitions": 1, "max_messages": 5, "max_wait_ms": 300});
    let first = f.plan(cmd(1)).await.unwrap();
    assert_eq!(bodies(&f.read_all(&first).await).len(), 5);
    let second = f.plan(cmd(2)).await.unwrap();
    let ticket = tickets(&second)[0].clone();
    let err = f.read(&ticket).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("commit or release"), "{err}");
    assert_eq!(f.counts().await, (7, 5), "nothing more was received");
    // Committing frees the budget; a fresh plan reads again.
    f.commit("default", 1).await;
    let third = f.plan(cmd(3)).await.unwrap();
    assert_eq!(bodies(&f.read_all(&third).await).len(), 5);
}
