//! sqs-flight server: Amazon SQS queues as Arrow Flight tables.
//!
//! SQS has no offsets and no replay, and it deletes a message only with the
//! receipt handle of the receive that got it. A distributed engine reads on
//! workers and commits on a coordinator that never sees those handles. This
//! server keeps every handle in a registry keyed by ticket, so that an
//! engine plans a batch (GetFlightInfo), reads its partitions anywhere
//! (DoGet, repeatable), and acknowledges it with `commit` (DoAction).
//!
//! # Layout
//!
//! - [`auth`]: bearer-token check of every RPC.
//! - [`config`]: flags, environment, TOML, validated [`config::Config`].
//! - [`error`]: the error type and its single mapping to Flight statuses.
//! - [`sqs`]: the queue trait, its aws-sdk-sqs and in-memory implementations,
//!   and bulk batch calls.
//! - [`registry`]: plans, tickets, receipts, watermarks, leases; the receive
//!   loop, the stream of a ticket's rows that DoGet and the SQL peeks read,
//!   and the visibility heartbeat.
//! - [`flight`]: the Flight service, one short method per RPC.
//! - [`sql`]: Flight SQL on the same port: SQL peeks over the queue tables
//!   on DataFusion.
//! - [`write`]: DoPut rows checked and sent with SendMessageBatch.
//! - [`metrics`], [`http`]: Prometheus metrics, `/healthz` and `/readyz`;
//!   [`fd_reserve`]: how the file-descriptor limit is shared.
//! - [`request_budget`]: the bound on bytes of requests still being received.
//! - [`server`]: bind, serve, shut down; [`idle`]: `--idle-exit`;
//!   [`instance`]: the process's identity and `--ready-file`;
//!   [`tls_self_signed`]: `--tls-self-signed`; [`secure_path`]: the owner
//!   and permissions of the state directory, the TLS key and token files.
//!
//! What is public is what the binary, the integration tests and the benches
//! use: [`Config`] and the settings of [`config`], [`server`]'s `bind`,
//! `serve` and `run`, [`registry::Registry`], the [`sqs`] queue trait and
//! its backends, [`metrics::Metrics`], the ready file's [`instance::Ready`],
//! [`telemetry::init`], the SQL worker's entry in [`sql::worker`], and
//! [`testing`] for what tests reach beyond that. The rest is `pub(crate)`.
//!
//! # The mechanisms
//!
//! **Ticket replay.** A ticket's first DoGet starts a receive loop that
//! records each receive (rows and receipt handles) in the ticket's log
//! *before* any reader streams it. Every DoGet, the first included, streams
//! by following that log, so replays and concurrent readers see the same
//! rows in the same order; a read that dies half way seals the log with what
//! it had. See [`registry::ticket`].
//!
//! **Visibility heartbeat.** Received messages stay invisible until commit:
//! the heartbeat extends each receipt chunk before half its visibility
//! timeout is left, while the consumer keeps calling within its lease; when
//! the lease runs out the messages are released. See [`registry::heartbeat`].
//!
//! **Commit.** `commit(N)` closes every ticket of batches <= N, deletes their
//! receipts with DeleteMessageBatch, counts SQS's refusals as `expired`, and
//! raises the watermark; deletes that could not be made are retried by the
//! next commit. Nothing leaves SQS any other way.

pub(crate) mod auth;
pub mod config;
pub(crate) mod demo;
pub(crate) mod error;
pub(crate) mod fd_reserve;
pub(crate) mod flight;
pub(crate) mod http;
pub(crate) mod idle;
pub mod instance;
pub(crate) mod large_payload;
pub mod metrics;
pub mod registry;
pub(crate) mod request_budget;
#[cfg(test)]
mod scratch;
pub(crate) mod secure_path;
pub mod server;
pub mod sql;
pub mod sqs;
pub(crate) mod state_log;
pub mod telemetry;
pub mod testing;
pub(crate) mod tls_self_signed;
pub(crate) mod write;

pub use config::Config;
pub use server::run;
