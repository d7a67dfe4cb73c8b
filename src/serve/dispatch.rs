//! The serving side of cross-shard calls: one [`ShardServer`] per shard owns the
//! shard's subsystems — the partition host ([`Broker`]), the controller (shard 0 only)
//! and the group shell — and answers each typed call ([`crate::base::rpc`]) with the
//! subsystem that owns it. Built at start-up by `crate::node`, which hands it to the
//! mesh.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};
use sluice_coordinator::group::consumer::{ConsumerGroupView, HeartbeatReply, Refused};
use sluice_coordinator::group::{Code, GroupSummary};
use sluice_coordinator::txn::{ListedTxns, ProducerIdAndEpoch, TxnDescription};
use sluice_replication::cluster::Applied;
use sluice_storage::producer::ActiveProducer;

use crate::base::error::ApiError;
use crate::base::ids::{Offset, ProducerId};
use crate::base::rpc::{self, Appended, ReadOut, ShardService};
use crate::base::util::{join_all, last_first};
use crate::cluster::controller::Controller;
use crate::coord::group::shard::GroupShell;
use crate::coord::txn::TxnShell;
use crate::partition::broker::{Broker, StagedProduce};

pub struct ShardServer {
    pub broker: Rc<Broker>,
    /// Present on shard 0 only: control calls are always sent there.
    pub controller: Option<Controller>,
    pub groups: Rc<GroupShell>,
    pub txns: Rc<TxnShell>,
}

impl ShardServer {
    fn controller(&self) -> &Controller {
        // Invariant, not an input: control calls are sent only by `Broker::control`,
        // which always addresses shard 0, and `crate::node` gives shard 0 (and only
        // it) the controller.
        self.controller.as_ref().unwrap_or_else(|| {
            panic!(
                "control call served on {}: Broker::control sends them to shard 0 only, which holds the controller",
                self.broker.shard
            )
        })
    }
}

impl ShardService for ShardServer {
    async fn produce(&self, c: rpc::Produce) -> Vec<Result<Appended, ApiError>> {
        let b = &self.broker;
        let (acks, timeout) = (c.acks, c.timeout);
        // Every partition staged first (judged, offsets given: at once, unless a turn,
        // a roll or a sequence gap waits); then made durable, the last journaled one
        // first: its wait for the journal covers the others' (`last_first`), where each
        // partition listening and being woken for its write and its sync cost a fifth
        // of a broker's CPU at 10,000 partitions of one record each; then acks=all
        // waits for the high watermarks, again the last one first.
        let staged = join_all(c.items.into_iter().map(|it| async move {
            // KIP-890: the first transactional batch of a transaction here is
            // checked with the coordinator before it opens a transaction.
            crate::coord::txn::verify_produce(b, &it).await?;
            b.produce_stage(acks, timeout, it).await
        }))
        .await;
        let mut results: Vec<Option<Result<Appended, ApiError>>> = Vec::new();
        let mut todo = Vec::new();
        for (i, s) in staged.into_iter().enumerate() {
            match s {
                Ok(s) => {
                    results.push(None);
                    todo.push((i, s));
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let journaled = |(_, s): &(usize, StagedProduce)| s.journaled();
        let durable = |(i, s)| async move { (i, b.produce_durable(s).await) };
        let durable = last_first(todo, journaled, durable).await;
        // acks=all: the last durable partition's high watermark first, alone. The
        // followers fetch every partition of a shard call in the same rounds, so by
        // then the others' are usually covered and answer at their first check
        // without a listener (each waits until the deadline of its stage, not longer).
        let pending = |(_, d): &(usize, Result<StagedProduce, ApiError>)| d.is_ok();
        let acked = |(i, d): (usize, Result<StagedProduce, ApiError>)| async move {
            match d {
                Ok(d) => (i, b.produce_acked(d).await),
                Err(e) => (i, Err(e)),
            }
        };
        let acked = last_first(durable, pending, acked).await;
        for (i, r) in acked {
            results[i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| r.expect("every partition finished"))
            .collect()
    }

    async fn epoch_end(&self, c: rpc::EpochEnd) -> Vec<Result<rpc::EpochEndOut, ApiError>> {
        self.broker.epoch_end_local(c.items)
    }

    async fn read(&self, c: rpc::Read) -> Vec<ReadOut> {
        let b = &self.broker;
        // Most reads are answered at once (nothing new, or the tail cache); only those
        // that go to the disk become futures.
        let mut outs: Vec<Option<ReadOut>> = Vec::with_capacity(c.items.len());
        let mut pending = Vec::new();
        for (i, it) in c.items.into_iter().enumerate() {
            match b.read_start(it) {
                Ok(out) => outs.push(Some(out)),
                Err(p) => {
                    outs.push(None);
                    pending.push((i, p));
                }
            }
        }
        let reads = pending
            .into_iter()
            .map(|(i, p)| async move { (i, b.read_finish(p).await) });
        for (i, out) in join_all(reads).await {
            outs[i] = Some(out);
        }
        outs.into_iter()
            .map(|o| o.expect("every read answered"))
            .collect()
    }

    async fn wait(&self, c: rpc::Wait) -> bool {
        self.broker
            .wait_local(c.items, c.timeout, c.follower, c.read_committed)
            .await
    }

    async fn changes(&self, c: rpc::Changes) -> (u64, Option<Vec<crate::partition::changes::Key>>) {
        self.broker.changes.since(c.since)
    }

    async fn wait_change(&self, c: rpc::WaitChange) -> bool {
        self.broker.changes.wait_past(c.since, c.timeout).await
    }

    async fn list_offsets(&self, c: rpc::ListOffsets) -> Vec<Result<rpc::ListedOffset, ApiError>> {
        let b = &self.broker;
        let futs = c
            .items
            .into_iter()
            .map(|it| b.list_offset_local(it, c.read_committed));
        join_all(futs).await
    }

    async fn offsets_before(
        &self,
        c: rpc::OffsetsBefore,
    ) -> Vec<Result<rpc::SegmentTimes, ApiError>> {
        let b = &self.broker;
        c.items
            .into_iter()
            .map(|tp| b.offsets_before_local(tp.topic(), tp.partition(), c.leader_only))
            .collect()
    }

    /// Any replica holding the log answers, as Kafka's (a follower's producer state is
    /// the leader's: it applies the same batches).
    async fn describe_producers(
        &self,
        c: rpc::DescribeProducers,
    ) -> Vec<Result<Vec<ActiveProducer>, ApiError>> {
        let b = &self.broker;
        c.items
            .into_iter()
            .map(|tp| {
                b.log(tp.topic(), tp.partition())
                    .map(|(log, _)| log.active_producers())
            })
            .collect()
    }

    async fn describe_logs(&self, _c: rpc::DescribeLogs) -> rpc::ShardLogs {
        self.broker.describe_logs_local()
    }

    async fn delete_records(&self, c: rpc::DeleteRecords) -> Vec<Result<Offset, ApiError>> {
        let b = &self.broker;
        let futs = c.items.into_iter().map(|it| b.delete_records_local(it));
        join_all(futs).await
    }

    async fn apply(&self, c: rpc::Apply) {
        self.broker.apply(c.0).await
    }

    async fn create_topics(
        &self,
        c: rpc::CreateTopics,
    ) -> Vec<Result<rpc::CreatedTopic, ApiError>> {
        self.controller().create_topics(&self.broker, c).await
    }

    async fn delete_topics(
        &self,
        c: rpc::DeleteTopics,
    ) -> Vec<Result<rpc::DeletedTopic, ApiError>> {
        self.controller().delete_topics(&self.broker, c).await
    }

    async fn create_partitions(&self, c: rpc::CreatePartitions) -> Vec<Result<(), ApiError>> {
        self.controller().create_partitions(&self.broker, c).await
    }

    async fn alter_configs(&self, c: rpc::AlterConfigs) -> Vec<Result<(), ApiError>> {
        self.controller().alter_configs(&self.broker, c).await
    }

    async fn elect_leaders(&self, c: rpc::ElectLeaders) -> Vec<rpc::ElectedPartition> {
        self.controller().elect_leaders(&self.broker, c).await
    }

    async fn reassign(&self, c: rpc::Reassign) -> Vec<Result<(), ApiError>> {
        self.controller().reassign(&self.broker, c).await
    }

    async fn describe_quorum(&self, _: rpc::DescribeQuorum) -> Result<rpc::QuorumView, i32> {
        self.controller().quorum.describe_anywhere().await
    }

    async fn change_voters(&self, c: rpc::ChangeVoters) -> Result<(), ApiError> {
        let q = &self.controller().quorum;
        let timeout = std::time::Duration::from_millis(c.timeout_ms.clamp(1_000, 300_000) as u64);
        q.change_voters_anywhere(c.node, c.add, timeout).await
    }

    async fn unregister(&self, c: rpc::Unregister) -> Result<(), ApiError> {
        let cmd = sluice_replication::cluster::Command::UnregisterBroker { id: c.0 };
        self.controller()
            .propose(&self.broker, cmd)
            .await
            .map(|_| ())
    }

    async fn list_reassignments(&self, c: rpc::ListReassignments) -> Vec<rpc::OngoingReassignment> {
        self.controller().list_reassignments(c)
    }

    async fn propose(&self, c: rpc::Propose) -> Result<Applied, ApiError> {
        self.controller().propose(&self.broker, c.0).await
    }

    async fn allocate_producer_id(
        &self,
        _: rpc::AllocateProducerId,
    ) -> Result<ProducerId, ApiError> {
        self.controller()
            .next_producer_id(&self.broker)
            .await
            .map(ProducerId::new)
    }

    async fn join_group(&self, c: rpc::JoinGroup) -> Result<JoinGroupResponse, ApiError> {
        self.groups.join(&self.broker, c).await
    }

    async fn sync_group(&self, c: rpc::SyncGroup) -> Result<SyncGroupResponse, ApiError> {
        self.groups.sync(&self.broker, c).await
    }

    async fn heartbeat(&self, c: rpc::Heartbeat) -> Result<Code, ApiError> {
        self.groups.heartbeat(&self.broker, c).await
    }

    async fn leave_group(&self, c: rpc::LeaveGroup) -> Result<rpc::LeftGroup, ApiError> {
        let (error, members) = self.groups.leave(&self.broker, c).await?;
        Ok(rpc::LeftGroup { error, members })
    }

    async fn commit_offsets(
        &self,
        c: rpc::CommitOffsets,
    ) -> Result<Vec<rpc::PartitionCode>, ApiError> {
        self.groups.commit(&self.broker, c).await
    }

    async fn fetch_offsets(
        &self,
        c: rpc::FetchOffsets,
    ) -> Result<Vec<rpc::FetchedOffset>, ApiError> {
        self.groups.fetch(&self.broker, c).await
    }

    async fn txn_commit_offsets(
        &self,
        c: rpc::TxnCommitOffsets,
    ) -> Result<Vec<rpc::PartitionCode>, ApiError> {
        self.groups.txn_commit(&self.broker, c).await
    }

    async fn txn_init(&self, c: rpc::TxnInit) -> Result<ProducerIdAndEpoch, ApiError> {
        self.txns.init(&self.broker, c).await
    }

    async fn txn_add(&self, c: rpc::TxnAdd) -> Result<(), ApiError> {
        self.txns.add_partitions(&self.broker, c).await
    }

    async fn txn_add_offsets(&self, c: rpc::TxnAddOffsets) -> Result<(), ApiError> {
        self.txns.add_offsets(&self.broker, c).await
    }

    async fn txn_end(&self, c: rpc::TxnEnd) -> Result<ProducerIdAndEpoch, ApiError> {
        self.txns.end(&self.broker, c).await
    }

    async fn txn_verify(&self, c: rpc::TxnVerify) -> Result<Vec<rpc::PartitionCode>, ApiError> {
        self.txns.verify(&self.broker, c).await
    }

    async fn txn_describe(&self, c: rpc::TxnDescribe) -> Result<TxnDescription, ApiError> {
        self.txns.describe(&self.broker, c).await
    }

    async fn txn_list(&self, c: rpc::TxnList) -> Result<ListedTxns, ApiError> {
        self.txns.list(&self.broker, c).await
    }

    /// Markers are appended on the partition; on a `__consumer_offsets` partition the
    /// group shell then completes the producer's pending transactional offsets.
    async fn write_markers(&self, c: rpc::WriteMarkers) -> Vec<Result<(), ApiError>> {
        let b = &self.broker;
        let futs = c.items.into_iter().map(|it| async move {
            let r = b.write_marker_local(&it).await;
            if r.is_ok() && it.topic == crate::coord::group::OFFSETS_TOPIC {
                self.groups
                    .complete_txn(it.partition, it.producer_id.get(), it.commit);
            }
            r
        });
        join_all(futs).await
    }

    async fn delete_offsets(
        &self,
        c: rpc::DeleteOffsets,
    ) -> Result<Result<Vec<Code>, ResponseError>, ApiError> {
        self.groups.delete_offsets(&self.broker, c).await
    }

    async fn describe_group(&self, c: rpc::DescribeGroup) -> Result<GroupSummary, ApiError> {
        self.groups.describe(&self.broker, c).await
    }

    async fn consumer_heartbeat(
        &self,
        c: rpc::ConsumerHeartbeat,
    ) -> Result<Result<HeartbeatReply, Refused>, ApiError> {
        self.groups.consumer_heartbeat(&self.broker, c).await
    }

    async fn describe_consumer_group(
        &self,
        c: rpc::DescribeConsumerGroup,
    ) -> Result<Result<ConsumerGroupView, Refused>, ApiError> {
        self.groups.describe_consumer(&self.broker, c).await
    }

    async fn list_groups(&self, _c: rpc::ListGroups) -> Result<Vec<rpc::GroupListing>, ApiError> {
        self.groups.list(&self.broker).await
    }

    async fn delete_group(&self, c: rpc::DeleteGroup) -> Result<Code, ApiError> {
        self.groups.delete_group(&self.broker, c).await
    }
}
