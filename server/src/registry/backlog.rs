//! Batches sized to the backlog.
//!
//! An engine pays a fixed price per batch (Spark per micro-batch), so a
//! backlog read 1,000 messages per partition at a time costs many batches
//! where one would do. A plan that leaves `max_messages` to the built-in
//! default (its command does not set it, and the table's is the built-in
//! one, written or not: `--print-config` writes it) therefore
//! takes what is waiting: the queue's depth as the server last read it,
//! divided among the plan's partitions, never fewer than the default and
//! never more than `backlog_max_messages` (within `[limits]`). The depth
//! comes from reads the server makes anyway (the `status` action, which
//! the Spark source calls before each plan, and the metrics' poll), so a
//! plan makes no SQS call; one older than [`DEPTH_MAX_AGE`] is not used.
//! A trickle still gets small batches: a partition's read ends after
//! `max_wait_ms` without a message, whatever its `max_messages`.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use sqs_flight_schemas::PlanCommand;
use tokio::time::Instant;

use super::Table;
use crate::config::plan::DEFAULT_MAX_MESSAGES;
use crate::config::{Config, PlanParams};

/// How old a queue depth may be for a plan to be sized from it. The Spark
/// source reads `status` just before each plan, and the metrics' poll
/// reads every 15 s (`DEPTH_POLL_INTERVAL`); an older depth may be of a
/// backlog long read, so the plan takes the default instead.
pub(super) const DEPTH_MAX_AGE: Duration = Duration::from_secs(10);

/// A table's queue depth as the server last read it, and when.
#[derive(Debug, Default)]
pub(super) struct LastDepth {
    seen: Mutex<Option<(Instant, u64)>>,
}

impl LastDepth {
    fn lock(&self) -> MutexGuard<'_, Option<(Instant, u64)>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `visible`, read by a call that started `at`, unless a later
    /// read is kept already (a slower, older one does not replace it).
    pub(super) fn record(&self, at: Instant, visible: u64) {
        let mut seen = self.lock();
        if seen.is_none_or(|(last, _)| last <= at) {
            *seen = Some((at, visible));
        }
    }

    /// The depth read at most `max_age` ago (counted from the read's start).
    pub(super) fn within(&self, max_age: Duration) -> Option<u64> {
        self.lock()
            .filter(|(at, _)| at.elapsed() <= max_age)
            .map(|(_, visible)| visible)
    }
}

/// The sizing of the registry's plans.
#[derive(Debug, Clone, Copy)]
pub(super) struct Backlog {
    /// `[limits] max_messages`: a plan's `backlog_max_messages` counts
    /// only up to it.
    limit: u64,
}

impl Backlog {
    pub(super) fn new(config: &Config) -> Self {
        Self {
            limit: config.limits.max_messages,
        }
    }

    /// Most `max_messages` a batch planned with `params` takes from the
    /// backlog; at most the default: no sizing.
    fn cap(&self, params: &PlanParams) -> u64 {
        params.backlog_max_messages.min(self.limit)
    }

    /// `params` (a plan's, resolved and checked) with `max_messages` sized
    /// to `table`'s backlog where `cmd` and the table leave it to the
    /// built-in default and a depth was read lately; as they are otherwise.
    pub(super) fn size(&self, table: &Table, cmd: &PlanCommand, params: PlanParams) -> PlanParams {
        if cmd.max_messages.is_some() || !table.leaves_max_messages_to_default() {
            return params;
        }
        let Some(depth) = table.depth_within(DEPTH_MAX_AGE) else {
            return params;
        };
        let max_messages = per_partition(depth, params.partitions, self.cap(&params));
        if max_messages != params.max_messages {
            tracing::debug!(table = %cmd.table, consumer = %cmd.consumer, depth, max_messages, "batch sized to the backlog");
        }
        PlanParams {
            max_messages,
            ..params
        }
    }
}

/// Messages per partition for a backlog of `depth` over `partitions`:
/// `depth / partitions` rounded up, at least [`DEFAULT_MAX_MESSAGES`] and
/// at most `cap` (a `cap` below the default leaves the default).
pub(super) fn per_partition(depth: u64, partitions: u64, cap: u64) -> u64 {
    depth
        .div_ceil(partitions.max(1))
        .min(cap)
        .max(DEFAULT_MAX_MESSAGES)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 10_000;

    #[test]
    fn a_backlog_is_shared_among_the_partitions_rounded_up() {
        assert_eq!(per_partition(20_000, 2, CAP), 10_000);
        assert_eq!(per_partition(5_001, 2, CAP), 2_501);
        assert_eq!(per_partition(3_000, 1, CAP), 3_000);
    }

    #[test]
    fn never_below_the_default() {
        assert_eq!(per_partition(0, 2, CAP), DEFAULT_MAX_MESSAGES);
        assert_eq!(per_partition(1_500, 2, CAP), DEFAULT_MAX_MESSAGES);
    }

    #[test]
    fn never_above_the_cap() {
        assert_eq!(per_partition(1_000_000, 2, CAP), CAP);
        assert_eq!(per_partition(u64::MAX, 1, CAP), CAP);
    }

    #[test]
    fn a_cap_of_zero_or_the_default_turns_it_off() {
        for cap in [0, 1, DEFAULT_MAX_MESSAGES] {
            assert_eq!(per_partition(50_000, 2, cap), DEFAULT_MAX_MESSAGES);
        }
    }

    #[test]
    fn the_cap_is_within_the_limit() {
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), Vec::new());
        let params = PlanParams {
            backlog_max_messages: 50_000,
            ..PlanParams::DEFAULTS
        };
        config.limits.max_messages = 20_000;
        assert_eq!(Backlog::new(&config).cap(&params), 20_000);
        config.limits.max_messages = 100_000;
        assert_eq!(Backlog::new(&config).cap(&params), 50_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_depth_serves_until_it_is_older_than_its_max_age() {
        let depth = LastDepth::default();
        assert_eq!(depth.within(DEPTH_MAX_AGE), None, "none read yet");
        depth.record(Instant::now(), 7);
        tokio::time::advance(DEPTH_MAX_AGE).await;
        assert_eq!(depth.within(DEPTH_MAX_AGE), Some(7));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(depth.within(DEPTH_MAX_AGE), None, "too old");
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_read_does_not_replace_a_newer_one() {
        let depth = LastDepth::default();
        let earlier = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        depth.record(Instant::now(), 5);
        depth.record(earlier, 900);
        assert_eq!(depth.within(DEPTH_MAX_AGE), Some(5));
    }
}
