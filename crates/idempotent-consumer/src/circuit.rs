//! The dead-letter circuit: when too many recent records go to the DLT, the
//! consumer stops instead of dumping a bad deploy (or a bad producer) into
//! the DLT. It stays open until the service restarts, after someone looked.
//!
//! Opening it cancels every partition's token: each worker finishes the
//! attempt it is in and stops, and no offset is stored past a record that
//! was not finished, on any partition; a restart resumes at the first of
//! them (docs/inventory-service.md).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug)]
pub struct Circuit {
    recent: Mutex<VecDeque<bool>>,
    window: usize,
    max_share: f64,
    min_records: usize,
    open: AtomicBool,
}

impl Circuit {
    /// Opens when more than `max_share` of the last `window` records were
    /// dead-lettered, once at least `min_records` were seen.
    pub fn new(window: usize, max_share: f64, min_records: usize) -> Self {
        Self {
            recent: Mutex::new(VecDeque::with_capacity(window)),
            window: window.max(1),
            max_share,
            min_records: min_records.max(1),
            open: AtomicBool::new(false),
        }
    }

    /// Records one outcome; true if this one opened the circuit.
    pub fn record(&self, dead_lettered: bool) -> bool {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() == self.window {
            recent.pop_front();
        }
        recent.push_back(dead_lettered);
        let failed = recent.iter().filter(|d| **d).count();
        let trips = recent.len() >= self.min_records
            && failed as f64 > self.max_share * recent.len() as f64;
        trips && !self.open.swap(true, Ordering::SeqCst)
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_when_more_than_half_of_the_window_failed() {
        let circuit = Circuit::new(100, 0.5, 20);
        for _ in 0..50 {
            assert!(!circuit.record(false));
        }
        for _ in 0..50 {
            assert!(!circuit.record(true), "exactly half is not more than half");
        }
        assert!(circuit.record(true), "51 of the last 100");
        assert!(circuit.is_open());
        assert!(!circuit.record(true), "it opens once");
    }

    #[test]
    fn a_few_early_failures_do_not_open_it() {
        let circuit = Circuit::new(100, 0.5, 20);
        for _ in 0..19 {
            circuit.record(true);
        }
        assert!(!circuit.is_open());
        assert!(circuit.record(true));
    }

    #[test]
    fn old_failures_leave_the_window() {
        let circuit = Circuit::new(10, 0.5, 10);
        for _ in 0..5 {
            circuit.record(true);
        }
        for _ in 0..100 {
            circuit.record(false);
        }
        for _ in 0..5 {
            circuit.record(true);
        }
        assert!(!circuit.is_open());
    }
}
