//! The sqs-flight server as a test fixture: bound to port 0 on loopback,
//! served in-process, shut down and joined on `stop` (or cancelled on drop).

use std::net::SocketAddr;
use std::time::Duration;

use arrow_flight::FlightClient;
use sqs_flight_server::config::{Backend, Config, PlanParams, TableConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running server.
pub struct TestServer {
    pub addr: SocketAddr,
    /// `grpc://127.0.0.1:PORT` (`grpc+tls://` with TLS)
    pub url: String,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// A table on an SQS queue with the built-in defaults.
pub fn sqs_table(name: &str, queue_url: &str) -> TableConfig {
    TableConfig {
        name: name.to_string(),
        backend: Backend::Sqs {
            queue_url: queue_url.to_string(),
            region: None,
        },
        defaults: PlanParams::DEFAULTS,
        visibility_timeout: None,
        payload: None,
        large_payloads: None,
        role: None,
    }
}

/// A configuration listening on a free loopback port.
pub fn config(tables: Vec<TableConfig>) -> Config {
    Config::new("127.0.0.1:0".parse().unwrap(), tables)
}

impl TestServer {
    /// Starts a server whose SQS tables use `sqs`.
    pub async fn start(config: Config, sqs: aws_sdk_sqs::Client) -> Self {
        let registry = sqs_flight_server::registry::Registry::build_with_s3(
            &config,
            Some(sqs),
            Some(crate::s3::sdk_config()),
        )
        .await
        .expect("registry");
        Self::start_with_registry(config, registry).await
    }

    /// Starts a server of the in-memory table `table` alone, holding
    /// `messages` sample messages, with `tweak` applied to its
    /// configuration, which must be valid (the binary checks it too). It
    /// calls no SQS.
    pub async fn in_memory(table: &str, messages: u64, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = config(vec![TableConfig::memory(table, messages)]);
        tweak(&mut config);
        config.validate().expect("a valid test configuration");
        Self::start(config, unused_sqs()).await
    }

    /// Starts a server on a registry built by the test (say, of tables
    /// whose queues a test wraps to watch the calls).
    pub async fn start_with_registry(
        mut config: Config,
        registry: std::sync::Arc<sqs_flight_server::registry::Registry>,
    ) -> Self {
        // SQL statements run in worker processes of the server's binary
        // (this process's own executable is the test binary).
        if config.sql.worker.is_none() {
            config.sql.worker = Some(crate::server_process::server_binary().to_path_buf());
        }
        let listener = sqs_flight_server::server::bind(&config)
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let scheme = if config.tls.is_some() {
            "grpc+tls"
        } else {
            "grpc"
        };
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            sqs_flight_server::server::serve(listener, config, registry, stop)
                .await
                .expect("server runs");
        });
        Self {
            addr,
            url: format!("{scheme}://{addr}"),
            shutdown,
            task: Some(task),
        }
    }

    /// A Flight client connected to the server.
    pub async fn client(&self) -> FlightClient {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to the test server");
        FlightClient::new(channel)
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("server stops within 10 s")
                .expect("server task did not panic");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A loopback address with a free port (released at once, for a server to bind).
pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// An SQS client that is never called: the demo table lives in memory.
pub fn unused_sqs() -> aws_sdk_sqs::Client {
    let conf = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .build();
    aws_sdk_sqs::Client::from_conf(conf)
}
