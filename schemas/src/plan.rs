//! The plan parameters (docs/protocol.md, "Plan parameters: defaults and
//! limits"), each defined once, in [`plan_params!`](crate::plan_params).
//!
//! An entry holds everything about one parameter that more than one place
//! needs: its meaning, built-in default and limit, whether 0 is allowed,
//! the server's `--limit-*` flag, the Spark option, the Rust client's field,
//! the CLI flag (if the CLI has one) and the value a store written before
//! the parameter existed holds. From the list come:
//!
//! - here: the `DEFAULT_*` / `LIMIT_*` constants, [`PLAN_PARAMS`], the
//!   plan command's fields and its known fields
//!   ([`PlanCommand`](crate::PlanCommand));
//! - in the server: `Plan<T>` (a table's defaults, a batch's values, the
//!   limits), the `[limits]` settings and their flags, the `[tables.NAME]`
//!   keys, and the stored batch;
//! - in the Rust client: `PlanOptions`'s fields and setters, and the CLI's
//!   flags;
//! - in the Python client: `sqs_flight/_plan_params.py`, written from
//!   [`PLAN_PARAMS`] by this module's test (`SQSF_BLESS=1` rewrites it),
//!   which `client.py` and the Spark options read.
//!
//! Adding a parameter is one entry here, plus the code that uses its value.
//!
//! [`plan_params!`](crate::plan_params) hands the list to a macro of the
//! caller's (`plan_params!(my_macro)`), which matches each entry as
//!
//! ```text
//! $(
//!     $(#[doc = $doc:literal])*
//!     $name:ident {
//!         default: $default_name:ident = $default:expr,
//!         limit: $limit_name:ident = $limit:expr,
//!         zero: $zero:literal,
//!         limit_flag: $flag:literal, $env:literal, $value_name:literal {
//!             $(#[doc = $flag_doc:literal])*
//!         },
//!         spark: $spark:literal,
//!         client: $client:ident: $client_ty:ty,
//!         cli: [$({ $(#[doc = $cli_doc:literal])* })?],
//!     }
//! )*
//! ```
//!
//! - `zero`: whether the parameter may be 0 (its limit may not);
//! - `limit_flag`: the server's `--limit-*` flag, its variable, value name
//!   and help (the `[limits]` key is the parameter's name);
//! - `client`: the field and setter of the Rust client's `PlanOptions`: a
//!   `u64`, or a `Duration` for a parameter in milliseconds;
//! - `cli`: the help of the CLI's flag `--NAME`, if it has one.

/// Hands the list of plan parameters to `$callback!` (see the module's
/// documentation for the form of an entry).
#[macro_export]
macro_rules! plan_params {
    ($callback:ident) => {
        $callback! {
            /// Partitions (endpoints) per batch unless the command or table says otherwise.
            partitions {
                default: DEFAULT_PARTITIONS = 2,
                limit: LIMIT_PARTITIONS = 64,
                zero: false,
                limit_flag: "limit-partitions", "SQSF_LIMIT_PARTITIONS", "N" {
                    /// Largest `partitions` a plan may ask for: partitions (endpoints) per batch.
                },
                spark: "partitions",
                client: partitions: u64,
                cli: [{
                    /// Partitions (endpoints, one DoGet each) per batch (default: the table's).
                }],
            }
            /// Messages per partition of a batch.
            max_messages {
                default: DEFAULT_MAX_MESSAGES = 1000,
                limit: LIMIT_MAX_MESSAGES = 100_000,
                zero: false,
                limit_flag: "limit-max-messages", "SQSF_LIMIT_MAX_MESSAGES", "N" {
                    /// Largest `max_messages`: messages per partition and batch.
                },
                spark: "maxMessagesPerPartition",
                client: max_messages: u64,
                cli: [{
                    /// Messages per partition and batch (default: the table's).
                }],
            }
            /// Idle time without a message after which a partition's stream ends.
            max_wait_ms {
                default: DEFAULT_MAX_WAIT_MS = 1000,
                limit: LIMIT_MAX_WAIT_MS = 20_000,
                zero: true,
                limit_flag: "limit-max-wait-ms", "SQSF_LIMIT_MAX_WAIT_MS", "MS" {
                    /// Largest `max_wait_ms`: idle time that ends a partition's stream.
                },
                spark: "maxWaitMs",
                client: max_wait: Duration,
                cli: [{
                    /// Milliseconds a partition waits for a message before its batch ends
                    /// (default: the table's).
                }],
            }
            /// Bytes per partition of a batch.
            max_bytes {
                default: DEFAULT_MAX_BYTES = 64 << 20,
                limit: LIMIT_MAX_BYTES = 256 << 20,
                zero: false,
                limit_flag: "limit-max-bytes", "SQSF_LIMIT_MAX_BYTES", "N" {
                    /// Largest `max_bytes`: bytes per partition and batch.
                },
                spark: "maxBytesPerPartition",
                client: max_bytes: u64,
                cli: [],
            }
            /// Time after which a partition's stream ends however busy the queue is.
            max_duration_ms {
                default: DEFAULT_MAX_DURATION_MS = 30_000,
                limit: LIMIT_MAX_DURATION_MS = 300_000,
                zero: false,
                limit_flag: "limit-max-duration-ms", "SQSF_LIMIT_MAX_DURATION_MS", "MS" {
                    /// Largest `max_duration_ms`: total time of a partition's stream.
                },
                spark: "maxDurationMs",
                client: max_duration: Duration,
                cli: [],
            }
            // Why 32 on loopback: "Choosing the defaults" in
            // benches/results/2026-12-01-round5-ddbdb76.md (figure 3 at 8, 16 and
            // 32 through a 20 ms proxy, and at 0 ms); past it: figure 8 at 20 and
            // 50 ms.
            /// ReceiveMessage calls a partition keeps in flight at most. The count
            /// grows while receives come back full and shrinks while they do not (an
            /// idle queue costs one long poll per partition); past 32 it grows only
            /// as far as the round trip needs for 32,000 messages a second (32 calls
            /// up to 10 ms, 64 at 20 ms, 128 from 40 ms).
            receivers {
                default: DEFAULT_RECEIVERS = 128,
                limit: LIMIT_RECEIVERS = 128,
                zero: false,
                limit_flag: "limit-receivers", "SQSF_LIMIT_RECEIVERS", "N" {
                    /// Largest `receivers`: ReceiveMessage calls in flight per partition.
                },
                spark: "receiversPerPartition",
                client: receivers: u64,
                cli: [{
                    /// ReceiveMessage calls each partition keeps in flight at most (default:
                    /// the table's). More hide SQS's round trip on a busy queue.
                }],
                // One call at a time, as before `receivers` existed.
            }
            /// Batches received ahead of a consumer's next plan: once every partition
            /// of batch N has received, batch N+1 is received with the same plan
            /// command (docs/protocol.md, "Read-ahead"). Off (0) unless asked for, as
            /// a client that does not repeat one plan command would leave those
            /// messages hidden until release or lease expiry. The Spark source asks
            /// for 1.
            read_ahead {
                default: DEFAULT_READ_AHEAD = 0,
                limit: LIMIT_READ_AHEAD = 1,
                zero: true,
                limit_flag: "limit-read-ahead", "SQSF_LIMIT_READ_AHEAD", "N" {
                    /// Largest `read_ahead`: batches received ahead of a consumer's plans.
                },
                spark: "readAhead",
                client: read_ahead: u64,
                cli: [{
                    /// Batches received ahead of this consumer's plans, 0 or 1 (default:
                    /// the table's).
                }],
                // No read-ahead, as before `read_ahead` existed.
            }
            /// 1: a new batch's partitions start receiving at its plan, so SQS's round
            /// trip overlaps the engine's planning (docs/protocol.md, "Planning");
            /// 0: at their first DoGet. Off (0) unless asked for, as a client that
            /// commits without reading every partition would have the unread rows
            /// deleted. The Spark source asks for 1.
            receive_at_plan {
                default: DEFAULT_RECEIVE_AT_PLAN = 0,
                limit: LIMIT_RECEIVE_AT_PLAN = 1,
                zero: true,
                limit_flag: "limit-receive-at-plan", "SQSF_LIMIT_RECEIVE_AT_PLAN", "N" {
                    /// Largest `receive_at_plan`: 1 lets plans start their partitions'
                    /// receives, 0 keeps them to the first DoGets.
                },
                spark: "receiveAtPlan",
                client: receive_at_plan: u64,
                cli: [{
                    /// 1: the batch's partitions start receiving when it is planned, not at
                    /// their first read (default: the table's).
                }],
                // Receives at the first DoGet, as before `receive_at_plan` existed.
            }
            /// Most messages per partition a batch takes when `max_messages` is left
            /// to the built-in default: the queue's last-read depth over the
            /// partitions, rounded up, never below `max_messages` (docs/protocol.md,
            /// "Plan parameters"). Off (0) unless asked for; the Spark source
            /// asks for 10000.
            backlog_max_messages {
                default: DEFAULT_BACKLOG_MAX_MESSAGES = 0,
                limit: LIMIT_BACKLOG_MAX_MESSAGES = 100_000,
                zero: true,
                limit_flag: "limit-backlog-max-messages", "SQSF_LIMIT_BACKLOG_MAX_MESSAGES", "N" {
                    /// Largest `backlog_max_messages`: messages per partition of a batch
                    /// sized to the backlog.
                },
                spark: "backlogMaxMessagesPerPartition",
                client: backlog_max_messages: u64,
                cli: [],
                // No sizing, as before `backlog_max_messages` existed.
            }
        }
    };
}

/// What [`PLAN_PARAMS`] says of one plan parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanParam {
    /// The field of a plan command, a `[limits]` and `[tables.NAME]` key.
    pub name: &'static str,
    /// What it means (its entry's doc comment).
    pub doc: &'static str,
    /// The built-in default.
    pub default: u64,
    /// The built-in limit.
    pub limit: u64,
    /// Whether a plan may set it to 0.
    pub may_be_zero: bool,
    /// The Spark source's option that sets it.
    pub spark_option: &'static str,
}

macro_rules! definitions {
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
        $(
            $(#[doc = $doc])*
            pub const $default_name: u64 = $default;
            #[doc = concat!("Upper limit of `", stringify!($name), "`.")]
            pub const $limit_name: u64 = $limit;
        )*

        /// Every plan parameter, in the order of the list.
        pub const PLAN_PARAMS: &[PlanParam] = &[
            $(
                PlanParam {
                    name: stringify!($name),
                    doc: concat!($($doc, "\n",)*),
                    default: $default_name,
                    limit: $limit_name,
                    may_be_zero: $zero,
                    spark_option: $spark,
                },
            )*
        ];
    };
}

plan_params!(definitions);

/// How many plan parameters there are.
pub const COUNT: usize = PLAN_PARAMS.len();

/// Whether the plan parameter `name` may be 0 (`max_wait_ms`: a partition
/// then makes one receive call and does not wait; `read_ahead`,
/// `receive_at_plan`: off). The
/// limits of these are at least 1 like the others.
pub fn may_be_zero(name: &str) -> bool {
    PLAN_PARAMS.iter().any(|p| p.name == name && p.may_be_zero)
}

/// A value of a plan parameter as the Rust client holds it: a count, or a
/// time in milliseconds.
pub trait PlanValue: Copy {
    /// The value a plan command carries.
    fn plan_value(self) -> u64;
    /// The value of a plan command's `value`.
    fn from_plan_value(value: u64) -> Self;
}

impl PlanValue for u64 {
    fn plan_value(self) -> u64 {
        self
    }
    fn from_plan_value(value: u64) -> Self {
        value
    }
}

/// In whole milliseconds.
impl PlanValue for std::time::Duration {
    fn plan_value(self) -> u64 {
        u64::try_from(self.as_millis()).unwrap_or(u64::MAX)
    }
    fn from_plan_value(value: u64) -> Self {
        std::time::Duration::from_millis(value)
    }
}

/// The Python client's copy of [`PLAN_PARAMS`] (a module of plain data).
pub fn python_module() -> String {
    let quote = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut out = String::from(
        "\"\"\"The plan parameters, as schemas/src/plan.rs defines them (its\n\
         `plan_params!` list). Written by `SQSF_BLESS=1 cargo test --workspace --lib\n\
         plan::tests`; a test fails when this file differs from the list. Do not edit.\n\
         \"\"\"\n\
         \n\
         from __future__ import annotations\n\
         \n\
         from typing import NamedTuple\n\
         \n\
         \n\
         class PlanParam(NamedTuple):\n    \
             \"\"\"One plan parameter: its plan-command field (also its `[limits]` and\n    \
             `[tables.NAME]` key), meaning, built-in default and limit, whether a plan\n    \
             may set it to 0, and the Spark source's option that sets it.\"\"\"\n\
         \n    \
             name: str\n    \
             doc: str\n    \
             default: int\n    \
             limit: int\n    \
             may_be_zero: bool\n    \
             spark_option: str\n\
         \n\
         \n\
         #: Every plan parameter, in the server's order.\n\
         PLAN_PARAMS = (\n",
    );
    for p in PLAN_PARAMS {
        out += &format!(
            "    PlanParam(\n        name={},\n        doc=(\n",
            quote(p.name)
        );
        for line in p.doc.lines() {
            out += &format!("            {}\n", quote(&format!("{}\n", line.trim())));
        }
        out += &format!(
            "        ),\n        default={},\n        limit={},\n        may_be_zero={},\n        \
             spark_option={},\n    ),\n",
            p.default,
            p.limit,
            if p.may_be_zero { "True" } else { "False" },
            quote(p.spark_option)
        );
    }
    out + ")\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Python module of the checkout under test (cargo gives the test
    /// its manifest directory at run time: a test binary reused from a
    /// target directory another checkout built names that one at compile
    /// time).
    fn python_path() -> std::path::PathBuf {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(
                || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
                std::path::PathBuf::from,
            )
            .join("../client/python/src/sqs_flight/_plan_params.py")
    }

    #[test]
    fn the_python_list_is_the_definition() {
        let new = python_module();
        if std::env::var_os("SQSF_BLESS").is_some() {
            std::fs::write(python_path(), &new).unwrap();
        }
        let old = std::fs::read_to_string(python_path()).unwrap_or_default();
        assert!(
            old == new,
            "client/python/src/sqs_flight/_plan_params.py differs from plan_params!; \
             run `SQSF_BLESS=1 cargo test --workspace --lib plan::tests` and review the diff"
        );
    }

    #[test]
    fn each_parameter_once_with_a_default_within_its_limit() {
        let mut names: Vec<&str> = PLAN_PARAMS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COUNT);
        for p in PLAN_PARAMS {
            assert!(p.limit >= 1 && p.default <= p.limit, "{p:?}");
            assert!(p.default >= 1 || p.may_be_zero, "{p:?}");
            assert!(!p.doc.is_empty(), "{p:?}");
        }
        let zero: Vec<_> = PLAN_PARAMS
            .iter()
            .filter(|p| may_be_zero(p.name))
            .map(|p| p.name)
            .collect();
        assert_eq!(
            zero,
            [
                "max_wait_ms",
                "read_ahead",
                "receive_at_plan",
                "backlog_max_messages"
            ]
        );
    }
}
