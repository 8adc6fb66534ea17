//! Typed payloads: JSON bodies decoded into a `payload` struct column.
//!
//! A table may declare the schema of its JSON bodies ([`PayloadSpec`]).
//! Its rows then carry `payload` (a struct of that schema, decoded with
//! arrow-json) and `payload_error`. A body that is not JSON, or does not fit
//! the schema, keeps its `body`, gets a null `payload` and an error saying
//! why; no row is ever dropped. Fields the schema does not name are
//! ignored; missing fields are null.
//!
//! Field specs are written in the server's TOML (or a JSON file) as:
//!
//! ```toml
//! [tables.orders.payload]
//! unwrap = "sns"            # optional: bodies are SNS envelopes
//! fields = [
//!   { name = "order_id", type = "int64" },
//!   { name = "at", type = "timestamp", unit = "ms", timezone = "UTC" },
//!   { name = "customer", type = "struct", fields = [{ name = "id", type = "utf8" }] },
//!   { name = "tags", type = "list", item = { type = "utf8" } },
//! ]
//! ```

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow_json::ReaderBuilder;
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::schema::column;

/// Column of the decoded payload.
pub const PAYLOAD: &str = "payload";
/// Column saying why a body has no payload.
pub const PAYLOAD_ERROR: &str = "payload_error";

/// How bodies are unwrapped before decoding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unwrap {
    /// The body is the payload.
    #[default]
    None,
    /// The body is an SNS envelope whose `Message` string is the payload.
    Sns,
}

/// One field of a payload schema, as written in configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Required except for a list's `item`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// bool, int8..int64, uint8..uint64, float32, float64, utf8, date32,
    /// timestamp, struct, list.
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub nullable: bool,
    /// For `struct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<FieldSpec>>,
    /// For `list`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<Box<FieldSpec>>,
    /// For `timestamp`: s, ms, us or ns (default ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// For `timestamp`: for example "UTC"; none means a naive timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// A payload declaration: the fields and how to unwrap bodies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadSpec {
    #[serde(default)]
    pub unwrap: Unwrap,
    pub fields: Vec<FieldSpec>,
}

impl FieldSpec {
    /// The Arrow field; the error names the field path.
    pub fn to_field(&self, path: &str) -> Result<Field, String> {
        let path = if path.is_empty() {
            self.name.clone()
        } else {
            format!("{path}.{}", self.name)
        };
        let dt = match self.ty.as_str() {
            "bool" | "boolean" => DataType::Boolean,
            "int8" => DataType::Int8,
            "int16" => DataType::Int16,
            "int32" => DataType::Int32,
            "int64" => DataType::Int64,
            "uint8" => DataType::UInt8,
            "uint16" => DataType::UInt16,
            "uint32" => DataType::UInt32,
            "uint64" => DataType::UInt64,
            "float32" => DataType::Float32,
            "float64" | "double" => DataType::Float64,
            "utf8" | "string" => DataType::Utf8,
            "date32" | "date" => DataType::Date32,
            "timestamp" => DataType::Timestamp(
                unit(self.unit.as_deref(), &path)?,
                self.timezone.as_deref().map(Into::into),
            ),
            "struct" => {
                let fields = self
                    .fields
                    .as_ref()
                    .ok_or(format!("{path}: a struct needs `fields`"))?;
                DataType::Struct(to_fields(fields, &path)?)
            }
            "list" => {
                let item = self
                    .item
                    .as_ref()
                    .ok_or(format!("{path}: a list needs `item`"))?;
                let mut item = item.to_field(&format!("{path}[]"))?;
                item = item.with_name("item");
                DataType::List(Arc::new(item))
            }
            other => return Err(format!("{path}: unknown type {other:?}")),
        };
        Ok(Field::new(&self.name, dt, self.nullable))
    }

    /// The spec of an Arrow field (for schema inference output).
    pub fn from_field(field: &Field) -> Result<Self, String> {
        let mut spec = FieldSpec {
            name: field.name().clone(),
            ty: String::new(),
            nullable: field.is_nullable(),
            fields: None,
            item: None,
            unit: None,
            timezone: None,
        };
        spec.ty = match field.data_type() {
            DataType::Boolean => "bool".into(),
            DataType::Int8 => "int8".into(),
            DataType::Int16 => "int16".into(),
            DataType::Int32 => "int32".into(),
            DataType::Int64 => "int64".into(),
            DataType::UInt8 => "uint8".into(),
            DataType::UInt16 => "uint16".into(),
            DataType::UInt32 => "uint32".into(),
            DataType::UInt64 => "uint64".into(),
            DataType::Float32 => "float32".into(),
            DataType::Float64 => "float64".into(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "utf8".into(),
            DataType::Date32 => "date32".into(),
            DataType::Timestamp(u, tz) => {
                spec.unit = Some(unit_name(u).into());
                spec.timezone = tz.as_ref().map(|t| t.to_string());
                "timestamp".into()
            }
            DataType::Struct(fields) => {
                spec.fields = Some(
                    fields
                        .iter()
                        .map(|f| Self::from_field(f))
                        .collect::<Result<_, _>>()?,
                );
                "struct".into()
            }
            DataType::List(item) | DataType::LargeList(item) => {
                let mut item = Self::from_field(item)?;
                item.name = String::new();
                spec.item = Some(Box::new(item));
                "list".into()
            }
            // Inference yields Null for fields seen only as null.
            DataType::Null => "utf8".into(),
            other => {
                return Err(format!(
                    "{}: type {other} has no payload spec",
                    field.name()
                ));
            }
        };
        Ok(spec)
    }
}

fn unit(unit: Option<&str>, path: &str) -> Result<TimeUnit, String> {
    match unit.unwrap_or("ms") {
        "s" => Ok(TimeUnit::Second),
        "ms" => Ok(TimeUnit::Millisecond),
        "us" => Ok(TimeUnit::Microsecond),
        "ns" => Ok(TimeUnit::Nanosecond),
        other => Err(format!(
            "{path}: unknown timestamp unit {other:?} (s, ms, us, ns)"
        )),
    }
}

fn unit_name(u: &TimeUnit) -> &'static str {
    match u {
        TimeUnit::Second => "s",
        TimeUnit::Millisecond => "ms",
        TimeUnit::Microsecond => "us",
        TimeUnit::Nanosecond => "ns",
    }
}

fn to_fields(specs: &[FieldSpec], path: &str) -> Result<Fields, String> {
    let mut seen = std::collections::HashSet::new();
    specs
        .iter()
        .map(|s| {
            if s.name.is_empty() {
                return Err(format!("{path}: a field has no name"));
            }
            if !seen.insert(s.name.as_str()) {
                return Err(format!("{path}: field {:?} is declared twice", s.name));
            }
            s.to_field(path)
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Fields::from)
}

impl PayloadSpec {
    /// The Arrow fields of the payload struct.
    pub fn arrow_fields(&self) -> Result<Fields, String> {
        if self.fields.is_empty() {
            return Err("a payload needs at least one field".into());
        }
        to_fields(&self.fields, "")
    }
}

/// The schema of a table with a payload: the base columns, then `payload`
/// and `payload_error`.
pub fn schema_with_payload(base: &Schema, payload: &Fields) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = base.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        PAYLOAD,
        DataType::Struct(payload.clone()),
        true,
    )));
    fields.push(Arc::new(Field::new(PAYLOAD_ERROR, DataType::Utf8, true)));
    Arc::new(Schema::new(fields))
}

/// The schema of a table without a payload whose rows may still carry an
/// error (a large payload that could not be read): the base columns, then
/// `payload_error`.
pub fn schema_with_payload_error(base: &Schema) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = base.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(PAYLOAD_ERROR, DataType::Utf8, true)));
    Arc::new(Schema::new(fields))
}

/// `batch` with `errors` (one per row) in its `payload_error` column: a
/// given error takes the place of the column's value, and the column is
/// added last when the batch has none.
pub fn with_errors(
    batch: RecordBatch,
    errors: &[Option<String>],
) -> Result<RecordBatch, ArrowError> {
    if errors.len() != batch.num_rows() {
        return Err(ArrowError::InvalidArgumentError(format!(
            "{} errors for {} rows",
            errors.len(),
            batch.num_rows()
        )));
    }
    let schema = batch.schema();
    match schema.index_of(PAYLOAD_ERROR) {
        Ok(i) => {
            let old = batch.column(i).as_string::<i32>();
            let merged: StringArray = errors
                .iter()
                .enumerate()
                .map(|(row, e)| {
                    e.as_deref()
                        .or_else(|| old.is_valid(row).then(|| old.value(row)))
                })
                .collect();
            let mut columns = batch.columns().to_vec();
            columns[i] = Arc::new(merged);
            RecordBatch::try_new(schema, columns)
        }
        Err(_) => {
            let added: StringArray = errors.iter().map(Option::as_deref).collect();
            let mut columns = batch.columns().to_vec();
            columns.push(Arc::new(added));
            RecordBatch::try_new(schema_with_payload_error(&schema), columns)
        }
    }
}

/// Decodes bodies into the payload columns.
#[derive(Debug, Clone)]
pub struct PayloadDecoder {
    unwrap: Unwrap,
    payload: SchemaRef,
    table: SchemaRef,
}

impl PayloadDecoder {
    pub fn new(spec: &PayloadSpec, base: &Schema) -> Result<Self, String> {
        let fields = spec.arrow_fields()?;
        // Check now that arrow-json can decode this schema.
        let payload = Arc::new(Schema::new(fields.clone()));
        ReaderBuilder::new(payload.clone())
            .build_decoder()
            .map_err(|e| format!("payload schema: {e}"))?;
        Ok(Self {
            unwrap: spec.unwrap,
            payload,
            table: schema_with_payload(base, &fields),
        })
    }

    /// The table schema including the payload columns.
    pub fn table_schema(&self) -> SchemaRef {
        Arc::clone(&self.table)
    }

    /// Adds `payload` and `payload_error` to a batch of the base schema.
    pub fn extend(&self, batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
        let bodies = batch
            .column_by_name(column::BODY)
            .ok_or_else(|| ArrowError::SchemaError("no body column".into()))?
            .as_string::<i32>()
            .clone();
        let (payload, errors) = self.decode(&bodies)?;
        let mut columns = batch.columns().to_vec();
        columns.push(payload);
        columns.push(Arc::new(errors));
        RecordBatch::try_new(self.table_schema(), columns)
    }

    fn unwrapped<'a>(&self, body: &'a str) -> Result<std::borrow::Cow<'a, str>, String> {
        match self.unwrap {
            Unwrap::None => Ok(body.into()),
            Unwrap::Sns => {
                let envelope: serde_json::Value =
                    serde_json::from_str(body).map_err(|e| format!("not an SNS envelope: {e}"))?;
                match envelope.get("Message") {
                    Some(serde_json::Value::String(m)) => Ok(m.clone().into()),
                    _ => Err("not an SNS envelope: no string field `Message`".into()),
                }
            }
        }
    }

    fn decode(&self, bodies: &StringArray) -> Result<(ArrayRef, StringArray), ArrowError> {
        let n = bodies.len();
        let mut texts = Vec::with_capacity(n);
        let mut errors: Vec<Option<String>> = vec![None; n];
        for (i, b) in bodies.iter().enumerate() {
            match self.unwrapped(b.unwrap_or_default()) {
                Ok(t) => texts.push(Some(t)),
                Err(e) => {
                    errors[i] = Some(e);
                    texts.push(None);
                }
            }
        }
        // Fast path: every body decodes, in one pass.
        if errors.iter().all(Option::is_none)
            && let Ok(array) = self.decode_all(texts.iter().flatten().map(|t| t.as_ref()), n)
        {
            return Ok((array, StringArray::from(errors)));
        }
        // Some body is bad: decode one by one to tell which.
        let null = new_null_array(&DataType::Struct(self.payload.fields().clone()), 1);
        let mut rows: Vec<ArrayRef> = Vec::with_capacity(n);
        for (i, text) in texts.iter().enumerate() {
            let row = match text {
                None => null.clone(),
                Some(t) => match self.decode_all(std::iter::once(t.as_ref()), 1) {
                    Ok(a) => a,
                    Err(e) => {
                        errors[i] = Some(e);
                        null.clone()
                    }
                },
            };
            rows.push(row);
        }
        let refs: Vec<&dyn Array> = rows.iter().map(|a| a.as_ref()).collect();
        let array = arrow_select::concat::concat(&refs)?;
        Ok((array, StringArray::from(errors)))
    }

    /// Decodes `expected` JSON values into one struct array.
    fn decode_all<'a>(
        &self,
        texts: impl Iterator<Item = &'a str>,
        expected: usize,
    ) -> Result<ArrayRef, String> {
        // One more than expected, so that a body holding two values shows
        // up as an extra row instead of stopping the decoder mid-body.
        let mut decoder = ReaderBuilder::new(Arc::clone(&self.payload))
            .with_batch_size(expected + 1)
            .build_decoder()
            .map_err(|e| e.to_string())?;
        for t in texts {
            if !t.trim_start().starts_with('{') {
                return Err("body is not a JSON object".into());
            }
            let before = decoder.len();
            let consumed = decoder.decode(t.as_bytes()).map_err(clean)?;
            let newline = decoder.decode(b"\n").map_err(clean)?;
            // Each body must be exactly one value: otherwise later rows
            // would take the payloads of earlier bodies.
            if consumed != t.len() || newline != 1 || decoder.len() != before + 1 {
                return Err("body holds more than one JSON value".into());
            }
        }
        let struct_type = DataType::Struct(self.payload.fields().clone());
        match decoder.flush().map_err(clean)? {
            None if expected == 0 => Ok(arrow_array::new_empty_array(&struct_type)),
            Some(batch) if batch.num_rows() == expected => {
                Ok(Arc::new(arrow_array::StructArray::from(batch)))
            }
            other => Err(format!(
                "body holds {} JSON values, expected {expected}",
                other.map_or(0, |b| b.num_rows())
            )),
        }
    }
}

/// arrow-json's messages without the "Json error: " prefix.
fn clean(e: ArrowError) -> String {
    match e {
        ArrowError::JsonError(m) => m,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::types::Int64Type;

    use super::*;
    use crate::message::{SqsMessage, messages_to_batch};
    use crate::schema::table_schema;

    #[test]
    fn with_errors_adds_the_column_or_overrides_its_values_where_given() {
        let plain = batch(&["a", "b"]);
        let errors = [None, Some("no object".to_string())];
        let added = with_errors(plain.clone(), &errors).unwrap();
        assert_eq!(added.schema(), schema_with_payload_error(&table_schema()));
        let col = added
            .column_by_name(PAYLOAD_ERROR)
            .unwrap()
            .as_string::<i32>();
        assert!(col.is_null(0));
        assert_eq!(col.value(1), "no object");
        // A batch with a payload keeps its decoding errors where none is given.
        let d = PayloadDecoder::new(&spec(Unwrap::None), &table_schema()).unwrap();
        let decoded = d.extend(batch(&["not json", r#"{"id": 1}"#])).unwrap();
        let merged = with_errors(decoded, &errors).unwrap();
        assert_eq!(merged.schema(), d.table_schema());
        let col = merged
            .column_by_name(PAYLOAD_ERROR)
            .unwrap()
            .as_string::<i32>();
        assert!(col.is_valid(0), "the decoding error stays");
        assert_eq!(col.value(1), "no object");
        assert!(with_errors(plain, &errors[..1]).is_err());
    }

    fn spec(unwrap: Unwrap) -> PayloadSpec {
        let toml_like = serde_json::json!({
            "unwrap": unwrap,
            "fields": [
                {"name": "id", "type": "int64"},
                {"name": "user", "type": "struct", "fields": [{"name": "name", "type": "utf8"}]},
                {"name": "tags", "type": "list", "item": {"type": "utf8"}},
                {"name": "at", "type": "timestamp", "unit": "ms", "timezone": "UTC"}
            ]
        });
        serde_json::from_value(toml_like).unwrap()
    }

    fn batch(bodies: &[&str]) -> RecordBatch {
        let msgs: Vec<_> = bodies
            .iter()
            .enumerate()
            .map(|(i, b)| SqsMessage {
                message_id: i.to_string(),
                body: b.to_string(),
                ..Default::default()
            })
            .collect();
        messages_to_batch(&msgs, 1, 0).unwrap()
    }

    #[test]
    fn good_and_bad_bodies_each_keep_their_row() {
        let d = PayloadDecoder::new(&spec(Unwrap::None), &table_schema()).unwrap();
        let out = d
            .extend(batch(&[
                r#"{"id": 1, "user": {"name": "ann"}, "tags": ["a"], "extra": true}"#,
                "not json",
                r#"{"id": "seven"}"#,
                r#"{"id": 4}"#,
                "[1, 2]",
            ]))
            .unwrap();
        assert_eq!(out.num_rows(), 5);
        assert_eq!(out.schema(), d.table_schema());
        let payload = out.column_by_name(PAYLOAD).unwrap().as_struct();
        let errors = out
            .column_by_name(PAYLOAD_ERROR)
            .unwrap()
            .as_string::<i32>();
        let ids = payload
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert!(payload.is_valid(0) && errors.is_null(0));
        assert_eq!(ids.value(0), 1);
        assert!(
            payload.is_null(1) && errors.value(1).contains("JSON"),
            "{}",
            errors.value(1)
        );
        assert!(
            payload.is_null(2) && errors.value(2).contains("id"),
            "{}",
            errors.value(2)
        );
        assert!(payload.is_valid(3) && errors.is_null(3));
        assert_eq!(ids.value(3), 4);
        assert!(
            payload.column_by_name("user").unwrap().is_null(3),
            "missing fields are null"
        );
        assert!(payload.is_null(4) && errors.value(4).contains("not a JSON object"));
        assert_eq!(
            out.column_by_name("body")
                .unwrap()
                .as_string::<i32>()
                .value(1),
            "not json"
        );
    }

    #[test]
    fn an_empty_batch_decodes_to_empty_columns() {
        let d = PayloadDecoder::new(&spec(Unwrap::None), &table_schema()).unwrap();
        let out = d.extend(batch(&[])).unwrap();
        assert_eq!(out.num_rows(), 0);
        assert_eq!(out.schema(), d.table_schema());
    }

    #[test]
    fn sns_envelopes_are_unwrapped() {
        let d = PayloadDecoder::new(&spec(Unwrap::Sns), &table_schema()).unwrap();
        let env = serde_json::json!({"Type": "Notification", "Message": "{\"id\": 9}"}).to_string();
        let out = d.extend(batch(&[&env, r#"{"id": 1}"#])).unwrap();
        let payload = out.column_by_name(PAYLOAD).unwrap().as_struct();
        let ids = payload
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert_eq!(ids.value(0), 9);
        let errors = out
            .column_by_name(PAYLOAD_ERROR)
            .unwrap()
            .as_string::<i32>();
        assert!(
            errors.value(1).contains("SNS envelope"),
            "{}",
            errors.value(1)
        );
    }

    #[test]
    fn specs_round_trip_and_bad_specs_are_named() {
        let s = spec(Unwrap::None);
        let fields = s.arrow_fields().unwrap();
        let back: Vec<_> = fields
            .iter()
            .map(|f| FieldSpec::from_field(f).unwrap())
            .collect();
        assert_eq!(back, s.fields);
        let bad: PayloadSpec =
            serde_json::from_value(serde_json::json!({"fields": [{"name": "x", "type": "list"}]}))
                .unwrap();
        assert!(
            bad.arrow_fields()
                .unwrap_err()
                .contains("x: a list needs `item`")
        );
        let bad: PayloadSpec =
            serde_json::from_value(serde_json::json!({"fields": [{"name": "x", "type": "money"}]}))
                .unwrap();
        assert!(bad.arrow_fields().unwrap_err().contains("unknown type"));
    }
}
