//! `sqs-flight-bench`: the end-to-end figures of issues 6 and 14, each
//! printed as ours beside a baseline measured in the same run, and written
//! as JSON; figures 3, 5 and 7 at each added round trip (a latency proxy in
//! front of rustack, as far as SQS is from its clients). `scripts/bench.sh`
//! runs it (in release) with the criterion micro benchmarks and the Spark
//! script, folds the parts into one `results.json` (`collect`) with a
//! Markdown summary rendered from it, `publish` records a run and renders
//! `benches/RESULTS.md` from it, and `compare` sets two runs side by side;
//! see `benches/README.md`.
//!
//! # Layout
//!
//! - [`report`]: figures, rows, ratios, targets, markdown; [`chart`]: SVG
//!   line charts (figures 3 and 4).
//! - [`results`]: a run's JSON and its Markdown summary; [`compare`]: two
//!   runs side by side; [`publish`]: a run recorded in `benches/results/`
//!   and `benches/RESULTS.md` rendered from it.
//! - [`criterion`]: figure 1 from criterion's output.
//! - [`sqs`]: the link of each RTT, the raw baselines and bench-specific
//!   SDK calls; the emulator, queues, sends, counts and the latency proxy
//!   come from the integration tests' harness (`sqs_flight_tests`).
//! - [`flight`]: the server in-process, a Flight client, the raw Flight server.
//! - `fig_*`: one module per figure (2, 3, 5, 6, 7); [`fig_sqs`]: what
//!   figures 3, 5 and 7 share (the server in-process on a queue, batches
//!   read and committed through it, CPU time, alternating runs).

mod chart;
mod compare;
mod criterion;
mod fig_commit;
mod fig_latency;
mod fig_memory;
mod fig_overhead;
mod fig_receive;
mod fig_simulated;
mod fig_sqs;
mod flight;
mod publish;
mod report;
mod results;
mod sdk_cpu;
mod sqs;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use futures::FutureExt;
use sqs_flight_tests::latency::LatencyProxy;
use sqs_flight_tests::rustack::{RUSTACK_ENV, Rustack, rustack};

#[derive(Debug, Parser)]
#[command(
    name = "sqs-flight-bench",
    about = "sqs-flight benchmarks beside their baselines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Figures 2, 3, 3m, 5, 6 and 7 (rustack and the in-process server).
    E2e(Box<E2e>),
    /// Figure 1 from criterion's output directory.
    CriterionSummary {
        /// `$CARGO_TARGET_DIR/criterion`
        #[arg(long)]
        dir: PathBuf,
        /// JSON file the figure is written to (a part of the run).
        #[arg(long)]
        out: PathBuf,
    },
    /// Folds the parts of a run into `DIR/results.json` with the run's
    /// metadata, and renders `DIR/results.md` from it.
    Collect(Box<Collect>),
    /// Prints the Markdown of a `results.json` or of one part's JSON (and
    /// writes the charts it holds into --charts).
    Render {
        json: PathBuf,
        /// Directory the charts in the JSON are written to.
        #[arg(long)]
        charts: Option<PathBuf>,
    },
    /// Records a run: copies its results.json to
    /// BENCHES/results/DATE-COMMIT.json, writes its charts beside it, and
    /// renders BENCHES/RESULTS.md from that copy.
    Publish {
        /// The run's results.json (bench-results/results.json).
        #[arg(required_unless_present = "check")]
        json: Option<PathBuf>,
        /// The benches directory of the repository.
        #[arg(long, default_value = "benches")]
        benches: PathBuf,
        /// Publish a quick run too (small counts: the page says so).
        #[arg(long)]
        allow_quick: bool,
        /// Only check that BENCHES/RESULTS.md and its charts are the
        /// rendering of the JSON the page names.
        #[arg(long, conflicts_with = "json")]
        check: bool,
    },
    /// Two runs side by side: per figure and row, ours before -> after and
    /// the ratio ours/baseline before -> after; rows that moved more than
    /// --threshold are flagged.
    Compare {
        /// The older run's results.json.
        old: PathBuf,
        /// The newer run's results.json.
        new: PathBuf,
        /// Relative change beyond which a row is flagged (0.1: 10%).
        #[arg(long, default_value_t = 0.1)]
        threshold: f64,
    },
    /// A latency proxy on 127.0.0.1 (figure 4 puts the server's and
    /// boto3's SQS traffic through it): prints `listening on
    /// 127.0.0.1:PORT`, then runs until SIGTERM or SIGINT.
    Proxy {
        /// The SQS server to forward to, `HOST:PORT`.
        #[arg(long)]
        upstream: String,
        /// Round-trip time to add, in milliseconds (half each way).
        #[arg(long)]
        rtt_ms: u64,
        /// Each one-way delay varies by up to this many milliseconds.
        #[arg(long, default_value_t = 0)]
        jitter_ms: u64,
    },
    /// CPU of this process per SQS call for aws-sdk-sqs client settings
    /// (the raw drain loop on rustack, variants alternated).
    SdkCpu {
        /// The rustack executable.
        #[arg(long, env = "SQSF_RUSTACK")]
        rustack: PathBuf,
        /// Messages each variant drains per round.
        #[arg(long, default_value_t = 20_000)]
        messages: u64,
        /// Concurrent receive + delete loops.
        #[arg(long, default_value_t = 8)]
        workers: usize,
        /// Rounds; the best of each variant is printed.
        #[arg(long, default_value_t = 3)]
        reps: usize,
    },
    /// Draws a chart written as JSON (figure 4's script) as SVG.
    Chart {
        /// The chart: `{"title", "x_label", "y_label", "series": [{"name",
        /// "dashed", "colour", "points": [[x, y], ...]}]}`.
        #[arg(long)]
        data: PathBuf,
        /// The SVG file to write.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct Collect {
    /// Directory written to: results.json, results.md (the charts already
    /// in it are listed).
    #[arg(long)]
    dir: PathBuf,
    /// The commit measured (with " (with uncommitted changes)" if so).
    #[arg(long)]
    commit: String,
    /// UTC date and time of the run.
    #[arg(long)]
    date: String,
    /// "full" or "quick ...".
    #[arg(long)]
    mode: String,
    /// `rustc --version` and the profile.
    #[arg(long)]
    toolchain: String,
    /// The SQS server and each figure's RTTs.
    #[arg(long)]
    sqs_server: String,
    /// A part that failed, `NAME: WHY` (repeatable).
    #[arg(long)]
    failed: Vec<String>,
    /// A line for the end of the summary, e.g. a part skipped and why
    /// (repeatable).
    #[arg(long)]
    note: Vec<String>,
    /// The parts' JSON files (missing ones are skipped).
    parts: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct E2e {
    /// The rustack executable (rustack-cli 0.12.0 with the sqs feature).
    #[arg(long, env = "SQSF_RUSTACK")]
    rustack: PathBuf,
    /// The sqs-flight-server binary, for figure 6 (a release build).
    #[arg(long, env = "SQSF_SERVER_BIN")]
    server_bin: Option<PathBuf>,
    /// JSON file the figures are written to (a part of the run, rewritten
    /// after each figure); each is printed as Markdown too.
    #[arg(long)]
    out: PathBuf,
    /// Directory the charts are written to (fig3.svg) [default: the
    /// directory of --out].
    #[arg(long)]
    charts: Option<PathBuf>,
    /// Added round-trip times in milliseconds of figures 3, 5 and 7: 0 is
    /// rustack on loopback; above 0 every timed SQS call of both sides goes
    /// through a latency proxy of that RTT.
    #[arg(long, value_delimiter = ',', default_values_t = [0u64])]
    rtt_ms: Vec<u64>,
    /// The RTTs of figure 3 [default: --rtt-ms].
    #[arg(long, value_delimiter = ',')]
    fig3_rtt_ms: Option<Vec<u64>>,
    /// Each one-way delay of the proxy varies by up to this many ms.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u64,
    /// Above 0 ms, message counts are cut so that the raw baseline takes
    /// about this many seconds per run (estimated from the RTT and its
    /// calls in flight); each row prints the count used.
    #[arg(long, default_value_t = 10)]
    rtt_budget_secs: u64,
    /// Which figures to run (3m: figure 3's latency hiding on the
    /// in-memory backend with a simulated RTT, at figure 3's RTTs).
    #[arg(long, value_delimiter = ',', default_values = ["2", "3", "3m", "5", "6", "7"])]
    figures: Vec<String>,
    /// Body sizes in bytes (figures 2, 3 and 6).
    #[arg(long, value_delimiter = ',', default_values_t = [256usize, 4096])]
    sizes: Vec<usize>,
    /// Messages per run of figures 2 and 3.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Messages per partition of each batch in figure 3, committed after it
    /// is read (a streaming consumer's micro-batch; 0: one batch holding
    /// every message).
    #[arg(long, default_value_t = sqs_flight_server::config::plan::DEFAULT_MAX_MESSAGES)]
    batch_messages: u64,
    /// Partitions of figure 3.
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 4])]
    partitions: Vec<u64>,
    /// The plans' `receivers` in figure 3; the raw baseline runs as many
    /// loops as ours keeps calls in flight at the RTT (partitions x 32 up
    /// to 10 ms, more beyond: `registry::receive::width_at`).
    #[arg(long, value_delimiter = ',', default_values_t = [sqs_flight_server::config::plan::DEFAULT_RECEIVERS])]
    receivers: Vec<u64>,
    /// DeleteMessageBatch / ChangeMessageVisibilityBatch calls our server
    /// keeps in flight (figures 3 and 5), and so the raw commit baseline.
    #[arg(long, default_value_t = sqs_flight_server::config::DEFAULT_SQS_BATCH_CONCURRENCY)]
    batch_concurrency: u32,
    /// Figure 3: commit each batch before the next is planned, instead of
    /// while the next is planned and read (in order, as the Spark source
    /// commits, and as the raw loops delete while other loops receive).
    #[arg(long)]
    commits_in_turn: bool,
    /// Runs per case of figures 2 and 3 (the best is reported).
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// Messages of the commit in figure 5.
    #[arg(long, default_value_t = 100_000)]
    commit_messages: u64,
    /// In-flight counts at which figure 6 reads RSS (ascending, multiples of 4).
    #[arg(long, value_delimiter = ',', default_values_t = [25_000u64, 50_000, 100_000])]
    memory_counts: Vec<u64>,
    /// The plans' `receivers` in figure 6 [default: the server's].
    #[arg(long)]
    memory_receivers: Option<u64>,
    /// Messages sent one by one in figure 7.
    #[arg(long, default_value_t = 300)]
    latency_messages: u64,
    /// Milliseconds between two sends in figure 7.
    #[arg(long, default_value_t = 30)]
    latency_interval_ms: u64,
    /// Figures 3 and 5 through a server with a durable registry in a fresh
    /// directory under this one (what `--state-dir` costs).
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::CriterionSummary { dir, out } => {
            let fig = criterion::figure(&dir)?;
            report::emit(&fig, charts_dir(&out))?;
            results::Part {
                figures: vec![fig],
                failed: Vec::new(),
            }
            .save(&out)
        }
        Command::Collect(c) => collect(*c),
        Command::Render { json, charts } => {
            if let Some(dir) = charts {
                write_charts(&json, &dir)?;
            }
            print!("{}", results::render(&json)?);
            Ok(())
        }
        Command::Publish {
            json,
            benches,
            allow_quick,
            check,
        } => {
            if check {
                publish::check(&benches)?;
                eprintln!(
                    "{}/{} is its JSON's rendering",
                    benches.display(),
                    publish::PAGE
                );
                return Ok(());
            }
            let json = json.context("publish needs the run's results.json")?;
            let done = publish::publish(&json, &benches, allow_quick)?;
            eprintln!(
                "{b}/{} and {b}/{}{}",
                done.json,
                publish::PAGE,
                done.charts
                    .iter()
                    .map(|c| format!(", {}/{c}", benches.display()))
                    .collect::<String>(),
                b = benches.display()
            );
            Ok(())
        }
        Command::Compare {
            old,
            new,
            threshold,
        } => {
            let (old, new) = (results::Run::load(&old)?, results::Run::load(&new)?);
            print!("{}", compare::report(&old, &new, threshold));
            Ok(())
        }
        Command::Proxy {
            upstream,
            rtt_ms,
            jitter_ms,
        } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(proxy(&upstream, rtt_ms, jitter_ms)),
        Command::Chart { data, out } => {
            let text = std::fs::read_to_string(&data)
                .with_context(|| format!("read {}", data.display()))?;
            let chart: chart::Chart = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a chart", data.display()))?;
            std::fs::write(&out, chart.svg()).with_context(|| format!("write {}", out.display()))
        }
        Command::SdkCpu {
            rustack,
            messages,
            workers,
            reps,
        } => {
            // SAFETY: single-threaded here (no runtime yet).
            unsafe { std::env::set_var(RUSTACK_ENV, &rustack) };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(async {
                    let rustack =
                        tokio::task::spawn_blocking(sqs_flight_tests::rustack::rustack).await?;
                    sdk_cpu::run(rustack, messages, workers, reps)
                        .await
                        .map(drop)
                })
        }
        Command::E2e(args) => {
            // The harness starts the rustack named by $SQSF_RUSTACK; set it
            // before any thread exists.
            // SAFETY: single-threaded here (no runtime yet).
            unsafe { std::env::set_var(RUSTACK_ENV, &args.rustack) };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(e2e(*args))
        }
    }
}

/// `sqs-flight-bench collect`: the run's JSON, then its Markdown from it.
fn collect(c: Collect) -> Result<()> {
    let mut run = results::Run {
        commit: c.commit,
        date: c.date,
        mode: c.mode,
        machine: results::Machine::this(c.toolchain),
        sqs_server: c.sqs_server,
        charts: ["fig3.svg", "fig4.svg"]
            .into_iter()
            .filter(|f| c.dir.join(f).exists())
            .map(String::from)
            .collect(),
        figures: Default::default(),
        failed: Vec::new(),
        notes: c.note,
    };
    for path in c.parts.iter().filter(|p| p.exists()) {
        run.add(results::Part::load(path)?);
    }
    for f in c.failed {
        let (what, error) = f.split_once(": ").unwrap_or((&f, "failed"));
        run.failed.push(results::Failure {
            what: what.into(),
            error: error.into(),
        });
    }
    let json = c.dir.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(&run)?)
        .with_context(|| format!("write {}", json.display()))?;
    let md = c.dir.join("results.md");
    std::fs::write(&md, results::render(&json)?)
        .with_context(|| format!("write {}", md.display()))?;
    eprintln!("{} and {}", json.display(), md.display());
    Ok(())
}

/// Writes the charts of the figures in a run's or a part's JSON into `dir`.
fn write_charts(json: &Path, dir: &Path) -> Result<()> {
    let figures: Vec<report::Figure> = match results::Run::load(json) {
        Ok(run) => run.figures.into_values().collect(),
        Err(_) => results::Part::load(json)?.figures,
    };
    for fig in &figures {
        fig.write_chart(dir)?;
    }
    Ok(())
}

/// Where the charts of a run whose figures go to `out` are written.
fn charts_dir(out: &Path) -> &Path {
    match out.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// `sqs-flight-bench proxy`: serves until SIGTERM or SIGINT.
async fn proxy(upstream: &str, rtt_ms: u64, jitter_ms: u64) -> Result<()> {
    let upstream: SocketAddr = tokio::net::lookup_host(upstream)
        .await
        .with_context(|| format!("resolve --upstream {upstream}"))?
        .next()
        .with_context(|| format!("--upstream {upstream} resolves to no address"))?;
    let proxy = LatencyProxy::start(
        upstream,
        Duration::from_millis(rtt_ms),
        Duration::from_millis(jitter_ms),
    )
    .await
    .context("start the latency proxy")?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {}", proxy.addr())?;
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    proxy.stop().await;
    Ok(())
}

async fn e2e(a: E2e) -> Result<()> {
    // Started from a thread that lives as long as the process, and killed
    // with it (the harness's PR_SET_PDEATHSIG).
    let rustack = tokio::task::spawn_blocking(rustack).await?;
    eprintln!(
        "rustack 0.12.0 on {} (pid {})",
        rustack.endpoint, rustack.pid
    );
    let sqs_client = rustack.client().await;
    let charts = a.charts.as_deref().unwrap_or(charts_dir(&a.out));
    let mut part = results::Part::default();
    for figure in &a.figures {
        let started = std::time::Instant::now();
        // The harness's helpers panic on SQS errors: a panic fails the
        // figure, not the run.
        let result = std::panic::AssertUnwindSafe(run_figure(figure, &a, rustack, &sqs_client))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                let text = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                Err(anyhow!("panicked: {text}"))
            });
        match result {
            Ok(fig) => {
                report::emit(&fig, charts)?;
                part.figures.push(fig);
            }
            Err(e) => {
                let failure = results::Failure {
                    what: format!("figure {figure}"),
                    error: format!("{e:#}"),
                };
                eprintln!("{}", results::failures(std::slice::from_ref(&failure)));
                part.failed.push(failure);
            }
        }
        part.save(&a.out)?;
        eprintln!(
            "figure {figure} took {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    if !part.failed.is_empty() {
        let failed: Vec<&str> = part.failed.iter().map(|f| f.what.as_str()).collect();
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

async fn run_figure(
    figure: &str,
    a: &E2e,
    rustack: &Rustack,
    sqs_client: &aws_sdk_sqs::Client,
) -> Result<report::Figure> {
    let rtts = |ms: &[u64]| sqs::Rtts {
        ms: ms.to_vec(),
        jitter: Duration::from_millis(a.jitter_ms),
        budget: Duration::from_secs(a.rtt_budget_secs),
    };
    let sqs_settings = || fig_sqs::Settings {
        messages: a.messages,
        sizes: a.sizes.clone(),
        partitions: a.partitions.clone(),
        receivers: a.receivers.clone(),
        batch_concurrency: a.batch_concurrency,
        commits: if a.commits_in_turn {
            fig_sqs::Commits::InTurn
        } else {
            fig_sqs::Commits::Overlapped
        },
        batch_messages: a.batch_messages,
        commit_messages: a.commit_messages,
        reps: a.reps,
        emulator_pid: rustack.pid,
        state_dir: a.state_dir.clone(),
    };
    match figure {
        "2" => {
            let s = fig_overhead::Settings {
                messages: a.messages,
                sizes: a.sizes.clone(),
                reps: a.reps.max(3),
            };
            fig_overhead::run(&s).await
        }
        "3" => {
            let ms = a.fig3_rtt_ms.as_deref().unwrap_or(&a.rtt_ms);
            fig_receive::run(rustack, &rtts(ms), &sqs_settings()).await
        }
        "3m" => {
            let ms = a.fig3_rtt_ms.as_deref().unwrap_or(&a.rtt_ms);
            fig_simulated::run(&rtts(ms), &sqs_settings()).await
        }
        "5" => fig_commit::run(rustack, &rtts(&a.rtt_ms), &sqs_settings()).await,
        "6" => {
            let bin = a
                .server_bin
                .as_deref()
                .context("figure 6 needs --server-bin (the release sqs-flight-server)")?;
            let s = fig_memory::Settings {
                server_bin: bin,
                endpoint: &rustack.endpoint,
                counts: a.memory_counts.clone(),
                sizes: a.sizes.clone(),
                receivers: a.memory_receivers,
            };
            fig_memory::run(sqs_client, &s).await
        }
        "7" => {
            let s = fig_latency::Settings {
                messages: a.latency_messages,
                interval: Duration::from_millis(a.latency_interval_ms),
            };
            fig_latency::run(rustack, &rtts(&a.rtt_ms), &s).await
        }
        other => bail!("no figure {other} here (1 is criterion's, 4 is benches/spark_vs_boto3.py)"),
    }
}
