//! The queue counts `status` read last, per table. A `status` with
//! `max_age_ms` answers them again while they are that young, instead of
//! calling GetQueueAttributes: a dashboard or the progress of many
//! streaming queries over one table then costs at most one SQS call per
//! table per `max_age_ms`, whatever the number of callers. A `status`
//! without it reads SQS, and what it reads serves the next cached ones.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::sqs::QueueAttributes;

/// The last counts read for each table (the server's tables are fixed, so
/// the map holds at most one entry per table).
#[derive(Default)]
pub(crate) struct AttributesCache {
    tables: Mutex<HashMap<String, Arc<Entry>>>,
}

#[derive(Default)]
struct Entry {
    /// Held by a cached caller while it reads SQS: callers that come at
    /// once wait for that one read instead of making their own.
    refresh: tokio::sync::Mutex<()>,
    /// When the last read started, and what it answered.
    last: Mutex<Option<(Instant, QueueAttributes)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Entry {
    fn within(&self, max_age: Duration) -> Option<QueueAttributes> {
        lock(&self.last)
            .filter(|(at, _)| at.elapsed() <= max_age)
            .map(|(_, attrs)| attrs)
    }

    async fn read<F, Fut, E>(&self, read: F) -> Result<QueueAttributes, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<QueueAttributes, E>>,
    {
        let started = Instant::now();
        let attrs = read().await?;
        let mut last = lock(&self.last);
        // A slower read that started earlier does not replace a newer one.
        if last.is_none_or(|(at, _)| at <= started) {
            *last = Some((started, attrs));
        }
        Ok(attrs)
    }
}

impl AttributesCache {
    /// The counts of `table`: those read at most `max_age` ago (counted
    /// from the start of that read), else `read()`'s. A zero `max_age`
    /// always reads.
    pub(crate) async fn get<F, Fut, E>(
        &self,
        table: &str,
        max_age: Duration,
        read: F,
    ) -> Result<QueueAttributes, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<QueueAttributes, E>>,
    {
        let entry = Arc::clone(lock(&self.tables).entry(table.to_string()).or_default());
        if max_age.is_zero() {
            return entry.read(read).await;
        }
        if let Some(attrs) = entry.within(max_age) {
            return Ok(attrs);
        }
        let _one_read = entry.refresh.lock().await;
        if let Some(attrs) = entry.within(max_age) {
            return Ok(attrs);
        }
        entry.read(read).await
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A read that counts its calls and answers the count as `visible`,
    /// after `delay`.
    async fn counted(calls: &AtomicU64, delay: Duration) -> Result<QueueAttributes, Infallible> {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(delay).await;
        Ok(QueueAttributes {
            visible: n,
            ..QueueAttributes::default()
        })
    }

    const AGE: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn a_cached_status_reads_sqs_once_per_max_age() {
        let (cache, calls) = (AttributesCache::default(), AtomicU64::new(0));
        let get = || cache.get("t", AGE, || counted(&calls, Duration::ZERO));
        assert_eq!(get().await.unwrap().visible, 1);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(get().await.unwrap().visible, 1, "4 s old: answered again");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(get().await.unwrap().visible, 2, "6 s old: read again");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn callers_at_once_share_one_read() {
        let (cache, calls) = (AttributesCache::default(), AtomicU64::new(0));
        let get = || cache.get("t", AGE, || counted(&calls, Duration::from_millis(300)));
        let answers = futures::future::join_all((0..20).map(|_| get())).await;
        assert!(answers.iter().all(|a| a.as_ref().unwrap().visible == 1));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_without_max_age_reads_now_and_serves_the_next_cached_ones() {
        let (cache, calls) = (AttributesCache::default(), AtomicU64::new(0));
        let cached = || cache.get("t", AGE, || counted(&calls, Duration::ZERO));
        let fresh = || cache.get("t", Duration::ZERO, || counted(&calls, Duration::ZERO));
        assert_eq!(cached().await.unwrap().visible, 1);
        assert_eq!(fresh().await.unwrap().visible, 2, "never from the cache");
        assert_eq!(cached().await.unwrap().visible, 2, "the newest read");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn tables_are_cached_apart() {
        let (cache, calls) = (AttributesCache::default(), AtomicU64::new(0));
        let a = cache
            .get("a", AGE, || counted(&calls, Duration::ZERO))
            .await;
        let b = cache
            .get("b", AGE, || counted(&calls, Duration::ZERO))
            .await;
        assert_eq!((a.unwrap().visible, b.unwrap().visible), (1, 2));
    }
}
