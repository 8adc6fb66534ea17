//! A strict reader of JSON objects whose errors name the field.
//!
//! serde's derive reports a wrong type without the field's name; clients of
//! a Flight server deserve better, so commands are read field by field.

use std::fmt;

use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Longest piece of client input quoted back in an error message, in
/// characters: a client's megabyte of text must not travel back in a status.
pub const MAX_QUOTED_CHARS: usize = 64;

/// `text` cut to [`MAX_QUOTED_CHARS`] characters, marked when cut.
pub fn quote_cut(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        None => text.to_string(),
        Some((at, _)) => format!("{}... ({} bytes)", &text[..at], text.len()),
    }
}

/// What is wrong with a JSON command or ticket. The message always names the
/// field (or says that the document itself is not a JSON object).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("{what} is not valid JSON: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("{what} must be a JSON object")]
    NotAnObject { what: &'static str },
    #[error("{what}: missing required field `{field}`")]
    Missing {
        what: &'static str,
        field: &'static str,
    },
    #[error("{what}: unknown field `{field}` (expected one of: {expected})")]
    Unknown {
        what: &'static str,
        field: String,
        expected: String,
    },
    #[error("{what}: field `{field}` is given more than once")]
    Duplicate { what: &'static str, field: String },
    #[error("{what}: field `{field}` must be {expected}, got {got}")]
    Type {
        what: &'static str,
        field: &'static str,
        expected: &'static str,
        got: String,
    },
    #[error("{what}: field `{field}` is {value}, {limit}")]
    Range {
        what: &'static str,
        field: &'static str,
        value: String,
        limit: String,
    },
}

/// The fields of one JSON object, taken out one by one.
pub struct Fields {
    what: &'static str,
    map: Map<String, Value>,
    known: &'static [&'static str],
}

impl Fields {
    /// Parses `bytes` as a JSON object. `what` names the document in errors
    /// ("plan command", "ticket"); `known` lists every accepted field.
    pub fn parse(
        what: &'static str,
        bytes: &[u8],
        known: &'static [&'static str],
    ) -> Result<Self, FieldError> {
        let document: Document =
            serde_json::from_slice(bytes).map_err(|e| FieldError::Malformed {
                what,
                reason: e.to_string(),
            })?;
        match document {
            Document::Object(map) => Ok(Self { what, map, known }),
            Document::Duplicate(field) => Err(FieldError::Duplicate {
                what,
                field: quote_cut(&field),
            }),
            Document::Other => Err(FieldError::NotAnObject { what }),
        }
    }

    /// Removes `field`; a JSON `null` counts as absent.
    fn take(&mut self, field: &'static str) -> Option<Value> {
        self.map.remove(field).filter(|v| !v.is_null())
    }

    fn type_error(&self, field: &'static str, expected: &'static str, got: &Value) -> FieldError {
        FieldError::Type {
            what: self.what,
            field,
            expected,
            got: describe(got),
        }
    }

    /// An optional non-empty string.
    pub fn opt_str(&mut self, field: &'static str) -> Result<Option<String>, FieldError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(v) => Err(self.type_error(field, "a non-empty string", &v)),
        }
    }

    /// A required non-empty string.
    pub fn str(&mut self, field: &'static str) -> Result<String, FieldError> {
        self.opt_str(field)?.ok_or_else(|| self.missing(field))
    }

    /// An optional non-negative integer.
    pub fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>, FieldError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(v) => Err(self.type_error(field, "a non-negative integer", &v)),
        }
    }

    /// A required non-negative integer.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, FieldError> {
        self.opt_u64(field)?.ok_or_else(|| self.missing(field))
    }

    /// An optional boolean.
    pub fn opt_bool(&mut self, field: &'static str) -> Result<Option<bool>, FieldError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(self.type_error(field, "a boolean", &v)),
        }
    }

    /// An optional array of non-empty strings; the error names the first
    /// element that is not one, by its index.
    pub fn opt_str_list(&mut self, field: &'static str) -> Result<Option<Vec<String>>, FieldError> {
        let items = match self.take(field) {
            None => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(v) => return Err(self.type_error(field, "an array of non-empty strings", &v)),
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            match item {
                Value::String(s) if !s.is_empty() => out.push(s),
                other => {
                    return Err(FieldError::Type {
                        what: self.what,
                        field,
                        expected: "an array of non-empty strings",
                        got: format!("{} at index {i}", describe(&other)),
                    });
                }
            }
        }
        Ok(Some(out))
    }

    /// The error for a required `field` that is absent.
    pub fn missing(&self, field: &'static str) -> FieldError {
        FieldError::Missing {
            what: self.what,
            field,
        }
    }

    /// Refuses any field not taken yet.
    pub fn finish(self) -> Result<(), FieldError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(field) => Err(FieldError::Unknown {
                what: self.what,
                field: quote_cut(field),
                expected: self.known.join(", "),
            }),
        }
    }

    /// An error for `field` whose `value` is out of range.
    pub fn range(&self, field: &'static str, value: impl ToString, limit: String) -> FieldError {
        FieldError::Range {
            what: self.what,
            field,
            value: value.to_string(),
            limit,
        }
    }
}

/// A JSON value as an error message shows it (strings cut).
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {:?}", quote_cut(s)),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

/// A JSON document read for [`Fields`]: an object whose keys are each given
/// once, or something else. serde_json's own `Value` keeps the last of
/// duplicate keys silently; a command must not mean two things.
enum Document {
    Object(Map<String, Value>),
    Duplicate(String),
    Other,
}

impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocumentVisitor)
    }
}

struct DocumentVisitor;

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Document, A::Error> {
        let mut map = Map::new();
        let mut duplicate = None;
        while let Some(key) = access.next_key::<String>()? {
            let value: Value = access.next_value()?;
            if map.contains_key(&key) {
                duplicate.get_or_insert(key);
            } else {
                map.insert(key, value);
            }
        }
        Ok(duplicate.map_or(Document::Object(map), Document::Duplicate))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Document, A::Error> {
        while access.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Document::Other)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Document, E> {
        Ok(Document::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Document, E> {
        Ok(Document::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Document, E> {
        Ok(Document::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Document, E> {
        Ok(Document::Other)
    }

    fn visit_str<E>(self, _: &str) -> Result<Document, E> {
        Ok(Document::Other)
    }

    fn visit_unit<E>(self) -> Result<Document, E> {
        Ok(Document::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_by_name() {
        let e = Fields::parse("x", br#"{"a":1,"b":2,"a":3}"#, &["a", "b"])
            .err()
            .unwrap();
        assert_eq!(e.to_string(), "x: field `a` is given more than once");
    }

    #[test]
    fn long_input_is_cut_in_errors() {
        let long = "y".repeat(10_000);
        let doc = format!(r#"{{"{long}":1}}"#);
        let e = Fields::parse("x", doc.as_bytes(), &["a"])
            .unwrap()
            .finish()
            .unwrap_err()
            .to_string();
        assert!(e.len() < 300 && e.contains("10000 bytes"), "{e}");
        let doc = format!(r#"{{"a":"{long}"}}"#);
        let mut f = Fields::parse("x", doc.as_bytes(), &["a"]).unwrap();
        let e = f.opt_u64("a").unwrap_err().to_string();
        assert!(e.len() < 300, "{e}");
        assert_eq!(quote_cut("short"), "short");
    }

    #[test]
    fn non_objects_are_named_as_such() {
        for doc in [&b"[1,{}]"[..], b"1", b"-1.5", b"\"s\"", b"true", b"null"] {
            let e = Fields::parse("x", doc, &[]).err().unwrap();
            assert_eq!(e, FieldError::NotAnObject { what: "x" });
        }
    }
}
