//! What one SQS call costs this process in CPU, per aws-sdk-sqs client
//! setting: the server makes every call through the SDK (signing, JSON,
//! HTTP), and at 0 ms that CPU bounds figures 3 and 4 on two cores.
//!
//! Each variant drains the same number of messages with the raw loop of
//! figure 3 (receive 10 + DeleteMessageBatch, `workers` loops) on rustack,
//! and reports this process's CPU (user + system) per SQS call. Variants
//! run alternately, `reps` rounds, each on a fresh queue; the best round
//! of each is printed, since other load only ever adds CPU.

use std::time::Duration;

use anyhow::Result;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::StalledStreamProtectionConfig;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use sqs_flight_server::sqs::aws::{Retries, retrying};
use sqs_flight_tests::rustack::Rustack;

use crate::fig_sqs::cpu_seconds;
use crate::sqs;

/// One client setting to measure.
struct Variant {
    name: &'static str,
    client: Client,
}

/// The server's client (its retry and timeout settings over the harness's
/// credentials and endpoint), with `tweak` applied.
fn client(
    endpoint: &str,
    tweak: impl FnOnce(aws_sdk_sqs::config::Builder) -> aws_sdk_sqs::config::Builder,
) -> Client {
    let base = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "test", "test", None, None, "bench",
        ))
        .endpoint_url(endpoint);
    Client::from_conf(tweak(retrying(base, Retries::default())).build())
}

fn variants(endpoint: &str) -> Vec<Variant> {
    vec![
        Variant {
            name: "the server's client (SDK defaults)",
            client: client(endpoint, |b| b),
        },
        Variant {
            name: "stalled-stream protection off",
            client: client(endpoint, |b| {
                b.stalled_stream_protection(StalledStreamProtectionConfig::disabled())
            }),
        },
        // Not options for the server (it needs both), but what they cost.
        Variant {
            name: "no attempt timeouts (for comparison only)",
            client: client(endpoint, |b| b.timeout_config(TimeoutConfig::disabled())),
        },
        Variant {
            name: "no retries (for comparison only)",
            client: client(endpoint, |b| b.retry_config(RetryConfig::disabled())),
        },
    ]
}

/// Runs the comparison and prints one line per variant; returns the lines.
pub async fn run(
    rustack: &Rustack,
    messages: u64,
    workers: usize,
    reps: usize,
) -> Result<Vec<String>> {
    let setup = rustack.client().await;
    let variants = variants(&rustack.endpoint);
    let mut best = vec![f64::INFINITY; variants.len()];
    for round in 0..reps {
        for (i, v) in variants.iter().enumerate() {
            let q = sqs::new_queue(&setup, "sdkcpu").await;
            sqs::fill(&setup, &q, messages, 256).await;
            let calls = 2 * messages.div_ceil(10);
            let before = cpu_seconds(std::process::id());
            let t =
                sqs::raw_drain(&v.client, &q, messages, workers, Duration::from_secs(600)).await?;
            let us = (cpu_seconds(std::process::id()) - before) * 1e6 / calls as f64;
            eprintln!(
                "round {round}: {}: {us:.0} us CPU per call, {:.0} msg/s",
                v.name,
                messages as f64 / t.as_secs_f64()
            );
            best[i] = best[i].min(us);
        }
    }
    let lines: Vec<String> = variants
        .iter()
        .zip(&best)
        .map(|(v, us)| {
            format!(
                "{}: {us:.0} us of CPU per SQS call (best of {reps})",
                v.name
            )
        })
        .collect();
    for line in &lines {
        println!("{line}");
    }
    Ok(lines)
}
