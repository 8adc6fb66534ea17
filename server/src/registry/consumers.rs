//! Every consumer the registry holds, behind one lock.
//!
//! [`Consumers`] owns the map of (table, consumer) to [`Consumer`] and its
//! `std::sync::Mutex`; the lock is taken only here, and never across an
//! `.await` (no method is async), as mini-redis keeps its `State` behind
//! `Db`'s methods. Each method does one thing under the lock: run a closure
//! on one consumer, take what a release, a lease expiry or an eviction
//! takes, or list what status and the heartbeat read. A plan, which checks
//! the caps, may forget idle consumers and evict batches received ahead
//! before it adds its batch, does it all under one lock with
//! [`Consumers::atomically`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::PlannedBatch;
use super::consumer::{Consumer, PendingReject};
use super::store::StoredConsumer;
use super::usage::Usage;

/// A consumer's key: its table's name and its own.
pub(super) type ConsumerKey = (String, String);

/// The consumer map, as a plan sees it under the lock.
pub(super) type ConsumerMap = HashMap<ConsumerKey, Consumer>;

/// What a consumer keeps after its open batches are taken: its state to
/// store, or nothing (it is forgotten).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Left {
    Kept(StoredConsumer),
    Nothing,
}

impl Left {
    fn of(c: &Consumer) -> Self {
        if c.is_empty() {
            Left::Nothing
        } else {
            Left::Kept(c.stored())
        }
    }
}

/// The open batches of a consumer whose lease ran out, taken.
pub(super) struct Expired {
    pub(super) key: ConsumerKey,
    pub(super) batches: Vec<Arc<PlannedBatch>>,
    pub(super) left: Left,
}

/// Every consumer, behind the lock that guards the map.
#[derive(Default)]
pub(super) struct Consumers {
    map: Mutex<ConsumerMap>,
}

impl Consumers {
    fn lock(&self) -> MutexGuard<'_, ConsumerMap> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The map, for the start, before the registry is shared.
    pub(super) fn get_mut(&mut self) -> &mut ConsumerMap {
        self.map.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the whole map under one lock: a plan, whose checks and
    /// changes must see the same consumers.
    pub(super) fn atomically<T>(&self, f: impl FnOnce(&mut ConsumerMap) -> T) -> T {
        f(&mut self.lock())
    }

    /// How many consumers the registry holds.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the registry holds the consumer `key`.
    pub(super) fn contains(&self, key: &ConsumerKey) -> bool {
        self.lock().contains_key(key)
    }

    /// Runs `f` on the consumer `key`, if the registry holds it.
    pub(super) fn with<T>(
        &self,
        key: &ConsumerKey,
        f: impl FnOnce(&mut Consumer) -> T,
    ) -> Option<T> {
        self.lock().get_mut(key).map(f)
    }

    /// Runs `f` on the consumer `key`, made if the registry does not hold
    /// it (a commit's consumer, released while the commit waited).
    pub(super) fn with_or_new<T>(
        &self,
        key: &ConsumerKey,
        f: impl FnOnce(&mut Consumer) -> T,
    ) -> T {
        f(self.lock().entry(key.clone()).or_insert_with(Consumer::new))
    }

    /// Runs `f` on the consumer `key` (a release taking its batches), then
    /// forgets it if it is left with nothing; `f`'s answer and what the
    /// consumer kept, or `None` if the registry does not hold it.
    pub(super) fn take_from<T>(
        &self,
        key: &ConsumerKey,
        f: impl FnOnce(&mut Consumer) -> T,
    ) -> Option<(T, Left)> {
        let mut map = self.lock();
        let c = map.get_mut(key)?;
        let out = f(c);
        let left = Left::of(c);
        if left == Left::Nothing {
            map.remove(key);
        }
        Some((out, left))
    }

    /// Takes the open batches of every consumer whose lease ran out at
    /// `now`; a consumer left with nothing (it never committed) is
    /// forgotten, so that status does not list it.
    pub(super) fn take_expired(
        &self,
        now: Instant,
        lease: Duration,
        usage: &Usage,
    ) -> Vec<Expired> {
        let mut map = self.lock();
        let expired: Vec<Expired> = map
            .iter_mut()
            .filter(|(_, c)| c.lease_expired(now, lease))
            .map(|(key, c)| Expired {
                key: key.clone(),
                batches: c.take_open(usage),
                left: Left::of(c),
            })
            .collect();
        for e in &expired {
            if e.left == Left::Nothing {
                map.remove(&e.key);
            }
        }
        expired
    }

    /// Takes the batch received ahead of every consumer `which` names.
    pub(super) fn take_ahead(
        &self,
        usage: &Usage,
        which: impl Fn(&ConsumerKey) -> bool,
    ) -> Vec<(ConsumerKey, Arc<PlannedBatch>)> {
        take_ahead(&mut self.lock(), usage, which)
    }

    /// Takes the rejects a previous process left to give back, of every
    /// consumer that has some.
    pub(super) fn take_restored_rejects(&self) -> Vec<(ConsumerKey, Vec<PendingReject>)> {
        self.lock()
            .iter_mut()
            .filter(|(_, c)| c.has_restored_rejects())
            .map(|(k, c)| (k.clone(), c.take_restored_rejects()))
            .collect()
    }

    /// Whether any consumer holds work (see [`Consumer::holds_work`]).
    pub(super) fn any_holds_work(&self) -> bool {
        self.lock().values().any(Consumer::holds_work)
    }

    /// The open batches of every consumer, with their table's name.
    pub(super) fn open_batches(&self) -> Vec<(String, Arc<PlannedBatch>)> {
        self.lock()
            .iter()
            .flat_map(|((t, _), c)| c.open_batches().map(move |b| (t.clone(), Arc::clone(b))))
            .collect()
    }

    /// `f` of every consumer of `table`, by consumer name.
    pub(super) fn of_table<T>(
        &self,
        table: &str,
        f: impl Fn(&str, &Consumer) -> T,
    ) -> BTreeMap<String, T> {
        self.lock()
            .iter()
            .filter(|((t, _), _)| t == table)
            .map(|((_, name), c)| (name.clone(), f(name, c)))
            .collect()
    }
}

/// Takes the batch received ahead of every consumer of `map` that `which`
/// names.
pub(super) fn take_ahead(
    map: &mut ConsumerMap,
    usage: &Usage,
    which: impl Fn(&ConsumerKey) -> bool,
) -> Vec<(ConsumerKey, Arc<PlannedBatch>)> {
    map.iter_mut()
        .filter(|(k, _)| which(k))
        .filter_map(|(k, c)| Some((k.clone(), c.take_ahead(usage)?)))
        .collect()
}
