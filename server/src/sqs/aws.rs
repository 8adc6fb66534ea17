//! [`Queue`] over aws-sdk-sqs, for Amazon SQS and compatible servers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry,
    DeleteMessageBatchRequestEntry, Message, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use base64::Engine;
use futures::FutureExt;
use futures::future::BoxFuture;
use sqs_flight_schemas::SqsMessage;

use super::congestion::{Congestion, Observer};
use super::role::{Assumed, TableRole};
use super::{
    BatchOutcome, FailedEntry, OutgoingMessage, Queue, QueueAttributes, ReceiptHandle,
    ReceiveRequest, Received, STRING_ATTRIBUTE, SqsError,
};
use crate::config::RoleConfig;

/// First pause before a retry; it doubles with each attempt (then full
/// jitter: the SDK sleeps a random share of it).
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between two attempts of one call.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How SQS calls are retried: throttling, 5xx answers and connection errors
/// get up to `max_attempts` attempts with capped exponential backoff and
/// jitter (the SDK's standard mode); other errors are not retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retries {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Retries {
    /// `max_attempts` (at least 1) with the built-in backoff.
    pub(crate) fn new(max_attempts: u32) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            initial_backoff: INITIAL_BACKOFF,
            max_backoff: MAX_BACKOFF,
        }
    }
}

impl Default for Retries {
    fn default() -> Self {
        Self::new(crate::config::DEFAULT_SQS_MAX_ATTEMPTS)
    }
}

/// Applies `retries` to an SQS client configuration. The client gets its own
/// retry partition with an unlimited token bucket: the budget of a call is
/// its attempts and nothing else, so a burst of failures elsewhere never
/// turns the retries of later calls off (the server's calls are few and
/// bounded in concurrency, so they cannot storm).
pub fn retrying(
    builder: aws_sdk_sqs::config::Builder,
    retries: Retries,
) -> aws_sdk_sqs::config::Builder {
    let (config, partition, timeouts) = retries.settings();
    builder
        .retry_config(config)
        .retry_partition(partition)
        .timeout_config(timeouts)
}

impl Retries {
    /// The SDK settings of these retries (any AWS client takes them: the S3
    /// calls of large payloads retry as SQS calls do).
    pub(crate) fn settings(self) -> (RetryConfig, RetryPartition, TimeoutConfig) {
        let retries = self;
        let config = RetryConfig::standard()
            .with_max_attempts(retries.max_attempts.max(1))
            .with_initial_backoff(retries.initial_backoff)
            .with_max_backoff(retries.max_backoff);
        let partition = RetryPartition::custom("sqs-flight")
            .token_bucket(TokenBucket::unlimited())
            .build();
        // Each attempt is bounded: a connection that stalls must end in a retry,
        // not hang a read or a commit. ReceiveMessage long-polls up to 20 s.
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
            .build();
        (config, partition, timeouts)
    }
}

/// Bound on opening a connection to SQS.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one attempt of any SQS call: the longest long poll (20 s) plus
/// a margin for a slow answer.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(35);

/// The SQS clients of a server's tables: one per region and role, all
/// from the AWS configuration loaded once (credentials, retries; the SQS
/// endpoint set on each client, so that STS never inherits it), or one
/// given client for every table. Each region's endpoint has its
/// [`Congestion`] window of at most `cap` calls in flight
/// (`sqs_max_connections`), which every queue of that region shares,
/// whatever its role.
pub(crate) struct Clients {
    base: Base,
    cap: usize,
    retries: Retries,
    /// Each region's window (by region; `""`: none).
    windows: HashMap<String, Arc<Congestion>>,
    /// The clients built, by region and role.
    built: HashMap<ClientKey, Endpoint>,
}

/// What tells two clients apart: the region they sign for and the role
/// (with its session name) their credentials come from.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ClientKey {
    region: String,
    role: Option<RoleConfig>,
}

impl ClientKey {
    /// The key of a client of `region` and of `role`, whose session name
    /// is part of it: two tables' default sessions differ.
    fn new(region: Option<String>, role: Option<TableRole<'_>>) -> Self {
        Self {
            region: region.unwrap_or_default(),
            role: role.map(|r| RoleConfig {
                session_name: Some(r.role.session_name(r.table)),
                ..r.role.clone()
            }),
        }
    }
}

/// The settings of an SQS client of `config`, calling `endpoint` if set
/// (else the SDK's: `AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`, AWS's).
fn sqs_builder(
    config: &aws_config::SdkConfig,
    endpoint: Option<&str>,
) -> aws_sdk_sqs::config::Builder {
    let builder = aws_sdk_sqs::config::Builder::from(config);
    match endpoint {
        Some(endpoint) => builder.endpoint_url(endpoint),
        None => builder,
    }
}

/// One client and the window its calls share.
#[derive(Clone)]
struct Endpoint {
    client: Client,
    congestion: Arc<Congestion>,
}

impl Endpoint {
    /// `builder`'s client, its attempts observed by `congestion`.
    fn new(builder: aws_sdk_sqs::config::Builder, congestion: Arc<Congestion>) -> Self {
        let config = builder
            .interceptor(Observer(Arc::clone(&congestion)))
            .build();
        Self {
            client: Client::from_conf(config),
            congestion,
        }
    }
}

enum Base {
    /// The standard AWS chain, and the SQS endpoint its clients call.
    Loaded {
        shared: Box<aws_config::SdkConfig>,
        endpoint: Option<String>,
    },
    /// The given client, observed, with its window; a table with a role
    /// gets its settings with the role's credentials, STS being called
    /// with the standard AWS chain (`chain`, loaded when first needed).
    Given {
        given: Endpoint,
        /// The given client's settings, before they were observed.
        settings: Box<aws_sdk_sqs::Config>,
        chain: Option<Box<aws_config::SdkConfig>>,
    },
}

impl Clients {
    /// Loads the standard AWS chain; `endpoint` is the SQS calls' endpoint
    /// (set on each SQS client, not on the chain: STS must not get it); at
    /// most `cap` calls in flight per region.
    pub(crate) async fn load(endpoint: Option<&str>, retries: Retries, cap: usize) -> Self {
        let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        let base = Base::Loaded {
            shared: Box::new(shared),
            endpoint: endpoint.map(str::to_string),
        };
        Self::with_base(base, retries, cap)
    }

    /// `client` for every table, whatever its region, with its attempts
    /// observed and at most `cap` calls in flight.
    pub(crate) fn given(client: Client, cap: usize, retries: Retries) -> Self {
        let settings = Box::new(client.config().clone());
        let given = Endpoint::new(settings.to_builder(), Congestion::new(cap));
        let base = Base::Given {
            given,
            settings,
            chain: None,
        };
        Self::with_base(base, retries, cap)
    }

    fn with_base(base: Base, retries: Retries, cap: usize) -> Self {
        Self {
            base,
            cap,
            retries,
            windows: HashMap::new(),
            built: HashMap::new(),
        }
    }

    /// The region of the standard AWS chain (`AWS_REGION`,
    /// `AWS_DEFAULT_REGION`, the profile), if it names one.
    pub(crate) fn default_region(&self) -> Option<String> {
        let region = match &self.base {
            Base::Loaded { shared, .. } => shared.region(),
            Base::Given { given, .. } => given.client.config().region(),
        };
        region.map(|r| r.to_string()).filter(|r| !r.is_empty())
    }

    /// The queue at `url`, on the client that signs for `region` (the
    /// chain's when `None`) with the credentials of `role` (the chain's
    /// when `None`), built once per region and role, sharing its region's
    /// window.
    pub(crate) async fn queue(
        &mut self,
        region: Option<&str>,
        url: &str,
        role: Option<TableRole<'_>>,
    ) -> AwsQueue {
        let endpoint = self.endpoint(region, role).await;
        let queue =
            AwsQueue::new(endpoint.client, url.to_string()).with_congestion(endpoint.congestion);
        match role {
            Some(r) => queue.with_role(Assumed::of(r.role, r.table)),
            None => queue,
        }
    }

    async fn endpoint(&mut self, region: Option<&str>, role: Option<TableRole<'_>>) -> Endpoint {
        let region = region.map(str::to_string).or_else(|| self.default_region());
        let key = ClientKey::new(region.clone(), role);
        if let Some(built) = self.built.get(&key) {
            return built.clone();
        }
        let mut builder = match (role, &self.base) {
            (Some(role), _) => self.role_builder(region.as_deref(), role).await,
            (None, Base::Given { given, .. }) => return given.clone(),
            (None, Base::Loaded { shared, endpoint }) => sqs_builder(shared, endpoint.as_deref()),
        };
        // Set or cleared: an empty AWS_REGION is no region.
        builder.set_region(region.map(aws_sdk_sqs::config::Region::new));
        let window = self.window(&key.region);
        let endpoint = Endpoint::new(retrying(builder, self.retries), window);
        self.built.insert(key, endpoint.clone());
        endpoint
    }

    /// The settings of an SQS client whose credentials are `role`'s.
    async fn role_builder(
        &mut self,
        region: Option<&str>,
        role: TableRole<'_>,
    ) -> aws_sdk_sqs::config::Builder {
        let retries = self.retries;
        match &mut self.base {
            Base::Loaded { shared, endpoint } => {
                let assumed = super::role::assume(shared, role, region, retries).await;
                sqs_builder(&assumed, endpoint.as_deref())
            }
            Base::Given {
                settings, chain, ..
            } => {
                if chain.is_none() {
                    let loaded = aws_config::defaults(aws_config::BehaviorVersion::latest())
                        .load()
                        .await;
                    *chain = Some(Box::new(loaded));
                }
                let chain = chain.as_deref().expect("loaded above");
                let assumed = super::role::assume(chain, role, region, retries).await;
                let mut builder = settings.to_builder();
                builder.set_credentials_provider(assumed.credentials_provider());
                builder
            }
        }
    }

    /// The window of `region`'s endpoint (the given client's, if given).
    fn window(&mut self, region: &str) -> Arc<Congestion> {
        if let Base::Given { given, .. } = &self.base {
            return Arc::clone(&given.congestion);
        }
        let cap = self.cap;
        let window = self.windows.entry(region.to_string());
        Arc::clone(window.or_insert_with(|| Congestion::new(cap)))
    }
}

/// One queue, by URL.
pub struct AwsQueue {
    client: Client,
    url: String,
    /// Why no call can be made (no region to sign for), if so.
    unusable: Option<SqsError>,
    /// The window of calls in flight its endpoint allows, shared with the
    /// other queues on the same client (none: calls are not held back).
    congestion: Option<Arc<Congestion>>,
    /// The role its client's credentials come from, if any: what a failure
    /// to load them names.
    role: Option<Assumed>,
}

impl AwsQueue {
    pub fn new(client: Client, url: String) -> Self {
        let unusable = client
            .config()
            .region()
            .is_none_or(|r| r.as_ref().is_empty())
            .then(|| SqsError::Region {
                message: format!(
                    "the queue URL {url} names no AWS region and the server has none configured; \
                     set AWS_REGION (or a region in the AWS profile) in the server's environment, \
                     or `region` in the table's configuration"
                ),
            });
        Self {
            client,
            url,
            unusable,
            congestion: None,
            role: None,
        }
    }

    /// The same queue, its client's credentials being `role`'s: a call
    /// whose credentials cannot be loaded fails naming it.
    pub(crate) fn with_role(mut self, role: Assumed) -> Self {
        self.role = Some(role);
        self
    }

    /// The same queue, each call holding a place in `congestion` (the
    /// window of the endpoint its client calls; see [`Congestion`]).
    pub(crate) fn with_congestion(mut self, congestion: Arc<Congestion>) -> Self {
        self.congestion = Some(congestion);
        self
    }

    /// `call`, unless the queue cannot be called (then its reason, at
    /// once); within the endpoint's window when it has one.
    fn run<'a, T: Send + 'a>(
        &'a self,
        call: impl Future<Output = Result<T, SqsError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, SqsError>> {
        let call = call.map(|r| r.map_err(|e| self.naming_role(e)));
        match (&self.unusable, &self.congestion) {
            (Some(e), _) => futures::future::ready(Err(e.clone())).boxed(),
            (None, Some(window)) => window.run(call).boxed(),
            (None, None) => call.boxed(),
        }
    }

    /// `err`, naming the queue's role when its credentials could not be
    /// loaded: with a role they come from STS AssumeRole alone.
    fn naming_role(&self, err: SqsError) -> SqsError {
        match (err, &self.role) {
            (SqsError::Identity { role: None, reason }, Some(role)) => SqsError::Identity {
                role: Some(role.clone()),
                reason,
            },
            (err, _) => err,
        }
    }
}

/// Error codes that mean the credentials, not the request, are wrong.
const CREDENTIAL_CODES: &[&str] = &[
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "AccessDenied",
    "AccessDeniedException",
    "SignatureDoesNotMatch",
    "MissingAuthenticationToken",
    "ExpiredToken",
    "InvalidSecurity",
];

/// Error codes of a queue that does not exist.
const NO_QUEUE_CODES: &[&str] = &[
    "QueueDoesNotExist",
    "AWS.SimpleQueueService.NonExistentQueue",
];

/// Codes SQS answers a call signed for another region than the queue's
/// with ("The address https://sqs.REGION.amazonaws.com/ is not valid for
/// this endpoint").
const WRONG_REGION_CODES: &[&str] = &["InvalidAddress", "AWS.SimpleQueueService.InvalidAddress"];

/// Codes of calls SQS may take later (throttling, too many messages in
/// flight, timeouts): the sender's fault in SQS's terms, but past the
/// retries they mean "try later", not "bad request".
const RETRY_LATER_CODES: &[&str] = &[
    "RequestThrottled",
    "ThrottlingException",
    "Throttling",
    "KmsThrottled",
    "KMS.ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "SlowDown",
    "OverLimit",
    "RequestTimeout",
];

fn sqs_error<E>(operation: &'static str, err: SdkError<E, HttpResponse>) -> SqsError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    if let Some(reason) = credentials_not_loaded(&err) {
        return SqsError::Identity { role: None, reason };
    }
    let message = err
        .message()
        .map(str::to_string)
        .unwrap_or_else(|| error_chain(&err));
    let status = err.raw_response().map(|r| r.status().as_u16());
    let answer = Answer {
        code: err.code().map(str::to_string),
        message,
        // A 400 answer, or one SQS marks as the sender's fault (the
        // `x-amzn-query-error: CODE;Sender` header), refuses the request itself.
        sender_fault: err.meta().extra("type") == Some("Sender") || status == Some(400),
        status,
    };
    answer.into_error(operation)
}

/// Why the call's credentials could not be loaded, if that is why it
/// failed: the SDK then sends nothing and fails it as a dispatch failure
/// (neither a connection error nor a timeout of the call) whose chain
/// names the credentials provider's error, or the identity cache's time
/// out loading it.
pub(crate) fn credentials_not_loaded<E>(err: &SdkError<E, HttpResponse>) -> Option<String>
where
    E: std::error::Error + 'static,
{
    let SdkError::DispatchFailure(failure) = err else {
        return None;
    };
    if failure.is_io() || failure.is_timeout() {
        return None;
    }
    let chain = error_chain(err).to_ascii_lowercase();
    let names_identity = chain.contains("credentials") || chain.contains("identity resolver");
    names_identity.then(|| super::role::sts_reason(err))
}

/// Whether an SDK error's text is its refusal to call without a region:
/// `Invalid Configuration: Missing Region` (AWS endpoints), `missing
/// signing region` (a custom endpoint).
fn names_missing_region(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("missing region") || lower.contains("missing signing region")
}

/// What a failed SQS call came back with.
struct Answer {
    code: Option<String>,
    message: String,
    sender_fault: bool,
    /// The HTTP status, if an answer came at all.
    status: Option<u16>,
}

impl Answer {
    fn into_error(self, operation: &'static str) -> SqsError {
        let Answer {
            code,
            message,
            sender_fault,
            status,
        } = self;
        match code {
            Some(code) if CREDENTIAL_CODES.contains(&code.as_str()) => SqsError::Credentials {
                message: format!("{code}: {message}"),
            },
            Some(code) if WRONG_REGION_CODES.contains(&code.as_str()) => SqsError::Region {
                message: format!(
                    "{code}: {message}; the queue is not in the region its calls are signed for: \
                     set the table's `region` (or AWS_REGION) to the queue's region"
                ),
            },
            Some(code) if NO_QUEUE_CODES.contains(&code.as_str()) => {
                SqsError::NoQueue { code, message }
            }
            Some(code)
                if sender_fault
                    && !RETRY_LATER_CODES.contains(&code.as_str())
                    && !super::congestion::THROTTLING_CODES.contains(&code.as_str()) =>
            {
                SqsError::Refused {
                    operation,
                    code,
                    message,
                }
            }
            Some(code) => SqsError::Service {
                operation,
                code,
                message,
            },
            None if message.contains("credentials") => SqsError::Credentials { message },
            // The SDK's own refusal to call without a region (a client
            // built without one): configuration, not a fault to retry.
            None if names_missing_region(&message) => SqsError::Region {
                message: format!(
                    "{message}: set AWS_REGION in the server's environment, or `region` in the \
                     table's configuration"
                ),
            },
            // An answer without an error code (a proxy's or an emulator's 503,
            // say): its HTTP status is all there is to tell; no answer at all
            // is what "Unreachable" means.
            None => SqsError::Service {
                operation,
                code: match status {
                    Some(status) => format!("HTTP {status}"),
                    None => "Unreachable".to_string(),
                },
                message,
            },
        }
    }
}

/// "a: b: c" from an error and its sources, without Rust debug output.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// Runs one batch call (delete, change visibility, send) and reads its
/// answer; `parts` splits it into the indexes of the `Successful` entries
/// and the `Failed` ones (entry ids are indexes into the request).
async fn batch_outcome<O, E>(
    operation: &'static str,
    call: impl Future<Output = Result<O, SdkError<E, HttpResponse>>>,
    parts: impl FnOnce(O) -> (Vec<usize>, Vec<BatchResultErrorEntry>),
) -> Result<BatchOutcome, SqsError>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let out = call.await.map_err(|e| sqs_error(operation, e))?;
    let (succeeded, failed) = parts(out);
    let failed = failed
        .into_iter()
        .filter_map(|f| {
            Some(FailedEntry {
                index: f.id.parse().ok()?,
                code: f.code,
                sender_fault: f.sender_fault,
            })
        })
        .collect();
    Ok(BatchOutcome { succeeded, failed })
}

fn indexes<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<usize> {
    ids.filter_map(|id| id.parse().ok()).collect()
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

impl Queue for AwsQueue {
    fn receive(&self, req: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
        #[allow(deprecated)] // moto reads only the older AttributeNames
        let call = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(req.max_messages as i32)
            .wait_time_seconds(secs(req.wait))
            .visibility_timeout(secs(req.visibility_timeout))
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .attribute_names(QueueAttributeName::All)
            .message_attribute_names("All");
        let call = async move {
            let out = call
                .send()
                .await
                .map_err(|e| sqs_error("ReceiveMessage", e))?;
            Ok(out
                .messages
                .unwrap_or_default()
                .into_iter()
                .filter_map(convert)
                .collect())
        };
        self.run(call)
    }

    fn delete_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        let entries = receipts
            .iter()
            .enumerate()
            .map(|(i, r)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r.expose())
                    .build()
                    .expect("id and receipt handle are set")
            })
            .collect();
        let call = self
            .client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries));
        self.run(batch_outcome("DeleteMessageBatch", call.send(), |o| {
            (
                indexes(o.successful.iter().map(|s| s.id.as_str())),
                o.failed,
            )
        }))
    }

    fn change_visibility_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        let entries = receipts
            .iter()
            .enumerate()
            .map(|(i, r)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r.expose())
                    .visibility_timeout(secs(timeout))
                    .build()
                    .expect("id and receipt handle are set")
            })
            .collect();
        let call = self
            .client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries));
        self.run(batch_outcome(
            "ChangeMessageVisibilityBatch",
            call.send(),
            |o| {
                (
                    indexes(o.successful.iter().map(|s| s.id.as_str())),
                    o.failed,
                )
            },
        ))
    }

    fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        let entries = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let mut e = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(m.body)
                    .set_message_group_id(m.message_group_id)
                    .set_message_deduplication_id(m.message_deduplication_id)
                    .set_delay_seconds(m.delay_seconds);
                for (name, value) in m.attributes {
                    let v = MessageAttributeValue::builder()
                        .data_type(STRING_ATTRIBUTE)
                        .string_value(value)
                        .build()
                        .expect("data type is set");
                    e = e.message_attributes(name, v);
                }
                if let Some(size) = m.payload_size {
                    let v = MessageAttributeValue::builder()
                        .data_type(crate::large_payload::NUMBER_ATTRIBUTE)
                        .string_value(size.to_string())
                        .build()
                        .expect("data type is set");
                    e = e.message_attributes(crate::large_payload::RESERVED_ATTRIBUTE, v);
                }
                e.build().expect("id and body are set")
            })
            .collect();
        let call = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries));
        self.run(batch_outcome("SendMessageBatch", call.send(), |o| {
            (
                indexes(o.successful.iter().map(|s| s.id.as_str())),
                o.failed,
            )
        }))
    }

    fn is_fifo(&self) -> bool {
        self.url.ends_with(".fifo")
    }

    fn congestion(&self) -> Option<&Arc<Congestion>> {
        self.congestion.as_ref()
    }

    fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
        let call = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::VisibilityTimeout);
        let call = async move {
            let out = call
                .send()
                .await
                .map_err(|e| sqs_error("GetQueueAttributes", e))?;
            let attrs = out.attributes.unwrap_or_default();
            let num = |name: QueueAttributeName| -> u64 {
                attrs.get(&name).and_then(|v| v.parse().ok()).unwrap_or(0)
            };
            Ok(QueueAttributes {
                visible: num(QueueAttributeName::ApproximateNumberOfMessages),
                in_flight: num(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
                visibility_timeout: Duration::from_secs(num(QueueAttributeName::VisibilityTimeout)),
            })
        };
        self.run(call)
    }
}

/// Converts an SDK message, moving its strings. A message without an id, a
/// body or a receipt handle cannot be tracked and is dropped (SQS always
/// sends all three).
fn convert(m: Message) -> Option<Received> {
    let mut attrs = m.attributes.unwrap_or_default();
    let mut take = |name: MessageSystemAttributeName| attrs.remove(&name);
    let number = |v: Option<String>| v.and_then(|s| s.parse::<i64>().ok());
    let message = SqsMessage {
        md5_of_body: m.md5_of_body,
        sent_timestamp: number(take(MessageSystemAttributeName::SentTimestamp)),
        first_receive_timestamp: number(take(
            MessageSystemAttributeName::ApproximateFirstReceiveTimestamp,
        )),
        receive_count: number(take(MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|n| i32::try_from(n).ok()),
        sender_id: take(MessageSystemAttributeName::SenderId),
        message_group_id: take(MessageSystemAttributeName::MessageGroupId),
        message_deduplication_id: take(MessageSystemAttributeName::MessageDeduplicationId),
        sequence_number: take(MessageSystemAttributeName::SequenceNumber),
        message_attributes: message_attributes(m.message_attributes.unwrap_or_default()),
        message_id: m.message_id?,
        body: m.body?,
    };
    Some(Received {
        message,
        receipt: ReceiptHandle::new(m.receipt_handle?),
    })
}

/// String and Number values as text, Binary as base64, sorted by name.
fn message_attributes(attrs: HashMap<String, MessageAttributeValue>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = attrs
        .into_iter()
        .filter_map(|(name, v)| {
            let text = match (v.string_value, v.binary_value) {
                (Some(s), _) => s,
                (None, Some(b)) => base64::engine::general_purpose::STANDARD.encode(b.as_ref()),
                (None, None) => return None,
            };
            Some((name, text))
        })
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use aws_sdk_sqs::primitives::Blob;

    use super::*;

    #[test]
    fn sdk_messages_convert_with_every_attribute() {
        let m = Message::builder()
            .message_id("m1")
            .receipt_handle("secret-handle")
            .body("hello")
            .md5_of_body("5d41402abc4b2a76b9719d911017c592")
            .attributes(MessageSystemAttributeName::SentTimestamp, "1700000000123")
            .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "3")
            .attributes(MessageSystemAttributeName::MessageGroupId, "g1")
            .message_attributes(
                "b",
                MessageAttributeValue::builder()
                    .data_type("Binary")
                    .binary_value(Blob::new(vec![1u8, 2, 3]))
                    .build()
                    .unwrap(),
            )
            .message_attributes(
                "a",
                MessageAttributeValue::builder()
                    .data_type("Number")
                    .string_value("42")
                    .build()
                    .unwrap(),
            )
            .build();
        let r = convert(m).unwrap();
        assert_eq!(r.receipt.expose(), "secret-handle");
        assert_eq!(r.message.sent_timestamp, Some(1_700_000_000_123));
        assert_eq!(r.message.receive_count, Some(3));
        assert_eq!(r.message.message_group_id.as_deref(), Some("g1"));
        assert_eq!(
            r.message.message_attributes,
            vec![("a".into(), "42".into()), ("b".into(), "AQID".into())]
        );
        assert!(!format!("{r:?}").contains("secret-handle"));
    }

    #[test]
    fn region_errors_are_configuration_errors_not_retryable_ones() {
        let answer = |code: Option<&str>, message: &str, status| Answer {
            code: code.map(str::to_string),
            message: message.into(),
            sender_fault: status == Some(400),
            status,
        };
        let wrong = answer(
            Some("InvalidAddress"),
            "The address https://sqs.us-east-1.amazonaws.com/ is not valid for this endpoint.",
            Some(400),
        );
        let missing = answer(
            None,
            "dispatch failure: other: Invalid Configuration: Missing Region",
            None,
        );
        let unsigned = answer(
            None,
            "dispatch failure: other: missing signing region",
            None,
        );
        for e in [wrong, missing, unsigned].map(|a| a.into_error("ReceiveMessage")) {
            assert!(
                matches!(&e, SqsError::Region { message } if message.contains("region")),
                "{e}"
            );
        }
        let unreachable = answer(None, "dispatch failure: io error", None);
        assert!(matches!(
            unreachable.into_error("ReceiveMessage"),
            SqsError::Service { code, .. } if code == "Unreachable"
        ));
    }

    #[tokio::test]
    async fn a_queue_without_a_region_fails_every_call_at_once() {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .build();
        let url = "http://127.0.0.1:9/000000000000/q".to_string();
        let q = AwsQueue::new(Client::from_conf(config), url.clone());
        let e = q.attributes().await.unwrap_err();
        let SqsError::Region { message } = &e else {
            panic!("{e}")
        };
        for named in [url.as_str(), "AWS_REGION", "`region`"] {
            assert!(message.contains(named), "{e}");
        }
        let e = q.receive(ReceiveRequest {
            max_messages: 1,
            wait: Duration::ZERO,
            visibility_timeout: Duration::from_secs(30),
        });
        assert!(matches!(e.await, Err(SqsError::Region { .. })));
    }

    #[tokio::test]
    async fn a_role_that_cannot_be_assumed_fails_the_call_naming_the_role_not_its_external_id() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", listener.local_addr().unwrap())
        };
        let own = aws_sdk_sqs::config::Credentials::new("own", "own", None, None, "test");
        // STS at a port nobody listens on (set in code here: a test).
        let base = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .credentials_provider(own)
            .endpoint_url(&closed)
            .load()
            .await;
        let role = RoleConfig {
            arn: "arn:aws:iam::210987654321:role/reader".into(),
            external_id: Some("hush-hush".into()),
            session_name: None,
        };
        let table = TableRole {
            table: "orders",
            role: &role,
        };
        let assumed = super::super::role::assume(&base, table, None, Retries::new(1)).await;
        let client = Client::from_conf(sqs_builder(&assumed, Some(&closed)).build());
        let q = AwsQueue::new(client, format!("{closed}/210987654321/orders"))
            .with_role(Assumed::of(&role, "orders"));
        let e = q.attributes().await.unwrap_err();
        let SqsError::Identity {
            role: Some(named), ..
        } = &e
        else {
            panic!("not the role's failure: {e:?}")
        };
        assert_eq!(named.session_name, "sqs-flight-orders");
        let text = e.to_string();
        assert!(
            text.starts_with(
                "cannot assume role arn:aws:iam::210987654321:role/reader (session sqs-flight-orders): "
            ),
            "{text}"
        );
        assert!(!text.contains("hush"), "{text}");
        assert_eq!(e.code(), "AssumeRole");
        assert!(!e.is_push_back(), "not a congestion signal");
    }

    #[test]
    fn messages_without_a_receipt_are_dropped() {
        let m = Message::builder().message_id("m1").body("x").build();
        assert!(convert(m).is_none());
    }
}
