//! `tables`, `schema` and `status`: what the server holds.

use std::fmt::Write as _;

use crate::{Client, Status};
use arrow_schema::Schema;
use tokio::io::AsyncWriteExt;

use super::exit::CliError;

async fn print(text: &str) -> Result<(), CliError> {
    let mut out = tokio::io::stdout();
    out.write_all(text.as_bytes())
        .await
        .map_err(CliError::stdout)?;
    out.flush().await.map_err(CliError::stdout)
}

pub async fn tables(client: &Client) -> Result<(), CliError> {
    let mut text = String::new();
    for name in client.tables().await? {
        writeln!(text, "{name}").expect("writing to a String");
    }
    print(&text).await
}

pub async fn schema(client: &Client, table: &str) -> Result<(), CliError> {
    let schema = client.schema(table).await?;
    print(&schema_text(&schema)).await
}

/// One line per column: name, type, and `not null` where it applies.
fn schema_text(schema: &Schema) -> String {
    let width = schema
        .fields()
        .iter()
        .map(|f| f.name().len())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for f in schema.fields() {
        let null = if f.is_nullable() { "" } else { "  not null" };
        writeln!(text, "{:width$}  {}{null}", f.name(), f.data_type())
            .expect("writing to a String");
    }
    text
}

pub async fn status(client: &Client, table: Option<&str>, json: bool) -> Result<(), CliError> {
    let status = client.status(table).await?;
    let text = if json {
        let mut s = serde_json::to_string_pretty(&status).expect("plain structs serialize");
        s.push('\n');
        s
    } else {
        status_text(&status)
    };
    print(&text).await
}

fn batch(b: Option<u64>) -> String {
    b.map_or_else(|| "-".to_string(), |b| b.to_string())
}

/// An age for people: `850 ms`, `12.3 s`, `4m 05s`, `2h 07m`, `3d 04h`.
fn age_text(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms} ms"),
        1..60 => format!("{s}.{} s", ms % 1000 / 100),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `, oldest message 4m 05s old` when the newest batch holds messages.
fn lag_text(age_ms: Option<u64>) -> String {
    age_ms.map_or_else(String::new, |ms| {
        format!(", oldest message {} old", age_text(ms))
    })
}

/// A line per table, and an indented line per consumer.
fn status_text(status: &Status) -> String {
    let mut text = String::new();
    let w = status
        .tables
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max(5);
    writeln!(
        text,
        "{:w$}  {:>9}  {:>9}  consumers",
        "table", "visible", "in flight"
    )
    .unwrap();
    let count = |n: Option<u64>| n.map_or_else(|| "?".to_string(), |n| n.to_string());
    for (name, t) in &status.tables {
        writeln!(
            text,
            "{name:w$}  {:>9}  {:>9}  {}",
            count(t.approximate_depth),
            count(t.approximate_in_flight),
            t.consumers.len()
        )
        .unwrap();
        if let Some(error) = &t.error {
            writeln!(text, "  queue counts unknown: {error}").unwrap();
        }
        for (consumer, c) in &t.consumers {
            let open: Vec<_> = c.open_batches.iter().map(u64::to_string).collect();
            write!(
                text,
                "  consumer {consumer}: committed batch {}, last planned {}, open [{}], holding {}{}",
                batch(c.committed_batch),
                batch(c.last_planned_batch),
                open.join(", "),
                super::plural(c.in_flight, "message"),
                lag_text(c.oldest_age_ms)
            )
            .unwrap();
            if c.rejected > 0 {
                write!(text, ", gave back {}", super::plural(c.rejected, "message")).unwrap();
            }
            if let Some(ahead) = c.read_ahead_batch {
                let held = super::plural(c.read_ahead, "message");
                write!(text, ", read ahead: batch {ahead} ({held})").unwrap();
            }
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConsumerStatus, TableStatus};

    #[test]
    fn status_text_shows_tables_and_consumers() {
        let mut s = Status::default();
        let mut t = TableStatus {
            approximate_depth: Some(20),
            approximate_in_flight: Some(3),
            ..TableStatus::default()
        };
        t.consumers.insert(
            "cli".into(),
            ConsumerStatus {
                committed_batch: Some(2),
                last_planned_batch: Some(3),
                open_batches: vec![3],
                in_flight: 3,
                oldest_age_ms: Some(245_000),
                rejected: 2,
                read_ahead_batch: Some(4),
                read_ahead: 10,
                ..ConsumerStatus::default()
            },
        );
        t.consumers.insert("idle".into(), ConsumerStatus::default());
        s.tables.insert("demo".into(), t);
        let text = status_text(&s);
        assert!(text.lines().nth(1).unwrap().starts_with("demo"), "{text}");
        assert!(
            text.contains(
                "consumer cli: committed batch 2, last planned 3, open [3], holding 3 messages, \
                 oldest message 4m 05s old, gave back 2 messages, read ahead: batch 4 (10 messages)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "consumer idle: committed batch -, last planned -, open [], holding 0 messages\n"
            ),
            "no age when the newest batch holds nothing: {text}"
        );
    }

    #[test]
    fn a_table_whose_counts_are_unknown_says_why() {
        let mut s = Status::default();
        let gone = TableStatus {
            error: Some("table \"gone\": queue does not exist".into()),
            ..TableStatus::default()
        };
        s.tables.insert("gone".into(), gone);
        let text = status_text(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["gone", "?", "?", "0"],
            "{text}"
        );
        assert_eq!(
            lines[2],
            "  queue counts unknown: table \"gone\": queue does not exist"
        );
    }

    #[test]
    fn ages_read_as_people_say_them() {
        let cases = [
            (0, "0 ms"),
            (850, "850 ms"),
            (12_345, "12.3 s"),
            (59_999, "59.9 s"),
            (60_000, "1m 00s"),
            (7_620_000, "2h 07m"),
            (14 * 86_400_000 + 3_600_000, "14d 01h"),
        ];
        for (ms, text) in cases {
            assert_eq!(age_text(ms), text, "{ms} ms");
        }
    }

    #[test]
    fn schema_text_aligns_columns() {
        let text = schema_text(&crate::table_schema());
        let first = text.lines().next().unwrap();
        assert!(
            first.starts_with("message_id ") && first.ends_with("Utf8  not null"),
            "{first}"
        );
        assert_eq!(text.lines().count(), 13);
    }
}
