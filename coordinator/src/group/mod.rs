//! The classic consumer-group coordinator as a sans-I/O state machine: requests and the
//! time go in, responses, records for `__consumer_offsets` and deferred replies come
//! out. No sockets, no disk, no clock: the broker's group shell (`src/coord/group/shard.rs`)
//! is the I/O shell around it.
//!
//! It follows Apache Kafka's `GroupCoordinator`/`GroupMetadata` (the classic protocol):
//!
//! ```text
//!            join (first member)             all members joined / rebalance timeout
//!   Empty ───────────────────────► Preparing ─────────────────────────────────────► Completing
//!     ▲                            Rebalance ◄──── join, leave, expiry ───────────── Rebalance
//!     │  last member leaves          ▲   │                                              │ leader's
//!     └──────────────────────────────┘   └◄─── join (new/changed), leave, expiry ◄──┐   │ SyncGroup
//!                                                                                Stable ◄┘
//!   Dead: the group was deleted (DeleteGroups, or expired offsets of an empty group).
//! ```
//!
//! Transactions (KIP-98, KIP-447): a TxnOffsetCommit is validated like a commit of a
//! member ([`Coordinator::plan_txn_commit`]), its offsets are written by the shell as
//! offset-commit records in a transactional batch of the producer, and they stay pending
//! per producer id until the transaction's marker is written on the group's partition
//! ([`Coordinator::complete_txn`]): COMMIT makes them visible, ABORT drops them. Loading
//! replays transactional batches and markers the same way
//! ([`Coordinator::load_txn_record`], [`Coordinator::load_marker`]).
//!
//! Timers are deadlines inside the state (session expiry per member, the join phase's
//! deadline, the sync phase's deadline, pending member ids); [`Coordinator::tick`] fires
//! the ones that are due. JoinGroup and SyncGroup answers are deferred: the caller
//! passes a [`JoinToken`] or [`SyncToken`] and gets the answer in [`Effects::replies`] of whichever call
//! completes the phase.
//!
//! The code is one state and three roles over it, a file each, cut where Apache Kafka's
//! group coordinator cuts (`GroupMetadataManager` for membership, `OffsetMetadataManager`
//! for offsets, the coordinator shard's replay and its loader for loading):
//!
//! - `membership.rs`: JoinGroup, SyncGroup, Heartbeat and LeaveGroup, the rebalance
//!   state machine above, static members, refusals, the membership timers
//!   ([`Coordinator::tick`]), DescribeGroups and ListGroups, and the GroupMetadata record
//!   a generation writes.
//! - `offsets.rs`: OffsetCommit, OffsetFetch and OffsetDelete, TxnOffsetCommit and its
//!   pending offsets until the transaction's marker, offset expiry, the offset records.
//! - `load.rs`: replaying a `__consumer_offsets` partition into memory when its
//!   coordination moves to this shard, ending its load, and unloading the groups of a
//!   partition that moved away.
//!
//! This file holds what all three share: the calls' inputs and outputs ([`Effects`],
//! [`Deferred`], [`Record`], [`Code`]), the group and member state with the running
//! tallies every membership change keeps, the [`Coordinator`] itself, and DeleteGroups,
//! which spans membership and offsets. The role files are private; their public types
//! are re-exported here, so every path is `sluice_coordinator::group::…` as before.

pub mod assignor;
pub mod consumer;
#[cfg(test)]
mod consumer_tests;
mod load;
mod membership;
mod offsets;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};

use crate::records::Key;
use crate::sb;
use offsets::offset_tombstone;

pub use assignor::Assignment;
pub use membership::{GroupSummary, JoinArgs, Leaving, SyncArgs};
pub use offsets::{
    offset_record, CommitArgs, CommitPlan, StableFetch, TxnCommitArgs, TxnCommitPlan,
};

/// Identifies a waiting JoinGroup request in the shell. A join token and a sync token
/// are different types, and [`Deferred`] pairs each with its own response type, so the
/// coordinator cannot answer a JoinGroup with a SyncGroup response (the compiler
/// checks it) and the shell keeps one typed map of waiters per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JoinToken(pub u64);

/// Identifies a waiting SyncGroup request in the shell (see [`JoinToken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SyncToken(pub u64);

/// Kafka's broker settings for groups, with Kafka's defaults.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// group.min.session.timeout.ms
    pub session_timeout_min_ms: i32,
    /// group.max.session.timeout.ms
    pub session_timeout_max_ms: i32,
    /// group.initial.rebalance.delay.ms: how long a group that was empty waits for more
    /// members before its first generation.
    pub initial_rebalance_delay_ms: i64,
    /// offsets.retention.minutes, in ms: offsets of an empty group expire this long
    /// after the later of the group becoming empty and the commit; those of a Stable
    /// consumer group expire this long after the commit if the group no longer
    /// subscribes to their topic (KIP-496).
    pub offsets_retention_ms: i64,
    /// offsets.retention.check.interval.ms
    pub offsets_retention_check_interval_ms: i64,
    /// offset.metadata.max.bytes
    pub offset_metadata_max_bytes: usize,
    /// group.max.size: the most members a group admits (Kafka's default: i32::MAX).
    pub group_max_size: usize,
    /// The largest batch a GroupMetadata record may travel in (the shell's internal
    /// batch limit): a new member whose group's record would outgrow it, by
    /// [`Group::record_bytes_estimate`], is refused at JoinGroup.
    pub metadata_batch_bytes_max: usize,
    /// Consumer groups of the KIP-848 protocol.
    pub consumer: consumer::ConsumerConfig,
}

/// What a batch of one record adds to the record's key and value, at most: the batch
/// header (61 bytes) and the record's own framing (length, attributes, timestamp and
/// offset deltas, key and value lengths as varints, header count: 32 bytes at most).
pub const RECORD_BATCH_OVERHEAD_BYTES: usize = 61 + 32;

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            session_timeout_min_ms: 6_000,
            session_timeout_max_ms: 1_800_000,
            initial_rebalance_delay_ms: 3_000,
            offsets_retention_ms: 7 * 24 * 60 * 60 * 1000,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            group_max_size: i32::MAX as usize,
            metadata_batch_bytes_max: 32 << 20,
            consumer: consumer::ConsumerConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    /// The names Kafka uses in DescribeGroups and ListGroups.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A deferred answer to the waiting request its token names.
#[derive(Debug)]
pub enum Deferred {
    Join(JoinToken, JoinGroupResponse),
    Sync(SyncToken, SyncGroupResponse),
}

impl Deferred {
    /// The same waiter answered with `code` instead: the shell could not store the
    /// records this answer depended on (Kafka answers a failed group write so).
    pub fn failed(self, code: ResponseError) -> Deferred {
        match self {
            Deferred::Join(t, r) => Deferred::Join(t, err_join(code, &r.member_id)),
            Deferred::Sync(t, _) => Deferred::Sync(t, err_sync(code)),
        }
    }
}

/// A record to append to `__consumer_offsets` (the shell picks the partition from the
/// group id). `value: None` is a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub group: String,
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

/// What a call produced besides its direct answer.
#[derive(Debug, Default)]
pub struct Effects {
    /// Appended (and flushed) before any reply is sent.
    pub records: Vec<Record>,
    pub replies: Vec<Deferred>,
}

fn err_join(code: ResponseError, member_id: &str) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(code.code())
        .with_generation_id(-1)
        .with_member_id(sb(member_id))
}

fn err_sync(code: ResponseError) -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(code.code())
}

/// The result of a direct (non-deferred) call: a Kafka error code or success.
pub type Code = Result<(), ResponseError>;

/// One partition's committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    awaiting_join: Option<JoinToken>,
    awaiting_sync: Option<SyncToken>,
    /// Joined the current join phase (rejoined, or new).
    joined: bool,
    /// In the generation's sync phase and has not sent SyncGroup yet (Kafka's
    /// `pendingSyncMembers`): removed when the sync phase expires, in CompletingRebalance
    /// or Stable.
    pending_sync: bool,
    session_deadline_ms: i64,
}

impl Member {
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone)]
pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// Members in join order (BTreeMap by a join sequence would be fairer; ids are
    /// unique and sorting by id keeps responses deterministic).
    pub members: BTreeMap<String, Member>,
    /// group.instance.id → member id.
    pub static_members: HashMap<String, String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with their expiry.
    pending_members: HashMap<String, i64>,
    /// Join phase: when it completes regardless of stragglers.
    join_deadline_ms: Option<i64>,
    /// Initial delay phase (group was empty): the latest the delay may extend to.
    initial_delay_limit_ms: Option<i64>,
    /// Sync phase: when members that have not synced are dropped (in CompletingRebalance,
    /// and in Stable while a member of the generation has not synced yet).
    sync_deadline_ms: Option<i64>,
    /// Replayed from a `__consumer_offsets` partition whose load has not finished
    /// ([`Coordinator::loaded`] ends it): its offsets do not expire and it is not
    /// deleted (no tombstones), as Kafka expires only groups in its cache, where loaded
    /// groups go once the whole partition is read. It may look empty and old only
    /// because its latest GroupMetadata record is still ahead in the log.
    loading: bool,
    pub state_timestamp_ms: i64,
    pub offsets: BTreeMap<(String, i32), Committed>,
    /// Where each offset in `offsets` stands in the log (the order records became
    /// durable): a transactional commit completed by a marker replaces an offset only
    /// if it was written after it (Kafka's `olderThan`).
    offset_seq: HashMap<(String, i32), u64>,
    /// Durable TxnOffsetCommits waiting for their transaction's marker, per producer
    /// id: exactly the offset records of the producer's open transaction in the log.
    pending_txn: BTreeMap<i64, BTreeMap<(String, i32), PendingTxnOffset>>,
    /// TxnOffsetCommits planned and not yet reported durable or failed, per producer id
    /// and partition (a count): OffsetFetch with require_stable counts them as pending.
    inflight_txn: BTreeMap<i64, BTreeMap<(String, i32), u32>>,
    /// Per protocol name: how many members list it (Kafka's `supportedProtocols`), so
    /// a join checks the group's protocols in O(its own protocols), not O(members).
    protocol_support: HashMap<String, usize>,
    /// Members with `joined` false, counted since the join phase began: a join phase
    /// can end only when this is 0, so a rejoin does not scan every member.
    unjoined: usize,
    /// The sum of [`member_record_bytes`] over `members`, kept as members come, change
    /// and go, so admitting a member estimates the group's record in O(1).
    members_record_bytes: usize,
    /// The longest member id the group has had (bounds the record's leader field).
    member_id_bytes_max: usize,
    /// The largest single assignment of the group's last assignment (the leader's
    /// SyncGroup, or the record loaded): the estimate gives every member that much.
    assignment_bytes_max: usize,
    /// A consumer group of the KIP-848 protocol (`consumer.rs`); `None`: classic. The
    /// classic fields stay as an empty group's while it is set.
    pub consumer: Option<Box<consumer::ConsumerGroup>>,
}

/// What a member adds to its group's GroupMetadata value, not counting its assignment's
/// bytes (see the member layout in `records.rs`): the subscription counted is its
/// largest protocol metadata, since the protocol is not chosen yet.
fn member_record_bytes(
    id: &str,
    instance_id: Option<&str>,
    client_id: &str,
    client_host: &str,
    protocols: &[(String, Bytes)],
) -> usize {
    let subscription = protocols.iter().map(|(_, m)| m.len()).max().unwrap_or(0);
    // STRING id, NULLABLE_STRING instance, STRING client id and host, two i32 timeouts,
    // BYTES subscription, the i32 length of the assignment.
    2 + id.len()
        + 2
        + instance_id.map_or(0, str::len)
        + 2
        + client_id.len()
        + 2
        + client_host.len()
        + 4
        + 4
        + 4
        + subscription
        + 4
}

impl Member {
    fn record_bytes(&self) -> usize {
        member_record_bytes(
            &self.id,
            self.instance_id.as_deref(),
            &self.client_id,
            &self.client_host,
            &self.protocols,
        )
    }
}

/// Counts (`add`) or uncounts a member in its group's running tallies: the protocols it
/// lists and its share of the GroupMetadata record. Called with the member as it is
/// when it joins the tallies and again, unchanged, when it leaves them.
fn count_member(
    support: &mut HashMap<String, usize>,
    record_bytes: &mut usize,
    m: &Member,
    add: bool,
) {
    count_protocols(support, &m.protocols, add);
    if add {
        *record_bytes += m.record_bytes();
    } else {
        *record_bytes = record_bytes.saturating_sub(m.record_bytes());
    }
}

/// Counts (`add`) or uncounts a member's protocols in `Group::protocol_support`.
fn count_protocols(support: &mut HashMap<String, usize>, protocols: &[(String, Bytes)], add: bool) {
    for (name, _) in protocols {
        if add {
            *support.entry(name.clone()).or_insert(0) += 1;
        } else if let Some(n) = support.get_mut(name) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                support.remove(name);
            }
        }
    }
}

/// A transactional offset commit of a group whose record is durable, until its
/// transaction ends.
#[derive(Debug, Clone)]
struct PendingTxnOffset {
    committed: Committed,
    /// Its place in the log (see `offset_seq`).
    seq: u64,
}

impl Group {
    fn new(id: &str, now_ms: i64) -> Group {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            pending_members: HashMap::new(),
            join_deadline_ms: None,
            initial_delay_limit_ms: None,
            sync_deadline_ms: None,
            loading: false,
            state_timestamp_ms: now_ms,
            offsets: BTreeMap::new(),
            offset_seq: HashMap::new(),
            pending_txn: BTreeMap::new(),
            inflight_txn: BTreeMap::new(),
            protocol_support: HashMap::new(),
            unjoined: 0,
            members_record_bytes: 0,
            member_id_bytes_max: 0,
            assignment_bytes_max: 0,
            consumer: None,
        }
    }

    /// Its state's name as tools show it: a KIP-848 group's own states (Empty,
    /// Assigning, Reconciling, Stable), else the classic GroupState's.
    pub fn state_name(&self) -> &'static str {
        match &self.consumer {
            Some(c) => c.state(),
            None => self.state.name(),
        }
    }

    /// How many members it has, of either protocol.
    pub fn member_count(&self) -> usize {
        self.consumer
            .as_ref()
            .map_or(self.members.len(), |c| c.members.len())
    }

    fn transition(&mut self, to: GroupState, now_ms: i64) {
        use GroupState::*;
        let ok = matches!(
            (self.state, to),
            (Empty, PreparingRebalance)
                | (Stable, PreparingRebalance)
                | (CompletingRebalance, PreparingRebalance)
                | (PreparingRebalance, CompletingRebalance)
                | (PreparingRebalance, Empty)
                | (CompletingRebalance, Stable)
                | (_, Dead)
        );
        assert!(
            ok,
            "group {}: illegal transition {:?} -> {:?}",
            self.id, self.state, to
        );
        self.state = to;
        self.state_timestamp_ms = now_ms;
    }
}

/// Every group of the `__consumer_offsets` partitions one shard coordinates.
#[derive(Debug, Default)]
pub struct Coordinator {
    pub config: CoordinatorConfig,
    groups: HashMap<String, Group>,
    member_seq: u64,
    next_expiry_check_ms: i64,
    /// Counts offset records in the order they became durable (or were loaded).
    log_seq: u64,
    /// Per group, the partitions with an OffsetCommit being written (planned, not yet
    /// applied or failed): expiry leaves them (and their group) alone, or its tombstone
    /// would land after the new commit in the log while memory keeps the commit
    /// (Kafka skips partitions with pending commits the same way).
    committing: HashMap<String, HashMap<(String, i32), u32>>,
}

impl Coordinator {
    pub fn new(config: CoordinatorConfig) -> Coordinator {
        Coordinator {
            config,
            groups: HashMap::new(),
            member_seq: 0,
            log_seq: 0,
            committing: HashMap::new(),
            // The first check runs at the first tick (offsets loaded from the log may
            // have expired while the broker was down).
            next_expiry_check_ms: 0,
        }
    }

    pub fn group(&self, id: &str) -> Option<&Group> {
        self.groups.get(id)
    }

    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.values()
    }

    /// DeleteGroups for one group.
    pub fn delete_group(&mut self, now_ms: i64, group_id: &str, fx: &mut Effects) -> Code {
        let Some(group) = self.groups.get(group_id) else {
            return Err(ResponseError::GroupIdNotFound);
        };
        match group.state {
            GroupState::Dead => return Err(ResponseError::GroupIdNotFound),
            GroupState::Empty if group.consumer.as_ref().is_none_or(|c| c.members.is_empty()) => {}
            _ => return Err(ResponseError::NonEmptyGroup),
        }
        let mut group = self.groups.remove(group_id).expect("present");
        if group.consumer.is_some() {
            fx.records.extend(consumer::group_tombstones(group_id));
        }
        group.transition(GroupState::Dead, now_ms);
        for (topic, partition) in group.offsets.keys() {
            fx.records
                .push(offset_tombstone(group_id, topic, *partition));
        }
        fx.records.push(group_tombstone(group_id));
        Ok(())
    }
}

fn group_tombstone(group: &str) -> Record {
    Record {
        group: group.to_string(),
        key: Key::Group {
            group: group.to_string(),
        }
        .encode(),
        value: None,
    }
}
