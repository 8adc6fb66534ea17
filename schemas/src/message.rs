//! Received SQS messages and their conversion into Arrow record batches.

use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, MapBuilder, MapFieldNames, StringBuilder, TimestampMillisecondBuilder,
};
use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch};
use arrow_schema::ArrowError;

use crate::schema::{TIMESTAMP_TZ, table_schema};

/// One received SQS message, in plain Rust types.
///
/// The receipt handle is deliberately not part of it: handles stay in the
/// server's registry and never reach a column.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SqsMessage {
    pub message_id: String,
    pub body: String,
    pub md5_of_body: Option<String>,
    /// `SentTimestamp`, milliseconds since the epoch.
    pub sent_timestamp: Option<i64>,
    /// `ApproximateFirstReceiveTimestamp`, milliseconds since the epoch.
    pub first_receive_timestamp: Option<i64>,
    /// `ApproximateReceiveCount`.
    pub receive_count: Option<i32>,
    pub sender_id: Option<String>,
    pub message_group_id: Option<String>,
    pub message_deduplication_id: Option<String>,
    pub sequence_number: Option<String>,
    /// Message attributes as text (Binary values base64-encoded), sorted by
    /// name so that the same message always yields the same map.
    pub message_attributes: Vec<(String, String)>,
}

impl SqsMessage {
    /// Bytes this message holds in memory, for the registry's budgets.
    pub fn size(&self) -> usize {
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let attributes: usize = self
            .message_attributes
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        self.message_id.len()
            + self.body.len()
            + opt(&self.md5_of_body)
            + opt(&self.sender_id)
            + opt(&self.message_group_id)
            + opt(&self.message_deduplication_id)
            + opt(&self.sequence_number)
            + attributes
    }
}

/// Builds record batches of the table schema from received messages.
///
/// One builder is used per receive: append the messages, then
/// [`finish`](Self::finish) with the batch and partition they were read in.
pub struct MessageBatchBuilder {
    message_id: StringBuilder,
    body: StringBuilder,
    md5_of_body: StringBuilder,
    sent_timestamp: TimestampMillisecondBuilder,
    first_receive_timestamp: TimestampMillisecondBuilder,
    receive_count: Int32Builder,
    sender_id: StringBuilder,
    message_group_id: StringBuilder,
    message_deduplication_id: StringBuilder,
    sequence_number: StringBuilder,
    message_attributes: MapBuilder<StringBuilder, StringBuilder>,
    rows: usize,
}

impl MessageBatchBuilder {
    /// A builder with room for `capacity` messages.
    pub fn with_capacity(capacity: usize) -> Self {
        let names = MapFieldNames {
            entry: "entries".into(),
            key: "keys".into(),
            value: "values".into(),
        };
        Self {
            message_id: StringBuilder::with_capacity(capacity, capacity * 36),
            body: StringBuilder::with_capacity(capacity, capacity * 256),
            md5_of_body: StringBuilder::with_capacity(capacity, capacity * 32),
            sent_timestamp: TimestampMillisecondBuilder::with_capacity(capacity)
                .with_timezone(TIMESTAMP_TZ),
            first_receive_timestamp: TimestampMillisecondBuilder::with_capacity(capacity)
                .with_timezone(TIMESTAMP_TZ),
            receive_count: Int32Builder::with_capacity(capacity),
            sender_id: StringBuilder::with_capacity(capacity, capacity * 21),
            message_group_id: StringBuilder::new(),
            message_deduplication_id: StringBuilder::new(),
            sequence_number: StringBuilder::new(),
            message_attributes: MapBuilder::new(
                Some(names),
                StringBuilder::new(),
                StringBuilder::new(),
            ),
            rows: 0,
        }
    }

    /// Rows appended since the last `finish`.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// True when no row was appended since the last `finish`.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Appends one message as a row.
    pub fn append(&mut self, m: &SqsMessage) {
        self.message_id.append_value(&m.message_id);
        self.body.append_value(&m.body);
        self.md5_of_body.append_option(m.md5_of_body.as_deref());
        self.sent_timestamp.append_option(m.sent_timestamp);
        self.first_receive_timestamp
            .append_option(m.first_receive_timestamp);
        self.receive_count.append_option(m.receive_count);
        self.sender_id.append_option(m.sender_id.as_deref());
        self.message_group_id
            .append_option(m.message_group_id.as_deref());
        self.message_deduplication_id
            .append_option(m.message_deduplication_id.as_deref());
        self.sequence_number
            .append_option(m.sequence_number.as_deref());
        for (k, v) in &m.message_attributes {
            self.message_attributes.keys().append_value(k);
            self.message_attributes.values().append_value(v);
        }
        // Appending to a MapBuilder only fails when keys and values differ
        // in length, which the loop above rules out.
        self.message_attributes
            .append(true)
            .expect("keys and values appended in pairs");
        self.rows += 1;
    }

    /// Finishes the appended rows into a batch read in `batch` / `partition`.
    pub fn finish(&mut self, batch: i64, partition: i32) -> Result<RecordBatch, ArrowError> {
        let rows = std::mem::take(&mut self.rows);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.message_id.finish()),
            Arc::new(self.body.finish()),
            Arc::new(self.md5_of_body.finish()),
            Arc::new(self.sent_timestamp.finish()),
            Arc::new(self.first_receive_timestamp.finish()),
            Arc::new(self.receive_count.finish()),
            Arc::new(self.sender_id.finish()),
            Arc::new(self.message_group_id.finish()),
            Arc::new(self.message_deduplication_id.finish()),
            Arc::new(self.sequence_number.finish()),
            Arc::new(self.message_attributes.finish()),
            Arc::new(Int64Array::from_value(batch, rows)),
            Arc::new(Int32Array::from_value(partition, rows)),
        ];
        RecordBatch::try_new(table_schema(), columns)
    }
}

impl Default for MessageBatchBuilder {
    fn default() -> Self {
        Self::with_capacity(10)
    }
}

/// Converts messages into one record batch.
pub fn messages_to_batch<'a>(
    messages: impl IntoIterator<Item = &'a SqsMessage>,
    batch: i64,
    partition: i32,
) -> Result<RecordBatch, ArrowError> {
    let mut builder = MessageBatchBuilder::default();
    for m in messages {
        builder.append(m);
    }
    builder.finish(batch, partition)
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, Int64Type, TimestampMillisecondType};

    use super::*;

    fn sample(i: usize) -> SqsMessage {
        SqsMessage {
            message_id: format!("id-{i}"),
            body: format!("{{\"n\":{i}}}"),
            md5_of_body: Some("d41d8cd98f00b204e9800998ecf8427e".into()),
            sent_timestamp: Some(1_700_000_000_000 + i as i64),
            first_receive_timestamp: None,
            receive_count: Some(1),
            sender_id: Some("AIDAEXAMPLE".into()),
            message_group_id: i.is_multiple_of(2).then(|| "g".to_string()),
            message_deduplication_id: None,
            sequence_number: None,
            message_attributes: vec![("kind".into(), format!("k{i}"))],
        }
    }

    #[test]
    fn rows_carry_every_field_and_the_batch_coordinates() {
        let msgs: Vec<_> = (0..3).map(sample).collect();
        let batch = messages_to_batch(&msgs, 7, 2).unwrap();
        assert_eq!(batch.num_rows(), 3);
        assert_eq!(batch.schema(), table_schema());
        let ids = batch.column(0).as_string::<i32>();
        assert_eq!(ids.value(2), "id-2");
        let sent = batch.column(3).as_primitive::<TimestampMillisecondType>();
        assert_eq!(sent.value(1), 1_700_000_000_001);
        assert!(batch.column(4).is_null(0));
        assert_eq!(batch.column(5).as_primitive::<Int32Type>().value(0), 1);
        let groups = batch.column(7).as_string::<i32>();
        assert_eq!(groups.value(0), "g");
        assert!(groups.is_null(1));
        let attrs = batch.column(10).as_map();
        let first = attrs.value(1);
        assert_eq!(first.column(0).as_string::<i32>().value(0), "kind");
        assert_eq!(first.column(1).as_string::<i32>().value(0), "k1");
        assert_eq!(batch.column(11).as_primitive::<Int64Type>().value(2), 7);
        assert_eq!(batch.column(12).as_primitive::<Int32Type>().value(2), 2);
    }

    #[test]
    fn builder_is_reusable_and_empty_batches_keep_the_schema() {
        let mut b = MessageBatchBuilder::default();
        b.append(&sample(1));
        assert_eq!(b.finish(1, 0).unwrap().num_rows(), 1);
        assert!(b.is_empty());
        let empty = b.finish(1, 0).unwrap();
        assert_eq!(empty.num_rows(), 0);
        assert_eq!(empty.schema(), table_schema());
    }

    #[test]
    fn size_counts_strings() {
        let m = SqsMessage {
            message_id: "abc".into(),
            body: "12345".into(),
            message_attributes: vec![("k".into(), "vv".into())],
            ..Default::default()
        };
        assert_eq!(m.size(), 3 + 5 + 1 + 2);
    }
}
