//! What a commit gives back to SQS instead of deleting: the rejects of
//! DoAction `commit` (docs/protocol.md, "commit").

use std::time::Duration;

use sqs_flight_schemas::CommitCommand;

/// The rejects of one commit: messages of the consumer's open batches up to
/// the committed one that go back to SQS instead of being deleted. The
/// default rejects nothing (a plain commit).
///
/// ```
/// use std::time::Duration;
/// use sqs_flight_client::CommitOptions;
///
/// let options = CommitOptions {
///     reject: vec!["6f1c0e0a-3a8e-4c47-9a51-0d8f6e5b7c21".into()],
///     reject_delay: Some(Duration::from_secs(60)),
///     ..CommitOptions::default()
/// };
/// let cmd = options.command("orders", "etl", 7);
/// assert_eq!(cmd.reject_delay_seconds, Some(60));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitOptions {
    /// Message ids to give back (each at most once, at most
    /// [`sqs_flight_schemas::command::MAX_REJECT_IDS`]).
    pub reject: Vec<String>,
    /// How long the rejected messages stay invisible (whole seconds, at
    /// most 12 hours); `None`: visible again at once.
    pub reject_delay: Option<Duration>,
    /// Also give back every message whose typed payload did not decode.
    pub reject_payload_errors: bool,
}

impl CommitOptions {
    /// The commit command of `batch` of `consumer` with these rejects. A
    /// delay with nothing to reject is left out (the server would refuse it).
    pub fn command(&self, table: &str, consumer: &str, batch: u64) -> CommitCommand {
        let rejects = !self.reject.is_empty() || self.reject_payload_errors;
        let delay = self
            .reject_delay
            .filter(|_| rejects)
            .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        CommitCommand {
            reject: self.reject.clone(),
            reject_delay_seconds: delay,
            reject_payload_errors: self.reject_payload_errors,
            ..CommitCommand::new(table, consumer, batch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rejects_is_a_plain_commit() {
        let plain = CommitOptions {
            reject_delay: Some(Duration::from_secs(5)),
            ..CommitOptions::default()
        };
        assert_eq!(
            plain.command("t", "c", 3).to_json(),
            CommitCommand::new("t", "c", 3).to_json()
        );
        let errors = CommitOptions {
            reject_payload_errors: true,
            reject_delay: Some(Duration::from_secs(5)),
            ..CommitOptions::default()
        };
        let cmd = errors.command("t", "c", 3);
        assert!(cmd.reject_payload_errors);
        assert_eq!(cmd.reject_delay_seconds, Some(5));
    }
}
