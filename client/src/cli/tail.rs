//! `tail`: plan a batch, read it, write it out, then commit it (or keep it
//! for release at exit), until a batch comes back empty.
//!
//! The order is what makes `--commit` safe: a batch is committed only after
//! every row of it has been written and flushed, so an interrupted or failed
//! tail never deletes a message it did not print. Whatever is still
//! uncommitted when tail stops (an unfinished batch, or everything under
//! `--peek`) is released, so that it is visible again at once instead of
//! after the consumer's lease.

use std::time::{Duration, Instant};

use crate::{Client, Error, Plan, PlanOptions};
use arrow_array::RecordBatch;

use super::args::TailArgs;
use super::exit::CliError;
use super::output::{Format, Output, column_indices};
use super::{Say, plural};

/// The server's built-in partitions per batch, assumed when `--limit`
/// shapes batches and `--partitions` is not given.
const BUILTIN_PARTITIONS: u64 = sqs_flight_schemas::plan::DEFAULT_PARTITIONS;
/// The server's built-in messages per partition, likewise.
const BUILTIN_MAX_MESSAGES: u64 = sqs_flight_schemas::plan::DEFAULT_MAX_MESSAGES;
/// Under `--follow`, an empty batch that came back sooner than this is
/// followed by a pause, so that a server with short waits is not polled in
/// a tight loop.
const FOLLOW_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Reads of a planned batch that failed with a retryable error are tried
/// again this many times (a ticket replays the same rows, so this is safe).
const READ_RETRIES: u32 = 4;
/// First pause between read attempts; doubled each time.
const READ_BACKOFF: Duration = Duration::from_millis(500);

/// One `tail` run.
struct Tail<'a> {
    client: &'a Client,
    args: TailArgs,
    /// Projection of each batch; `None` for `--format body`.
    columns: Option<Vec<usize>>,
    output: Output,
    say: &'a Say,
    /// Rows written out.
    printed: u64,
    /// Batches that held rows.
    batches: u64,
    deleted: u64,
    expired: u64,
    /// Whether the consumer may hold uncommitted messages of this run.
    holding: bool,
}

pub async fn run(client: &Client, args: TailArgs, say: &Say) -> Result<(), CliError> {
    let schema = client.schema(&args.table).await?;
    let columns = match args.format {
        Format::Body => None,
        _ => Some(column_indices(&schema, &args.columns)?),
    };
    let mut tail = Tail {
        client,
        output: Output::new(args.format),
        args,
        columns,
        say,
        printed: 0,
        batches: 0,
        deleted: 0,
        expired: 0,
        holding: false,
    };
    let outcome = tokio::select! {
        r = tail.read_all() => r,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    tail.finish(outcome).await
}

impl Tail<'_> {
    fn commit(&self) -> bool {
        self.args.acknowledge.commit
    }

    fn consumer(&self) -> &str {
        &self.args.batching.consumer
    }

    /// Reads batches until one is empty (or, following, until `--limit`).
    async fn read_all(&mut self) -> Result<(), CliError> {
        loop {
            let Some(options) = self.next_options() else {
                return Ok(());
            };
            let started = Instant::now();
            let rows = self.one_batch(&options).await?;
            if rows == 0 && !self.args.follow {
                return Ok(());
            }
            if rows == 0 && started.elapsed() < FOLLOW_MIN_INTERVAL {
                tokio::time::sleep(FOLLOW_MIN_INTERVAL - started.elapsed()).await;
            }
        }
    }

    /// Plans, reads, writes out and (with `--commit`) commits one batch;
    /// returns its row count.
    async fn one_batch(&mut self, options: &PlanOptions) -> Result<u64, CliError> {
        self.holding = true;
        let plan = self.client.plan(&self.args.table, options).await?;
        let rows = self.read(&plan).await?;
        let count: u64 = rows.iter().map(|b| b.num_rows() as u64).sum();
        self.output.write(&self.project(rows)?).await?;
        self.printed += count;
        self.batches += u64::from(count > 0);
        if self.commit() {
            let c = self
                .client
                .commit(&plan.table, &plan.consumer, plan.batch)
                .await?;
            self.holding = false;
            self.deleted += c.deleted;
            self.expired += c.expired;
            if c.expired > 0 {
                self.say.line(format_args!(
                    "warning: {} of batch {} could not be deleted (their receipt expired); \
                     they will be delivered again",
                    plural(c.expired, "message"),
                    plan.batch
                ));
            }
        }
        Ok(count)
    }

    /// Reads a planned batch, retrying retryable failures.
    async fn read(&self, plan: &Plan) -> Result<Vec<RecordBatch>, Error> {
        let mut pause = READ_BACKOFF;
        let mut attempt = 0;
        loop {
            match self.client.read_batch(plan).await {
                Err(e) if e.is_retryable() && attempt < READ_RETRIES => {
                    self.say.line(format_args!(
                        "{e}; reading batch {} again in {pause:?}",
                        plan.batch
                    ));
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn project(&self, rows: Vec<RecordBatch>) -> Result<Vec<RecordBatch>, CliError> {
        match &self.columns {
            None => Ok(rows),
            Some(columns) => rows
                .iter()
                .map(|b| b.project(columns).map_err(CliError::render))
                .collect(),
        }
    }

    /// The plan options of the next batch; `None` once `--limit` is reached.
    fn next_options(&self) -> Option<PlanOptions> {
        shape(self.args.batching.options(), self.args.limit, self.printed)
    }

    /// Releases what is still held, reports, and returns the outcome.
    async fn finish(self, outcome: Result<(), CliError>) -> Result<(), CliError> {
        let released = match self.holding {
            true => self.release().await,
            false => None,
        };
        let closed = matches!(outcome, Err(CliError::OutputClosed));
        if !closed && (outcome.is_ok() || self.printed > 0) {
            self.summary(released);
        }
        outcome
    }

    async fn release(&self) -> Option<u64> {
        match self.client.release(&self.args.table, self.consumer()).await {
            Ok(r) => Some(r.released),
            Err(e) => {
                self.say.line(format_args!(
                    "warning: could not release consumer {:?}: {e}; its messages become visible \
                     again when its lease on the server expires",
                    self.consumer()
                ));
                None
            }
        }
    }

    fn summary(&self, released: Option<u64>) {
        let mut text = format!(
            "{} from table {} in {}",
            plural(self.printed, "message"),
            self.args.table,
            plural(self.batches, "batch")
        );
        if self.commit() {
            text.push_str(&format!(", {} deleted", self.deleted));
            if self.expired > 0 {
                text.push_str(&format!(
                    ", {} expired (to be delivered again)",
                    self.expired
                ));
            }
        }
        if let Some(n) = released.filter(|&n| n > 0) {
            text.push_str(&format!(", {n} released back to the queue"));
        }
        self.say.line(text);
    }
}

/// `options` for the next batch when `printed` of `limit` messages are out:
/// under a limit the batch is shaped so that it cannot hold more than the
/// messages still wanted, because a committed batch is deleted whole.
fn shape(mut options: PlanOptions, limit: Option<u64>, printed: u64) -> Option<PlanOptions> {
    let Some(limit) = limit else {
        return Some(options);
    };
    let remaining = limit.checked_sub(printed).filter(|&r| r > 0)?;
    let partitions = options
        .partitions
        .unwrap_or(BUILTIN_PARTITIONS)
        .min(remaining);
    let per_partition = options.max_messages.unwrap_or(BUILTIN_MAX_MESSAGES);
    options.partitions = Some(partitions);
    options.max_messages = Some((remaining / partitions).clamp(1, per_partition));
    Some(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaped(limit: u64, printed: u64, partitions: Option<u64>) -> Option<(u64, u64)> {
        let options = PlanOptions {
            partitions,
            ..PlanOptions::consumer("c")
        };
        shape(options, Some(limit), printed)
            .map(|o| (o.partitions.unwrap(), o.max_messages.unwrap()))
    }

    #[test]
    fn limit_shapes_batches_to_what_is_still_wanted() {
        assert_eq!(shaped(5, 0, None), Some((2, 2)));
        assert_eq!(shaped(5, 4, None), Some((1, 1)));
        assert_eq!(shaped(5, 5, None), None);
        assert_eq!(shaped(1, 0, Some(8)), Some((1, 1)));
        assert_eq!(shaped(10_000, 0, Some(4)), Some((4, 1000)));
        assert_eq!(plural(1, "batch"), "1 batch");
        assert_eq!(plural(2, "batch"), "2 batches");
        assert_eq!(plural(0, "message"), "0 messages");
        let untouched = shape(PlanOptions::consumer("c"), None, 7).unwrap();
        assert_eq!(untouched, PlanOptions::consumer("c"));
    }
}
