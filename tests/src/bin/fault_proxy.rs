//! `sqsf-fault-proxy`: the fault proxy of `sqs_flight_tests::faults` as a
//! process, for tests outside Rust (the Python client's pytest suite).
//!
//! ```text
//! sqsf-fault-proxy --upstream http://127.0.0.1:PORT
//!     --rule duplicate-receives|redeliver-deleted [--share 0.3] [--seed 1]
//! ```
//!
//! Prints `listening on http://127.0.0.1:PORT` once it listens, serves until
//! its stdin closes or it gets SIGTERM or SIGINT, then prints its counts as
//! one line of JSON. `GET /counts` on its port answers the same JSON while
//! it runs: `{"ReceiveMessage": {"calls": 12, "duplicated": 3}, ...}`.

use std::io::{Read, Write};

use anyhow::{Context, bail};
use sqs_flight_tests::faults::{FaultProxy, Faults};
use tokio::signal::unix::{SignalKind, signal};

/// Share of the messages a rule applies to when `--share` is not given.
const DEFAULT_SHARE: f64 = 0.3;
/// Seed of the draws when `--seed` is not given.
const DEFAULT_SEED: u64 = 1;

struct Args {
    upstream: String,
    faults: Faults,
    seed: u64,
}

fn parse(mut args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let (mut upstream, mut rule, mut share, mut seed) = (None, None, DEFAULT_SHARE, DEFAULT_SEED);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--upstream" => upstream = Some(value()?),
            "--rule" => rule = Some(value()?),
            "--share" => share = value()?.parse().context("--share: a number from 0 to 1")?,
            "--seed" => seed = value()?.parse().context("--seed: an integer")?,
            other => bail!("unknown argument {other:?}"),
        }
    }
    if !(0.0..=1.0).contains(&share) {
        bail!("--share {share}: a number from 0 to 1");
    }
    let faults = match rule.as_deref() {
        Some("duplicate-receives") => Faults::none().duplicate_receives(share),
        Some("redeliver-deleted") => Faults::none().redeliver_deleted(share),
        Some(other) => bail!("--rule {other:?}: duplicate-receives or redeliver-deleted"),
        None => bail!("--rule is required: duplicate-receives or redeliver-deleted"),
    };
    let upstream = upstream.context("--upstream URL is required")?;
    Ok(Args {
        upstream,
        faults,
        seed,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse(std::env::args().skip(1))?;
    let proxy = FaultProxy::start(&args.upstream, args.seed).await;
    proxy.set(args.faults);
    let mut out = std::io::stdout();
    writeln!(out, "listening on {}", proxy.endpoint)?;
    out.flush()?;
    // stdin is read on a thread of its own: its end is the parent's end.
    let (closed, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = closed.send(());
    });
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = stdin_closed => {}
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    writeln!(out, "{}", proxy.counts())?;
    out.flush()?;
    Ok(())
}
