//! `commit`: commit a consumer's batches up to one, giving back the
//! messages named with --reject (or whose payload did not decode) instead
//! of deleting them.

use std::time::Duration;

use crate::{Client, CommitOptions, Committed};

use super::args::CommitArgs;
use super::exit::CliError;

pub async fn run(client: &Client, args: CommitArgs) -> Result<(), CliError> {
    let options = CommitOptions {
        reject: args.reject,
        reject_delay: args.reject_delay.map(|s| Duration::from_secs(u64::from(s))),
        reject_payload_errors: args.reject_payload_errors,
    };
    let done = client
        .commit_with(&args.table, &args.consumer, args.batch, &options)
        .await?;
    println!("{}", summary(&args.table, &args.consumer, &done));
    Ok(())
}

/// `table t, consumer c: committed batch 3; 5 messages deleted, 1 rejected, 0 expired`.
fn summary(table: &str, consumer: &str, done: &Committed) -> String {
    format!(
        "table {table}, consumer {consumer}: committed batch {}; {} deleted, {} rejected, {} expired",
        done.committed_batch,
        super::plural(done.deleted, "message"),
        done.rejected,
        done.expired
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_every_count() {
        let done = Committed {
            committed_batch: 3,
            deleted: 5,
            expired: 0,
            rejected: 1,
        };
        assert_eq!(
            summary("t", "c", &done),
            "table t, consumer c: committed batch 3; 5 messages deleted, 1 rejected, 0 expired"
        );
    }
}
