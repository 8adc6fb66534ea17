//! Configuration: command-line flags (each also an `SQSF_*` environment
//! variable), an optional TOML file, and the validated [`Config`] that the
//! rest of the server (and the tests) use.
//!
//! Each setting is defined once, in a [`settings!`](setting::settings)
//! list: the top-level ones below, the `[sql]` group in [`sql`]. Its doc
//! comment, type, default, bounds and variable make its flag, its TOML
//! key, its field of [`Config`] (or [`sql::SqlConfig`]), its bounds check,
//! its line of `--print-config` and its row of docs/configuration.md (a
//! test renders the tables there and compares). The plan parameters and
//! their bounds are in [`plan`]. The keys of `[tables.NAME]` are likewise
//! a list, `table_keys!` in `table.rs` (made by `table_key.rs`): each key's
//! TOML field, bounds, `--print-config` line and docs row.

mod docs;
pub(crate) mod large_payloads;
pub mod plan;
mod print;
pub mod role;
pub(crate) mod setting;
pub mod sql;
mod table;
mod table_key;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use crate::secure_path::PathError;

pub use large_payloads::LargePayloadConfig;
pub(crate) use plan::LimitSettings;
pub use plan::PlanParams;
pub use role::RoleConfig;
use setting::settings;
pub(crate) use table::TableToml;
pub use table::{Backend, TableConfig};
use table::{tables, valid_table_name};

/// Where the server listens unless told otherwise.
pub(crate) const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 50051);
/// How long a consumer's uncommitted messages stay invisible after its last call.
pub(crate) const DEFAULT_CONSUMER_LEASE_SECS: u64 = 300;
/// Bytes of uncommitted messages the whole registry may hold.
pub(crate) const DEFAULT_REGISTRY_MAX_BYTES: u64 = 1 << 30;
/// Uncommitted messages the whole registry may hold.
pub(crate) const DEFAULT_REGISTRY_MAX_MESSAGES: u64 = 2_000_000;
/// How long a table remembers the message ids its commits deleted
/// (seconds): 15 minutes, longer than most queues' visibility timeouts.
pub(crate) const DEFAULT_DEDUP_WINDOW_SECS: u64 = 900;
/// Upper limit of `dedup_window`: SQS's longest retention, 14 days.
pub(crate) const LIMIT_DEDUP_WINDOW_SECS: u64 = 1_209_600;
/// Message ids a table's committed window holds at most: about 60 MB at
/// the ~60 bytes each costs.
pub(crate) const DEFAULT_DEDUP_WINDOW_IDS: u64 = 1_000_000;
/// Upper limit of `dedup_window_ids`.
pub(crate) const LIMIT_DEDUP_WINDOW_IDS: u64 = 100_000_000;
/// Consumers the registry keeps at once, across all tables. Each costs
/// about a kilobyte (see [`crate::registry::caps`]); a Spark query is one.
pub(crate) const DEFAULT_MAX_CONSUMERS: u64 = 10_000;
/// Planned, uncommitted batches one consumer may hold. A Spark stream holds
/// at most two or three (the batch being read while the one before it
/// commits in the background); this leaves room for any engine that plans
/// ahead, and stops one that never commits.
pub(crate) const DEFAULT_MAX_OPEN_BATCHES_PER_CONSUMER: u64 = 100;
/// Tickets (partitions of open batches) the registry holds at once, across
/// all consumers: about 100 MiB at the 1 KiB each is counted at (see
/// [`crate::registry::caps`]). 500 Spark queries of 64 partitions with
/// three batches open each stay under it.
pub(crate) const DEFAULT_MAX_TICKETS: u64 = 100_000;
/// Visibility timeout used when a queue's own is shorter than this (seconds):
/// a heartbeat cannot keep a message hidden with a shorter one.
pub(crate) const MIN_VISIBILITY_TIMEOUT_SECS: u64 = 2;
/// The longest visibility timeout SQS accepts (12 hours).
pub(crate) const MAX_VISIBILITY_TIMEOUT_SECS: u64 = 43_200;
/// Largest command, ticket or action body (bytes). The largest a legal
/// request needs is a commit rejecting 10,000 ids of 256 bytes: about 2.6 MB.
pub const DEFAULT_MAX_COMMAND_BYTES: u64 = 4 << 20;
/// Smallest `max_command_bytes` accepted: a plan command or a ticket must fit.
pub(crate) const MIN_MAX_COMMAND_BYTES: u64 = 4 << 10;
/// Largest Handshake message (bytes): a token, with room to spare.
pub(crate) const DEFAULT_MAX_HANDSHAKE_BYTES: u64 = 4 << 10;
/// Smallest `max_handshake_bytes` accepted.
pub(crate) const MIN_MAX_HANDSHAKE_BYTES: u64 = 256;
/// Upper limit of `max_handshake_bytes`: anyone may send a Handshake.
pub(crate) const LIMIT_MAX_HANDSHAKE_BYTES: u64 = 1 << 20;
/// Sample messages the embedded demo table starts with.
pub(crate) const DEFAULT_DEMO_MESSAGES: u64 = 20;
/// Open DoGet/DoPut streams per client IP address (a Spark job's executors
/// on one host open one DoGet per partition, up to 64 per batch).
pub(crate) const DEFAULT_MAX_STREAMS_PER_CLIENT: u32 = 256;
/// Largest gRPC message the server decodes (a DoPut record batch, a command).
pub(crate) const DEFAULT_MAX_REQUEST_BYTES: u64 = 64 << 20;
/// Smallest `max_request_bytes` accepted: commands and tickets must fit.
pub(crate) const MIN_MAX_REQUEST_BYTES: u64 = 4 << 10;
/// Upper limit of `max_request_bytes`.
pub(crate) const LIMIT_MAX_REQUEST_BYTES: u64 = 1 << 30;
/// Bytes of request messages begun and not yet whole that the server holds,
/// over all calls: four DoPut batches of the largest size at once.
pub(crate) const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: u64 = 256 << 20;
/// Rows one DoPut call may send.
pub(crate) const DEFAULT_MAX_PUT_ROWS: u64 = 10_000_000;
/// Bytes (bodies and attributes) one DoPut call may send.
pub(crate) const DEFAULT_MAX_PUT_BYTES: u64 = 16 << 30;
/// Bytes of one DoPut schema message, metadata included. A DoPut schema
/// has at most five columns (a few hundred bytes); pandas' metadata adds a
/// few kilobytes.
pub(crate) const DEFAULT_MAX_PUT_SCHEMA_BYTES: u64 = 1 << 20;
/// Smallest `max_put_schema_bytes` accepted: the five columns DoPut reads.
pub(crate) const MIN_MAX_PUT_SCHEMA_BYTES: u64 = 4 << 10;
/// Bytes of schemas and dictionaries all DoPut streams together keep
/// decoded between batches: 256 streams at the largest schema.
pub(crate) const DEFAULT_MAX_PUT_HELD_BYTES: u64 = 256 << 20;
/// Seconds a DoPut stream may go without sending a message (a client
/// writing a batch sends it as soon as it is made).
pub(crate) const DEFAULT_PUT_IDLE_TIMEOUT_SECS: u64 = 60;
/// Attempts per SQS call (throttling, 5xx and connection errors are retried).
pub const DEFAULT_SQS_MAX_ATTEMPTS: u32 = 5;
/// DeleteMessageBatch and ChangeMessageVisibilityBatch calls one commit,
/// release or heartbeat keeps in flight. At SQS's ~20 ms round trip a
/// commit of 100,000 messages (10,000 calls) takes about 20 ms x 10,000 /
/// this: 1.6 s at 128, 25 s at the 8 used before. Why 128: "Choosing the
/// defaults" in benches/results/2026-12-01-round5-ddbdb76.md (figure 3,
/// read and commit through a 20 ms proxy at 32, 64 and 128).
pub const DEFAULT_SQS_BATCH_CONCURRENCY: u32 = 128;
/// Upper limit of `sqs_batch_concurrency`.
pub(crate) const LIMIT_SQS_BATCH_CONCURRENCY: u32 = 512;
/// Upper limit of `sqs_max_attempts`.
pub(crate) const LIMIT_SQS_MAX_ATTEMPTS: u32 = 20;
/// SQS calls (and so HTTP connections) in flight to one SQS endpoint, all
/// tables, receives and batch calls together. A Spark micro-batch of the
/// default 2 partitions, each received ahead once, opens up to 4 x 128
/// receives at 50 ms plus a commit's 128 batch calls; rustack answers 503
/// past 256 connections, and the HTTP client may hold a few more
/// connections than calls for a moment, so this stays below with room to
/// spare. At 192 calls a 50 ms round trip still carries 38,400 messages a
/// second (received or deleted).
pub(crate) const DEFAULT_SQS_MAX_CONNECTIONS: u32 = 192;
/// Upper limit of `sqs_max_connections`.
pub(crate) const LIMIT_SQS_MAX_CONNECTIONS: u32 = 4096;
/// Table name of the embedded demo backend.
pub(crate) const DEMO_TABLE: &str = "demo";
/// Seconds open streams may take to finish after SIGTERM/SIGINT.
pub(crate) const DEFAULT_SHUTDOWN_GRACE_SECS: u64 = 10;
/// Connections open at once on the Flight port, all clients together
/// (lowered to 3/4 of the file-descriptor limit when that is smaller).
pub(crate) const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;
/// Connections open at once per client IP address: a Spark host opens one
/// DoGet per partition (up to 64 per batch), over one connection or several.
pub(crate) const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: u32 = 512;
/// Seconds a new connection has to send its first bytes (a gRPC client
/// sends its HTTP/2 preface, or its TLS ClientHello, at once).
pub(crate) const DEFAULT_PREFACE_TIMEOUT_SECS: u64 = 10;
/// Calls (HTTP/2 streams) open at once on one connection: its HTTP/2
/// SETTINGS_MAX_CONCURRENT_STREAMS. Above `max_streams_per_client`'s
/// default, so that a client multiplexing all its DoGets on one connection
/// meets that limit first.
pub const DEFAULT_MAX_CALLS_PER_CONNECTION: u32 = 512;
/// Calls open at once per client address, any RPC: four times
/// `max_streams_per_client`'s default, room for a Spark host's DoGets and
/// the unary calls beside them. A call costs the server about 10 KiB
/// while it waits (measured on a debug build), so about 10 MiB per client.
pub(crate) const DEFAULT_MAX_CALLS_PER_CLIENT: u32 = 1024;
/// Calls open at once on the Flight port, all clients together: about
/// 160 MiB at 10 KiB each.
pub(crate) const DEFAULT_MAX_CALLS: u32 = 16_384;
/// Seconds a call has to send its one request message to the end (a
/// command of `max_command_bytes`, 4 MiB, takes 32 s at 1 Mbit/s).
pub(crate) const DEFAULT_REQUEST_BODY_TIMEOUT_SECS: u64 = 30;
/// Connections open at once on the `--metrics-listen` port, all clients
/// together (lowered to 1/16 of the file-descriptor limit when that is
/// smaller: see [`crate::fd_reserve`]). A Prometheus server keeps one.
pub(crate) const DEFAULT_METRICS_MAX_CONNECTIONS: u32 = 256;
/// Connections open at once on the `--metrics-listen` port per client IP
/// address.
pub(crate) const DEFAULT_METRICS_MAX_CONNECTIONS_PER_CLIENT: u32 = 64;
/// Seconds a request on the `--metrics-listen` port has to send its whole
/// header, and an idle keep-alive connection to start its next request.
pub(crate) const DEFAULT_METRICS_HEADER_TIMEOUT_SECS: u64 = 10;

/// The help heading of the settings that belong to no group (the flattened
/// groups' headings would run on into the flags after them).
const SERVER: &str = "Server";

/// `sqs-flight-server`: Amazon SQS queues as Arrow Flight tables.
///
/// With no `--table` and no `--config`, the server serves an embedded
/// in-memory demo table named `demo` filled with sample messages.
#[derive(Debug, Parser)]
#[command(name = "sqs-flight-server", version, about, long_about, mut_args = docs::with_default)]
pub struct Cli {
    #[command(flatten)]
    pub settings: Settings,
    /// A table; repeat the flag (comma-separated in the variable). If `--table`
    /// is given, `SQSF_TABLE` is ignored; tables of the TOML file and of
    /// `--table` are merged, and a name defined in both is an error.
    ///
    /// After the URL, `;KEY=VALUE` sets `region`, `role_arn`,
    /// `role_external_id` or `role_session_name` as `[tables.NAME]` does
    /// (`orders=URL;role_arn=arn:aws:iam::123456789012:role/reader`; quote it
    /// in a shell; no `,` in a value).
    #[arg(
        long = "table",
        env = "SQSF_TABLE",
        help_heading = SERVER,
        value_delimiter = ',',
        value_name = "NAME=QUEUE_URL[;KEY=VALUE]..."
    )]
    pub tables: Vec<String>,
    /// The TOML file: the settings below by their TOML keys, plus
    /// `[tables.NAME]`.
    #[arg(long, env = "SQSF_CONFIG", value_name = "FILE", help_heading = SERVER)]
    pub config: Option<PathBuf>,
    /// Format of the log on stderr. Set the level with `RUST_LOG` (default
    /// `info`).
    #[arg(
        long,
        env = "SQSF_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        help_heading = SERVER
    )]
    pub log_format: LogFormat,
    /// Sample messages in the `demo` table. Only used when no table is
    /// configured.
    #[arg(
        long,
        env = "SQSF_DEMO_MESSAGES",
        value_name = "N",
        default_value_t = DEFAULT_DEMO_MESSAGES,
        help_heading = SERVER
    )]
    pub demo_messages: u64,
    /// Once listening, write {url, pid, instance_id, started_at, listen} as
    /// JSON to this file (atomically, mode 0600); removed at a clean exit.
    #[arg(long, env = "SQSF_READY_FILE", value_name = "FILE", help_heading = SERVER)]
    pub ready_file: Option<PathBuf>,
    /// Serve TLS with a self-signed certificate kept in this directory, made
    /// anew (new key) when it no longer covers the advertised host or has 30
    /// days left
    /// ([operations.md](operations.md#where-the-server-runs-and-what-it-advertises)).
    /// Checked as `--state-dir` is. Not with `--tls-cert`.
    #[arg(long, env = "SQSF_TLS_SELF_SIGNED", value_name = "DIR", help_heading = SERVER)]
    pub tls_self_signed: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit (see
    /// [below](#checking-a-configuration---print-config)).
    #[arg(long, help_heading = SERVER)]
    pub print_config: bool,
}

settings! {
    /// The settings of the flags, the `SQSF_*` variables and the TOML
    /// file, in one struct: the command line fills it, the `--config`
    /// file fills another, and each value is the command line's, else
    /// the file's, else the default. Each field is unset (`None`) where
    /// not given.
    #[command(next_help_heading = SERVER)]
    pub struct Settings;
    /// The validated configuration the server runs with.
    #[derive(Debug, Clone)]
    pub struct Config;
    names "";

    /// Flight (gRPC) address: an IP address and port (`0.0.0.0:50051`,
    /// `[::]:50051`), not a host name; port `0` picks a free port.
    ///
    /// The server prints `sqs-flight-server listening on grpc://...` on stdout,
    /// with the advertised location.
    listen: SocketAddr = DEFAULT_LISTEN, "SQSF_LISTEN", value_name = "ADDR";
    /// The location put in every endpoint, where clients (Spark executors) open
    /// DoGet: it must be reachable from them.
    ///
    /// Unset with `listen` on `0.0.0.0` or `[::]`, endpoints say `127.0.0.1`
    /// and the server warns
    /// ([operations.md](operations.md#where-the-server-runs-and-what-it-advertises)).
    advertise: Option<String> = None => "`grpc://<bound address>`", "SQSF_ADVERTISE",
        value_name = "URI";
    /// Every Flight RPC must then carry `authorization: Bearer TOKEN`; an empty
    /// string means no token.
    ///
    /// Not checked by the gRPC health service and the HTTP port. A `--config`
    /// file holding it must be readable by its owner only (`chmod 600`).
    auth_token: Option<String> = None => "none (every caller is let in; logged as a warning)",
        "SQSF_AUTH_TOKEN", value_name = "TOKEN", hide_env_values = true;
    /// The token, read from this file at start (without its trailing line
    /// break).
    ///
    /// It must belong to the server's user and be readable by it only
    /// (`chmod 600`; root's may be group-readable); one that is not, or is
    /// unreadable, empty, of several lines, or given with `auth_token`, is
    /// refused at start.
    auth_token_file: Option<PathBuf> = None, "SQSF_AUTH_TOKEN_FILE", value_name = "FILE";
    /// After SIGTERM or SIGINT, how long open calls may take to finish before
    /// they are cut; `0` cuts them at once
    /// ([operations.md](operations.md#stopping)).
    shutdown_grace: Duration = Duration::from_secs(DEFAULT_SHUTDOWN_GRACE_SECS),
        "SQSF_SHUTDOWN_GRACE", value_name = "SECONDS";
    /// HTTP address for `/metrics`, `/healthz` and `/readyz`.
    metrics_listen: Option<SocketAddr> = None => "off", "SQSF_METRICS_LISTEN",
        value_name = "ADDR";
    /// Connections open at once on the `metrics_listen` port, all clients, at
    /// least 1, at most 1/16 of the file-descriptor limit; over it, the one idle
    /// longest is closed.
    metrics_max_connections: u32 = DEFAULT_METRICS_MAX_CONNECTIONS, min 1,
        "SQSF_METRICS_MAX_CONNECTIONS", value_name = "N", help_heading = "Metrics port";
    /// The same per client IP address (IPv6: per /64), at least 1.
    metrics_max_connections_per_client: u32 = DEFAULT_METRICS_MAX_CONNECTIONS_PER_CLIENT, min 1,
        "SQSF_METRICS_MAX_CONNECTIONS_PER_CLIENT", value_name = "N",
        help_heading = "Metrics port";
    /// Time a request on the `metrics_listen` port has to send its whole
    /// header, at least 1; then its connection is closed.
    metrics_header_timeout: Duration = Duration::from_secs(DEFAULT_METRICS_HEADER_TIMEOUT_SECS),
        min 1, "SQSF_METRICS_HEADER_TIMEOUT", value_name = "SECONDS",
        help_heading = "Metrics port";
    /// Exit (status 0) after this long without an authenticated Flight RPC,
    /// with no stream open and no consumer holding open batches or deletes to
    /// retry; at least 1.
    ///
    /// For servers started on demand (the Spark source's managed mode). What
    /// counts: [protocol.md](protocol.md#connecting).
    idle_exit: Option<Duration> = None => "off",
        min 1 " second (leave it out to never exit when idle)", "SQSF_IDLE_EXIT",
        value_name = "SECONDS";
    /// Another SQS-compatible service (LocalStack, moto, rustack, ElasticMQ).
    sqs_endpoint: Option<String> = None => "the AWS endpoint of the region",
        "SQSF_SQS_ENDPOINT", value_name = "URL";
    /// An S3-compatible service for the objects of large payloads (moto serves
    /// S3 and SQS on one port), reached path-style with the same AWS chain as
    /// SQS.
    s3_endpoint: Option<String> = None => "`AWS_ENDPOINT_URL_S3` if set, else the AWS endpoint of the table's region",
        "SQSF_S3_ENDPOINT", value_name = "URL";
    /// Attempts per SQS call, 1 to 20; throttling, 5xx answers and connection
    /// errors are retried with capped, jittered backoff
    /// ([operations.md](operations.md#sqs-errors-and-retries)).
    sqs_max_attempts: u32 = DEFAULT_SQS_MAX_ATTEMPTS, min 1 max LIMIT_SQS_MAX_ATTEMPTS,
        "SQSF_SQS_MAX_ATTEMPTS", value_name = "N";
    /// DeleteMessageBatch and ChangeMessageVisibilityBatch calls one commit,
    /// release, hand-back or heartbeat keeps in flight, 1 to 512.
    sqs_batch_concurrency: u32 = DEFAULT_SQS_BATCH_CONCURRENCY,
        min 1 max LIMIT_SQS_BATCH_CONCURRENCY, "SQSF_SQS_BATCH_CONCURRENCY",
        value_name = "N";
    /// SQS calls (and so HTTP connections) in flight to one SQS endpoint, all
    /// tables, 1 to 4096; a call past it waits. Below it, a congestion window
    /// narrows while the endpoint pushes back
    /// ([operations.md](operations.md#sqs-errors-and-retries)).
    sqs_max_connections: u32 = DEFAULT_SQS_MAX_CONNECTIONS,
        min 1 max LIMIT_SQS_MAX_CONNECTIONS, "SQSF_SQS_MAX_CONNECTIONS",
        value_name = "N";
    /// How long a consumer's uncommitted messages stay invisible after its last
    /// call, at least 1; then the server releases them, as `release` would.
    consumer_lease: Duration = Duration::from_secs(DEFAULT_CONSUMER_LEASE_SECS),
        min 1 " second", "SQSF_CONSUMER_LEASE", value_name = "SECONDS";
    /// Bytes of uncommitted messages held for replay, all tables, plus 1 KiB
    /// for each ticket of an open batch and each consumer. Past it, plans and
    /// reads get `RESOURCE_EXHAUSTED`.
    registry_max_bytes: u64 = DEFAULT_REGISTRY_MAX_BYTES, "SQSF_REGISTRY_MAX_BYTES",
        value_name = "N", help_heading = "Registry budget";
    /// Uncommitted messages held for replay, all tables. Past it, reads get
    /// `RESOURCE_EXHAUSTED`.
    registry_max_messages: u64 = DEFAULT_REGISTRY_MAX_MESSAGES, "SQSF_REGISTRY_MAX_MESSAGES",
        value_name = "N", help_heading = "Registry budget";
    /// How long the ids of deleted messages are remembered: a copy SQS delivers
    /// again within it is deleted, not made a row ([protocol rule
    /// 6](protocol.md#6-one-row-per-message-id)). 0 (off) to 1209600 (SQS's
    /// longest retention).
    dedup_window: Duration = Duration::from_secs(DEFAULT_DEDUP_WINDOW_SECS),
        min 0 max LIMIT_DEDUP_WINDOW_SECS " seconds", "SQSF_DEDUP_WINDOW",
        value_name = "SECONDS", help_heading = "Registry budget";
    /// Most message ids one table's window holds (the oldest go first), about
    /// 60 bytes each. 0 (off) to 100000000.
    dedup_window_ids: u64 = DEFAULT_DEDUP_WINDOW_IDS, min 0 max LIMIT_DEDUP_WINDOW_IDS,
        "SQSF_DEDUP_WINDOW_IDS", value_name = "N", help_heading = "Registry budget";
    /// Consumers held at once, all tables, at least 1; a plan of one more gets
    /// `RESOURCE_EXHAUSTED`.
    ///
    /// A consumer counts from its first plan. A release or lease expiry forgets
    /// one that never committed; one that committed gives its place once it
    /// holds nothing and has been silent for `consumer_lease`.
    max_consumers: u64 = DEFAULT_MAX_CONSUMERS, min 1, "SQSF_MAX_CONSUMERS",
        value_name = "N", help_heading = "Registry budget";
    /// Planned, uncommitted batches one consumer may hold, at least 1; planning
    /// one more gets `RESOURCE_EXHAUSTED`.
    max_open_batches_per_consumer: u64 = DEFAULT_MAX_OPEN_BATCHES_PER_CONSUMER, min 1,
        "SQSF_MAX_OPEN_BATCHES_PER_CONSUMER", value_name = "N", help_heading = "Registry budget";
    /// Tickets (a partition of an open batch) held at once, all consumers, at
    /// least 1; a plan past it gets `RESOURCE_EXHAUSTED`.
    max_tickets: u64 = DEFAULT_MAX_TICKETS, min 1, "SQSF_MAX_TICKETS",
        value_name = "N", help_heading = "Registry budget";
    /// DoGet and DoPut streams open at once per client IP address, at least 1;
    /// one more gets `RESOURCE_EXHAUSTED`. Keep it well above `partitions`: a
    /// Spark host opens one DoGet per partition.
    max_streams_per_client: u32 = DEFAULT_MAX_STREAMS_PER_CLIENT, min 1,
        "SQSF_MAX_STREAMS_PER_CLIENT",
        value_name = "N", help_heading = "Per-client limits";
    /// Largest gRPC message decoded (a command, a ticket, a DoPut batch), 4096
    /// to 1073741824 bytes. Above it DoPut gets `RESOURCE_EXHAUSTED` (the
    /// batches before are sent), other RPCs gRPC's `OUT_OF_RANGE`.
    max_request_bytes: u64 = DEFAULT_MAX_REQUEST_BYTES,
        min MIN_MAX_REQUEST_BYTES max LIMIT_MAX_REQUEST_BYTES, "SQSF_MAX_REQUEST_BYTES",
        value_name = "N", help_heading = "Per-client limits";
    /// Bytes of request messages begun and not yet whole, all calls, at least
    /// `max_request_bytes`; a message that would pass it gets
    /// `RESOURCE_EXHAUSTED`.
    max_buffered_request_bytes: u64 = DEFAULT_MAX_BUFFERED_REQUEST_BYTES,
        "SQSF_MAX_BUFFERED_REQUEST_BYTES", value_name = "N", help_heading = "Per-client limits";
    /// Rows one DoPut call may send, at least 1; the batch that would pass it
    /// is refused whole (`RESOURCE_EXHAUSTED`, naming the rows sent before).
    max_put_rows: u64 = DEFAULT_MAX_PUT_ROWS, min 1, "SQSF_MAX_PUT_ROWS",
        value_name = "N", help_heading = "Per-client limits";
    /// Bytes one DoPut call may send, as SQS counts them (body and attributes),
    /// at least 1; refused like `max_put_rows`.
    max_put_bytes: u64 = DEFAULT_MAX_PUT_BYTES, min 1, "SQSF_MAX_PUT_BYTES",
        value_name = "N", help_heading = "Per-client limits";
    /// Largest DoPut schema message, 4096 to 1073741824 bytes; a larger one
    /// gets `RESOURCE_EXHAUSTED` before it is decoded. DoPut reads at most five
    /// columns and no metadata.
    max_put_schema_bytes: u64 = DEFAULT_MAX_PUT_SCHEMA_BYTES,
        min MIN_MAX_PUT_SCHEMA_BYTES max LIMIT_MAX_REQUEST_BYTES, "SQSF_MAX_PUT_SCHEMA_BYTES",
        value_name = "N", help_heading = "Per-client limits";
    /// Bytes all DoPut streams keep decoded between batches (schemas,
    /// dictionaries), at least `max_put_schema_bytes`; past it,
    /// `RESOURCE_EXHAUSTED` (send again later).
    max_put_held_bytes: u64 = DEFAULT_MAX_PUT_HELD_BYTES, "SQSF_MAX_PUT_HELD_BYTES",
        value_name = "N", help_heading = "Per-client limits";
    /// Time a DoPut stream may send nothing, or read no PutResult (sending its
    /// batches does not count), at least 1; then it ends with
    /// `DEADLINE_EXCEEDED`.
    put_idle_timeout: Duration = Duration::from_secs(DEFAULT_PUT_IDLE_TIMEOUT_SECS), min 1,
        "SQSF_PUT_IDLE_TIMEOUT", value_name = "SECONDS", help_heading = "Per-client limits";
    /// Largest command, ticket or action body (GetFlightInfo, GetSchema, DoGet,
    /// DoAction), 4096 to 1073741824 bytes (`max_request_bytes` applies above
    /// it); a larger one gets `RESOURCE_EXHAUSTED` before it is buffered.
    max_command_bytes: u64 = DEFAULT_MAX_COMMAND_BYTES,
        min MIN_MAX_COMMAND_BYTES max LIMIT_MAX_REQUEST_BYTES, "SQSF_MAX_COMMAND_BYTES",
        value_name = "N", help_heading = "Per-client limits";
    /// Largest Handshake call, 256 to 1048576 bytes; one that sends more gets
    /// `RESOURCE_EXHAUSTED` at once.
    max_handshake_bytes: u64 = DEFAULT_MAX_HANDSHAKE_BYTES,
        min MIN_MAX_HANDSHAKE_BYTES max LIMIT_MAX_HANDSHAKE_BYTES, "SQSF_MAX_HANDSHAKE_BYTES",
        value_name = "N", help_heading = "Per-client limits";
    /// Connections open at once on the Flight port, all clients, at least 1, at
    /// most 3/4 of the file-descriptor limit. Over it an open one gives way:
    /// one with no call open first, then one that made no call with the token,
    /// then the one idle longest.
    max_connections: u32 = DEFAULT_MAX_CONNECTIONS, min 1, "SQSF_MAX_CONNECTIONS",
        value_name = "N", help_heading = "Connections";
    /// The same per client IP address (IPv6: per /64), at least 1. Keep it
    /// well above a Spark host's DoGets (one per partition).
    max_connections_per_client: u32 = DEFAULT_MAX_CONNECTIONS_PER_CLIENT, min 1,
        "SQSF_MAX_CONNECTIONS_PER_CLIENT", value_name = "N", help_heading = "Connections";
    /// Time a new connection has to send its first bytes (the HTTP/2 preface,
    /// or its TLS ClientHello), at least 1; then it is closed.
    preface_timeout: Duration = Duration::from_secs(DEFAULT_PREFACE_TIMEOUT_SECS), min 1,
        "SQSF_PREFACE_TIMEOUT", value_name = "SECONDS", help_heading = "Connections";
    /// Calls open at once on one connection, any RPC (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS; 16, or this when lower, on a client's
    /// connections past its first 4), at least 1. A stream opened past it is
    /// reset (REFUSED_STREAM).
    max_calls_per_connection: u32 = DEFAULT_MAX_CALLS_PER_CONNECTION, min 1,
        "SQSF_MAX_CALLS_PER_CONNECTION", value_name = "N", help_heading = "Connections";
    /// Calls of any RPC open at once per client IP address (IPv6: per /64), all
    /// its connections, at least 1; one more gets `RESOURCE_EXHAUSTED`, unless
    /// its connection has fewer than 8 calls open. Keep it well above
    /// `max_streams_per_client`.
    max_calls_per_client: u32 = DEFAULT_MAX_CALLS_PER_CLIENT, min 1,
        "SQSF_MAX_CALLS_PER_CLIENT", value_name = "N", help_heading = "Connections";
    /// Calls open at once on the Flight port, all clients, at least 1; one more
    /// gets `RESOURCE_EXHAUSTED`.
    max_calls: u32 = DEFAULT_MAX_CALLS, min 1, "SQSF_MAX_CALLS", value_name = "N",
        help_heading = "Connections";
    /// Time a call has to send its request message, from its headers (every RPC
    /// but Handshake, DoPut and DoExchange), at least 1; then it ends with
    /// `DEADLINE_EXCEEDED`.
    request_body_timeout: Duration = Duration::from_secs(DEFAULT_REQUEST_BODY_TIMEOUT_SECS),
        min 1, "SQSF_REQUEST_BODY_TIMEOUT", value_name = "SECONDS", help_heading = "Connections";
    /// The durable registry, `DIR/registry.redb` (owner-only): a server
    /// restarted on it, after `kill -9` too, replays and commits the same
    /// tickets.
    ///
    /// One server process per directory; DIR and the directories above it must
    /// not be writable by other users
    /// ([operations.md](operations.md#file-permissions)).
    state_dir: Option<PathBuf> = None
        => "none: the registry is in memory only (logged as a warning)",
        "SQSF_STATE_DIR", value_name = "DIR";
    /// The registry's state in object storage, `s3://BUCKET/PREFIX` (S3 at
    /// `s3_endpoint` if set) or a directory (`file:///PATH`, an absolute
    /// path: a mounted volume, NFS), so that a server on another host can
    /// take it over ([operations.md](operations.md#state-in-object-storage)).
    ///
    /// A server started on it reads it, becomes its only writer, and
    /// replays and commits the batches the previous server left open; the
    /// previous server, if still running, is fenced (`fenced`). Works alone
    /// or with `state_dir`, which then holds the local copy.
    state_url: Option<String> = None => "none: the state is on this host only",
        "SQSF_STATE_URL", value_name = "URL";
    /// An IAM role (`arn:aws:iam::ACCOUNT:role/NAME`) the state log's S3
    /// calls are made as, when the bucket of an `s3://` `state_url` is in
    /// another account: credentials from STS AssumeRole, called with the
    /// server's own AWS chain and renewed before they expire
    /// ([cross-account queues](#queues-of-another-account-role_arn)).
    state_url_role_arn: Option<String> = None => "none: the server's own AWS chain",
        "SQSF_STATE_URL_ROLE_ARN", value_name = "ARN";
    /// The external id `state_url_role_arn`'s trust policy asks for; needs
    /// `state_url_role_arn`. Never logged.
    state_url_role_external_id: Option<String> = None => "none",
        "SQSF_STATE_URL_ROLE_EXTERNAL_ID", value_name = "ID";
    /// The name of `state_url_role_arn`'s sessions, as the bucket's account
    /// sees it in CloudTrail; needs `state_url_role_arn`.
    state_url_role_session_name: Option<String> = None => "`sqs-flight-state`",
        "SQSF_STATE_URL_ROLE_SESSION_NAME", value_name = "NAME";
    /// A commit answers once it is decided and runs its DeleteMessageBatch
    /// calls after, answering `"deletes": "behind"`
    /// ([protocol.md](protocol.md#commit)).
    ///
    /// Without `state_dir`, a crash after the answer loses those deletes: the
    /// messages are read again. `--deletes-behind` alone means `true`.
    deletes_behind: bool = false, "SQSF_DELETES_BEHIND", num_args = 0..=1,
        default_missing_value = "true";

    @only_in_settings {
        /// PEM certificate, or chain (leaf first), of the Flight port (TLS 1.2
        /// and 1.3); needs `--tls-key`. Unset: plaintext (logged as a warning).
        ///
        /// Endpoints then say `grpc+tls://` (set `--advertise` to a name the
        /// certificate carries). A bad file, or a key that does not match,
        /// stops the server at start.
        #[arg(long, env = "SQSF_TLS_CERT", value_name = "FILE")]
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tls_cert: Option<PathBuf>,
        /// PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC) of `--tls-cert`.
        /// Needs `--tls-cert`.
        #[arg(long, env = "SQSF_TLS_KEY", value_name = "FILE")]
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tls_key: Option<PathBuf>,
        #[command(flatten)]
        #[serde(default, skip_serializing)]
        pub sql: sql::SqlSettings,
        #[command(flatten)]
        #[serde(default, skip_serializing)]
        pub limits: LimitSettings,
        /// `[tables.NAME]` (the file only).
        #[arg(skip)]
        #[serde(default, skip_serializing)]
        pub tables: BTreeMap<String, TableToml>,
    }
    @only_in_config {
        /// Serve Flight over TLS; `None`: plaintext.
        pub tls: Option<TlsFiles> = None,
        pub limits: PlanParams = PlanParams::LIMITS,
        /// Flight SQL: its threads, memory cap and time limit.
        pub sql: sql::SqlConfig = sql::SqlConfig::default(),
        pub tables: Vec<TableConfig> = Vec::new(),
        /// Files of the process's start: where it says it listens, its made certificate.
        pub startup: Startup = Startup::default(),
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Command-line-only settings of the process's start (not in the TOML file:
/// they belong to whoever starts this process, not to what it serves).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Startup {
    /// `--ready-file`: written once the server listens; `None`: none.
    pub ready_file: Option<PathBuf>,
    /// `--tls-self-signed`: the directory of a made certificate; `None`: none.
    pub tls_self_signed: Option<PathBuf>,
}

/// The PEM files of the server's TLS identity (read when the server starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A configuration mistake, naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Toml { path: PathBuf, message: String },
    #[error("--table {0:?}: expected NAME=QUEUE_URL[;KEY=VALUE]...")]
    TableSyntax(String),
    #[error("table {0:?} is defined twice")]
    DuplicateTable(String),
    #[error("table name {0:?}: use 1-256 characters of A-Z a-z 0-9 _ - .")]
    TableName(String),
    #[error("table {table:?}: payload: {problem}")]
    Payload { table: String, problem: String },
    #[error("{setting}: {problem}")]
    Setting { setting: String, problem: String },
    #[error("{setting} = {value}: {problem}")]
    Value {
        setting: String,
        value: u64,
        problem: String,
    },
}

impl Config {
    /// A configuration with built-in defaults and the given tables.
    pub fn new(listen: SocketAddr, tables: Vec<TableConfig>) -> Self {
        Self {
            listen,
            tables,
            ..Self::defaults()
        }
    }

    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&TableConfig> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Checks each setting's bounds and every table's defaults against the limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_bounds()?;
        if self.max_buffered_request_bytes < self.max_request_bytes {
            return Err(value_error(
                "max_buffered_request_bytes".into(),
                self.max_buffered_request_bytes,
                &format!(
                    "must be at least max_request_bytes ({}), or no message of that size could be received",
                    self.max_request_bytes
                ),
            ));
        }
        if self.max_put_held_bytes < self.max_put_schema_bytes {
            return Err(value_error(
                "max_put_held_bytes".into(),
                self.max_put_held_bytes,
                &format!(
                    "must be at least max_put_schema_bytes ({}), or a DoPut with a schema of that size could never start",
                    self.max_put_schema_bytes
                ),
            ));
        }
        self.limits.check_as_limits()?;
        self.state_url_role()?;
        let mut seen = std::collections::HashSet::new();
        for t in &self.tables {
            if !valid_table_name(&t.name) {
                return Err(ConfigError::TableName(t.name.clone()));
            }
            if !seen.insert(&t.name) {
                return Err(ConfigError::DuplicateTable(t.name.clone()));
            }
            t.check(self.limits)?;
        }
        Ok(())
    }
}

impl Config {
    /// The role of the state log's S3 calls (`state_url_role_*`), checked
    /// as a table's role is; it needs an `s3://` `state_url`.
    pub(crate) fn state_url_role(&self) -> Result<Option<RoleConfig>, ConfigError> {
        let Some(arn) = &self.state_url_role_arn else {
            for (key, set) in [
                (
                    "state_url_role_external_id",
                    &self.state_url_role_external_id,
                ),
                (
                    "state_url_role_session_name",
                    &self.state_url_role_session_name,
                ),
            ] {
                if set.is_some() {
                    return Err(setting_error(key, "needs state_url_role_arn"));
                }
            }
            return Ok(None);
        };
        if !self
            .state_url
            .as_deref()
            .is_some_and(|u| u.starts_with("s3://"))
        {
            return Err(setting_error(
                "state_url_role_arn",
                "applies to the S3 calls of an s3:// state_url; set state_url to one, or leave it out",
            ));
        }
        let role = RoleConfig {
            arn: arn.clone(),
            external_id: self.state_url_role_external_id.clone(),
            session_name: self.state_url_role_session_name.clone(),
        };
        role.check()
            .map_err(|(key, problem)| setting_error(&format!("state_url_{key}"), &problem))?;
        Ok(Some(role))
    }
}

fn value_error(setting: String, value: u64, problem: &str) -> ConfigError {
    ConfigError::Value {
        setting,
        value,
        problem: problem.to_string(),
    }
}

fn setting_error(setting: &str, problem: &str) -> ConfigError {
    ConfigError::Setting {
        setting: setting.to_string(),
        problem: problem.to_string(),
    }
}

/// The token of `--auth-token-file`: the file's text without its trailing
/// line break; an empty or unreadable file, or one that another user owns
/// or can read (see [`crate::secure_path`]), is an error naming it.
fn read_token_file(path: &Path) -> Result<String, ConfigError> {
    let problem = |p: String| setting_error("auth_token_file", &p);
    let text = crate::secure_path::read_secret(path).map_err(|e| match e {
        PathError::Io { source, .. } => {
            problem(format!("cannot read {}: {source}", path.display()))
        }
        unsafe_file => problem(unsafe_file.to_string()),
    })?;
    let token = text.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        return Err(problem(format!("{} is empty", path.display())));
    }
    if token.contains(['\n', '\r']) {
        return Err(problem(format!(
            "{} holds more than one line; put only the token in it",
            path.display()
        )));
    }
    Ok(token.to_string())
}

/// The settings of the `--config` file; one that holds `auth_token` is a
/// secret file, checked as `--auth-token-file` is.
fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let (text, meta) =
        crate::secure_path::read_checked(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    let settings: Settings = toml::from_str(&text).map_err(|e| ConfigError::Toml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if settings.auth_token.as_ref().is_some_and(|t| !t.is_empty()) {
        crate::secure_path::check_secret(path, &meta).map_err(|e| ConfigError::Toml {
            path: path.to_path_buf(),
            message: format!("it holds auth_token: {e}"),
        })?;
    }
    Ok(settings)
}

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    /// Each setting from its flag or variable, else the `--config` file,
    /// else its default; then checked.
    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        let mut given = cli.settings;
        let mut file = match &cli.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        let mut config = Config::defaults();
        given.apply(&mut file, &mut config)?;
        config.tables = tables(std::mem::take(&mut file.tables), &cli.tables)?;
        if config.tables.is_empty() {
            let demo = TableConfig::memory(DEMO_TABLE, cli.demo_messages);
            config.tables.push(demo);
        }
        config.auth_token = auth_token(config.auth_token.take(), &config.auth_token_file)?;
        config.tls = tls_files(
            given.tls_cert.or(file.tls_cert),
            given.tls_key.or(file.tls_key),
        )?;
        config.limits = given.limits.or(file.limits).limits();
        config.sql = sql::SqlConfig::resolve(given.sql.or(file.sql))?;
        config.startup = Startup {
            ready_file: cli.ready_file,
            tls_self_signed: cli.tls_self_signed,
        };
        if config.tls.is_some() && config.startup.tls_self_signed.is_some() {
            return Err(setting_error(
                "tls_self_signed",
                "--tls-self-signed makes a certificate; --tls-cert brings one: give one of them",
            ));
        }
        config.validate()?;
        Ok(config)
    }
}

/// `--auth-token` or the token of `--auth-token-file`, not both; an empty
/// token is none.
fn auth_token(
    token: Option<String>,
    file: &Option<PathBuf>,
) -> Result<Option<String>, ConfigError> {
    match (token, file) {
        (Some(_), Some(_)) => Err(setting_error(
            "auth_token",
            "give --auth-token or --auth-token-file, not both",
        )),
        (token, None) => Ok(token.filter(|t| !t.is_empty())),
        (None, Some(path)) => read_token_file(path).map(Some),
    }
}

/// `--tls-cert` and `--tls-key`: both or neither.
fn tls_files(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<TlsFiles>, ConfigError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(setting_error(
            "tls_key",
            "--tls-cert needs --tls-key (the certificate's PEM private key)",
        )),
        (None, Some(_)) => Err(setting_error(
            "tls_cert",
            "--tls-key needs --tls-cert (the PEM certificate)",
        )),
    }
}
