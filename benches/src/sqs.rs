//! aws-sdk-sqs against the emulator: the raw baselines (receive +
//! DeleteMessageBatch loops without the server) and bench bodies. Queues,
//! sends and counts are the integration tests' (`sqs_flight_tests::moto`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use futures::{StreamExt, TryStreamExt, stream};
use sqs_flight_tests::moto::{create_queue, send_bodies};

/// Concurrent runs of SendMessageBatch calls when filling a queue.
const SEND_CONCURRENCY: usize = 8;
/// Messages per run (sent ten per call, one call after the other).
const SEND_RUN: u64 = 500;
/// Pause of a raw loop after an empty receive (the server's short-poll pause).
const EMPTY_PAUSE: Duration = Duration::from_millis(50);
/// Visibility timeout of bench queues: long, so that nothing comes back
/// while a figure runs.
const QUEUE_VISIBILITY_SECS: u32 = 600;

/// A fresh standard queue whose messages stay hidden long enough that
/// nothing comes back while a figure runs; its URL.
pub async fn new_queue(sqs: &Client, name: &str) -> String {
    let vt = QUEUE_VISIBILITY_SECS.to_string();
    create_queue(sqs, name, &[(QueueAttributeName::VisibilityTimeout, &vt)]).await
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

/// Sends `count` messages of `size` bytes: SendMessageBatch through the
/// harness, [`SEND_CONCURRENCY`] runs of [`SEND_RUN`] messages at a time.
pub async fn fill(sqs: &Client, url: &str, count: u64, size: usize) {
    let runs: Vec<(u64, u64)> = (0..count)
        .step_by(SEND_RUN as usize)
        .map(|start| (start, (start + SEND_RUN).min(count)))
        .collect();
    stream::iter(runs)
        .map(|(from, to)| send_bodies(sqs, url, (from..to).map(|n| body(n, size))))
        .buffer_unordered(SEND_CONCURRENCY)
        .for_each(|_| async {})
        .await;
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
