//! `--tls-self-signed DIR`: TLS without a certificate to hand.
//!
//! A server that a program starts for itself on a cluster (the Spark
//! source's managed mode) must not send its bearer token across the network
//! in plaintext, and its starter has no certificate to give it. So the
//! server makes one: a self-signed certificate whose names are the hosts it
//! is reached by, kept in DIR (`cert.pem`, `key.pem` mode 0600, and `hosts`,
//! the names it covers) and reused at the next start while it still covers
//! them; the starter hands `cert.pem` to the clients as their trust root.
//!
//! A `cert.pem` and `key.pem` put in DIR without a `hosts` file are the
//! operator's own: they are used as they are and never replaced.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::config::TlsFiles;

/// The names every generated certificate covers beside the advertised host.
const ALWAYS_COVERED: &[&str] = &["localhost", "127.0.0.1"];

/// Why the certificate could not be made or kept.
#[derive(Debug, thiserror::Error)]
pub enum SelfSignedError {
    #[error("--tls-self-signed {dir}: {source}")]
    Io {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--tls-self-signed: cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// The names a certificate for a server advertised at `advertise` (a
/// location URI, if any) must cover: its host, this machine's host name,
/// `localhost` and `127.0.0.1`.
pub fn hosts_for(advertise: Option<&str>) -> Vec<String> {
    let mut hosts: Vec<String> = ALWAYS_COVERED.iter().map(|h| h.to_string()).collect();
    if let Some(host) = advertise.and_then(location_host) {
        hosts.push(host);
    }
    if let Some(name) = host_name() {
        hosts.push(name);
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

/// `host` of `scheme://host:port[/...]` (brackets of an IPv6 host dropped).
fn location_host(uri: &str) -> Option<String> {
    let rest = uri.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// The certificate and key in `dir` for `hosts`: the ones there when they
/// cover every host (or are the operator's own), else new ones.
pub fn ensure(dir: &Path, hosts: &[String]) -> Result<TlsFiles, SelfSignedError> {
    let io = |source| SelfSignedError::Io {
        dir: dir.display().to_string(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    let listed = dir.join("hosts");
    if files.cert.exists() && files.key.exists() {
        match std::fs::read_to_string(&listed) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(dir = %dir.display(), "TLS: using the certificate in the directory as it is (no hosts file: the operator's own)");
                return Ok(files);
            }
            Err(e) => return Err(io(e)),
            Ok(text) if covers(&text, hosts) => return Ok(files),
            Ok(_) => tracing::info!(
                ?hosts,
                "TLS: the self-signed certificate does not cover every host; making a new one"
            ),
        }
    }
    let made = rcgen::generate_simple_self_signed(hosts.to_vec())?;
    write_private(&files.key, made.signing_key.serialize_pem().as_bytes()).map_err(io)?;
    write_private(&files.cert, made.cert.pem().as_bytes()).map_err(io)?;
    write_private(&listed, (hosts.join("\n") + "\n").as_bytes()).map_err(io)?;
    tracing::info!(dir = %dir.display(), ?hosts, "TLS: made a self-signed certificate");
    Ok(files)
}

fn covers(listed: &str, hosts: &[String]) -> bool {
    let have: Vec<&str> = listed.lines().map(str::trim).collect();
    hosts.iter().all(|h| have.contains(&h.as_str()))
}

/// Writes `path` whole: a temp file created exclusively, without following
/// links, mode 0600, synced, then renamed over `path`.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp); // a leftover of a crashed start of this pid
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_hosts() {
        assert_eq!(
            location_host("grpc+tls://10.0.0.5:4000").as_deref(),
            Some("10.0.0.5")
        );
        assert_eq!(
            location_host("grpc+tls://[::1]:4000").as_deref(),
            Some("::1")
        );
        assert_eq!(
            location_host("grpc://driver.local").as_deref(),
            Some("driver.local")
        );
        assert_eq!(location_host("nonsense"), None);
    }

    #[test]
    fn a_certificate_is_made_once_kept_private_and_remade_for_a_new_host() {
        let dir = std::env::temp_dir().join(format!("sqsf-selfsigned-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let hosts = hosts_for(Some("grpc+tls://10.1.2.3:7000"));
        assert!(
            hosts.contains(&"10.1.2.3".to_string()) && hosts.contains(&"localhost".to_string())
        );
        let files = ensure(&dir, &hosts).unwrap();
        let key_mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
        assert_eq!(key_mode & 0o777, 0o600);
        let first = std::fs::read(&files.cert).unwrap();
        ensure(&dir, &hosts).unwrap();
        assert_eq!(std::fs::read(&files.cert).unwrap(), first, "reused");
        ensure(&dir, &hosts_for(Some("grpc+tls://10.9.9.9:7000"))).unwrap();
        assert_ne!(
            std::fs::read(&files.cert).unwrap(),
            first,
            "remade for a new host"
        );
        // The operator's own pair (no hosts file) is never replaced.
        std::fs::remove_file(dir.join("hosts")).unwrap();
        let own = std::fs::read(&files.cert).unwrap();
        ensure(&dir, &hosts_for(Some("grpc+tls://10.7.7.7:7000"))).unwrap();
        assert_eq!(std::fs::read(&files.cert).unwrap(), own);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
