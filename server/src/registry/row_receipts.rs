//! Which receipt each row of a ticket's log uses now.
//!
//! A row's receipt is the one its receive brought, unless SQS delivered the
//! same message again while the ticket held it (see `dedup::offer`):
//!
//! - a later receive's receipt replaces it: SQS acts only on the newest
//!   receipt of a message, so the row uses that one from then on
//!   ([`RowReceipts::renewed`]); a renewal that arrives while the row is
//!   still being recorded waits ([`RowReceipts::pending`]) until the
//!   record puts it in place;
//! - the receipt of a receive whose call overlapped the row's is kept
//!   besides the row's own ([`RowReceipts::second`]), since which of the
//!   two SQS acts on is unknown: a delete or give-back of the row uses
//!   both.
//!
//! All three are empty unless SQS delivered a message twice.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::sqs::ReceiptHandle;

/// The receipts rows use besides (or instead of) their receive's, by row
/// of the log.
#[derive(Default)]
pub(super) struct RowReceipts {
    /// The newest receipt of recorded rows, replacing their receive's.
    renewed: BTreeMap<usize, ReceiptHandle>,
    /// Newer receipts for rows being recorded (classified, not yet in the
    /// log): the record puts them in place.
    pending: Vec<(usize, ReceiptHandle)>,
    /// Second receipts of rows, from a receive whose call overlapped the
    /// row's; at most one per row (the latest).
    second: Vec<(usize, ReceiptHandle)>,
}

impl RowReceipts {
    /// Row `row`, recorded, uses `receipt` from now on.
    pub(super) fn renew(&mut self, row: usize, receipt: ReceiptHandle) {
        self.renewed.insert(row, receipt);
    }

    /// Row `row`, still being recorded, is to use `receipt` once it is.
    pub(super) fn renew_pending(&mut self, row: usize, receipt: ReceiptHandle) {
        self.pending.retain(|(r, _)| *r != row);
        self.pending.push((row, receipt));
    }

    /// Puts the pending renewals of rows `start..` in `receipts` (a
    /// receive being recorded at row `start`), and answers them as
    /// (offset in the receive, receipt); the others stay pending.
    pub(super) fn take_pending(
        &mut self,
        start: usize,
        receipts: &mut [ReceiptHandle],
    ) -> Vec<(u32, ReceiptHandle)> {
        let mut renewed = Vec::new();
        for (row, r) in std::mem::take(&mut self.pending) {
            match receipts.get_mut(row.wrapping_sub(start)) {
                Some(slot) if row >= start => {
                    renewed.push(((row - start) as u32, r.clone()));
                    *slot = r;
                }
                _ => self.pending.push((row, r)),
            }
        }
        renewed
    }

    /// Keeps `receipt` as row `row`'s second receipt (replacing an
    /// earlier one).
    pub(super) fn add_second(&mut self, row: usize, receipt: ReceiptHandle) {
        self.second.retain(|(r, _)| *r != row);
        self.second.push((row, receipt));
    }

    /// Takes the second receipts, by row.
    pub(super) fn take_second(&mut self) -> Vec<(usize, ReceiptHandle)> {
        std::mem::take(&mut self.second)
    }

    /// `received`, the receipts a receive brought for `rows`, with the
    /// renewed ones in place of those they replaced.
    pub(super) fn in_use(
        &self,
        rows: Range<usize>,
        mut received: Vec<ReceiptHandle>,
    ) -> Vec<ReceiptHandle> {
        let start = rows.start;
        for (row, r) in self.renewed.range(rows) {
            received[row - start] = r.clone();
        }
        received
    }

    /// Forgets every receipt kept (the rows are gone).
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str) -> ReceiptHandle {
        ReceiptHandle::new(name.to_string())
    }

    fn receipts(names: &[&str]) -> Vec<ReceiptHandle> {
        names.iter().map(|n| r(n)).collect()
    }

    #[test]
    fn a_row_uses_its_newest_receipt_and_a_pending_one_once_recorded() {
        let mut rows = RowReceipts::default();
        rows.renew(1, r("r1-old"));
        rows.renew(1, r("r1-new"));
        rows.renew(4, r("r4-new"));
        let used = rows.in_use(0..3, receipts(&["r0", "r1", "r2"]));
        assert_eq!(used, receipts(&["r0", "r1-new", "r2"]), "newest only");
        let used = rows.in_use(3..5, receipts(&["r3", "r4"]));
        assert_eq!(used, receipts(&["r3", "r4-new"]), "by row of the log");

        rows.renew_pending(6, r("r6-new"));
        rows.renew_pending(9, r("r9-new"));
        let mut recording = receipts(&["r5", "r6", "r7"]);
        let taken = rows.take_pending(5, &mut recording);
        assert_eq!(taken, [(1, r("r6-new"))]);
        assert_eq!(recording, receipts(&["r5", "r6-new", "r7"]));
        let mut later = receipts(&["r8", "r9"]);
        assert_eq!(rows.take_pending(8, &mut later).len(), 1, "r9 waited");
    }

    #[test]
    fn a_row_keeps_one_second_receipt_the_latest() {
        let mut rows = RowReceipts::default();
        rows.add_second(2, r("a"));
        rows.add_second(2, r("b"));
        rows.add_second(0, r("c"));
        let second = rows.take_second();
        assert_eq!(second, [(2, r("b")), (0, r("c"))]);
        assert!(rows.take_second().is_empty());
    }
}
