//! The JSON commands of the Flight surface (docs/protocol.md, "Plain Flight RPCs").
//!
//! ```json
//! {"table": "orders", "consumer": "q1", "batch": 17,
//!  "partitions": 4, "max_messages": 10000, "max_wait_ms": 2000,
//!  "receivers": 4}
//! ```
//!
//! Only `table` is required in a plan command; `consumer` defaults to
//! [`DEFAULT_CONSUMER`]. Limits are checked by the server, which knows the
//! table's configuration; this module checks syntax, types and names.

use serde::Serialize;

use crate::json::{FieldError, Fields};

/// The consumer used when a command names none.
pub const DEFAULT_CONSUMER: &str = "default";

/// Longest accepted table or consumer name, in bytes.
pub const MAX_NAME_LEN: usize = 256;

macro_rules! plan_command {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident {
                default: $default_name:ident = $default:expr,
                limit: $limit_name:ident = $limit:expr,
                zero: $zero:literal,
                limit_flag: $flag:literal, $env:literal, $value_name:literal {
                    $(#[doc = $flag_doc:literal])*
                },
                spark: $spark:literal,
                client: $client:ident: $client_ty:ty,
                cli: [$({ $(#[doc = $cli_doc:literal])* })?],
            }
        )*
    ) => {
        /// GetFlightInfo's command: plan (or look up) one batch of a consumer.
        /// The plan parameters are those of [`crate::plan`], each `None`
        /// where the command leaves it to the table.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        pub struct PlanCommand {
            pub table: String,
            pub consumer: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            pub batch: Option<u64>,
            $(
                $(#[doc = $doc])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<u64>,
            )*
        }

        impl PlanCommand {
            const FIELDS: &'static [&'static str] =
                &["table", "consumer", "batch", $(stringify!($name)),*];

            /// The plan parameters of a command being parsed.
            fn parse_params(
                f: &mut Fields,
                table: String,
                consumer: String,
                batch: Option<u64>,
            ) -> Result<Self, FieldError> {
                Ok(Self {
                    table,
                    consumer,
                    batch,
                    $( $name: f.opt_u64(stringify!($name))?, )*
                })
            }
        }
    };
}

crate::plan_params!(plan_command);

/// DoAction `commit`: delete everything of `consumer` up to `batch`,
/// except the messages it rejects, which go back to SQS.
///
/// The reject fields are left out of the JSON when unused, so a plain
/// commit is the same document an older server takes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CommitCommand {
    pub table: String,
    pub consumer: String,
    pub batch: u64,
    /// Message ids of the consumer's open batches up to `batch` to give
    /// back to SQS instead of deleting; each at most once, at most
    /// [`MAX_REJECT_IDS`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reject: Vec<String>,
    /// Seconds the rejected messages stay invisible (0 to
    /// [`MAX_REJECT_DELAY_SECONDS`], default 0); only with something to reject.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reject_delay_seconds: Option<u32>,
    /// Also give back every message of those batches whose typed payload
    /// did not decode (`payload_error` not null).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reject_payload_errors: bool,
}

/// The most message ids one commit may reject by id: a commit with more is
/// refused. A batch with more messages to give back is better released, or
/// committed with `reject_payload_errors`.
pub const MAX_REJECT_IDS: usize = 10_000;

/// The longest message id a reject list may name, in bytes (SQS's are 36).
pub const MAX_REJECT_ID_LEN: usize = 256;

/// The longest a rejected message may stay invisible: SQS's limit for a
/// visibility timeout (12 hours).
pub const MAX_REJECT_DELAY_SECONDS: u32 = 43_200;

/// DoAction `release`: make every uncommitted message visible again (or,
/// with `read_ahead_only`, those of the batch received ahead only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReleaseCommand {
    pub table: String,
    pub consumer: String,
    /// Give back only the batch received ahead of the consumer's next plan
    /// (docs/protocol.md, rule 7); its open batches stay.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub read_ahead_only: bool,
}

/// DoAction `status`: one table or all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatusCommand {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// How old, in milliseconds, the queue counts may be: counts read from
    /// SQS that long ago or less are answered again without a call (a
    /// dashboard, a streaming query's progress). None or 0: read now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age_ms: Option<u64>,
}

/// The largest `max_age_ms` of a `status` command: a minute (SQS's own
/// approximate counts settle within about that long).
pub const MAX_STATUS_AGE_MS: u64 = 60_000;

/// The largest batch number: batches travel as Int64 in the schema.
pub const MAX_BATCH: u64 = i64::MAX as u64;

/// What is wrong with a table or consumer name, if anything: longer than
/// [`MAX_NAME_LEN`] bytes, or holding a control character (names are
/// written to logs and status answers verbatim).
pub(crate) fn name_problem(name: &str) -> Option<(String, String)> {
    if name.len() > MAX_NAME_LEN {
        return Some((
            format!("{} bytes long", name.len()),
            format!("the limit is {MAX_NAME_LEN} bytes"),
        ));
    }
    name.char_indices()
        .find(|(_, c)| c.is_control())
        .map(|(at, c)| {
            (
                format!("a name with U+{:04X} at byte {at}", c as u32),
                "control characters are not allowed in names".to_string(),
            )
        })
}

/// Checks a table or consumer name given outside a JSON command (a PATH
/// descriptor): at most [`MAX_NAME_LEN`] bytes, no control characters.
/// `what` names the document in the error, as in [`FieldError`].
pub fn check_name(what: &'static str, field: &'static str, name: &str) -> Result<(), FieldError> {
    match name_problem(name) {
        Some((value, limit)) => Err(FieldError::Range {
            what,
            field,
            value,
            limit,
        }),
        None => Ok(()),
    }
}

/// An optional table or consumer name, checked by [`name_problem`].
fn opt_name(f: &mut Fields, field: &'static str) -> Result<Option<String>, FieldError> {
    let value = f.opt_str(field)?;
    match value.as_deref().and_then(name_problem) {
        Some((what, limit)) => Err(f.range(field, what, limit)),
        None => Ok(value),
    }
}

fn table(f: &mut Fields) -> Result<String, FieldError> {
    opt_name(f, "table")?.ok_or_else(|| f.missing("table"))
}

fn consumer(f: &mut Fields) -> Result<String, FieldError> {
    Ok(opt_name(f, "consumer")?.unwrap_or_else(|| DEFAULT_CONSUMER.to_string()))
}

fn batch(f: &mut Fields, value: Option<u64>) -> Result<Option<u64>, FieldError> {
    match value {
        Some(b) if b > MAX_BATCH => Err(f.range("batch", b, format!("the limit is {MAX_BATCH}"))),
        _ => Ok(value),
    }
}

/// The `reject` list: at most [`MAX_REJECT_IDS`] ids of at most
/// [`MAX_REJECT_ID_LEN`] bytes, none twice.
fn reject_ids(f: &mut Fields) -> Result<Vec<String>, FieldError> {
    let ids = f
        .opt_str_list("reject", MAX_REJECT_IDS, "ids")?
        .unwrap_or_default();
    if let Some(long) = ids.iter().find(|id| id.len() > MAX_REJECT_ID_LEN) {
        let value = format!("a list holding {:?}", crate::json::quote_cut(long));
        let limit = format!("a message id is at most {MAX_REJECT_ID_LEN} bytes");
        return Err(f.range("reject", value, limit));
    }
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    let twice: Vec<String> = ids
        .iter()
        .filter(|id| !seen.insert(id.as_str()))
        .map(|id| format!("{:?}", crate::json::quote_cut(id)))
        .collect();
    if !twice.is_empty() {
        let shown = shown_list(&twice);
        let value = format!("a list naming {shown} more than once");
        return Err(f.range("reject", value, "each id may be given once".into()));
    }
    Ok(ids)
}

/// The most items an error message lists before it says how many more.
pub const MAX_LISTED: usize = 10;

/// `"a", "b" and 3 more`: at most [`MAX_LISTED`] of `items`, joined.
pub fn shown_list(items: &[String]) -> String {
    let mut out = items
        .iter()
        .take(MAX_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > MAX_LISTED {
        out.push_str(&format!(" and {} more", items.len() - MAX_LISTED));
    }
    out
}

/// `reject_delay_seconds`: within SQS's limit, and only with something to
/// reject.
fn reject_delay(f: &Fields, delay: Option<u64>, rejects: bool) -> Result<Option<u32>, FieldError> {
    let Some(d) = delay else { return Ok(None) };
    if d > u64::from(MAX_REJECT_DELAY_SECONDS) {
        let limit = format!("the limit is {MAX_REJECT_DELAY_SECONDS} (12 hours, SQS's)");
        return Err(f.range("reject_delay_seconds", d, limit));
    }
    if !rejects {
        let limit = "but nothing is rejected: give `reject` or `reject_payload_errors`".into();
        return Err(f.range("reject_delay_seconds", d, limit));
    }
    Ok(Some(d as u32))
}

impl PlanCommand {
    /// A plan of the next batch of `consumer` with the table's defaults.
    pub fn new(table: impl Into<String>, consumer: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            consumer: consumer.into(),
            ..Self::default()
        }
    }

    /// Parses the UTF-8 JSON command of GetFlightInfo.
    pub fn parse(bytes: &[u8]) -> Result<Self, FieldError> {
        let mut f = Fields::parse("plan command", bytes, Self::FIELDS)?;
        let table = table(&mut f)?;
        let consumer = consumer(&mut f)?;
        let raw_batch = f.opt_u64("batch")?;
        let batch = batch(&mut f, raw_batch)?;
        let cmd = Self::parse_params(&mut f, table, consumer, batch)?;
        f.finish()?;
        Ok(cmd)
    }

    /// The command as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serializes")
    }
}

impl CommitCommand {
    const FIELDS: &'static [&'static str] = &[
        "table",
        "consumer",
        "batch",
        "reject",
        "reject_delay_seconds",
        "reject_payload_errors",
    ];

    /// A plain commit: delete everything of `consumer` up to `batch`.
    pub fn new(table: impl Into<String>, consumer: impl Into<String>, batch: u64) -> Self {
        Self {
            table: table.into(),
            consumer: consumer.into(),
            batch,
            ..Self::default()
        }
    }

    /// Whether the commit gives anything back (ids, or payload errors).
    pub fn rejects(&self) -> bool {
        !self.reject.is_empty() || self.reject_payload_errors
    }

    /// Parses DoAction `commit`'s body.
    pub fn parse(bytes: &[u8]) -> Result<Self, FieldError> {
        let mut f = Fields::parse("commit command", bytes, Self::FIELDS)?;
        let table = table(&mut f)?;
        let consumer = consumer(&mut f)?;
        let raw = f.u64("batch")?;
        let batch = batch(&mut f, Some(raw))?.unwrap_or(raw);
        let reject = reject_ids(&mut f)?;
        let delay = f.opt_u64("reject_delay_seconds")?;
        let cmd = Self {
            table,
            consumer,
            batch,
            reject,
            reject_delay_seconds: None,
            reject_payload_errors: f.opt_bool("reject_payload_errors")?.unwrap_or(false),
        };
        let cmd = Self {
            reject_delay_seconds: reject_delay(&f, delay, cmd.rejects())?,
            ..cmd
        };
        f.finish()?;
        Ok(cmd)
    }

    /// The command as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serializes")
    }
}

impl ReleaseCommand {
    const FIELDS: &'static [&'static str] = &["table", "consumer", "read_ahead_only"];

    /// A release of every uncommitted message of `consumer`.
    pub fn new(table: impl Into<String>, consumer: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            consumer: consumer.into(),
            read_ahead_only: false,
        }
    }

    /// Parses DoAction `release`'s body.
    pub fn parse(bytes: &[u8]) -> Result<Self, FieldError> {
        let mut f = Fields::parse("release command", bytes, Self::FIELDS)?;
        let cmd = Self {
            table: table(&mut f)?,
            consumer: consumer(&mut f)?,
            read_ahead_only: f.opt_bool("read_ahead_only")?.unwrap_or(false),
        };
        f.finish()?;
        Ok(cmd)
    }

    /// The command as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serializes")
    }
}

impl StatusCommand {
    const FIELDS: &'static [&'static str] = &["table", "max_age_ms"];

    /// Parses DoAction `status`'s body; an empty body means `{}`.
    pub fn parse(bytes: &[u8]) -> Result<Self, FieldError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let mut f = Fields::parse("status command", bytes, Self::FIELDS)?;
        let max_age_ms = match f.opt_u64("max_age_ms")? {
            Some(ms) if ms > MAX_STATUS_AGE_MS => {
                let limit = format!("the limit is {MAX_STATUS_AGE_MS}");
                return Err(f.range("max_age_ms", ms, limit));
            }
            ms => ms,
        };
        let cmd = Self {
            table: opt_name(&mut f, "table")?,
            max_age_ms,
        };
        f.finish()?;
        Ok(cmd)
    }

    /// The command as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_defaults_and_full_form() {
        let p = PlanCommand::parse(br#"{"table":"orders"}"#).unwrap();
        assert_eq!(p, PlanCommand::new("orders", "default"));
        let p = PlanCommand::parse(
            br#"{"table":"orders","consumer":"q1","batch":17,"partitions":4,
                "max_messages":10000,"max_wait_ms":2000,"max_bytes":1,"max_duration_ms":5,
                "receivers":3}"#,
        )
        .unwrap();
        assert_eq!(p.receivers, Some(3));
        assert_eq!(p.batch, Some(17));
        assert_eq!(p.partitions, Some(4));
        assert_eq!(p.max_duration_ms, Some(5));
        assert_eq!(PlanCommand::parse(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn plan_errors_name_the_field() {
        let err = |s: &str| PlanCommand::parse(s.as_bytes()).unwrap_err().to_string();
        assert!(err("{").contains("not valid JSON"));
        assert!(err("[1]").contains("must be a JSON object"));
        assert!(err("{}").contains("missing required field `table`"));
        assert!(err(r#"{"table":"t","bogus":1}"#).contains("unknown field `bogus`"));
        let e = err(r#"{"table":"t","batch":"7"}"#);
        assert!(
            e.contains("`batch`") && e.contains("non-negative integer"),
            "{e}"
        );
        assert!(err(r#"{"table":"t","partitions":-1}"#).contains("`partitions`"));
        assert!(err(r#"{"table":"t","max_wait_ms":1.5}"#).contains("`max_wait_ms`"));
        assert!(err(r#"{"table":"t","receivers":"4"}"#).contains("`receivers`"));
        assert!(err(r#"{"table":""}"#).contains("`table`"));
        assert!(err(r#"{"table":"t","batch":9223372036854775808}"#).contains("limit"));
        let long = format!(r#"{{"table":"{}"}}"#, "x".repeat(MAX_NAME_LEN + 1));
        assert!(err(&long).contains("`table`"));
        let e = err(r#"{"table":"t","consumer":"a\nb"}"#);
        assert!(e.contains("`consumer`") && e.contains("U+000A"), "{e}");
        let e = err(r#"{"table":"t","batch":1,"batch":2}"#);
        assert!(e.contains("`batch`") && e.contains("more than once"), "{e}");
    }

    #[test]
    fn null_counts_as_absent() {
        let p = PlanCommand::parse(br#"{"table":"t","batch":null,"consumer":null}"#).unwrap();
        assert_eq!(p, PlanCommand::new("t", DEFAULT_CONSUMER));
    }

    #[test]
    fn commit_requires_batch() {
        let c = CommitCommand::parse(br#"{"table":"t","consumer":"c","batch":3}"#).unwrap();
        assert_eq!(c.batch, 3);
        let e = CommitCommand::parse(br#"{"table":"t"}"#).unwrap_err();
        assert!(e.to_string().contains("`batch`"));
        assert_eq!(CommitCommand::parse(&c.to_json()).unwrap(), c);
        assert_eq!(c.to_json(), br#"{"table":"t","consumer":"c","batch":3}"#);
    }

    #[test]
    fn commit_rejects_and_their_errors_name_the_field() {
        let c = CommitCommand::parse(
            br#"{"table":"t","batch":3,"reject":["a","b"],"reject_delay_seconds":30,
                 "reject_payload_errors":true}"#,
        )
        .unwrap();
        assert_eq!(c.reject, ["a", "b"]);
        assert_eq!(c.reject_delay_seconds, Some(30));
        assert!(c.reject_payload_errors);
        assert_eq!(CommitCommand::parse(&c.to_json()).unwrap(), c);
        let only_errors = CommitCommand::parse(
            br#"{"table":"t","batch":3,"reject_payload_errors":true,"reject_delay_seconds":0}"#,
        )
        .unwrap();
        assert_eq!(only_errors.reject_delay_seconds, Some(0));

        let err = |body: &str| {
            CommitCommand::parse(body.as_bytes())
                .unwrap_err()
                .to_string()
        };
        let e = err(r#"{"table":"t","batch":1,"reject":"a"}"#);
        assert!(e.contains("`reject`") && e.contains("array"), "{e}");
        let e = err(r#"{"table":"t","batch":1,"reject":["a",7]}"#);
        assert!(
            e.contains("`reject`") && e.contains("number 7 at index 1"),
            "{e}"
        );
        let e = err(r#"{"table":"t","batch":1,"reject":["a",""]}"#);
        assert!(e.contains("at index 1"), "{e}");
        let e = err(r#"{"table":"t","batch":1,"reject":["a","b","a","b","c"]}"#);
        assert!(e.contains(r#"naming "a", "b" more than once"#), "{e}");
        let many = (0..=MAX_REJECT_IDS)
            .map(|i| format!("\"{i}\""))
            .collect::<Vec<_>>();
        let e = err(&format!(
            r#"{{"table":"t","batch":1,"reject":[{}]}}"#,
            many.join(",")
        ));
        assert!(
            e.contains("`reject`") && e.contains("the limit is 10000"),
            "{e}"
        );
        let e = err(&format!(
            r#"{{"table":"t","batch":1,"reject":["{}"]}}"#,
            "x".repeat(300)
        ));
        assert!(e.contains("at most 256 bytes"), "{e}");
        let e = err(r#"{"table":"t","batch":1,"reject":["a"],"reject_delay_seconds":43201}"#);
        assert!(
            e.contains("`reject_delay_seconds`") && e.contains("43200"),
            "{e}"
        );
        let e = err(r#"{"table":"t","batch":1,"reject_delay_seconds":5}"#);
        assert!(
            e.contains("`reject_delay_seconds`") && e.contains("nothing is rejected"),
            "{e}"
        );
        let e = err(r#"{"table":"t","batch":1,"reject":[],"reject_delay_seconds":5}"#);
        assert!(e.contains("nothing is rejected"), "{e}");
        let e = err(r#"{"table":"t","batch":1,"reject_payload_errors":"yes"}"#);
        assert!(
            e.contains("`reject_payload_errors`") && e.contains("boolean"),
            "{e}"
        );
    }

    #[test]
    fn release_and_status() {
        let r = ReleaseCommand::parse(br#"{"table":"t"}"#).unwrap();
        assert_eq!(r.consumer, "default");
        assert!(ReleaseCommand::parse(br#"{"table":"t","batch":1}"#).is_err());
        assert_eq!(StatusCommand::parse(b"").unwrap().table, None);
        assert_eq!(StatusCommand::parse(b"{}").unwrap().table, None);
        assert_eq!(
            StatusCommand::parse(br#"{"table":"x"}"#).unwrap().table,
            Some("x".into())
        );
        assert!(StatusCommand::parse(br#"{"tables":"x"}"#).is_err());
        let cached = StatusCommand::parse(br#"{"table":"x","max_age_ms":5000}"#).unwrap();
        assert_eq!(cached.max_age_ms, Some(5000));
        let e = StatusCommand::parse(br#"{"max_age_ms":60001}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_age_ms") && e.contains("60000"), "{e}");
        assert!(StatusCommand::parse(br#"{"max_age_ms":-1}"#).is_err());
    }
}
