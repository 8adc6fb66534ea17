//! aws-sdk-sqs against any SQS-compatible server (moto, rustack, a proxy in
//! front of either): the client, fresh queues, sends, receives, deletes and
//! counts that the integration tests and the benchmarks share.
//!
//! Every helper panics with the SDK's error context on a failed call: in a
//! test that fails the test, in a benchmark the figure (the bench binary
//! catches the panic).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::operation::delete_message_batch::DeleteMessageBatchOutput;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use futures::{StreamExt, stream};

/// Panics with what failed (`ReceiveMessage {url}`) and the SDK's whole
/// error chain.
fn call_failed<T>(call: String, e: impl std::error::Error) -> T {
    panic!("{call}: {}", aws_sdk_sqs::error::DisplayErrorContext(e))
}

/// An SQS client for `endpoint` with static dummy credentials (`test` /
/// `test`), region us-east-1, the latest behavior version, standard retries
/// and a 60 s operation timeout. Reads nothing from the environment or
/// profile files.
pub async fn sqs_client(endpoint: &str) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "sqs-flight-tests",
        ))
        .endpoint_url(endpoint)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_timeout(Duration::from_secs(60))
                .build(),
        )
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

static QUEUE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `{prefix}-{pid}-{n}`, unique within this process (and across concurrent
/// processes sharing one server). SQS names allow `[A-Za-z0-9_-]`, 80 chars
/// including a `.fifo` suffix.
pub(crate) fn unique_queue_name(prefix: &str, fifo: bool) -> String {
    let n = QUEUE_COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!(
        "{prefix}-{}-{n}{}",
        std::process::id(),
        if fifo { ".fifo" } else { "" }
    );
    let base = name.strip_suffix(".fifo").unwrap_or(&name);
    assert!(
        name.len() <= 80
            && base
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "bad queue name {name:?}: use a short prefix of [A-Za-z0-9_-]"
    );
    name
}

async fn create_named_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
    attrs: &[(QueueAttributeName, &str)],
) -> String {
    let mut req = client.create_queue().queue_name(name);
    for (k, v) in attrs {
        req = req.attributes(k.clone(), *v);
    }
    let out = req
        .send()
        .await
        .unwrap_or_else(|e| call_failed(format!("CreateQueue {name}"), e));
    out.queue_url()
        .expect("CreateQueue returned no QueueUrl")
        .to_string()
}

/// Creates a fresh standard queue named `{name_prefix}-{pid}-{n}` with the
/// given attributes and returns its URL.
pub async fn create_queue(
    client: &aws_sdk_sqs::Client,
    name_prefix: &str,
    attrs: &[(QueueAttributeName, &str)],
) -> String {
    create_named_queue(client, &unique_queue_name(name_prefix, false), attrs).await
}

/// Creates a fresh standard queue named after `name_prefix` (see
/// [`create_queue`]) holding `n` messages `m0..m{n-1}`, sent in order, and
/// returns its URL.
pub async fn queue_holding(client: &aws_sdk_sqs::Client, name_prefix: &str, n: usize) -> String {
    let url = create_queue(client, name_prefix, &[]).await;
    send_bodies(client, &url, (0..n).map(|i| format!("m{i}"))).await;
    url
}

/// Creates a fresh FIFO queue named `{name_prefix}-{pid}-{n}.fifo` and
/// returns its URL. `FifoQueue=true` is added unless `attrs` sets it;
/// ContentBasedDeduplication is left to `attrs` (default false: then every
/// send needs a MessageDeduplicationId, which [`send_fifo_bodies`] provides).
pub async fn create_fifo_queue(
    client: &aws_sdk_sqs::Client,
    name_prefix: &str,
    attrs: &[(QueueAttributeName, &str)],
) -> String {
    let mut all: Vec<(QueueAttributeName, &str)> = attrs.to_vec();
    if !all.iter().any(|(k, _)| *k == QueueAttributeName::FifoQueue) {
        all.push((QueueAttributeName::FifoQueue, "true"));
    }
    create_named_queue(client, &unique_queue_name(name_prefix, true), &all).await
}

async fn send_batches(
    client: &aws_sdk_sqs::Client,
    url: &str,
    entries: Vec<SendMessageBatchRequestEntry>,
) -> Vec<String> {
    let mut ids = Vec::with_capacity(entries.len());
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        let chunk: Vec<_> = entries.by_ref().take(10).collect();
        let n = chunk.len();
        let out = client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(chunk))
            .send()
            .await
            .unwrap_or_else(|e| call_failed(format!("SendMessageBatch to {url}"), e));
        assert!(
            out.failed().is_empty(),
            "SendMessageBatch to {url}: failed entries {:?}",
            out.failed()
        );
        assert_eq!(
            out.successful().len(),
            n,
            "SendMessageBatch to {url}: {out:?}"
        );
        // Entry ids are the index within the chunk; keep the send order.
        let mut ok: Vec<_> = out.successful().to_vec();
        ok.sort_by_key(|e| e.id().parse::<usize>().unwrap_or(usize::MAX));
        ids.extend(ok.into_iter().map(|e| e.message_id().to_string()));
    }
    ids
}

/// Sends `bodies` to a standard queue with SendMessageBatch, 10 per call, in
/// order; panics on any error or `Failed` entry. Returns the MessageIds in
/// the order of `bodies`.
pub async fn send_bodies(
    client: &aws_sdk_sqs::Client,
    url: &str,
    bodies: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let entries = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            SendMessageBatchRequestEntry::builder()
                .id((i % 10).to_string())
                .message_body(body)
                .build()
                .expect("batch entry")
        })
        .collect();
    send_batches(client, url, entries).await
}

static DEDUP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Sends `(message_group_id, body)` pairs to a FIFO queue with
/// SendMessageBatch, 10 per call, in order, each with a unique
/// MessageDeduplicationId (so it works with or without content-based
/// deduplication and never drops a repeated body). Returns the MessageIds.
pub async fn send_fifo_bodies(
    client: &aws_sdk_sqs::Client,
    url: &str,
    group_and_bodies: impl IntoIterator<Item = (String, String)>,
) -> Vec<String> {
    let entries = group_and_bodies
        .into_iter()
        .enumerate()
        .map(|(i, (group, body))| {
            let dedup = DEDUP_COUNTER.fetch_add(1, Ordering::Relaxed);
            SendMessageBatchRequestEntry::builder()
                .id((i % 10).to_string())
                .message_body(body)
                .message_group_id(group)
                .message_deduplication_id(format!("{}-{dedup}", std::process::id()))
                .build()
                .expect("batch entry")
        })
        .collect();
    send_batches(client, url, entries).await
}

/// `(visible, in_flight)`: ApproximateNumberOfMessages and
/// ApproximateNumberOfMessagesNotVisible (exact on moto).
pub async fn queue_counts(client: &aws_sdk_sqs::Client, url: &str) -> (i64, i64) {
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap_or_else(|e| call_failed(format!("GetQueueAttributes {url}"), e));
    let get = |k: QueueAttributeName| -> i64 {
        let attrs = out
            .attributes()
            .unwrap_or_else(|| panic!("GetQueueAttributes {url}: no attributes"));
        let v = attrs
            .get(&k)
            .unwrap_or_else(|| panic!("GetQueueAttributes {url}: no {k:?} in {attrs:?}"));
        v.parse()
            .unwrap_or_else(|_| panic!("GetQueueAttributes {url}: {k:?} = {v:?}"))
    };
    (
        get(QueueAttributeName::ApproximateNumberOfMessages),
        get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Visibility timeout that [`drain_visible`] gives the messages it receives.
pub const DRAIN_VISIBILITY_TIMEOUT_SECS: i32 = 43_200;

/// Receives every currently visible message (WaitTimeSeconds 0, 10 per call,
/// all system and message attributes) until a receive comes back empty, and
/// returns them in receive order.
///
/// This is an inspection tool with a side effect: **every returned message
/// is left in flight** for [`DRAIN_VISIBILITY_TIMEOUT_SECS`] (12 h, so a
/// slow drain never sees a message twice): afterwards the queue shows them
/// as not visible, and they come back only via ChangeMessageVisibility with
/// their receipt handles (or are deleted with them). Nothing is deleted.
///
/// An empty short-poll receive means "empty" on moto; on real SQS a short
/// poll samples servers and may miss messages. On a FIFO queue only what the
/// group locks allow is returned (moto hands out several messages of one
/// group per receive, then locks the group while they are in flight).
pub async fn drain_visible(client: &aws_sdk_sqs::Client, url: &str) -> Vec<Message> {
    let mut all = Vec::new();
    let mut seen = HashSet::new();
    loop {
        let msgs = receive_ten(client, url, 0, Some(DRAIN_VISIBILITY_TIMEOUT_SECS)).await;
        if msgs.is_empty() {
            return all;
        }
        for m in msgs {
            let id = m.message_id().unwrap_or_default().to_string();
            assert!(
                seen.insert(id.clone()),
                "drain_visible({url}): message {id} received twice"
            );
            all.push(m);
        }
    }
}

/// One ReceiveMessage call as the sqs-flight server makes it: up to ten
/// messages, every system attribute (also under the older AttributeNames)
/// and every message attribute, long-polling `wait_secs`, with the queue's
/// visibility timeout unless `visibility_secs` says otherwise.
pub async fn receive_ten(
    client: &aws_sdk_sqs::Client,
    url: &str,
    wait_secs: i32,
    visibility_secs: Option<i32>,
) -> Vec<Message> {
    #[allow(deprecated)] // the server also sends the older AttributeNames
    let out = client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(wait_secs)
        .set_visibility_timeout(visibility_secs)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .attribute_names(QueueAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap_or_else(|e| call_failed(format!("ReceiveMessage {url}"), e));
    out.messages.unwrap_or_default()
}

/// One DeleteMessageBatch call of up to ten receipt handles (entry ids are
/// their positions); the answer, whose `failed` entries are the caller's
/// to count.
pub async fn delete_batch<'a>(
    client: &aws_sdk_sqs::Client,
    url: &str,
    handles: impl IntoIterator<Item = &'a str>,
) -> DeleteMessageBatchOutput {
    let entries = handles
        .into_iter()
        .enumerate()
        .map(|(i, handle)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(handle)
                .build()
                .expect("batch entry")
        })
        .collect();
    client
        .delete_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
        .send()
        .await
        .unwrap_or_else(|e| call_failed(format!("DeleteMessageBatch {url}"), e))
}

/// Deletes `messages` with DeleteMessageBatch (10 per call); returns how
/// many entries came back `Failed` (moto reports garbage handles there).
pub async fn delete_messages(
    client: &aws_sdk_sqs::Client,
    url: &str,
    messages: &[Message],
) -> usize {
    let mut failed = 0;
    for chunk in messages.chunks(10) {
        let handles = chunk
            .iter()
            .map(|m| m.receipt_handle().expect("message without receipt handle"));
        failed += delete_batch(client, url, handles).await.failed().len();
    }
    failed
}

/// Sends one message with SendMessage; its MessageId.
pub async fn send_message(client: &aws_sdk_sqs::Client, url: &str, body: String) -> String {
    let out = client
        .send_message()
        .queue_url(url)
        .message_body(body)
        .send()
        .await
        .unwrap_or_else(|e| call_failed(format!("SendMessage {url}"), e));
    out.message_id().unwrap_or_default().to_string()
}

/// Runs of [`send_bodies`] that [`send_many`] keeps going at once.
pub const SEND_CONCURRENCY: usize = 8;
/// Messages per run of [`send_many`] (ten per call, one call after the other).
const SEND_RUN: u64 = 500;

/// Fills a standard queue fast: `count` messages whose bodies are
/// `body(0)..body(count - 1)`, sent as [`SEND_CONCURRENCY`] concurrent runs
/// of [`send_bodies`]; the order across runs is not kept. For volume
/// (rustack); moto slows down with every message it holds.
pub async fn send_many(
    client: &aws_sdk_sqs::Client,
    url: &str,
    count: u64,
    body: impl Fn(u64) -> String,
) {
    let body = &body;
    stream::iter((0..count).step_by(SEND_RUN as usize))
        .map(|from| send_bodies(client, url, (from..(from + SEND_RUN).min(count)).map(body)))
        .buffer_unordered(SEND_CONCURRENCY)
        .for_each(|_| async {})
        .await;
}
