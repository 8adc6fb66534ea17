//! The harness of the integration tests and the benchmarks.
//!
//! # Layout
//!
//! - [`moto`], [`rustack`]: SQS emulators started once per process, on
//!   free loopback ports, killed with it ([`process`]).
//! - [`sqs`]: aws-sdk-sqs helpers for any of them: client, fresh queues,
//!   sends, receives, deletes, counts.
//! - [`latency`]: a TCP proxy that adds SQS's round trip in front of an
//!   emulator; [`faults`]: an HTTP proxy that makes calls fail.
//! - [`server`]: the sqs-flight server in-process; [`server_process`]: the
//!   server binary as a child process.

pub mod faults;
pub mod latency;
pub mod moto;
pub mod process;
pub mod rustack;
pub mod server;
pub mod server_process;
pub mod sqs;
