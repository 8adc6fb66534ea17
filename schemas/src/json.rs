//! A strict reader of JSON objects whose errors name the field.
//!
//! serde's derive reports a wrong type without the field's name; clients of
//! a Flight server deserve better, so commands are read field by field.
//!
//! A document is read in one pass into the few fields its command knows,
//! not into a whole `serde_json::Value`: an unknown field's value is
//! skipped unread (only its name is kept, for the error), an object value
//! is only named, and a list keeps at most [`MAX_KEPT_ITEMS`] items and its
//! length. So whatever a client sends, the server holds little more than
//! the fields it will use (a 28 MiB list of short ids read into a `Value`
//! took about 500 MiB).

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Number;

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

/// The most items of a list a document keeps: no list a command takes is
/// longer (a commit rejects at most 10,000 ids).
pub const MAX_KEPT_ITEMS: usize = 10_001;

/// The fields of one JSON object, taken out one by one.
pub struct Fields {
    what: &'static str,
    map: Vec<(&'static str, Shallow)>,
    /// The first field of the document that is not in `known` (cut as
    /// [`quote_cut`] cuts it).
    unknown: Option<String>,
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
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let document = DocumentSeed { known }
            .deserialize(&mut de)
            .and_then(|d| de.end().map(|()| d))
            .map_err(|e| FieldError::Malformed {
                what,
                reason: e.to_string(),
            })?;
        match document {
            Document::Object { map, unknown } => Ok(Self {
                what,
                map,
                unknown,
                known,
            }),
            Document::Duplicate(field) => Err(FieldError::Duplicate {
                what,
                field: quote_cut(&field),
            }),
            Document::Other => Err(FieldError::NotAnObject { what }),
        }
    }

    /// Removes `field`; a JSON `null` counts as absent.
    fn take(&mut self, field: &'static str) -> Option<Shallow> {
        let at = self.map.iter().position(|(name, _)| *name == field)?;
        Some(self.map.swap_remove(at).1).filter(|v| !matches!(v, Shallow::Null))
    }

    fn type_error(&self, field: &'static str, expected: &'static str, got: &Shallow) -> FieldError {
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
            Some(Shallow::String(s)) if !s.is_empty() => Ok(Some(s)),
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
            Some(Shallow::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
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
            Some(Shallow::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(self.type_error(field, "a boolean", &v)),
        }
    }

    /// An optional array of at most `max` non-empty strings (`noun` names
    /// them in the error for a longer one); the error for an element that is
    /// not one names it by its index.
    pub fn opt_str_list(
        &mut self,
        field: &'static str,
        max: usize,
        noun: &str,
    ) -> Result<Option<Vec<String>>, FieldError> {
        debug_assert!(max < MAX_KEPT_ITEMS, "a list is kept up to MAX_KEPT_ITEMS");
        let (items, len) = match self.take(field) {
            None => return Ok(None),
            Some(Shallow::Array { items, len }) => (items, len),
            Some(v) => return Err(self.type_error(field, "an array of non-empty strings", &v)),
        };
        if len > max {
            let limit = format!("the limit is {max} {noun}");
            return Err(self.range(field, format!("a list of {len} {noun}"), limit));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            match item {
                Item::Str(s) if !s.is_empty() => out.push(s),
                other => {
                    return Err(FieldError::Type {
                        what: self.what,
                        field,
                        expected: "an array of non-empty strings",
                        got: format!("{} at index {i}", other.describe()),
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

    /// Refuses a field that is not known, or known and not taken.
    pub fn finish(self) -> Result<(), FieldError> {
        let left = self.map.first().map(|(name, _)| name.to_string());
        match self.unknown.or(left) {
            None => Ok(()),
            Some(field) => Err(FieldError::Unknown {
                what: self.what,
                field,
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

/// A field's value as the document gave it, within bounds: scalars whole,
/// a list's first [`MAX_KEPT_ITEMS`] items and its length, an object only
/// named.
enum Shallow {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array { items: Vec<Item>, len: usize },
    Object,
}

/// An item of a list: a string, or what else it is (as errors show it).
enum Item {
    Str(String),
    Other(String),
}

impl Item {
    fn describe(&self) -> String {
        match self {
            Item::Str(s) => format!("string {:?}", quote_cut(s)),
            Item::Other(d) => d.clone(),
        }
    }
}

/// A JSON value as an error message shows it (strings cut).
fn describe(value: &Shallow) -> String {
    match value {
        Shallow::Null => "null".to_string(),
        Shallow::Bool(b) => format!("boolean {b}"),
        Shallow::Number(n) => format!("number {n}"),
        Shallow::String(s) => format!("string {:?}", quote_cut(s)),
        Shallow::Array { .. } => "an array".to_string(),
        Shallow::Object => "an object".to_string(),
    }
}

/// A JSON document read for [`Fields`]: an object whose keys are each given
/// once, or something else. serde_json's own `Value` keeps the last of
/// duplicate keys silently; a command must not mean two things.
enum Document {
    Object {
        map: Vec<(&'static str, Shallow)>,
        unknown: Option<String>,
    },
    Duplicate(String),
    Other,
}

/// Reads a [`Document`], keeping only the `known` fields' values.
struct DocumentSeed {
    known: &'static [&'static str],
}

impl<'de> DeserializeSeed<'de> for DocumentSeed {
    type Value = Document;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Document, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Document, A::Error> {
        let mut map: Vec<(&'static str, Shallow)> = Vec::new();
        let mut unknown = None;
        let mut duplicate = None;
        while let Some(key) = access.next_key::<String>()? {
            let Some(name) = self.known.iter().copied().find(|k| *k == key) else {
                access.next_value::<IgnoredAny>()?;
                unknown.get_or_insert(quote_cut(&key));
                continue;
            };
            let value: Shallow = access.next_value()?;
            if map.iter().any(|(seen, _)| *seen == name) {
                duplicate.get_or_insert(key);
            } else {
                map.push((name, value));
            }
        }
        Ok(match duplicate {
            Some(key) => Document::Duplicate(key),
            None => Document::Object { map, unknown },
        })
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

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemVisitor)
    }
}

/// Reads a list item: a string is kept, anything else only described
/// (a nested list or object is skipped unread).
struct ItemVisitor;

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Item, E> {
        Ok(Item::Other(describe(&Shallow::Null)))
    }

    fn visit_bool<E>(self, b: bool) -> Result<Item, E> {
        Ok(Item::Other(describe(&Shallow::Bool(b))))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Item, E> {
        Ok(Item::Other(format!("number {n}")))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Item, E> {
        Ok(Item::Other(format!("number {n}")))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Item, E> {
        ShallowVisitor
            .visit_f64(n)
            .map(|v| Item::Other(describe(&v)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Item, E> {
        Ok(Item::Str(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Item, E> {
        Ok(Item::Str(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Item, A::Error> {
        while access.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Item::Other("an array".into()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Item, A::Error> {
        while access.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Item::Other("an object".into()))
    }
}

impl<'de> Deserialize<'de> for Shallow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShallowVisitor)
    }
}

struct ShallowVisitor;

impl<'de> Visitor<'de> for ShallowVisitor {
    type Value = Shallow;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Shallow, E> {
        Ok(Shallow::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Shallow, E> {
        Ok(Shallow::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Shallow, E> {
        Ok(Shallow::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Shallow, E> {
        Ok(Shallow::Number(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Shallow, E> {
        Ok(Number::from_f64(n).map_or(Shallow::Null, Shallow::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Shallow, E> {
        Ok(Shallow::String(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Shallow, E> {
        Ok(Shallow::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Shallow, A::Error> {
        let mut items = Vec::new();
        let mut len = 0usize;
        while len < MAX_KEPT_ITEMS {
            match access.next_element::<Item>()? {
                None => return Ok(Shallow::Array { items, len }),
                Some(item) => items.push(item),
            }
            len += 1;
        }
        while access.next_element::<IgnoredAny>()?.is_some() {
            len += 1;
        }
        Ok(Shallow::Array { items, len })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Shallow, A::Error> {
        while access.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Shallow::Object)
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
