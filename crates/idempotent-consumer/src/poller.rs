//! The poll loop, on a thread of its own: it polls the consumer (which
//! serves rebalances and keeps the member in the group), hands each record
//! to its partition's worker, and tends the assignments: starts workers,
//! restarts dead ones from their last stored offset, and pauses or resumes
//! each partition as the back-pressure, the database and the circuit say.
//!
//! Its own thread, because librdkafka runs the rebalance callback inside
//! `poll`, and a revoke waits there (bounded) for the partition's worker to
//! finish the attempt in flight and store its offset, so that librdkafka
//! commits it before the partition moves. Waiting on a runtime thread would
//! starve the very worker it waits for when the runtime has one thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::handler::Handler;
use super::partition::{Assignment, Rewind};
use super::pipeline::Pipeline;
use super::record::Record;

pub(super) type KafkaConsumer = BaseConsumer<Context>;

/// How long one poll waits for a record: also the longest a pause or resume
/// waits to be applied.
const POLL_TIMEOUT: Duration = Duration::from_millis(50);
/// A partition's worker gets paused above this many queued records, resumed
/// below the low mark. Generous on purpose: each resume costs a fetch round
/// trip, and pausing at 500 held the consumer to a third of its speed
/// (docs/benchmarks.md). 5 000 records of a few hundred bytes is a few MB.
pub(super) const QUEUE_HIGH: usize = 5_000;
pub(super) const QUEUE_LOW: usize = 1_000;
/// The longest wait before a dead worker starts again.
const MAX_RESTART_WAIT: Duration = Duration::from_secs(60);
/// The longest a rewind may hold the poll thread; also the wait before the
/// next try.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

type Assignments = Arc<Mutex<HashMap<i32, Assignment>>>;

fn lock(assignments: &Assignments) -> MutexGuard<'_, HashMap<i32, Assignment>> {
    assignments.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The consumer's context: the rebalance callbacks.
#[derive(Debug)]
pub(super) struct Context {
    assignments: Assignments,
    topic: String,
    /// Parent of every assignment's token.
    consuming: CancellationToken,
    revoke_grace: Duration,
    runtime: tokio::runtime::Handle,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let leaving: Vec<Assignment> = {
            let mut assignments = lock(&self.assignments);
            revoked
                .elements_for_topic(&self.topic)
                .iter()
                .filter_map(|element| assignments.remove(&element.partition()))
                .collect()
        };
        let partitions: Vec<i32> = leaving.iter().map(|a| a.partition).collect();
        tracing::info!(
            ?partitions,
            "revoking partitions: waiting for their attempts in flight"
        );
        // Every worker finishes its attempt in flight and stores its offset
        // before librdkafka commits and hands the partitions over.
        for partition in self.finish(leaving) {
            tracing::warn!(
                partition,
                grace = ?self.revoke_grace,
                "revoked while a record was in progress; its new owner may apply it again (absorbed as a duplicate)"
            );
        }
        for partition in &partitions {
            metrics::gauge!("consumer_lag", "partition" => partition.to_string()).set(0.0);
        }
        tracing::info!(partitions = ?self.owned(), "partitions revoked");
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                {
                    let mut assignments = lock(&self.assignments);
                    for element in assigned.elements_for_topic(&self.topic) {
                        let partition = element.partition();
                        assignments.entry(partition).or_insert_with(|| {
                            Assignment::new(partition, self.consuming.child_token())
                        });
                    }
                }
                tracing::info!(partitions = ?self.owned(), "partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(error) => tracing::error!(%error, "rebalance failed"),
        }
        metrics::gauge!("consumer_assigned_partitions").set(self.owned().len() as f64);
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        // NoOffset: an automatic commit found nothing new to commit.
        if let Err(error) = result
            && error.rdkafka_error_code() != Some(RDKafkaErrorCode::NoOffset)
        {
            tracing::warn!(%error, ?offsets, "offset commit failed; the records will be delivered again");
        }
    }
}

impl Context {
    pub(super) fn new(
        topic: String,
        consuming: CancellationToken,
        revoke_grace: Duration,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        Self {
            assignments: Arc::default(),
            topic,
            consuming,
            revoke_grace,
            runtime,
        }
    }

    /// Stops the workers of `leaving` and waits for them (all within one
    /// revoke grace) to finish their attempt in flight and store its offset;
    /// returns the partitions whose worker did not finish in time.
    fn finish(&self, leaving: Vec<Assignment>) -> Vec<i32> {
        for assignment in &leaving {
            assignment.token.cancel();
        }
        let deadline = Instant::now() + self.revoke_grace;
        let mut late = Vec::new();
        for mut assignment in leaving {
            if let Some(worker) = assignment.worker.as_mut() {
                let left = deadline.saturating_duration_since(Instant::now());
                if !self.wait_for(worker, left) {
                    late.push(assignment.partition);
                }
            }
        }
        late
    }

    /// Waits up to `limit` for a worker to end; false if it did not. Only
    /// ever blocks the poll thread: anywhere else (the consumer closing on
    /// the last drop of it, which may happen on a runtime thread) it does
    /// not wait.
    fn wait_for(&self, worker: &mut tokio::task::JoinHandle<()>, limit: Duration) -> bool {
        if tokio::runtime::Handle::try_current().is_ok() {
            return worker.is_finished();
        }
        // The timer is made inside block_on: it needs the runtime's context.
        self.runtime
            .block_on(async { tokio::time::timeout(limit, worker).await })
            .is_ok()
    }

    fn owned(&self) -> Vec<i32> {
        let mut owned: Vec<i32> = lock(&self.assignments).keys().copied().collect();
        owned.sort_unstable();
        owned
    }
}

/// The poll loop and what it tends.
pub(super) struct Poller<H: Handler> {
    pub(super) consumer: Arc<KafkaConsumer>,
    pub(super) pipeline: Arc<Pipeline<H>>,
    pub(super) max_batch: usize,
    pub(super) shutdown: CancellationToken,
}

impl<H: Handler> Poller<H> {
    /// Runs until shutdown; then lets every worker finish its attempt in
    /// flight (bounded by the revoke grace), commits what they stored and
    /// leaves the group.
    pub(super) fn run(&self) {
        let context = self.consumer.context();
        let mut logged_error: Option<Instant> = None;
        while !self.shutdown.is_cancelled() {
            match self.consumer.poll(POLL_TIMEOUT) {
                Some(Ok(message)) => self.hand_over(Record::from_message(&message)),
                // A broker that is down reports every few ms: logged once a
                // second at most.
                Some(Err(error))
                    if logged_error.is_none_or(|at| at.elapsed() > Duration::from_secs(1)) =>
                {
                    tracing::warn!(%error, "consumer error");
                    logged_error = Some(Instant::now());
                }
                Some(Err(_)) | None => {}
            }
            self.tend(context);
        }
        self.stop(context);
    }

    fn hand_over(&self, record: Record) {
        let assignments = lock(&self.consumer.context().assignments);
        if let Some(assignment) = assignments.get(&record.partition) {
            assignment.hand_over(record);
        }
        // Otherwise no longer ours: its new owner reads it again.
    }

    fn tend(&self, context: &Context) {
        let stopped = self.pipeline.policy.consuming.is_cancelled();
        let database_down = !self.pipeline.policy.health.database().is_available();
        let mut paused = 0;
        let mut assignments = lock(&context.assignments);
        for assignment in assignments.values_mut() {
            if assignment.worker_died() {
                self.bury(context, assignment);
            }
            if let Some(rewind) = assignment.rewind_due() {
                self.rewind(context, assignment, rewind);
            }
            if !stopped {
                assignment.start_worker(
                    &context.runtime,
                    &self.pipeline,
                    &self.consumer,
                    self.max_batch,
                );
            }
            let queued = assignment
                .shared
                .queued
                .load(std::sync::atomic::Ordering::SeqCst);
            if queued > QUEUE_HIGH {
                assignment.backlogged = true;
            } else if queued < QUEUE_LOW {
                assignment.backlogged = false;
            }
            // Asked of librdkafka whenever it differs from what was last
            // asked, and at least once per assignment: librdkafka keeps a
            // partition paused by the application across a revoke and a new
            // assignment, and only what this loop asks undoes it.
            let pause =
                stopped || database_down || assignment.backlogged || assignment.worker.is_none();
            if assignment.paused != Some(pause) {
                let partitions = one_partition(&context.topic, assignment.partition);
                let applied = if pause {
                    self.consumer.pause(&partitions)
                } else {
                    self.consumer.resume(&partitions)
                };
                match applied {
                    Ok(()) => assignment.paused = Some(pause),
                    Err(error) => {
                        tracing::warn!(%error, partition = assignment.partition, pause, "pause or resume failed; trying again")
                    }
                }
            }
            if assignment.paused == Some(true) {
                paused += 1;
            }
        }
        metrics::gauge!("consumer_paused_partitions").set(f64::from(paused));
    }

    /// A worker died (it panicked): its records in memory are lost, so the
    /// partition stays paused until it is rewound to the last stored offset.
    fn bury(&self, context: &Context, assignment: &mut Assignment) {
        let dead = assignment.bury_worker();
        let cause = dead
            .map(|worker| match context.runtime.block_on(worker) {
                Err(error) if error.is_panic() => panic_message(error.into_panic()),
                Err(error) => error.to_string(),
                Ok(()) => "it returned".to_owned(),
            })
            .unwrap_or_default();
        self.pipeline.policy.health.worker_died();
        // No partition label: a labelled series would first appear at 1, and
        // `increase()` cannot see a series' first sample (the log names it).
        metrics::counter!("consumer_worker_restarts_total").increment(1);
        tracing::error!(
            partition = assignment.partition,
            cause,
            "a partition worker died; its partition is rewound to the last stored offset"
        );
    }

    /// Rewinds a dead worker's partition, then lets a new worker start after
    /// a wait that grows with each death. Until the seek succeeds the
    /// partition stays paused, or the records lost with the worker would be
    /// skipped; a failed seek is tried again after a pause, as each try may
    /// hold the poll thread for its timeout.
    fn rewind(&self, context: &Context, assignment: &mut Assignment, rewind: Rewind) {
        let partition = assignment.partition;
        if let Some(to) = rewind.to
            && let Err(error) =
                self.consumer
                    .seek(&context.topic, partition, Offset::Offset(to), SEEK_TIMEOUT)
        {
            tracing::error!(%error, partition, to, "cannot rewind the partition of a dead worker; trying again");
            assignment.rewind = Some(Rewind {
                next_try: Instant::now() + SEEK_TIMEOUT,
                ..rewind
            });
            return;
        }
        let wait = Duration::from_secs(1 << assignment.deaths.min(6)).min(MAX_RESTART_WAIT);
        assignment.rewound(Instant::now() + wait);
        tracing::info!(partition, to = rewind.to, restart_in = ?wait, "rewound; a new worker starts soon");
    }

    fn stop(&self, context: &Context) {
        tracing::info!("consumer stopping: finishing the attempts in flight");
        let leaving: Vec<Assignment> = lock(&context.assignments).drain().map(|(_, a)| a).collect();
        for partition in context.finish(leaving) {
            tracing::warn!(
                partition,
                "a record was still in progress at shutdown; it will be delivered again"
            );
        }
        // Commit what the workers stored, then leave the group (closing the
        // consumer sends LeaveGroup: partitions move at once).
        match self.consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => tracing::warn!(%error, "final offset commit failed"),
        }
        self.consumer.unsubscribe();
        tracing::info!("consumer stopped");
    }
}

fn one_partition(topic: &str, partition: i32) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, partition);
    list
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned())
}
