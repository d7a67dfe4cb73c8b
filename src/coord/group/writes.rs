//! The group shell's writes to `__consumer_offsets`, in one ordered queue: every record
//! the coordinator makes — a KIP-848 heartbeat's, a timer's, an offset commit's, a
//! generation's — reaches its partition in the order the coordinator made it, so a
//! replay rebuilds what memory holds. One task writes the queue: the writes that wait
//! while a batch is in flight go out together in the next one (a group commit: a
//! thousand heartbeats share a few durable writes, not one each). A transactional
//! offset commit is a batch of its own (it carries its producer).
//!
//! A batch that cannot be stored and holds KIP-848 records leaves memory ahead of the
//! log: the writer forgets the partition's groups at once (they reload from the log at
//! the next request) and fails the writes still queued for it, which were made on top
//! of the lost state.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use glommio::channels::local_channel::{self, LocalSender};
use kafka_protocol::error::ResponseError;
use sluice_coordinator::consumer_records::is_consumer_key;
use sluice_coordinator::group::Record;

use super::partition_for;
use super::shard::GroupShell;
use crate::base::error::ApiError;

/// Each partition's outcome for one write.
pub type Outcome = BTreeMap<i32, Result<(), ApiError>>;

/// The most record bytes one batch of coalesced writes carries (well below the
/// internal batch limit); the rest goes in the next batch.
const BATCH_BYTES: usize = 4 << 20;

struct Write {
    /// By partition, in the order made.
    records: BTreeMap<i32, Vec<Record>>,
    /// Partitions it only waits on (a barrier: answered once what was queued before it
    /// for them is written).
    waits: BTreeSet<i32>,
    producer: Option<(i64, i16)>,
    /// Partitions already failed (their records dropped after an earlier failure).
    failed: BTreeMap<i32, ApiError>,
    tx: LocalSender<Outcome>,
}

impl Write {
    fn bytes(&self) -> usize {
        self.records
            .values()
            .flatten()
            .map(|r| r.key.len() + r.value.as_ref().map_or(0, Vec::len))
            .sum()
    }
}

#[derive(Default)]
pub struct Writes {
    queue: RefCell<VecDeque<Write>>,
    flushing: Cell<bool>,
}

impl GroupShell {
    /// Writes `records` (by their groups' partitions; one transactional batch of
    /// `producer` if given) after everything queued before, and returns each
    /// partition's outcome. `barrier`: a partition to wait on even without records,
    /// so an answer that reads memory does not leave before what made that memory is
    /// durable.
    pub(super) async fn write(
        &self,
        records: Vec<Record>,
        producer: Option<(i64, i16)>,
        barrier: Option<i32>,
    ) -> Outcome {
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for r in records {
            by_partition
                .entry(partition_for(&r.group))
                .or_default()
                .push(r);
        }
        let waits: BTreeSet<i32> = barrier
            .into_iter()
            .filter(|p| !by_partition.contains_key(p))
            .collect();
        let w = &self.writes;
        if by_partition.is_empty() && (waits.is_empty() || !w.flushing.get()) {
            // Nothing to write, and nothing written or waiting before it.
            return waits.into_iter().map(|p| (p, Ok(()))).collect();
        }
        let (tx, rx) = local_channel::new_bounded(1);
        w.queue.borrow_mut().push_back(Write {
            records: by_partition,
            waits,
            producer,
            failed: BTreeMap::new(),
            tx,
        });
        if !w.flushing.replace(true) {
            let (Some(shell), Some(broker)) = (self.me.upgrade(), self.broker.upgrade()) else {
                w.flushing.set(false);
                return BTreeMap::new();
            };
            glommio::spawn_local(async move {
                shell.flush(&broker).await;
                shell.writes.flushing.set(false);
            })
            .detach();
        }
        rx.recv().await.unwrap_or_default()
    }

    /// Writes the queue until it is empty.
    async fn flush(&self, broker: &crate::partition::broker::Broker) {
        loop {
            let batch = self.next_batch();
            if batch.is_empty() {
                return;
            }
            let producer = batch[0].producer;
            let mut records: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
            for w in &batch {
                for (p, recs) in &w.records {
                    records.entry(*p).or_default().extend(recs.iter().cloned());
                }
            }
            let mut outcome: BTreeMap<i32, Result<(), ApiError>> = BTreeMap::new();
            for (p, recs) in records {
                let r = self.append_batch(broker, p, &recs, producer).await;
                if r.is_err() && recs.iter().any(|r| is_consumer_key(&r.key)) {
                    self.lost(p);
                }
                outcome.insert(p, r);
            }
            for w in batch {
                let mut out: Outcome = w
                    .records
                    .keys()
                    .chain(w.waits.iter())
                    .map(|p| (*p, outcome.get(p).cloned().unwrap_or(Ok(()))))
                    .collect();
                for (p, e) in w.failed {
                    out.insert(p, Err(e));
                }
                let _ = w.tx.try_send(out);
            }
        }
    }

    /// The next writes to go out together: a run of plain writes up to
    /// [`BATCH_BYTES`], or one transactional write.
    fn next_batch(&self) -> Vec<Write> {
        let mut q = self.writes.queue.borrow_mut();
        let mut out = Vec::new();
        let mut bytes = 0;
        while let Some(w) = q.front() {
            let transactional = w.producer.is_some();
            if !out.is_empty() && (transactional || bytes + w.bytes() > BATCH_BYTES) {
                break;
            }
            bytes += w.bytes();
            out.push(q.pop_front().expect("front"));
            if transactional {
                break;
            }
        }
        out
    }

    /// KIP-848 records of `partition` were not stored: its groups are forgotten (they
    /// reload from the log) and the writes queued for it fail, since the coordinator
    /// made them on top of what was lost.
    fn lost(&self, partition: i32) {
        tracing::warn!(
            partition,
            "consumer group records not stored: reloading the partition's groups"
        );
        self.forget_partition(partition);
        let e = ApiError::with(
            ResponseError::NotCoordinator,
            "an earlier write of the group's partition failed; its groups reload",
        );
        for w in self.writes.queue.borrow_mut().iter_mut() {
            if w.records.remove(&partition).is_some() || w.waits.remove(&partition) {
                w.failed.insert(partition, e.clone());
            }
        }
    }
}
