//! Record batches in, messages out, row by row.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, MapArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Schema};
use sqs_flight_schemas::schema::attributes_type;

use super::WriteError;
use crate::sqs::{OutgoingMessage, STRING_ATTRIBUTE};

/// The largest message SQS accepts, attributes included (bytes).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// The longest delay SQS accepts (seconds).
pub const MAX_DELAY_SECONDS: i32 = 900;
/// Message attributes SQS accepts on one message.
pub const MAX_ATTRIBUTES: usize = 10;
/// Longest attribute name SQS accepts (characters, all ASCII).
pub const MAX_ATTRIBUTE_NAME: usize = 256;
/// Longest message group or deduplication id SQS accepts (characters).
pub const MAX_ID_LEN: usize = 128;

/// Columns DoPut reads; `body` is required.
pub const BODY: &str = "body";
pub const GROUP: &str = "message_group_id";
pub const DEDUP: &str = "message_deduplication_id";
pub const DELAY: &str = "delay_seconds";
pub const ATTRIBUTES: &str = "message_attributes";
const COLUMNS: &[&str] = &[BODY, GROUP, DEDUP, DELAY, ATTRIBUTES];

/// Checks the schema of a DoPut batch before anything is sent: `body` is
/// present, every column is one DoPut knows, each of a usable type.
pub fn check_schema(schema: &Schema) -> Result<(), WriteError> {
    if schema.column_with_name(BODY).is_none() {
        return Err(WriteError::Schema(format!(
            "DoPut needs a `body` column (Utf8); the batch has: {}",
            names(schema)
        )));
    }
    for field in schema.fields() {
        let target = match field.name().as_str() {
            BODY | GROUP | DEDUP => DataType::Utf8,
            DELAY => DataType::Int32,
            ATTRIBUTES => attributes_type(),
            other => {
                return Err(WriteError::Schema(format!(
                    "DoPut: unknown column `{other}` (expected: {})",
                    COLUMNS.join(", ")
                )));
            }
        };
        if !usable(field.data_type(), &target) {
            return Err(WriteError::Schema(format!(
                "DoPut: column `{}` is {}, expected {target}",
                field.name(),
                field.data_type()
            )));
        }
    }
    Ok(())
}

fn names(schema: &Schema) -> String {
    let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    if names.is_empty() {
        "no columns".into()
    } else {
        names.join(", ")
    }
}

/// Strings of any Arrow string type, integers of any width, and maps of
/// strings are accepted (Polars writes LargeUtf8, pandas Int64).
fn usable(from: &DataType, to: &DataType) -> bool {
    match to {
        DataType::Utf8 => matches!(
            from,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ),
        DataType::Int32 => from.is_integer(),
        DataType::Map(_, _) => {
            matches!(from, DataType::Map(_, _)) && arrow_cast::can_cast_types(from, to)
        }
        _ => false,
    }
}

fn cast(column: &ArrayRef, to: &DataType, name: &str) -> Result<ArrayRef, WriteError> {
    arrow_cast::cast(column, to)
        .map_err(|e| WriteError::Schema(format!("DoPut: column `{name}`: {e}")))
}

fn strings(batch: &RecordBatch, name: &str) -> Result<Option<StringArray>, WriteError> {
    batch
        .column_by_name(name)
        .map(|c| cast(c, &DataType::Utf8, name).map(|a| a.as_string::<i32>().clone()))
        .transpose()
}

/// The characters SQS accepts in a body or attribute value.
fn sqs_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

fn check_text(what: &str, text: &str) -> Result<(), String> {
    match text.char_indices().find(|(_, c)| !sqs_char(*c)) {
        Some((at, c)) => Err(format!(
            "{what} contains U+{:04X} at byte {at}, a character SQS does not accept",
            c as u32
        )),
        None => Ok(()),
    }
}

/// How rows are checked for one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRules {
    /// A FIFO queue: a group id per row, no per-message delay.
    pub fifo: bool,
    /// The largest message (body and attributes): SQS's limit, or the
    /// table's `max_object_bytes` when large bodies go to S3.
    pub max_message_bytes: usize,
}

impl RowRules {
    /// SQS's own rules.
    pub fn sqs(fifo: bool) -> Self {
        Self {
            fifo,
            max_message_bytes: MAX_MESSAGE_BYTES,
        }
    }
}

/// Turns one batch into messages; `first_row` numbers rows in errors. The
/// result holds the messages of the rows before the first bad row, and
/// that row's error. All at once: DoPut converts in slices ([`Rows`]).
pub fn messages(
    batch: &RecordBatch,
    first_row: u64,
    rules: RowRules,
) -> Result<(Vec<OutgoingMessage>, Option<WriteError>), WriteError> {
    let mut rows = Rows::new(batch, first_row, rules)?;
    let slice = rows.next_slice(usize::MAX, usize::MAX);
    Ok((slice.messages, slice.bad_row))
}

/// The messages of consecutive rows of one batch, up to its first bad row.
#[derive(Debug, Default)]
pub struct Slice {
    /// The number of the first row (over the whole call).
    pub first_row: u64,
    pub messages: Vec<OutgoingMessage>,
    /// Bytes of `messages` as SQS counts them.
    pub bytes: u64,
    /// The row after the last message, if it can never be sent.
    pub bad_row: Option<WriteError>,
}

/// One batch's columns, cast to the types DoPut reads, turned into
/// messages a slice at a time ([`Rows::next_slice`]) so that the messages
/// of a batch of millions of rows never exist all at once.
#[derive(Debug)]
pub struct Rows {
    body: StringArray,
    group: Option<StringArray>,
    dedup: Option<StringArray>,
    /// `delay_seconds` as sent, and cast to Int64.
    delay: Option<(ArrayRef, ArrayRef)>,
    attrs: Option<ArrayRef>,
    rules: RowRules,
    /// The number of row 0 of the batch, over the whole call.
    first_row: u64,
    /// The next row to convert; `len` once done or at a bad row.
    next: usize,
    len: usize,
}

impl Rows {
    /// Casts the columns of `batch` (schema checked by [`check_schema`]);
    /// its rows are numbered from `first_row` in errors.
    pub fn new(batch: &RecordBatch, first_row: u64, rules: RowRules) -> Result<Self, WriteError> {
        let body = strings(batch, BODY)?
            .ok_or_else(|| WriteError::Schema("DoPut needs a `body` column (Utf8)".into()))?;
        // Int64, not Int32: a cast to a narrower type turns out-of-range
        // values into nulls, which would silently drop a delay.
        let delay = batch
            .column_by_name(DELAY)
            .map(|given| {
                Ok::<_, WriteError>((Arc::clone(given), cast(given, &DataType::Int64, DELAY)?))
            })
            .transpose()?;
        let attrs = batch
            .column_by_name(ATTRIBUTES)
            .map(|c| cast(c, &attributes_type(), ATTRIBUTES))
            .transpose()?;
        Ok(Self {
            body,
            group: strings(batch, GROUP)?,
            dedup: strings(batch, DEDUP)?,
            delay,
            attrs,
            rules,
            first_row,
            next: 0,
            len: batch.num_rows(),
        })
    }

    /// True once every row is converted, or a bad row was met.
    pub fn is_done(&self) -> bool {
        self.next >= self.len
    }

    /// The messages of the next rows: at most `max_rows`, and no more once
    /// they hold `max_bytes` (at least one row, whatever its size). Stops
    /// before a bad row, which ends the batch.
    pub fn next_slice(&mut self, max_rows: usize, max_bytes: usize) -> Slice {
        let mut slice = Slice {
            first_row: self.first_row + self.next as u64,
            ..Slice::default()
        };
        let mut bytes = 0usize;
        while self.next < self.len && slice.messages.len() < max_rows && bytes < max_bytes {
            let i = self.next;
            match self.row(i) {
                Ok(message) => {
                    bytes = bytes.saturating_add(message.sqs_size());
                    slice.messages.push(message);
                    self.next += 1;
                }
                Err(reason) => {
                    let row = self.first_row + i as u64;
                    slice.bad_row = Some(WriteError::Row { row, reason });
                    self.next = self.len;
                }
            }
        }
        slice.bytes = bytes as u64;
        slice
    }

    /// Bytes (as SQS counts them) of the rows not yet converted, up to the
    /// first bad row, without keeping their messages.
    pub fn measure(&self) -> u64 {
        (self.next..self.len)
            .map_while(|i| self.row(i).ok())
            .map(|m| m.sqs_size() as u64)
            .sum()
    }

    /// At least the bytes [`Rows::measure`] counts, read from the columns'
    /// offsets alone: the bytes of every body, attribute name and value,
    /// and the type `String` per attribute.
    pub fn bytes_at_most(&self) -> u64 {
        let text = |a: &StringArray| {
            let offsets = a.value_offsets();
            offsets
                .first()
                .zip(offsets.last())
                .map_or(0, |(first, last)| (last - first) as u64)
        };
        let attributes = self.attrs.as_ref().map_or(0, |a| {
            let entries = a.as_map().entries();
            let keys = entries.column(0).as_string::<i32>();
            let values = entries.column(1).as_string::<i32>();
            text(keys) + text(values) + (STRING_ATTRIBUTE.len() * entries.len()) as u64
        });
        text(&self.body) + attributes
    }

    /// Row `i` as a message, or why SQS would refuse it.
    fn row(&self, i: usize) -> Result<OutgoingMessage, String> {
        let text = |a: &Option<StringArray>| {
            a.as_ref()
                .filter(|a| a.is_valid(i))
                .map(|a| a.value(i).to_string())
        };
        let body = &self.body;
        let message = OutgoingMessage {
            body: if body.is_valid(i) {
                body.value(i).to_string()
            } else {
                String::new()
            },
            message_group_id: text(&self.group),
            message_deduplication_id: text(&self.dedup),
            delay_seconds: None,
            attributes: self
                .attrs
                .as_ref()
                .map(|a| attributes(a.as_map(), i))
                .unwrap_or_default(),
            payload_size: None,
        };
        let delay = match &self.delay {
            Some((given, d)) if given.is_valid(i) => Some(
                d.is_valid(i)
                    .then(|| d.as_primitive::<Int64Type>().value(i))
                    .ok_or_else(|| format!("delay_seconds is {}", value_text(given, i))),
            ),
            _ => None,
        };
        match delay.transpose() {
            Ok(d) => check_row(message, d, body.is_valid(i), self.rules),
            Err(shown) => Err(format!("{shown}, outside 0..={MAX_DELAY_SECONDS}")),
        }
    }
}

/// A value of an integer column that does not fit Int64, as text.
fn value_text(column: &ArrayRef, i: usize) -> String {
    arrow_cast::display::ArrayFormatter::try_new(column.as_ref(), &Default::default())
        .map(|f| f.value(i).to_string())
        .unwrap_or_else(|_| "out of range".into())
}

fn attributes(map: &MapArray, i: usize) -> Vec<(String, String)> {
    if map.is_null(i) {
        return Vec::new();
    }
    let entries = map.value(i);
    let keys = entries.column(0).as_string::<i32>();
    let values = entries.column(1).as_string::<i32>();
    (0..entries.len())
        .filter(|&j| values.is_valid(j))
        .map(|j| (keys.value(j).to_string(), values.value(j).to_string()))
        .collect()
}

/// An attribute name as SQS accepts it: 1-256 of A-Z a-z 0-9 _ - ., no
/// leading, trailing or doubled period, not starting with `AWS.` or
/// `Amazon.` (any case).
fn check_attribute_name(name: &str) -> Result<(), String> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_ATTRIBUTE_NAME {
        Some("is longer than 256 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
    {
        Some("may hold only A-Z a-z 0-9 _ - .")
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        Some("may not start or end with a period or hold two in a row")
    } else {
        let lower = name.to_ascii_lowercase();
        (lower.starts_with("aws.") || lower.starts_with("amazon."))
            .then_some("may not start with `AWS.` or `Amazon.` (reserved)")
    };
    match problem {
        Some(p) => Err(format!(
            "attribute name {:?} {p}",
            sqs_flight_schemas::json::quote_cut(name)
        )),
        None => Ok(()),
    }
}

/// A message group or deduplication id as SQS accepts it: 1-128
/// characters of A-Z a-z 0-9 and ASCII punctuation.
fn check_id(column: &str, id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err(format!("{column} is empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(format!(
            "{column} is {} characters long, above the SQS limit of {MAX_ID_LEN}",
            id.chars().count()
        ));
    }
    match id
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || c.is_ascii_punctuation()))
    {
        Some((at, c)) => Err(format!(
            "{column} contains U+{:04X} at byte {at}; SQS accepts only A-Z a-z 0-9 and ASCII punctuation",
            c as u32
        )),
        None => Ok(()),
    }
}

/// The message if SQS can take it, else why SQS would refuse it for good.
fn check_row(
    mut m: OutgoingMessage,
    delay: Option<i64>,
    has_body: bool,
    rules: RowRules,
) -> Result<OutgoingMessage, String> {
    let fifo = rules.fifo;
    if !has_body {
        return Err("body is null".into());
    }
    if m.body.is_empty() {
        return Err("body is empty; SQS needs at least one character".into());
    }
    check_text("body", &m.body)?;
    if m.attributes.len() > MAX_ATTRIBUTES {
        return Err(format!(
            "message_attributes has {} entries, above the SQS limit of {MAX_ATTRIBUTES}",
            m.attributes.len()
        ));
    }
    for (k, (name, value)) in m.attributes.iter().enumerate() {
        check_attribute_name(name)?;
        if m.attributes[..k].iter().any(|(other, _)| other == name) {
            return Err(format!("attribute `{name}` is given more than once"));
        }
        if value.is_empty() {
            return Err(format!(
                "attribute `{name}` is empty; SQS needs at least one character"
            ));
        }
        check_text(&format!("attribute `{name}`"), value)?;
    }
    if let Some(g) = &m.message_group_id {
        check_id(GROUP, g)?;
    }
    if let Some(d) = &m.message_deduplication_id {
        check_id(DEDUP, d)?;
    }
    let size = m.sqs_size();
    let max = rules.max_message_bytes;
    if size > max {
        let limit = match max == MAX_MESSAGE_BYTES {
            true => format!("the SQS limit of {MAX_MESSAGE_BYTES}"),
            false => format!("the table's large_payloads.max_object_bytes ({max})"),
        };
        return Err(format!(
            "message is {size} bytes with its attributes, above {limit}"
        ));
    }
    match delay {
        Some(d) if fifo => {
            return Err(format!(
                "delay_seconds is {d}, but FIFO queues take no per-message delay"
            ));
        }
        Some(d) if !(0..=i64::from(MAX_DELAY_SECONDS)).contains(&d) => {
            return Err(format!(
                "delay_seconds is {d}, outside 0..={MAX_DELAY_SECONDS}"
            ));
        }
        _ if fifo && m.message_group_id.is_none() => {
            return Err(
                "message_group_id is missing; a FIFO queue needs one on every message".into(),
            );
        }
        _ => {}
    }
    m.delay_seconds = delay.map(|d| d as i32); // in 0..=900: checked above
    Ok(m)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{MapBuilder, StringBuilder};
    use arrow_array::{Int64Array, LargeStringArray};
    use arrow_schema::Field;

    use super::*;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn schema_needs_body_and_known_columns_of_usable_types() {
        let ok = Schema::new(vec![
            Field::new("body", DataType::LargeUtf8, true),
            Field::new("delay_seconds", DataType::Int64, true),
        ]);
        check_schema(&ok).unwrap();
        let no_body = Schema::new(vec![Field::new("text", DataType::Utf8, true)]);
        assert!(
            check_schema(&no_body)
                .unwrap_err()
                .to_string()
                .contains("`body`")
        );
        let unknown = Schema::new(vec![
            Field::new("body", DataType::Utf8, true),
            Field::new("extra", DataType::Utf8, true),
        ]);
        assert!(
            check_schema(&unknown)
                .unwrap_err()
                .to_string()
                .contains("`extra`")
        );
        let wrong = Schema::new(vec![Field::new("body", DataType::Int32, true)]);
        assert!(
            check_schema(&wrong)
                .unwrap_err()
                .to_string()
                .contains("expected Utf8")
        );
    }

    #[test]
    fn rows_become_messages_until_the_first_bad_row() {
        let mut attrs = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        for _ in 0..4 {
            attrs.keys().append_value("k");
            attrs.values().append_value("v");
            attrs.append(true).unwrap();
        }
        let b = batch(vec![
            (
                "body",
                Arc::new(LargeStringArray::from(vec![
                    Some("a"),
                    Some("b"),
                    Some("bad\u{0}"),
                    Some("d"),
                ])),
            ),
            (
                "delay_seconds",
                Arc::new(Int64Array::from(vec![Some(5), None, None, None])),
            ),
            ("message_attributes", Arc::new(attrs.finish())),
        ]);
        let (msgs, err) = messages(&b, 100, RowRules::sqs(false)).unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0].delay_seconds, Some(5));
        assert_eq!(msgs[1].attributes, vec![("k".to_string(), "v".to_string())]);
        let err = err.unwrap().to_string();
        assert!(err.starts_with("row 102: body contains U+0000"), "{err}");
    }

    #[test]
    fn each_kind_of_unsendable_row_is_named() {
        let big = "x".repeat(MAX_MESSAGE_BYTES + 1);
        let cases: Vec<(Option<&str>, bool, &str)> = vec![
            (None, false, "body is null"),
            (Some(""), false, "body is empty"),
            (Some(big.as_str()), false, "above the SQS limit"),
            (Some("x"), true, "message_group_id is missing"),
        ];
        for (body, fifo, needle) in cases {
            let b = batch(vec![(
                "body",
                Arc::new(StringArray::from(vec![body])) as ArrayRef,
            )]);
            let (msgs, err) = messages(&b, 0, RowRules::sqs(fifo)).unwrap();
            assert!(msgs.is_empty());
            let err = err.expect(needle).to_string();
            assert!(err.contains(needle), "{err}");
        }
        let b = batch(vec![
            ("body", Arc::new(StringArray::from(vec!["x"])) as ArrayRef),
            ("delay_seconds", Arc::new(Int64Array::from(vec![901]))),
        ]);
        assert!(
            messages(&b, 0, RowRules::sqs(false))
                .unwrap()
                .1
                .unwrap()
                .to_string()
                .contains("0..=900")
        );
    }

    #[test]
    fn rows_come_in_slices_up_to_the_first_bad_row() {
        let mut bodies = vec![Some("ab"); 25];
        bodies[21] = Some("");
        let b = batch(vec![(
            "body",
            Arc::new(StringArray::from(bodies)) as ArrayRef,
        )]);
        let mut rows = Rows::new(&b, 100, RowRules::sqs(false)).unwrap();
        assert_eq!(rows.measure(), 42, "the 21 rows before the bad one");
        assert!(rows.bytes_at_most() >= rows.measure());
        let first = rows.next_slice(10, usize::MAX);
        assert_eq!((first.first_row, first.messages.len()), (100, 10));
        assert_eq!(first.bytes, 20);
        assert!(first.bad_row.is_none());
        let second = rows.next_slice(usize::MAX, 5);
        assert_eq!(
            (second.first_row, second.messages.len()),
            (110, 3),
            "stops once the slice holds 5 bytes"
        );
        let last = rows.next_slice(100, usize::MAX);
        assert_eq!((last.first_row, last.messages.len()), (113, 8));
        let err = last.bad_row.expect("row 121 is bad").to_string();
        assert!(err.starts_with("row 121: body is empty"), "{err}");
        assert!(rows.is_done(), "nothing after a bad row");
    }
}
