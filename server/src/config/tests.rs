use sqs_flight_schemas::payload::Unwrap;

use super::plan::*;
use super::table::{DEFAULT_RTT_MS, MAX_RTT_MS};
use super::*;

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("sqs-flight-server").chain(args.iter().copied())).unwrap()
}

#[test]
fn client_limits_come_from_flags_and_toml() {
    let c = Config::try_from(cli(&[])).unwrap();
    assert_eq!(c.max_streams_per_client, DEFAULT_MAX_STREAMS_PER_CLIENT);
    assert_eq!(c.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
    let c = Config::try_from(cli(&[
        "--max-streams-per-client",
        "3",
        "--max-request-bytes",
        "65536",
        "--max-put-rows",
        "7",
        "--max-put-bytes",
        "9",
        "--limit-partitions",
        "4",
    ]))
    .unwrap();
    assert_eq!(
        (
            c.max_streams_per_client,
            c.max_request_bytes,
            c.max_put_rows,
            c.max_put_bytes
        ),
        (3, 65536, 7, 9)
    );
    assert_eq!(c.limits.partitions, 4);
    assert_eq!(c.limits.max_messages, LIMIT_MAX_MESSAGES);
    let err = Config::try_from(cli(&["--max-streams-per-client", "0"])).unwrap_err();
    assert!(err.to_string().contains("max_streams_per_client"), "{err}");
    let err = Config::try_from(cli(&["--max-request-bytes", "10"])).unwrap_err();
    assert!(err.to_string().contains("max_request_bytes"), "{err}");
    let err = Config::try_from(cli(&["--limit-partitions", "1"])).unwrap_err();
    assert!(err.to_string().contains("tables.demo.partitions"), "{err}");

    let scratch = crate::scratch::dir("limits");
    let dir = scratch.path().to_path_buf();
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "max_streams_per_client = 5\nmax_put_rows = 11\n[limits]\npartitions = 8\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let c = Config::try_from(cli(&["--config", p])).unwrap();
    assert_eq!((c.max_streams_per_client, c.max_put_rows), (5, 11));
    assert_eq!(c.limits.partitions, 8);
    let c = Config::try_from(cli(&["--config", p, "--limit-partitions", "6"])).unwrap();
    assert_eq!(c.limits.partitions, 6, "a flag wins over the file");
}

/// A file `c.toml` with `text` in a fresh directory named for `test`: the
/// directory's guard, and the file's path.
fn toml_file(test: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = crate::scratch::dir(test);
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn a_listen_flag_wins_over_the_file_even_at_the_default_address() {
    let (_dir, path) = toml_file("listen", "listen = \"127.0.0.1:6001\"\n");
    let p = path.to_str().unwrap();
    let c = Config::try_from(cli(&["--config", p])).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:6001");
    let c = Config::try_from(cli(&["--config", p, "--listen", "127.0.0.1:50051"])).unwrap();
    assert_eq!(c.listen, DEFAULT_LISTEN, "the flag was given, so it wins");
    let c = Config::try_from(cli(&["--config", p, "--listen", "127.0.0.1:6002"])).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:6002");
}

#[test]
fn the_registry_budget_has_flags_over_the_file() {
    let c = Config::try_from(cli(&[])).unwrap();
    assert_eq!(
        (c.registry_max_bytes, c.registry_max_messages),
        (DEFAULT_REGISTRY_MAX_BYTES, DEFAULT_REGISTRY_MAX_MESSAGES)
    );
    let (_dir, path) = toml_file(
        "budget",
        "registry_max_bytes = 7000\nregistry_max_messages = 70\n",
    );
    let p = path.to_str().unwrap();
    let c = Config::try_from(cli(&["--config", p])).unwrap();
    assert_eq!((c.registry_max_bytes, c.registry_max_messages), (7000, 70));
    let c = Config::try_from(cli(&[
        "--config",
        p,
        "--registry-max-bytes",
        "9000",
        "--registry-max-messages",
        "90",
    ]))
    .unwrap();
    assert_eq!((c.registry_max_bytes, c.registry_max_messages), (9000, 90));
    assert!(
        c.to_toml().contains("registry_max_messages = 90"),
        "{}",
        c.to_toml()
    );
}

#[test]
fn idle_exit_is_off_unless_set_and_never_zero() {
    assert_eq!(Config::try_from(cli(&[])).unwrap().idle_exit, None);
    let c = Config::try_from(cli(&["--idle-exit", "90"])).unwrap();
    assert_eq!(c.idle_exit, Some(Duration::from_secs(90)));
    assert!(c.to_toml().contains("idle_exit = 90"), "{}", c.to_toml());
    let err = Config::try_from(cli(&["--idle-exit", "0"])).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("idle_exit") && msg.contains("at least 1 second"),
        "{msg}"
    );
}

#[test]
fn no_tables_means_the_demo_table() {
    let c = Config::try_from(cli(&[])).unwrap();
    assert_eq!(c.tables.len(), 1);
    assert_eq!(c.tables[0].name, DEMO_TABLE);
    assert!(matches!(c.tables[0].backend, Backend::Memory { .. }));
    assert_eq!(c.consumer_lease, Duration::from_secs(300));
    assert_eq!(c.listen, DEFAULT_LISTEN);
}

#[test]
fn table_flags_are_parsed_and_checked() {
    let c = Config::try_from(cli(&["--table", "orders=http://q/1", "--table", "b=u"])).unwrap();
    assert_eq!(c.tables.len(), 2);
    assert_eq!(
        c.tables[0].backend,
        Backend::Sqs {
            queue_url: "http://q/1".into(),
            region: None,
        }
    );
    let err = Config::try_from(cli(&["--table", "orders"])).unwrap_err();
    assert!(err.to_string().contains("NAME=QUEUE_URL"));
    let err = Config::try_from(cli(&["--table", "a=x", "--table", "a=y"])).unwrap_err();
    assert!(err.to_string().contains("twice"));
    let err = Config::try_from(cli(&["--table", "a b=x"])).unwrap_err();
    assert!(err.to_string().contains("table name"));
}

#[test]
fn toml_tables_and_limits() {
    let scratch = crate::scratch::dir("config");
    let dir = scratch.path().to_path_buf();
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "consumer_lease = 10\n[limits]\npartitions = 8\n\
         [tables.orders]\nqueue_url = \"u\"\npartitions = 4\nvisibility_timeout = 60\n",
    )
    .unwrap();
    let c = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap();
    assert_eq!(c.consumer_lease, Duration::from_secs(10));
    assert_eq!(c.limits.partitions, 8);
    let t = c.table("orders").unwrap();
    assert_eq!(t.defaults.partitions, 4);
    assert_eq!(t.defaults.max_messages, DEFAULT_MAX_MESSAGES);
    assert_eq!(t.visibility_timeout, Some(Duration::from_secs(60)));

    for bad in [0, 1, 43_201] {
        let text = format!("[tables.orders]\nqueue_url = \"u\"\nvisibility_timeout = {bad}\n");
        std::fs::write(&path, text).unwrap();
        let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(
            err.to_string().contains("tables.orders.visibility_timeout"),
            "{bad}: {err}"
        );
    }

    std::fs::write(
        &path,
        "[tables.orders]\nqueue_url = \"u\"\npartitions = 9\n[limits]\npartitions = 8\n",
    )
    .unwrap();
    let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
    assert!(
        err.to_string().contains("tables.orders.partitions"),
        "{err}"
    );

    std::fs::write(
        &path,
        "[tables.orders]\nqueue_url = \"u\"\n[tables.orders.payload]\nunwrap = \"sns\"\n\
         fields = [{ name = \"id\", type = \"int64\" }]\n",
    )
    .unwrap();
    let c = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap();
    let p = c.table("orders").unwrap().payload.as_ref().unwrap();
    assert_eq!(p.unwrap, Unwrap::Sns);
    assert_eq!(p.fields[0].name, "id");
    std::fs::write(
        &path,
        "[tables.orders]\nqueue_url = \"u\"\n[tables.orders.payload]\n\
         fields = [{ name = \"id\", type = \"money\" }]\n",
    )
    .unwrap();
    let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
    assert!(
        err.to_string()
            .contains("table \"orders\": payload: id: unknown type"),
        "{err}"
    );

    std::fs::write(&path, "[tables.orders]\nqueue_url = \"u\"\nbogus = 1\n").unwrap();
    let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
}

#[test]
fn tls_files_come_in_pairs_and_token_sources_exclude_each_other() {
    let err = Config::try_from(cli(&["--tls-cert", "c.pem"])).unwrap_err();
    assert!(
        err.to_string().contains("--tls-cert needs --tls-key"),
        "{err}"
    );
    let err = Config::try_from(cli(&["--tls-key", "k.pem"])).unwrap_err();
    assert!(
        err.to_string().contains("--tls-key needs --tls-cert"),
        "{err}"
    );
    let c = Config::try_from(cli(&["--tls-cert", "c.pem", "--tls-key", "k.pem"])).unwrap();
    assert_eq!(c.tls.unwrap().key, PathBuf::from("k.pem"));
    let err = Config::try_from(cli(&[
        "--tls-cert",
        "c.pem",
        "--tls-key",
        "k.pem",
        "--tls-self-signed",
        "d",
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("give one of them"), "{err}");
    assert_eq!(
        c.shutdown_grace,
        Duration::from_secs(DEFAULT_SHUTDOWN_GRACE_SECS)
    );

    let scratch = crate::scratch::dir("token");
    let dir = scratch.path().to_path_buf();
    let file = dir.join("token");
    let file_arg = file.to_str().unwrap();
    std::fs::write(&file, "tok-1\r\n").unwrap();
    chmod(&file, 0o600);
    let c = Config::try_from(cli(&["--auth-token-file", file_arg])).unwrap();
    assert_eq!(c.auth_token.as_deref(), Some("tok-1"));
    let err =
        Config::try_from(cli(&["--auth-token-file", file_arg, "--auth-token", "x"])).unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
    std::fs::write(&file, "\n").unwrap();
    let err = Config::try_from(cli(&["--auth-token-file", file_arg])).unwrap_err();
    assert!(err.to_string().contains("is empty"), "{err}");
    let missing = dir.join("missing");
    let err = Config::try_from(cli(&["--auth-token-file", missing.to_str().unwrap()])).unwrap_err();
    assert!(err.to_string().contains("cannot read"), "{err}");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn sqs_max_attempts_come_from_flag_or_toml_within_limits() {
    let c = Config::try_from(cli(&[])).unwrap();
    assert_eq!(c.sqs_max_attempts, DEFAULT_SQS_MAX_ATTEMPTS);
    let c = Config::try_from(cli(&["--sqs-max-attempts", "8"])).unwrap();
    assert_eq!(c.sqs_max_attempts, 8);
    for bad in ["0", "21"] {
        let err = Config::try_from(cli(&["--sqs-max-attempts", bad])).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("sqs_max_attempts = {bad}")),
            "{err}"
        );
    }
}

#[test]
fn sqs_batch_concurrency_comes_from_flag_or_toml_within_limits() {
    let c = Config::try_from(cli(&[])).unwrap();
    assert_eq!(c.sqs_batch_concurrency, DEFAULT_SQS_BATCH_CONCURRENCY);
    let c = Config::try_from(cli(&["--sqs-batch-concurrency", "64"])).unwrap();
    assert_eq!(c.sqs_batch_concurrency, 64);
    for bad in ["0", "513"] {
        let err = Config::try_from(cli(&["--sqs-batch-concurrency", bad])).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("sqs_batch_concurrency = {bad}")),
            "{err}"
        );
    }
}

#[test]
fn receivers_have_a_table_default_and_a_limit() {
    let c = Config::try_from(cli(&["--table", "t=http://q"])).unwrap();
    assert_eq!(c.tables[0].defaults.receivers, DEFAULT_RECEIVERS);
    assert_eq!(c.limits.receivers, LIMIT_RECEIVERS);
    let c = Config::try_from(cli(&["--table", "t=http://q", "--limit-receivers", "4"]));
    let err = c.unwrap_err().to_string();
    assert!(err.contains("tables.t.receivers"), "{err}");
    assert!(err.contains("the limit is 4"), "{err}");
}

#[test]
fn a_table_region_must_agree_with_its_queue_url() {
    let scratch = crate::scratch::dir("region");
    let dir = scratch.path().to_path_buf();
    let path = dir.join("c.toml");
    let load = |table: &str| {
        std::fs::write(&path, format!("[tables.orders]\n{table}")).unwrap();
        Config::try_from(cli(&["--config", path.to_str().unwrap()]))
    };
    let aws = "queue_url = \"https://sqs.eu-west-1.amazonaws.com/123/q\"\n";
    let c = load(&format!("{aws}region = \"eu-west-1\"\n")).unwrap();
    assert!(
        c.to_toml().contains("region = \"eu-west-1\""),
        "{}",
        c.to_toml()
    );
    let c =
        load("queue_url = \"http://127.0.0.1:4566/000000000000/q\"\nregion = \"local\"\n").unwrap();
    assert!(matches!(&c.tables[0].backend, Backend::Sqs { region: Some(r), .. } if r == "local"));
    let err = load(&format!("{aws}region = \"us-east-1\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tables.orders.region")
            && err.contains("us-east-1")
            && err.contains("eu-west-1"),
        "{err}"
    );
    let err = load(&format!("{aws}region = \"\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tables.orders.region") && err.contains("empty"),
        "{err}"
    );
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_token_file_or_a_toml_file_with_auth_token_that_others_can_read_is_refused() {
    let (_dir, path) = toml_file("token-perms", "auth_token = \"tok-2\"\n");
    let p = path.to_str().unwrap();
    chmod(&path, 0o644);
    let err = Config::try_from(cli(&["--config", p]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("holds auth_token") && err.contains(&format!("chmod 600 {p}")),
        "{err}"
    );
    chmod(&path, 0o600);
    let c = Config::try_from(cli(&["--config", p])).unwrap();
    assert_eq!(c.auth_token.as_deref(), Some("tok-2"));
    // Without a token the file is no secret: others may read it.
    std::fs::write(&path, "consumer_lease = 60\n").unwrap();
    chmod(&path, 0o644);
    Config::try_from(cli(&["--config", p])).unwrap();

    let token = path.with_file_name("token");
    std::fs::write(&token, "tok-3\n").unwrap();
    let t = token.to_str().unwrap();
    for (mode, why) in [(0o644, "read"), (0o620, "write")] {
        chmod(&token, mode);
        let err = Config::try_from(cli(&["--auth-token-file", t]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("auth_token_file") && err.contains(&format!("chmod 600 {t}")),
            "{why}: {err}"
        );
    }
    chmod(&token, 0o400);
    let c = Config::try_from(cli(&["--auth-token-file", t])).unwrap();
    assert_eq!(c.auth_token.as_deref(), Some("tok-3"));
    std::os::unix::fs::chown(&token, Some(65534), None).unwrap();
    let err = Config::try_from(cli(&["--auth-token-file", t]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("uid 65534") && err.contains("chown"), "{err}");
}

#[test]
fn each_declared_bound_is_checked_naming_the_setting() {
    for (flag, value, message) in [
        (
            "--sqs-max-attempts",
            "0",
            "sqs_max_attempts = 0: must be 1 to 20",
        ),
        (
            "--sqs-max-attempts",
            "21",
            "sqs_max_attempts = 21: must be 1 to 20",
        ),
        (
            "--sqs-batch-concurrency",
            "513",
            "sqs_batch_concurrency = 513: must be 1 to 512",
        ),
        ("--max-tickets", "0", "max_tickets = 0: must be at least 1"),
        (
            "--max-connections",
            "0",
            "max_connections = 0: must be at least 1",
        ),
        (
            "--preface-timeout",
            "0",
            "preface_timeout = 0: must be at least 1",
        ),
        (
            "--max-handshake-bytes",
            "255",
            "max_handshake_bytes = 255: must be 256 to 1048576",
        ),
        (
            "--max-command-bytes",
            "4095",
            "max_command_bytes = 4095: must be 4096 to 1073741824",
        ),
    ] {
        let err = Config::try_from(cli(&[flag, value])).unwrap_err();
        assert_eq!(err.to_string(), message);
    }
    let c = Config::try_from(cli(&["--sqs-max-attempts", "20", "--max-tickets", "1"])).unwrap();
    assert_eq!((c.sqs_max_attempts, c.max_tickets), (20, 1));
}

#[test]
fn rtt_ms_is_for_in_memory_tables_within_its_bounds() {
    let scratch = crate::scratch::dir("rtt");
    let dir = scratch.path().to_path_buf();
    let path = dir.join("c.toml");
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        Config::try_from(cli(&["--config", path.to_str().unwrap()]))
    };
    let memory = |sample_messages, ms| Backend::Memory {
        sample_messages,
        rtt: Duration::from_millis(ms),
    };
    let c = load("[tables.sim]\nsample_messages = 5\nrtt_ms = 20\n").unwrap();
    assert_eq!(c.table("sim").unwrap().backend, memory(5, 20));
    // It reads back from --print-config.
    let back = load(&c.to_toml()).unwrap();
    assert_eq!(back.tables, c.tables);
    let c = load("[tables.sim]\nsample_messages = 0\n").unwrap();
    assert_eq!(c.tables[0].backend, memory(0, DEFAULT_RTT_MS));
    let c = load(&format!(
        "[tables.sim]\nsample_messages = 0\nrtt_ms = {MAX_RTT_MS}\n"
    ))
    .unwrap();
    assert_eq!(c.tables[0].backend, memory(0, MAX_RTT_MS));

    for bad in [MAX_RTT_MS + 1, 4_000_000_000] {
        let err = load(&format!(
            "[tables.sim]\nsample_messages = 0\nrtt_ms = {bad}\n"
        ))
        .unwrap_err()
        .to_string();
        let want = format!("tables.sim.rtt_ms = {bad}: must be 0 to 10000 milliseconds");
        assert_eq!(err, want);
    }
    let err = load("[tables.orders]\nqueue_url = \"u\"\nrtt_ms = 20\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("tables.orders.rtt_ms: rtt_ms applies to the in-memory backend only"),
        "{err}"
    );
    let err = load("[tables.orders]\nqueue_url = \"u\"\nsample_messages = 1\n").unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
    let err = load("[tables.orders]\npartitions = 2\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("tables.orders.queue_url: missing"),
        "{err}"
    );
    let err = load("[tables.sim]\nsample_messages = 1\nregion = \"eu-west-1\"\n").unwrap_err();
    assert!(err.to_string().starts_with("tables.sim.region"), "{err}");
}

#[test]
fn deletes_behind_is_off_unless_the_flag_says_so() {
    let of = |args: &[&str]| Config::try_from(cli(args)).unwrap().deletes_behind;
    assert!(!of(&[]));
    assert!(of(&["--deletes-behind"]), "the flag alone turns it on");
    assert!(of(&["--deletes-behind", "true"]));
    assert!(!of(&["--deletes-behind", "false"]));
    // A table after the flag is not taken for its value.
    let c = Config::try_from(cli(&["--deletes-behind", "--table", "t=https://q"]));
    assert!(c.unwrap().deletes_behind);
}

#[test]
fn the_state_urls_role_needs_an_s3_url_and_is_checked_as_a_tables() {
    let arn = "arn:aws:iam::210987654321:role/state-writer";
    let ok = cli(&[
        "--state-url",
        "s3://b/p",
        "--state-url-role-arn",
        arn,
        "--state-url-role-external-id",
        "ext-42",
    ]);
    let role = Config::try_from(ok)
        .unwrap()
        .state_url_role()
        .unwrap()
        .unwrap();
    assert_eq!(role.arn, arn);
    assert_eq!(role.session_name("state"), "sqs-flight-state");
    let url = ["--state-url", "s3://b/p"];
    let refused = [
        (
            vec!["--state-url-role-arn", arn],
            "state_url_role_arn: applies to the S3 calls",
        ),
        (
            vec!["--state-url", "/var/lib/s", "--state-url-role-arn", arn],
            "state_url_role_arn: applies to the S3 calls",
        ),
        (
            [&url[..], &["--state-url-role-session-name", "s1"]].concat(),
            "state_url_role_session_name: needs state_url_role_arn",
        ),
        (
            [&url[..], &["--state-url-role-arn", "arn:aws:iam::1:role/r"]].concat(),
            "state_url_role_arn: \"arn:aws:iam::1:role/r\" is not a role ARN",
        ),
        (
            [
                &url[..],
                &[
                    "--state-url-role-arn",
                    arn,
                    "--state-url-role-external-id",
                    "x",
                ],
            ]
            .concat(),
            "state_url_role_external_id: the external id is 1 characters long",
        ),
    ];
    for (args, says) in refused {
        let e = Config::try_from(cli(&args)).unwrap_err().to_string();
        assert!(e.starts_with(says), "{args:?}: {e}");
    }
}
