//! A raw HTTP/2 client for connection-hostility tests: it sends the client
//! preface, acknowledges the server's SETTINGS, answers its PINGs, and
//! opens streams by writing HEADERS frames itself, ignoring the server's
//! SETTINGS_MAX_CONCURRENT_STREAMS (which hyper and every gRPC library
//! respect). It records what the server sends back per stream (answers
//! and resets) and whether the server closed the connection; it decodes
//! no header block (HPACK), so statuses are read with hyper instead.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// The RST_STREAM error code of a stream over SETTINGS_MAX_CONCURRENT_STREAMS.
pub const REFUSED_STREAM: u32 = 0x7;
/// Largest frame payload read (the server's SETTINGS_MAX_FRAME_SIZE default).
const MAX_FRAME: usize = 1 << 14;

/// What the server sent on one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSeen {
    /// A HEADERS frame came (response headers or trailers).
    pub headers: bool,
    /// A frame with END_STREAM came: the server ended its side.
    pub ended: bool,
    /// The server reset the stream with this error code.
    pub reset: Option<u32>,
}

/// What the reader saw: per stream, and whether the connection is over.
#[derive(Debug, Default)]
pub struct Seen {
    pub streams: HashMap<u32, StreamSeen>,
    /// The server's first SETTINGS frame came: it serves the connection.
    pub served: bool,
    /// The SETTINGS_MAX_CONCURRENT_STREAMS the server's SETTINGS named.
    pub max_concurrent_streams: Option<u32>,
    /// The server closed the connection (EOF or a reset).
    pub closed: bool,
}

/// One raw HTTP/2 connection.
pub struct RawH2 {
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    seen: Arc<Mutex<Seen>>,
    changed: watch::Receiver<()>,
    next_stream: u32,
    authority: String,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for RawH2 {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl RawH2 {
    /// Connects from `from` to `addr` and sends the preface and an empty
    /// SETTINGS frame; the reader answers the server from then on.
    pub async fn connect(from: IpAddr, addr: SocketAddr) -> std::io::Result<Self> {
        let socket = if from.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(from, 0))?;
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, mut write) = stream.into_split();
        write.write_all(PREFACE).await?;
        write.write_all(&frame(SETTINGS, 0, 0, &[])).await?;
        let writer = Arc::new(tokio::sync::Mutex::new(write));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = watch::channel(());
        let reader = tokio::spawn(read_frames(
            read,
            Arc::clone(&writer),
            Arc::clone(&seen),
            tx,
        ));
        Ok(Self {
            writer,
            seen,
            changed,
            next_stream: 1,
            authority: addr.to_string(),
            reader,
        })
    }

    /// Waits until `done` holds of what was seen.
    pub async fn until(&mut self, mut done: impl FnMut(&Seen) -> bool) {
        loop {
            if done(&self.seen.lock().unwrap()) {
                return;
            }
            if self.changed.changed().await.is_err() {
                // The reader is over: what it saw is final.
                assert!(
                    done(&self.seen.lock().unwrap()),
                    "the connection ended first"
                );
                return;
            }
        }
    }

    /// Waits until the server has sent its SETTINGS: it serves us.
    pub async fn served(&mut self) {
        self.until(|s| s.served || s.closed).await;
        assert!(
            self.seen.lock().unwrap().served,
            "the server closed the connection before serving it"
        );
    }

    /// Waits until the server has closed the connection.
    pub async fn closed(&mut self) {
        self.until(|s| s.closed).await;
    }

    /// Whether the server has closed the connection.
    pub fn is_closed(&self) -> bool {
        self.seen.lock().unwrap().closed
    }

    /// The SETTINGS_MAX_CONCURRENT_STREAMS the server announced, once it
    /// [`served`](Self::served) the connection.
    pub fn max_concurrent_streams(&self) -> Option<u32> {
        self.seen.lock().unwrap().max_concurrent_streams
    }

    /// What the server sent on `stream` so far.
    pub fn stream(&self, stream: u32) -> StreamSeen {
        let seen = self.seen.lock().unwrap();
        seen.streams.get(&stream).copied().unwrap_or_default()
    }

    /// Opens a gRPC call to `path` (headers only: no body, no END_STREAM)
    /// and returns its stream id.
    pub async fn open_call(&mut self, path: &str, token: Option<&str>) -> u32 {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        literal_indexed_name(&mut block, 4, path); // :path
        literal_indexed_name(&mut block, 1, &self.authority); // :authority
        literal_new_name(&mut block, "content-type", "application/grpc");
        literal_new_name(&mut block, "te", "trailers");
        if let Some(token) = token {
            literal_new_name(&mut block, "authorization", &format!("Bearer {token}"));
        }
        let headers = frame(HEADERS, END_HEADERS, id, &block);
        self.writer
            .lock()
            .await
            .write_all(&headers)
            .await
            .expect("HEADERS written");
        id
    }
}

impl RawH2 {
    /// Sends one empty gRPC message on `stream` and ends the request.
    pub async fn send_empty_message(&mut self, stream: u32) {
        let data = frame(DATA, END_STREAM, stream, &[0; 5]);
        self.writer
            .lock()
            .await
            .write_all(&data)
            .await
            .expect("DATA written");
    }
}

/// An HPACK literal without indexing, its name from the static table.
fn literal_indexed_name(block: &mut Vec<u8>, index: u8, value: &str) {
    assert!(index < 15);
    block.push(index);
    string(block, value);
}

/// An HPACK literal without indexing with a new name.
fn literal_new_name(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0);
    string(block, name);
    string(block, value);
}

/// An HPACK string, not Huffman-coded, shorter than 127 bytes.
fn string(block: &mut Vec<u8>, s: &str) {
    let len = u8::try_from(s.len()).ok().filter(|&n| n < 127);
    block.push(len.expect("a short header"));
    block.extend_from_slice(s.as_bytes());
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a small frame");
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads the server's frames until the connection ends, answering SETTINGS
/// and PINGs and recording the rest in `seen`.
async fn read_frames(
    mut read: OwnedReadHalf,
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    seen: Arc<Mutex<Seen>>,
    changed: watch::Sender<()>,
) {
    let mut head = [0u8; 9];
    let mut payload = vec![0u8; MAX_FRAME];
    loop {
        if read.read_exact(&mut head).await.is_err() {
            break;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if len > MAX_FRAME || read.read_exact(&mut payload[..len]).await.is_err() {
            break;
        }
        let answer = match kind {
            SETTINGS if flags & ACK == 0 => Some(frame(SETTINGS, ACK, 0, &[])),
            PING if flags & ACK == 0 => Some(frame(PING, ACK, 0, &payload[..len])),
            _ => None,
        };
        if let Some(answer) = answer
            && writer.lock().await.write_all(&answer).await.is_err()
        {
            break;
        }
        record(
            &mut seen.lock().unwrap(),
            kind,
            flags,
            stream,
            &payload[..len],
        );
        changed.send_replace(());
    }
    seen.lock().unwrap().closed = true;
    changed.send_replace(());
}

fn record(seen: &mut Seen, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    if kind == SETTINGS && flags & ACK == 0 {
        seen.served = true;
        for setting in payload.chunks_exact(6) {
            if u16::from_be_bytes([setting[0], setting[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS {
                seen.max_concurrent_streams = Some(u32::from_be_bytes([
                    setting[2], setting[3], setting[4], setting[5],
                ]));
            }
        }
    }
    if stream == 0 {
        return;
    }
    let s = seen.streams.entry(stream).or_default();
    if kind == HEADERS {
        s.headers = true;
    }
    if kind == RST_STREAM && payload.len() >= 4 {
        s.reset = Some(u32::from_be_bytes([
            payload[0], payload[1], payload[2], payload[3],
        ]));
    }
    if flags & END_STREAM != 0 && kind != SETTINGS && kind != PING {
        s.ended = true;
    }
}
