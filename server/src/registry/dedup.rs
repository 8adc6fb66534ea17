//! One row per message id: SQS's at-least-once duplicates stop here.
//!
//! A standard queue delivers at least once: a message can reach two
//! receives (moto does it to concurrent ReceiveMessage calls often, SQS
//! rarely), and a deleted message can come back (a copy on a server that
//! missed the delete). Each table keeps two sets of message ids, as keys
//! ([`Key`]):
//!
//! - **held**: the id of every message recorded in an open ticket, with
//!   where it is (the ticket and the row). A receive that brings a held id
//!   again adds no row: the held row takes the newer receipt handle
//!   ([`Ticket::renew`]), since SQS acts only on the most recent one, and
//!   the older handle is never used again. An entry lives while its
//!   ticket holds the row: [`Ticket::close`] removes the ticket's entries.
//!   At most one entry per message the registry holds, so the registry's
//!   `max_messages` bounds it (about 50 bytes each).
//! - **committed**: the ids a commit deleted (not those it rejected), for
//!   `window` and at most `max_ids` of them, oldest forgotten first. A
//!   receive that brings one is deleted again with its new receipt and
//!   adds no row. Inserted before the commit closes its tickets, so an id
//!   is always in one set or the other while a commit moves it.
//!
//! The lock order is this table's lock, then a ticket's log: a ticket
//! never holds its log's lock while it calls in here.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use sqs_flight_schemas::TicketId;
use tokio::time::Instant;

use super::ticket::Ticket;
use crate::sqs::ReceiptHandle;

/// A message id as the sets keep it: a canonical UUID (SQS's, moto's and
/// rustack's ids) is its 128 bits, exactly; any other id two independent
/// 64-bit SipHashes of it (a collision between two ids is about one in
/// 2^128).
pub(crate) type Key = u128;

/// The key of message id `id`.
pub(crate) fn key(id: &str) -> Key {
    if let Some(uuid) = uuid_bits(id) {
        return uuid;
    }
    let half = |salt: u8| {
        let mut h = DefaultHasher::new();
        h.write_u8(salt);
        h.write(id.as_bytes());
        h.finish()
    };
    (u128::from(half(1)) << 64) | u128::from(half(2))
}

/// The 128 bits of a canonical (lowercase or uppercase) hyphenated UUID.
fn uuid_bits(id: &str) -> Option<u128> {
    let b = id.as_bytes();
    if b.len() != 36 {
        return None;
    }
    let mut bits = 0u128;
    for (i, &c) in b.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        let digit = (c as char).to_digit(16)?;
        bits = (bits << 4) | u128::from(digit);
    }
    Some(bits)
}

/// Where a held id is: a ticket's row, and the ReceiveMessage call that
/// brought its receipt.
struct Holder {
    ticket: Weak<Ticket>,
    row: u32,
    call: Span,
}

/// When a ReceiveMessage call was issued and when its answer came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub issued: Instant,
    pub answered: Instant,
}

impl Span {
    /// A call issued and answered at `at` (a restored row's).
    pub fn at(at: Instant) -> Self {
        Self {
            issued: at,
            answered: at,
        }
    }
}

/// Gives the held row `h` of open ticket `t` the receipt `r` a later
/// delivery of its message brought, from `call`. Which receipt SQS acts on
/// is the one of the call it served last:
/// - a call issued after the holder's was answered is the later one: the
///   row takes its receipt, and the older one is never used again;
/// - a call answered before the holder's was issued is the earlier one:
///   its receipt is dropped unused;
/// - calls that overlapped (in flight together) cannot be told apart: the
///   row keeps its receipt, and its delete uses this one too
///   ([`Ticket::add_second_receipt`]); deleting with a receipt SQS no longer acts on
///   does nothing.
///
/// The receipt comes back if the ticket was closed meanwhile.
fn offer(
    h: &mut Holder,
    t: &Ticket,
    call: Span,
    r: ReceiptHandle,
    renewed: &mut Vec<Renewed>,
) -> Result<(), ReceiptHandle> {
    if call.answered < h.call.issued {
        return if t.is_closed() { Err(r) } else { Ok(()) };
    }
    if call.issued < h.call.answered {
        return t.add_second_receipt(h.row as usize, r);
    }
    let receipt = r.expose().to_string();
    let at = t.renew(h.row as usize, r)?;
    h.call = call;
    // A row still being recorded is journaled by its own receive
    // (`Ticket::append`).
    renewed.extend(at.map(|(seq, offset)| Renewed {
        id: t.id().clone(),
        seq,
        offset,
        receipt,
    }));
    Ok(())
}

/// What a receive's message is to the table.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not held, not committed: a row, held from now on by the ticket at
    /// the row given to [`Dedup::classify`].
    New,
    /// Held already: its holder took this receipt. No row.
    Held,
    /// The `n`th new message of this same receive has the same id: it
    /// takes this receipt. No row.
    Again(usize),
    /// Deleted by a commit within the window: delete it again. No row.
    Committed,
}

/// A held row that took a newer receipt, for the journal.
#[derive(Debug)]
pub struct Renewed {
    pub id: TicketId,
    pub seq: u64,
    pub offset: u32,
    pub receipt: String,
}

/// What becomes of messages that will not be recorded.
#[derive(Debug, Default)]
pub struct Unrecorded {
    pub give_back: Vec<ReceiptHandle>,
    pub delete: Vec<ReceiptHandle>,
    /// Held ones whose holder took the receipt.
    pub held: u64,
}

struct Sets {
    held: HashMap<Key, Holder>,
    committed: HashSet<Key>,
    /// The committed ids, oldest first, with when they leave the window.
    order: VecDeque<(Instant, Key)>,
}

/// The held and committed ids of one table, and what they dropped.
pub struct Dedup {
    sets: Mutex<Sets>,
    window: Duration,
    max_ids: usize,
    dropped_held: AtomicU64,
    dropped_committed: AtomicU64,
}

/// Duplicates dropped since the process started, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    pub held: u64,
    pub committed: u64,
}

impl Dedup {
    /// Committed ids are kept for `window`, at most `max_ids` of them (0:
    /// none, the committed set is off).
    pub fn new(window: Duration, max_ids: u64) -> Self {
        Self {
            sets: Mutex::new(Sets {
                held: HashMap::new(),
                committed: HashSet::new(),
                order: VecDeque::new(),
            }),
            window,
            max_ids: usize::try_from(max_ids).unwrap_or(usize::MAX),
            dropped_held: AtomicU64::new(0),
            dropped_committed: AtomicU64::new(0),
        }
    }

    fn sets(&self) -> MutexGuard<'_, Sets> {
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Classifies one receive's messages (`keys`, with their `receipts`,
    /// in receive order) for `ticket`, whose next row is `first_row`, in
    /// one step under the table's lock: new ids are held by `ticket` from
    /// then on (the `i`th new one at `first_row + i`), and a held id's
    /// holder takes the new receipt. A holder that was closed meanwhile
    /// (released) holds nothing: the message is new again.
    ///
    /// Which receipt the row keeps is decided by the calls' times
    /// (`call`), not by which answer came back first (see [`offer`]).
    ///
    /// Receipts of [`Seen::New`] and [`Seen::Again`] messages are left in
    /// `receipts` for the caller; those of [`Seen::Held`] ones are taken.
    pub fn classify(
        &self,
        ticket: &Arc<Ticket>,
        first_row: u32,
        keys: &[Key],
        receipts: &mut [Option<ReceiptHandle>],
        call: Span,
        renewed: &mut Vec<Renewed>,
    ) -> Vec<Seen> {
        let mut sets = self.sets();
        sets.expire(Instant::now());
        let arrival = Arrival {
            ticket,
            first_row,
            call,
        };
        let mut next_row = first_row;
        let mut seen = Vec::with_capacity(keys.len());
        for (i, &k) in keys.iter().enumerate() {
            seen.push(
                match sets.seen_before(k, &arrival, &mut receipts[i], renewed) {
                    Some(before) => before,
                    None => {
                        sets.hold(k, &arrival, next_row);
                        next_row += 1;
                        Seen::New
                    }
                },
            );
        }
        self.count_dropped(&seen);
        seen
    }

    /// Counts the duplicates a receive's messages (`seen`) dropped.
    fn count_dropped(&self, seen: &[Seen]) {
        let (held, committed) = seen.iter().fold((0, 0), |(h, c), s| match s {
            Seen::Held | Seen::Again(_) => (h + 1, c),
            Seen::Committed => (h, c + 1),
            Seen::New => (h, c),
        });
        self.dropped_held.fetch_add(held, Ordering::Relaxed);
        self.dropped_committed
            .fetch_add(committed, Ordering::Relaxed);
    }

    /// Sorts messages that will not be recorded (a receive that came back
    /// after its loop ended): a held one gives its holder this newer
    /// receipt, as [`Dedup::classify`] does, and must not be handed back
    /// (that would make a held message visible); a committed one is
    /// deleted again; only the rest goes back to SQS.
    pub fn unrecorded(
        &self,
        keys: &[Key],
        receipts: Vec<ReceiptHandle>,
        call: Span,
        renewed: &mut Vec<Renewed>,
    ) -> Unrecorded {
        let mut sets = self.sets();
        sets.expire(Instant::now());
        let mut out = Unrecorded::default();
        let mut held = 0u64;
        for (&k, r) in keys.iter().zip(receipts) {
            if sets.committed.contains(&k) {
                out.delete.push(r);
                continue;
            }
            let Some(h) = sets.held.get_mut(&k) else {
                out.give_back.push(r);
                continue;
            };
            let Some(t) = h.ticket.upgrade() else {
                out.give_back.push(r);
                continue;
            };
            match offer(h, &t, call, r, renewed) {
                Ok(()) => held += 1,
                Err(r) => out.give_back.push(r),
            }
        }
        out.held = held;
        self.dropped_held.fetch_add(held, Ordering::Relaxed);
        self.dropped_committed
            .fetch_add(out.delete.len() as u64, Ordering::Relaxed);
        out
    }

    /// Holds `keys` (a restored ticket's rows, from row 0) for `ticket`.
    pub fn adopt(&self, ticket: &Arc<Ticket>, keys: &[Key]) {
        let mut sets = self.sets();
        let call = Span::at(Instant::now());
        for (row, &k) in keys.iter().enumerate() {
            sets.held.insert(
                k,
                Holder {
                    ticket: Arc::downgrade(ticket),
                    row: row as u32,
                    call,
                },
            );
        }
    }

    /// Forgets the entries of `keys` that `ticket` holds: its rows were
    /// closed, or never recorded.
    pub fn release(&self, ticket: &Ticket, keys: &[Key]) {
        let mut sets = self.sets();
        for k in keys {
            if let Entry::Occupied(e) = sets.held.entry(*k)
                && std::ptr::eq(e.get().ticket.as_ptr(), ticket)
            {
                e.remove();
            }
        }
    }

    /// Remembers ids a commit deletes, for the window.
    pub fn committed(&self, keys: impl IntoIterator<Item = Key>) {
        if self.window().is_none() {
            return;
        }
        let mut sets = self.sets();
        let until = Instant::now() + self.window;
        for k in keys {
            if sets.committed.insert(k) {
                sets.order.push_back((until, k));
            }
        }
        while sets.order.len() > self.max_ids {
            if let Some((_, k)) = sets.order.pop_front() {
                sets.committed.remove(&k);
            }
        }
    }

    /// How long committed ids are kept; `None` when the window is off.
    pub fn window(&self) -> Option<Duration> {
        (self.max_ids > 0 && !self.window.is_zero()).then_some(self.window)
    }

    /// Brings back committed ids a previous process kept (`--state-dir`),
    /// each with how long it has left, oldest first; never longer than
    /// this process's window, never more than its `max_ids`.
    pub fn restore_committed(&self, ids: impl IntoIterator<Item = (Duration, Key)>) {
        if self.window().is_none() {
            return;
        }
        let mut sets = self.sets();
        let now = Instant::now();
        for (left, k) in ids {
            if sets.committed.insert(k) {
                sets.order.push_back((now + left.min(self.window), k));
            }
        }
        sets.order
            .make_contiguous()
            .sort_by_key(|(until, _)| *until);
        while sets.order.len() > self.max_ids {
            if let Some((_, k)) = sets.order.pop_front() {
                sets.committed.remove(&k);
            }
        }
    }

    /// Duplicates dropped so far.
    pub fn dropped(&self) -> Dropped {
        Dropped {
            held: self.dropped_held.load(Ordering::Relaxed),
            committed: self.dropped_committed.load(Ordering::Relaxed),
        }
    }

    /// (held, committed) ids now.
    pub fn sizes(&self) -> (usize, usize) {
        let sets = self.sets();
        (sets.held.len(), sets.committed.len())
    }
}

/// One receive [`Dedup::classify`] sorts: the ticket it records into,
/// that ticket's next row, and the call that brought it.
struct Arrival<'t> {
    ticket: &'t Arc<Ticket>,
    first_row: u32,
    call: Span,
}

impl Sets {
    /// What message `k` of `arrival` is when the table saw it before
    /// (committed, held, or twice in this receive), `None` when it is new.
    /// A held one's holder takes its `receipt` (see [`offer`]); a holder
    /// closed meanwhile (released) holds nothing, and the receipt stays.
    fn seen_before(
        &mut self,
        k: Key,
        arrival: &Arrival,
        receipt: &mut Option<ReceiptHandle>,
        renewed: &mut Vec<Renewed>,
    ) -> Option<Seen> {
        if self.committed.contains(&k) {
            return Some(Seen::Committed);
        }
        let h = self.held.get_mut(&k)?;
        let holder = h.ticket.upgrade();
        let mine = holder
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(t, arrival.ticket));
        if mine && h.row >= arrival.first_row {
            // Twice in this receive: its row is not in the log yet.
            return Some(Seen::Again((h.row - arrival.first_row) as usize));
        }
        let t = holder?;
        let r = receipt.take()?;
        match offer(h, &t, arrival.call, r, renewed) {
            Ok(()) => Some(Seen::Held),
            // Closed meanwhile (released): new again.
            Err(r) => {
                *receipt = Some(r);
                None
            }
        }
    }

    /// Holds message `k` of `arrival` at `row` of its ticket from now on.
    fn hold(&mut self, k: Key, arrival: &Arrival, row: u32) {
        self.held.insert(
            k,
            Holder {
                ticket: Arc::downgrade(arrival.ticket),
                row,
                call: arrival.call,
            },
        );
    }

    /// Forgets the committed ids whose window ended.
    fn expire(&mut self, now: Instant) {
        while let Some(&(until, k)) = self.order.front() {
            if until > now {
                break;
            }
            self.order.pop_front();
            self.committed.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::ticket::ReceivedRows;

    #[test]
    fn uuids_are_their_bits_and_other_ids_hash_apart() {
        let id = "0f8fad5b-d9cb-469f-a165-70867728950e";
        assert_eq!(key(id), 0x0f8fad5b_d9cb_469f_a165_70867728950e);
        assert_eq!(key(&id.to_uppercase()), key(id));
        assert_ne!(key("m1"), key("m2"));
        assert_eq!(key("m1"), key("m1"));
        assert_eq!(uuid_bits("0f8fad5b-d9cb-469f-a165-70867728950"), None);
        assert_eq!(uuid_bits("0f8fad5b_d9cb-469f-a165-70867728950e"), None);
        assert_eq!(uuid_bits("0f8fad5b-d9cb-469f-a165-70867728950g"), None);
    }

    use sqs_flight_schemas::SqsMessage;
    use sqs_flight_schemas::message::messages_to_batch;

    use crate::registry::usage::Usage;

    fn ticket(d: &Arc<Dedup>, partition: u32) -> Arc<Ticket> {
        let id = TicketId {
            table: "t".into(),
            consumer: "c".into(),
            batch: 1,
            partition,
            plan: 1,
        };
        let usage = Arc::new(Usage::default());
        Arc::new(Ticket::new(id, usage).with_dedup(Arc::clone(d)))
    }

    /// One row per message id, as a receive records them.
    fn rows_of<'a>(ids: impl IntoIterator<Item = &'a str>) -> arrow_array::RecordBatch {
        let messages: Vec<SqsMessage> = ids
            .into_iter()
            .map(|id| SqsMessage {
                message_id: id.to_string(),
                body: "b".into(),
                ..Default::default()
            })
            .collect();
        messages_to_batch(&messages, 1, 0).unwrap()
    }

    /// A receive of `ids` with receipts `r-<id>-<tag>` classified for `t`
    /// and its new messages recorded, as the receive loop does.
    fn receive(d: &Dedup, t: &Arc<Ticket>, ids: &[&str], tag: &str) -> Vec<Seen> {
        let keys: Vec<Key> = ids.iter().map(|id| key(id)).collect();
        let mut receipts: Vec<_> = ids
            .iter()
            .map(|id| Some(ReceiptHandle::new(format!("r-{id}-{tag}"))))
            .collect();
        // One call after another: each later than the last.
        let call = Span::at(Instant::now());
        let seen = d.classify(
            t,
            t.rows() as u32,
            &keys,
            &mut receipts,
            call,
            &mut Vec::new(),
        );
        let mut fresh: Vec<usize> = Vec::new();
        for (i, s) in seen.iter().enumerate() {
            match s {
                Seen::New => fresh.push(i),
                Seen::Again(n) => receipts[fresh[*n]] = receipts[i].take(),
                Seen::Held | Seen::Committed => {}
            }
        }
        if !fresh.is_empty() {
            let rows = rows_of(fresh.iter().map(|&i| ids[i]));
            let r = fresh.iter().map(|&i| receipts[i].take().unwrap()).collect();
            t.append(ReceivedRows::new(rows, r, 1, Instant::now()))
                .unwrap();
        }
        seen
    }

    fn window() -> Arc<Dedup> {
        Arc::new(Dedup::new(Duration::from_secs(60), 100))
    }

    #[tokio::test]
    async fn a_held_id_adds_no_row_and_its_holder_takes_the_newest_receipt() {
        let d = window();
        let (t0, t1) = (ticket(&d, 0), ticket(&d, 1));
        assert_eq!(receive(&d, &t0, &["a", "b"], "1"), [Seen::New, Seen::New]);
        assert_eq!(
            receive(&d, &t1, &["b", "c"], "2"),
            [Seen::Held, Seen::New],
            "b is held by partition 0"
        );
        assert_eq!(receive(&d, &t0, &["b"], "3"), [Seen::Held]);
        assert_eq!(t0.rows(), 2, "no second row for b");
        assert_eq!(t0.receipts(), ["r-a-1", "r-b-3"], "the newest receipt");
        assert_eq!(t1.receipts(), ["r-c-2"]);
        let due: Vec<_> = t0.due(Instant::now() + Duration::from_secs(1));
        let extended: Vec<String> = due
            .iter()
            .flat_map(|c| c.receipts.iter().map(|r| r.expose().to_string()))
            .collect();
        assert_eq!(
            extended,
            ["r-a-1", "r-b-3"],
            "the heartbeat extends the newest"
        );
        assert_eq!(
            d.dropped(),
            Dropped {
                held: 2,
                committed: 0
            }
        );
        let closed: Vec<String> = t0.close().iter().map(|r| r.expose().to_string()).collect();
        assert_eq!(
            closed,
            ["r-a-1", "r-b-3"],
            "a commit or release uses the newest"
        );
    }

    #[tokio::test]
    async fn a_row_still_being_recorded_takes_the_newer_receipt_when_it_is() {
        let d = window();
        let (t0, t1) = (ticket(&d, 0), ticket(&d, 1));
        let r = |s: &str| Some(ReceiptHandle::new(s.into()));
        // Partition 0 classified `a` and is writing it to the journal...
        let mut first = [r("r-a-1")];
        let at = Span::at(Instant::now());
        let seen = d.classify(&t0, 0, &[key("a")], &mut first, at, &mut Vec::new());
        assert_eq!(seen, [Seen::New]);
        // ...when partition 1's receive brings it again.
        let mut renewed = Vec::new();
        let mut second = [r("r-a-2")];
        let seen = d.classify(&t1, 0, &[key("a")], &mut second, at, &mut renewed);
        assert_eq!(seen, [Seen::Held]);
        assert!(renewed.is_empty(), "journaled by partition 0's record");
        let rows = rows_of(["a"]);
        let taken = t0.append(ReceivedRows::new(
            rows,
            vec![first[0].take().unwrap()],
            1,
            Instant::now(),
        ));
        let taken: Vec<(u32, String)> = taken
            .unwrap()
            .into_iter()
            .map(|(o, r)| (o, r.expose().to_string()))
            .collect();
        assert_eq!(taken, [(0, "r-a-2".to_string())]);
        assert_eq!(t0.receipts(), ["r-a-2"], "the newest receipt");
        assert_eq!(t1.rows(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_later_call_s_receipt_wins_and_overlapping_calls_delete_with_both() {
        let d = window();
        let (t0, t1) = (ticket(&d, 0), ticket(&d, 1));
        let ms = |n| Instant::now() + Duration::from_millis(n);
        let span = |from, to| Span {
            issued: ms(from),
            answered: ms(to),
        };
        let r = |s: &str| Some(ReceiptHandle::new(s.into()));
        let record = |t: &Arc<Ticket>, receipt: ReceiptHandle| {
            t.append(ReceivedRows::new(
                rows_of(["a"]),
                vec![receipt],
                1,
                Instant::now(),
            ))
            .unwrap();
        };
        let mut held = [r("r-10-20")];
        let seen = d.classify(
            &t0,
            0,
            &[key("a")],
            &mut held,
            span(10, 20),
            &mut Vec::new(),
        );
        assert_eq!(seen, [Seen::New]);
        record(&t0, held[0].take().unwrap());
        let offer = |receipt: &str, call| {
            let mut one = [r(receipt)];
            let seen = d.classify(&t1, 0, &[key("a")], &mut one, call, &mut Vec::new());
            assert_eq!(seen, [Seen::Held], "{receipt}");
            assert_eq!(one[0], None, "{receipt}: taken, never handed back");
        };
        offer("r-0-5", span(0, 5));
        assert_eq!(
            t0.receipts(),
            ["r-10-20"],
            "an earlier call's receipt is dropped"
        );
        offer("r-15-30", span(15, 30));
        assert_eq!(
            t0.receipts(),
            ["r-10-20"],
            "overlapping: the row keeps its own..."
        );
        offer("r-16-31", span(16, 31));
        let second: Vec<(usize, String)> = t0
            .take_second_receipts()
            .into_iter()
            .map(|(row, r)| (row, r.expose().to_string()))
            .collect();
        assert_eq!(
            second,
            [(0, "r-16-31".to_string())],
            "...and deletes with both (one other a row, the latest)"
        );
        offer("r-25-40", span(25, 40));
        assert_eq!(
            t0.receipts(),
            ["r-25-40"],
            "a later call's receipt replaces it"
        );
    }

    #[tokio::test]
    async fn twice_in_one_receive_is_one_row_with_the_later_receipt() {
        let d = window();
        let t = ticket(&d, 0);
        assert_eq!(
            receive(&d, &t, &["a", "b", "a"], "1"),
            [Seen::New, Seen::New, Seen::Again(0)]
        );
        assert_eq!(t.rows(), 2);
        assert_eq!(t.receipts(), ["r-a-1", "r-b-1"]);
    }

    #[tokio::test]
    async fn a_closed_or_dropped_holder_holds_nothing_and_committed_ids_are_dropped() {
        let d = window();
        let t0 = ticket(&d, 0);
        receive(&d, &t0, &["a", "b"], "1");
        assert_eq!(d.sizes(), (2, 0));
        // A commit: the deleted id enters the window before the close.
        d.committed([key("a")]);
        t0.close();
        assert_eq!(d.sizes(), (0, 1), "the close forgot its held ids");
        let t1 = ticket(&d, 1);
        assert_eq!(
            receive(&d, &t1, &["a", "b"], "2"),
            [Seen::Committed, Seen::New],
            "a was committed, b released: b is new again"
        );
        assert_eq!(t1.receipts(), ["r-b-2"]);
        drop(t1);
        assert_eq!(d.sizes(), (0, 1), "a dropped ticket forgets its ids");
        assert_eq!(
            d.dropped(),
            Dropped {
                held: 0,
                committed: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn committed_ids_leave_by_age_and_by_count() {
        let d = Dedup::new(Duration::from_secs(60), 3);
        d.committed([1, 2]);
        tokio::time::advance(Duration::from_secs(30)).await;
        d.committed([3, 4]);
        assert_eq!(d.sizes().1, 3, "the oldest left past max_ids");
        let mut sets = d.sets();
        assert!(!sets.committed.contains(&1));
        sets.expire(Instant::now() + Duration::from_secs(31));
        assert_eq!(sets.committed.len(), 2, "2 left by age, 3 and 4 stay");
        drop(sets);
        let off = Dedup::new(Duration::from_secs(60), 0);
        off.committed([1]);
        assert_eq!(off.sizes().1, 0, "max_ids 0 turns the window off");
    }
}
