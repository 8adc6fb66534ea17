//! The ReceiveMessage calls of one receive loop: how many a partition keeps
//! in flight, and how that width opens, grows and shrinks with what the
//! receives bring and how long they take (docs/protocol.md, "Plan
//! parameters": `receivers`).

use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::sqs::{Received, SQS_BATCH};

/// A ReceiveMessage call in flight.
#[derive(Debug)]
pub(super) struct Call {
    pub(super) issued: Instant,
    /// From issue to SQS's answer (set when it answers).
    pub(super) took: Duration,
    /// Its long-poll time, and the idle time that was left when it was issued.
    pub(super) wait: Duration,
    pub(super) left: Duration,
    /// Messages it asked for.
    pub(super) asked: u64,
    /// Counts the call in `status` until what it brought is recorded or
    /// handed back (dropped with the call); `None` in unit tests.
    pub(super) _counted: Option<crate::registry::table::ReceiveCall>,
}

pub(super) type CallResult = (
    Call,
    std::result::Result<Vec<Received>, crate::sqs::SqsError>,
);

/// The ReceiveMessage calls of one partition: how many are in flight, how
/// many may be (`target`), and how many messages they asked for.
///
/// A loop starts with one call, whatever the table did before, so an idle
/// queue costs one long poll per partition, also right after a busy batch
/// (SQS bills every call). If that first receive comes back full, the
/// target jumps at once to where the table's last receive loop ended
/// (`warm`, no wider than a recent queue depth fills: [`warm_width`]): a
/// busy queue gets back the width it had within one round trip instead of
/// ramping up from one again. From then on the target grows by
/// one for each receive that comes back full, up to the plan's `receivers`,
/// and shrinks by one for each that brings less than it asked for (the
/// queue is being emptied faster than it fills), so a trickling queue also
/// settles at one long poll per partition.
///
/// Past [`NARROW`] calls, the target grows only as far as the round trip
/// calls for: the calls that bring [`PARTITION_RATE`] messages a second
/// when each takes as long as the quickest full receive of the loop took
/// (Little's law: calls = rate x round trip / 10). On loopback and up to
/// 10 ms that is 32 at most; at SQS's 20 ms, 64; from 40 ms, 128; never
/// more than `receivers`.
/// The quickest, not a mean: a full receive that waited in a busy server
/// or emulator must not widen the load that made it wait.
pub(super) struct Calls {
    pub(super) set: JoinSet<CallResult>,
    pub(super) target: usize,
    /// The width the first full receive opens; `None` once a receive has
    /// shown how busy the queue is (or when the table has no warmer width).
    warm: Option<usize>,
    max: usize,
    pub(super) asked: u64,
    /// The round trip of the quickest full receive so far.
    quickest: Option<Duration>,
    /// Whether some receive brought a message.
    brought: bool,
}

/// The width a loop's first full receive opens: the table's `warm` width,
/// but no more calls than the queue's `depth` fills, when the server read
/// it lately ([`DEPTH_MAX_AGE`](crate::registry::backlog::DEPTH_MAX_AGE);
/// the Spark source reads it before each plan). A burst after an idle
/// spell then opens what it needs, not the width of the last drain, whose
/// extra calls would long-poll an empty queue (SQS bills each); the depth
/// is of the whole queue, so each partition may still open more than its
/// share. Without a recent depth, the warm width.
pub(super) fn warm_width(warm: usize, depth: Option<u64>) -> usize {
    depth.map_or(warm, |depth| {
        let calls = depth.div_ceil(SQS_BATCH as u64);
        warm.min(usize::try_from(calls).unwrap_or(usize::MAX))
    })
}

/// Calls a partition may always grow to: 32,000 messages a second at
/// 10 ms.
const NARROW: usize = 32;
/// Messages a second a partition's calls are sized for past [`NARROW`].
const PARTITION_RATE: u128 = 32_000;

/// The ReceiveMessage calls a partition grows to on a busy queue whose
/// calls take `rtt`, with the plan's `receivers` (see [`Calls`]).
pub fn width_at(rtt: Duration, receivers: u64) -> u64 {
    let calls = (PARTITION_RATE * rtt.as_micros()).div_ceil(SQS_BATCH as u128 * 1_000_000);
    let calls = u64::try_from(calls).unwrap_or(u64::MAX);
    calls.max(NARROW as u64).min(receivers.max(1))
}

impl Calls {
    /// At most `max` calls: one at first, `warm` once one comes back full.
    pub(super) fn new(max: u64, warm: usize) -> Self {
        let max = usize::try_from(max).unwrap_or(usize::MAX).max(1);
        Self {
            set: JoinSet::new(),
            target: 1,
            warm: (warm > 1).then(|| warm.min(max)),
            max,
            asked: 0,
            quickest: None,
            brought: false,
        }
    }

    /// The most calls the round trip seen so far calls for (see [`Calls`]).
    fn cap(&self) -> usize {
        let narrow = NARROW.min(self.max);
        self.quickest.map_or(narrow, |rtt| {
            usize::try_from(width_at(rtt, self.max as u64)).unwrap_or(self.max)
        })
    }

    pub(super) fn in_flight(&self) -> usize {
        self.set.len()
    }

    /// Accounts for a finished call and adapts the target to what it brought.
    pub(super) fn finished(&mut self, call: &Call, got: usize) {
        self.asked -= call.asked;
        self.brought |= got > 0;
        if (got as u64) < call.asked {
            self.warm = None;
            self.target = self.target.saturating_sub(1).max(1);
        } else if got >= SQS_BATCH {
            self.quickest = Some(self.quickest.map_or(call.took, |q| q.min(call.took)));
            let warm = self.warm.take().unwrap_or(0);
            self.target = (self.target + 1).max(warm).min(self.cap());
        }
    }

    /// Where the table's next loop may jump after its first full receive:
    /// this loop's target, or its warm width if no receive decided it;
    /// `None` when no receive brought a message (an idle queue says
    /// nothing of the width a busy one needs, so the batch received ahead
    /// on a drained queue does not narrow the next drain).
    pub(super) fn ending(&self) -> Option<usize> {
        self.brought
            .then(|| self.warm.unwrap_or(0).max(self.target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that asked for `asked` and took `took`.
    fn call_taking(asked: u64, took: Duration) -> Call {
        Call {
            issued: Instant::now(),
            took,
            wait: Duration::ZERO,
            left: Duration::ZERO,
            asked,
            _counted: None,
        }
    }

    fn call(asked: u64) -> Call {
        call_taking(asked, Duration::ZERO)
    }

    #[test]
    fn calls_grow_on_full_receives_and_shrink_on_empty_ones_within_bounds() {
        let mut calls = Calls::new(3, 1);
        calls.asked = 63;
        calls.finished(&call(10), 10);
        assert_eq!((calls.target, calls.asked), (2, 53));
        calls.finished(&call(10), 10);
        calls.finished(&call(10), 10);
        assert_eq!(calls.target, 3, "never above receivers");
        calls.finished(&call(10), 4);
        assert_eq!(calls.target, 2, "a partial receive shrinks the target");
        calls.finished(&call(3), 3);
        assert_eq!(calls.target, 2, "all it asked for, below ten: no change");
        for _ in 0..5 {
            calls.asked += 10;
            calls.finished(&call(10), 0);
        }
        assert_eq!(calls.target, 1, "never below one");
        assert_eq!(Calls::new(0, 0).max, 1);
        assert_eq!(Calls::new(4, 0).target, 1);
    }

    #[test]
    fn calls_grow_past_32_only_as_far_as_the_round_trip_calls_for() {
        let full = |calls: &mut Calls, rtt_ms: u64, n: usize| {
            for _ in 0..n {
                calls.asked += 10;
                calls.finished(&call_taking(10, Duration::from_millis(rtt_ms)), 10);
            }
        };
        // The target of a cold loop of `max` calls after 500 full receives
        // of `rtt_ms` each.
        let grown = |max: u64, rtt_ms: u64| {
            let mut calls = Calls::new(max, 0);
            full(&mut calls, rtt_ms, 500);
            calls.target
        };
        assert_eq!(grown(128, 2), 32, "loopback: 32");
        assert_eq!(grown(128, 20), 64, "20 ms: 64 bring 32,000 msg/s");
        assert_eq!(grown(128, 30), 96, "30 ms: 96 bring 32,000 msg/s");
        assert_eq!(grown(128, 500), 128, "never past receivers");
        assert_eq!(grown(16, 30), 16, "never past a smaller receivers");
        // A receive slowed by a busy server does not widen the loop: the
        // quickest round trip decides.
        let mut busy = Calls::new(128, 0);
        full(&mut busy, 2, 1);
        full(&mut busy, 400, 500);
        assert_eq!(busy.target, 32);
        // A warm width from a far loop is held to what this loop's round
        // trip calls for.
        let mut warm = Calls::new(128, 96);
        full(&mut warm, 2, 1);
        assert_eq!(warm.target, 32);
    }

    #[test]
    fn a_recent_depth_bounds_the_warm_width_to_the_calls_it_fills() {
        assert_eq!(warm_width(32, None), 32, "no depth read lately");
        assert_eq!(warm_width(32, Some(15)), 2, "a burst of 15: two calls");
        assert_eq!(warm_width(32, Some(0)), 0, "an empty queue: no jump");
        assert_eq!(
            warm_width(32, Some(20_000)),
            32,
            "a backlog: the warm width"
        );
    }

    #[test]
    fn a_warm_loop_starts_with_one_call_and_opens_its_width_on_a_full_receive() {
        let mut busy = Calls::new(8, 32);
        assert_eq!(
            (busy.target, busy.ending()),
            (1, None),
            "one call first; a loop that brought nothing leaves the table's width"
        );
        busy.asked = 10;
        busy.finished(&call(10), 10);
        assert_eq!(busy.target, 8, "a full first receive opens the warm width");
        busy.asked = 10;
        busy.finished(&call(10), 10);
        assert_eq!(busy.target, 8, "then grows by one, within receivers");

        let mut idle = Calls::new(8, 8);
        idle.asked = 10;
        idle.finished(&call(10), 0);
        assert_eq!(
            (idle.target, idle.ending()),
            (1, None),
            "an empty first receive: an idle queue leaves the table's width as it was"
        );
        idle.asked = 10;
        idle.finished(&call(10), 10);
        assert_eq!(
            (idle.target, idle.ending()),
            (2, Some(2)),
            "then ramps from one"
        );

        let mut small = Calls::new(8, 6);
        small.asked = 7;
        small.finished(&call(7), 7);
        assert_eq!(
            small.ending(),
            Some(6),
            "a loop too short to tell keeps the width"
        );
    }
}
