//! Building the registry from the configuration: each table's queue client
//! and, with `--state-dir`, what a previous process left in the store
//! ([`Registry::restore`]).

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use sqs_flight_schemas::TicketId;
use tokio::time::Instant;

use super::journal::Journal;
use super::store::{ChunkMeta, LoadedBatch, LoadedConsumer, Op, Store};
use super::ticket::{ReceivedRows, Ticket};
use super::{Consumer, ConsumerKey, PlannedBatch, Registry, Table};
use crate::config::{Backend, Config, TableConfig};
use crate::error::{Error, Result};
use crate::large_payload::s3::AwsObjectStore;
use crate::metrics::Metrics;
use crate::sqs::aws;
use crate::sqs::metered::MeteredQueue;
use crate::sqs::region::{self, RegionSource};
use crate::sqs::role;
use crate::sqs::{Queue, ReceiptHandle};
use crate::state_log::StateUrl;
use crate::state_log::fenced_queue::FencedQueue;
use crate::state_log::replica::{self, Fence};

/// Why the registry could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The state store could not be opened or read.
    #[error("--state-dir: {0}")]
    State(Error),
    /// The state log could not be read or taken over.
    #[error("--state-url: {0}")]
    StateUrl(Error),
    /// A table's region is malformed.
    #[error("{0}")]
    Region(String),
}

impl Registry {
    /// Builds each table's queue client and the registry. SQS tables use
    /// `client`, or ones built from the standard AWS chain when it is `None`
    /// (one per region: see [`crate::sqs::region`]). With `config.state_dir`,
    /// the registry is restored from its store (and written to it from then
    /// on); without it, it lives in memory only.
    pub async fn build(
        config: &Config,
        client: Option<aws_sdk_sqs::Client>,
    ) -> Result<Arc<Registry>, BuildError> {
        Self::build_with_s3(config, client, None).await
    }

    /// [`Registry::build`], the S3 calls of large payloads made with `s3`'s
    /// credentials and region (the standard AWS chain when `None`).
    pub async fn build_with_s3(
        config: &Config,
        client: Option<aws_sdk_sqs::Client>,
        s3: Option<aws_config::SdkConfig>,
    ) -> Result<Arc<Registry>, BuildError> {
        let metrics = Arc::new(Metrics::new());
        let fence = Arc::new(Fence::default());
        let fenced = config.state_url.as_ref().map(|_| &fence);
        let tables = tables(config, client, s3, &metrics, fenced).await?;
        let mut registry = Registry::new(config, tables, metrics);
        match (&config.state_dir, &config.state_url) {
            (dir, Some(url)) => {
                let store = take_over(config, dir.as_deref(), url, fence)
                    .await
                    .map_err(BuildError::StateUrl)?;
                let restored = registry.restore(store).map_err(BuildError::StateUrl)?;
                tracing::info!(state_url = %url, consumers = restored.consumers,
                    batches = restored.batches, messages = restored.messages,
                    "durable registry: restored open batches from the state log; every plan, receive and commit is written to it before it is acted on");
            }
            (Some(dir), None) => {
                let store = Store::open(dir).map_err(BuildError::State)?;
                let restored = registry.restore(store).map_err(BuildError::State)?;
                tracing::info!(state_dir = %dir.display(), consumers = restored.consumers,
                    batches = restored.batches, messages = restored.messages,
                    "durable registry: restored open batches; every plan, receive and commit is written before it is acted on");
            }
            (None, None) => tracing::warn!(
                "no --state-dir: the registry is in memory only; if this process dies, uncommitted \
                 batches cannot be replayed or committed and their messages are read again after \
                 their visibility timeout (duplicates, never loss)"
            ),
        }
        Ok(Arc::new(registry))
    }

    /// Brings back what a previous process left in `store`: watermarks,
    /// open batches with their rows and receipts (replayed as they were),
    /// and pending deletes. Every later change is written to the store.
    fn restore(&mut self, mut store: Store) -> Result<Restored> {
        let loaded = store.load()?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let committed = store.load_committed(now_ms)?;
        store.compact();
        self.restore_committed_ids(&committed, now_ms);
        let clock = RestoreClock {
            now: Instant::now(),
            now_ms,
        };
        let mut restored = Restored::default();
        let mut max_plan = 0;
        let (mut forgotten, mut ahead_ops) = (Vec::new(), Vec::new());
        for mut lc in loaded {
            if !self.tables.contains_key(&lc.table) {
                tracing::warn!(table = %lc.table, consumer = %lc.consumer, batches = lc.batches.len(),
                    "state store names a table this server does not serve; its messages reappear in SQS after their visibility timeout");
                continue;
            }
            give_back_restored_ahead(&mut lc, &mut ahead_ops);
            let plans = lc.batches.iter().map(|lb| lb.stored.plan);
            max_plan = plans.fold(max_plan, u64::max);
            let (key, c) = self.restored_consumer(lc, clock, &mut restored);
            if c.is_empty() {
                // Released before it committed anything, by a server that
                // left its entry behind: dropped from the store too.
                forgotten.push(key);
                continue;
            }
            restored.consumers += 1;
            self.consumers.get_mut().insert(key, c);
        }
        write_restore_ops(&store, &ahead_ops, &forgotten);
        if max_plan >= *self.next_plan.get_mut() {
            *self.next_plan.get_mut() = max_plan + 1;
        }
        self.journal = Journal::Durable(Arc::new(store));
        Ok(restored)
    }

    /// Puts the ids that commits deleted, as the store kept them
    /// (table, until when in Unix ms, id), back into their tables' held
    /// ids for what is left of their committed window.
    fn restore_committed_ids(&self, committed: &[(String, u64, u128)], now_ms: u64) {
        for (name, table) in &self.tables {
            let left = committed.iter().filter(|(t, _, _)| t == name);
            table.dedup().restore_committed(
                left.map(|(_, until_ms, k)| (Duration::from_millis(until_ms - now_ms), *k)),
            );
        }
    }

    /// One consumer as the store kept it, with its open batches; counts
    /// them and their messages in `restored`.
    fn restored_consumer(
        &mut self,
        lc: LoadedConsumer,
        clock: RestoreClock,
        restored: &mut Restored,
    ) -> (ConsumerKey, Consumer) {
        let mut c = Consumer::restored(lc.state);
        if c.has_restored_rejects() {
            *self.restored_rejects.get_mut() = true;
        }
        let key = (lc.table, lc.consumer);
        for lb in lc.batches {
            let planned = self.restored_batch(&key, lb, clock, &mut restored.messages);
            c.add_batch(Arc::new(planned), &self.usage);
            restored.batches += 1;
        }
        (key, c)
    }

    /// One open batch of consumer `key` as the store kept it: its tickets
    /// hold their rows and receipts as they were, and are in the table's
    /// held ids. Counts its messages in `messages`.
    fn restored_batch(
        &self,
        key: &ConsumerKey,
        lb: LoadedBatch,
        clock: RestoreClock,
        messages: &mut u64,
    ) -> PlannedBatch {
        let (table, consumer) = key;
        let dedup = self.tables[table].dedup();
        let tickets: Vec<Arc<Ticket>> = lb
            .tickets
            .into_iter()
            .enumerate()
            .map(|(partition, lt)| {
                let id = TicketId {
                    table: table.clone(),
                    consumer: consumer.clone(),
                    batch: lb.batch,
                    partition: partition as u32,
                    plan: lb.stored.plan,
                };
                let chunks: Vec<ReceivedRows> = lt
                    .chunks
                    .into_iter()
                    .map(|chunk| clock.received(chunk))
                    .collect();
                *messages += chunks.iter().map(|c| c.receipts.len() as u64).sum::<u64>();
                let t = Ticket::restored(id, Arc::clone(&self.usage), chunks, lt.sealed);
                let t = Arc::new(t.with_dedup(Arc::clone(dedup)));
                dedup.adopt(&t, &t.keys());
                t
            })
            .collect();
        PlannedBatch {
            batch: lb.batch,
            plan: lb.stored.plan,
            params: lb.stored.params(),
            tickets,
        }
    }
}

/// When a restore runs, on the wall clock (the store's visibility
/// deadlines are in Unix ms) and on the monotonic clock tickets use.
#[derive(Clone, Copy)]
struct RestoreClock {
    now: Instant,
    now_ms: u64,
}

impl RestoreClock {
    /// One receive's rows as the store kept them, their visibility
    /// deadline moved to the monotonic clock.
    fn received(&self, (rows, meta): (RecordBatch, ChunkMeta)) -> ReceivedRows {
        let left = meta.visible_until_ms.saturating_sub(self.now_ms);
        let receipts = meta.receipts.into_iter().map(ReceiptHandle::new);
        ReceivedRows {
            rows,
            receipts: receipts.collect(),
            objects: meta.objects,
            bytes: meta.bytes,
            visible_until: self.now + Duration::from_millis(left),
        }
    }
}

/// Writes what a restore decided: the batches the previous process read
/// ahead are given back (`ahead_ops`), the `forgotten` consumers dropped.
/// A failure is logged: the next start does it again.
fn write_restore_ops(store: &Store, ahead_ops: &[Op], forgotten: &[ConsumerKey]) {
    if let Err(e) = store.write(ahead_ops) {
        tracing::warn!(error = %e,
            "could not write that batches read ahead by the previous process are given back; the next start gives them back again");
    }
    if let Err(e) = store.write(&super::plan::drop_ops(forgotten)) {
        tracing::warn!(error = %e, consumers = forgotten.len(),
            "could not drop released consumers from the state store; they are skipped again at the next start");
    }
}

/// What [`Registry::restore`] brought back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Restored {
    consumers: usize,
    batches: usize,
    messages: u64,
}

/// The store of `--state-url`: the state log read into the store of `dir`
/// (or of a private directory of its own), and taken over.
async fn take_over(
    config: &Config,
    dir: Option<&std::path::Path>,
    url: &str,
    fence: Arc<Fence>,
) -> Result<Store> {
    let parsed = StateUrl::parse(url).map_err(Error::InvalidArgument)?;
    let store = match dir {
        Some(dir) => Store::open(dir)?,
        None => Store::open_scratch()?,
    };
    let retries = aws::Retries::new(config.sqs_max_attempts);
    let role = config
        .state_url_role()
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let endpoint = s3_endpoint(config);
    let objects = replica::objects(&parsed, endpoint.as_deref(), role.as_ref(), retries).await;
    let replica = replica::take_over(objects, &store, fence).await?;
    store.attach(replica);
    Ok(store)
}

/// The configured tables, each on its queue, counted in `metrics`; with
/// `fence`, a queue that changes nothing in SQS once it is up.
async fn tables(
    config: &Config,
    client: Option<aws_sdk_sqs::Client>,
    s3: Option<aws_config::SdkConfig>,
    metrics: &Arc<Metrics>,
    fence: Option<&Arc<Fence>>,
) -> Result<Vec<Arc<Table>>, BuildError> {
    let mut clients = sqs_clients(config, client).await;
    let s3 = s3_config(config, s3).await;
    let s3_endpoint = s3_endpoint(config);
    let mut tables = Vec::with_capacity(config.tables.len());
    for t in &config.tables {
        // The queue, and the region its calls (and its S3 calls) sign for.
        let (queue, region) = table_queue(t, clients.as_mut()).await?;
        let mut queue: Arc<dyn Queue> =
            Arc::new(MeteredQueue::new(queue, &t.name, Arc::clone(metrics)));
        if let Some(fence) = fence {
            queue = Arc::new(FencedQueue::new(queue, Arc::clone(fence)));
        }
        let mut table = Table::new(t.clone(), queue)
            .with_bulk_concurrency(config.sqs_batch_concurrency)
            .with_dedup_window(config.dedup_window, config.dedup_window_ids);
        if let Some(shared) = s3.as_ref().filter(|_| t.large_payloads.is_some()) {
            let retries = aws::Retries::new(config.sqs_max_attempts);
            let endpoint = s3_endpoint.as_deref();
            let shared = table_s3_config(t, shared, region.as_deref(), retries).await;
            let store = AwsObjectStore::new(&shared, region.as_deref(), endpoint, retries);
            table = table.with_object_store(Arc::new(store));
        }
        tables.push(Arc::new(table));
    }
    Ok(tables)
}

/// The SQS clients, when a table is on SQS: from `client`, else from the
/// standard AWS chain.
async fn sqs_clients(config: &Config, client: Option<aws_sdk_sqs::Client>) -> Option<aws::Clients> {
    let needs_sqs = config
        .tables
        .iter()
        .any(|t| matches!(t.backend, Backend::Sqs { .. }));
    let cap = config.sqs_max_connections as usize;
    let retries = aws::Retries::new(config.sqs_max_attempts);
    match (needs_sqs, client) {
        (true, Some(c)) => Some(aws::Clients::given(c, cap, retries)),
        (true, None) => {
            Some(aws::Clients::load(config.sqs_endpoint.as_deref(), retries, cap).await)
        }
        (false, _) => None,
    }
}

/// The AWS configuration of table `t`'s S3 calls: `shared`, with the
/// credentials of the table's role when it has one (STS in `region`).
async fn table_s3_config(
    t: &TableConfig,
    shared: &aws_config::SdkConfig,
    region: Option<&str>,
    retries: aws::Retries,
) -> aws_config::SdkConfig {
    match &t.role {
        Some(role) => {
            let role = role::TableRole {
                table: &t.name,
                role,
            };
            role::assume(shared, role, region, retries).await
        }
        None => shared.clone(),
    }
}

/// The AWS configuration of large payloads' S3 calls, when a table reads
/// them: `s3`, else the AWS chain loaded once more, without the SQS
/// endpoint (an S3-compatible server is `s3_endpoint`'s).
async fn s3_config(
    config: &Config,
    s3: Option<aws_config::SdkConfig>,
) -> Option<aws_config::SdkConfig> {
    if !config.tables.iter().any(|t| t.large_payloads.is_some()) {
        return None;
    }
    Some(match s3 {
        Some(given) => given,
        None => {
            aws_config::defaults(aws_config::BehaviorVersion::latest())
                .load()
                .await
        }
    })
}

/// The queue of table `t`, and the region its calls sign for (`None` for
/// an in-memory queue).
async fn table_queue(
    t: &TableConfig,
    clients: Option<&mut aws::Clients>,
) -> Result<(Arc<dyn Queue>, Option<String>), BuildError> {
    match (&t.backend, clients) {
        (Backend::Sqs { queue_url, region }, Some(clients)) => {
            sqs_queue(t, queue_url, region.as_deref(), clients).await
        }
        (
            Backend::Memory {
                sample_messages,
                rtt,
            },
            _,
        ) => Ok((
            Arc::new(crate::demo::seeded_queue(&t.name, *sample_messages).with_rtt(*rtt)),
            None,
        )),
        (Backend::Sqs { .. }, None) => unreachable!("clients built for SQS tables"),
    }
}

/// Where large payloads' S3 calls go: `s3_endpoint`, else the AWS SDKs'
/// own variable for it, `AWS_ENDPOINT_URL_S3` (both path-style, as
/// S3-compatible servers need), else S3's endpoint for the region.
fn s3_endpoint(config: &Config) -> Option<String> {
    config.s3_endpoint.clone().or_else(|| {
        std::env::var(S3_ENDPOINT_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty())
    })
}

/// The AWS SDKs' variable for the S3 endpoint.
pub(super) const S3_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_S3";

/// The queue of table `t`, with the client of its region (its own
/// `region`, else the one its queue URL names, else the AWS chain's) and
/// of its role; and that region.
async fn sqs_queue(
    t: &TableConfig,
    queue_url: &str,
    region: Option<&str>,
    clients: &mut aws::Clients,
) -> Result<(Arc<dyn Queue>, Option<String>), BuildError> {
    let name = t.name.as_str();
    let chosen = region::table_region(region, queue_url)
        .map_err(|e| BuildError::Region(format!("tables.{name}.region: {e}")))?;
    let (region, source) = match chosen {
        Some((region, source)) => (Some(region), source),
        None => (clients.default_region(), RegionSource::Environment),
    };
    match &region {
        Some(r) => tracing::info!(table = %name, region = %r, from = %source, "SQS region"),
        None => tracing::error!(table = %name, queue_url,
            "no AWS region for this table: its queue URL names none and neither AWS_REGION nor \
             the AWS profile sets one; its reads fail until `region` is set in its config or \
             AWS_REGION in the environment"),
    }
    let role = t
        .role
        .as_ref()
        .map(|role| role::TableRole { table: name, role });
    let queue = clients.queue(region.as_deref(), queue_url, role).await;
    Ok((Arc::new(queue), region))
}

/// Takes the batches a previous process received ahead (see
/// [`super::ahead`]) off `lc`: nobody planned them, so their receipts are
/// given back at visibility 0 by the heartbeat, as rejects of that process
/// are; `ops` gets the store's record of it.
fn give_back_restored_ahead(lc: &mut LoadedConsumer, ops: &mut Vec<Op>) {
    let (ahead, planned) = std::mem::take(&mut lc.batches)
        .into_iter()
        .partition::<Vec<_>, _>(|b| b.stored.ahead);
    lc.batches = planned;
    if ahead.is_empty() {
        return;
    }
    let receipts: Vec<String> = ahead
        .iter()
        .flat_map(|b| &b.tickets)
        .flat_map(|t| &t.chunks)
        .flat_map(|(_, meta)| meta.receipts.iter().cloned())
        .collect();
    tracing::info!(table = %lc.table, consumer = %lc.consumer, messages = receipts.len(),
        "giving back the batch received ahead by the previous process");
    if !receipts.is_empty() {
        lc.state.pending_reject.push(super::store::StoredReject {
            delay_seconds: 0,
            receipts,
            read_ahead: true,
        });
    }
    ops.extend(ahead.iter().map(|b| Op::Forget {
        table: lc.table.clone(),
        consumer: lc.consumer.clone(),
        batch: b.batch,
    }));
    ops.push(Op::Consumer {
        table: lc.table.clone(),
        consumer: lc.consumer.clone(),
        state: lc.state.clone(),
    });
}
