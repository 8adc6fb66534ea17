//! What the registry holds, against its budget.

use std::sync::atomic::{AtomicU64, Ordering};

/// Messages and bytes held for replay across all tickets.
#[derive(Debug, Default)]
pub struct Usage {
    messages: AtomicU64,
    bytes: AtomicU64,
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
}
