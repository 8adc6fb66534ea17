//! One object of the state log, as bytes.
//!
//! ```text
//! b"SQSFLOG\n"                      magic, 8 bytes
//! u32 header length, header JSON    `Header`: format, seq, writer, kind, voids
//! frames, each:
//!   u32 length, JSON                one change (`ops::Record`)
//!   u64 length, bytes               its rows (Arrow IPC), or empty
//! u32 CRC-32 of everything above
//! ```
//!
//! Integers are big-endian. Decoding checks every length against what is
//! left before it takes a byte, the CRC before it parses a frame, and
//! refuses a segment over [`MAX_SEGMENT_BYTES`], an unknown format or
//! magic, a header over [`MAX_HEADER_BYTES`], or trailing bytes: an
//! object that is not a segment this server wrote is refused, never
//! trusted.

use serde::{Deserialize, Serialize};

/// The first bytes of every segment.
const MAGIC: &[u8; 8] = b"SQSFLOG\n";

/// The segment format this server writes, and the only one it reads.
pub const FORMAT: u32 = 1;

/// The largest segment read (or written): 4 GiB, the most one snapshot
/// of the open state can hold (the registry's own byte budget is lower).
pub const MAX_SEGMENT_BYTES: u64 = 4 << 30;

/// The largest header read.
pub const MAX_HEADER_BYTES: u32 = 64 << 10;

/// The bytes that hold any header this server reads: the magic, its
/// length and the header itself ([`decode_header`] needs no more).
pub const MAX_START_BYTES: u64 = 8 + 4 + MAX_HEADER_BYTES as u64;

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Changes to apply to the state the earlier segments left.
    Changes,
    /// The whole state: what came before it no longer counts.
    Snapshot,
}

/// A segment's header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub format: u32,
    /// Its place in the log; the object's name says the same.
    pub seq: u64,
    /// The server that wrote it (`Log::writer`).
    pub writer: String,
    pub kind: Kind,
    /// Earlier segments of the same writer whose write was reported as
    /// failed but landed after all: they do not count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub voids: Vec<u64>,
}

/// One frame: a change as JSON, and its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub json: Vec<u8>,
    pub blob: Vec<u8>,
}

/// A segment's bytes.
pub fn encode(header: &Header, frames: &[Frame]) -> Vec<u8> {
    let header = serde_json::to_vec(header).expect("plain struct serializes");
    let size = 8
        + 4
        + header.len()
        + frames
            .iter()
            .map(|f| 12 + f.json.len() + f.blob.len())
            .sum::<usize>()
        + 4;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    for f in frames {
        out.extend_from_slice(&(f.json.len() as u32).to_be_bytes());
        out.extend_from_slice(&f.json);
        out.extend_from_slice(&(f.blob.len() as u64).to_be_bytes());
        out.extend_from_slice(&f.blob);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Why bytes are not a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

fn refused(what: impl Into<String>) -> Refused {
    Refused(what.into())
}

/// A reader that checks every length against what is left.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], Refused> {
        if n > self.rest.len() as u64 {
            return Err(refused(format!(
                "{what} says {n} bytes, {} are left",
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n as usize);
        self.rest = tail;
        Ok(head)
    }

    fn u32(&mut self, what: &str) -> Result<u32, Refused> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64, Refused> {
        let b = self.take(8, what)?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes")))
    }
}

/// Only the header of a segment (the fencing check reads no further);
/// the magic and format are checked, the CRC is not.
pub fn decode_header(bytes: &[u8]) -> Result<Header, Refused> {
    let mut c = Cursor { rest: bytes };
    if c.take(8, "magic")? != MAGIC {
        return Err(refused("not a state log segment (wrong magic bytes)"));
    }
    let len = c.u32("header length")?;
    if len > MAX_HEADER_BYTES {
        return Err(refused(format!(
            "header of {len} bytes, above {MAX_HEADER_BYTES}"
        )));
    }
    let header: Header = serde_json::from_slice(c.take(u64::from(len), "header")?)
        .map_err(|e| refused(format!("header: {e}")))?;
    if header.format != FORMAT {
        return Err(refused(format!(
            "segment format {}, and this server reads format {FORMAT} only",
            header.format
        )));
    }
    Ok(header)
}

/// A whole segment: its header and frames, after its CRC is checked.
pub fn decode(bytes: &[u8]) -> Result<(Header, Vec<Frame>), Refused> {
    if bytes.len() as u64 > MAX_SEGMENT_BYTES {
        return Err(refused(format!(
            "{} bytes, above {MAX_SEGMENT_BYTES}",
            bytes.len()
        )));
    }
    let Some(body_len) = bytes.len().checked_sub(4) else {
        return Err(refused("shorter than a CRC"));
    };
    let (body, crc) = bytes.split_at(body_len);
    if crc32fast::hash(body).to_be_bytes() != crc {
        return Err(refused("CRC mismatch: the segment is damaged"));
    }
    let header = decode_header(body)?;
    let mut c = Cursor { rest: body };
    c.take(8, "magic")?;
    let len = c.u32("header length")?;
    c.take(u64::from(len), "header")?;
    let mut frames = Vec::new();
    while !c.rest.is_empty() {
        let json_len = c.u32("frame length")?;
        let json = c.take(u64::from(json_len), "frame")?.to_vec();
        let blob_len = c.u64("rows length")?;
        let blob = c.take(blob_len, "rows")?.to_vec();
        frames.push(Frame { json, blob });
    }
    Ok((header, frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            format: FORMAT,
            seq: 7,
            writer: "w1".into(),
            kind: Kind::Changes,
            voids: vec![5],
        }
    }

    fn frames() -> Vec<Frame> {
        vec![
            Frame {
                json: b"{\"a\":1}".to_vec(),
                blob: vec![1, 2, 3],
            },
            Frame {
                json: b"{}".to_vec(),
                blob: vec![],
            },
        ]
    }

    #[test]
    fn a_segment_round_trips() {
        let bytes = encode(&header(), &frames());
        assert_eq!(decode(&bytes).unwrap(), (header(), frames()));
        assert_eq!(decode_header(&bytes).unwrap(), header());
    }

    #[test]
    fn every_damaged_or_foreign_segment_is_refused() {
        let good = encode(&header(), &frames());
        // Every truncation, and every single flipped byte.
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err(), "truncated at {n}");
            let mut bad = good.clone();
            bad[n] ^= 0x40;
            assert!(decode(&bad).is_err(), "byte {n} flipped");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        assert!(decode(b"{\"not\": \"a segment\"}").is_err());
        let other = Header {
            format: FORMAT + 1,
            ..header()
        };
        let err = decode(&encode(&other, &[])).unwrap_err();
        assert!(err.0.contains("format 2"), "{err}");
    }

    #[test]
    fn lengths_past_the_end_are_refused_before_allocating() {
        // A frame claiming 2^64-1 bytes of rows, with a valid CRC.
        let mut body = MAGIC.to_vec();
        let h = serde_json::to_vec(&header()).unwrap();
        body.extend_from_slice(&(h.len() as u32).to_be_bytes());
        body.extend_from_slice(&h);
        body.extend_from_slice(&2u32.to_be_bytes());
        body.extend_from_slice(b"{}");
        body.extend_from_slice(&u64::MAX.to_be_bytes());
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_be_bytes());
        let err = decode(&body).unwrap_err();
        assert!(err.0.contains("rows says"), "{err}");
    }
}
