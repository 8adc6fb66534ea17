//! The JSON answers of the DoActions `commit`, `release` and `status`.
//!
//! Unknown fields are ignored, so that a newer server that adds a field does
//! not break an older client.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The answer of `commit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    /// The consumer's committed watermark after this commit.
    pub committed_batch: u64,
    /// Messages deleted from SQS by this commit.
    pub deleted: u64,
    /// Messages SQS refused to delete because their receipt had expired
    /// (they were redelivered and will be read again).
    pub expired: u64,
    /// Messages given back to SQS by this commit (its rejects); 0 from a
    /// server older than rejects.
    #[serde(default)]
    pub rejected: u64,
}

/// The answer of `release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    /// Messages made visible again.
    pub released: u64,
}

/// The answer of `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub tables: BTreeMap<String, TableStatus>,
}

/// One table in `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableStatus {
    /// SQS's ApproximateNumberOfMessages: visible, waiting to be read;
    /// `None` when the server could not read the queue's counts (`error`).
    pub approximate_depth: Option<u64>,
    /// SQS's ApproximateNumberOfMessagesNotVisible: received, not deleted.
    pub approximate_in_flight: Option<u64>,
    /// Why the counts are missing (a deleted queue, SQS down): only in a
    /// status of every table; a status of one table fails instead.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub consumers: BTreeMap<String, ConsumerStatus>,
}

/// One consumer of a table in `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerStatus {
    pub committed_batch: Option<u64>,
    pub last_planned_batch: Option<u64>,
    #[serde(default)]
    pub open_batches: Vec<u64>,
    /// Messages the server holds invisible for this consumer.
    pub in_flight: u64,
    /// The age in milliseconds of the oldest message (by `SentTimestamp`)
    /// of the last planned batch; `None` while that batch holds none (and
    /// from servers that predate it).
    #[serde(default)]
    pub oldest_age_ms: Option<u64>,
    /// Messages its commits gave back to SQS since the server started.
    #[serde(default)]
    pub rejected: u64,
    /// The batch the server received ahead of this consumer's next plan,
    /// if any (see docs/protocol.md, "Read-ahead").
    #[serde(default)]
    pub read_ahead_batch: Option<u64>,
    /// Messages held in that batch (not in `in_flight`).
    #[serde(default)]
    pub read_ahead: u64,
    /// Its ReceiveMessage calls in flight, or whose messages are not yet
    /// recorded or handed back (counted in neither `in_flight`,
    /// `read_ahead` nor the queue's visible depth).
    #[serde(default)]
    pub receives_in_flight: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_parses_the_documented_shape() {
        let json = r#"{"tables": {"orders": {"approximate_depth": 3, "approximate_in_flight": 2,
            "consumers": {"q1": {"committed_batch": 4, "last_planned_batch": 6,
            "open_batches": [5, 6], "in_flight": 2, "oldest_age_ms": 73250}, "q2": {"committed_batch": null,
            "last_planned_batch": null, "open_batches": [], "in_flight": 0}}}}}"#;
        let s: Status = serde_json::from_str(json).unwrap();
        let t = &s.tables["orders"];
        assert_eq!(
            (t.approximate_depth, t.approximate_in_flight),
            (Some(3), Some(2))
        );
        assert_eq!(t.consumers["q1"].open_batches, [5, 6]);
        assert_eq!(t.consumers["q2"].committed_batch, None);
        assert_eq!(t.consumers["q1"].oldest_age_ms, Some(73_250));
        assert_eq!(
            t.consumers["q2"].oldest_age_ms, None,
            "older servers send none"
        );
    }

    #[test]
    fn answers_tolerate_new_fields() {
        let c: Committed =
            serde_json::from_str(r#"{"committed_batch":2,"deleted":5,"expired":0,"new":1}"#)
                .unwrap();
        assert_eq!((c.deleted, c.rejected), (5, 0));
        let r: Released = serde_json::from_str(r#"{"released":7}"#).unwrap();
        assert_eq!(r.released, 7);
    }
}
