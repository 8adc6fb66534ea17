//! Prometheus metrics, one registry per server (no global state, so that
//! several servers in one process each count their own).
//!
//! Labels are table, consumer, SQS operation and SQS error code only: never
//! a message id or anything else of unbounded cardinality.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry as PromRegistry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TableConsumer {
    pub(crate) table: String,
    pub(crate) consumer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TableLabel {
    pub(crate) table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TableReason {
    pub(crate) table: String,
    pub(crate) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SqsCall {
    pub(crate) table: String,
    pub(crate) operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TableOutcome {
    pub(crate) table: String,
    pub(crate) outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SqsErrorLabel {
    pub(crate) table: String,
    pub(crate) operation: String,
    pub(crate) code: String,
}

type Counters<L> = Family<L, Counter>;
type Gauges<L> = Family<L, Gauge<i64, AtomicI64>>;
type AtomicI64 = std::sync::atomic::AtomicI64;

/// Every metric the server exports.
pub struct Metrics {
    registry: PromRegistry,
    pub(crate) received: Counters<TableConsumer>,
    pub(crate) replayed: Counters<TableConsumer>,
    pub(crate) deleted: Counters<TableConsumer>,
    pub(crate) released: Counters<TableConsumer>,
    pub(crate) expired: Counters<TableConsumer>,
    /// Messages given back to SQS at commit (`reject`) instead of deleted.
    pub(crate) rejected: Counters<TableConsumer>,
    pub(crate) sqs_seconds: Family<SqsCall, Histogram>,
    /// Age of each message at its first receive into a ticket.
    message_age: Family<TableLabel, Histogram>,
    pub(crate) sqs_errors: Counters<SqsErrorLabel>,
    pub(crate) heartbeat_extended: Counters<TableLabel>,
    pub(crate) heartbeat_failures: Counters<TableLabel>,
    /// SQS duplicates that added no row, by reason (`held`, `committed`).
    pub(crate) duplicates_dropped: Counters<TableReason>,
    /// Large payloads' S3 objects, by what became of them (`read`,
    /// `read_failed`, `deleted`, `delete_failed`).
    pub(crate) large_payloads: Counters<TableOutcome>,
    pub(crate) doget_streams_open: Gauge<i64, AtomicI64>,
    /// Flight SQL statements planning or running in worker processes.
    pub(crate) sql_queries_running: Gauge<i64, AtomicI64>,
    pub(crate) registry_messages: Gauge<i64, AtomicI64>,
    pub(crate) registry_bytes: Gauge<i64, AtomicI64>,
    /// Consumers the registry holds (`max_consumers`).
    pub(crate) registry_consumers: Gauge<i64, AtomicI64>,
    /// Tickets of open batches the registry holds (`max_tickets`).
    pub(crate) registry_tickets: Gauge<i64, AtomicI64>,
    pub(crate) open_batches: Gauges<TableConsumer>,
    pub(crate) committed_batch: Gauges<TableConsumer>,
    pub(crate) consumer_in_flight: Gauges<TableConsumer>,
    pub(crate) consumer_read_ahead: Gauges<TableConsumer>,
    pub(crate) queue_depth: Gauges<TableLabel>,
    pub(crate) queue_in_flight: Gauges<TableLabel>,
    /// Calls the SQS endpoint's congestion window allows in flight now
    /// (`sqs_max_connections` until the endpoint pushes back).
    pub(crate) sqs_window: Gauges<TableLabel>,
    /// SQS attempts the endpoint pushed back (503, 429, throttling, no
    /// connection), counted by the window of the table's endpoint.
    pub(crate) sqs_push_backs: Counters<TableLabel>,
}

fn call_histogram() -> Histogram {
    // 1 ms .. ~33 s
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn age_histogram() -> Histogram {
    // 0.1 s .. 0.1 s * 2^24 (about 19.4 days): past SQS's longest
    // retention, 14 days, so no real age lands in +Inf.
    Histogram::new(exponential_buckets(0.1, 2.0, 25))
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = PromRegistry::with_prefix("sqsf");
        let m = Self {
            received: Counters::default(),
            replayed: Counters::default(),
            deleted: Counters::default(),
            released: Counters::default(),
            expired: Counters::default(),
            rejected: Counters::default(),
            sqs_seconds: Family::new_with_constructor(call_histogram),
            message_age: Family::new_with_constructor(age_histogram),
            sqs_errors: Counters::default(),
            heartbeat_extended: Counters::default(),
            heartbeat_failures: Counters::default(),
            duplicates_dropped: Counters::default(),
            large_payloads: Counters::default(),
            doget_streams_open: Gauge::default(),
            sql_queries_running: Gauge::default(),
            registry_messages: Gauge::default(),
            registry_bytes: Gauge::default(),
            registry_consumers: Gauge::default(),
            registry_tickets: Gauge::default(),
            open_batches: Gauges::default(),
            committed_batch: Gauges::default(),
            consumer_in_flight: Gauges::default(),
            consumer_read_ahead: Gauges::default(),
            queue_depth: Gauges::default(),
            queue_in_flight: Gauges::default(),
            sqs_window: Gauges::default(),
            sqs_push_backs: Counters::default(),
            registry: PromRegistry::default(),
        };
        let r = &mut registry;
        r.register(
            "messages_received",
            "Messages received from SQS and recorded",
            m.received.clone(),
        );
        r.register(
            "duplicates_dropped",
            "Messages SQS delivered again that added no row: held already, or committed within the window",
            m.duplicates_dropped.clone(),
        );
        r.register(
            "large_payloads",
            "Large payloads' S3 objects read into rows, not read (the row has a payload_error), and deleted after their message's commit",
            m.large_payloads.clone(),
        );
        r.register(
            "messages_replayed",
            "Rows streamed again by replayed tickets",
            m.replayed.clone(),
        );
        r.register(
            "messages_deleted",
            "Messages deleted at commit",
            m.deleted.clone(),
        );
        r.register(
            "messages_released",
            "Messages made visible by release or lease expiry",
            m.released.clone(),
        );
        r.register(
            "messages_expired",
            "Receipts SQS refused at commit (message redelivered)",
            m.expired.clone(),
        );
        r.register(
            "messages_rejected",
            "Messages given back to SQS at commit (rejected) instead of deleted",
            m.rejected.clone(),
        );
        r.register(
            "sqs_call_seconds",
            "Latency of SQS calls",
            m.sqs_seconds.clone(),
        );
        r.register(
            "message_age_seconds",
            "Age of messages (now minus SentTimestamp) at their first receive",
            m.message_age.clone(),
        );
        r.register(
            "sqs_errors",
            "Failed SQS calls by error code",
            m.sqs_errors.clone(),
        );
        r.register(
            "heartbeat_extended",
            "Messages whose visibility the heartbeat extended",
            m.heartbeat_extended.clone(),
        );
        r.register(
            "heartbeat_failures",
            "Failed heartbeat extension calls",
            m.heartbeat_failures.clone(),
        );
        r.register(
            "doget_streams_open",
            "DoGet streams open now",
            m.doget_streams_open.clone(),
        );
        r.register(
            "sql_queries_running",
            "Flight SQL statements planning or running in worker processes now",
            m.sql_queries_running.clone(),
        );
        r.register(
            "registry_messages",
            "Uncommitted messages held for replay",
            m.registry_messages.clone(),
        );
        r.register(
            "registry_bytes",
            "Bytes of uncommitted messages held for replay",
            m.registry_bytes.clone(),
        );
        r.register(
            "registry_consumers",
            "Consumers the registry holds",
            m.registry_consumers.clone(),
        );
        r.register(
            "registry_tickets",
            "Tickets of planned, uncommitted batches",
            m.registry_tickets.clone(),
        );
        r.register(
            "open_batches",
            "Planned, uncommitted batches",
            m.open_batches.clone(),
        );
        r.register(
            "committed_batch",
            "Committed watermark (-1: none)",
            m.committed_batch.clone(),
        );
        r.register(
            "consumer_in_flight",
            "Uncommitted messages held per consumer",
            m.consumer_in_flight.clone(),
        );
        r.register(
            "consumer_read_ahead",
            "Messages held in the batch received ahead of a consumer's next plan",
            m.consumer_read_ahead.clone(),
        );
        r.register(
            "queue_depth",
            "ApproximateNumberOfMessages, polled",
            m.queue_depth.clone(),
        );
        r.register(
            "queue_in_flight",
            "ApproximateNumberOfMessagesNotVisible, polled",
            m.queue_in_flight.clone(),
        );
        r.register(
            "sqs_window",
            "Calls the SQS endpoint's congestion window allows in flight now",
            m.sqs_window.clone(),
        );
        r.register(
            "sqs_push_backs",
            "SQS call attempts the endpoint pushed back (503, 429, throttling, no connection)",
            m.sqs_push_backs.clone(),
        );
        Self { registry, ..m }
    }

    /// Counts `n` duplicates of `table` dropped for `reason`.
    pub(crate) fn duplicates(&self, table: &str, reason: &str, n: u64) {
        if n > 0 {
            let labels = TableReason {
                table: table.to_string(),
                reason: reason.to_string(),
            };
            self.duplicates_dropped.get_or_create(&labels).inc_by(n);
        }
    }

    /// Counts `n` large payloads' objects of `table` with `outcome`.
    pub(crate) fn large_payloads(&self, table: &str, outcome: &str, n: u64) {
        if n > 0 {
            let labels = TableOutcome {
                table: table.to_string(),
                outcome: outcome.to_string(),
            };
            self.large_payloads.get_or_create(&labels).inc_by(n);
        }
    }

    /// The text exposition format.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Drops every series of one consumer (once the registry forgot it), so
    /// that the metrics do not grow with consumers that come and go.
    pub(crate) fn forget_consumer(&self, table: &str, consumer: &str) {
        let labels = consumer_labels(table, consumer);
        for family in [
            &self.received,
            &self.replayed,
            &self.deleted,
            &self.released,
            &self.expired,
            &self.rejected,
        ] {
            family.remove(&labels);
        }
        for family in [
            &self.open_batches,
            &self.committed_batch,
            &self.consumer_in_flight,
            &self.consumer_read_ahead,
        ] {
            family.remove(&labels);
        }
    }

    /// Adds `n` to a table/consumer counter.
    pub(crate) fn count(family: &Counters<TableConsumer>, table: &str, consumer: &str, n: u64) {
        if n > 0 {
            family
                .get_or_create(&consumer_labels(table, consumer))
                .inc_by(n);
        }
    }

    /// Records the age of messages of `table` received now, at
    /// `now_ms`, from their `SentTimestamp`s; an age below zero (clocks
    /// apart) counts as zero.
    pub(crate) fn message_ages(
        &self,
        table: &str,
        now_ms: i64,
        sent_ms: impl IntoIterator<Item = i64>,
    ) {
        let histogram = self.message_age.get_or_create(&table_labels(table));
        for sent in sent_ms {
            let age_ms = now_ms.saturating_sub(sent).max(0);
            histogram.observe(age_ms as f64 / 1000.0);
        }
    }

    /// Records one SQS call.
    pub(crate) fn sqs_call(
        &self,
        table: &str,
        operation: &str,
        took: Duration,
        error_code: Option<&str>,
    ) {
        let call = SqsCall {
            table: table.to_string(),
            operation: operation.to_string(),
        };
        self.sqs_seconds
            .get_or_create(&call)
            .observe(took.as_secs_f64());
        if let Some(code) = error_code {
            let label = SqsErrorLabel {
                table: call.table,
                operation: call.operation,
                code: code.to_string(),
            };
            self.sqs_errors.get_or_create(&label).inc();
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The labels of one consumer's series: its table and its name.
pub(crate) fn consumer_labels(table: &str, consumer: &str) -> TableConsumer {
    TableConsumer {
        table: table.to_string(),
        consumer: consumer.to_string(),
    }
}

/// The labels of one table's series.
pub(crate) fn table_labels(table: &str) -> TableLabel {
    TableLabel {
        table: table.to_string(),
    }
}

/// Keeps `doget_streams_open` right however a stream ends.
pub(crate) struct OpenStream(pub Arc<Metrics>);

impl OpenStream {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        metrics.doget_streams_open.inc();
        Self(metrics)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.doget_streams_open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_their_labels() {
        let m = Metrics::new();
        Metrics::count(&m.deleted, "orders", "q1", 7);
        m.sqs_call(
            "orders",
            "ReceiveMessage",
            Duration::from_millis(3),
            Some("Throttling"),
        );
        let text = m.render();
        assert!(
            text.contains(r#"sqsf_messages_deleted_total{table="orders",consumer="q1"} 7"#),
            "{text}"
        );
        assert!(text.contains(r#"sqsf_sqs_errors_total{table="orders",operation="ReceiveMessage",code="Throttling"} 1"#), "{text}");
        assert!(text.contains("sqsf_sqs_call_seconds_count"), "{text}");
    }

    #[test]
    fn message_ages_land_in_their_buckets_and_never_below_zero() {
        let m = Metrics::new();
        let now = 1_000_000_000_000;
        let day = 86_400_000;
        m.message_ages("orders", now, [now + 5_000, now - 50, now - 14 * day]);
        let text = m.render();
        let bucket = |le: &str| {
            let series = format!(r#"sqsf_message_age_seconds_bucket{{le="{le}",table="orders"}} "#);
            let line = text.lines().find(|l| l.starts_with(&series));
            line.unwrap_or_else(|| panic!("no {series} in {text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(bucket("0.1"), "2", "ahead of this clock counts as 0; 50 ms");
        assert_eq!(bucket("819.2"), "2");
        assert_eq!(bucket("1677721.6"), "3", "14 days are in a finite bucket");
        assert_eq!(bucket("+Inf"), "3");
        assert!(
            text.contains(r#"sqsf_message_age_seconds_count{table="orders"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sqsf_message_age_seconds_sum{table="orders"} 1209600.05"#),
            "the age ahead of this clock adds 0 to the sum: {text}"
        );
    }
}
