//! `infer-schema`: peek a batch, infer the schema of its JSON bodies with
//! arrow-json, print it as the server's `[tables.T.payload]` block.
//!
//! The batch is planned for one partition and released afterwards whatever
//! happens, so a look at a queue never deletes or hides its messages for
//! longer than the command runs. The fields are written with the server's
//! own `FieldSpec`, so the printed block is what the server reads back.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::schemas::column;
use crate::schemas::payload::FieldSpec;
use crate::{Client, PlanOptions};
use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_json::reader::infer_json_schema_from_iterator;
use arrow_schema::{DataType, Field, Fields};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use super::args::{InferArgs, UnwrapArg};
use super::exit::CliError;
use super::{Say, plural};

pub async fn run(client: &Client, args: InferArgs, say: &Say) -> Result<(), CliError> {
    let rows = peek(client, &args, say).await?;
    let bodies = bodies(&rows)?;
    let sample = Sample::of(bodies.iter().map(String::as_str), args.unwrap);
    if sample.skipped > 0 {
        say.line(format_args!(
            "skipped {} of {} bodies: {}",
            sample.skipped,
            sample.read,
            skip_reason(args.unwrap)
        ));
    }
    let fields = sample.infer(&args.table)?;
    let text = toml_block(&args.table, args.unwrap, &fields, &sample);
    let mut out = tokio::io::stdout();
    out.write_all(text.as_bytes())
        .await
        .map_err(CliError::stdout)?;
    out.flush().await.map_err(CliError::stdout)
}

/// Reads one batch of at most --max-messages and releases it, also when the
/// read failed or was interrupted.
async fn peek(client: &Client, args: &InferArgs, say: &Say) -> Result<Vec<RecordBatch>, CliError> {
    let mut options = PlanOptions::consumer(&args.consumer)
        .partitions(1)
        .max_messages(args.max_messages);
    options.max_wait = args.max_wait_ms.map(Duration::from_millis);
    let plan = client.plan(&args.table, &options).await?;
    let read = tokio::select! {
        r = client.read_batch(&plan) => r.map_err(CliError::from),
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    match client.release(&args.table, &args.consumer).await {
        Ok(r) => say.line(format_args!(
            "released {} of table {} back to the queue",
            plural(r.released, "message"),
            args.table
        )),
        Err(e) => say.line(format_args!(
            "warning: could not release consumer {:?}: {e}; its messages become visible again \
             when its lease on the server expires",
            args.consumer
        )),
    }
    read
}

fn bodies(rows: &[RecordBatch]) -> Result<Vec<String>, CliError> {
    let mut out = Vec::new();
    for b in rows {
        let body = b
            .column_by_name(column::BODY)
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(|| CliError::render("the table has no Utf8 `body` column"))?;
        out.extend(body.iter().flatten().map(str::to_string));
    }
    Ok(out)
}

fn skip_reason(unwrap: UnwrapArg) -> &'static str {
    match unwrap {
        UnwrapArg::None => "not a JSON object",
        UnwrapArg::Sns => "not an SNS envelope whose Message is a JSON object",
    }
}

/// The bodies that are JSON objects, and how many were not.
struct Sample {
    objects: Vec<Value>,
    read: usize,
    skipped: usize,
}

impl Sample {
    fn of<'a>(bodies: impl Iterator<Item = &'a str>, unwrap: UnwrapArg) -> Self {
        let mut sample = Self {
            objects: Vec::new(),
            read: 0,
            skipped: 0,
        };
        for body in bodies {
            sample.read += 1;
            match object(body, unwrap) {
                Some(v) => sample.objects.push(v),
                None => sample.skipped += 1,
            }
        }
        sample
    }

    /// The payload fields, sorted by name at every level.
    fn infer(&self, table: &str) -> Result<Vec<FieldSpec>, CliError> {
        if self.objects.is_empty() {
            return Err(CliError::Infer(format!(
                "no body to infer from: table {table} gave {}, none of them a JSON object",
                plural(self.read as u64, "message")
            )));
        }
        let schema = infer_json_schema_from_iterator(self.objects.iter().map(Ok))
            .map_err(|e| CliError::Infer(format!("the bodies disagree on a field's type: {e}")))?;
        if schema.fields().is_empty() {
            return Err(CliError::Infer(format!(
                "the JSON objects of table {table} have no fields"
            )));
        }
        sorted(schema.fields())
            .iter()
            .map(|f| FieldSpec::from_field(f))
            .collect::<Result<_, _>>()
            .map_err(CliError::Infer)
    }
}

/// The JSON object in `body` (inside its SNS envelope with `Sns`).
fn object(body: &str, unwrap: UnwrapArg) -> Option<Value> {
    let value: Value = serde_json::from_str(body).ok()?;
    let value = match unwrap {
        UnwrapArg::None => value,
        UnwrapArg::Sns => serde_json::from_str(value.get("Message")?.as_str()?).ok()?,
    };
    value.is_object().then_some(value)
}

/// `fields` sorted by name, and so are those of nested structs: arrow-json
/// infers them in no particular order.
fn sorted(fields: &Fields) -> Fields {
    let mut out: Vec<Field> = fields
        .iter()
        .map(|f| {
            f.as_ref()
                .clone()
                .with_data_type(sorted_type(f.data_type()))
        })
        .collect();
    out.sort_by(|a, b| a.name().cmp(b.name()));
    Fields::from(out)
}

fn sorted_type(t: &DataType) -> DataType {
    match t {
        DataType::Struct(fields) => DataType::Struct(sorted(fields)),
        DataType::List(item) => DataType::List(Arc::new(
            item.as_ref()
                .clone()
                .with_data_type(sorted_type(item.data_type())),
        )),
        other => other.clone(),
    }
}

/// The `[tables.T.payload]` block, one top-level field per line.
fn toml_block(table: &str, unwrap: UnwrapArg, fields: &[FieldSpec], sample: &Sample) -> String {
    let mut text = String::new();
    let w = &mut text;
    writeln!(
        w,
        "# Payload of table {table}, inferred from {} JSON bod{}; edit the types as needed.",
        sample.objects.len(),
        if sample.objects.len() == 1 {
            "y"
        } else {
            "ies"
        }
    )
    .expect("writing to a String");
    writeln!(w, "[tables.{}.payload]", toml_key(table)).expect("writing to a String");
    if unwrap == UnwrapArg::Sns {
        writeln!(w, "unwrap = \"sns\"").expect("writing to a String");
    }
    writeln!(w, "fields = [").expect("writing to a String");
    for f in fields {
        writeln!(w, "  {},", inline(f)).expect("writing to a String");
    }
    writeln!(w, "]").expect("writing to a String");
    text
}

/// A field spec as a TOML inline table.
fn inline(f: &FieldSpec) -> String {
    let mut parts = Vec::new();
    if !f.name.is_empty() {
        parts.push(format!("name = {}", toml_string(&f.name)));
    }
    parts.push(format!("type = {}", toml_string(&f.ty)));
    if !f.nullable {
        parts.push("nullable = false".into());
    }
    if let Some(unit) = &f.unit {
        parts.push(format!("unit = {}", toml_string(unit)));
    }
    if let Some(tz) = &f.timezone {
        parts.push(format!("timezone = {}", toml_string(tz)));
    }
    if let Some(item) = &f.item {
        parts.push(format!("item = {}", inline(item)));
    }
    if let Some(fields) = &f.fields {
        let inner: Vec<String> = fields.iter().map(inline).collect();
        parts.push(format!("fields = [{}]", inner.join(", ")));
    }
    format!("{{ {} }}", parts.join(", "))
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                write!(out, "\\u{:04X}", c as u32).expect("writing to a String");
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A table name as a TOML key: bare when it can be, quoted otherwise.
fn toml_key(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        name.to_string()
    } else {
        toml_string(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infer(bodies: &[&str], unwrap: UnwrapArg) -> (Vec<FieldSpec>, Sample) {
        let sample = Sample::of(bodies.iter().copied(), unwrap);
        (sample.infer("t").unwrap(), sample)
    }

    #[test]
    fn objects_are_inferred_and_the_rest_skipped() {
        let (fields, sample) = infer(
            &[
                r#"{"user":"ann","amount":1,"tags":["a"],"who":{"z":1,"id":"c"},"gone":null}"#,
                r#"{"user":"bob","amount":2.5}"#,
                "not json",
                "[1, 2]",
            ],
            UnwrapArg::None,
        );
        assert_eq!((sample.read, sample.skipped), (4, 2));
        let names: Vec<_> = fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["amount", "gone", "tags", "user", "who"]);
        let types: Vec<_> = fields.iter().map(|f| f.ty.as_str()).collect();
        assert_eq!(types, ["float64", "utf8", "list", "utf8", "struct"]);
        assert_eq!(fields[2].item.as_ref().unwrap().ty, "utf8");
        let inner: Vec<_> = fields[4]
            .fields
            .as_ref()
            .unwrap()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(inner, ["id", "z"], "nested fields sorted too");
    }

    #[test]
    fn sns_envelopes_are_opened() {
        let envelope =
            serde_json::json!({"Type": "Notification", "Message": r#"{"n": 1}"#}).to_string();
        let (fields, sample) = infer(&[&envelope, r#"{"n": 2}"#], UnwrapArg::Sns);
        assert_eq!(sample.skipped, 1, "a bare object is not an envelope");
        assert_eq!(
            (fields[0].name.as_str(), fields[0].ty.as_str()),
            ("n", "int64")
        );
    }

    #[test]
    fn nothing_to_infer_is_an_error() {
        let sample = Sample::of(["x", "1"].into_iter(), UnwrapArg::None);
        let e = sample.infer("t").unwrap_err().to_string();
        assert!(
            e.contains("gave 2 messages, none of them a JSON object"),
            "{e}"
        );
        let sample = Sample::of(["{}"].into_iter(), UnwrapArg::None);
        assert!(
            sample
                .infer("t")
                .unwrap_err()
                .to_string()
                .contains("no fields")
        );
    }

    #[test]
    fn the_block_is_toml_with_inline_fields() {
        let (fields, sample) = infer(
            &[r#"{"a \"q\"":1,"l":[{"x":true}],"s":{"t":"v"}}"#],
            UnwrapArg::None,
        );
        let text = toml_block("my.table", UnwrapArg::Sns, &fields, &sample);
        let expected = "\
# Payload of table my.table, inferred from 1 JSON body; edit the types as needed.
[tables.\"my.table\".payload]
unwrap = \"sns\"
fields = [
  { name = \"a \\\"q\\\"\", type = \"int64\" },
  { name = \"l\", type = \"list\", item = { type = \"struct\", fields = [{ name = \"x\", type = \"bool\" }] } },
  { name = \"s\", type = \"struct\", fields = [{ name = \"t\", type = \"utf8\" }] },
]
";
        assert_eq!(text, expected);
        assert_eq!(toml_key("orders_2-x"), "orders_2-x");
        assert_eq!(toml_string("a\u{1}b\\"), "\"a\\u0001b\\\\\"");
    }
}
