//! What one client may make the server do: concurrent streams per peer
//! address, and rows and bytes per DoPut call. The stream counter also
//! counts every open stream for `--idle-exit` ([`crate::idle`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use tonic::Status;

use crate::config::Config;
use crate::idle::{self, Activity};

/// Per-client limits, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientLimits {
    /// Open DoGet and DoPut streams per peer IP address.
    pub max_streams_per_client: u32,
    /// Rows one DoPut call may send.
    pub max_put_rows: u64,
    /// Bytes (as SQS counts them: bodies and attributes) one DoPut call may send.
    pub max_put_bytes: u64,
    /// Bytes one gRPC message may hold, and one DoPut message decode to.
    pub max_request_bytes: u64,
    /// Bytes of a command, ticket or action body.
    pub max_command_bytes: u64,
    /// Bytes of one DoPut schema message.
    pub max_put_schema_bytes: u64,
    /// Bytes of schemas and dictionaries all DoPut streams hold together.
    pub max_put_held_bytes: u64,
    /// How long a DoPut stream may send nothing.
    pub put_idle_timeout: std::time::Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            max_streams_per_client: crate::config::DEFAULT_MAX_STREAMS_PER_CLIENT,
            max_put_rows: crate::config::DEFAULT_MAX_PUT_ROWS,
            max_put_bytes: crate::config::DEFAULT_MAX_PUT_BYTES,
            max_request_bytes: crate::config::DEFAULT_MAX_REQUEST_BYTES,
            max_command_bytes: crate::config::DEFAULT_MAX_COMMAND_BYTES,
            max_put_schema_bytes: crate::config::DEFAULT_MAX_PUT_SCHEMA_BYTES,
            max_put_held_bytes: crate::config::DEFAULT_MAX_PUT_HELD_BYTES,
            put_idle_timeout: std::time::Duration::from_secs(
                crate::config::DEFAULT_PUT_IDLE_TIMEOUT_SECS,
            ),
        }
    }
}

impl ClientLimits {
    /// Refuses `bytes` (the command, ticket or action body `what`) above
    /// `max_command_bytes`, before anything parses it.
    pub(crate) fn check_command(
        &self,
        what: &str,
        bytes: &[u8],
    ) -> Result<(), crate::error::Error> {
        let max = self.max_command_bytes;
        if bytes.len() as u64 <= max {
            return Ok(());
        }
        Err(crate::error::Error::limit(
            "max_command_bytes",
            format!(
                "{what} is {} bytes, above the limit of {max} bytes (max_command_bytes)",
                bytes.len()
            ),
        ))
    }
}

impl From<&Config> for ClientLimits {
    fn from(c: &Config) -> Self {
        Self {
            max_streams_per_client: c.max_streams_per_client,
            max_put_rows: c.max_put_rows,
            max_put_bytes: c.max_put_bytes,
            max_request_bytes: c.max_request_bytes,
            max_command_bytes: c.max_command_bytes,
            max_put_schema_bytes: c.max_put_schema_bytes,
            max_put_held_bytes: c.max_put_held_bytes,
            put_idle_timeout: c.put_idle_timeout,
        }
    }
}

type Open = Arc<Mutex<HashMap<IpAddr, u32>>>;

/// Open streams per peer IP, and in all (in an [`Activity`]).
#[derive(Debug, Default)]
pub(crate) struct StreamCounter {
    open: Open,
    activity: Activity,
}

impl StreamCounter {
    /// A counter that also counts each stream in `activity`.
    pub(crate) fn new(activity: Activity) -> Self {
        Self {
            open: Open::default(),
            activity,
        }
    }

    /// Counts one more stream of `peer`, or refuses it with
    /// RESOURCE_EXHAUSTED when `max` are open already. A call without a
    /// peer address (not over TCP) has no limit, but is counted in the
    /// activity all the same.
    pub(crate) fn acquire(
        &self,
        peer: Option<SocketAddr>,
        max: u32,
    ) -> Result<StreamGuard, Status> {
        let Some(ip) = peer.map(|p| p.ip()) else {
            return Ok(StreamGuard {
                per_ip: None,
                _open: self.activity.open_stream(),
            });
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            let message = format!(
                "{ip} has {n} DoGet/DoPut streams open, the limit per client is {max} \
                 (max_streams_per_client): finish or cancel one first"
            );
            tracing::warn!(%message, "stream limit reached");
            return Err(crate::error::over_limit("max_streams_per_client", message));
        }
        *n += 1;
        Ok(StreamGuard {
            per_ip: Some((Arc::clone(&self.open), ip)),
            _open: self.activity.open_stream(),
        })
    }

    /// Streams open now from `ip`.
    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> u32 {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&ip).copied().unwrap_or(0)
    }
}

/// One counted stream; dropping it uncounts the stream.
#[derive(Debug)]
pub(crate) struct StreamGuard {
    /// The per-IP count it is in (none without a peer address).
    per_ip: Option<(Open, IpAddr)>,
    _open: idle::OpenStream,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let Some((open, ip)) = &self.per_ip else {
            return;
        };
        let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(ip);
            }
        }
    }
}

/// A response stream that holds its [`StreamGuard`] until it is dropped:
/// when it ends, or when the client goes away.
pub(crate) struct Guarded<S> {
    inner: S,
    _guard: StreamGuard,
}

impl<S> Guarded<S> {
    pub(crate) fn new(inner: S, guard: StreamGuard) -> Self {
        Self {
            inner,
            _guard: guard,
        }
    }
}

impl<S: Stream + Unpin> Stream for Guarded<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use futures::{StreamExt, stream};

    use super::*;

    #[tokio::test]
    async fn streams_are_counted_per_ip_and_uncounted_on_drop() {
        let activity = Activity::new();
        let c = StreamCounter::new(activity.clone());
        let a: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let a2: SocketAddr = "10.0.0.1:2000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        let g1 = c.acquire(Some(a), 2).unwrap();
        let g2 = c.acquire(Some(a2), 2).unwrap();
        let e = c.acquire(Some(a), 2).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("max_streams_per_client"), "{e}");
        let _gb = c.acquire(Some(b), 2).unwrap();
        let no_peer = c.acquire(None, 0).expect("no limit without a peer address");
        assert_eq!(
            activity.open_streams(),
            4,
            "every stream counts for --idle-exit"
        );
        drop(no_peer);
        drop(g1);
        assert_eq!(c.open(a.ip()), 1);
        let s = Guarded::new(stream::iter([1, 2]), c.acquire(Some(a), 2).unwrap());
        assert_eq!(c.open(a.ip()), 2);
        let items: Vec<_> = s.collect().await;
        assert_eq!(items, [1, 2]);
        assert_eq!(c.open(a.ip()), 1, "the guard went with the stream");
        drop(g2);
        assert_eq!(c.open(a.ip()), 0);
        assert_eq!(activity.open_streams(), 1);
    }
}
