//! `send`: input lines in, DoPut batches out.
//!
//! Lines are read and turned into messages a batch at a time, so a line
//! that is not a message is found before anything of its batch leaves: the
//! batch stream then ends, the server confirms the batches it already has,
//! and the error says how many messages they held. A row the server
//! refuses is reported with its input line, which [`line_of_row`] recovers
//! from the row number the server gives (rows skip blank lines).

use std::cell::Cell;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Client;
use crate::send::{BadLine, LineError, LineFault, MessageRows, OutgoingMessage, is_blank};
use arrow_array::RecordBatch;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};

use super::args::SendArgs;
use super::exit::CliError;
use super::{Say, plural};

/// Bytes of bodies and attributes a batch may hold before it is sent,
/// whatever --batch-rows says, so that large messages do not pile up in
/// memory (SQS takes up to 1 MiB each).
const MAX_BATCH_BYTES: usize = 8 << 20;
/// How often the progress spinner redraws.
const PROGRESS_TICK: Duration = Duration::from_millis(120);

/// Why the reader stopped early.
#[derive(Debug)]
enum Stop {
    Line(LineError),
    Read(std::io::Error),
}

/// What the reader leaves for the sender beside the batches.
#[derive(Debug, Default)]
struct Shared {
    /// The stop, and the first line of the batch it discarded.
    stop: Option<(Stop, u64)>,
    /// Lines skipped as blank, ascending: rows do not count them.
    skipped: Vec<u64>,
}

/// Reads the input into batches of messages.
struct Reader {
    input: Box<dyn AsyncBufRead + Unpin + Send>,
    raw: bool,
    batch_rows: usize,
    /// Lines read so far.
    line: u64,
    buf: Vec<u8>,
    shared: Arc<Mutex<Shared>>,
}

impl Reader {
    /// The next batch; `None` at the end of the input or at a stop, which
    /// is then in `shared` (and nothing of its batch is returned).
    async fn next_batch(&mut self) -> Option<RecordBatch> {
        let mut rows = MessageRows::new();
        let batch_start = self.line + 1;
        while rows.len() < self.batch_rows && rows.bytes() < MAX_BATCH_BYTES {
            match self.next_message().await {
                Ok(Some(m)) => rows.push(&m),
                Ok(None) => break,
                Err(stop) => {
                    self.shared.lock().expect("not poisoned").stop = Some((stop, batch_start));
                    return None;
                }
            }
        }
        (!rows.is_empty()).then(|| rows.finish())
    }

    /// The next message, past blank lines; `None` at the end.
    async fn next_message(&mut self) -> Result<Option<OutgoingMessage>, Stop> {
        loop {
            self.buf.clear();
            let n = self
                .input
                .read_until(b'\n', &mut self.buf)
                .await
                .map_err(Stop::Read)?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            let bad = |BadLine { fault, reason }| {
                Stop::Line(LineError {
                    line: self.line,
                    fault,
                    reason,
                })
            };
            let bytes = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
            let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
            let text = std::str::from_utf8(bytes).map_err(|e| {
                bad(BadLine {
                    fault: LineFault::NotText,
                    reason: format!(
                        "not UTF-8 text (invalid byte at column {})",
                        e.valid_up_to() + 1
                    ),
                })
            })?;
            let blank = if self.raw {
                text.is_empty()
            } else {
                is_blank(text)
            };
            if blank {
                self.shared
                    .lock()
                    .expect("not poisoned")
                    .skipped
                    .push(self.line);
                continue;
            }
            return match self.raw {
                true => Ok(Some(OutgoingMessage::body(text))),
                false => OutgoingMessage::parse_json_line(text)
                    .map(Some)
                    .map_err(bad),
            };
        }
    }
}

/// The input line (from 1) of row `row` (from 0), given the lines skipped.
fn line_of_row(row: u64, skipped: &[u64]) -> u64 {
    let mut line = row + 1;
    for &s in skipped {
        if s > line {
            break;
        }
        line += 1;
    }
    line
}

/// The input and the name errors call it by.
async fn open(
    file: Option<&Path>,
) -> Result<(Box<dyn AsyncBufRead + Unpin + Send>, String), CliError> {
    match file {
        None => Ok((Box::new(BufReader::new(tokio::io::stdin())), "stdin".into())),
        Some(p) if p.as_os_str() == "-" => {
            Ok((Box::new(BufReader::new(tokio::io::stdin())), "stdin".into()))
        }
        Some(p) => {
            let f = tokio::fs::File::open(p)
                .await
                .map_err(|e| CliError::Usage(format!("cannot read --file {}: {e}", p.display())))?;
            Ok((Box::new(BufReader::new(f)), p.display().to_string()))
        }
    }
}

/// A spinner with the count of messages sent, on a terminal only.
struct Progress(Option<ProgressBar>);

impl Progress {
    fn new(say: &Say, table: &str) -> Self {
        Self(say.live().then(|| {
            let style = ProgressStyle::with_template(
                "{spinner} {prefix}: {human_pos} messages sent ({per_sec}, {elapsed})",
            )
            .expect("a valid template");
            let bar = ProgressBar::new_spinner()
                .with_style(style)
                .with_prefix(format!("sending to {table}"));
            bar.enable_steady_tick(PROGRESS_TICK);
            bar
        }))
    }

    fn set(&self, sent: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(sent);
        }
    }

    fn clear(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

pub async fn run(client: &Client, args: SendArgs, say: &Say) -> Result<(), CliError> {
    let (input, name) = open(args.file.as_deref()).await?;
    if name == "stdin" && say.live() && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        say.line("reading messages from the terminal, one per line; end with Ctrl-D");
    }
    let shared = Arc::new(Mutex::new(Shared::default()));
    let reader = Reader {
        input,
        raw: args.raw,
        batch_rows: args.batch_rows,
        line: 0,
        buf: Vec::new(),
        shared: Arc::clone(&shared),
    };
    let batches = futures::stream::unfold(reader, |mut r| async move {
        r.next_batch().await.map(|b| (b, r))
    });
    let progress = Progress::new(say, &args.table);
    let confirmed = Cell::new(0);
    let sending = client.send_with_progress(&args.table, batches, |o| {
        confirmed.set(o.sent);
        progress.set(o.sent);
    });
    let result = tokio::select! {
        r = sending => r,
        _ = tokio::signal::ctrl_c() => {
            progress.clear();
            say.line(format_args!(
                "{} confirmed sent to {} before the interruption; a batch in flight may have been sent in part",
                plural(confirmed.get(), "message"),
                args.table
            ));
            return Err(CliError::Interrupted);
        }
    };
    progress.clear();
    let shared = std::mem::take(&mut *shared.lock().expect("not poisoned"));
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(error) => {
            let line = error.row.map(|r| line_of_row(r, &shared.skipped));
            return Err(CliError::Send {
                error: Box::new(error),
                input: name,
                line,
            });
        }
    };
    match shared.stop {
        None => {
            say.line(format_args!(
                "sent {} to {}",
                plural(outcome.sent, "message"),
                args.table
            ));
            Ok(())
        }
        Some((Stop::Line(error), batch_start)) => Err(CliError::BadLine {
            input: name,
            error,
            batch_start,
            sent: outcome.sent,
        }),
        Some((Stop::Read(e), _)) => Err(CliError::Input {
            input: name,
            reason: e.to_string(),
            sent: outcome.sent,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(text: &'static str, raw: bool, batch_rows: usize) -> Reader {
        Reader {
            input: Box::new(BufReader::new(text.as_bytes())),
            raw,
            batch_rows,
            line: 0,
            buf: Vec::new(),
            shared: Arc::default(),
        }
    }

    #[test]
    fn rows_map_back_to_lines_past_blank_ones() {
        assert_eq!(line_of_row(0, &[]), 1);
        assert_eq!(line_of_row(4, &[]), 5);
        assert_eq!(line_of_row(0, &[2]), 1);
        assert_eq!(line_of_row(1, &[2]), 3);
        assert_eq!(line_of_row(0, &[1, 2]), 3);
        assert_eq!(line_of_row(2, &[1, 3, 9]), 5);
    }

    #[tokio::test]
    async fn lines_become_batches_of_batch_rows() {
        let mut r = reader(
            "{\"body\":\"a\"}\n\n{\"body\":\"b\"}\r\n{\"body\":\"c\"}",
            false,
            2,
        );
        assert_eq!(r.next_batch().await.unwrap().num_rows(), 2);
        assert_eq!(r.next_batch().await.unwrap().num_rows(), 1);
        assert!(r.next_batch().await.is_none());
        let shared = r.shared.lock().unwrap();
        assert!(shared.stop.is_none());
        assert_eq!(shared.skipped, [2]);
    }

    #[tokio::test]
    async fn a_bad_line_discards_its_batch_and_names_itself() {
        let mut r = reader(
            "{\"body\":\"a\"}\n{\"body\":\"b\"}\n{\"body\":\"c\"}\nnope\n",
            false,
            2,
        );
        assert_eq!(r.next_batch().await.unwrap().num_rows(), 2);
        assert!(r.next_batch().await.is_none(), "line 3's batch is not sent");
        let shared = r.shared.lock().unwrap();
        let Some((Stop::Line(e), start)) = &shared.stop else {
            panic!("{shared:?}")
        };
        assert_eq!((e.line, *start), (4, 3));
        assert!(e.reason.starts_with("not JSON"), "{e}");
    }

    #[tokio::test]
    async fn raw_lines_are_bodies_and_must_be_utf8() {
        let mut r = reader("a\n\n {\"x\"} \r\n", true, 10);
        let b = r.next_batch().await.unwrap();
        use arrow_array::cast::AsArray;
        let bodies: Vec<_> = b.column(0).as_string::<i32>().iter().flatten().collect();
        assert_eq!(bodies, ["a", " {\"x\"} "]);
        let mut r = Reader {
            input: Box::new(BufReader::new(&b"ok\n\xff\xfe\n"[..])),
            ..reader("", true, 10)
        };
        assert!(r.next_batch().await.is_none());
        let shared = r.shared.lock().unwrap();
        let Some((Stop::Line(e), _)) = &shared.stop else {
            panic!("{shared:?}")
        };
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("not UTF-8"), "{e}");
    }
}
