//! `--tls-self-signed DIR`: TLS without a certificate to hand.
//!
//! A server that a program starts for itself on a cluster (the Spark
//! source's managed mode) must not send its bearer token across the network
//! in plaintext, and its starter has no certificate to give it. So the
//! server makes one: a self-signed certificate whose names are the hosts it
//! is reached by, kept in DIR (`cert.pem`, `key.pem` mode 0600, and `hosts`,
//! the names it covers) and reused at the next start while it still covers
//! them and is valid for more than [`RENEW_BEFORE_DAYS`]; the starter hands
//! `cert.pem` to the clients as their trust root. A made certificate lives
//! [`LIFETIME_DAYS`], and each one made has a new key.
//!
//! A `cert.pem` and `key.pem` put in DIR without a `hosts` file are the
//! operator's own: they are used as they are and never replaced (a warning
//! is logged when they expire within [`RENEW_BEFORE_DAYS`]).
//!
//! DIR, and every directory above it, must be safe from other users, and
//! the key readable by this user only (see [`crate::secure_path`]): whoever
//! can change them can listen in on every client.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;

use crate::config::TlsFiles;
use crate::secure_path::{self, PathError};

/// The names every generated certificate covers beside the advertised host.
const ALWAYS_COVERED: &[&str] = &["localhost", "127.0.0.1"];

/// Days a made certificate is valid (from its making).
pub(crate) const LIFETIME_DAYS: i64 = 365;
/// A made certificate valid for fewer days than this at start is made
/// again, with a new key.
pub(crate) const RENEW_BEFORE_DAYS: i64 = 30;
/// Days a made certificate is valid before its making, for clients whose
/// clock is a little behind.
const BACKDATE_DAYS: i64 = 1;
const DAY_SECS: i64 = 86_400;

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
    /// DIR or a file in it could be changed (or the key read) by another user.
    #[error("--tls-self-signed: {0}")]
    Unsafe(#[from] PathError),
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
/// cover every host and are not due for renewal (or are the operator's
/// own), else new ones.
pub(crate) fn ensure(dir: &Path, hosts: &[String]) -> Result<TlsFiles, SelfSignedError> {
    let dir = secure_path::private_dir(dir)?;
    let io = |source| SelfSignedError::Io {
        dir: dir.display().to_string(),
        source,
    };
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    let listed = dir.join("hosts");
    if files.cert.exists() && files.key.exists() {
        check_files(&files, &listed)?;
        let expires = not_after(&std::fs::read_to_string(&files.cert).map_err(io)?);
        match std::fs::read_to_string(&listed) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                warn_if_expiring(&files, expires);
                tracing::info!(dir = %dir.display(), "TLS: using the certificate in the directory as it is (no hosts file: the operator's own)");
                return Ok(files);
            }
            Err(e) => return Err(io(e)),
            Ok(text) if !covers(&text, hosts) => tracing::info!(
                ?hosts,
                "TLS: the self-signed certificate does not cover every host; making a new one"
            ),
            Ok(_) if renewal_due(expires, now()) => tracing::info!(
                expires_at = ?expires,
                "TLS: the self-signed certificate expires within {RENEW_BEFORE_DAYS} days (or outlives {LIFETIME_DAYS}); making a new one with a new key"
            ),
            Ok(_) => return Ok(files),
        }
    }
    let (cert, key) = generate(hosts, now())?;
    write_private(&files.key, key.as_bytes()).map_err(io)?;
    write_private(&files.cert, cert.as_bytes()).map_err(io)?;
    write_private(&listed, (hosts.join("\n") + "\n").as_bytes()).map_err(io)?;
    tracing::info!(dir = %dir.display(), ?hosts, days = LIFETIME_DAYS, "TLS: made a self-signed certificate");
    Ok(files)
}

/// The files already in DIR: the key a secret, the certificate and the
/// hosts list this user's and not writable by others.
fn check_files(files: &TlsFiles, listed: &Path) -> Result<(), SelfSignedError> {
    let meta = |p: &Path| {
        std::fs::metadata(p).map_err(|source| PathError::Io {
            path: p.to_path_buf(),
            source,
        })
    };
    secure_path::check_secret(&files.key, &meta(&files.key)?)?;
    secure_path::check_owned_file(&files.cert, &meta(&files.cert)?)?;
    if listed.exists() {
        secure_path::check_owned_file(listed, &meta(listed)?)?;
    }
    Ok(())
}

/// Whether a made certificate valid until `expires` (Unix seconds; `None`:
/// unreadable) must be made again at `now`: it expires within
/// [`RENEW_BEFORE_DAYS`], or it outlives [`LIFETIME_DAYS`] (made by a
/// server before this limit, valid until the year 4096, its key never
/// changed).
fn renewal_due(expires: Option<i64>, now: i64) -> bool {
    expires.is_none_or(|t| {
        t - now < RENEW_BEFORE_DAYS * DAY_SECS || t - now > (LIFETIME_DAYS + 1) * DAY_SECS
    })
}

fn warn_if_expiring(files: &TlsFiles, expires: Option<i64>) {
    if let Some(t) = expires.filter(|t| t - now() < RENEW_BEFORE_DAYS * DAY_SECS) {
        tracing::warn!(cert = %files.cert.display(), expires_at = t,
            "TLS: your certificate expires within {RENEW_BEFORE_DAYS} days (or has expired); replace it");
    }
}

/// Seconds since the Unix epoch.
fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A new key and a certificate for `hosts` valid from a day before `now`
/// for [`LIFETIME_DAYS`]: `(cert PEM, key PEM)`.
fn generate(hosts: &[String], now: i64) -> Result<(String, String), rcgen::Error> {
    made_until(hosts, now, now + LIFETIME_DAYS * DAY_SECS)
}

/// [`generate`] valid until `not_after` (Unix seconds).
fn made_until(
    hosts: &[String],
    now: i64,
    not_after: i64,
) -> Result<(String, String), rcgen::Error> {
    let at = |secs| {
        time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    };
    let mut params = rcgen::CertificateParams::new(hosts.to_vec())?;
    params.not_before = at(now - BACKDATE_DAYS * DAY_SECS);
    params.not_after = at(not_after);
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The `notAfter` (Unix seconds) of the first certificate in `pem`; `None`
/// when it cannot be read. A few lines of DER rather than an X.509 crate:
/// the path to the field is fixed (RFC 5280 4.1).
pub fn not_after(pem: &str) -> Option<i64> {
    let b64: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .map(str::trim)
        .collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let (_, cert, _) = der_next(&der).filter(|(tag, ..)| *tag == SEQUENCE)?;
    let (_, mut tbs, _) = der_next(cert).filter(|(tag, ..)| *tag == SEQUENCE)?;
    if tbs.first() == Some(&EXPLICIT_VERSION) {
        tbs = der_next(tbs)?.2;
    }
    for _ in ["serialNumber", "signature", "issuer"] {
        tbs = der_next(tbs)?.2;
    }
    let (_, validity, _) = der_next(tbs).filter(|(tag, ..)| *tag == SEQUENCE)?;
    let not_before_rest = der_next(validity)?.2;
    let (tag, value, _) = der_next(not_before_rest)?;
    asn1_time(tag, value)
}

const SEQUENCE: u8 = 0x30;
const EXPLICIT_VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// `(tag, content, rest)` of the first DER element of `der`.
fn der_next(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let (bytes, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
        if bytes.is_empty() || bytes.len() > 4 {
            return None;
        }
        (bytes.iter().fold(0, |n, b| n << 8 | usize::from(*b)), rest)
    };
    let (content, rest) = rest.split_at_checked(len)?;
    Some((tag, content, rest))
}

/// A UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) as
/// Unix seconds.
fn asn1_time(tag: u8, value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        UTC_TIME => {
            let yy: i32 = text.get(..2)?.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        GENERALIZED_TIME => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    if rest.len() != 10 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let two = |i: usize| rest.get(i..i + 2)?.parse::<u8>().ok();
    let month = time::Month::try_from(two(0)?).ok()?;
    let date = time::Date::from_calendar_date(year, month, two(2)?).ok()?;
    let at = date.with_hms(two(4)?, two(6)?, two(8)?).ok()?;
    Some(at.assume_utc().unix_timestamp())
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
        let scratch = crate::scratch::dir("selfsigned");
        let dir = scratch.path().join("tls");
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
    }

    /// A fresh directory under the temp dir, removed at drop.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("sqsf-selfsigned-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn a_made_certificate_lives_a_year_and_its_end_is_read_back() {
        let hosts = hosts_for(None);
        let t = now();
        let (cert, _) = generate(&hosts, t).unwrap();
        assert_eq!(
            not_after(&cert),
            Some(t + LIFETIME_DAYS * DAY_SECS),
            "UTCTime"
        );
        let far = rcgen::generate_simple_self_signed(hosts)
            .unwrap()
            .cert
            .pem();
        let millennium = 1000 * 365 * DAY_SECS;
        assert!(
            not_after(&far).unwrap() > t + millennium,
            "GeneralizedTime (4096)"
        );
        assert_eq!(
            not_after("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
            None
        );
        assert_eq!(not_after(""), None);
    }

    #[test]
    fn renewal_is_due_near_the_end_after_it_or_for_a_certificate_made_without_an_end() {
        let t = 1_000_000_000;
        assert!(!renewal_due(Some(t + 200 * DAY_SECS), t));
        assert!(
            !renewal_due(Some(t + LIFETIME_DAYS * DAY_SECS), t),
            "just made"
        );
        assert!(renewal_due(Some(t + (RENEW_BEFORE_DAYS - 1) * DAY_SECS), t));
        assert!(renewal_due(Some(t - DAY_SECS), t), "expired");
        assert!(
            renewal_due(Some(t + 3000 * 365 * DAY_SECS), t),
            "valid until 4096"
        );
        assert!(renewal_due(None, t), "unreadable");
    }

    #[test]
    fn a_certificate_near_its_end_is_made_again_with_a_new_key() {
        let scratch = Scratch::new("renew");
        let hosts = hosts_for(None);
        let files = ensure(&scratch.0, &hosts).unwrap();
        // As if made 360 days ago: 5 days left.
        let t = now();
        let (cert, key) = made_until(&hosts, t - 360 * DAY_SECS, t + 5 * DAY_SECS).unwrap();
        write_private(&files.cert, cert.as_bytes()).unwrap();
        write_private(&files.key, key.as_bytes()).unwrap();
        let files = ensure(&scratch.0, &hosts).unwrap();
        assert_ne!(read(&files.key), key, "a new key");
        let end = not_after(&read(&files.cert)).unwrap();
        assert!(end >= t + LIFETIME_DAYS * DAY_SECS, "a new year: {end} {t}");
        // One with 200 days left is kept.
        let (cert, key) = made_until(&hosts, t - 165 * DAY_SECS, t + 200 * DAY_SECS).unwrap();
        write_private(&files.cert, cert.as_bytes()).unwrap();
        write_private(&files.key, key.as_bytes()).unwrap();
        ensure(&scratch.0, &hosts).unwrap();
        assert_eq!(read(&files.key), key, "kept");
        // One of an older server, valid until 4096, is replaced.
        let old = rcgen::generate_simple_self_signed(hosts.clone()).unwrap();
        write_private(&files.cert, old.cert.pem().as_bytes()).unwrap();
        ensure(&scratch.0, &hosts).unwrap();
        assert_eq!(
            not_after(&read(&files.cert)).map(|e| e - now() < 400 * DAY_SECS),
            Some(true)
        );
    }

    #[test]
    fn a_key_others_can_read_or_a_directory_of_another_user_is_refused() {
        use std::os::unix::fs::chown;
        let scratch = Scratch::new("perms");
        let hosts = hosts_for(None);
        let files = ensure(&scratch.0, &hosts).unwrap();
        std::fs::remove_file(scratch.0.join("hosts")).unwrap(); // the operator's own pair
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ensure(&scratch.0, &hosts).unwrap_err().to_string();
        assert!(
            e.contains(&format!("chmod 600 {}", files.key.display())),
            "{e}"
        );
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).unwrap();
        ensure(&scratch.0, &hosts).unwrap();
        chown(&files.cert, Some(65534), None).unwrap();
        let e = ensure(&scratch.0, &hosts).unwrap_err().to_string();
        assert!(e.contains("uid 65534") && e.contains("cert.pem"), "{e}");
        chown(&scratch.0, Some(65534), None).unwrap();
        let e = ensure(&scratch.0, &hosts).unwrap_err().to_string();
        assert!(e.contains("uid 65534") && e.contains("chown"), "{e}");
    }
}
