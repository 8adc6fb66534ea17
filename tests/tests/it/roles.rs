//! Tables whose queues live in another AWS account, read as an IAM role
//! (`role_arn`), with the real server binary against moto's STS and SQS.
//!
//! moto keeps one set of queues per account and runs a call signed with
//! an assumed role's key (`ASIA...`) in that role's account: a queue made
//! in the role's account is found only through the role, never with the
//! process's own key (`test`, account 123456789012). moto's request
//! recorder (`/moto-api/recorder/`) shows each call's key and body; the
//! tests that use it run one at a time ([`RECORDER`]).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::types::MessageAttributeValue;
use serde_json::{Value, json};
use sqs_flight_tests::http::get;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::prelude::{
    action_on, connect, free_addr, plan_on, poll, read_on, reason, tables_toml, tickets,
};
use sqs_flight_tests::server_process::ServerProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Mutex, MutexGuard};

/// The account of the queues read through a role (not moto's default).
const OTHER_ACCOUNT: &str = "210987654321";
/// A third account, for a second role.
const THIRD_ACCOUNT: &str = "310987654321";
/// Serializes the tests that record moto's requests: the recorder is one
/// per moto process.
static RECORDER: Mutex<()> = Mutex::const_new(());

fn role_arn(account: &str, name: &str) -> String {
    format!("arn:aws:iam::{account}:role/{name}")
}

/// One HTTP/1.0 request to moto: (status, body).
fn moto_http(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let addr: SocketAddr = moto()
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("moto listens on an IP address");
    let mut s = TcpStream::connect(addr).expect("connect to moto");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    write!(s, "{head}\r\n{body}").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// An STS query call to moto signed (in name: moto checks no signature)
/// with access key `key`: the answer's XML.
fn sts_call(key: &str, params: &str) -> String {
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/sts/aws4_request, \
         SignedHeaders=host, Signature=0"
    );
    let headers = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Authorization", auth.as_str()),
    ];
    let body = format!("{params}&Version=2011-06-15");
    let (status, answer) = moto_http("POST", "/", &headers, &body);
    assert_eq!(status, 200, "STS {params}: {answer}");
    answer
}

/// The text of the first `<tag>` of `xml`.
fn xml_field<'a>(xml: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no <{tag}> in {xml}"))
        + open.len();
    let end = xml[start..].find('<').expect("a closing tag") + start;
    &xml[start..end]
}

/// The access key of a session of role `arn`, assumed by the test itself
/// (to make and fill the queues of the role's account).
fn assumed_key(arn: &str, session: &str) -> String {
    let params = format!("Action=AssumeRole&RoleArn={arn}&RoleSessionName={session}");
    xml_field(&sts_call("test", &params), "AccessKeyId").to_string()
}

/// Who moto says signs with `key`: `arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION`
/// for an assumed role's key.
fn caller_arn(key: &str) -> String {
    xml_field(&sts_call(key, "Action=GetCallerIdentity"), "Arn").to_string()
}

/// An SQS client of moto signing with `key` (moto checks no secret).
async fn sqs_as(key: &str) -> aws_sdk_sqs::Client {
    let base = moto().client().await;
    let config = base
        .config()
        .to_builder()
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, "any", None, None, "roles-test"))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// A queue of the account of role `arn`, made and filled by the test
/// itself through a session of its own.
struct RoleQueue {
    url: String,
    /// A client of the queue's account.
    owner: aws_sdk_sqs::Client,
    /// The key the test's own calls sign with (not the server's).
    owner_key: String,
}

/// A queue in the account of role `arn` holding `bodies`.
async fn queue_of_role(arn: &str, prefix: &str, bodies: &[&str]) -> RoleQueue {
    let owner_key = assumed_key(arn, "roles-test-setup");
    let owner = sqs_as(&owner_key).await;
    let url = moto::create_queue(&owner, prefix, &[]).await;
    moto::send_bodies(&owner, &url, bodies.iter().map(|b| b.to_string())).await;
    RoleQueue {
        url,
        owner,
        owner_key,
    }
}

/// One request moto recorded.
#[derive(Debug)]
struct Recorded {
    /// The access key of its `Authorization` header.
    key: String,
    /// `X-Amz-Target` (SQS's JSON calls), else empty.
    target: String,
    body: String,
    /// The method and the URL.
    method: String,
    url: String,
}

/// Requests recorded by moto while this lives (one at a time, see
/// [`RECORDER`]); stops the recorder when dropped.
struct Recording {
    _one_at_a_time: MutexGuard<'static, ()>,
}

impl Recording {
    async fn start() -> Self {
        let guard = RECORDER.lock().await;
        moto_http("POST", "/moto-api/recorder/reset-recording", &[], "");
        moto_http("POST", "/moto-api/recorder/start-recording", &[], "");
        Self {
            _one_at_a_time: guard,
        }
    }

    /// Every request recorded so far.
    fn requests(&self) -> Vec<Recorded> {
        let (status, text) = moto_http("GET", "/moto-api/recorder/download-recording", &[], "");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let entry: Value = serde_json::from_str(line).expect("a JSON line");
                let header = |name: &str| {
                    let headers = entry["headers"].as_object().expect("headers");
                    let found = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name));
                    found
                        .and_then(|(_, v)| v.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                let raw = entry["body"].as_str().unwrap_or("");
                let body = if entry["body_encoded"].as_bool() == Some(true) {
                    String::from_utf8_lossy(&base64_decode(raw)).into_owned()
                } else {
                    raw.to_string()
                };
                Recorded {
                    key: access_key(&header("Authorization")),
                    target: header("X-Amz-Target"),
                    body,
                    method: entry["method"].as_str().unwrap_or("").to_string(),
                    url: entry["url"].as_str().unwrap_or("").to_string(),
                }
            })
            .collect()
    }

    /// The SQS calls on `queue_url` but those signed with `test_key` (the
    /// test's own): (operation, access key).
    fn sqs_calls(&self, queue_url: &str, test_key: &str) -> Vec<(String, String)> {
        self.requests()
            .into_iter()
            .filter(|r| r.target.starts_with("AmazonSQS.") && r.key != test_key)
            .filter(|r| {
                let body: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
                body["QueueUrl"] == queue_url
            })
            .map(|r| (r.target.trim_start_matches("AmazonSQS.").to_string(), r.key))
            .collect()
    }

    /// The keys of the `method` calls (GET, PUT) on objects under
    /// `/bucket/`.
    fn object_calls(&self, method: &str, bucket: &str) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == method && r.url.contains(&format!("/{bucket}/")))
            .map(|r| r.key)
            .collect()
    }

    /// The parameters of each AssumeRole call of session `session`.
    fn assume_role_calls(&self, session: &str) -> Vec<Vec<(String, String)>> {
        self.requests()
            .into_iter()
            .map(|r| form_params(&r.body))
            .filter(|p| p.contains(&("Action".into(), "AssumeRole".into())))
            .filter(|p| p.contains(&("RoleSessionName".into(), session.into())))
            .collect()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        moto_http("POST", "/moto-api/recorder/stop-recording", &[], "");
    }
}

/// The key of `Credential=KEY/...` in an Authorization header.
fn access_key(authorization: &str) -> String {
    authorization
        .split("Credential=")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("")
        .to_string()
}

/// `a=1&b=x%3Ay` as (name, value) pairs, percent-decoded.
fn form_params(body: &str) -> Vec<(String, String)> {
    body.split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (percent_decode(k), percent_decode(v)))
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).expect("percent-encoded byte"));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("UTF-8")
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
    {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// A TOML config of table `cross` on `cross_url` as `role` (with
/// `external_id`) and table `own` on `own_url` as the server itself.
fn cross_and_own(
    cross_url: &str,
    role: &str,
    external_id: &str,
    own_url: &str,
) -> (sqs_flight_tests::prelude::TempDir, String) {
    tables_toml(&[
        (
            "cross",
            format!(
                "queue_url = \"{cross_url}\"\nrole_arn = \"{role}\"\nrole_external_id = \"{external_id}\"\n"
            ),
        ),
        ("own", format!("queue_url = \"{own_url}\"\n")),
    ])
}

/// The server binary on moto with `config`, its STS and S3 moto's too,
/// with `extra` flags.
fn start_with_s3(config: &str, extra: &[&str]) -> ServerProcess {
    let mut env = moto::AWS_ENV.to_vec();
    env.push(("AWS_ENDPOINT_URL_STS", &moto().endpoint));
    let mut args = vec!["--listen", "127.0.0.1:0", "--config", config];
    args.extend(["--sqs-endpoint", &moto().endpoint]);
    args.extend(["--s3-endpoint", &moto().endpoint]);
    args.extend_from_slice(extra);
    ServerProcess::start_with_env(&args, &env)
}

/// The server binary on moto with `config`, its STS at `sts`, its
/// operations port at `ops`.
fn start(config: &str, sts: &str, ops: SocketAddr) -> ServerProcess {
    let ops = ops.to_string();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--config",
        config,
        "--sqs-endpoint",
        &moto().endpoint,
        "--metrics-listen",
        &ops,
    ];
    let mut env = moto::AWS_ENV.to_vec();
    env.push(("AWS_ENDPOINT_URL_STS", sts));
    ServerProcess::start_with_env(&args, &env)
}

/// Plans batch `batch` of consumer `c` on `table`, reads it and commits
/// it: the bodies read, sorted, or the first status refused.
async fn read_and_commit(url: &str, table: &str, batch: u64) -> Result<Vec<String>, tonic::Status> {
    let mut flight = connect(url).await;
    let cmd = json!({"table": table, "consumer": "c", "batch": batch, "partitions": 1,
        "receivers": 1, "max_wait_ms": 500});
    let info = plan_on(&mut flight, &cmd).await?;
    let mut bodies = Vec::new();
    for t in tickets(&info) {
        bodies.extend(sqs_flight_tests::prelude::bodies(
            &read_on(&mut flight, &t).await?,
        ));
    }
    let body = json!({"table": table, "consumer": "c", "batch": batch});
    action_on(&mut flight, "commit", &body).await?;
    bodies.sort();
    Ok(bodies)
}

/// Writes `bodies` to `table` with one DoPut: the messages sent.
async fn put(url: &str, table: &str, bodies: &[&str]) -> u64 {
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use futures::TryStreamExt;
    let column: arrow_array::ArrayRef = Arc::new(arrow_array::StringArray::from(bodies.to_vec()));
    let batch = arrow_array::RecordBatch::try_from_iter([("body", column)]).expect("a batch");
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(arrow_flight::FlightDescriptor::new_path(vec![
            table.into(),
        ])))
        .build(futures::stream::iter([Ok(batch)]));
    let mut flight = connect(url).await;
    let results: Vec<_> = flight
        .do_put(data)
        .await
        .expect("DoPut")
        .try_collect()
        .await
        .expect("DoPut results");
    results
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.app_metadata).unwrap()["sent"]
                .as_u64()
                .unwrap()
        })
        .sum()
}

/// The operations and keys of `calls` must include a receive and a delete,
/// and every key be `key`'s (`Some`) or an assumed role's session `arn`.
fn assert_signed_by(calls: &[(String, String)], signer: &str, log: &str) {
    let ops: BTreeSet<&str> = calls.iter().map(|(op, _)| op.as_str()).collect();
    for op in ["ReceiveMessage", "DeleteMessageBatch"] {
        assert!(ops.contains(op), "{op} among {calls:?}\n{log}");
    }
    let keys: BTreeSet<&str> = calls.iter().map(|(_, key)| key.as_str()).collect();
    for key in keys {
        if signer.starts_with("arn:") {
            assert!(key.starts_with("ASIA"), "an assumed role's key: {key}");
            assert_eq!(caller_arn(key), signer, "who signs with {key}");
        } else {
            assert_eq!(key, signer, "{calls:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_table_reads_and_commits_as_the_role_and_the_other_as_the_server() {
    let role = role_arn(OTHER_ACCOUNT, "roles-reader");
    let cross = queue_of_role(&role, "roles-cross", &["c1", "c2"]).await;
    let cross_url = &cross.url;
    let own_sqs = moto().client().await;
    let own_url = moto::create_queue(&own_sqs, "roles-own", &[]).await;
    moto::send_bodies(&own_sqs, &own_url, ["o1".to_string()]).await;
    // The process's own identity cannot see the other account's queue.
    let direct = own_sqs.get_queue_attributes().queue_url(cross_url).send();
    assert!(
        direct.await.is_err(),
        "moto keeps the queue in {OTHER_ACCOUNT}"
    );

    let external_id = "ext-roles-1";
    let (_dir, config) = cross_and_own(cross_url, &role, external_id, &own_url);
    // From here on moto records the server's calls (and the test's own).
    let recording = Recording::start().await;
    let server = start(&config, &moto().endpoint, free_addr());
    let read = read_and_commit(&server.url, "cross", 1).await;
    assert_eq!(
        read.expect("the role's table reads"),
        ["c1", "c2"],
        "{}",
        server.log()
    );
    assert_eq!(
        read_and_commit(&server.url, "own", 1)
            .await
            .expect("own reads"),
        ["o1"]
    );
    assert_eq!(
        moto::queue_counts(&cross.owner, cross_url).await,
        (0, 0),
        "committed"
    );
    assert_eq!(
        put(&server.url, "cross", &["w1"]).await,
        1,
        "DoPut as the role"
    );
    assert_eq!(
        moto::queue_counts(&cross.owner, cross_url).await,
        (1, 0),
        "written"
    );
    assert_eq!(
        moto::queue_counts(&own_sqs, &own_url).await,
        (0, 0),
        "committed"
    );

    let calls = recording.assume_role_calls("sqs-flight-cross");
    assert!(
        !calls.is_empty(),
        "the server called AssumeRole\n{}",
        server.log()
    );
    for params in &calls {
        for expected in [("RoleArn", role.as_str()), ("ExternalId", external_id)] {
            let pair = (expected.0.to_string(), expected.1.to_string());
            assert!(params.contains(&pair), "{expected:?} in {params:?}");
        }
    }
    let session =
        format!("arn:aws:sts::{OTHER_ACCOUNT}:assumed-role/roles-reader/sqs-flight-cross");
    let cross_calls = recording.sqs_calls(cross_url, &cross.owner_key);
    assert!(
        cross_calls.iter().any(|(op, _)| op == "SendMessageBatch"),
        "{cross_calls:?}"
    );
    assert_signed_by(&cross_calls, &session, &server.log());
    assert_signed_by(&recording.sqs_calls(&own_url, ""), "test", &server.log());
    assert!(
        !server.log().contains(external_id),
        "the external id is never logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_of_two_roles_each_sign_as_their_own_session() {
    let (role_a, role_b) = (
        role_arn(OTHER_ACCOUNT, "reader-a"),
        role_arn(THIRD_ACCOUNT, "team/reader-b"),
    );
    let qa = queue_of_role(&role_a, "roles-a", &["a1"]).await;
    let url_a = &qa.url;
    let qb = queue_of_role(&role_b, "roles-b", &["b1", "b2"]).await;
    let url_b = &qb.url;
    let (_dir, config) = tables_toml(&[
        (
            "a",
            format!(
                "queue_url = \"{url_a}\"\nrole_arn = \"{role_a}\"\nrole_external_id = \"ext-a\"\n"
            ),
        ),
        (
            "b",
            format!(
                "queue_url = \"{url_b}\"\nrole_arn = \"{role_b}\"\nrole_session_name = \"audit-b\"\n"
            ),
        ),
    ]);
    // From here on moto records the server's calls (and the test's own).
    let recording = Recording::start().await;
    let server = start(&config, &moto().endpoint, free_addr());
    assert_eq!(
        read_and_commit(&server.url, "a", 1).await.expect("a reads"),
        ["a1"],
        "{}",
        server.log()
    );
    assert_eq!(
        read_and_commit(&server.url, "b", 1).await.expect("b reads"),
        ["b1", "b2"]
    );
    assert_eq!(moto::queue_counts(&qa.owner, url_a).await, (0, 0));
    assert_eq!(moto::queue_counts(&qb.owner, url_b).await, (0, 0));

    assert!(!recording.assume_role_calls("sqs-flight-a").is_empty());
    let b_calls = recording.assume_role_calls("audit-b");
    assert!(!b_calls.is_empty(), "b's session is named as set");
    assert!(
        b_calls
            .iter()
            .all(|p| !p.iter().any(|(k, _)| k == "ExternalId")),
        "b sends no external id: {b_calls:?}"
    );
    let a = format!("arn:aws:sts::{OTHER_ACCOUNT}:assumed-role/reader-a/sqs-flight-a");
    let b = format!("arn:aws:sts::{THIRD_ACCOUNT}:assumed-role/reader-b/audit-b");
    assert_signed_by(
        &recording.sqs_calls(url_a, &qa.owner_key),
        &a,
        &server.log(),
    );
    assert_signed_by(
        &recording.sqs_calls(url_b, &qb.owner_key),
        &b,
        &server.log(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sts_unreachable_fails_the_role_table_naming_the_role_while_the_other_reads() {
    let role = role_arn(OTHER_ACCOUNT, "roles-unreachable");
    let cross = queue_of_role(&role, "roles-nosts", &["c1"]).await;
    let cross_url = &cross.url;
    let own_sqs = moto().client().await;
    let own_url = moto::create_queue(&own_sqs, "roles-nosts-own", &[]).await;
    moto::send_bodies(&own_sqs, &own_url, ["o1".to_string()]).await;
    let external_id = "hush-hush-ext";
    let (_dir, config) = cross_and_own(cross_url, &role, external_id, &own_url);
    // Nothing listens there: every AssumeRole call is refused.
    let closed = format!("http://{}", free_addr());
    let ops = free_addr();
    let server = start(&config, &closed, ops);

    let err = read_and_commit(&server.url, "cross", 1)
        .await
        .expect_err("no credentials for the role");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert_eq!(reason(&err), Some("sqs_credentials"), "{err}");
    for named in ["\"cross\"", role.as_str(), "sqs-flight-cross"] {
        assert!(err.message().contains(named), "names {named}: {err}");
    }
    assert!(!err.message().contains(external_id), "{err}");
    assert_eq!(
        moto::queue_counts(&cross.owner, cross_url).await,
        (1, 0),
        "nothing received"
    );

    assert_eq!(
        read_and_commit(&server.url, "own", 1)
            .await
            .expect("own reads"),
        ["o1"]
    );
    let mut flight = connect(&server.url).await;
    let status = action_on(&mut flight, "status", &json!({}))
        .await
        .expect("status");
    let why = status["tables"]["cross"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains(&role), "status names the role: {status}");
    assert!(status["tables"]["own"]["error"].is_null(), "{status}");

    let readyz = async || get(ops, "/readyz").await;
    let last = poll(Duration::from_secs(30), readyz, |(code, _)| *code == 503).await;
    let (Ok((code, body)) | Err((code, body))) = last;
    assert_eq!(
        (code, body.as_str()),
        (
            503,
            "not ready\ntable cross: its role could not be assumed (see the server log)\n"
        )
    );
    assert!(!server.log().contains(external_id), "never logged");
}

/// A proxy in front of moto's STS that shortens every session it hands
/// out to `lifetime` (STS and moto give at least 15 minutes), counting the
/// AssumeRole calls. One request per connection (HTTP/1.0 to moto).
struct ShortSessions {
    endpoint: String,
    assumed: Arc<AtomicUsize>,
}

impl ShortSessions {
    async fn start(lifetime: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let assumed = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&assumed);
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let _ = shorten(conn, lifetime, &counter).await;
                });
            }
        });
        Self { endpoint, assumed }
    }
}

/// Forwards one request on `conn` to moto and answers with moto's answer,
/// its `<Expiration>` moved to `lifetime` from now.
async fn shorten(
    mut conn: tokio::net::TcpStream,
    lifetime: Duration,
    assumed: &AtomicUsize,
) -> std::io::Result<()> {
    let Some((head, body)) = read_request(&mut conn).await? else {
        return Ok(());
    };
    if body.contains("Action=AssumeRole") {
        assumed.fetch_add(1, Ordering::SeqCst);
    }
    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| {
            !["host", "content-length", "connection"].contains(&k.to_ascii_lowercase().as_str())
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let answer = tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        moto_http("POST", &path, &headers, &body)
    })
    .await
    .expect("forward to moto");
    let (status, mut text) = answer;
    if let (Some(start), Some(end)) = (text.find("<Expiration>"), text.find("</Expiration>")) {
        let until = SystemTime::now() + lifetime;
        text.replace_range(start + "<Expiration>".len()..end, &iso8601(until));
    }
    let reply = format!(
        "HTTP/1.1 {status} OK\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}

/// One HTTP request read from `conn`: its head and its body (`None`: the
/// connection closed first).
async fn read_request(
    conn: &mut tokio::net::TcpStream,
) -> std::io::Result<Option<(String, String)>> {
    let mut request = Vec::new();
    let mut buf = [0u8; 8192];
    let body_start = loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        request.extend_from_slice(&buf[..n]);
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..body_start]).to_string();
    let length = header_value(&head, "content-length").map_or(0, |v| v.parse().unwrap_or(0));
    while request.len() < body_start + length {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&request[body_start..]).to_string();
    Ok(Some((head, body)))
}

/// An STS that refuses every AssumeRole as AWS does when the role's trust
/// policy does not name the caller (moto's STS grants every role): its
/// endpoint.
async fn refusing_sts() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(Some(_)) = read_request(&mut conn).await {
                    let _ = conn.write_all(access_denied().as_bytes()).await;
                    let _ = conn.shutdown().await;
                }
            });
        }
    });
    endpoint
}

/// STS's answer to an AssumeRole the role's trust policy does not allow.
fn access_denied() -> String {
    let body = "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><Error>\
        <Type>Sender</Type><Code>AccessDenied</Code><Message>User: \
        arn:aws:iam::123456789012:user/test is not authorized to perform: sts:AssumeRole\
        </Message></Error><RequestId>5e1f0c2a-0000-4000-8000-000000000000</RequestId>\
        </ErrorResponse>";
    format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// `t` as `2026-12-05T19:30:00Z`.
fn iso8601(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_that_expire_during_a_stream_are_renewed_with_no_failed_call() {
    let role = role_arn(OTHER_ACCOUNT, "roles-renewed");
    let queue = queue_of_role(&role, "roles-renew", &[]).await;
    let (url, owner) = (&queue.url, &queue.owner);
    // Sessions of 20 s: the SDK renews them some 10 to 15 s before they end.
    let sts = ShortSessions::start(Duration::from_secs(20)).await;
    let (_dir, config) = tables_toml(&[(
        "cross",
        format!("queue_url = \"{url}\"\nrole_arn = \"{role}\"\n"),
    )]);
    // From here on moto records the server's calls (and the test's own).
    let recording = Recording::start().await;
    let server = start(&config, &sts.endpoint, free_addr());
    let started = Instant::now();
    let mut batch = 0;
    // Until a third session was assumed (the second signed calls), for
    // up to 60 s: some 10 to 20 s.
    while sts.assumed.load(Ordering::SeqCst) < 3 && started.elapsed() < Duration::from_secs(60) {
        batch += 1;
        let body = format!("m{batch}");
        moto::send_bodies(owner, url, [body.clone()]).await;
        let read = read_and_commit(&server.url, "cross", batch).await;
        assert_eq!(
            read.expect("every call succeeds"),
            [body],
            "{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let calls = sts.assumed.load(Ordering::SeqCst);
    assert!(
        calls >= 3,
        "renewed: {calls} AssumeRole calls in 60 s\n{}",
        server.log()
    );
    let keys: BTreeSet<String> = recording
        .sqs_calls(url, &queue.owner_key)
        .into_iter()
        .map(|(_, key)| key)
        .collect();
    assert!(
        keys.len() >= 2,
        "the calls signed with each new session's key: {keys:?}"
    );
    // Cached: each session signs many calls, not one AssumeRole per call.
    let signed = recording.sqs_calls(url, &queue.owner_key).len();
    assert!(
        keys.len() * 2 < signed,
        "{} keys for {signed} calls",
        keys.len()
    );
    let session =
        format!("arn:aws:sts::{OTHER_ACCOUNT}:assumed-role/roles-renewed/sqs-flight-cross");
    for key in &keys {
        assert_eq!(caller_arn(key), session);
    }
    assert_eq!(
        moto::queue_counts(owner, url).await,
        (0, 0),
        "every batch committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_sts_refuses_fails_naming_the_role_and_stss_answer() {
    let role = role_arn(OTHER_ACCOUNT, "roles-untrusted");
    let cross = queue_of_role(&role, "roles-refused", &["c1"]).await;
    let (_dir, config) = tables_toml(&[(
        "cross",
        format!(
            "queue_url = \"{}\"\nrole_arn = \"{role}\"\nrole_external_id = \"hush-wrong\"\n",
            cross.url
        ),
    )]);
    let server = start(&config, &refusing_sts().await, free_addr());
    let err = read_and_commit(&server.url, "cross", 1)
        .await
        .expect_err("STS refuses the role");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert_eq!(reason(&err), Some("sqs_credentials"), "{err}");
    let says = format!(
        "table \"cross\": cannot assume role {role} (session sqs-flight-cross): STS answered \
         AccessDenied: User: arn:aws:iam::123456789012:user/test is not authorized to perform: \
         sts:AssumeRole; the role's trust policy must"
    );
    assert!(err.message().starts_with(&says), "{err}");
    assert!(!err.message().contains("hush"), "{err}");
    assert_eq!(moto::queue_counts(&cross.owner, &cross.url).await, (1, 0));
}

/// An S3 client of moto signing with `key`, path-style.
fn s3_as(key: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::from(&sqs_flight_tests::s3::sdk_config())
        .credentials_provider(Credentials::new(key, "any", None, None, "roles-test"))
        .endpoint_url(&moto().endpoint)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_tables_large_payloads_are_read_from_s3_as_the_role() {
    let role = role_arn(OTHER_ACCOUNT, "roles-payloads");
    let cross = queue_of_role(&role, "roles-lp", &[]).await;
    let s3 = s3_as(&cross.owner_key);
    let bucket = sqs_flight_tests::s3::create_bucket(&s3, "roles-lp").await;
    let payload = "x".repeat(300_000);
    sqs_flight_tests::s3::put(&s3, &bucket, "big-1", payload.as_bytes()).await;
    let pointer = format!(
        r#"["software.amazon.payloadoffloading.PayloadS3Pointer", {{"s3BucketName": "{bucket}", "s3Key": "big-1"}}]"#
    );
    let size = MessageAttributeValue::builder()
        .data_type("Number")
        .string_value(payload.len().to_string())
        .build()
        .unwrap();
    cross
        .owner
        .send_message()
        .queue_url(&cross.url)
        .message_body(pointer)
        .message_attributes("ExtendedPayloadSize", size)
        .send()
        .await
        .expect("send the pointer");
    let (_dir, config) = tables_toml(&[(
        "cross",
        format!(
            "queue_url = \"{}\"\nrole_arn = \"{role}\"\n[tables.cross.large_payloads]\nread = true\n",
            cross.url
        ),
    )]);
    let recording = Recording::start().await;
    let server = start_with_s3(&config, &[]);
    let read = read_and_commit(&server.url, "cross", 1).await;
    assert_eq!(
        read.expect("the payload is read"),
        [payload],
        "{}",
        server.log()
    );
    let reads = recording.object_calls("GET", &bucket);
    assert!(!reads.is_empty(), "the server read the object");
    let session =
        format!("arn:aws:sts::{OTHER_ACCOUNT}:assumed-role/roles-payloads/sqs-flight-cross");
    for key in BTreeSet::from_iter(reads) {
        assert_eq!(caller_arn(&key), session, "the object is read as the role");
    }
}

/// `--state-url` on a bucket of another account, with
/// `--state-url-role-arn`: the state log is read and written as the role
/// (sessions `sqs-flight-state`), the table as the server's own identity.
/// The server's own key cannot see the bucket (moto keeps accounts apart):
/// without the role the server does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_log_is_written_as_the_state_url_role() {
    let role = role_arn(OTHER_ACCOUNT, "roles-state");
    let owner = assumed_key(&role, "roles-test-setup");
    let bucket = sqs_flight_tests::s3::create_bucket(&s3_as(&owner), "roles-state").await;
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "roles-state", 3).await;
    let (_dir, config) = tables_toml(&[("t", format!("queue_url = \"{queue_url}\"\n"))]);
    let recording = Recording::start().await;
    let state_url = format!("s3://{bucket}/stream");
    let server = start_with_s3(
        &config,
        &[
            "--state-url",
            &state_url,
            "--state-url-role-arn",
            &role,
            "--state-url-role-external-id",
            "ext-state-1",
        ],
    );
    let read = read_and_commit(&server.url, "t", 1).await;
    assert_eq!(read.expect("read and commit").len(), 3, "{}", server.log());

    let writes = recording.object_calls("PUT", &bucket);
    assert!(writes.len() >= 2, "the takeover and the batch: {writes:?}");
    let session = format!("arn:aws:sts::{OTHER_ACCOUNT}:assumed-role/roles-state/sqs-flight-state");
    for key in BTreeSet::from_iter(writes) {
        assert_eq!(caller_arn(&key), session, "the log is written as the role");
    }
    let calls = recording.assume_role_calls("sqs-flight-state");
    assert!(!calls.is_empty(), "AssumeRole was called");
    for params in calls {
        assert!(
            params.contains(&("RoleArn".into(), role.clone())),
            "{params:?}"
        );
        assert!(
            params.contains(&("ExternalId".into(), "ext-state-1".into())),
            "{params:?}"
        );
    }
}

/// A state URL role STS does not grant (here: STS unreachable) stops the
/// start with an error naming the URL, the role and why, never the
/// external id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_url_role_that_cannot_be_assumed_stops_the_start_naming_it() {
    let role = role_arn(OTHER_ACCOUNT, "roles-state-nosts");
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "roles-state-nosts", 1).await;
    let (_dir, config) = tables_toml(&[("t", format!("queue_url = \"{queue_url}\"\n"))]);
    let closed = format!("http://{}", free_addr());
    let state_url = "s3://roles-state-nosts/stream";
    let mut cmd = std::process::Command::new(sqs_flight_tests::server_process::server_binary());
    cmd.args(["--listen", "127.0.0.1:0", "--config", &config])
        .args([
            "--sqs-endpoint",
            &moto().endpoint,
            "--s3-endpoint",
            &moto().endpoint,
        ])
        .args(["--state-url", state_url, "--state-url-role-arn", &role])
        .args(["--state-url-role-external-id", "hush-hush-state"])
        .args(["--sqs-max-attempts", "1"])
        .envs(moto::AWS_ENV.iter().copied())
        .env("AWS_ENDPOINT_URL_STS", &closed)
        .env("RUST_BACKTRACE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    sqs_flight_tests::process::die_with_parent(&mut cmd);
    let out = sqs_flight_tests::prelude::bounded(tokio::task::spawn_blocking(move || cmd.output()))
        .await
        .unwrap()
        .expect("run the server");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {log}");
    let error = log
        .lines()
        .find(|l| l.starts_with("Error:"))
        .unwrap_or_default();
    let says = format!("cannot assume role {role} (session sqs-flight-state)");
    assert!(
        error.contains(state_url) && error.contains(&says) && error.contains("Connection refused"),
        "the error names the URL, the role and why:\n{log}"
    );
    assert!(
        !log.contains("hush-hush-state"),
        "the external id stays secret:\n{log}"
    );
}
