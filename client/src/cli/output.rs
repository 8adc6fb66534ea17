//! Writing record batches to stdout as a table, JSON lines, CSV or bodies.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use clap::ValueEnum;
use tokio::io::{AsyncWriteExt, Stdout};

use super::exit::CliError;

/// How rows are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// An aligned text table per batch, for people.
    Table,
    /// One JSON object per row (nulls included), for jq and scripts.
    Jsonl,
    /// CSV with one header line; maps and structs as text.
    Csv,
    /// The `body` column alone, one message per line (a body that holds a
    /// newline spans lines).
    Body,
}

/// Writes batches in one format to stdout, remembering whether the CSV
/// header went out.
pub struct Output {
    format: Format,
    stdout: Stdout,
    header_written: bool,
}

impl Output {
    pub fn new(format: Format) -> Self {
        Self {
            format,
            stdout: tokio::io::stdout(),
            header_written: false,
        }
    }

    /// Writes `batches` (one schema) and flushes, so that when this returns
    /// the rows have left the process.
    pub async fn write(&mut self, batches: &[RecordBatch]) -> Result<(), CliError> {
        if batches.iter().all(|b| b.num_rows() == 0) {
            return Ok(());
        }
        let bytes = self.render(batches).map_err(CliError::render)?;
        self.stdout
            .write_all(&bytes)
            .await
            .map_err(CliError::stdout)?;
        self.stdout.flush().await.map_err(CliError::stdout)
    }

    fn render(&mut self, batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
        match self.format {
            Format::Table => render_table(batches),
            Format::Jsonl => render_jsonl(batches),
            Format::Csv => {
                let header = !self.header_written;
                self.header_written = true;
                render_csv(batches, header)
            }
            Format::Body => render_bodies(batches),
        }
    }
}

fn render_table(batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let table = arrow_cast::pretty::pretty_format_batches(batches)?;
    Ok(format!("{table}\n").into_bytes())
}

fn render_jsonl(batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let mut writer = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::LineDelimited>(Vec::new());
    for b in batches {
        writer.write(b)?;
    }
    writer.finish()?;
    Ok(writer.into_inner())
}

fn render_csv(batches: &[RecordBatch], header: bool) -> Result<Vec<u8>, ArrowError> {
    let mut writer = arrow_csv::WriterBuilder::new()
        .with_header(header)
        .build(Vec::new());
    for b in batches {
        writer.write(&nested_as_text(b)?)?;
    }
    Ok(writer.into_inner())
}

fn render_bodies(batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let mut out = Vec::new();
    for b in batches {
        let body = b
            .column_by_name(crate::schemas::column::BODY)
            .ok_or_else(|| {
                ArrowError::SchemaError("--format body needs the `body` column".into())
            })?;
        let formatter = ArrayFormatter::try_new(body.as_ref(), &FormatOptions::default())?;
        for row in 0..b.num_rows() {
            out.extend_from_slice(formatter.value(row).to_string().as_bytes());
            out.push(b'\n');
        }
    }
    Ok(out)
}

/// CSV has no maps, lists or structs: such columns become their text form
/// (`{event: order_paid}`).
fn nested_as_text(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    if !schema.fields().iter().any(|f| f.data_type().is_nested()) {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default();
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !field.data_type().is_nested() {
            fields.push(field.as_ref().clone());
            columns.push(Arc::clone(column));
            continue;
        }
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
        let text: StringArray = (0..column.len())
            .map(|i| column.is_valid(i).then(|| formatter.value(i).to_string()))
            .collect();
        fields.push(Field::new(field.name(), DataType::Utf8, true));
        columns.push(Arc::new(text));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// The columns `tail` prints unless told otherwise.
pub const DEFAULT_COLUMNS: &str = "message_id,sent_timestamp,body";

/// Column indices of a `--columns` list (`all` for every column).
pub fn column_indices(schema: &SchemaRef, list: &str) -> Result<Vec<usize>, CliError> {
    if list.trim() == "all" {
        return Ok((0..schema.fields().len()).collect());
    }
    list.split(',')
        .map(str::trim)
        .map(|name| {
            schema.index_of(name).map_err(|_| {
                let known: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                CliError::Usage(format!(
                    "unknown column {name:?} in --columns (columns: {}, or `all`)",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schemas::{MessageBatchBuilder, SqsMessage, table_schema};

    fn sample() -> RecordBatch {
        let mut b = MessageBatchBuilder::with_capacity(2);
        for i in 0..2 {
            b.append(&SqsMessage {
                message_id: format!("id-{i}"),
                body: format!(r#"{{"n":{i}}}"#),
                sent_timestamp: Some(1_700_000_000_000),
                message_attributes: vec![("k".into(), "v".into())],
                ..SqsMessage::default()
            });
        }
        b.finish(3, 0).unwrap()
    }

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn every_format_renders_every_row() {
        let batch = sample();
        let table = text(render_table(std::slice::from_ref(&batch)).unwrap());
        assert!(
            table.contains("id-1") && table.contains(r#"{"n":1}"#),
            "{table}"
        );
        let jsonl = text(render_jsonl(std::slice::from_ref(&batch)).unwrap());
        let lines: Vec<serde_json::Value> = jsonl
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["body"], r#"{"n":1}"#);
        assert_eq!(lines[0]["md5_of_body"], serde_json::Value::Null);
        let csv = text(render_csv(std::slice::from_ref(&batch), true).unwrap());
        assert_eq!(csv.lines().count(), 3, "{csv}");
        assert!(csv.lines().next().unwrap().starts_with("message_id,body,"));
        assert!(csv.contains("{k: v}"), "{csv}");
        let bodies = text(render_bodies(std::slice::from_ref(&batch)).unwrap());
        assert_eq!(bodies, "{\"n\":0}\n{\"n\":1}\n");
    }

    #[test]
    fn columns_are_checked_against_the_schema() {
        let schema = table_schema();
        assert_eq!(column_indices(&schema, DEFAULT_COLUMNS).unwrap(), [0, 3, 1]);
        assert_eq!(
            column_indices(&schema, "all").unwrap().len(),
            schema.fields().len()
        );
        let e = column_indices(&schema, "body,nope")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"nope\"") && e.contains("message_id"), "{e}");
    }
}
