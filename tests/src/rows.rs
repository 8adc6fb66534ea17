//! What a test reads out of Flight answers: columns, bodies, tickets, plan
//! metadata.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_flight::{FlightInfo, Ticket};
use serde_json::Value;

/// The values of a Utf8 column across batches (nulls as None).
pub fn strings(batches: &[RecordBatch], column: &str) -> Vec<Option<String>> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b.column_by_name(column).expect("column exists");
            let col = col.as_string::<i32>();
            (0..col.len())
                .map(|i| col.is_valid(i).then(|| col.value(i).to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The values of a Utf8 column across batches, a null as "".
pub fn texts(batches: &[RecordBatch], column: &str) -> Vec<String> {
    strings(batches, column)
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
}

/// The rows of `batches` as one record batch, to compare reads whose batch
/// boundaries may differ (a sealed ticket replays coalesced rows).
pub fn concat(batches: &[RecordBatch]) -> RecordBatch {
    let schema = batches.first().map_or_else(
        || Arc::new(arrow_schema::Schema::empty()),
        RecordBatch::schema,
    );
    arrow_select::concat::concat_batches(&schema, batches).expect("batches of one schema")
}

/// The `body` column across batches.
pub fn bodies(batches: &[RecordBatch]) -> Vec<String> {
    strings(batches, "body").into_iter().flatten().collect()
}

/// The `message_id` column across batches.
pub fn message_ids(batches: &[RecordBatch]) -> Vec<String> {
    strings(batches, "message_id")
        .into_iter()
        .flatten()
        .collect()
}

/// Sorted bodies, for set comparisons.
pub fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The `app_metadata` JSON of a FlightInfo.
pub fn metadata(info: &FlightInfo) -> BTreeMap<String, Value> {
    serde_json::from_slice(&info.app_metadata).expect("app_metadata is JSON")
}

/// The tickets of a plan.
pub fn tickets(info: &FlightInfo) -> Vec<Ticket> {
    info.endpoint
        .iter()
        .map(|e| e.ticket.clone().unwrap())
        .collect()
}

/// Asserts that `rows` ((group, body) in read order) hold `per_group`
/// bodies of each group, each group's in sent order (bodies sort by it).
pub fn assert_each_group_in_order(rows: Vec<(Option<String>, String)>, per_group: usize) {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (group, body) in rows {
        let group = group.expect("message_group_id is set on FIFO rows");
        assert!(body.starts_with(&group), "{body} in group {group}");
        groups.entry(group).or_default().push(body);
    }
    for (group, bodies) in groups {
        let mut expected = bodies.clone();
        expected.sort();
        assert_eq!(bodies, expected, "group {group} out of order");
        assert_eq!(bodies.len(), per_group);
    }
}
