//! Tickets: one repeatable read of one partition of one batch.
//!
//! Tickets are opaque to clients, who pass back exactly the bytes they were
//! given. Inside they are versioned UTF-8 JSON, readable in logs and easy to
//! evolve:
//!
//! ```json
//! {"v":1,"table":"orders","consumer":"q1","batch":17,"partition":0,"plan":42}
//! ```
//!
//! `plan` identifies the planning that issued the ticket, so that a ticket
//! of a batch that was released and planned again is told apart from the
//! new plan's tickets instead of silently reading different data.

use serde::Serialize;

use crate::command::{MAX_BATCH, name_problem};
use crate::json::{FieldError, Fields};

/// The ticket format this build writes and reads.
pub const TICKET_VERSION: u64 = 1;

/// What a ticket identifies.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct TicketId {
    pub table: String,
    pub consumer: String,
    pub batch: u64,
    pub partition: u32,
    pub plan: u64,
}

impl TicketId {
    const FIELDS: &'static [&'static str] =
        &["v", "table", "consumer", "batch", "partition", "plan"];

    /// The ticket's bytes.
    pub fn encode(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Versioned<'a> {
            v: u64,
            #[serde(flatten)]
            id: &'a TicketId,
        }
        serde_json::to_vec(&Versioned {
            v: TICKET_VERSION,
            id: self,
        })
        .expect("plain struct serializes")
    }

    /// Parses ticket bytes, refusing other versions and any malformed field.
    pub fn decode(bytes: &[u8]) -> Result<Self, FieldError> {
        let mut f = Fields::parse("ticket", bytes, Self::FIELDS)?;
        let version = f.u64("v")?;
        if version != TICKET_VERSION {
            return Err(f.range(
                "v",
                version,
                format!("this server reads ticket version {TICKET_VERSION} only"),
            ));
        }
        let table = f.str("table")?;
        let consumer = f.str("consumer")?;
        let batch = f.u64("batch")?;
        let partition = f.u64("partition")?;
        let plan = f.u64("plan")?;
        for (field, name) in [("table", &table), ("consumer", &consumer)] {
            if let Some((what, limit)) = name_problem(name) {
                return Err(f.range(field, what, limit));
            }
        }
        if batch > MAX_BATCH {
            return Err(f.range("batch", batch, format!("the limit is {MAX_BATCH}")));
        }
        let partition = u32::try_from(partition)
            .map_err(|_| f.range("partition", partition, format!("the limit is {}", u32::MAX)))?;
        f.finish()?;
        Ok(Self {
            table,
            consumer,
            batch,
            partition,
            plan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> TicketId {
        TicketId {
            table: "orders".into(),
            consumer: "q1".into(),
            batch: 17,
            partition: 3,
            plan: 42,
        }
    }

    #[test]
    fn round_trip_and_documented_form() {
        let bytes = id().encode();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"v":1,"table":"orders","consumer":"q1","batch":17,"partition":3,"plan":42}"#
        );
        assert_eq!(TicketId::decode(&bytes).unwrap(), id());
    }

    #[test]
    fn malformed_tickets_are_refused() {
        let bad = [
            &b"\xff\xfe"[..],
            b"",
            b"null",
            br#"{"v":2,"table":"t","consumer":"c","batch":1,"partition":0,"plan":1}"#,
            br#"{"table":"t","consumer":"c","batch":1,"partition":0,"plan":1}"#,
            br#"{"v":1,"table":"t","consumer":"c","batch":1,"partition":0}"#,
            br#"{"v":1,"table":"t","consumer":"c","batch":1,"partition":4294967296,"plan":1}"#,
            br#"{"v":1,"table":"t","consumer":"c","batch":1,"partition":0,"plan":1,"x":0}"#,
            br#"{"v":1,"table":"t","consumer":"c","batch":-1,"partition":0,"plan":1}"#,
            br#"{"v":1,"v":1,"table":"t","consumer":"c","batch":1,"partition":0,"plan":1}"#,
        ];
        for b in bad {
            assert!(
                TicketId::decode(b).is_err(),
                "{:?}",
                String::from_utf8_lossy(b)
            );
        }
    }

    #[test]
    fn a_bad_name_is_blamed_on_its_own_field() {
        let long = "c".repeat(crate::command::MAX_NAME_LEN + 1);
        let t = TicketId {
            consumer: long,
            ..id()
        };
        let e = TicketId::decode(&t.encode()).unwrap_err().to_string();
        assert!(e.contains("`consumer`"), "{e}");
    }
}
