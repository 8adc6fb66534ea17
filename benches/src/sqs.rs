//! aws-sdk-sqs against the emulator: queues, bulk sends, and the raw
//! baselines (receive + DeleteMessageBatch loops without the server).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use futures::{StreamExt, TryStreamExt, stream};

/// Concurrent SendMessageBatch calls when filling a queue.
const SEND_CONCURRENCY: usize = 8;
/// Pause of a raw loop after an empty receive (the server's short-poll pause).
const EMPTY_PAUSE: Duration = Duration::from_millis(50);
/// Visibility timeout of bench queues: long, so that nothing comes back
/// while a figure runs.
const QUEUE_VISIBILITY_SECS: u32 = 600;

/// An SQS client for the emulator (dummy credentials, loopback endpoint).
pub fn client(endpoint: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "bench"))
        .endpoint_url(endpoint)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_timeout(Duration::from_secs(60))
                .build(),
        )
        .build();
    Client::from_conf(config)
}

/// A fresh standard queue; its URL.
pub async fn new_queue(sqs: &Client, name: &str) -> Result<String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let out = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            QUEUE_VISIBILITY_SECS.to_string(),
        )
        .send()
        .await
        .with_context(|| format!("CreateQueue {name}"))?;
    out.queue_url.context("CreateQueue returned no URL")
}

/// A JSON body of exactly `size` bytes (at least 32): `{"n":N,"pad":"xx.."}`.
pub fn body(n: u64, size: usize) -> String {
    let head = format!("{{\"n\":{n},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    let mut s = String::with_capacity(size);
    s.push_str(&head);
    s.extend(std::iter::repeat_n('x', pad));
    s.push_str("\"}");
    s
}

/// Sends `count` messages of `size` bytes with SendMessageBatch.
pub async fn fill(sqs: &Client, url: &str, count: u64, size: usize) -> Result<()> {
    let chunks: Vec<(u64, u64)> = (0..count)
        .step_by(10)
        .map(|start| (start, (start + 10).min(count)))
        .collect();
    stream::iter(chunks)
        .map(|(from, to)| send_chunk(sqs, url, from, to, size))
        .buffer_unordered(SEND_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn send_chunk(sqs: &Client, url: &str, from: u64, to: u64, size: usize) -> Result<()> {
    let entries = (from..to)
        .map(|n| {
            SendMessageBatchRequestEntry::builder()
                .id((n - from).to_string())
                .message_body(body(n, size))
                .build()
                .expect("id and body are set")
        })
        .collect();
    let out = sqs
        .send_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
        .send()
        .await
        .context("SendMessageBatch")?;
    if !out.failed.is_empty() {
        bail!("SendMessageBatch refused {} entries", out.failed.len());
    }
    Ok(())
}

/// One ReceiveMessage call asking for what the server asks for: ten
/// messages and every system and message attribute.
pub async fn receive(sqs: &Client, url: &str, wait_secs: i32) -> Result<Vec<(String, String)>> {
    #[allow(deprecated)] // the server also sends the older AttributeNames
    let out = sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(wait_secs)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .attribute_names(QueueAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .context("ReceiveMessage")?;
    Ok(out
        .messages
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| Some((m.body?, m.receipt_handle?)))
        .collect())
}

/// One DeleteMessageBatch call; the number deleted.
pub async fn delete(sqs: &Client, url: &str, handles: &[String]) -> Result<u64> {
    let entries = handles
        .iter()
        .enumerate()
        .map(|(i, h)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(h)
                .build()
                .expect("id and handle are set")
        })
        .collect();
    let out = sqs
        .delete_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
        .send()
        .await
        .context("DeleteMessageBatch")?;
    Ok(out.successful.len() as u64)
}

/// The raw baseline of figure 3: `workers` loops of receive(10) +
/// DeleteMessageBatch until `count` messages were received and deleted.
/// Like the server's receive loop with a short idle wait, a loop polls
/// without waiting and pauses [`EMPTY_PAUSE`] after an empty receive.
/// Returns the elapsed time.
pub async fn raw_drain(
    sqs: &Client,
    url: &str,
    count: u64,
    workers: usize,
    deadline: Duration,
) -> Result<Duration> {
    let received = Arc::new(AtomicU64::new(0));
    let deleted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let loops = (0..workers).map(|_| {
        let (received, deleted) = (Arc::clone(&received), Arc::clone(&deleted));
        async move {
            while received.load(Ordering::Relaxed) < count {
                if start.elapsed() > deadline {
                    bail!("raw drain did not finish within {deadline:?}");
                }
                let got = receive(sqs, url, 0).await?;
                if got.is_empty() {
                    tokio::time::sleep(EMPTY_PAUSE).await;
                    continue;
                }
                received.fetch_add(got.len() as u64, Ordering::Relaxed);
                let handles: Vec<String> = got.into_iter().map(|(_, h)| h).collect();
                let n = delete(sqs, url, &handles).await?;
                deleted.fetch_add(n, Ordering::Relaxed);
            }
            Ok(())
        }
    });
    futures::future::try_join_all(loops).await?;
    let t = start.elapsed();
    let n = deleted.load(Ordering::Relaxed);
    if n != count {
        bail!("raw drain deleted {n} of {count}");
    }
    Ok(t)
}

/// Receives `count` messages with `workers` loops and keeps their handles
/// (the untimed setup of the raw commit baseline).
pub async fn receive_handles(
    sqs: &Client,
    url: &str,
    count: u64,
    workers: usize,
    deadline: Duration,
) -> Result<Vec<String>> {
    let start = Instant::now();
    let got = Arc::new(std::sync::Mutex::new(Vec::with_capacity(count as usize)));
    let loops = (0..workers).map(|_| {
        let got = Arc::clone(&got);
        async move {
            loop {
                if got.lock().expect("not poisoned").len() as u64 >= count {
                    return Ok(());
                }
                if start.elapsed() > deadline {
                    bail!("receiving {count} handles did not finish within {deadline:?}");
                }
                let batch = receive(sqs, url, 0).await?;
                if batch.is_empty() {
                    tokio::time::sleep(EMPTY_PAUSE).await;
                }
                got.lock()
                    .expect("not poisoned")
                    .extend(batch.into_iter().map(|(_, h)| h));
            }
        }
    });
    futures::future::try_join_all(loops).await?;
    let handles = std::mem::take(&mut *got.lock().expect("not poisoned"));
    Ok(handles)
}

/// The raw baseline of figure 5: DeleteMessageBatch of every handle, ten
/// per call, `concurrency` calls at a time. Returns the elapsed time and
/// the number deleted.
pub async fn raw_delete(
    sqs: &Client,
    url: &str,
    handles: &[String],
    concurrency: usize,
) -> Result<(Duration, u64)> {
    let start = Instant::now();
    let deleted: Vec<u64> = stream::iter(handles.chunks(10))
        .map(|chunk| delete(sqs, url, chunk))
        .buffer_unordered(concurrency)
        .try_collect()
        .await?;
    Ok((start.elapsed(), deleted.iter().sum()))
}

/// Visible + in-flight messages as the emulator reports them.
pub async fn depth(sqs: &Client, url: &str) -> Result<(u64, u64)> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .context("GetQueueAttributes")?;
    let attrs = out.attributes.unwrap_or_default();
    let get = |k: QueueAttributeName| attrs.get(&k).and_then(|v| v.parse().ok()).unwrap_or(0u64);
    Ok((
        get(QueueAttributeName::ApproximateNumberOfMessages),
        get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    ))
}

/// Sends one message now.
pub async fn send_one(sqs: &Client, url: &str, body: String) -> Result<()> {
    sqs.send_message()
        .queue_url(url)
        .message_body(body)
        .send()
        .await
        .context("SendMessage")?;
    Ok(())
}
