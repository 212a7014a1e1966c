//! Which WAL position CDC mode may confirm to PostgreSQL.
//!
//! Confirming a position (the flush LSN of a standby status update) lets the
//! server recycle the WAL before it: a transaction confirmed is never sent
//! again. So the position advances only past a transaction whose every
//! record the broker acknowledged, and every earlier transaction's too;
//! after a crash the slot resends from there: duplicates possible, loss
//! never. Transactions arrive in commit order; their records are acknowledged
//! in any order across partitions.
//!
//! With nothing in flight, a keepalive's position is confirmed as well: the
//! server sends it after everything decoded up to it, so everything before
//! it either reached us or was not for the publication. Without that, a
//! database whose other tables are busy and whose outbox is quiet would keep
//! its WAL for ever behind the slot.

use std::collections::VecDeque;
use std::fmt;

/// A WAL position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    /// PostgreSQL's text form of `pg_lsn`: `16/B374D848`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl std::str::FromStr for Lsn {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("{text:?} is not a WAL position such as 16/B374D848");
        let (high, low) = text.split_once('/').ok_or_else(invalid)?;
        let high = u32::from_str_radix(high, 16).map_err(|_| invalid())?;
        let low = u32::from_str_radix(low, 16).map_err(|_| invalid())?;
        Ok(Self((u64::from(high) << 32) | u64::from(low)))
    }
}

/// A transaction the tracker follows, by the order it began in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxId(u64);

#[derive(Debug)]
struct Tx {
    id: u64,
    /// Where the server resumes after it: known at its commit.
    end: Option<Lsn>,
    /// Records handed to the producer and not yet acknowledged.
    pending: usize,
}

/// The misuses the stream's own order rules out; each is a bug in the
/// caller (or a server breaking the protocol), reported, never ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    #[error("a transaction began while another was open")]
    AlreadyOpen,
    #[error("a record or commit came for a transaction that is not the open one")]
    NotOpen,
    #[error("a delivery was reported for a record the tracker did not hand out")]
    UnknownDelivery,
    #[error("commit position {end} is before the last confirmed position {confirmed}")]
    Backwards { end: Lsn, confirmed: Lsn },
}

/// Transactions received and not yet confirmed, in commit order.
#[derive(Debug, Default)]
pub struct Progress {
    transactions: VecDeque<Tx>,
    next_id: u64,
    confirmed: Lsn,
}

impl Progress {
    /// Starts from the slot's `confirmed_flush_lsn`.
    pub fn from(confirmed: Lsn) -> Self {
        Self {
            confirmed,
            ..Self::default()
        }
    }

    fn open(&mut self, tx: TxId) -> Result<&mut Tx, ProgressError> {
        match self.transactions.back_mut() {
            Some(open) if open.id == tx.0 && open.end.is_none() => Ok(open),
            _ => Err(ProgressError::NotOpen),
        }
    }

    /// A `Begin`.
    pub fn begin(&mut self) -> Result<TxId, ProgressError> {
        if self.transactions.back().is_some_and(|tx| tx.end.is_none()) {
            return Err(ProgressError::AlreadyOpen);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.transactions.push_back(Tx {
            id,
            end: None,
            pending: 0,
        });
        Ok(TxId(id))
    }

    /// A record of the open transaction handed to the producer.
    pub fn sent(&mut self, tx: TxId) -> Result<(), ProgressError> {
        self.open(tx)?.pending += 1;
        Ok(())
    }

    /// The `Commit` of the open transaction: `end` is its end LSN.
    pub fn commit(&mut self, tx: TxId, end: Lsn) -> Result<(), ProgressError> {
        let confirmed = self.confirmed;
        let open = self.open(tx)?;
        if end < confirmed {
            return Err(ProgressError::Backwards { end, confirmed });
        }
        open.end = Some(end);
        Ok(())
    }

    /// The broker acknowledged one record of `tx`.
    pub fn delivered(&mut self, tx: TxId) -> Result<(), ProgressError> {
        let first = self
            .transactions
            .front()
            .map(|t| t.id)
            .ok_or(ProgressError::UnknownDelivery)?;
        let index = usize::try_from(tx.0.wrapping_sub(first))
            .map_err(|_| ProgressError::UnknownDelivery)?;
        match self.transactions.get_mut(index) {
            Some(t) if t.id == tx.0 && t.pending > 0 => {
                t.pending -= 1;
                Ok(())
            }
            _ => Err(ProgressError::UnknownDelivery),
        }
    }

    /// A keepalive at `position`: confirmable when nothing is in flight.
    pub fn keepalive(&mut self, position: Lsn) {
        self.settle();
        if self.transactions.is_empty() {
            self.confirmed = self.confirmed.max(position);
        }
    }

    /// The position to confirm now: past every transaction whose records,
    /// and every earlier transaction's, were all acknowledged.
    pub fn confirmable(&mut self) -> Lsn {
        self.settle();
        self.confirmed
    }

    /// Records handed out and not acknowledged.
    pub fn in_flight(&self) -> usize {
        self.transactions.iter().map(|t| t.pending).sum()
    }

    fn settle(&mut self) {
        while let Some(Tx {
            end: Some(end),
            pending: 0,
            ..
        }) = self.transactions.front()
        {
            self.confirmed = self.confirmed.max(*end);
            self.transactions.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn positions_read_and_print_as_postgresql_writes_them() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn, Lsn(0x16_B374_D848));
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn(0).to_string(), "0/0");
        for bad in ["", "16", "16/", "/1", "G/1", "1/2/3", "100000000/0"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_transaction_is_confirmed_only_when_it_and_every_earlier_one_are_delivered() {
        let mut progress = Progress::from(Lsn(10));
        let first = progress.begin().unwrap();
        progress.sent(first).unwrap();
        progress.sent(first).unwrap();
        progress.commit(first, Lsn(20)).unwrap();
        let second = progress.begin().unwrap();
        progress.sent(second).unwrap();
        progress.commit(second, Lsn(30)).unwrap();

        progress.delivered(second).unwrap();
        assert_eq!(
            progress.confirmable(),
            Lsn(10),
            "the first is not delivered"
        );
        progress.delivered(first).unwrap();
        assert_eq!(
            progress.confirmable(),
            Lsn(10),
            "one record of the first is not"
        );
        progress.delivered(first).unwrap();
        assert_eq!(progress.confirmable(), Lsn(30));
        assert_eq!(progress.in_flight(), 0);
    }

    #[test]
    fn an_open_transaction_is_never_confirmed_even_with_every_record_delivered() {
        let mut progress = Progress::from(Lsn(10));
        let tx = progress.begin().unwrap();
        progress.sent(tx).unwrap();
        progress.delivered(tx).unwrap();
        progress.keepalive(Lsn(50));
        assert_eq!(progress.confirmable(), Lsn(10));
        progress.commit(tx, Lsn(40)).unwrap();
        assert_eq!(progress.confirmable(), Lsn(40));
    }

    #[test]
    fn a_keepalive_moves_the_position_only_when_nothing_is_in_flight() {
        let mut progress = Progress::from(Lsn(10));
        progress.keepalive(Lsn(15));
        assert_eq!(progress.confirmable(), Lsn(15), "idle: the WAL is released");
        let tx = progress.begin().unwrap();
        progress.sent(tx).unwrap();
        progress.commit(tx, Lsn(20)).unwrap();
        progress.keepalive(Lsn(25));
        assert_eq!(progress.confirmable(), Lsn(15), "a record is in flight");
        progress.delivered(tx).unwrap();
        progress.keepalive(Lsn(25));
        assert_eq!(progress.confirmable(), Lsn(25));
        progress.keepalive(Lsn(5));
        assert_eq!(progress.confirmable(), Lsn(25), "never backwards");
    }

    #[test]
    fn the_stream_order_is_enforced() {
        let mut progress = Progress::from(Lsn(10));
        let tx = progress.begin().unwrap();
        assert_eq!(progress.begin(), Err(ProgressError::AlreadyOpen));
        assert_eq!(progress.delivered(tx), Err(ProgressError::UnknownDelivery));
        assert_eq!(
            progress.commit(tx, Lsn(5)),
            Err(ProgressError::Backwards {
                end: Lsn(5),
                confirmed: Lsn(10)
            })
        );
        progress.commit(tx, Lsn(20)).unwrap();
        assert_eq!(progress.sent(tx), Err(ProgressError::NotOpen));
        assert_eq!(progress.commit(tx, Lsn(30)), Err(ProgressError::NotOpen));
    }

    proptest! {
        /// Any interleaving of deliveries: the confirmed position never
        /// passes a transaction with a record in flight, never goes back,
        /// and reaches the last commit once everything is delivered.
        #[test]
        fn never_confirms_past_a_record_in_flight(
            sizes in proptest::collection::vec(0_usize..4, 1..12),
            order in proptest::collection::vec(any::<prop::sample::Index>(), 0..48),
        ) {
            let mut progress = Progress::from(Lsn(100));
            let mut outstanding: Vec<(TxId, Lsn)> = Vec::new();
            let mut ends = Vec::new();
            for (n, size) in sizes.iter().enumerate() {
                let tx = progress.begin().unwrap();
                let end = Lsn(200 + 10 * n as u64);
                for _ in 0..*size {
                    progress.sent(tx).unwrap();
                    outstanding.push((tx, end));
                }
                progress.commit(tx, end).unwrap();
                ends.push(end);
            }
            let mut last = progress.confirmable();
            for index in order {
                if outstanding.is_empty() {
                    break;
                }
                let (tx, _) = outstanding.remove(index.index(outstanding.len()));
                progress.delivered(tx).unwrap();
                let now = progress.confirmable();
                prop_assert!(now >= last);
                if let Some(earliest) = outstanding.iter().map(|(_, end)| *end).min() {
                    prop_assert!(now < earliest, "{now} confirmed with {earliest} in flight");
                }
                last = now;
            }
            for (tx, _) in outstanding.drain(..) {
                progress.delivered(tx).unwrap();
            }
            prop_assert_eq!(progress.confirmable(), *ends.last().unwrap());
            prop_assert_eq!(progress.in_flight(), 0);
        }
    }
}
