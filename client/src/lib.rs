//! Rust client of sqs-flight: Amazon SQS queues read as Arrow Flight tables.
//!
//! A reader plans a **batch** of a table for its **consumer**
//! ([`Client::plan`]), reads the batch's endpoints, possibly in parallel
//! ([`Client::read`], [`Client::read_batch`]), and then acknowledges it:
//! [`Client::commit`] deletes every message the consumer read in batches up
//! to that one, [`Client::release`] makes the uncommitted ones visible again.
//! Until then the server keeps the messages invisible for the consumer, and
//! reading an endpoint again returns the same rows, so a failed read is
//! simply retried.
//!
//! Writing goes the other way: [`Client::send`] turns the rows of record
//! batches into messages (DoPut), one message per row.
//!
//! ```no_run
//! # async fn run() -> sqs_flight_client::Result<()> {
//! use sqs_flight_client::{Client, PlanOptions};
//!
//! let client = Client::connect("grpc://127.0.0.1:50051").await?;
//! loop {
//!     let plan = client.plan("demo", &PlanOptions::consumer("example")).await?;
//!     let rows = client.read_batch(&plan).await?;
//!     if rows.iter().all(|b| b.num_rows() == 0) {
//!         break;
//!     }
//!     // ... process the rows, then:
//!     client.commit(&plan.table, &plan.consumer, plan.batch).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! - [`client`]: [`Client`] and its [`ClientBuilder`] (URL, TLS, token).
//! - [`plan`]: [`PlanOptions`] in, [`Plan`] and its [`Endpoint`]s out.
//! - [`answer`]: the JSON answers of `commit`, `release` and `status`.
//! - [`send`]: [`Client::send`] over DoPut, [`MessageRows`] to build its
//!   batches from JSON lines or text, [`SendOutcome`] and [`SendError`].
//! - [`error`]: [`Error`], which says whether a failure is worth retrying.
//! - [`url`]: the accepted server URL forms.
//! - `datafusion` (feature `datafusion`): a DataFusion `TableProvider`
//!   reading one batch per provider, for SQL over queues.
//!
//! - `cli` (feature `cli`, on by default): the `sqs-flight` command-line
//!   tool, built on this library; `src/bin/sqs-flight.rs` only calls
//!   [`cli::main`](crate::cli::main).
//!
//! The wire types (plan, commit, release and status commands, the table
//! schema) come from `sqs-flight-schemas`, shared with the server.

pub mod answer;
#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
mod commit;
mod connect;
pub use connect::NOT_HTTP2;
#[cfg(feature = "datafusion")]
pub mod datafusion;
pub mod error;
pub mod plan;
pub mod send;
pub mod url;

pub use answer::{Committed, ConsumerStatus, Released, Status, TableStatus};
pub use client::{Client, ClientBuilder, RecordBatchStream};
pub use commit::CommitOptions;
pub use error::{Error, Reason, Result};
pub use plan::{Endpoint, Plan, PlanOptions};
pub use send::{MessageRows, OutgoingMessage, SendError, SendOutcome};
pub use sqs_flight_schemas::{self as schemas, table_schema};
