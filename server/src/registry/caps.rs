//! The registry's caps: what a plan may add to what the server holds.
//!
//! Messages are bounded by the budget (`registry_max_bytes`,
//! `registry_max_messages`), checked before each receive. Plans are bounded
//! here, before a new batch is made: open batches per consumer
//! (`max_open_batches_per_consumer`), tickets in all
//! (`max_tickets`), consumers in all (`max_consumers`), and the budget's
//! bytes, which count every ticket at [`TICKET_COST_BYTES`] and every
//! consumer at [`CONSUMER_COST_BYTES`] besides the messages held. A plan
//! past one is refused with `RESOURCE_EXHAUSTED` naming the setting, and
//! changes nothing: no consumer is made, nothing is journaled.
//!
//! A consumer that committed is kept for its watermark after it holds
//! nothing. When a new consumer would go past `max_consumers`, every
//! consumer that holds nothing (no open batch, no delete or give-back to
//! retry) and has not called for its lease is forgotten first, from memory,
//! the metrics and the journal.

use std::sync::Arc;

use tokio::time::Instant;

use super::consumers::{ConsumerKey, ConsumerMap};
use super::{PlannedBatch, Registry};
use crate::error::{Error, Result};

/// What the budget counts for one ticket: its log, its id (table and
/// consumer names), its share of the batch and the journal's entry. A debug
/// build measured about 850 bytes per ticket under a flood of 64-partition
/// plans (docs/operations.md, "Limits").
pub const TICKET_COST_BYTES: u64 = 1024;
/// What the budget counts for one consumer: its map entry, its names and
/// its metric series.
pub const CONSUMER_COST_BYTES: u64 = 1024;

/// The caps of plans, and the budget of messages, from the configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    /// `max_consumers`.
    pub(super) consumers: u64,
    /// `max_open_batches_per_consumer`.
    pub(super) open_batches: u64,
    /// `max_tickets`.
    pub(super) tickets: u64,
    /// `registry_max_bytes`: messages' bytes, and plans' (see
    /// [`TICKET_COST_BYTES`], [`CONSUMER_COST_BYTES`]).
    pub(super) max_bytes: u64,
    /// `registry_max_messages`.
    pub(super) max_messages: u64,
}

/// The tickets of `batches`.
pub(super) fn tickets_of<'a>(batches: impl IntoIterator<Item = &'a Arc<PlannedBatch>>) -> u64 {
    batches.into_iter().map(|b| b.tickets.len() as u64).sum()
}

impl Registry {
    /// Checks that `key`, holding `open` batches now, may plan one more of
    /// `partitions` partitions. For a new consumer at `max_consumers`, the
    /// idle consumers are forgotten first (from memory only: the caller
    /// journals and forgets the metrics of the keys returned).
    pub(super) fn make_room(
        &self,
        consumers: &mut ConsumerMap,
        key: &ConsumerKey,
        partitions: u64,
        now: Instant,
    ) -> Result<Vec<ConsumerKey>> {
        let caps = self.caps;
        let existing = consumers.get(key);
        let open = existing.map_or(0, |c| c.open_batch_count() as u64);
        if open >= caps.open_batches {
            return Err(refused(format!(
                "consumer {:?} of table {:?} holds {open} open batches, the limit \
                 (max_open_batches_per_consumer, --max-open-batches-per-consumer); commit or \
                 release its batches first",
                key.1, key.0
            )));
        }
        let tickets = self.usage.tickets();
        if tickets + partitions > caps.tickets {
            return Err(refused(format!(
                "the server holds {tickets} tickets of open batches and this plan asks {partitions} \
                 more, past the limit of {} (max_tickets, --max-tickets); commit or release \
                 batches first",
                caps.tickets
            )));
        }
        let new = u64::from(existing.is_none());
        self.check_plan_budget(tickets + partitions, consumers.len() as u64 + new)?;
        if new == 0 || (consumers.len() as u64) < caps.consumers {
            return Ok(Vec::new());
        }
        let idle: Vec<ConsumerKey> = consumers
            .iter()
            .filter(|(_, c)| c.is_idle(now, self.lease))
            .map(|(k, _)| k.clone())
            .collect();
        if consumers.len() - idle.len() >= caps.consumers as usize {
            return Err(refused(format!(
                "the server holds {} consumers, the limit (max_consumers, --max-consumers); \
                 release consumers that are done, or wait for idle ones to pass their lease",
                consumers.len()
            )));
        }
        for k in &idle {
            consumers.remove(k);
        }
        tracing::info!(
            forgotten = idle.len(),
            "max_consumers reached: forgot the consumers that held nothing and passed their lease"
        );
        Ok(idle)
    }

    /// Refuses a plan that would take the registry past `registry_max_bytes`
    /// with `tickets` tickets and `consumers` consumers besides its messages.
    pub(super) fn check_plan_budget(&self, tickets: u64, consumers: u64) -> Result<()> {
        let (_, bytes) = self.usage.snapshot();
        let plans = tickets * TICKET_COST_BYTES + consumers * CONSUMER_COST_BYTES;
        if bytes.saturating_add(plans) > self.caps.max_bytes {
            return Err(refused(format!(
                "the registry holds {bytes} bytes of messages and {plans} bytes of plans \
                 ({tickets} tickets at {TICKET_COST_BYTES} bytes, {consumers} consumers at \
                 {CONSUMER_COST_BYTES}); \
                 its limit is {} bytes (registry_max_bytes, --registry-max-bytes): commit or \
                 release batches first",
                self.caps.max_bytes
            )));
        }
        Ok(())
    }

    /// Refuses new receives once the registry holds its budget: its
    /// messages, and their bytes with those its tickets are counted at.
    pub fn check_budget(&self) -> Result<()> {
        let (messages, bytes) = self.usage.snapshot();
        let tickets = self.ticket_bytes();
        if messages >= self.caps.max_messages
            || bytes.saturating_add(tickets) >= self.caps.max_bytes
        {
            return Err(Error::ResourceExhausted(format!(
                "the registry holds {messages} uncommitted messages ({bytes} bytes, and \
                 {tickets} bytes counted for the tickets of open batches); its limit is {} \
                 messages (registry_max_messages) or {} bytes (registry_max_bytes): commit or \
                 release batches first",
                self.caps.max_messages, self.caps.max_bytes
            )));
        }
        Ok(())
    }

    /// Bytes the budget counts for the tickets held now, besides their
    /// messages (the receives' check; consumers are counted at plans).
    pub(super) fn ticket_bytes(&self) -> u64 {
        self.usage.tickets() * TICKET_COST_BYTES
    }
}

fn refused(message: String) -> Error {
    Error::ResourceExhausted(message)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqs_flight_schemas::{CommitCommand, PlanCommand, ReleaseCommand};

    use super::*;
    use crate::config::{Config, TableConfig};

    async fn registry(set: impl FnOnce(&mut Config)) -> Arc<Registry> {
        let table = TableConfig::memory("t", 0);
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), vec![table]);
        set(&mut config);
        Registry::build(&config, None).await.unwrap()
    }

    fn plan(consumer: &str, batch: u64, partitions: u64) -> PlanCommand {
        let mut cmd = PlanCommand::new("t", consumer);
        cmd.batch = Some(batch);
        cmd.partitions = Some(partitions);
        cmd
    }

    /// The message of a plan refused with RESOURCE_EXHAUSTED.
    async fn refused(r: &Arc<Registry>, cmd: PlanCommand) -> String {
        match r.plan(&cmd).await {
            Err(Error::ResourceExhausted(m)) => m,
            Err(e) => panic!("refused otherwise: {e}"),
            Ok(_) => panic!("{cmd:?} was planned"),
        }
    }

    fn consumers(r: &Registry) -> Vec<String> {
        r.consumer_status("t").into_keys().collect()
    }

    fn release(consumer: &str) -> ReleaseCommand {
        ReleaseCommand::new("t", consumer)
    }

    #[tokio::test]
    async fn each_cap_refuses_a_plan_naming_its_setting_and_changes_nothing() {
        let r = registry(|c| {
            c.max_open_batches_per_consumer = 2;
            c.max_tickets = 6;
            c.max_consumers = 2;
        })
        .await;
        r.plan(&plan("a", 1, 2)).await.unwrap();
        r.plan(&plan("a", 2, 2)).await.unwrap();
        let m = refused(&r, plan("a", 3, 1)).await;
        assert!(m.contains("max_open_batches_per_consumer"), "{m}");
        assert_eq!(r.consumer_status("t")["a"].open_batches, [1, 2]);
        r.plan(&plan("a", 2, 2))
            .await
            .expect("a plan made earlier is no new batch");

        let m = refused(&r, plan("b", 1, 3)).await;
        assert!(m.contains("max_tickets"), "{m}");
        assert_eq!(consumers(&r), ["a"], "no consumer made");
        r.plan(&plan("b", 1, 2)).await.unwrap();
        assert_eq!(r.usage.tickets(), 6);

        r.release(&release("b")).await.unwrap();
        assert_eq!(r.usage.tickets(), 4, "a release gives its tickets back");
        r.plan(&plan("b", 1, 1)).await.unwrap();
        let m = refused(&r, plan("c", 1, 1)).await;
        assert!(m.contains("max_consumers"), "{m}");
        assert_eq!(consumers(&r), ["a", "b"]);

        r.commit(&CommitCommand::new("t", "a", 2)).await.unwrap();
        assert_eq!(r.usage.tickets(), 1, "a commit gives its tickets back");
        r.plan(&plan("a", 3, 1)).await.unwrap();
    }

    #[tokio::test]
    async fn the_budget_counts_tickets_and_consumers() {
        let r =
            registry(|c| c.registry_max_bytes = 3 * TICKET_COST_BYTES + CONSUMER_COST_BYTES).await;
        r.plan(&plan("a", 1, 3)).await.unwrap();
        let m = refused(&r, plan("a", 2, 1)).await;
        assert!(m.contains("registry_max_bytes"), "{m}");
        let m = refused(&r, plan("b", 1, 1)).await;
        assert!(m.contains("registry_max_bytes"), "{m}");
        assert_eq!(consumers(&r), ["a"]);
        r.check_budget().expect("no message held yet");
        // A kilobyte of messages is a quarter of the budget; with the
        // tickets' three it is all of it.
        r.usage.add(1, CONSUMER_COST_BYTES);
        let m = r.check_budget().unwrap_err().to_string();
        assert!(
            m.contains("registry_max_bytes"),
            "receives count tickets: {m}"
        );
    }

    #[tokio::test]
    async fn an_idle_consumer_past_its_lease_gives_its_place_and_its_series() {
        let scratch = crate::scratch::dir("caps");
        let dir = scratch.path().join("state");
        let r = registry(|c| {
            c.max_consumers = 1;
            c.consumer_lease = Duration::from_secs(5);
            c.state_dir = Some(dir.clone());
        })
        .await;
        r.plan(&plan("a", 1, 1)).await.unwrap();
        r.commit(&CommitCommand::new("t", "a", 1)).await.unwrap();
        let series = r#"consumer="a""#;
        assert!(r.render_metrics().contains(series));
        let m = refused(&r, plan("b", 1, 1)).await;
        assert!(m.contains("max_consumers"), "within its lease: {m}");
        // a's last call, six seconds ago: past its lease.
        let ago = Instant::now().checked_sub(Duration::from_secs(6)).unwrap();
        let key = ("t".to_string(), "a".to_string());
        r.consumers.with(&key, |c| c.seen_at(ago)).unwrap();
        r.plan(&plan("b", 1, 1)).await.unwrap();
        assert_eq!(consumers(&r), ["b"]);
        assert!(!r.render_metrics().contains(series), "a's series are gone");
        drop(r);
        let loaded = super::super::store::Store::open(&dir)
            .unwrap()
            .load()
            .unwrap();
        let names: Vec<_> = loaded.iter().map(|c| c.consumer.as_str()).collect();
        assert_eq!(names, ["b"], "a is gone from the journal too");
    }

    #[tokio::test]
    async fn a_release_leaves_no_journal_entry_and_keeps_the_series_until_an_eviction() {
        let scratch = crate::scratch::dir("release");
        let dir = scratch.path().join("state");
        let r = registry(|c| {
            c.max_consumers = 1;
            c.consumer_lease = Duration::from_secs(5);
            c.state_dir = Some(dir.clone());
        })
        .await;
        let loaded = || {
            let store = r.journal.store().unwrap();
            store
                .load()
                .unwrap()
                .into_iter()
                .map(|c| (c.consumer, c.batches.len()))
                .collect::<Vec<_>>()
        };
        // Released before it committed: nothing of it is kept, but its
        // series are (the dashboard's released-messages panel reads them).
        r.plan(&plan("a", 1, 2)).await.unwrap();
        assert!(r.render_metrics().contains(r#"consumer="a""#));
        r.release(&release("a")).await.unwrap();
        assert!(consumers(&r).is_empty(), "a is forgotten");
        assert_eq!(r.usage.tickets(), 0);
        assert!(loaded().is_empty(), "a is gone from the journal");
        assert!(
            r.render_metrics().contains(r#"consumer="a""#),
            "a's series stay"
        );

        // Released after a commit: kept for its watermark, without its
        // released batch, and with its series, until an eviction.
        r.plan(&plan("b", 1, 1)).await.unwrap();
        r.commit(&CommitCommand::new("t", "b", 1)).await.unwrap();
        r.plan(&plan("b", 2, 2)).await.unwrap();
        r.release(&release("b")).await.unwrap();
        assert_eq!(consumers(&r), ["b"]);
        assert_eq!(loaded(), [("b".to_string(), 0)], "b's batch 2 is gone");
        let series = r#"consumer="b""#;
        assert!(r.render_metrics().contains(series), "b's series stay");
        let ago = Instant::now().checked_sub(Duration::from_secs(6)).unwrap();
        let key = ("t".to_string(), "b".to_string());
        r.consumers.with(&key, |c| c.seen_at(ago)).unwrap();
        r.plan(&plan("c", 1, 1)).await.unwrap();
        assert_eq!(consumers(&r), ["c"], "b gave its place");
        assert!(
            !r.render_metrics().contains(series),
            "b's series went with it"
        );
        assert_eq!(loaded(), [("c".to_string(), 1)]);
        drop(r);
    }

    #[tokio::test(start_paused = true)]
    async fn series_of_released_consumers_go_after_a_while_and_past_max_consumers() {
        use crate::registry::release::RETIRED_SERIES_FOR;
        let r = registry(|c| c.max_consumers = 2).await;
        let has = |name: &str| {
            r.render_metrics()
                .contains(&format!(r#"consumer="{name}""#))
        };
        for name in ["a", "b", "c"] {
            r.plan(&plan(name, 1, 1)).await.unwrap();
            assert!(
                has(name),
                "a scrape while {name} holds a batch makes its series"
            );
            r.release(&release(name)).await.unwrap();
        }
        assert!(consumers(&r).is_empty());
        assert!(
            !has("a"),
            "past max_consumers released ones, the oldest series go"
        );
        assert!(has("b") && has("c"), "the newest stay");

        // One that came back keeps its series when its retirement is due.
        r.plan(&plan("b", 1, 1)).await.unwrap();
        tokio::time::advance(RETIRED_SERIES_FOR - Duration::from_secs(1)).await;
        r.forget_retired(Instant::now());
        assert!(has("b") && has("c"), "not due yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        r.forget_retired(Instant::now());
        assert!(
            !has("c"),
            "c's series went {RETIRED_SERIES_FOR:?} after its release"
        );
        assert!(has("b"), "b plans again: its series stay");
    }
}
