//! Integration tests: the sqs-flight server against moto, through Flight.
//!
//! Each test makes its own queue on the process's moto server and starts
//! its own sqs-flight server on a free loopback port.

mod back_pressure;
mod backlog;
mod bad_input;
mod call_caps;
mod cli;
mod cli_infer;
mod cli_send;
mod client;
mod client_limits;
mod client_payload;
mod client_send;
mod commit;
mod connections;
mod credentials_and_auth_token;
mod dedup;
mod deletes_behind;
mod discovery_and_columns;
mod faults;
mod fifo;
mod file_perms;
mod flight_sql;
mod flight_sql_catalog;
mod flight_sql_limits;
mod flight_sql_relay;
mod flight_sql_runaway_queries;
mod fuzz;
mod hangup;
mod hostile_requests;
mod idle_exit;
mod large_payloads;
mod metrics_port;
mod observability;
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
mod roles;
mod secrets;
mod state_url;
mod tls;
mod visibility;
mod write;
