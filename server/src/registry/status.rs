//! What `status` and the metrics show of the consumers: watermark, open
//! batches, messages in flight, the age of the oldest message held, and
//! the rejects; and the registry's metrics (queue depths, streams open,
//! the series of forgotten consumers).

use std::collections::BTreeMap;

use serde::Serialize;

use super::Registry;
use crate::sqs::QueueAttributes;

/// A consumer in `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerStatus {
    pub(super) committed_batch: Option<u64>,
    pub(super) last_planned_batch: Option<u64>,
    pub(super) open_batches: Vec<u64>,
    pub(super) in_flight: u64,
    /// The batch received ahead of the consumer's next plan, if any, and
    /// the messages it holds (not in `in_flight`: not planned yet). Both
    /// absent without one, so a consumer that does not read ahead shows
    /// what it did before read-ahead existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) read_ahead_batch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) read_ahead: Option<u64>,
    /// The age now, in milliseconds, of the oldest message (by
    /// `SentTimestamp`) of the last planned batch; `None` when that batch
    /// holds no message (not read yet, empty, committed or released).
    pub(super) oldest_age_ms: Option<u64>,
    /// Messages its commits gave back to SQS since this process started.
    pub(super) rejected: u64,
    /// Its ReceiveMessage calls in flight, or whose messages are not yet
    /// recorded or handed back: SQS no longer shows those messages as
    /// visible, and nothing above counts them yet.
    pub(super) receives_in_flight: u64,
}

impl Registry {
    /// DoGet streams (and SQL peek reads) open now.
    pub fn open_streams(&self) -> i64 {
        self.metrics.doget_streams_open.get()
    }

    /// Drops every metric series of a consumer the registry forgot (a
    /// Flight SQL peek's, one whose lease expired, an idle one's that gave
    /// its place), so that the metrics do not grow with consumers that come and
    /// go. A consumer the registry still holds keeps its series.
    pub fn forget_consumer_metrics(&self, table: &str, consumer: &str) {
        let key = (table.to_string(), consumer.to_string());
        if !self.consumers.contains(&key) {
            self.metrics.forget_consumer(table, consumer);
        }
    }

    /// Sets the queue depth gauges of `table` from its queue's attributes.
    pub fn record_queue_depth(&self, table: &str, attributes: &QueueAttributes) {
        let label = crate::metrics::table_labels(table);
        let m = &self.metrics;
        m.queue_depth
            .get_or_create(&label)
            .set(attributes.visible as i64);
        m.queue_in_flight
            .get_or_create(&label)
            .set(attributes.in_flight as i64);
    }

    /// The metrics in the text exposition format, with the gauges computed
    /// from the registry set first.
    pub fn render_metrics(&self) -> String {
        self.refresh_gauges();
        self.metrics.render()
    }

    /// Sets the gauges computed from the registry, before a scrape.
    pub(super) fn refresh_gauges(&self) {
        let m = &self.metrics;
        let (messages, bytes) = self.usage.snapshot();
        m.registry_messages.set(messages as i64);
        m.registry_bytes.set(bytes as i64);
        m.registry_tickets.set(self.usage.tickets() as i64);
        m.registry_consumers.set(self.consumers.len() as i64);
        for table in self.tables.keys() {
            for (consumer, s) in self.consumer_status(table) {
                let labels = crate::metrics::consumer_labels(table, &consumer);
                m.open_batches
                    .get_or_create(&labels)
                    .set(s.open_batches.len() as i64);
                let committed = s.committed_batch.map_or(-1, |b| b as i64);
                m.committed_batch.get_or_create(&labels).set(committed);
                m.consumer_in_flight
                    .get_or_create(&labels)
                    .set(s.in_flight as i64);
                m.consumer_read_ahead
                    .get_or_create(&labels)
                    .set(s.read_ahead.unwrap_or(0) as i64);
            }
        }
    }

    /// The consumers of `table`, for `status`.
    pub fn consumer_status(&self, table: &str) -> BTreeMap<String, ConsumerStatus> {
        let now_ms = unix_now_ms();
        let calls = self.tables.get(table);
        self.consumers.of_table(table, |name, c| {
            let receiving = calls.map_or(0, |t| t.receives_in_flight(name));
            c.status(now_ms, receiving as u64)
        })
    }
}

/// Milliseconds since the Unix epoch now.
pub(super) fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The age at `now_ms` of a message sent at `sent_ms`; zero if it was
/// sent "later" (SQS's clock ahead of this host's).
pub(super) fn age_ms(now_ms: i64, sent_ms: i64) -> u64 {
    u64::try_from(now_ms.saturating_sub(sent_ms)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use crate::registry::ticket::ReceivedRows;
    use std::time::Duration;

    use sqs_flight_schemas::PlanCommand;
    use sqs_flight_schemas::message::messages_to_batch;
    use tokio::time::Instant;

    use super::*;
    use crate::config::{Config, TableConfig};
    use crate::registry::PlannedBatch;
    use crate::sqs::ReceiptHandle;

    /// Records one message sent at `sent_ms` into partition 0 of `batch`.
    fn record_sent(batch: &PlannedBatch, sent_ms: i64) {
        let message = sqs_flight_schemas::SqsMessage {
            message_id: format!("m{sent_ms}"),
            body: "b".into(),
            sent_timestamp: Some(sent_ms),
            ..Default::default()
        };
        let rows = messages_to_batch(&[message], batch.batch as i64, 0).unwrap();
        let receipt = vec![ReceiptHandle::new(format!("r{sent_ms}"))];
        let until = Instant::now() + Duration::from_secs(30);
        batch.tickets[0]
            .append(ReceivedRows::new(rows, receipt, 1, until))
            .unwrap();
    }

    #[tokio::test]
    async fn status_shows_the_age_of_the_oldest_message_of_the_newest_batch() {
        let config = Config::new(
            "127.0.0.1:0".parse().unwrap(),
            vec![TableConfig::memory("t", 0)],
        );
        let r = Registry::build(&config, None).await.unwrap();
        let plan = |batch| {
            let mut cmd = PlanCommand::new("t", "c");
            cmd.batch = Some(batch);
            cmd.partitions = Some(2);
            cmd
        };
        let age = || r.consumer_status("t")["c"].oldest_age_ms;
        const HOUR: i64 = 3_600_000;
        let now = unix_now_ms();
        let first = r.plan(&plan(1)).await.unwrap();
        assert_eq!(age(), None, "nothing received yet");
        record_sent(&first, now - 24 * HOUR);
        record_sent(&first, now - HOUR);
        let day = age().unwrap();
        assert!(day >= 24 * HOUR as u64, "the oldest message counts: {day}");

        let second = r.plan(&plan(2)).await.unwrap();
        assert_eq!(age(), None, "the newest batch holds nothing yet");
        record_sent(&second, now - HOUR);
        let hour = age().unwrap();
        assert!(
            (HOUR as u64..day).contains(&hour),
            "the newest batch's, not the older one's: {hour}"
        );

        let third = r.plan(&plan(3)).await.unwrap();
        record_sent(&third, now + HOUR);
        assert_eq!(age(), Some(0), "a timestamp ahead of this clock is age 0");
    }
}
