//! Following a ticket's log: every reader streams what is recorded, then
//! what is recorded later, until the log is sealed ([`Ticket::follow`]).

use std::sync::Arc;

use arrow_array::RecordBatch;
use futures::Stream;
use tokio::sync::watch;

use super::super::packed::Packed;
use super::log::LogRows;
use super::{Begin, Phase, Ticket};
use crate::error::Error;

impl Ticket {
    /// The rows of this ticket: what is recorded, then what is recorded
    /// later, until the log is sealed. `begin` is what the reader's
    /// [`Ticket::begin`] answered: if that read fails before recording
    /// anything, the stream ends with its error.
    pub fn follow(
        self: Arc<Self>,
        begin: Begin,
    ) -> impl Stream<Item = Result<RecordBatch, Error>> + Send + 'static {
        let follower = Follower {
            changed: self.changed.subscribe(),
            ticket: self,
            generation: begin.generation,
            next: 0,
            done: false,
        };
        futures::stream::unfold(follower, |mut follower| async move {
            let item = follower.next_batch().await?;
            Some((item, follower))
        })
    }
}

/// What a reader following a log finds at its next row.
enum Found {
    /// Rows as received, from the next on.
    Rows(RecordBatch),
    /// A packed batch, and the next row's offset in it.
    Unpack(Arc<Packed>, usize),
    /// The first read the reader joined failed with nothing recorded.
    Failed(Error),
    /// Sealed, and every row read.
    End,
    /// Every row recorded so far read: wait for more.
    Wait,
}

/// One reader following a ticket's log (see [`Ticket::follow`]).
struct Follower {
    ticket: Arc<Ticket>,
    /// Told when the log changes.
    changed: watch::Receiver<u64>,
    /// The failed first reads when the reader began
    /// ([`FailedFirstReads::generation`](super::log::FailedFirstReads::generation)).
    generation: u64,
    /// The row the reader reads next.
    next: usize,
    /// The stream ended with an error.
    done: bool,
}

impl Follower {
    /// The next rows, waiting for the log to change as needed; `None` at
    /// the end of the stream.
    async fn next_batch(&mut self) -> Option<Result<RecordBatch, Error>> {
        if self.done {
            return None;
        }
        loop {
            match self.look() {
                Found::Rows(b) => return Some(Ok(self.advance(b))),
                Found::Unpack(packed, offset) => return Some(self.unpack(&packed, offset)),
                Found::Failed(e) => return Some(self.fail(e)),
                Found::End => return None,
                Found::Wait => self.changed.changed().await.ok()?,
            }
        }
    }

    /// What the log holds at the reader's next row now.
    fn look(&mut self) -> Found {
        self.changed.borrow_and_update();
        let log = self.ticket.log();
        if let Some(e) = log.failed_first_reads.since(self.generation) {
            Found::Failed(e)
        } else if self.next < log.rows {
            let i = log.starts.partition_point(|&s| s <= self.next) - 1;
            let offset = self.next - log.starts[i];
            match &log.batches[i] {
                LogRows::Rows(b) => Found::Rows(b.slice(offset, b.num_rows() - offset)),
                LogRows::Packed(p) => Found::Unpack(Arc::clone(p), offset),
            }
        } else if log.phase == Phase::Sealed {
            Found::End
        } else {
            Found::Wait
        }
    }

    /// The rows of `packed` from `offset` on; an error ends the stream.
    fn unpack(&mut self, packed: &Packed, offset: usize) -> Result<RecordBatch, Error> {
        match packed.unpack() {
            Ok(b) => Ok(self.advance(b.slice(offset, b.num_rows() - offset))),
            Err(e) => self.fail(Error::Internal(format!("unpacking held rows: {e}"))),
        }
    }

    /// Moves the reader past `rows`, which it streams next.
    fn advance(&mut self, rows: RecordBatch) -> RecordBatch {
        self.next += rows.num_rows();
        rows
    }

    /// Ends the stream with `error`.
    fn fail(&mut self, error: Error) -> Result<RecordBatch, Error> {
        self.done = true;
        Err(error)
    }
}
