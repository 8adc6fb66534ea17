//! Integration tests: the sqs-flight server against moto, through Flight.
//!
//! Each test makes its own queue on the process's moto server and starts
//! its own sqs-flight server on a free loopback port.

mod back_pressure;
mod backlog;
mod bad_input;
mod bombs;
mod calls;
mod cli;
mod cli_infer;
mod cli_send;
mod client;
mod client_payload;
mod client_send;
mod commit;
mod connections;
mod dedup;
mod deletes_behind;
mod faults;
mod fifo;
mod file_perms;
mod flight_sql;
mod flight_sql_bombs;
mod flight_sql_catalog;
mod flight_sql_limits;
mod flight_sql_relay;
mod fuzz;
mod guards;
mod hangup;
mod idle_exit;
mod large_payloads;
mod limits;
mod metrics_port;
mod ops;
mod over_limit;
mod payload;
mod put_bounds;
mod read_ahead;
mod readyz;
mod reasons;
mod receivers;
mod receives_in_flight;
mod region;
mod registry_limits;
mod reject;
mod replay;
mod request_budget;
mod restart;
mod secrets;
mod surface;
mod tls;
mod visibility;
mod write;
