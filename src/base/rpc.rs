//! Cross-shard calls: every message one shard sends another, each a type of its own
//! tied to its reply type at compile time.
//!
//! A call is a struct implementing [`ShardCall`], whose `Reply` names what the serving
//! shard answers. [`shard_calls!`] generates, from one table, the request envelope the
//! mesh carries ([`ShardReq`]: each variant holds the call and its own reply slot, an
//! [`Answer`] of the call's reply type), the [`ShardService`] trait with one method per
//! call (implemented by the shard's server, `crate::serve::dispatch`) and [`serve`], which puts
//! each method's result into the slot that came with the call. Adding a call is one line
//! in the table; a handler that returned the wrong reply, or a caller that expected
//! another, does not compile, and no reply is ever matched against its call at run time.
//!
//! The mesh itself only carries [`Answered`] back: the token `serve` gets by filling the
//! slot, which tells the caller (through the mesh's correlation) that its reply is in
//! its slot. The slot is written before the token is sent, and the token reaches the
//! caller through a channel, so the caller always finds the reply there.
//!
//! The message types live here, below every module that sends or serves them, so the
//! shard context (`crate::partition::broker`) can carry them without knowing the controller or the
//! group shell.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};
use sluice_coordinator::group::consumer::{
    ConsumerGroupView, HeartbeatArgs, HeartbeatReply, Refused,
};
use sluice_coordinator::group::{
    Code, CommitArgs, Committed, GroupSummary, JoinArgs, Leaving, SyncArgs, TxnCommitArgs,
};
use sluice_coordinator::txn::{
    AddArgs, AddOffsetsArgs, EndArgs, InitArgs, ListFilter, ListedTxns, ProducerIdAndEpoch,
    TxnDescription,
};
use sluice_protocol::TopicPartition;
use sluice_replication::cluster::{Applied, Command};
use sluice_storage::producer::ActiveProducer;
use uuid::Uuid;

use crate::base::error::ApiError;
use crate::base::ids::{BrokerId, LeaderEpoch, Offset, ProducerId};
use crate::base::metadata::{MetadataImage, TopicMeta};

/// A call one shard makes to another over the mesh.
pub trait ShardCall: Sized {
    /// What the serving shard answers.
    type Reply;
    /// The mesh's envelope for this call, carrying the slot its reply goes into.
    fn into_request(self, answer: Answer<Self::Reply>) -> ShardReq;
}

/// The slot a call's reply is put in by the serving shard (which may be another
/// thread). Made with the call by [`Answer::new`]; the caller keeps the [`Reply`] end.
pub struct Answer<R>(Arc<Mutex<Option<R>>>);

/// The caller's end of an [`Answer`].
pub struct Reply<R>(Arc<Mutex<Option<R>>>);

/// What the mesh carries back: proof that [`serve`] filled the call's slot. Only
/// [`Answer::give`] makes one.
pub struct Answered(());

impl<R> Answer<R> {
    pub fn new() -> (Answer<R>, Reply<R>) {
        let slot = Arc::new(Mutex::new(None));
        (Answer(slot.clone()), Reply(slot))
    }

    /// Puts the reply in the caller's slot.
    pub fn give(self, reply: R) -> Answered {
        // A poisoned lock means a thread panicked while holding it, and a shard that
        // panics aborts the process (panic = abort), so this lock is never poisoned.
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(reply);
        Answered(())
    }
}

impl<R> Reply<R> {
    /// The reply, once the mesh returned the call's [`Answered`]; `None` if the call
    /// ended without one (its serving task was dropped at shutdown).
    pub fn take(self) -> Option<R> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

macro_rules! shard_calls {
    ($( $(#[$doc:meta])* $call:ident => $method:ident -> $reply:ty; )*) => {
        /// The mesh's request envelope: one variant per call, with its reply slot.
        pub enum ShardReq {
            $( $(#[$doc])* $call($call, Answer<$reply>), )*
        }

        $(
            impl ShardCall for $call {
                type Reply = $reply;
                fn into_request(self, answer: Answer<$reply>) -> ShardReq {
                    ShardReq::$call(self, answer)
                }
            }
        )*

        /// What a shard serves: one method per call.
        #[allow(async_fn_in_trait)]
        pub trait ShardService {
            $( async fn $method(&self, call: $call) -> $reply; )*
        }

        /// Answers one call, into its own slot.
        pub async fn serve<S: ShardService>(service: &S, req: ShardReq) -> Answered {
            match req {
                $( ShardReq::$call(c, answer) => answer.give(service.$method(c).await), )*
            }
        }
    };
}

shard_calls! {
    /// Produce to partitions of the serving shard.
    Produce => produce -> Vec<Result<Appended, ApiError>>;
    /// OffsetForLeaderEpoch for partitions of the serving shard.
    EpochEnd => epoch_end -> Vec<Result<EpochEndOut, ApiError>>;
    /// Read partitions without waiting.
    Read => read -> Vec<ReadOut>;
    /// Wait until any partition's visible end passes its offset (durable end for a
    /// follower fetch, high watermark for a consumer), or the timeout.
    Wait => wait -> bool;
    /// The serving shard's change feed after a position: the new position and the
    /// partitions changed since, if the feed knows (`crate::partition::changes`).
    Changes => changes -> (u64, Option<Vec<(std::sync::Arc<str>, i32)>>);
    /// Wait until the serving shard's change feed moves past a position, or the timeout.
    WaitChange => wait_change -> bool;
    ListOffsets => list_offsets -> Vec<Result<ListedOffset, ApiError>>;
    /// ListOffsets v0: each partition's segments as Kafka's "offsets before" sees them.
    OffsetsBefore => offsets_before -> Vec<Result<SegmentTimes, ApiError>>;
    DeleteRecords => delete_records -> Vec<Result<Offset, ApiError>>;
    /// The producers each partition's log remembers (DescribeProducers).
    DescribeProducers => describe_producers -> Vec<Result<Vec<ActiveProducer>, ApiError>>;
    /// The serving shard's logs: sizes of the open ones, causes of the offline ones.
    DescribeLogs => describe_logs -> ShardLogs;
    /// Adopt a new metadata image (from the controller).
    Apply => apply -> ();
    // Metadata changes, for the controller on shard 0.
    CreateTopics => create_topics -> Vec<Result<CreatedTopic, ApiError>>;
    DeleteTopics => delete_topics -> Vec<Result<DeletedTopic, ApiError>>;
    CreatePartitions => create_partitions -> Vec<Result<(), ApiError>>;
    AlterConfigs => alter_configs -> Vec<Result<(), ApiError>>;
    ElectLeaders => elect_leaders -> Vec<ElectedPartition>;
    /// AlterPartitionReassignments: one result per partition, in the call's order.
    Reassign => reassign -> Vec<Result<(), ApiError>>;
    /// DescribeQuorum: the metadata quorum as this broker's voter sees it if it leads
    /// (else the leader's id, -1 if none is known).
    DescribeQuorum => describe_quorum -> Result<QuorumView, i32>;
    /// UnregisterBroker: a stopped broker that holds no replica leaves the cluster.
    Unregister => unregister -> Result<(), ApiError>;
    /// AddRaftVoter / RemoveRaftVoter, on the controller leader's node.
    ChangeVoters => change_voters -> Result<(), ApiError>;
    /// ListPartitionReassignments: the ongoing moves asked about.
    ListReassignments => list_reassignments -> Vec<OngoingReassignment>;
    /// A command from inside the broker (an ISR change from a partition leader).
    Propose => propose -> Result<Applied, ApiError>;
    /// One producer id from this broker's controller-allocated block (InitProducerId).
    AllocateProducerId => allocate_producer_id -> Result<ProducerId, ApiError>;
    // Consumer-group requests, for the home shard of the group's `__consumer_offsets`
    // partition (see `crate::coord::group`).
    JoinGroup => join_group -> Result<JoinGroupResponse, ApiError>;
    SyncGroup => sync_group -> Result<SyncGroupResponse, ApiError>;
    Heartbeat => heartbeat -> Result<Code, ApiError>;
    LeaveGroup => leave_group -> Result<LeftGroup, ApiError>;
    CommitOffsets => commit_offsets -> Result<Vec<PartitionCode>, ApiError>;
    FetchOffsets => fetch_offsets -> Result<Vec<FetchedOffset>, ApiError>;
    /// TxnOffsetCommit: offsets pending until the producer's transaction ends.
    TxnCommitOffsets => txn_commit_offsets -> Result<Vec<PartitionCode>, ApiError>;
    DeleteOffsets => delete_offsets -> Result<Result<Vec<Code>, ResponseError>, ApiError>;
    DescribeGroup => describe_group -> Result<GroupSummary, ApiError>;
    /// ConsumerGroupHeartbeat (KIP-848).
    ConsumerHeartbeat => consumer_heartbeat -> Result<Result<HeartbeatReply, Refused>, ApiError>;
    /// ConsumerGroupDescribe of one group.
    DescribeConsumerGroup => describe_consumer_group -> Result<Result<ConsumerGroupView, Refused>, ApiError>;
    /// Every group the serving shard coordinates.
    ListGroups => list_groups -> Result<Vec<GroupListing>, ApiError>;
    DeleteGroup => delete_group -> Result<Code, ApiError>;
    // Transaction calls, for the home shard of the transactional id's
    // `__transaction_state` partition (see `crate::coord::txn`).
    TxnInit => txn_init -> Result<ProducerIdAndEpoch, ApiError>;
    TxnAdd => txn_add -> Result<(), ApiError>;
    TxnAddOffsets => txn_add_offsets -> Result<(), ApiError>;
    TxnEnd => txn_end -> Result<ProducerIdAndEpoch, ApiError>;
    TxnDescribe => txn_describe -> Result<TxnDescription, ApiError>;
    /// KIP-890 verification: are these partitions in the id's ongoing transaction?
    TxnVerify => txn_verify -> Result<Vec<PartitionCode>, ApiError>;
    /// Every transaction the serving shard coordinates.
    TxnList => txn_list -> Result<ListedTxns, ApiError>;
    /// Transaction markers for partitions of the serving shard (WriteTxnMarkers).
    WriteMarkers => write_markers -> Vec<Result<(), ApiError>>;
}

// ---- partition calls ----

/// Produce work for one partition on its home shard.
#[derive(Debug)]
pub struct ProduceItem {
    /// Shared by the items of one topic in a request (a clone per partition was an
    /// allocation per append at 10,000 partitions).
    pub topic: std::sync::Arc<str>,
    pub partition: i32,
    /// One or more v2 batches, a zero-copy slice of the request frame.
    pub records: Bytes,
    /// The producer's transactional id (transactional batches are verified with its
    /// coordinator, KIP-890).
    pub transactional_id: Option<std::sync::Arc<str>>,
}

#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub base_offset: Offset,
    pub log_append_time_ms: i64,
    pub log_start_offset: Offset,
}

pub struct Produce {
    pub acks: i16,
    /// How long acks=all may wait for the in-sync replicas.
    pub timeout: Duration,
    pub items: Vec<ProduceItem>,
}

/// One partition of an OffsetForLeaderEpoch call.
#[derive(Debug, Clone)]
pub struct EpochEndItem {
    pub topic: String,
    pub partition: i32,
    /// The requester's view of the leader epoch (KIP-320), -1 if none.
    pub current_leader_epoch: LeaderEpoch,
    /// The epoch whose end offset is asked for.
    pub leader_epoch: LeaderEpoch,
}

pub struct EpochEnd {
    pub items: Vec<EpochEndItem>,
}

/// The answer for one partition of an OffsetForLeaderEpoch call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEndOut {
    /// The largest epoch in the leader's log at or below the one asked for.
    pub leader_epoch: LeaderEpoch,
    /// The end offset of that epoch: the start offset of the next one, or the log end.
    pub end_offset: Offset,
}

#[derive(Debug)]
pub struct ReadItem {
    /// Shared: a Fetch's items of one topic hold one name.
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: Offset,
    pub max_bytes: usize,
    /// The fetching follower's broker id, or -1 for a consumer.
    pub replica_id: BrokerId,
    /// The requester's view of the leader epoch (KIP-320), -1 if none.
    pub current_leader_epoch: LeaderEpoch,
    /// isolation_level=1: read only below the last stable offset.
    pub read_committed: bool,
}

#[derive(Debug)]
pub struct ReadOut {
    pub error: Option<ApiError>,
    pub high_watermark: Offset,
    /// The last stable offset (the high watermark while no transaction is open).
    pub last_stable_offset: Offset,
    pub log_start_offset: Offset,
    pub records: Bytes,
    /// read_committed: the aborted transactions in the returned range.
    pub aborted: Vec<AbortedTxn>,
}

impl Default for ReadOut {
    /// No error, nothing read, every offset 0.
    fn default() -> ReadOut {
        ReadOut {
            error: None,
            high_watermark: Offset::ZERO,
            last_stable_offset: Offset::ZERO,
            log_start_offset: Offset::ZERO,
            records: Bytes::new(),
            aborted: Vec::new(),
        }
    }
}

/// An aborted transaction a read_committed fetch must skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: ProducerId,
    /// The offset of the transaction's first batch in the partition.
    pub first_offset: Offset,
}

pub struct Read {
    pub items: Vec<ReadItem>,
}

/// One partition of a Wait call.
#[derive(Debug, Clone)]
pub struct WaitItem {
    pub topic: Arc<str>,
    pub partition: i32,
    /// The wait ends once the partition's visible end is past this offset.
    pub offset: Offset,
}

pub struct Wait {
    pub items: Vec<WaitItem>,
    pub timeout: Duration,
    pub follower: bool,
    /// A read_committed consumer: wait for the last stable offset to pass.
    pub read_committed: bool,
}

/// See [`ShardReq::Changes`].
pub struct Changes {
    pub since: u64,
}

/// See [`ShardReq::WaitChange`].
pub struct WaitChange {
    pub since: u64,
    pub timeout: Duration,
}

/// One partition of a ListOffsets (v1+) call.
#[derive(Debug, Clone)]
pub struct ListOffsetsItem {
    pub topic: String,
    pub partition: i32,
    /// -2 earliest, -1 latest, else the first offset at or after this time.
    pub timestamp: i64,
    /// The requester's view of the leader epoch (KIP-320), -1 if none.
    pub current_leader_epoch: LeaderEpoch,
}

pub struct ListOffsets {
    pub items: Vec<ListOffsetsItem>,
    /// isolation_level=1: "latest" is the last stable offset.
    pub read_committed: bool,
}

/// The answer for one partition of a ListOffsets (v1+) call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedOffset {
    /// The offset found, -1 if none.
    pub offset: Offset,
    /// The timestamp of the record found, -1 for earliest and latest (or none found).
    pub timestamp: i64,
    /// The leader epoch of the record found (the current one for latest), -1 if none.
    pub leader_epoch: LeaderEpoch,
}

/// The partitions of ListOffsets v0 requests.
pub struct OffsetsBefore {
    pub items: Vec<TopicPartition>,
    /// Only the leader answers (false for Kafka's debugging replica id -2, which any
    /// replica answers).
    pub leader_only: bool,
}

/// A partition's log as ListOffsets v0 sees it (Kafka's "offset-time array"): per
/// segment, oldest first, its base offset (at least the log start) and the modification
/// time of its file; then, if the active segment holds data, the log end offset and the
/// time now. Plus the high watermark when a leader answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentTimes {
    pub offset_times: Vec<SegmentTime>,
    pub high_watermark: Option<Offset>,
}

/// One entry of [`SegmentTimes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentTime {
    /// A segment's base offset (at least the log start), or the log end offset.
    pub offset: Offset,
    /// The segment file's modification time, or the time now for the log end (ms).
    pub time_ms: i64,
}

/// One partition of a DeleteRecords call.
#[derive(Debug, Clone)]
pub struct DeleteRecordsItem {
    pub topic: String,
    pub partition: i32,
    /// Delete every record before this offset; -1: the high watermark.
    pub before_offset: Offset,
}

pub struct DeleteRecords {
    pub items: Vec<DeleteRecordsItem>,
}

/// The partitions whose producers to describe.
pub struct DescribeProducers {
    pub items: Vec<TopicPartition>,
}

pub struct Apply(pub Arc<MetadataImage>);

pub struct DescribeLogs;

/// One shard's part of DescribeLogDirs.
#[derive(Debug, Default)]
pub struct ShardLogs {
    pub online: Vec<OnlineLog>,
    pub offline: Vec<OfflineLog>,
}

/// A partition log this shard serves, as DescribeLogDirs reports it.
#[derive(Debug, Clone)]
pub struct OnlineLog {
    pub topic: String,
    pub partition: i32,
    pub size_bytes: u64,
    /// The log end offset minus the high watermark.
    pub offset_lag: i64,
}

/// A partition log this shard has taken offline, and why.
#[derive(Debug, Clone)]
pub struct OfflineLog {
    pub topic: String,
    pub partition: i32,
    pub cause: String,
}

// ---- controller calls ----

#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    /// -1: the broker default.
    pub num_partitions: i32,
    /// -1: the default, min(3, live brokers).
    pub replication_factor: i16,
    pub configs: Vec<NewTopicConfig>,
    /// Manual replica assignments as the client sent them; empty: placed by the
    /// controller. With them, `num_partitions` and `replication_factor` must be -1.
    pub assignments: Vec<ManualAssignment>,
}

/// A config a new topic is created with.
#[derive(Debug, Clone)]
pub struct NewTopicConfig {
    pub name: String,
    /// `None`: the client sent a null value (the controller refuses it).
    pub value: Option<String>,
}

/// A new topic's manual replica assignment for one partition.
#[derive(Debug, Clone)]
pub struct ManualAssignment {
    pub partition: i32,
    /// The replicas' broker ids, the preferred leader first.
    pub broker_ids: Vec<BrokerId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopicRef {
    Name(String),
    Id(Uuid),
}

/// An IncrementalAlterConfigs operation; [`AlterConfigOp::from_code`] reads Kafka's
/// numbering on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlterConfigOp {
    /// Give the config this value.
    Set,
    /// Remove the config's explicit value (back to its default).
    Delete,
    /// Add items to a list-valued config.
    Append,
    /// Remove items from a list-valued config.
    Subtract,
}

impl AlterConfigOp {
    /// The operation of a wire code (SET 0, DELETE 1, APPEND 2, SUBTRACT 3); `None`
    /// for a code Kafka does not define.
    pub fn from_code(code: i8) -> Option<AlterConfigOp> {
        match code {
            0 => Some(AlterConfigOp::Set),
            1 => Some(AlterConfigOp::Delete),
            2 => Some(AlterConfigOp::Append),
            3 => Some(AlterConfigOp::Subtract),
            _ => None,
        }
    }
}

/// One IncrementalAlterConfigs operation on one config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigOp {
    pub name: String,
    pub op: AlterConfigOp,
    /// The value SET, APPEND or SUBTRACT take; `None` for DELETE.
    pub value: Option<String>,
}

impl ConfigOp {
    pub fn new(name: impl Into<String>, op: AlterConfigOp, value: Option<&str>) -> ConfigOp {
        ConfigOp {
            name: name.into(),
            op,
            value: value.map(str::to_string),
        }
    }
}

pub struct CreateTopics {
    pub topics: Vec<NewTopic>,
    pub validate_only: bool,
}

/// A topic CreateTopics created (or, validating only, would create).
#[derive(Debug, Clone)]
pub struct CreatedTopic {
    pub name: String,
    /// What the topic starts with: id, partitions, explicit configs and assignments.
    pub meta: TopicMeta,
}

pub struct DeleteTopics {
    pub topics: Vec<TopicRef>,
}

/// A topic DeleteTopics deleted.
#[derive(Debug, Clone)]
pub struct DeletedTopic {
    pub name: String,
    pub id: Uuid,
}

/// One topic of a CreatePartitions call.
#[derive(Debug, Clone)]
pub struct NewPartitions {
    pub topic: String,
    /// The new total partition count.
    pub count: i32,
    /// Manual replica assignments, one per new partition; `None`: placed by the
    /// controller.
    pub assignments: Option<Vec<Vec<i32>>>,
}

pub struct CreatePartitions {
    pub items: Vec<NewPartitions>,
    pub validate_only: bool,
}

/// ElectLeaders: one election per partition, preferred or (`unclean`) unclean.
/// `partitions: None` asks for every partition, and is answered only for those that
/// needed an election (as Kafka's controller does).
pub struct ElectLeaders {
    pub unclean: bool,
    pub partitions: Option<Vec<TopicPartition>>,
}

/// AlterPartitionReassignments: per partition, the target replicas (`None` cancels
/// the ongoing move). With `keep_replication_factor` (v1's
/// `allow_replication_factor_change` false) a target of another size is refused.
pub struct Reassign {
    pub moves: Vec<(TopicPartition, Option<Vec<i32>>)>,
    pub keep_replication_factor: bool,
}

/// DescribeQuorum.
pub struct DescribeQuorum;

/// The metadata quorum as its leader sees it (DescribeQuorum).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumView {
    pub leader: i32,
    /// The raft term (Kafka's leader epoch of `__cluster_metadata`).
    pub term: i32,
    /// The commit index.
    pub high_watermark: i64,
    /// (voter id, replicated log end, last heard from in ms since the epoch or -1).
    pub voters: Vec<(i32, i64, i64)>,
    /// The learners (KRaft's observers), as the voters.
    pub observers: Vec<(i32, i64, i64)>,
}

/// AddRaftVoter (`add`) or RemoveRaftVoter of node `node`.
pub struct ChangeVoters {
    pub node: i32,
    pub add: bool,
    /// How long AddRaftVoter waits for the node to catch up.
    pub timeout_ms: i32,
}

/// UnregisterBroker of broker `0`.
pub struct Unregister(pub i32);

/// ListPartitionReassignments: the partitions asked about (`None`: every partition).
pub struct ListReassignments {
    pub partitions: Option<Vec<TopicPartition>>,
}

/// One partition's ongoing reassignment: its replica set now (the target, then the
/// replicas leaving), and which are being added and removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OngoingReassignment {
    pub partition: TopicPartition,
    pub replicas: Vec<i32>,
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
}

/// One partition's election in an ElectLeaders reply.
#[derive(Debug, Clone)]
pub struct ElectedPartition {
    pub partition: TopicPartition,
    /// Elected, or why not (ELECTION_NOT_NEEDED, no eligible replica, ...).
    pub result: Result<(), ApiError>,
}

/// How an AlterConfigs call changes one topic's explicit configs.
#[derive(Debug, Clone)]
pub enum ConfigChange {
    /// IncrementalAlterConfigs: operations on the current explicit set.
    Incremental(Vec<ConfigOp>),
    /// Legacy AlterConfigs: the new explicit set, replacing the current one (a config
    /// left out goes back to its default).
    Replace(BTreeMap<String, String>),
}

/// Config changes: topics' (`items`), then dynamic broker configs' (`brokers`). One
/// result per item, then one per broker change.
pub struct AlterConfigs {
    pub items: Vec<TopicConfigChange>,
    pub brokers: Vec<BrokerConfigChange>,
    pub validate_only: bool,
}

/// A change to one topic's explicit configs.
#[derive(Debug, Clone)]
pub struct TopicConfigChange {
    pub topic: String,
    pub change: ConfigChange,
}

/// A change to dynamic broker configs.
#[derive(Debug, Clone)]
pub struct BrokerConfigChange {
    /// -1 for the cluster-wide defaults, else a broker id.
    pub scope: i32,
    pub change: ConfigChange,
}

pub struct Propose(pub Command);

pub struct AllocateProducerId;

// ---- group calls: `partition` is the group's `__consumer_offsets` partition ----

pub struct JoinGroup {
    pub partition: i32,
    pub args: JoinArgs,
}

pub struct SyncGroup {
    pub partition: i32,
    pub args: SyncArgs,
}

pub struct Heartbeat {
    pub partition: i32,
    pub group: String,
    pub generation: i32,
    pub member: String,
    pub instance: Option<String>,
}

pub struct LeaveGroup {
    pub partition: i32,
    pub group: String,
    pub members: Vec<Leaving>,
}

/// The answer to a LeaveGroup call.
#[derive(Debug, Clone)]
pub struct LeftGroup {
    /// The group's error, if any.
    pub error: Code,
    /// One per leaving member, in the call's order.
    pub members: Vec<Code>,
}

pub struct CommitOffsets {
    pub partition: i32,
    pub args: CommitArgs,
}

/// One partition's answer in a group or transaction call that answers per partition
/// (offset commits, transaction verification).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionCode {
    pub partition: TopicPartition,
    pub code: Code,
}

pub struct FetchOffsets {
    pub partition: i32,
    pub group: String,
    /// None: every partition the group has committed.
    pub partitions: Option<Vec<TopicPartition>>,
    /// KIP-447: UNSTABLE_OFFSET_COMMIT for partitions with a transactional commit
    /// pending.
    pub require_stable: bool,
    /// OffsetFetch v9: the asking member and its epoch (KIP-848 groups check them).
    pub member: Option<(String, i32)>,
}

/// One partition's answer to a FetchOffsets call.
#[derive(Debug, Clone)]
pub struct FetchedOffset {
    pub partition: TopicPartition,
    /// The committed offset (`None`: nothing committed), or UNSTABLE_OFFSET_COMMIT
    /// while a transactional commit is pending and the call asked for stable offsets.
    pub offset: Result<Option<Committed>, ResponseError>,
}

pub struct TxnCommitOffsets {
    pub partition: i32,
    pub args: TxnCommitArgs,
}

pub struct DeleteOffsets {
    pub partition: i32,
    pub group: String,
    pub partitions: Vec<TopicPartition>,
}

pub struct DescribeGroup {
    pub partition: i32,
    pub group: String,
}

pub struct ConsumerHeartbeat {
    pub partition: i32,
    pub args: HeartbeatArgs,
}

pub struct DescribeConsumerGroup {
    pub partition: i32,
    pub group: String,
}

/// `partition`: any partition the serving shard owns (it lists all it leads).
pub struct ListGroups {
    pub partition: i32,
}

/// One group in a ListGroups reply.
#[derive(Debug, Clone)]
pub struct GroupListing {
    pub group_id: String,
    /// The protocol type its members joined with ("consumer" for consumers), empty if
    /// none.
    pub protocol_type: String,
    /// Its state's name (classic: GroupState's; KIP-848: Empty, Assigning,
    /// Reconciling, Stable).
    pub state: &'static str,
    /// "classic" or "consumer" (KIP-848).
    pub group_type: &'static str,
}

pub struct DeleteGroup {
    pub partition: i32,
    pub group: String,
}

/// A group call knows its `__consumer_offsets` partition (so the router can check
/// leadership and find the owner shard).
pub trait GroupCall: ShardCall {
    fn partition(&self) -> i32;
}

macro_rules! group_calls {
    ($($call:ident),*) => {
        $( impl GroupCall for $call {
            fn partition(&self) -> i32 {
                self.partition
            }
        } )*
    };
}

group_calls!(
    TxnCommitOffsets,
    JoinGroup,
    SyncGroup,
    Heartbeat,
    LeaveGroup,
    CommitOffsets,
    FetchOffsets,
    DeleteOffsets,
    DescribeGroup,
    ConsumerHeartbeat,
    DescribeConsumerGroup,
    ListGroups,
    DeleteGroup
);

// ---- transaction calls: `partition` is the id's `__transaction_state` partition ----

pub struct TxnInit {
    pub partition: i32,
    pub args: InitArgs,
}

pub struct TxnAdd {
    pub partition: i32,
    pub args: AddArgs,
}

pub struct TxnAddOffsets {
    pub partition: i32,
    pub args: AddOffsetsArgs,
}

pub struct TxnEnd {
    pub partition: i32,
    pub args: EndArgs,
}

pub struct TxnVerify {
    pub partition: i32,
    pub transactional_id: String,
    pub producer_id: ProducerId,
    pub producer_epoch: i16,
    pub partitions: Vec<TopicPartition>,
}

pub struct TxnDescribe {
    pub partition: i32,
    pub transactional_id: String,
}

pub struct TxnList {
    pub partition: i32,
    pub filter: ListFilter,
}

/// One end-transaction marker for a partition of the serving shard.
pub struct MarkerItem {
    pub topic: String,
    pub partition: i32,
    pub producer_id: ProducerId,
    pub producer_epoch: i16,
    pub commit: bool,
    pub coordinator_epoch: i32,
}

pub struct WriteMarkers {
    pub items: Vec<MarkerItem>,
}

/// A transaction call knows its `__transaction_state` partition.
pub trait TxnCall: ShardCall {
    fn partition(&self) -> i32;
}

macro_rules! txn_calls {
    ($($call:ident),*) => {
        $( impl TxnCall for $call {
            fn partition(&self) -> i32 {
                self.partition
            }
        } )*
    };
}

txn_calls!(
    TxnInit,
    TxnAdd,
    TxnAddOffsets,
    TxnEnd,
    TxnVerify,
    TxnDescribe,
    TxnList
);

#[cfg(test)]
mod tests {
    use super::AlterConfigOp;

    #[test]
    fn alter_config_ops_follow_kafkas_numbering() {
        let ops: Vec<_> = (-1..=4).map(AlterConfigOp::from_code).collect();
        assert_eq!(
            ops,
            [
                None,
                Some(AlterConfigOp::Set),
                Some(AlterConfigOp::Delete),
                Some(AlterConfigOp::Append),
                Some(AlterConfigOp::Subtract),
                None
            ]
        );
    }
}
