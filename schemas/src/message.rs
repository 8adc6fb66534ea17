//! Received SQS messages and their conversion into Arrow record batches.

use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, Int32Builder, MapBuilder, MapFieldNames, PrimitiveBuilder, StringBuilder,
    TimestampMillisecondBuilder,
};
use arrow_array::types::ArrowPrimitiveType;
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, RecordBatch, new_empty_array};
use arrow_schema::{ArrowError, DataType};

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
///
/// Every column is sized for the builder's row capacity, and each text
/// column's values for that many values of the length of the first one
/// appended (SQS ids, digests and the bodies of one receive are mostly of
/// one length), so that a finished batch's buffers are about as large as
/// its content: the server keeps every batch until it is committed, and
/// memory left over in each 10-row batch multiplies by the messages held.
/// A column whose estimate was far off is trimmed when finished.
pub struct MessageBatchBuilder {
    rows_hint: usize,
    message_id: TextColumn,
    body: TextColumn,
    md5_of_body: TextColumn,
    sent_timestamp: TimestampMillisecondBuilder,
    first_receive_timestamp: TimestampMillisecondBuilder,
    receive_count: Int32Builder,
    sender_id: TextColumn,
    message_group_id: TextColumn,
    message_deduplication_id: TextColumn,
    sequence_number: TextColumn,
    message_attributes: MapBuilder<StringBuilder, StringBuilder>,
    /// The map's key and value builders were sized for this batch.
    attributes_sized: bool,
    rows: usize,
}

/// Spare capacity a finished column may keep without being trimmed: one
/// cache line, or a quarter of what it holds.
fn too_loose(spare: usize, used: usize) -> bool {
    spare > 64 + used / 4
}

/// A Utf8 column whose buffers are allocated for one batch: offsets (and
/// validity, when a null comes) for the expected rows, values sized at the
/// first value.
struct TextColumn {
    rows: usize,
    /// None until the first append of a batch.
    builder: Option<StringBuilder>,
    /// The values buffer was sized in this batch.
    sized: bool,
}

impl TextColumn {
    fn new(rows: usize) -> Self {
        Self {
            rows,
            builder: None,
            sized: false,
        }
    }

    fn append(&mut self, value: Option<&str>) {
        match value {
            None => {
                let rows = self.rows;
                self.builder
                    .get_or_insert_with(|| StringBuilder::with_capacity(rows, 0))
                    .append_null();
            }
            Some(v) => {
                if !self.sized {
                    self.size_for(v.len());
                }
                if let Some(b) = &mut self.builder {
                    b.append_value(v);
                }
            }
        }
    }

    /// Makes room for the rest of the batch's values at `len` bytes each.
    /// Only nulls can precede the first value.
    fn size_for(&mut self, len: usize) {
        self.sized = true;
        let nulls = self.builder.as_ref().map_or(0, |b| b.len());
        let left = self.rows.saturating_sub(nulls).max(1);
        let mut b = StringBuilder::with_capacity(self.rows.max(nulls + 1), left * len);
        b.append_nulls(nulls);
        self.builder = Some(b);
    }

    fn finish(&mut self) -> ArrayRef {
        self.sized = false;
        let Some(mut b) = self.builder.take() else {
            return new_empty_array(&DataType::Utf8);
        };
        let values = b.values_slice().len();
        let offsets = b.offsets_slice().len();
        let spare = (b.values_capacity() - values) + (b.offsets_capacity() - offsets) * 4;
        let mut array = b.finish();
        if too_loose(spare, values + offsets * 4) {
            array.shrink_to_fit();
        }
        Arc::new(array)
    }
}

/// Finishes a primitive column, trimmed if it grew far past its rows.
fn finish_primitive<T: ArrowPrimitiveType>(b: &mut PrimitiveBuilder<T>) -> ArrayRef {
    let width = std::mem::size_of::<T::Native>();
    let used = b.len() * width;
    let spare = b.capacity() * width - used;
    let mut array = b.finish();
    if too_loose(spare, used) {
        array.shrink_to_fit();
    }
    Arc::new(array)
}

impl MessageBatchBuilder {
    /// A builder with room for `capacity` messages per batch.
    pub fn with_capacity(capacity: usize) -> Self {
        let rows = capacity.max(1);
        Self {
            rows_hint: rows,
            message_id: TextColumn::new(rows),
            body: TextColumn::new(rows),
            md5_of_body: TextColumn::new(rows),
            sent_timestamp: timestamps(rows),
            first_receive_timestamp: timestamps(rows),
            receive_count: Int32Builder::with_capacity(rows),
            sender_id: TextColumn::new(rows),
            message_group_id: TextColumn::new(rows),
            message_deduplication_id: TextColumn::new(rows),
            sequence_number: TextColumn::new(rows),
            message_attributes: attributes(rows),
            attributes_sized: false,
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
        self.message_id.append(Some(&m.message_id));
        self.body.append(Some(&m.body));
        self.md5_of_body.append(m.md5_of_body.as_deref());
        self.sent_timestamp.append_option(m.sent_timestamp);
        self.first_receive_timestamp
            .append_option(m.first_receive_timestamp);
        self.receive_count.append_option(m.receive_count);
        self.sender_id.append(m.sender_id.as_deref());
        self.message_group_id.append(m.message_group_id.as_deref());
        self.message_deduplication_id
            .append(m.message_deduplication_id.as_deref());
        self.sequence_number.append(m.sequence_number.as_deref());
        if !m.message_attributes.is_empty() && !self.attributes_sized {
            self.size_attributes(&m.message_attributes);
        }
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

    /// Sizes the map's keys and values for the rest of the batch at the
    /// first message with attributes: as many entries, of the same lengths.
    fn size_attributes(&mut self, first: &[(String, String)]) {
        self.attributes_sized = true;
        let left = self.rows_hint.saturating_sub(self.rows).max(1);
        let entries = left * first.len();
        let key_bytes: usize = first.iter().map(|(k, _)| k.len()).sum();
        let value_bytes: usize = first.iter().map(|(_, v)| v.len()).sum();
        let (keys, values) = self.message_attributes.entries();
        // No entry was appended yet in this batch: the builders are empty.
        if keys.is_empty() {
            *keys = StringBuilder::with_capacity(entries, left * key_bytes);
            *values = StringBuilder::with_capacity(entries, left * value_bytes);
        }
    }

    /// Finishes the appended rows into a batch read in `batch` / `partition`.
    pub fn finish(&mut self, batch: i64, partition: i32) -> Result<RecordBatch, ArrowError> {
        let rows = std::mem::take(&mut self.rows);
        self.attributes_sized = false;
        let attributes = {
            let (keys, values) = self.message_attributes.entries();
            let used = keys.values_slice().len()
                + values.values_slice().len()
                + (keys.offsets_slice().len() + values.offsets_slice().len()) * 4;
            let spare = keys.values_capacity() - keys.values_slice().len()
                + values.values_capacity()
                - values.values_slice().len()
                + (keys.offsets_capacity() - keys.offsets_slice().len()
                    + values.offsets_capacity()
                    - values.offsets_slice().len())
                    * 4;
            let mut map = self.message_attributes.finish();
            if too_loose(spare, used) {
                map.shrink_to_fit();
            }
            // The next batch starts from empty builders, sized again at its
            // first attribute.
            let (keys, values) = self.message_attributes.entries();
            *keys = StringBuilder::with_capacity(0, 0);
            *values = StringBuilder::with_capacity(0, 0);
            map
        };
        let columns: Vec<ArrayRef> = vec![
            self.message_id.finish(),
            self.body.finish(),
            self.md5_of_body.finish(),
            finish_primitive(&mut self.sent_timestamp),
            finish_primitive(&mut self.first_receive_timestamp),
            finish_primitive(&mut self.receive_count),
            self.sender_id.finish(),
            self.message_group_id.finish(),
            self.message_deduplication_id.finish(),
            self.sequence_number.finish(),
            Arc::new(attributes),
            Arc::new(Int64Array::from_value(batch, rows)),
            Arc::new(Int32Array::from_value(partition, rows)),
        ];
        RecordBatch::try_new(table_schema(), columns)
    }
}

fn timestamps(rows: usize) -> TimestampMillisecondBuilder {
    TimestampMillisecondBuilder::with_capacity(rows).with_timezone(TIMESTAMP_TZ)
}

/// The attribute map: offsets for `rows`; keys and values empty until the
/// first attribute.
fn attributes(rows: usize) -> MapBuilder<StringBuilder, StringBuilder> {
    let names = MapFieldNames {
        entry: "entries".into(),
        key: "keys".into(),
        value: "values".into(),
    };
    MapBuilder::with_capacity(
        Some(names),
        StringBuilder::with_capacity(0, 0),
        StringBuilder::with_capacity(0, 0),
        rows,
    )
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

    /// An SQS-like message: UUID id, MD5 digest, `body_len` bytes of body.
    fn realistic(i: usize, body_len: usize, fifo: bool, attributes: usize) -> SqsMessage {
        SqsMessage {
            message_id: format!("{i:08x}-2f1c-4b8e-9d3a-5c7e1f2a9b40"),
            body: "x".repeat(body_len),
            md5_of_body: Some("9e107d9d372bb6826bd81d3542a419d6".into()),
            sent_timestamp: Some(1_764_460_800_000),
            first_receive_timestamp: Some(1_764_460_800_500),
            receive_count: Some(1),
            sender_id: Some("AIDAIT2UOQQY3AUEKVGXU".into()),
            message_group_id: fifo.then(|| format!("group-{}", i % 3)),
            message_deduplication_id: fifo.then(|| format!("dedup-{i:06}")),
            sequence_number: fifo.then(|| format!("{:020}", 18_000_000_000u64 + i as u64)),
            message_attributes: (0..attributes)
                .map(|a| (format!("attr{a}"), format!("value-{i}-{a}")))
                .collect(),
        }
    }

    /// Bytes of content a row holds: its strings and fixed-width fields.
    fn content(msgs: &[SqsMessage]) -> usize {
        // two timestamps, receive_count, batch, partition
        msgs.iter().map(|m| m.size() + 8 + 8 + 4 + 8 + 4).sum()
    }

    /// What the server keeps per receive must be about what the receive
    /// holds: a 10-row batch with builders left at their default capacity
    /// (1024 values) kept ~28 KB of buffers whatever its content.
    #[test]
    fn finished_batches_hold_about_their_content() {
        let cases = [
            ("standard, 256 B bodies", 256, false, 0),
            ("standard, 4 KiB bodies", 4096, false, 0),
            ("standard, 256 B bodies, attributes", 256, false, 3),
            ("FIFO, 256 B bodies, attributes", 256, true, 2),
        ];
        for (what, body_len, fifo, attrs) in cases {
            let msgs: Vec<_> = (0..10)
                .map(|i| realistic(i, body_len, fifo, attrs))
                .collect();
            let mut b = MessageBatchBuilder::with_capacity(10);
            for m in &msgs {
                b.append(m);
            }
            let batch = b.finish(3, 1).unwrap();
            assert_eq!(batch.num_rows(), 10);
            let held = batch.get_array_memory_size();
            let content = content(&msgs);
            assert!(
                held <= 2 * content,
                "{what}: a 10-row batch holds {held} B for {content} B of content"
            );
        }
    }

    #[test]
    fn uneven_bodies_and_a_reused_builder_stay_near_their_content() {
        // The first body is small, the rest large: the estimate is far off,
        // and the column is trimmed when finished.
        let mut msgs: Vec<_> = (0..10).map(|i| realistic(i, 8192, false, 0)).collect();
        msgs[0].body = "{}".into();
        let mut b = MessageBatchBuilder::with_capacity(10);
        for round in 0..3 {
            for m in &msgs {
                b.append(m);
            }
            let batch = b.finish(round, 0).unwrap();
            let held = batch.get_array_memory_size();
            let content = content(&msgs);
            assert!(
                held <= 2 * content,
                "round {round}: {held} B held for {content} B of content"
            );
            let bodies = batch.column(1).as_string::<i32>();
            assert_eq!(bodies.value(0), "{}");
            assert_eq!(bodies.value(9).len(), 8192);
        }
        // More rows than the capacity: still near the content.
        let many: Vec<_> = (0..100).map(|i| realistic(i, 256, true, 1)).collect();
        for m in &many {
            b.append(m);
        }
        let batch = b.finish(9, 0).unwrap();
        assert_eq!(batch.num_rows(), 100);
        let held = batch.get_array_memory_size();
        assert!(held <= 2 * content(&many), "{held} B for 100 rows");
        // Nulls before the first value keep their place.
        let mut b = MessageBatchBuilder::with_capacity(4);
        let mut first = realistic(0, 16, false, 0);
        first.md5_of_body = None;
        first.sender_id = None;
        b.append(&first);
        b.append(&realistic(1, 16, true, 2));
        let batch = b.finish(1, 0).unwrap();
        let md5 = batch.column(2).as_string::<i32>();
        assert!(md5.is_null(0));
        assert_eq!(md5.value(1), "9e107d9d372bb6826bd81d3542a419d6");
        let groups = batch.column(7).as_string::<i32>();
        assert!(groups.is_null(0));
        assert_eq!(groups.value(1), "group-1");
        let attrs = batch.column(10).as_map();
        assert_eq!(attrs.value(0).len(), 0);
        assert_eq!(attrs.value(1).len(), 2);
        assert_eq!(
            attrs.value(1).column(1).as_string::<i32>().value(1),
            "value-1-1"
        );
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
