//! The threads a SQL worker process ([`super::worker`]) plans and runs
//! its statement on.
//!
//! DataFusion's operators are CPU-bound and yield to tokio only between
//! record batches; they run on a multi-thread runtime of a few workers
//! with stacks of [`SQL_THREAD_STACK_BYTES`], where deep expressions plan
//! recursively (a stack overflow ends the worker process, not the server).
//! The worker's stdin and stdout are served by the same runtime.
//!
//! Shutting down never waits for a query: [`SqlRuntime::shutdown`] drops
//! the runtime in the background.

use std::sync::Mutex;

use tokio::runtime::{Handle, Runtime};

/// Stack of each SQL worker thread: deep expressions plan recursively
/// (tokio's default is 2 MiB). Only touched pages cost memory.
const SQL_THREAD_STACK_BYTES: usize = 8 << 20;

/// The SQL runtime. Dropping it (or [`SqlRuntime::shutdown`]) stops it
/// without waiting for its tasks.
pub(crate) struct SqlRuntime {
    handle: Handle,
    runtime: Mutex<Option<Runtime>>,
}

impl SqlRuntime {
    /// A multi-thread runtime of `threads` workers named `sqsf-sql`.
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            // DataFusion spawns no blocking work here (no files are read),
            // so the blocking pool stays small: the worker's stdin (always
            // in a read) and stdout hold one thread each.
            .max_blocking_threads(threads.max(1) + 2)
            .thread_name("sqsf-sql")
            .thread_stack_size(SQL_THREAD_STACK_BYTES)
            .enable_time()
            .build()?;
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// Where queries are spawned. After [`SqlRuntime::shutdown`] a spawned
    /// task is cancelled at once (its `JoinHandle` says so).
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops the runtime without waiting: running queries are dropped at
    /// their next yield point, and the threads exit then.
    pub(crate) fn shutdown(&self) {
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(runtime) = runtime {
            runtime.shutdown_background();
        }
    }
}

impl Drop for SqlRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shutdown_does_not_wait_for_a_busy_task_and_later_spawns_are_cancelled() {
        let rt = SqlRuntime::new(1).unwrap();
        let (started, ready) = tokio::sync::oneshot::channel();
        let _busy = rt.handle().spawn(async move {
            let _ = started.send(());
            std::future::pending::<()>().await
        });
        ready.await.unwrap();
        let begun = std::time::Instant::now();
        rt.shutdown();
        assert!(begun.elapsed() < std::time::Duration::from_secs(5));
        let late = rt.handle().spawn(async { 1 });
        assert!(late.await.unwrap_err().is_cancelled());
    }
}
