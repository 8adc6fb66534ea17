//! What crosses the wire in sqs-flight.
//!
//! Every engine that reads a queue through the server sees the same Arrow
//! schema ([`table_schema`]), and every request it sends is one of a few
//! small JSON documents. This crate holds both, so that the server and the
//! clients agree on them by construction.
//!
//! # Layout
//!
//! - [`schema`]: the table schema (docs/protocol.md, "Table schema"), column by column.
//! - [`message`]: [`SqsMessage`], a received SQS message in plain Rust types,
//!   and [`MessageBatchBuilder`], which turns messages into record batches.
//! - [`command`]: the JSON commands (plan, commit, release, status) with a
//!   strict parser: unknown fields, wrong types and missing required fields
//!   are refused with an error that names the field.
//! - [`plan`]: the plan parameters, each defined once (`plan_params!`), with
//!   their defaults and limits.
//! - [`ticket`]: the versioned ticket that identifies one repeatable read.
//! - [`reason`]: [`Reason`], why the server refused a call, as a word a
//!   program may branch on, and the trailer that carries it.
//!
//! Nothing here performs I/O; the server converts SDK types into
//! [`SqsMessage`] so that this crate does not depend on the AWS SDK.

pub mod command;
pub mod json;
pub mod message;
pub mod payload;
pub mod plan;
pub mod reason;
pub mod schema;
pub mod ticket;

pub use command::{CommitCommand, PlanCommand, ReleaseCommand, StatusCommand};
pub use json::FieldError;
pub use message::{MessageBatchBuilder, SqsMessage};
pub use reason::Reason;
pub use schema::{column, table_schema};
pub use ticket::{TICKET_VERSION, TicketId};
