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

/// The ReceiveMessage calls of one partition in flight, the messages they
/// asked for, and how many may be in flight ([`Width`]).
pub(super) struct Calls {
    pub(super) set: JoinSet<CallResult>,
    pub(super) asked: u64,
    width: Width,
}

impl Calls {
    pub(super) fn new(width: Width) -> Self {
        Self {
            set: JoinSet::new(),
            asked: 0,
            width,
        }
    }

    pub(super) fn in_flight(&self) -> usize {
        self.set.len()
    }

    /// How many calls may be in flight now.
    pub(super) fn target(&self) -> usize {
        self.width.target
    }

    /// Accounts for a finished call and adapts the width to what it brought.
    pub(super) fn finished(&mut self, call: &Call, got: usize) {
        self.asked -= call.asked;
        self.width.finished(call.asked, call.took, got);
    }

    /// See [`Width::ending`].
    pub(super) fn ending(&self) -> Option<usize> {
        self.width.ending()
    }
}

/// How many ReceiveMessage calls one partition keeps in flight: one policy
/// of four rules.
///
/// - **Warm start.** A loop starts with one call, whatever the table did
///   before, so an idle queue costs one long poll per partition, also right
///   after a busy batch (SQS bills every call). If that first receive comes
///   back full, the target jumps at once to where the table's last receive
///   loop ended (`warm`): a busy queue gets back the width it had within
///   one round trip instead of ramping up from one again.
/// - **Depth cap.** That warm width is no wider than the queue's depth
///   fills, when the server read it lately
///   ([`DEPTH_MAX_AGE`](crate::registry::backlog::DEPTH_MAX_AGE); the
///   Spark source reads it before each plan): a burst after an idle spell
///   opens what it needs, not the width of the last drain, whose extra
///   calls would long-poll an empty queue (SQS bills each). The depth is
///   of the whole queue, so each partition may still open more than its
///   share.
/// - **Grow and narrow.** From then on the target grows by one for each
///   receive that comes back full, up to the plan's `receivers`, and
///   shrinks by one for each that brings less than it asked for (the queue
///   is being emptied faster than it fills), so a trickling queue also
///   settles at one long poll per partition.
/// - **Rate.** Past [`NARROW`] calls, the target grows only as far as the
///   round trip calls for: the calls that bring [`PARTITION_RATE`]
///   messages a second when each takes as long as the quickest full
///   receive of the loop took (Little's law: calls = rate x round trip /
///   10, [`width_at`]). On loopback and up to 10 ms that is 32 at most; at
///   SQS's 20 ms, 64; from 40 ms, 128; never more than `receivers`. The
///   quickest, not a mean: a full receive that waited in a busy server or
///   emulator must not widen the load that made it wait.
#[derive(Debug)]
pub(super) struct Width {
    target: usize,
    /// The width the first full receive opens; `None` once a receive has
    /// shown how busy the queue is (or when the table has no warmer width).
    warm: Option<usize>,
    /// The plan's `receivers`, at least 1.
    max: usize,
    /// The round trip of the quickest full receive so far.
    quickest: Option<Duration>,
    /// Whether some receive brought a message.
    brought: bool,
}

impl Width {
    /// At most `receivers` calls: one at first, and once one comes back
    /// full the table's `warm` width, held to what the queue's recent
    /// `depth` fills.
    pub(super) fn new(receivers: u64, warm: usize, depth: Option<u64>) -> Self {
        let max = usize::try_from(receivers).unwrap_or(usize::MAX).max(1);
        let warm = warm_width(warm, depth);
        Self {
            target: 1,
            warm: (warm > 1).then(|| warm.min(max)),
            max,
            quickest: None,
            brought: false,
        }
    }

    /// The most calls the round trip seen so far calls for.
    fn cap(&self) -> usize {
        let narrow = NARROW.min(self.max);
        self.quickest.map_or(narrow, |rtt| {
            usize::try_from(width_at(rtt, self.max as u64)).unwrap_or(self.max)
        })
    }

    /// Adapts the target to a call that asked for `asked` messages, took
    /// `took` and brought `got`.
    fn finished(&mut self, asked: u64, took: Duration, got: usize) {
        self.brought |= got > 0;
        if (got as u64) < asked {
            self.warm = None;
            self.target = self.target.saturating_sub(1).max(1);
        } else if got >= SQS_BATCH {
            self.quickest = Some(self.quickest.map_or(took, |q| q.min(took)));
            let warm = self.warm.take().unwrap_or(0);
            self.target = (self.target + 1).max(warm).min(self.cap());
        }
    }

    /// Where the table's next loop may jump after its first full receive:
    /// this loop's target, or its warm width if no receive decided it;
    /// `None` when no receive brought a message (an idle queue says
    /// nothing of the width a busy one needs, so the batch received ahead
    /// on a drained queue does not narrow the next drain).
    fn ending(&self) -> Option<usize> {
        self.brought
            .then(|| self.warm.unwrap_or(0).max(self.target))
    }
}

/// The width a loop's first full receive opens: the table's `warm` width,
/// but no more calls than the queue's `depth` fills, if it was read
/// lately (see [`Width`]).
fn warm_width(warm: usize, depth: Option<u64>) -> usize {
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
/// calls take `rtt`, with the plan's `receivers` (the rate rule of
/// [`Width`]).
pub fn width_at(rtt: Duration, receivers: u64) -> u64 {
    let calls = (PARTITION_RATE * rtt.as_micros()).div_ceil(SQS_BATCH as u128 * 1_000_000);
    let calls = u64::try_from(calls).unwrap_or(u64::MAX);
    calls.max(NARROW as u64).min(receivers.max(1))
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

    #[test]
    fn a_finished_call_leaves_the_messages_asked_and_moves_the_width() {
        let mut calls = Calls::new(Width::new(3, 1, None));
        calls.asked = 63;
        calls.finished(&call_taking(10, Duration::ZERO), 10);
        assert_eq!((calls.target(), calls.asked), (2, 53));
    }

    /// One policy case: a width made with `receivers`, `warm` and `depth`,
    /// then `receives` (each `times` calls that asked for `asked`, took
    /// `took_ms` and brought `got`), and the target and ending expected.
    struct Case {
        why: &'static str,
        receivers: u64,
        warm: usize,
        depth: Option<u64>,
        receives: &'static [(usize, u64, u64, usize)],
        target: usize,
        ending: Option<usize>,
    }

    const fn case(
        why: &'static str,
        (receivers, warm, depth): (u64, usize, Option<u64>),
        receives: &'static [(usize, u64, u64, usize)],
        (target, ending): (usize, Option<usize>),
    ) -> Case {
        Case {
            why,
            receivers,
            warm,
            depth,
            receives,
            target,
            ending,
        }
    }

    const FULL: (usize, u64, u64, usize) = (1, 10, 0, 10);
    const EMPTY: (usize, u64, u64, usize) = (1, 10, 0, 0);

    const CASES: &[Case] = &[
        // Grow and narrow.
        case("one call at first", (3, 1, None), &[], (1, None)),
        case(
            "a full receive grows by one",
            (3, 1, None),
            &[FULL],
            (2, Some(2)),
        ),
        case(
            "never above receivers",
            (3, 1, None),
            &[(3, 10, 0, 10)],
            (3, Some(3)),
        ),
        case(
            "a partial receive shrinks",
            (3, 1, None),
            &[(3, 10, 0, 10), (1, 10, 0, 4)],
            (2, Some(2)),
        ),
        case(
            "all it asked for, below ten: no change",
            (3, 1, None),
            &[FULL, (1, 3, 0, 3)],
            (2, Some(2)),
        ),
        case("never below one", (3, 1, None), &[(5, 10, 0, 0)], (1, None)),
        case(
            "receivers 0 is one call",
            (0, 0, None),
            &[(5, 10, 0, 10)],
            (1, Some(1)),
        ),
        // Rate: past 32 calls, as far as the quickest round trip calls for.
        case(
            "loopback: 32",
            (128, 0, None),
            &[(500, 10, 2, 10)],
            (32, Some(32)),
        ),
        case(
            "20 ms: 64 bring 32,000 msg/s",
            (128, 0, None),
            &[(500, 10, 20, 10)],
            (64, Some(64)),
        ),
        case(
            "30 ms: 96",
            (128, 0, None),
            &[(500, 10, 30, 10)],
            (96, Some(96)),
        ),
        case(
            "never past receivers",
            (128, 0, None),
            &[(500, 10, 500, 10)],
            (128, Some(128)),
        ),
        case(
            "never past a smaller receivers",
            (16, 0, None),
            &[(500, 10, 30, 10)],
            (16, Some(16)),
        ),
        case(
            "a slow receive of a busy server does not widen",
            (128, 0, None),
            &[(1, 10, 2, 10), (500, 10, 400, 10)],
            (32, Some(32)),
        ),
        // Warm start.
        case(
            "a full first receive opens the warm width",
            (8, 32, None),
            &[FULL],
            (8, Some(8)),
        ),
        case(
            "then grows by one, within receivers",
            (8, 32, None),
            &[FULL, FULL],
            (8, Some(8)),
        ),
        case(
            "a warm loop that brought nothing leaves the table's width",
            (8, 32, None),
            &[],
            (1, None),
        ),
        case(
            "an empty first receive: no jump",
            (8, 8, None),
            &[EMPTY],
            (1, None),
        ),
        case(
            "then ramps from one",
            (8, 8, None),
            &[EMPTY, FULL],
            (2, Some(2)),
        ),
        case(
            "a loop too short to tell keeps the width",
            (8, 6, None),
            &[(1, 7, 0, 7)],
            (1, Some(6)),
        ),
        case(
            "a warm width from a far loop is held to the round trip",
            (128, 96, None),
            &[(1, 10, 2, 10)],
            (32, Some(32)),
        ),
        // Depth cap.
        case(
            "a burst of 15: two calls",
            (128, 32, Some(15)),
            &[FULL],
            (2, Some(2)),
        ),
        case(
            "an empty queue: no jump",
            (128, 32, Some(0)),
            &[FULL],
            (2, Some(2)),
        ),
        case(
            "a backlog: the warm width",
            (128, 32, Some(20_000)),
            &[FULL],
            (32, Some(32)),
        ),
    ];

    #[test]
    fn the_width_follows_its_four_rules() {
        for c in CASES {
            let mut width = Width::new(c.receivers, c.warm, c.depth);
            for &(times, asked, took_ms, got) in c.receives {
                for _ in 0..times {
                    width.finished(asked, Duration::from_millis(took_ms), got);
                }
            }
            assert_eq!(
                (width.target, width.ending()),
                (c.target, c.ending),
                "{}",
                c.why
            );
        }
    }

    #[test]
    fn the_rate_rule_is_32_calls_up_to_10_ms_then_grows_with_the_round_trip() {
        let at = |ms| width_at(Duration::from_millis(ms), 128);
        assert_eq!(
            [at(1), at(10), at(20), at(40), at(80)],
            [32, 32, 64, 128, 128]
        );
        assert_eq!(width_at(Duration::from_millis(20), 16), 16);
    }
}
