//! The server binary checks its own files at start: the state directory
//! and every directory above it, `--tls-self-signed DIR` and its key, a
//! token file and a TOML file holding `auth_token` are refused when another
//! user owns them or could change them (or read them, for secrets), with a
//! message naming the path and the fix; what it makes is `0600`; a
//! certificate it made is made again when it nears its end.
//!
//! The tests run as root: "another user" is uid 65534 (nobody), set with
//! chown on a scratch directory that each test removes.

use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sqs_flight_client::Client;
use sqs_flight_server::testing::{hosts_for, not_after};
use sqs_flight_tests::process::die_with_parent;
use sqs_flight_tests::server_process::{ServerProcess, server_binary};

use sqs_flight_tests::prelude::{TempDir, bounded, temp_dir};

/// A user the tests run beside ("nobody").
const OTHER: u32 = 65534;
const DAY: i64 = 86_400;

/// A scratch directory (mode 0755, under the temp dir), removed at drop.
struct Scratch(TempDir);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = temp_dir(&format!("perms-{name}"));
        chmod(dir.path(), 0o755);
        Self(dir)
    }

    /// `name` in it, a directory made with `mode`.
    fn dir(&self, name: &str, mode: u32) -> PathBuf {
        let dir = self.0.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        chmod(&dir, mode);
        dir
    }

    /// `name` in it, a file holding `text` with `mode`.
    fn file(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).unwrap();
        chmod(&path, mode);
        path
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

/// The tests' own uid (the scratch directory's owner).
fn me(scratch: &Scratch) -> u32 {
    std::fs::metadata(scratch.0.path()).unwrap().uid()
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs the server binary (the demo table, a free port) with `args`,
/// expects it to exit at start with an error, and returns its stderr.
async fn refused(args: &[&str]) -> String {
    let mut cmd = Command::new(server_binary());
    cmd.args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    let out = bounded(tokio::task::spawn_blocking(move || cmd.output()))
        .await
        .unwrap()
        .expect("run the server");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started with {args:?}: {stderr}");
    stderr
}

/// [`refused`], whose stderr names each of `named`.
async fn refused_naming(args: &[&str], named: &[&str]) {
    let stderr = refused(args).await;
    for n in named {
        assert!(stderr.contains(n), "names {n:?}: {stderr}");
    }
}

#[tokio::test]
async fn a_state_dir_another_user_could_change_is_refused_at_start() {
    let scratch = Scratch::new("state");
    let state = scratch.dir("state", 0o700);
    chown(&state, Some(OTHER), None).unwrap();
    refused_naming(
        &["--state-dir", arg(&state)],
        &[arg(&state), "uid 65534", "chown"],
    )
    .await;
    chown(&state, Some(me(&scratch)), None).unwrap();
    chmod(&state, 0o777);
    refused_naming(
        &["--state-dir", arg(&state)],
        &[&format!("chmod 700 {}", state.display())],
    )
    .await;

    // A private directory in a parent anyone can write: it could be swapped.
    let open = scratch.dir("open", 0o777);
    let inside = scratch.dir("open/state", 0o700);
    refused_naming(
        &["--state-dir", arg(&inside)],
        &[&format!("chmod go-w {}", open.display()), arg(&inside)],
    )
    .await;
    // A parent of another user's.
    chmod(&open, 0o755);
    chown(&open, Some(OTHER), None).unwrap();
    refused_naming(&["--state-dir", arg(&inside)], &[arg(&open), "uid 65534"]).await;
    // Through a link, the real directory is what is checked.
    let link = scratch.0.path().join("link");
    std::os::unix::fs::symlink(&inside, &link).unwrap();
    refused_naming(&["--state-dir", arg(&link)], &[arg(&open), "uid 65534"]).await;
    assert!(!inside.join("registry.redb").exists(), "nothing made");
}

#[tokio::test]
async fn the_store_is_made_0600_and_an_older_looser_one_is_tightened() {
    let scratch = Scratch::new("store");
    let state = scratch.0.path().join("made/state");
    let start = || ServerProcess::start(&["--listen", "127.0.0.1:0", "--state-dir", arg(&state)]);
    // The umask (022) would leave a file made 0666 readable by all.
    drop(start());
    assert_eq!(mode(&state.join("registry.redb")), 0o600);
    assert_eq!(mode(&state), 0o700);
    assert_eq!(
        mode(&scratch.0.path().join("made")),
        0o700,
        "its missing parent too"
    );
    chmod(&state.join("registry.redb"), 0o644);
    drop(start());
    assert_eq!(mode(&state.join("registry.redb")), 0o600, "tightened");
    chown(state.join("registry.redb"), Some(OTHER), None).unwrap();
    refused_naming(
        &["--state-dir", arg(&state)],
        &["registry.redb", "uid 65534"],
    )
    .await;
}

#[tokio::test]
async fn token_files_and_a_toml_with_auth_token_that_others_can_read_are_refused() {
    let scratch = Scratch::new("token");
    let token = scratch.file("token", "tok\n", 0o644);
    refused_naming(
        &["--auth-token-file", arg(&token)],
        &["auth_token_file", &format!("chmod 600 {}", token.display())],
    )
    .await;
    chmod(&token, 0o600);
    chown(&token, Some(OTHER), None).unwrap();
    refused_naming(
        &["--auth-token-file", arg(&token)],
        &[arg(&token), "uid 65534", "chown"],
    )
    .await;

    let toml = scratch.file("c.toml", "auth_token = \"tok\"\n", 0o640);
    refused_naming(
        &["--config", arg(&toml)],
        &["auth_token", &format!("chmod 600 {}", toml.display())],
    )
    .await;
}

#[tokio::test]
async fn a_tls_dir_others_could_change_or_a_key_they_can_read_is_refused() {
    let scratch = Scratch::new("tls");
    let open = scratch.dir("open", 0o777);
    refused_naming(
        &["--tls-self-signed", arg(&open.join("tls"))],
        &[
            "--tls-self-signed",
            &format!("chmod go-w {}", open.display()),
        ],
    )
    .await;
    assert!(!open.join("tls").exists(), "nothing made in it");

    // The operator's own pair (no hosts file): its key readable by others.
    let tls = scratch.dir("tls", 0o700);
    let made = rcgen::generate_simple_self_signed(hosts_for(None)).unwrap();
    std::fs::write(tls.join("cert.pem"), made.cert.pem()).unwrap();
    std::fs::write(tls.join("key.pem"), made.signing_key.serialize_pem()).unwrap();
    chmod(&tls.join("key.pem"), 0o644);
    let key = tls.join("key.pem");
    let chmod_600 = format!("chmod 600 {}", key.display());
    refused_naming(&["--tls-self-signed", arg(&tls)], &[&chmod_600]).await;
    chmod(&key, 0o600);
    chown(&key, Some(OTHER), None).unwrap();
    refused_naming(&["--tls-self-signed", arg(&tls)], &[arg(&key), "uid 65534"]).await;
}

#[tokio::test]
async fn a_made_certificate_near_its_end_is_made_again_at_start_with_a_new_key() {
    let scratch = Scratch::new("renew");
    let tls = scratch.dir("tls", 0o700);
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let now = time::OffsetDateTime::from_unix_timestamp(secs as i64).unwrap();
    let hosts = hosts_for(None);
    let mut params = rcgen::CertificateParams::new(hosts.clone()).unwrap();
    params.not_before = now - time::Duration::days(360);
    params.not_after = now + time::Duration::days(5);
    let key = rcgen::KeyPair::generate().unwrap();
    let old_cert = params.self_signed(&key).unwrap().pem();
    let old_key = key.serialize_pem();
    std::fs::write(tls.join("cert.pem"), &old_cert).unwrap();
    std::fs::write(tls.join("key.pem"), &old_key).unwrap();
    chmod(&tls.join("key.pem"), 0o600);
    std::fs::write(tls.join("hosts"), hosts.join("\n") + "\n").unwrap();

    let server = ServerProcess::start(&["--listen", "127.0.0.1:0", "--tls-self-signed", arg(&tls)]);
    let cert = std::fs::read_to_string(tls.join("cert.pem")).unwrap();
    assert_ne!(
        std::fs::read_to_string(tls.join("key.pem")).unwrap(),
        old_key,
        "a new key"
    );
    let end = not_after(&cert).expect("a readable certificate");
    let left = end - now.unix_timestamp();
    assert!(
        (360 * DAY..=366 * DAY).contains(&left),
        "about a year: {left} s"
    );
    assert_eq!(mode(&tls.join("key.pem")), 0o600);
    // The server serves the new one: a client trusting it gets an answer.
    let client = bounded(
        Client::builder(server.url.clone())
            .ca_certificate_file(tls.join("cert.pem"))
            .connect(),
    )
    .await
    .unwrap();
    assert_eq!(bounded(client.tables()).await.unwrap(), ["demo"]);
}
