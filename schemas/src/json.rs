//! A strict reader of JSON objects whose errors name the field.
//!
//! serde's derive reports a wrong type without the field's name; clients of
//! a Flight server deserve better, so commands are read field by field.

use serde_json::{Map, Value};

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
        let value: Value = serde_json::from_slice(bytes).map_err(|e| FieldError::Malformed {
            what,
            reason: e.to_string(),
        })?;
        match value {
            Value::Object(map) => Ok(Self { what, map, known }),
            _ => Err(FieldError::NotAnObject { what }),
        }
    }

    /// Removes `field`; a JSON `null` counts as absent.
    fn take(&mut self, field: &'static str) -> Option<Value> {
        self.map.remove(field).filter(|v| !v.is_null())
    }

    fn type_error(&self, field: &'static str, expected: &'static str, got: &Value) -> FieldError {
        let got = match got {
            Value::Null => "null".to_string(),
            Value::Bool(b) => format!("boolean {b}"),
            Value::Number(n) => format!("number {n}"),
            Value::String(s) => format!("string {s:?}"),
            Value::Array(_) => "an array".to_string(),
            Value::Object(_) => "an object".to_string(),
        };
        FieldError::Type {
            what: self.what,
            field,
            expected,
            got,
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
                field: field.clone(),
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
