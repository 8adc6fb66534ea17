//! What the registry holds, against its budget: the messages held for
//! replay and their bytes, and the tickets of the open batches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Messages and bytes held for replay across all tickets, and the tickets
/// of every open batch.
#[derive(Debug, Default)]
pub struct Usage {
    messages: AtomicU64,
    bytes: AtomicU64,
    tickets: AtomicU64,
}

impl Usage {
    pub fn add(&self, messages: u64, bytes: u64) {
        self.messages.fetch_add(messages, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn remove(&self, messages: u64, bytes: u64) {
        self.messages.fetch_sub(messages, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// (messages, bytes) held now.
    pub fn snapshot(&self) -> (u64, u64) {
        (
            self.messages.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Counts `messages` and `bytes` until the answer is dropped: what a
    /// receive loop holds before its ticket does.
    pub fn hold(self: &Arc<Self>, messages: u64, bytes: u64) -> Held {
        self.add(messages, bytes);
        Held {
            usage: Arc::clone(self),
            messages,
            bytes,
        }
    }

    /// Counts the tickets of batches put into a consumer's open batches.
    pub fn add_tickets(&self, n: u64) {
        self.tickets.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts the tickets of batches taken out of a consumer's open batches
    /// (committed, released, expired).
    pub fn remove_tickets(&self, n: u64) {
        self.tickets.fetch_sub(n, Ordering::Relaxed);
    }

    /// Tickets of the open batches now.
    pub fn tickets(&self) -> u64 {
        self.tickets.load(Ordering::Relaxed)
    }
}

/// Messages and bytes counted in a [`Usage`] while this lives.
#[derive(Debug)]
pub struct Held {
    usage: Arc<Usage>,
    messages: u64,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.usage.remove(self.messages, self.bytes);
    }
}
