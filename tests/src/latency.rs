//! A TCP proxy that puts SQS's round trip between a client and an emulator.
//!
//! Every SQS-compatible server answers on loopback in well under a
//! millisecond; SQS answers a client in the same region in about 20 ms. A
//! benchmark that means anything to SQS users also runs through
//! [`LatencyProxy`], which adds a configurable round-trip time to every
//! byte (this kernel has no netem qdisc, so it is done in userspace).
//!
//! [`LatencyProxy::start`] listens on `127.0.0.1:0`. Every accepted
//! connection gets a connection of its own to the upstream (aws-sdk-sqs
//! opens one per concurrent call, so hundreds at a time are normal), and
//! each direction of it is a FIFO of `(due, bytes)`:
//!
//! - the reader stamps each chunk it reads with `arrival + rtt / 2` and the
//!   writer releases it on the other side at that instant. A chunk that
//!   arrives while an earlier one is still held is due half a round trip
//!   after its *own* arrival: delays never pile up, the proxy adds latency
//!   and no bandwidth limit;
//! - with jitter, each chunk's one-way delay is drawn uniformly from
//!   `rtt / 2 ± jitter` (xorshift64*, seeded per connection, never below
//!   zero), and a chunk is never due before the one ahead of it
//!   (`due = max(due, previous due)`), so the bytes keep their order;
//! - end of stream follows the data: EOF on one side becomes a shutdown of
//!   the other side's write half once everything before it was released;
//!   an error on either side closes both connections.
//!
//! Connection set-up is not delayed, only data: the SDK keeps its
//! connections open, and a TLS handshake is not what the benchmarks
//! measure.
//!
//! The proxy runs on a thread of its own, with a single-threaded tokio
//! runtime: a network's delay costs the measured process nothing, so the
//! proxy's work must not hide among the server's tasks. It still shares the
//! machine's cores; [`LatencyProxy::cpu_seconds`] says how much it used, so
//! a benchmark can report it apart from the server's.
//!
//! The accept loop and every connection are tasks of one [`TaskTracker`],
//! cancelled by one [`CancellationToken`]: [`LatencyProxy::stop`] cancels
//! and waits for them and the thread, dropping the proxy cancels them.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Largest chunk read at once from either side.
const READ_CHUNK: usize = 64 * 1024;
/// Chunks a direction holds before it stops reading (TCP's own flow
/// control then slows the sender). At loopback speeds far more than a round
/// trip's worth of SQS traffic.
const MAX_CHUNKS_HELD: usize = 1024;
/// Pause after a failed accept (out of file descriptors, say) before the
/// next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running latency proxy; it stops when dropped.
pub struct LatencyProxy {
    addr: SocketAddr,
    rtt: Duration,
    stop: CancellationToken,
    /// The proxy's thread; it ends once every task has.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Sent (dropped) when the thread's tasks are done.
    done: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl LatencyProxy {
    /// Starts a proxy on a free loopback port in front of `upstream` that
    /// adds `rtt` to every round trip, half each way, each one-way delay
    /// varied by up to `± jitter`, on a thread of its own.
    pub async fn start(upstream: SocketAddr, rtt: Duration, jitter: Duration) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let delay = Delay {
            one_way: rtt / 2,
            jitter,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let stop = CancellationToken::new();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let token = stop.clone();
        let thread = std::thread::Builder::new()
            .name("latency-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let tasks = TaskTracker::new();
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            tasks.spawn(accept(listener, upstream, delay, token, tasks.clone()));
                        }
                        Err(e) => tracing::warn!(error = %e, "latency proxy: no listener"),
                    }
                    tasks.close();
                    tasks.wait().await;
                });
                drop(done_tx);
            })?;
        Ok(Self {
            addr,
            rtt,
            stop,
            thread: Some(thread),
            done: Some(done),
        })
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the endpoint to give aws-sdk-sqs.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The round-trip time it adds.
    pub fn rtt(&self) -> Duration {
        self.rtt
    }

    /// CPU seconds (user + system) the proxy's thread has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        use std::os::unix::thread::JoinHandleExt;
        let Some(thread) = &self.thread else {
            return 0.0;
        };
        let mut clock: libc::clockid_t = 0;
        // SAFETY: the thread is joinable (its handle is held), so its
        // pthread_t is valid; both out-pointers are valid for writes.
        unsafe {
            if libc::pthread_getcpuclockid(thread.as_pthread_t(), &mut clock) != 0 {
                return f64::NAN;
            }
            let mut t = std::mem::zeroed::<libc::timespec>();
            if libc::clock_gettime(clock, &mut t) != 0 {
                return f64::NAN;
            }
            t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
        }
    }

    /// Closes the listener and every connection, and waits for their tasks
    /// and the thread.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How long a chunk is held in one direction.
#[derive(Debug, Clone, Copy)]
struct Delay {
    one_way: Duration,
    jitter: Duration,
}

impl Delay {
    /// One chunk's delay: `one_way ± jitter`, uniform, never below zero.
    fn draw(&self, rng: &mut XorShift) -> Duration {
        let jitter = self.jitter.as_nanos().min(u64::MAX as u128 / 4) as u64;
        if jitter == 0 {
            return self.one_way;
        }
        let offset = (rng.next() % (2 * jitter + 1)) as i128 - jitter as i128;
        let nanos = (self.one_way.as_nanos() as i128 + offset).max(0);
        Duration::from_nanos(nanos.min(u64::MAX as i128) as u64)
    }
}

/// xorshift64*: small and good enough to draw jitter (no `rand` crate for it).
#[derive(Debug, Clone)]
struct XorShift(u64);

impl XorShift {
    /// A generator whose sequence is fixed by `seed` (any value, zero too).
    fn new(seed: u64) -> Self {
        // One splitmix64 step spreads consecutive seeds; the state is never 0.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Seeds of the connections' generators, one pair per connection.
static SEEDS: AtomicU64 = AtomicU64::new(0);

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    delay: Delay,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, _)) => {
                let stop = stop.clone();
                let seed = SEEDS.fetch_add(2, Ordering::Relaxed);
                tasks.spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        done = connection(client, upstream, delay, seed) => {
                            if let Err(e) = done {
                                tracing::debug!(error = %e, "latency proxy connection ended");
                            }
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "latency proxy: accept failed");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
}

/// Carries one client connection to a new upstream connection, both ways.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    delay: Delay,
    seed: u64,
) -> io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // try_join: an error either way drops (closes) both connections; a
    // clean EOF one way lets the other way finish.
    tokio::try_join!(
        direction(client_read, server_write, delay, XorShift::new(seed)),
        direction(server_read, client_write, delay, XorShift::new(seed + 1)),
    )?;
    Ok(())
}

/// One direction: a reader that stamps chunks with their due instant and a
/// writer that releases them then, joined by a bounded FIFO.
async fn direction(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Delay,
    mut rng: XorShift,
) -> io::Result<()> {
    let (held, mut due) = mpsc::channel::<(Instant, Bytes)>(MAX_CHUNKS_HELD);
    let read = async move {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut last_due = Instant::now();
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                // EOF: dropping `held` lets the writer finish and shut down.
                return io::Result::Ok(());
            }
            let at = (Instant::now() + delay.draw(&mut rng)).max(last_due);
            last_due = at;
            if held
                .send((at, Bytes::copy_from_slice(&buf[..n])))
                .await
                .is_err()
            {
                return Ok(());
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bound of every wait in these tests (not a timing assertion).
    const BOUND: Duration = Duration::from_secs(60);

    /// A proxy of `rtt_ms` (± `jitter_ms`) in front of an upstream that
    /// echoes every connection until EOF, then closes its write half. The
    /// upstream's tasks end with the test's runtime.
    async fn echo_proxy(rtt_ms: u64, jitter_ms: u64) -> LatencyProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let upstream = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    tokio::io::copy(&mut r, &mut w).await.unwrap();
                    w.shutdown().await.unwrap();
                });
            }
        });
        let (rtt, jitter) = (
            Duration::from_millis(rtt_ms),
            Duration::from_millis(jitter_ms),
        );
        LatencyProxy::start(upstream, rtt, jitter).await.unwrap()
    }

    async fn stop_within_bound(proxy: LatencyProxy) {
        tokio::time::timeout(BOUND, proxy.stop())
            .await
            .expect("the proxy stops within the bound");
    }

    /// One byte there and back on `s`, within the bound.
    async fn one_byte_echo(s: &mut TcpStream, byte: u8) {
        s.write_all(&[byte]).await.unwrap();
        let mut one = [0u8; 1];
        tokio::time::timeout(BOUND, s.read_exact(&mut one))
            .await
            .expect("echo within the bound")
            .unwrap();
        assert_eq!(one, [byte]);
    }

    /// Writes `data` in uneven pieces, half-closes, and reads everything
    /// back to EOF, concurrently.
    async fn echo_through(addr: SocketAddr, data: &[u8]) -> Vec<u8> {
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut r, mut w) = s.into_split();
        let write = async {
            let mut rest = data;
            let mut size = 1;
            while !rest.is_empty() {
                let n = size.min(rest.len());
                w.write_all(&rest[..n]).await.unwrap();
                rest = &rest[n..];
                size = size * 7 % 9001 + 1;
                if size % 3 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            w.shutdown().await.unwrap();
        };
        let read = async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::time::timeout(BOUND, async { tokio::join!(write, read) })
            .await
            .expect("echo through the proxy within the bound");
        got
    }

    fn pattern(len: usize, salt: u64) -> Vec<u8> {
        let mut rng = XorShift::new(salt);
        (0..len).map(|_| rng.next() as u8).collect()
    }

    #[tokio::test]
    async fn bytes_arrive_intact_and_in_order_with_jitter() {
        let proxy = echo_proxy(10, 8).await;
        let data = pattern(300_000, 7);
        let got = echo_through(proxy.addr(), &data).await;
        assert_eq!(got.len(), data.len());
        assert!(got == data, "the echo differs from what was sent");
        stop_within_bound(proxy).await;
    }

    #[tokio::test]
    async fn a_round_trip_takes_at_least_the_rtt() {
        let proxy = echo_proxy(40, 0).await;
        let rtt = Duration::from_millis(40);
        assert_eq!(proxy.rtt(), rtt);
        assert!(proxy.endpoint().starts_with("http://127.0.0.1:"));
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.set_nodelay(true).unwrap();
        for i in 0..3u8 {
            let started = std::time::Instant::now();
            one_byte_echo(&mut s, i).await;
            // A lower bound only: the proxy never releases a byte early.
            let took = started.elapsed();
            assert!(took >= rtt, "round trip {i} took {took:?} < {rtt:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hundreds_of_connections_at_once() {
        let proxy = echo_proxy(20, 5).await;
        let addr = proxy.addr();
        let calls = (0..200u64).map(|i| async move {
            let data = pattern(2_000 + i as usize * 13, i);
            (echo_through(addr, &data).await, data)
        });
        for (got, sent) in futures::future::join_all(calls).await {
            assert!(got == sent, "a connection's echo differs");
        }
        // Its thread did the work: 200 connections cost it some CPU time.
        let cpu = proxy.cpu_seconds();
        assert!(cpu > 0.0 && cpu.is_finite(), "proxy CPU {cpu} s");
        stop_within_bound(proxy).await;
    }

    #[tokio::test]
    async fn stop_closes_open_connections() {
        let proxy = echo_proxy(2, 0).await;
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        one_byte_echo(&mut s, b'x').await;
        stop_within_bound(proxy).await;
        // The connection is gone: EOF or a reset, not a hang.
        let mut one = [0u8; 1];
        let read = tokio::time::timeout(BOUND, s.read(&mut one))
            .await
            .expect("the closed connection answers within the bound");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    /// aws-sdk-sqs through the proxy: a pool of keep-alive connections,
    /// concurrent calls, every answer intact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sdk_works_through_the_proxy() {
        use crate::sqs::{create_queue, delete_messages, queue_counts, receive_ten, send_many};
        let rustack = tokio::task::spawn_blocking(crate::rustack::rustack)
            .await
            .unwrap();
        let proxy = LatencyProxy::start(
            rustack.addr(),
            Duration::from_millis(10),
            Duration::from_millis(2),
        )
        .await
        .unwrap();
        let sqs = crate::sqs::sqs_client(&proxy.endpoint()).await;
        let url = create_queue(&sqs, "latency", &[]).await;
        send_many(&sqs, &url, 120, |n| format!("body-{n}")).await;
        let mut got = Vec::new();
        while got.len() < 120 {
            let batch = tokio::time::timeout(BOUND, receive_ten(&sqs, &url, 1, None))
                .await
                .expect("a receive within the bound");
            assert!(!batch.is_empty(), "{} of 120 received", got.len());
            got.extend(batch);
        }
        let mut bodies: Vec<String> = got.iter().map(|m| m.body().unwrap().to_string()).collect();
        bodies.sort();
        let mut sent: Vec<String> = (0..120).map(|n| format!("body-{n}")).collect();
        sent.sort();
        assert_eq!(bodies, sent);
        assert_eq!(delete_messages(&sqs, &url, &got).await, 0);
        assert_eq!(queue_counts(&sqs, &url).await, (0, 0));
        stop_within_bound(proxy).await;
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let delay = Delay {
            one_way: Duration::from_millis(10),
            jitter: Duration::from_millis(4),
        };
        let mut rng = XorShift::new(1);
        let draws: Vec<Duration> = (0..10_000).map(|_| delay.draw(&mut rng)).collect();
        assert!(draws.iter().all(|d| *d >= Duration::from_millis(6)));
        assert!(draws.iter().all(|d| *d <= Duration::from_millis(14)));
        // Both sides of the mean are drawn.
        assert!(draws.iter().any(|d| *d < Duration::from_millis(9)));
        assert!(draws.iter().any(|d| *d > Duration::from_millis(11)));
        // More jitter than delay never goes below zero.
        let wide = Delay {
            one_way: Duration::from_millis(1),
            jitter: Duration::from_millis(5),
        };
        assert!((0..1000).any(|_| wide.draw(&mut rng).is_zero()));
        let none = Delay {
            jitter: Duration::ZERO,
            ..delay
        };
        assert_eq!(none.draw(&mut rng), Duration::from_millis(10));
    }

    #[test]
    fn xorshift_is_seeded() {
        let a: Vec<u64> = (0..4)
            .scan(XorShift::new(0), |r, _| Some(r.next()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(XorShift::new(0), |r, _| Some(r.next()))
            .collect();
        let c: Vec<u64> = (0..4)
            .scan(XorShift::new(1), |r, _| Some(r.next()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| *x != 0));
    }
}
