//! One assigned partition: its queue, its worker, its token.
//!
//! The worker takes the records queued for it in order, up to a batch at a
//! time, hands them to the pipeline and stores the offset of the last
//! finished one (librdkafka commits stored offsets every second, on revoke
//! and on close). When the pipeline finishes only a prefix (its token was
//! cancelled), the worker stores that prefix and stops: nothing after an
//! unfinished record is ever processed or stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::handler::Handler;
use super::pipeline::Pipeline;
use super::record::Record;

/// No offset known yet.
const UNKNOWN: i64 = -1;

/// What the poll loop and the worker of one partition share.
#[derive(Debug)]
pub(super) struct Shared {
    /// Records handed to the worker and not yet taken back by it.
    pub(super) queued: AtomicUsize,
    /// The offset to resume from if the worker is lost: the one after the
    /// last stored, or the first handed over; `UNKNOWN` before any.
    pub(super) resume_at: AtomicI64,
}

/// One assignment of one partition to this consumer.
#[derive(Debug)]
pub(super) struct Assignment {
    pub(super) partition: i32,
    /// Cancelled on revoke, on shutdown and when the circuit opens.
    pub(super) token: CancellationToken,
    pub(super) shared: Arc<Shared>,
    sender: mpsc::UnboundedSender<Record>,
    /// Until the worker starts: its end of the queue.
    receiver: Option<mpsc::UnboundedReceiver<Record>>,
    pub(super) worker: Option<JoinHandle<()>>,
    /// Above the high mark until back under the low one (hysteresis).
    pub(super) backlogged: bool,
    /// What was last asked of librdkafka; `None` before anything was.
    pub(super) paused: Option<bool>,
    /// Times its worker died; the next start waits longer each time.
    pub(super) deaths: u32,
    /// A dead worker is started again from here, not before.
    pub(super) restart_at: Option<Instant>,
    /// Set while a dead worker's partition waits to be rewound: no new
    /// worker, and the partition paused, until it is.
    pub(super) rewind: Option<Rewind>,
}

/// A partition to rewind after its worker died.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rewind {
    /// The last stored offset's successor; `None` if nothing was ever
    /// handed over, so nothing was lost.
    pub(super) to: Option<i64>,
    pub(super) next_try: Instant,
}

impl Assignment {
    pub(super) fn new(partition: i32, token: CancellationToken) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Self {
            partition,
            token,
            shared: Arc::new(Shared {
                queued: AtomicUsize::new(0),
                resume_at: AtomicI64::new(UNKNOWN),
            }),
            sender,
            receiver: Some(receiver),
            worker: None,
            backlogged: false,
            paused: None,
            deaths: 0,
            restart_at: None,
            rewind: None,
        }
    }

    /// Queues a record for the worker (kept while a new worker waits for
    /// its start: the record comes after the rewind). A stopped assignment,
    /// or one whose worker died and is not rewound yet, drops it: whoever
    /// resumes the partition reads it again.
    pub(super) fn hand_over(&self, record: Record) {
        if self.token.is_cancelled() {
            return;
        }
        let _ = self.shared.resume_at.compare_exchange(
            UNKNOWN,
            record.offset,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if self.sender.send(record).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Starts the worker, unless it runs or waits for a rewind or a restart.
    pub(super) fn start_worker<H: Handler, C: ConsumerContext + 'static>(
        &mut self,
        runtime: &tokio::runtime::Handle,
        pipeline: &Arc<Pipeline<H>>,
        consumer: &Arc<BaseConsumer<C>>,
        max_batch: usize,
    ) {
        if self.worker.is_some() || self.restart_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let Some(receiver) = self.receiver.take() else {
            return;
        };
        self.restart_at = None;
        self.worker = Some(runtime.spawn(work(
            receiver,
            Arc::clone(pipeline),
            Arc::clone(consumer),
            Arc::clone(&self.shared),
            self.token.clone(),
            max_batch,
        )));
    }

    /// True when the worker ended although nobody stopped it: it panicked.
    pub(super) fn worker_died(&self) -> bool {
        !self.token.is_cancelled() && self.worker.as_ref().is_some_and(JoinHandle::is_finished)
    }

    /// After its worker died: the worker, to learn why; the partition is to
    /// be rewound to the last stored offset before anything else happens.
    /// Until then the old queue stays closed (it went with the worker), so
    /// records polled meanwhile are dropped and fetched again after the
    /// rewind, in order.
    pub(super) fn bury_worker(&mut self) -> Option<JoinHandle<()>> {
        let resume_at = self.shared.resume_at.load(Ordering::SeqCst);
        self.deaths += 1;
        self.rewind = Some(Rewind {
            to: (resume_at != UNKNOWN).then_some(resume_at),
            next_try: Instant::now(),
        });
        self.worker.take()
    }

    /// The rewind is due now.
    pub(super) fn rewind_due(&self) -> Option<Rewind> {
        self.rewind
            .filter(|rewind| rewind.next_try <= Instant::now())
    }

    /// Rewound: a fresh queue, and a new worker not before `restart_at`.
    pub(super) fn rewound(&mut self, restart_at: Instant) {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.sender = sender;
        self.receiver = Some(receiver);
        self.shared.queued.store(0, Ordering::SeqCst);
        self.restart_at = Some(restart_at);
        self.rewind = None;
    }
}

async fn work<H: Handler, C: ConsumerContext>(
    mut queue: mpsc::UnboundedReceiver<Record>,
    pipeline: Arc<Pipeline<H>>,
    consumer: Arc<BaseConsumer<C>>,
    shared: Arc<Shared>,
    token: CancellationToken,
    max_batch: usize,
) {
    loop {
        let first = tokio::select! {
            biased;
            () = token.cancelled() => return,
            record = queue.recv() => match record {
                Some(record) => record,
                None => return,
            },
        };
        let mut batch = vec![first];
        // Only records already waiting: a batch never waits to fill.
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(record) => batch.push(record),
                Err(_) => break,
            }
        }
        let outcomes = pipeline.process(&batch, &token).await;
        if let Some(last) = outcomes.len().checked_sub(1).map(|i| &batch[i]) {
            // rd_kafka_offset_store stores `offset + 1` (the next record to
            // read) itself: pass the last finished record's own offset.
            match consumer.store_offset(&last.topic, last.partition, last.offset) {
                Ok(()) => shared.resume_at.store(last.offset + 1, Ordering::SeqCst),
                // Revoked meanwhile: its new owner reads the records again,
                // and the dedupe rows absorb them.
                Err(error) => {
                    tracing::debug!(%error, partition = last.partition, "offset not stored")
                }
            }
        }
        shared.queued.fetch_sub(batch.len(), Ordering::SeqCst);
        if outcomes.len() < batch.len() {
            return;
        }
    }
}
