//! The Arrow schema of every queue table.

use std::sync::{Arc, LazyLock};

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};

/// Column names, so that code never spells them twice.
pub mod column {
    pub const MESSAGE_ID: &str = "message_id";
    pub const BODY: &str = "body";
    pub const MD5_OF_BODY: &str = "md5_of_body";
    pub const SENT_TIMESTAMP: &str = "sent_timestamp";
    pub const FIRST_RECEIVE_TIMESTAMP: &str = "first_receive_timestamp";
    pub const RECEIVE_COUNT: &str = "receive_count";
    pub const SENDER_ID: &str = "sender_id";
    pub const MESSAGE_GROUP_ID: &str = "message_group_id";
    pub const MESSAGE_DEDUPLICATION_ID: &str = "message_deduplication_id";
    pub const SEQUENCE_NUMBER: &str = "sequence_number";
    pub const MESSAGE_ATTRIBUTES: &str = "message_attributes";
    pub const BATCH: &str = "batch";
    pub const PARTITION: &str = "partition";
}

/// The time zone of both timestamp columns.
pub const TIMESTAMP_TZ: &str = "UTC";

/// The type of the timestamp columns: milliseconds since the epoch, UTC.
pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some(TIMESTAMP_TZ.into()))
}

/// The type of `message_attributes`: `Map<Utf8, Utf8>` with the field names
/// that arrow's `MapBuilder` produces (`entries`, `keys`, `values`).
pub fn attributes_type() -> DataType {
    let entries = Fields::from(vec![
        Field::new("keys", DataType::Utf8, false),
        Field::new("values", DataType::Utf8, true),
    ]);
    DataType::Map(
        Arc::new(Field::new("entries", DataType::Struct(entries), false)),
        false,
    )
}

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use column::*;
    Arc::new(Schema::new(vec![
        Field::new(MESSAGE_ID, DataType::Utf8, false),
        Field::new(BODY, DataType::Utf8, false),
        Field::new(MD5_OF_BODY, DataType::Utf8, true),
        Field::new(SENT_TIMESTAMP, timestamp_type(), true),
        Field::new(FIRST_RECEIVE_TIMESTAMP, timestamp_type(), true),
        Field::new(RECEIVE_COUNT, DataType::Int32, true),
        Field::new(SENDER_ID, DataType::Utf8, true),
        Field::new(MESSAGE_GROUP_ID, DataType::Utf8, true),
        Field::new(MESSAGE_DEDUPLICATION_ID, DataType::Utf8, true),
        Field::new(SEQUENCE_NUMBER, DataType::Utf8, true),
        Field::new(MESSAGE_ATTRIBUTES, attributes_type(), true),
        Field::new(BATCH, DataType::Int64, false),
        Field::new(PARTITION, DataType::Int32, false),
    ]))
});

/// The schema of every queue table (docs/protocol.md, "Table schema").
pub fn table_schema() -> SchemaRef {
    Arc::clone(&SCHEMA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_has_the_designed_columns_in_order() {
        let schema = table_schema();
        let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "message_id",
                "body",
                "md5_of_body",
                "sent_timestamp",
                "first_receive_timestamp",
                "receive_count",
                "sender_id",
                "message_group_id",
                "message_deduplication_id",
                "sequence_number",
                "message_attributes",
                "batch",
                "partition"
            ]
        );
        let not_null: Vec<_> = schema
            .fields()
            .iter()
            .filter(|f| !f.is_nullable())
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(not_null, ["message_id", "body", "batch", "partition"]);
        assert_eq!(
            schema
                .field_with_name("sent_timestamp")
                .unwrap()
                .data_type(),
            &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
        );
    }
}
