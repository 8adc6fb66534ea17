//! The harness of the integration tests and the benchmarks.
//!
//! # Layout
//!
//! - [`moto`], [`rustack`]: SQS emulators started once per process, on
//!   free loopback ports, killed with it ([`process`]).
//! - [`sqs`]: aws-sdk-sqs helpers for any of them: client, fresh queues,
//!   sends, receives, deletes, counts; [`s3`]: moto's S3, for large payloads.
//! - [`latency`]: a TCP proxy that adds SQS's round trip in front of an
//!   emulator; [`faults`]: an HTTP proxy that makes calls fail.
//! - [`server`]: the sqs-flight server in-process (`TestServer::in_memory`
//!   for a server of one in-memory table); [`server_process`]: the server
//!   binary as a child process; [`cli`]: the `sqs-flight` CLI binary.
//! - [`fixture`]: a moto queue behind an in-process server, and the Flight
//!   calls of the tests; [`rows`]: what they read out of the answers;
//!   [`watch`]: a queue whose receives a test watches; [`memory`]: the
//!   in-memory queue behind an in-process server, for timing tests on
//!   paused time.
//! - [`poll`]: the one way a test waits for a state; [`temp`]: scratch
//!   directories removed at drop; [`proptest_cases`]: the property tests'
//!   case counts; [`http`]: GETs of the operations endpoint;
//!   [`flight_sql`]: the Flight SQL calls; [`h2raw`]: a raw HTTP/2 client
//!   for connection-hostility tests; [`closed`]: raw TCP connections
//!   watched for the server to close them.
//!
//! The integration tests import it all with `use sqs_flight_tests::prelude::*`.

pub mod cli;
pub mod closed;
pub mod faults;
pub mod fixture;
pub mod flight_sql;
pub mod h2raw;
pub mod http;
pub mod latency;
pub mod memory;
pub mod moto;
pub mod poll;
pub mod process;
pub mod proptest_cases;
pub mod rows;
pub mod rustack;
pub mod s3;
pub mod server;
pub mod server_process;
pub mod sqs;
pub mod temp;
pub mod watch;

/// What most integration tests use.
pub mod prelude {
    pub use crate::fixture::*;
    pub use crate::memory::MemoryFixture;
    pub use crate::poll::poll;
    pub use crate::rows::*;
    pub use crate::server::free_addr;
    pub use crate::server_process::{server_process_on_moto, server_process_via};
    pub use crate::temp::{TempDir, tables_toml, temp_dir, temp_file};
    pub use crate::watch::*;
}
