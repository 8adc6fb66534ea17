//! Sending messages: record batches become SQS messages through DoPut.
//!
//! [`Client::send`] streams record batches to a table; the server sends
//! each row as one message (SendMessageBatch) and acknowledges each batch
//! with the number of messages it sent. The batches need a `body` column
//! (Utf8, LargeUtf8 or Utf8View) and may carry `message_group_id`,
//! `message_deduplication_id` (strings), `delay_seconds` (any integer) and
//! `message_attributes` (Map<Utf8, Utf8>); [`MessageRows`] builds such
//! batches from [`OutgoingMessage`]s, which [`OutgoingMessage::from_json_line`]
//! reads from JSON lines.
//!
//! A row that SQS can never accept (an empty body, a character SQS refuses,
//! more than 1 MiB, a FIFO message without a group id) stops the send: the
//! rows before it are sent, the rest are not, and the [`SendError`] says
//! which row it was and how many were sent.
//!
//! ```no_run
//! # async fn run() -> Result<(), sqs_flight_client::send::SendError> {
//! use sqs_flight_client::Client;
//! use sqs_flight_client::send::{MessageRows, OutgoingMessage};
//!
//! let client = Client::connect("grpc://127.0.0.1:50051").await?;
//! let mut rows = MessageRows::new();
//! rows.push(&OutgoingMessage::from_json_line(r#"{"body": "hello", "delay_seconds": 5}"#).unwrap());
//! rows.push(&OutgoingMessage::body("plain text"));
//! let outcome = client.send("orders", futures::stream::iter([rows.finish()])).await?;
//! assert_eq!(outcome.sent, 2);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use arrow_array::builder::{Int32Builder, MapBuilder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_flight::FlightDescriptor;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use sqs_flight_schemas::schema::attributes_type;
use sqs_flight_schemas::{column, reason};

use crate::client::Client;
use crate::error::Error;

/// What a send achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendOutcome {
    /// Messages SQS accepted.
    pub sent: u64,
    /// Batches the server acknowledged. The encoder splits a batch larger
    /// than a gRPC message should be into several, each acknowledged alone.
    pub batches: u64,
}

/// A send that stopped: why, and how far it got.
///
/// Converts into the plain [`Error`] (whose message still says all of
/// this) with `?`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error}")]
pub struct SendError {
    /// Messages SQS accepted before the failure.
    pub sent: u64,
    /// Whether `sent` is the server's own count at the failure. When it is
    /// not (the connection broke, or the call was refused as a whole), it
    /// counts the messages of the acknowledged batches; rows of a batch in
    /// flight may have been sent too.
    pub exact: bool,
    /// The row the server refused, counted from 0 across the whole send,
    /// when one row was the reason.
    pub row: Option<u64>,
    /// The failure; its kind says whether trying again may help.
    pub error: Error,
}

impl SendError {
    /// `error` after `acknowledged` messages were confirmed, with no word
    /// from the server on the count (the call failed before it answered,
    /// or its answer was malformed).
    fn new(acknowledged: u64, error: Error) -> Self {
        Self {
            sent: acknowledged,
            exact: false,
            row: None,
            error,
        }
    }

    /// The failure of the DoPut call after `acknowledged` messages were
    /// confirmed: the server's own count and row, from its
    /// `sqsf-rows-sent` and `sqsf-row` trailers, take precedence.
    fn of_call(acknowledged: u64, error: FlightError) -> Self {
        let trailer = |name: &str| match &error {
            FlightError::Tonic(status) => status
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok()),
            _ => None,
        };
        let count = trailer(reason::ROWS_SENT_HEADER);
        let row = trailer(reason::ROW_HEADER);
        Self {
            sent: count.unwrap_or(acknowledged),
            exact: count.is_some(),
            row,
            error: error.into(),
        }
    }
}

impl From<SendError> for Error {
    fn from(e: SendError) -> Self {
        e.error
    }
}

impl From<Error> for SendError {
    /// An error before anything was sent (connecting, for example).
    fn from(error: Error) -> Self {
        Self::new(0, error)
    }
}

/// The `{"sent": n}` of a PutResult.
#[derive(Deserialize)]
struct PutMetadata {
    sent: u64,
}

impl Client {
    /// Sends every row of `batches` to `table` as one SQS message each
    /// (DoPut), and returns how many were sent. Stops at the first row SQS
    /// can never accept; see [`SendError`].
    pub async fn send<S>(&self, table: &str, batches: S) -> Result<SendOutcome, SendError>
    where
        S: Stream<Item = RecordBatch> + Send + 'static,
    {
        self.send_with_progress(table, batches, |_| {}).await
    }

    /// [`send`](Self::send), calling `progress` with the running totals
    /// each time the server acknowledges a batch.
    pub async fn send_with_progress<S>(
        &self,
        table: &str,
        batches: S,
        mut progress: impl FnMut(SendOutcome),
    ) -> Result<SendOutcome, SendError>
    where
        S: Stream<Item = RecordBatch> + Send + 'static,
    {
        let mut outcome = SendOutcome::default();
        let mut batches = Box::pin(batches.peekable());
        // The server refuses a DoPut without data; nothing to send is done.
        if batches.as_mut().peek().await.is_none() {
            return Ok(outcome);
        }
        let data = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![table.to_string()])))
            .build(batches.map(Ok));
        let mut flight = self.flight();
        let answer = self.answered(async { Ok::<_, Error>(flight.do_put(data).await) });
        let mut results = answer
            .await
            .map_err(|e| SendError::new(0, e))?
            .map_err(|e| SendError::of_call(0, e))?;
        while let Some(result) = results.next().await {
            let result = result.map_err(|e| SendError::of_call(outcome.sent, e))?;
            let meta: PutMetadata = serde_json::from_slice(&result.app_metadata).map_err(|e| {
                let e =
                    Error::protocol("DoPut", format!("app_metadata is not {{\"sent\": n}}: {e}"));
                SendError::new(outcome.sent, e)
            })?;
            outcome.sent += meta.sent;
            outcome.batches += 1;
            progress(outcome);
        }
        Ok(outcome)
    }
}

/// One message to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub body: String,
    /// Required by FIFO queues, refused by none.
    pub message_group_id: Option<String>,
    /// For FIFO queues without content-based deduplication.
    pub message_deduplication_id: Option<String>,
    /// 0 to 900 seconds; standard queues only.
    pub delay_seconds: Option<i32>,
    /// String attributes.
    pub message_attributes: BTreeMap<String, String>,
}

/// A JSON line as written: like [`OutgoingMessage`], attribute values still
/// JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonMessage {
    body: String,
    message_group_id: Option<String>,
    message_deduplication_id: Option<String>,
    delay_seconds: Option<i32>,
    #[serde(default)]
    message_attributes: Option<BTreeMap<String, serde_json::Value>>,
}

/// The keys of a message object.
const MESSAGE_KEYS: [&str; 5] = [
    "body",
    "message_group_id",
    "message_deduplication_id",
    "delay_seconds",
    "message_attributes",
];

/// What serde will find wrong with `entries` as a [`JsonMessage`], if
/// anything: it stops at the first entry, in the map's order, whose key is
/// not a message key ([`LineFault::NotAMessage`]) or whose value has the
/// wrong type ([`LineFault::BadValue`]), and only then misses a `body`.
fn fault_of(entries: &serde_json::Map<String, serde_json::Value>) -> LineFault {
    for (key, value) in entries {
        if !MESSAGE_KEYS.contains(&key.as_str()) {
            return LineFault::NotAMessage;
        }
        let mut alone = serde_json::Map::new();
        alone.insert("body".into(), serde_json::Value::String(String::new()));
        alone.insert(key.clone(), value.clone());
        if JsonMessage::deserialize(&serde_json::Value::Object(alone)).is_err() {
            return LineFault::BadValue;
        }
    }
    match entries.contains_key("body") {
        true => LineFault::BadValue,
        false => LineFault::NotAMessage,
    }
}

/// serde_json's message without its ` at line L column C` suffix: the
/// position in a one-line document is noise next to a file's line number.
fn json_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rsplit_once(" at line ") {
        Some((reason, _)) if e.column() > 0 => format!("{reason} (column {})", e.column()),
        Some((reason, _)) => reason.to_string(),
        None => text,
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl OutgoingMessage {
    /// A message with this body and nothing else.
    pub fn body(body: impl Into<String>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }

    /// Reads one JSON lines object: `{"body": "...", "message_group_id"?,
    /// "message_deduplication_id"?, "delay_seconds"?, "message_attributes"?:
    /// {"k": "v"}}`. `body` must be a string (send a JSON document as its
    /// text); attribute values may be strings or numbers; other keys are
    /// refused, so that a misspelt one is not silently dropped. The error
    /// says what is wrong with the line.
    pub fn from_json_line(line: &str) -> Result<Self, String> {
        Self::parse_json_line(line).map_err(|bad| bad.reason)
    }

    /// [`from_json_line`](Self::from_json_line), with what kind of problem
    /// the line has beside its message.
    pub fn parse_json_line(line: &str) -> Result<Self, BadLine> {
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| BadLine::not_a_message(format!("not JSON: {}", json_reason(&e))))?;
        let serde_json::Value::Object(entries) = &value else {
            return Err(BadLine::not_a_message(format!(
                "expected a JSON object like {{\"body\": \"...\"}}, found {}",
                json_kind(&value)
            )));
        };
        let m = JsonMessage::deserialize(&value).map_err(|e| BadLine {
            fault: fault_of(entries),
            reason: json_reason(&e),
        })?;
        let mut message_attributes = BTreeMap::new();
        for (name, value) in m.message_attributes.unwrap_or_default() {
            let text = match value {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                other => {
                    return Err(BadLine {
                        fault: LineFault::BadValue,
                        reason: format!(
                            "message_attributes.{name}: expected a string or a number, found {}",
                            json_kind(&other)
                        ),
                    });
                }
            };
            message_attributes.insert(name, text);
        }
        Ok(Self {
            body: m.body,
            message_group_id: m.message_group_id,
            message_deduplication_id: m.message_deduplication_id,
            delay_seconds: m.delay_seconds,
            message_attributes,
        })
    }
}

static SEND_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new(column::BODY, DataType::Utf8, false),
        Field::new(column::MESSAGE_GROUP_ID, DataType::Utf8, true),
        Field::new(column::MESSAGE_DEDUPLICATION_ID, DataType::Utf8, true),
        Field::new(DELAY_SECONDS, DataType::Int32, true),
        Field::new(column::MESSAGE_ATTRIBUTES, attributes_type(), true),
    ]))
});

/// The DoPut column of a message's delay (not a column of the table).
pub const DELAY_SECONDS: &str = "delay_seconds";

/// The schema of the batches [`MessageRows`] builds: every DoPut column,
/// null where a message does not set it.
pub fn send_schema() -> SchemaRef {
    Arc::clone(&SEND_SCHEMA)
}

/// Builds DoPut record batches from messages, row by row.
#[derive(Debug)]
pub struct MessageRows {
    body: StringBuilder,
    group: StringBuilder,
    dedup: StringBuilder,
    delay: Int32Builder,
    attributes: MapBuilder<StringBuilder, StringBuilder>,
    rows: usize,
    bytes: usize,
}

impl Default for MessageRows {
    fn default() -> Self {
        Self::new()
    }
}

impl MessageRows {
    pub fn new() -> Self {
        Self {
            body: StringBuilder::new(),
            group: StringBuilder::new(),
            dedup: StringBuilder::new(),
            delay: Int32Builder::new(),
            attributes: MapBuilder::new(None, StringBuilder::new(), StringBuilder::new()),
            rows: 0,
            bytes: 0,
        }
    }

    /// Appends one row.
    pub fn push(&mut self, m: &OutgoingMessage) {
        self.body.append_value(&m.body);
        self.group.append_option(m.message_group_id.as_deref());
        self.dedup
            .append_option(m.message_deduplication_id.as_deref());
        self.delay.append_option(m.delay_seconds);
        let mut bytes = m.body.len();
        for (k, v) in &m.message_attributes {
            self.attributes.keys().append_value(k);
            self.attributes.values().append_value(v);
            bytes += k.len() + v.len();
        }
        self.attributes
            .append(true)
            .expect("as many keys as values");
        self.rows += 1;
        self.bytes += bytes;
    }

    /// Rows appended since the last [`finish`](Self::finish).
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Bytes of bodies and attributes appended since the last finish.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The rows appended so far, as one batch of [`send_schema`]; the
    /// builder starts over empty.
    pub fn finish(&mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.body.finish()),
            Arc::new(self.group.finish()),
            Arc::new(self.dedup.finish()),
            Arc::new(self.delay.finish()),
            Arc::new(self.attributes.finish()),
        ];
        self.rows = 0;
        self.bytes = 0;
        RecordBatch::try_new(send_schema(), columns).expect("columns built to the schema")
    }
}

/// What kind of problem a line of input has: what a caller may branch on
/// (the reason beside it is for people, and its words may change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFault {
    /// Not a message object at all: not JSON, not an object, a key that is
    /// not a message field, or no `body`. Often a line meant as the body
    /// itself.
    NotAMessage,
    /// A message object with a value of the wrong type or out of range.
    BadValue,
    /// Bytes that are not UTF-8 text.
    NotText,
}

/// A line that is not a message: the kind of problem and its description.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct BadLine {
    pub fault: LineFault,
    pub reason: String,
}

impl BadLine {
    fn not_a_message(reason: String) -> Self {
        Self {
            fault: LineFault::NotAMessage,
            reason,
        }
    }
}

/// A line of input that is not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    /// Counted from 1.
    pub line: u64,
    pub fault: LineFault,
    pub reason: String,
}

/// Whether a line of JSON lines input holds nothing (and is skipped).
pub fn is_blank(line: &str) -> bool {
    line.trim().is_empty()
}

/// One batch from JSON lines (see [`OutgoingMessage::from_json_line`]);
/// blank lines are skipped. The first bad line fails the whole batch.
pub fn batch_from_json_lines<'a>(
    lines: impl IntoIterator<Item = &'a str>,
) -> Result<RecordBatch, LineError> {
    let mut rows = MessageRows::new();
    for (i, line) in lines.into_iter().enumerate() {
        if is_blank(line) {
            continue;
        }
        let m = OutgoingMessage::parse_json_line(line).map_err(|bad| LineError {
            line: i as u64 + 1,
            fault: bad.fault,
            reason: bad.reason,
        })?;
        rows.push(&m);
    }
    Ok(rows.finish())
}

/// One batch whose bodies are the lines, as they are (an empty line cannot
/// be a message and is skipped).
pub fn batch_from_text_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> RecordBatch {
    let mut rows = MessageRows::new();
    for line in lines.into_iter().filter(|l| !l.is_empty()) {
        rows.push(&OutgoingMessage::body(line));
    }
    rows.finish()
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_array::{Array, StringArray};

    use super::*;

    #[test]
    fn json_lines_become_rows_with_every_column() {
        let lines = [
            r#"{"body": "a", "message_group_id": "g", "message_deduplication_id": "d", "delay_seconds": 5, "message_attributes": {"k": "v", "n": 3}}"#,
            "   ",
            r#"{"body": "{\"nested\": true}"}"#,
        ];
        let batch = batch_from_json_lines(lines).unwrap();
        assert_eq!(batch.schema(), send_schema());
        assert_eq!(batch.num_rows(), 2);
        let body = batch.column(0).as_string::<i32>();
        assert_eq!((body.value(0), body.value(1)), ("a", r#"{"nested": true}"#));
        assert_eq!(batch.column(1).as_string::<i32>().value(0), "g");
        assert!(batch.column(1).is_null(1));
        assert_eq!(batch.column(2).as_string::<i32>().value(0), "d");
        let delay = batch.column(3).as_primitive::<Int32Type>();
        assert_eq!(delay.value(0), 5);
        assert!(delay.is_null(1));
        let attrs = batch.column(4).as_map();
        let first = attrs.value(0);
        let keys: &StringArray = first.column(0).as_string();
        let values: &StringArray = first.column(1).as_string();
        assert_eq!(keys.iter().flatten().collect::<Vec<_>>(), ["k", "n"]);
        assert_eq!(values.iter().flatten().collect::<Vec<_>>(), ["v", "3"]);
        assert_eq!(attrs.value(1).len(), 0);
    }

    #[test]
    fn bad_lines_are_named_with_the_reason() {
        let cases = [
            ("not json", "line 2: not JSON"),
            (r#""just a string""#, "line 2: expected a JSON object"),
            (r#"{"text": "x"}"#, "unknown field `text`"),
            (r#"{"message_group_id": "g"}"#, "missing field `body`"),
            (
                r#"{"body": 1}"#,
                "invalid type: integer `1`, expected a string",
            ),
            (
                r#"{"body": "x", "delay_seconds": "5"}"#,
                "invalid type: string",
            ),
            (r#"{"body": "x", "delay_seconds": 99999999999}"#, "i32"),
            (
                r#"{"body": "x", "message_attributes": {"k": [1]}}"#,
                "message_attributes.k: expected a string or a number, found an array",
            ),
        ];
        for (bad, needle) in cases {
            let e = batch_from_json_lines([r#"{"body": "ok"}"#, bad]).unwrap_err();
            assert_eq!(e.line, 2, "{bad}");
            let text = e.to_string();
            assert!(text.contains(needle), "{bad}: {text}");
            assert!(!text.contains("at line 1"), "{bad}: {text}");
        }
    }

    #[test]
    fn a_bad_lines_fault_is_the_problem_serde_reports() {
        let cases = [
            ("not json", LineFault::NotAMessage),
            (r#""just a string""#, LineFault::NotAMessage),
            (r#"{"text": "x"}"#, LineFault::NotAMessage),
            (r#"{"message_group_id": "g"}"#, LineFault::NotAMessage),
            (r#"{"body": 1}"#, LineFault::BadValue),
            (r#"{"body": null}"#, LineFault::BadValue),
            (
                r#"{"body": "x", "delay_seconds": 99999999999}"#,
                LineFault::BadValue,
            ),
            (
                r#"{"body": "x", "message_attributes": {"k": [1]}}"#,
                LineFault::BadValue,
            ),
            // serde stops at the first key in the map's (sorted) order.
            (r#"{"body": 1, "zzz": "x"}"#, LineFault::BadValue),
            (r#"{"aaa": "x", "body": 1}"#, LineFault::NotAMessage),
            (r#"{"delay_seconds": "5"}"#, LineFault::BadValue),
        ];
        for (bad, fault) in cases {
            let e = batch_from_json_lines([bad]).unwrap_err();
            assert_eq!(e.fault, fault, "{bad}: {e}");
        }
    }

    #[test]
    fn text_lines_are_bodies_as_they_are() {
        let batch = batch_from_text_lines(["one", "", "  two  ", r#"{"body": "x"}"#]);
        let body = batch.column(0).as_string::<i32>();
        let got: Vec<_> = body.iter().flatten().collect();
        assert_eq!(got, ["one", "  two  ", r#"{"body": "x"}"#]);
    }

    #[test]
    fn builder_counts_rows_and_bytes_and_starts_over() {
        let mut rows = MessageRows::new();
        let mut m = OutgoingMessage::body("abc");
        m.message_attributes.insert("k".into(), "vv".into());
        rows.push(&m);
        assert_eq!((rows.len(), rows.bytes()), (1, 6));
        assert_eq!(rows.finish().num_rows(), 1);
        assert!(rows.is_empty());
        assert_eq!(rows.finish().num_rows(), 0);
    }

    #[test]
    fn the_servers_trailers_give_row_and_count() {
        let refused = |trailers: &[(&'static str, &str)]| {
            let mut status = tonic::Status::invalid_argument(
                "table \"t\": row 9: message_group_id is missing; 8 rows were sent before it",
            );
            for (name, value) in trailers {
                status.metadata_mut().insert(*name, value.parse().unwrap());
            }
            FlightError::Tonic(Box::new(status))
        };
        let both = [(reason::ROWS_SENT_HEADER, "8"), (reason::ROW_HEADER, "9")];
        let e = SendError::of_call(4, refused(&both));
        assert_eq!((e.sent, e.exact, e.row), (8, true, Some(9)));
        assert!(e.to_string().contains("row 9"), "{e}");
        // The message alone says nothing to a program.
        let e = SendError::of_call(4, refused(&[]));
        assert_eq!((e.sent, e.exact, e.row), (4, false, None));
        let e = SendError::of_call(4, refused(&[(reason::ROWS_SENT_HEADER, "x")]));
        assert_eq!((e.sent, e.exact, e.row), (4, false, None));
        let e = SendError::new(4, Error::protocol("DoPut", "x"));
        assert_eq!((e.sent, e.exact, e.row), (4, false, None));
    }
}
