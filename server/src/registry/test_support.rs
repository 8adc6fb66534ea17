//! What the registry's unit tests share: a registry on an in-memory
//! queue, reading a partition, polling for a condition, the queue's counts.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{PlannedBatch, Registry};
use crate::config::{Config, TableConfig};

/// A registry on an in-memory queue of `messages`, its store in `dir`.
pub(super) async fn registry(messages: u64, dir: Option<&std::path::Path>) -> Arc<Registry> {
    Registry::build(&config(messages, dir), None).await.unwrap()
}

/// A server on an in-memory queue `t` of `messages`, its store in `dir`.
fn config(messages: u64, dir: Option<&std::path::Path>) -> Config {
    let table = TableConfig::memory("t", messages);
    let mut config = Config::new("127.0.0.1:0".parse().unwrap(), vec![table]);
    config.state_dir = dir.map(Into::into);
    config
}

/// [`registry`] on `dir` again, once the registry that had it open let go
/// of it (its background tasks hold it a moment after their last change).
pub(super) async fn reopened(messages: u64, dir: &std::path::Path) -> Arc<Registry> {
    let config = config(messages, Some(dir));
    let mut last = None;
    for _ in 0..1000 {
        match Registry::build(&config, None).await {
            Ok(r) => return r,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the store could not be opened again within 10 s: {last:?}");
}

/// The message ids a read of partition `p` of `batch` streams.
pub(super) async fn read_partition(
    r: &Arc<Registry>,
    batch: &PlannedBatch,
    p: usize,
) -> Vec<String> {
    let id = batch.tickets[p].id().clone();
    let stream = r.read(&id, &CancellationToken::new()).unwrap();
    let batches: Vec<_> = stream.map(|b| b.unwrap()).collect().await;
    let mut ids = Vec::new();
    for b in &batches {
        let col = b.column_by_name("message_id").unwrap();
        let col = arrow_array::cast::AsArray::as_string::<i32>(col);
        ids.extend(col.iter().map(|v| v.unwrap().to_string()));
    }
    ids
}

/// Polls `check` every 10 ms until it answers, for up to 10 s; then
/// panics naming `what`.
pub(super) async fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    for _ in 0..1000 {
        if let Some(answer) = check() {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 10 s");
}

/// (visible, in flight) of the in-memory queue.
pub(super) async fn counts(r: &Registry) -> (u64, u64) {
    let a = r.table("t").unwrap().attributes().await.unwrap();
    (a.visible, a.in_flight)
}
