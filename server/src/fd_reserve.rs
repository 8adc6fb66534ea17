//! How the process's file descriptors are shared, so that what one part
//! of the server opens cannot starve another.
//!
//! Every connection and every SQL worker's pipe takes a descriptor from
//! the same soft `RLIMIT_NOFILE` (raised to the hard limit at start; see
//! [`crate::server::incoming::raise_fd_limit`]). The shares:
//!
//! - **Flight port**: at most 3/4 of the limit (`max_connections` is
//!   lowered to it; see [`crate::server::incoming`]).
//! - **Metrics port** (`--metrics-listen`): at most 1/16
//!   ([`HTTP_SHARE_DEN`]), and `metrics_max_connections` (256 by
//!   default).
//! - **SQL workers**: at most 1/16 ([`SQL_SHARE_DEN`]), at
//!   [`FDS_PER_SQL_WORKER`] each: `sql.max_statements` is lowered to it.
//! - **The rest**, at least 1/8: the listeners, SQS and S3 connections,
//!   the `--state-dir` database, the log.
//!
//! So however the metrics port is flooded or Flight SQL is used, the
//! Flight port's share and the SQS connections' remain.

use crate::server::incoming::fd_limit;

/// The metrics port may use at most 1/this of the file-descriptor limit.
pub const HTTP_SHARE_DEN: u64 = 16;
/// SQL workers may use at most 1/this of the file-descriptor limit.
pub const SQL_SHARE_DEN: u64 = 16;
/// Descriptors a SQL worker holds in the server: the pipes of its stdin
/// and stdout, its process handle, and one more while it starts.
pub const FDS_PER_SQL_WORKER: u64 = 4;

/// Connections the metrics port may hold: `wanted`, lowered to its share
/// of the process's file-descriptor limit (logged when lowered).
pub fn http_connections(wanted: usize) -> usize {
    let used = http_share(wanted, fd_limit());
    if used < wanted {
        tracing::warn!(
            metrics_max_connections = wanted,
            used,
            fd_limit = fd_limit(),
            "metrics_max_connections lowered to 1/16 of the file-descriptor limit"
        );
    }
    used
}

/// SQL statements (worker processes) that may run at once: `wanted`,
/// lowered to the workers' share of the file-descriptor limit (logged
/// when lowered).
pub fn sql_statements(wanted: usize) -> usize {
    let used = sql_share(wanted, fd_limit());
    if used < wanted {
        tracing::warn!(
            sql_max_statements = wanted,
            used,
            fd_limit = fd_limit(),
            "sql.max_statements lowered to fit 1/16 of the file-descriptor limit ({FDS_PER_SQL_WORKER} per worker)"
        );
    }
    used
}

/// `wanted`, at most 1/[`HTTP_SHARE_DEN`] of `limit` (at least 1).
fn http_share(wanted: usize, limit: Option<u64>) -> usize {
    match limit {
        Some(limit) => wanted.min((limit / HTTP_SHARE_DEN).max(1) as usize),
        None => wanted,
    }
}

/// `wanted`, at most as many workers as fit in 1/[`SQL_SHARE_DEN`] of
/// `limit` (at least 1).
fn sql_share(wanted: usize, limit: Option<u64>) -> usize {
    match limit {
        Some(limit) => {
            let workers = limit / SQL_SHARE_DEN / FDS_PER_SQL_WORKER;
            wanted.min(workers.max(1) as usize)
        }
        None => wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_port_gets_a_sixteenth_of_the_limit_at_most() {
        assert_eq!(http_share(256, Some(1024)), 64);
        assert_eq!(http_share(256, Some(1 << 20)), 256);
        assert_eq!(http_share(256, Some(8)), 1);
        assert_eq!(http_share(256, None), 256);
    }

    #[test]
    fn sql_workers_get_a_sixteenth_of_the_limit_at_most() {
        assert_eq!(sql_share(8, Some(1024)), 8);
        assert_eq!(sql_share(1024, Some(1024)), 16);
        assert_eq!(sql_share(8, Some(256)), 4);
        assert_eq!(sql_share(8, Some(16)), 1);
        assert_eq!(sql_share(8, None), 8);
    }

    #[test]
    fn the_shares_leave_an_eighth_for_the_rest() {
        let limit = 1024;
        let flight = limit / 4 * 3;
        let http = http_share(usize::MAX, Some(limit)) as u64;
        let sql = sql_share(usize::MAX, Some(limit)) as u64 * FDS_PER_SQL_WORKER;
        assert!(limit - flight - http - sql >= limit / 8);
    }
}
