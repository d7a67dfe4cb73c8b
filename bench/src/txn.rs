//! A transactional producer's coordinator side, as the Java client and librdkafka
//! drive it (KIP-98, with KIP-447 offsets): FindCoordinator for the transactional id,
//! InitProducerId with it, AddPartitionsToTxn before the first batch to a partition in
//! each transaction, AddOffsetsToTxn and TxnOffsetCommit for a consume-transform-produce
//! loop's input positions, and EndTxn. The produce requests themselves go over the
//! pipelined connections of `load.rs`; this is the one-request-at-a-time part.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, GroupId, ProducerId,
    TransactionalId, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use sluice_client::sbs;

use crate::kafka::{call_retrying, err, topic_name, Client};

/// A transactional id no other producer of this run, or of an earlier run against
/// the same broker, uses: each producer must be its own instance, or InitProducerId
/// would fence the others.
pub fn unique_id(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// The first non-zero of a response's per-partition error codes, or 0. A coordinator
/// that is loading or busy answers every partition of a request alike, so that code
/// stands for the request.
fn first_error(codes: impl IntoIterator<Item = i16>) -> i16 {
    codes.into_iter().find(|c| *c != 0).unwrap_or(0)
}

/// The consumer-group membership a consume-transform-produce loop commits its offsets
/// under, so that the group coordinator can fence a zombie (KIP-447).
pub struct GroupMeta {
    pub group: String,
    pub generation: i32,
    pub member_id: String,
}

/// One transactional producer instance, talking to its transaction coordinator.
pub struct Txn {
    coordinator: Client,
    id: String,
    pub producer_id: i64,
    pub epoch: i16,
    /// The partitions of the open transaction, each added once.
    partitions: HashSet<(String, i32)>,
    /// Whether the open transaction already holds the group's offsets partition.
    offsets_added: bool,
    /// When the open transaction took its first partition.
    started: Option<Instant>,
}

impl Txn {
    /// Finds the coordinator of `id` and takes the id's producer (epoch bumped).
    pub async fn init(bootstrap: SocketAddr, id: String) -> io::Result<Txn> {
        let addr = Client::connect(bootstrap)
            .await?
            .coordinator(&id, 1)
            .await?;
        let mut coordinator = Client::connect(addr).await?;
        let (producer_id, epoch) = coordinator.init_producer_id(Some(&id)).await?;
        Ok(Txn {
            coordinator,
            id,
            producer_id,
            epoch,
            partitions: HashSet::new(),
            offsets_added: false,
            started: None,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The fields that name this producer in every request: (transactional id,
    /// producer id, epoch).
    fn names(&self) -> (TransactionalId, ProducerId, i16) {
        (
            TransactionalId(sbs(&self.id)),
            ProducerId(self.producer_id),
            self.epoch,
        )
    }

    /// Whether a transaction is open and has been for `interval` or longer.
    pub fn due(&self, interval: Duration) -> bool {
        self.started.is_some_and(|s| s.elapsed() >= interval)
    }

    pub fn is_open(&self) -> bool {
        self.started.is_some()
    }

    /// Adds those of `partitions` of `topic` that the open transaction does not hold
    /// yet (opening one if none is), in one AddPartitionsToTxn. Right after a commit
    /// the coordinator answers CONCURRENT_TRANSACTIONS until the markers are written;
    /// that is retried, as clients do.
    pub async fn add_partitions(
        &mut self,
        topic: &str,
        partitions: impl IntoIterator<Item = i32>,
    ) -> io::Result<()> {
        let mut new: Vec<i32> = partitions
            .into_iter()
            .filter(|p| !self.partitions.contains(&(topic.to_string(), *p)))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        new.sort_unstable();
        new.dedup();
        let (id, pid, epoch) = self.names();
        let make = || {
            AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(id.clone())
                .with_v3_and_below_producer_id(pid)
                .with_v3_and_below_producer_epoch(epoch)
                .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(new.clone())])
        };
        let code = |r: &AddPartitionsToTxnResponse| {
            first_error(
                r.results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| &t.results_by_partition)
                    .map(|p| p.partition_error_code),
            )
        };
        call_retrying(&mut self.coordinator, "AddPartitionsToTxn", make, code).await?;
        self.started.get_or_insert_with(Instant::now);
        self.partitions
            .extend(new.into_iter().map(|p| (topic.to_string(), p)));
        Ok(())
    }

    /// `send_offsets_to_transaction`: puts the group's offsets partition into the open
    /// transaction (AddOffsetsToTxn, once per transaction) and writes `offsets` (the
    /// next input offset per partition of `topic`) to the group coordinator at
    /// `group_coordinator` as a TxnOffsetCommit with the member's group metadata. They
    /// become the group's committed offsets only if the transaction commits.
    pub async fn send_offsets(
        &mut self,
        group_coordinator: &mut Client,
        meta: &GroupMeta,
        topic: &str,
        offsets: &BTreeMap<i32, i64>,
    ) -> io::Result<()> {
        let (id, pid, epoch) = self.names();
        if !self.offsets_added {
            let make = || {
                AddOffsetsToTxnRequest::default()
                    .with_transactional_id(id.clone())
                    .with_producer_id(pid)
                    .with_producer_epoch(epoch)
                    .with_group_id(GroupId(sbs(&meta.group)))
            };
            let code = |r: &AddOffsetsToTxnResponse| r.error_code;
            call_retrying(&mut self.coordinator, "AddOffsetsToTxn", make, code).await?;
            self.offsets_added = true;
            self.started.get_or_insert_with(Instant::now);
        }
        let partitions: Vec<TxnOffsetCommitRequestPartition> = offsets
            .iter()
            .map(|(p, o)| {
                TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(*o)
                    .with_committed_leader_epoch(-1)
            })
            .collect();
        let make = || {
            TxnOffsetCommitRequest::default()
                .with_transactional_id(id.clone())
                .with_group_id(GroupId(sbs(&meta.group)))
                .with_producer_id(pid)
                .with_producer_epoch(epoch)
                .with_generation_id(meta.generation)
                .with_member_id(sbs(&meta.member_id))
                .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(partitions.clone())])
        };
        let code = |r: &TxnOffsetCommitResponse| {
            first_error(
                r.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| p.error_code),
            )
        };
        call_retrying(group_coordinator, "TxnOffsetCommit", make, code).await?;
        Ok(())
    }

    /// Commits the open transaction (EndTxn). The caller must have every produce of
    /// the transaction acknowledged first, as a client's commit flushes its batches.
    pub async fn commit(&mut self) -> io::Result<()> {
        if !self.is_open() {
            return Err(err("commit without an open transaction"));
        }
        let (id, pid, epoch) = self.names();
        let make = || {
            EndTxnRequest::default()
                .with_transactional_id(id.clone())
                .with_producer_id(pid)
                .with_producer_epoch(epoch)
                .with_committed(true)
        };
        let code = |r: &EndTxnResponse| r.error_code;
        call_retrying(&mut self.coordinator, "EndTxn", make, code).await?;
        self.partitions.clear();
        self.offsets_added = false;
        self.started = None;
        Ok(())
    }
}
