//! A bound on the bytes of requests still being received, over all calls.
//!
//! tonic decodes a gRPC message once all of it has arrived, and keeps what
//! has arrived until then: a client that sends all but the last byte of a
//! 60 MiB DoPut message on each of many streams makes the server hold all of
//! it, for as long as it likes. [`RequestBudget`] counts those bytes: each
//! request body is wrapped in a [`BudgetBody`], which follows the gRPC
//! framing (a 5-byte prefix, then the message) and charges the budget with
//! the bytes of the message it is in the middle of, giving them back once
//! the message is complete (tonic decodes it then) or the body is dropped.
//! A body whose next bytes would take the budget past its limit fails with
//! `RESOURCE_EXHAUSTED` naming `max_buffered_request_bytes`, and its bytes
//! are given back.
//!
//! Complete messages are not counted: once decoded they are the handler's,
//! and each handler bounds its own work (DoPut batches, commands).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tonic::Status;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// The gRPC message prefix: a compressed flag and a big-endian length.
const PREFIX_BYTES: usize = 5;

/// Bytes held against a limit by every holder together: what all calls
/// hold of request messages still arriving ([`RequestBudget`],
/// `max_buffered_request_bytes`), or what all DoPut streams keep decoded
/// between batches (`max_put_held_bytes`).
#[derive(Debug)]
pub struct ByteBudget {
    used: AtomicU64,
    limit: u64,
}

/// Bytes of partly received request messages the whole server may hold.
pub type RequestBudget = ByteBudget;

impl ByteBudget {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicU64::new(0),
            limit,
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Takes `n` bytes, unless that would go past the limit.
    pub fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    /// Gives back `n` bytes taken before.
    pub fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The refusal of a request message that would take [`RequestBudget`]
/// past its limit.
fn exhausted(budget: &RequestBudget) -> Status {
    crate::error::over_limit(
        "max_buffered_request_bytes",
        format!(
            "the server is already receiving {} of unfinished request messages, its limit \
         (--max-buffered-request-bytes, TOML max_buffered_request_bytes): send again later",
            crate::config::sql::show_bytes(budget.limit)
        ),
    )
}

/// Where a body is in the gRPC framing.
#[derive(Debug, Default)]
struct Framing {
    /// Bytes of the current message's prefix seen so far (0 to 5).
    prefix: [u8; PREFIX_BYTES],
    prefix_seen: usize,
    /// Bytes of the current message's payload still to come.
    payload_left: u64,
    /// Bytes of the current, unfinished message seen so far (prefix
    /// included): what the budget holds for this body.
    held: u64,
}

impl Framing {
    /// Follows `chunk`; returns how many bytes of an unfinished message are
    /// seen after it (the new `held`).
    fn follow(&mut self, mut chunk: &[u8]) -> u64 {
        while !chunk.is_empty() {
            if self.payload_left == 0 && self.prefix_seen < PREFIX_BYTES {
                let n = (PREFIX_BYTES - self.prefix_seen).min(chunk.len());
                self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&chunk[..n]);
                self.prefix_seen += n;
                self.held += n as u64;
                chunk = &chunk[n..];
                if self.prefix_seen == PREFIX_BYTES {
                    let mut len = &self.prefix[1..];
                    self.payload_left = u64::from(len.get_u32());
                    if self.payload_left == 0 {
                        self.finish();
                    }
                }
                continue;
            }
            let n = self.payload_left.min(chunk.len() as u64);
            self.payload_left -= n;
            self.held += n;
            chunk = &chunk[n as usize..];
            if self.payload_left == 0 {
                self.finish();
            }
        }
        self.held
    }

    fn finish(&mut self) {
        self.prefix_seen = 0;
        self.held = 0;
    }
}

/// A request body charged to a [`RequestBudget`] (see the module docs).
pub struct BudgetBody<B> {
    inner: B,
    budget: Arc<RequestBudget>,
    framing: Framing,
    /// Bytes this body holds in the budget.
    charged: u64,
    failed: bool,
}

impl<B> BudgetBody<B> {
    pub fn new(inner: B, budget: Arc<RequestBudget>) -> Self {
        Self {
            inner,
            budget,
            framing: Framing::default(),
            charged: 0,
            failed: false,
        }
    }

    /// Brings the charge to `held`; false if the budget refused the rise.
    fn charge(&mut self, held: u64) -> bool {
        if held > self.charged {
            if !self.budget.take(held - self.charged) {
                return false;
            }
        } else {
            self.budget.give(self.charged - held);
        }
        self.charged = held;
        true
    }
}

impl<B> Drop for BudgetBody<B> {
    fn drop(&mut self) {
        self.budget.give(self.charged);
    }
}

impl<B> Body for BudgetBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            let held = this.framing.follow(data);
            if !this.charge(held) {
                this.failed = true;
                this.charge(0);
                return Poll::Ready(Some(Err(Box::new(exhausted(&this.budget)))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps a gRPC service so that every request body is a [`BudgetBody`].
#[derive(Debug, Clone)]
pub struct WithRequestBudget<S> {
    inner: S,
    budget: Arc<RequestBudget>,
}

impl<S> WithRequestBudget<S> {
    pub fn new(inner: S, budget: Arc<RequestBudget>) -> Self {
        Self { inner, budget }
    }
}

impl<S, B> Service<http::Request<B>> for WithRequestBudget<S>
where
    S: Service<http::Request<BudgetBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let budget = Arc::clone(&self.budget);
        self.inner
            .call(request.map(|body| BudgetBody::new(body, budget)))
    }
}

impl<S: NamedService> NamedService for WithRequestBudget<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    /// A gRPC frame of `len` payload bytes.
    fn message(len: usize) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend(std::iter::repeat_n(7u8, len));
        out
    }

    /// A body that yields each chunk as one data frame.
    type ChunkBody = StreamBody<
        futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>,
    >;

    fn body_of(chunks: Vec<Vec<u8>>) -> ChunkBody {
        let frames: Vec<_> = chunks
            .into_iter()
            .map(|c| Ok(Frame::data(Bytes::from(c))))
            .collect();
        StreamBody::new(futures::stream::iter(frames))
    }

    #[test]
    fn framing_holds_only_the_unfinished_message() {
        let mut f = Framing::default();
        let two = [message(3), message(10)].concat();
        // The first message whole, then 4 bytes of the second's prefix.
        assert_eq!(f.follow(&two[..8 + 4]), 4);
        assert_eq!(f.follow(&two[12..14]), 6);
        assert_eq!(f.follow(&two[14..]), 0, "the second message is complete");
        assert_eq!(f.follow(&message(0)), 0, "an empty message holds nothing");
        assert_eq!(f.follow(&message(5)[..2]), 2, "a prefix split over chunks");
    }

    #[tokio::test]
    async fn complete_messages_pass_and_give_their_bytes_back() {
        let budget = RequestBudget::new(64);
        let m = message(40);
        let chunks = vec![m[..20].to_vec(), m[20..].to_vec(), message(50)];
        let mut body = BudgetBody::new(body_of(chunks), Arc::clone(&budget));
        let mut seen = Vec::new();
        while let Some(frame) = body.frame().await {
            frame.expect("within the budget");
            seen.push(budget.used());
        }
        assert_eq!(seen, [20, 0, 0]);
    }

    #[tokio::test]
    async fn unfinished_messages_past_the_limit_fail_and_are_given_back() {
        let budget = RequestBudget::new(100);
        let first = message(1000);
        let mut held = BudgetBody::new(body_of(vec![first[..90].to_vec()]), Arc::clone(&budget));
        held.frame().await.unwrap().unwrap();
        assert_eq!(budget.used(), 90);

        let second = message(1000);
        let mut refused =
            BudgetBody::new(body_of(vec![second[..20].to_vec()]), Arc::clone(&budget));
        let err = refused.frame().await.unwrap().unwrap_err();
        let status = err.downcast::<Status>().expect("a Status");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("max_buffered_request_bytes"),
            "{status}"
        );
        assert!(refused.frame().await.is_none(), "a refused body ends");
        assert_eq!(budget.used(), 90, "the refused body holds nothing");

        drop(held);
        assert_eq!(budget.used(), 0, "a dropped body gives its bytes back");
        let mut again = BudgetBody::new(body_of(vec![second[..20].to_vec()]), Arc::clone(&budget));
        again.frame().await.unwrap().unwrap();
    }
}
