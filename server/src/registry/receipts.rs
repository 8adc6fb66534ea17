//! The receipt handles of a ticket's receives, packed (see [`Receipts`]).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::sqs::ReceiptHandle;

/// The receipt handles of one receive, packed into one buffer: one
/// allocation per receive instead of a `String` (24 B plus its allocation)
/// per held message. Handles in canonical base64 (SQS's and the emulators')
/// are kept decoded, a quarter smaller, and encoded again when handed out.
pub(super) struct Receipts {
    bytes: Box<[u8]>,
    /// End of each handle in `bytes`.
    ends: Box<[u32]>,
    /// Whether `bytes` holds the handles decoded from base64 (else as text).
    decoded: bool,
}

impl Receipts {
    pub(super) fn pack(handles: Vec<ReceiptHandle>) -> Self {
        let texts = || handles.iter().map(|h| h.expose());
        // Decoded if every handle is canonical base64: it decodes, and
        // encodes back to the same text.
        let mut again = String::new();
        let decoded = Self::build(texts(), true, |h, out| {
            let from = out.len();
            BASE64.decode_vec(h, out).ok()?;
            again.clear();
            BASE64.encode_string(&out[from..], &mut again);
            (again == h).then_some(())
        });
        decoded.unwrap_or_else(|| {
            Self::build(texts(), false, |h, out| {
                out.extend_from_slice(h.as_bytes());
                Some(())
            })
            .expect("text always packs")
        })
    }

    /// Appends each handle to one buffer with `put`; `None` if `put` fails.
    fn build<'a>(
        handles: impl ExactSizeIterator<Item = &'a str>,
        decoded: bool,
        mut put: impl FnMut(&'a str, &mut Vec<u8>) -> Option<()>,
    ) -> Option<Self> {
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(handles.len());
        for h in handles {
            put(h, &mut bytes)?;
            ends.push(u32::try_from(bytes.len()).expect("one receive's handles fit in 4 GiB"));
        }
        Some(Self {
            bytes: bytes.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
            decoded,
        })
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = String> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(|(from, to)| {
            let bytes = &self.bytes[from as usize..to as usize];
            if self.decoded {
                BASE64.encode(bytes)
            } else {
                // Packed from `&str`s at the ends recorded.
                String::from_utf8_lossy(bytes).into_owned()
            }
        })
    }

    /// How many handles it holds.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn unpack(&self) -> impl Iterator<Item = ReceiptHandle> + '_ {
        self.iter().map(ReceiptHandle::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_pack_and_unpack_in_order() {
        let handles = ["", "a", "bc", "é+/=", ""].map(|h| ReceiptHandle::new(h.to_string()));
        let packed = Receipts::pack(handles.to_vec());
        assert!(!packed.decoded, "not base64: kept as text");
        let back: Vec<ReceiptHandle> = packed.unpack().collect();
        assert_eq!(back, handles);
        assert_eq!(Receipts::pack(Vec::new()).unpack().count(), 0);
    }

    #[test]
    fn base64_receipts_are_kept_decoded_and_come_back_as_they_were() {
        let rustack = "bWVzc2FnZS0xOjE3MDAwMDAwMDAwMDA6YWJjZGVm";
        let sqs_like = "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a+/QQ==";
        let handles = [rustack, sqs_like, ""].map(|h| ReceiptHandle::new(h.to_string()));
        let packed = Receipts::pack(handles.to_vec());
        assert!(packed.decoded);
        let text: usize = handles.iter().map(|h| h.expose().len()).sum();
        assert!(
            packed.bytes.len() * 4 <= text * 3,
            "{} of {text}",
            packed.bytes.len()
        );
        assert_eq!(packed.unpack().collect::<Vec<_>>(), handles);
        // One handle that does not encode back the same (unpadded, or
        // non-canonical trailing bits) keeps the whole receive as text.
        for odd in ["QQ", "QR==", "QUJD\n"] {
            let mixed = [rustack, odd].map(|h| ReceiptHandle::new(h.to_string()));
            let packed = Receipts::pack(mixed.to_vec());
            assert!(!packed.decoded, "{odd:?}");
            assert_eq!(packed.unpack().collect::<Vec<_>>(), mixed);
        }
    }
}
