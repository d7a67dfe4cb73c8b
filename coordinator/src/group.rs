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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};

use crate::records::{GroupValue, Key, MemberValue, OffsetValue};
use crate::sb;

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

/// A JoinGroup request, decoupled from the wire version.
#[derive(Debug, Clone)]
pub struct JoinArgs {
    pub group_id: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+ clients take the MEMBER_ID_REQUIRED round trip.
    pub require_known_member_id: bool,
    /// JoinGroup v9+: a static leader rejoining a stable group need not reassign.
    pub supports_skip_assignment: bool,
}

#[derive(Debug, Clone)]
pub struct SyncArgs {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

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
        }
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

    fn remove_offset(&mut self, tp: &(String, i32)) -> Option<Committed> {
        self.offset_seq.remove(tp);
        self.offsets.remove(tp)
    }

    /// Whether a TxnOffsetCommit for the partition waits for its transaction's end
    /// (or for its own record to be durable).
    pub fn has_pending_txn_offset(&self, tp: &(String, i32)) -> bool {
        self.pending_txn.values().any(|p| p.contains_key(tp))
            || self.inflight_txn.values().any(|p| p.contains_key(tp))
    }

    /// Producer ids with transactional commits pending in this group.
    pub fn txn_producers(&self) -> BTreeSet<i64> {
        self.pending_txn
            .keys()
            .chain(self.inflight_txn.keys())
            .copied()
            .collect()
    }

    /// One in-flight TxnOffsetCommit of the partition is over; false if none was
    /// counted (its transaction ended meanwhile).
    fn end_inflight(&mut self, producer_id: i64, tp: &(String, i32)) -> bool {
        let Some(m) = self.inflight_txn.get_mut(&producer_id) else {
            return false;
        };
        let Some(n) = m.get_mut(tp) else {
            return false;
        };
        *n -= 1;
        if *n == 0 {
            m.remove(tp);
        }
        if m.is_empty() {
            self.inflight_txn.remove(&producer_id);
        }
        true
    }

    fn has_txn_offsets(&self) -> bool {
        !self.pending_txn.is_empty() || !self.inflight_txn.is_empty()
    }

    /// Kafka's `validateCurrentMember`: a static member must be the one its instance id
    /// names, and the member must exist.
    fn current_member_error(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Option<ResponseError> {
        if let Some(i) = instance_id {
            match self.static_members.get(i) {
                Some(m) if m != member_id => return Some(ResponseError::FencedInstanceId),
                Some(_) => {}
                None => return Some(ResponseError::UnknownMemberId),
            }
        }
        (!self.members.contains_key(member_id)).then_some(ResponseError::UnknownMemberId)
    }

    /// A static member whose instance id now belongs to another member id.
    fn is_fenced(&self, instance_id: Option<&str>, member_id: &str) -> bool {
        instance_id
            .and_then(|i| self.static_members.get(i))
            .is_some_and(|m| m != member_id)
    }

    /// Protocols every member supports.
    fn candidate_protocols(&self) -> Vec<String> {
        let mut it = self.members.values();
        let Some(first) = it.next() else {
            return Vec::new();
        };
        let mut c: Vec<String> = first.protocols.iter().map(|(n, _)| n.clone()).collect();
        for m in it {
            c.retain(|p| m.protocols.iter().any(|(n, _)| n == p));
        }
        c
    }

    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        // A protocol every member lists is a candidate (see `candidate_protocols`).
        let everyone = self.members.len();
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols
                .iter()
                .any(|(n, _)| self.protocol_support.get(n) == Some(&everyone))
    }

    /// Kafka's vote: each member votes for its most preferred candidate; most votes win
    /// (ties go to the protocol listed first by the first member).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let mut votes: Vec<(String, usize)> = candidates.iter().map(|c| (c.clone(), 0)).collect();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(n)) {
                if let Some(v) = votes.iter_mut().find(|(c, _)| c == n) {
                    v.1 += 1;
                }
            }
        }
        let best = votes.iter().map(|(_, n)| *n).max()?;
        votes.into_iter().find(|(_, n)| *n == best).map(|(c, _)| c)
    }

    /// Every member has joined this phase. The count says when it may be so; the scan
    /// (once per phase when the count reaches 0) is what decides.
    fn all_joined(&self) -> bool {
        self.pending_members.is_empty()
            && self.unjoined == 0
            && self.members.values().all(|m| m.joined)
    }

    fn max_rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    /// The member list a leader gets in its JoinGroup response.
    fn member_list(&self) -> Vec<JoinGroupResponseMember> {
        let protocol = self.protocol.clone().unwrap_or_default();
        self.members
            .values()
            .map(|m| {
                JoinGroupResponseMember::default()
                    .with_member_id(sb(m.id.clone()))
                    .with_group_instance_id(m.instance_id.clone().map(sb))
                    .with_metadata(m.metadata(&protocol))
            })
            .collect()
    }

    fn join_response(&self, member_id: &str, with_members: bool) -> JoinGroupResponse {
        JoinGroupResponse::default()
            .with_generation_id(self.generation)
            .with_protocol_type(self.protocol_type.clone().map(sb))
            .with_protocol_name(self.protocol.clone().map(sb))
            .with_leader(sb(self.leader.clone().unwrap_or_default()))
            .with_member_id(sb(member_id))
            .with_members(if with_members {
                self.member_list()
            } else {
                Vec::new()
            })
    }

    /// A bound on the batch that would carry the group's GroupMetadata record with the
    /// member `a` in it (in place of the static member it replaces, if any), counted as
    /// `records.rs` lays the record out. Exact for what is known — ids, client ids and
    /// hosts, each member's largest protocol metadata (the protocol is chosen later) —
    /// and conservative for what is not: the assignments, which only the leader's
    /// SyncGroup brings, are counted as the largest assignment of the group's last
    /// assignment for every member, the new one included. O(1): the members' share is
    /// a running sum.
    pub fn record_bytes_estimate(&self, a: &JoinArgs) -> usize {
        let id_bytes = if a.member_id.is_empty() {
            new_member_id_bytes(&a.client_id)
        } else {
            a.member_id.len()
        };
        let joining = member_record_bytes(
            "",
            a.instance_id.as_deref(),
            &a.client_id,
            &a.client_host,
            &a.protocols,
        ) + id_bytes;
        let replaced = a
            .member_id
            .is_empty()
            .then_some(a.instance_id.as_ref())
            .flatten()
            .and_then(|i| self.static_members.get(i))
            .and_then(|id| self.members.get(id));
        let members = self.members.len() + usize::from(replaced.is_none());
        let leaving = replaced.map_or(0, Member::record_bytes);
        // The protocol chosen is one the new member lists too.
        let protocol_bytes = a.protocols.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        let leader_bytes = self.member_id_bytes_max.max(id_bytes);
        let key = 2 + 2 + self.id.len();
        // i16 version, STRING protocol type, i32 generation, NULLABLE_STRING protocol
        // and leader, i64 state timestamp, i32 member count.
        let header =
            2 + 2 + a.protocol_type.len() + 4 + 2 + protocol_bytes + 2 + leader_bytes + 8 + 4;
        // Each member's assignment length is in its share already; its bytes are not.
        let assignments = members.saturating_mul(self.assignment_bytes_max);
        (RECORD_BATCH_OVERHEAD_BYTES + key + header)
            .saturating_add(self.members_record_bytes.saturating_sub(leaving))
            .saturating_add(joining)
            .saturating_add(assignments)
    }

    /// Member ids handed out with MEMBER_ID_REQUIRED and not joined yet.
    #[cfg(test)]
    pub(crate) fn pending_member_count(&self) -> usize {
        self.pending_members.len()
    }

    /// The running sum of the members' record shares and the same sum counted afresh
    /// (tests check the tally never drifts).
    #[cfg(test)]
    pub(crate) fn record_bytes_tally(&self) -> (usize, usize) {
        let fresh = self.members.values().map(Member::record_bytes).sum();
        (self.members_record_bytes, fresh)
    }

    /// The GroupMetadata record of the group as it is now.
    fn metadata_record(&self) -> Record {
        let protocol = self.protocol.clone().unwrap_or_default();
        let value = GroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            state_timestamp_ms: self.state_timestamp_ms,
            members: self
                .members
                .values()
                .map(|m| MemberValue {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        };
        Record {
            group: self.id.clone(),
            key: Key::Group {
                group: self.id.clone(),
            }
            .encode(),
            value: Some(value.encode()),
        }
    }

    /// Rebuilds the group from its last GroupMetadata value, as Kafka's
    /// `GroupMetadata.loadGroup` does: with members it is Stable at the stored
    /// generation (the value is written when a generation's assignment is complete, or
    /// when the group empties), without them Empty. Each member's session timer starts
    /// at `now_ms`, so members that never come back expire after their session timeout
    /// and the group rebalances then, while live members just keep heartbeating.
    fn restore(&mut self, v: GroupValue, now_ms: i64) {
        let protocol_type = (!v.protocol_type.is_empty()).then_some(v.protocol_type);
        self.generation = v.generation;
        self.protocol = v.protocol;
        self.leader = v.leader;
        self.state_timestamp_ms = v.state_timestamp_ms.max(0);
        self.members.clear();
        self.protocol_support.clear();
        self.members_record_bytes = 0;
        self.assignment_bytes_max = 0;
        self.unjoined = 0;
        self.static_members.clear();
        self.pending_members.clear();
        self.join_deadline_ms = None;
        self.initial_delay_limit_ms = None;
        self.sync_deadline_ms = None;
        for m in v.members {
            if let Some(i) = &m.instance_id {
                self.static_members.insert(i.clone(), m.member_id.clone());
            }
            let protocols = match &self.protocol {
                Some(p) => vec![(p.clone(), m.subscription)],
                None => Vec::new(),
            };
            let member = Member {
                id: m.member_id.clone(),
                instance_id: m.instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                session_timeout_ms: m.session_timeout_ms,
                // Version 0 values have no rebalance timeout: Kafka uses the session's.
                rebalance_timeout_ms: if m.rebalance_timeout_ms < 0 {
                    m.session_timeout_ms
                } else {
                    m.rebalance_timeout_ms
                },
                protocol_type: protocol_type.clone().unwrap_or_default(),
                protocols,
                assignment: m.assignment,
                awaiting_join: None,
                awaiting_sync: None,
                joined: false,
                pending_sync: false,
                session_deadline_ms: now_ms + i64::from(m.session_timeout_ms),
            };
            count_member(
                &mut self.protocol_support,
                &mut self.members_record_bytes,
                &member,
                true,
            );
            self.member_id_bytes_max = self.member_id_bytes_max.max(member.id.len());
            self.assignment_bytes_max = self.assignment_bytes_max.max(member.assignment.len());
            self.members.insert(m.member_id, member);
        }
        self.protocol_type = protocol_type;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.leader = None;
        } else {
            self.state = GroupState::Stable;
            if self
                .leader
                .as_ref()
                .is_none_or(|l| !self.members.contains_key(l))
            {
                self.leader = self.members.keys().next().cloned();
            }
        }
    }

    /// Topics the members subscribe to (consumer protocol only), for OffsetDelete and
    /// the expiry of a Stable group's offsets; `None` if unknown (another protocol type,
    /// no protocol chosen yet, or a subscription that cannot be decoded).
    fn subscribed_topics(&self) -> Option<Vec<String>> {
        use kafka_protocol::messages::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::Decodable;
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol.clone()?;
        let mut topics = Vec::new();
        for m in self.members.values() {
            let mut meta = m.metadata(&protocol);
            if meta.len() < 6 {
                return None;
            }
            let version = i16::from_be_bytes([meta[0], meta[1]]);
            // The codec reserves what an array count claims: refuse counts the bytes
            // cannot hold (each topic takes at least 2 bytes) before decoding.
            let count = i32::from_be_bytes([meta[2], meta[3], meta[4], meta[5]]);
            if count < 0 || count as usize * 2 > meta.len() - 6 {
                return None;
            }
            let _ = bytes::Buf::get_i16(&mut meta);
            let sub = ConsumerProtocolSubscription::decode(&mut meta, version.clamp(0, 3)).ok()?;
            topics.extend(sub.topics.into_iter().map(|t| t.to_string()));
        }
        Some(topics)
    }
}

fn member_id_prefix(client_id: &str) -> &str {
    if client_id.is_empty() {
        "member"
    } else {
        client_id
    }
}

/// The length of the member id [`Coordinator::join`] hands a new member of `client_id`
/// (the prefix, a dash, a hyphenated UUID).
fn new_member_id_bytes(client_id: &str) -> usize {
    member_id_prefix(client_id).len() + 1 + 36
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

/// Why a JoinGroup is refused with GROUP_MAX_SIZE_REACHED.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// group.max.size, Kafka's rule.
    MaxSize(usize),
    /// The GroupMetadata record's estimate with the new member, in bytes, is over the
    /// batch limit.
    RecordTooLarge(usize),
}

/// The result of a direct (non-deferred) call: a Kafka error code or success.
pub type Code = Result<(), ResponseError>;

/// One LeaveGroup member.
#[derive(Debug, Clone)]
pub struct Leaving {
    pub member_id: String,
    pub instance_id: Option<String>,
}

/// One commit of OffsetCommit.
#[derive(Debug, Clone)]
pub struct CommitArgs {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub offsets: Vec<((String, i32), Committed)>,
}

/// OffsetFetch with require_stable: per partition, the committed offset (if any) or
/// UNSTABLE_OFFSET_COMMIT.
pub type StableFetch = Vec<((String, i32), Result<Option<Committed>, ResponseError>)>;

/// One TxnOffsetCommit.
#[derive(Debug, Clone)]
pub struct TxnCommitArgs {
    pub group_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// KIP-447 (TxnOffsetCommit v3+); -1, "" and `None` from older clients.
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub offsets: Vec<((String, i32), Committed)>,
}

/// A validated TxnOffsetCommit: append `records` as one transactional batch of
/// `producer_id`/`producer_epoch`, then [`Coordinator::apply_txn_commit`] (or
/// [`Coordinator::fail_txn_commit`]).
#[derive(Debug)]
pub struct TxnCommitPlan {
    pub group_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Per partition, in request order: the error, if this partition is refused.
    pub results: Vec<((String, i32), Code)>,
    pub records: Vec<Record>,
    accepted: Vec<((String, i32), Committed)>,
}

/// Kafka's `validateOffsetCommit` with `isTransactional = true`: unlike a plain commit, a
/// transactional one without member information is accepted from a non-empty group
/// (older clients send none), and a rebalance in progress does not refuse it.
fn txn_commit_error(group: &Group, a: &TxnCommitArgs) -> Option<ResponseError> {
    if group.state == GroupState::Dead {
        return Some(ResponseError::CoordinatorNotAvailable);
    }
    if a.generation < 0 && group.state == GroupState::Empty {
        return None;
    }
    if a.generation >= 0 || !a.member_id.is_empty() || a.instance_id.is_some() {
        return group
            .current_member_error(&a.member_id, a.instance_id.as_deref())
            .or((a.generation != group.generation).then_some(ResponseError::IllegalGeneration));
    }
    None
}

/// Kafka's `validateOffsetMetadataLength`: offset.metadata.max.bytes bounds the Java
/// string's `length()`, its UTF-16 code units, not its UTF-8 bytes. (At Kafka's 4096
/// that is at most 12,288 bytes, well inside the record's i16 string length.)
fn metadata_too_large(metadata: &str, max: usize) -> bool {
    // Only strings of more than `max` bytes can have more than `max` units.
    metadata.len() > max && metadata.encode_utf16().count() > max
}

/// A validated commit: append `records`, then [`Coordinator::apply_commit`].
#[derive(Debug)]
pub struct CommitPlan {
    pub group_id: String,
    /// Per partition, in request order: the error, if this partition is refused.
    pub results: Vec<((String, i32), Code)>,
    pub records: Vec<Record>,
    accepted: Vec<((String, i32), Committed)>,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub struct GroupSummary {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    /// (member id, instance id, client id, host, metadata, assignment)
    pub members: Vec<(String, Option<String>, String, String, Bytes, Bytes)>,
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

    /// Forgets every group `keep` refuses (its `__consumer_offsets` partition moved to
    /// another coordinator, or must be reloaded). Returns how many went.
    pub fn unload(&mut self, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.groups.len();
        self.groups.retain(|id, _| keep(id));
        self.committing.retain(|id, _| keep(id));
        before - self.groups.len()
    }

    pub fn group(&self, id: &str) -> Option<&Group> {
        self.groups.get(id)
    }

    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.values()
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.member_seq += 1;
        // Kafka: client id, a dash and a UUID; unique per coordinator is what matters.
        let id = format!("{}-{}", member_id_prefix(client_id), uuid::Uuid::new_v4());
        assert_eq!(id.len(), new_member_id_bytes(client_id));
        id
    }

    // ---------------------------------------------------------------- JoinGroup

    /// JoinGroup. The answer comes in `fx.replies` under `token`, now or later.
    pub fn join(&mut self, token: JoinToken, now_ms: i64, a: JoinArgs, fx: &mut Effects) {
        let reply = |fx: &mut Effects, r: JoinGroupResponse| {
            fx.replies.push(Deferred::Join(token, r));
        };
        if a.group_id.is_empty() {
            return reply(fx, err_join(ResponseError::InvalidGroupId, &a.member_id));
        }
        let c = &self.config;
        if a.session_timeout_ms < c.session_timeout_min_ms
            || a.session_timeout_ms > c.session_timeout_max_ms
        {
            return reply(
                fx,
                err_join(ResponseError::InvalidSessionTimeout, &a.member_id),
            );
        }
        if !self.groups.contains_key(&a.group_id) {
            if !a.member_id.is_empty() {
                // Kafka: a member id for a group that does not exist is unknown.
                return reply(fx, err_join(ResponseError::UnknownMemberId, &a.member_id));
            }
            if a.protocol_type.is_empty() || a.protocols.is_empty() {
                return reply(
                    fx,
                    err_join(ResponseError::InconsistentGroupProtocol, &a.member_id),
                );
            }
            self.groups
                .insert(a.group_id.clone(), Group::new(&a.group_id, now_ms));
        }
        let group = &self.groups[&a.group_id];
        if group.state == GroupState::Dead {
            // Deleted meanwhile: the client looks the coordinator up again.
            return reply(
                fx,
                err_join(ResponseError::CoordinatorNotAvailable, &a.member_id),
            );
        }
        // Before the protocol check, as Kafka's `handleJoinGroup` orders them.
        if let Some(refusal) = self.refusal(&a) {
            self.refuse(token, now_ms, &a, refusal, fx);
            self.drop_if_unused(&a.group_id);
            return;
        }
        let group = &self.groups[&a.group_id];
        if !group.supports(&a.protocol_type, &a.protocols) {
            return reply(
                fx,
                err_join(ResponseError::InconsistentGroupProtocol, &a.member_id),
            );
        }
        let group_id = a.group_id.clone();
        if a.member_id.is_empty() {
            self.join_unknown_member(token, now_ms, a, fx);
        } else {
            self.join_known_member(token, now_ms, a, fx);
        }
        self.drop_if_unused(&group_id);
    }

    /// Whether the group must refuse the join `a` with GROUP_MAX_SIZE_REACHED: Kafka's
    /// `acceptJoiningMember` for group.max.size, then, for a member not in the group
    /// yet, the bound on its GroupMetadata record ([`Group::record_bytes_estimate`]).
    fn refusal(&self, a: &JoinArgs) -> Option<Refusal> {
        let group = &self.groups[&a.group_id];
        let max = self.config.group_max_size;
        // A static member rejoining with a new member id takes its own place: the group
        // does not grow. Kafka's classic coordinator counts it as a new member and
        // refuses it in a full group; KAFKA-20601 lets it in for KIP-848 groups, and
        // so does this one, or a full group of static members could not restart.
        let replaces_static = a.member_id.is_empty()
            && a.instance_id
                .as_ref()
                .is_some_and(|i| group.static_members.contains_key(i));
        let full = match group.state {
            _ if replaces_static => false,
            GroupState::Empty | GroupState::Dead => false,
            // Counted by members that have (re)joined this phase, not by the group's
            // size, which can be over the limit (a group loaded over a lowered limit):
            // the first `max` members back stay, later ones are refused and removed.
            // In this phase a member has joined exactly when it awaits its answer.
            GroupState::PreparingRebalance => {
                let awaiting = group
                    .members
                    .get(&a.member_id)
                    .is_some_and(|m| m.awaiting_join.is_some());
                !awaiting && group.members.len().saturating_sub(group.unjoined) >= max
            }
            // A current member is always let back in; the join phase ahead drops
            // whoever does not rejoin.
            GroupState::CompletingRebalance | GroupState::Stable => {
                !group.members.contains_key(&a.member_id) && group.members.len() >= max
            }
        };
        if full {
            return Some(Refusal::MaxSize(max));
        }
        if group.members.contains_key(&a.member_id) {
            // A current member's record share is there already; if its new metadata
            // makes the record too large, the SyncGroup path answers (the last line).
            return None;
        }
        let estimate = group.record_bytes_estimate(a);
        (estimate > self.config.metadata_batch_bytes_max)
            .then_some(Refusal::RecordTooLarge(estimate))
    }

    /// Refuses a join with GROUP_MAX_SIZE_REACHED, as Kafka does: the member id is
    /// forgotten (a pending id, or a current member that rejoined too late in a group
    /// over its limit, which is removed) and the answer carries no member id.
    fn refuse(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        a: &JoinArgs,
        r: Refusal,
        fx: &mut Effects,
    ) {
        let bytes_max = self.config.metadata_batch_bytes_max;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        group.pending_members.remove(&a.member_id);
        let removed = Self::remove_member(group, &a.member_id).is_some();
        match r {
            Refusal::MaxSize(max) => tracing::info!(
                group = %group.id, member = %a.member_id, members = group.members.len(),
                removed, "group.max.size {max} reached: JoinGroup refused with GROUP_MAX_SIZE_REACHED"
            ),
            Refusal::RecordTooLarge(estimate) => tracing::warn!(
                group = %group.id, client = %a.client_id, members = group.members.len(),
                estimate, "group metadata would outgrow the {bytes_max}-byte batch limit with \
                 another member: JoinGroup refused with GROUP_MAX_SIZE_REACHED"
            ),
        }
        fx.replies.push(Deferred::Join(
            token,
            err_join(ResponseError::GroupMaxSizeReached, ""),
        ));
        // A member gone may have been the last one the join phase waited for.
        Self::maybe_complete_join(group, now_ms, fx);
    }

    /// A group created by a join that was refused holds nothing: drop it.
    fn drop_if_unused(&mut self, group_id: &str) {
        let unused = self.groups.get(group_id).is_some_and(|g| {
            g.state == GroupState::Empty
                && g.generation == 0
                && g.members.is_empty()
                && g.pending_members.is_empty()
                && g.offsets.is_empty()
                && !g.has_txn_offsets()
        });
        if unused {
            self.groups.remove(group_id);
        }
    }

    fn join_unknown_member(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let new_id = self.new_member_id(&a.client_id);
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        if let Some(instance) = a.instance_id.clone() {
            if let Some(old_id) = group.static_members.get(&instance).cloned() {
                return self.replace_static_member(token, now_ms, old_id, new_id, a, fx);
            }
            // A new static member: no member-id round trip (KIP-345).
            return self.add_member_and_rebalance(token, now_ms, new_id, a, fx);
        }
        if a.require_known_member_id {
            let deadline = now_ms + i64::from(a.session_timeout_ms);
            group.pending_members.insert(new_id.clone(), deadline);
            fx.replies.push(Deferred::Join(
                token,
                err_join(ResponseError::MemberIdRequired, &new_id),
            ));
            return;
        }
        self.add_member_and_rebalance(token, now_ms, new_id, a, fx);
    }

    fn join_known_member(&mut self, token: JoinToken, now_ms: i64, a: JoinArgs, fx: &mut Effects) {
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        let reply = |fx: &mut Effects, r: JoinGroupResponse| {
            fx.replies.push(Deferred::Join(token, r));
        };
        if group.pending_members.remove(&a.member_id).is_some() {
            let id = a.member_id.clone();
            return self.add_member_and_rebalance(token, now_ms, id, a, fx);
        }
        if group.is_fenced(a.instance_id.as_deref(), &a.member_id) {
            return reply(fx, err_join(ResponseError::FencedInstanceId, &a.member_id));
        }
        let Some(member) = group.members.get(&a.member_id) else {
            return reply(fx, err_join(ResponseError::UnknownMemberId, &a.member_id));
        };
        let same_protocols = member.protocols == a.protocols;
        let is_leader = group.leader.as_deref() == Some(a.member_id.as_str());
        match group.state {
            GroupState::Empty | GroupState::Dead => {
                reply(fx, err_join(ResponseError::UnknownMemberId, &a.member_id))
            }
            GroupState::PreparingRebalance => {
                self.update_member_and_rebalance(token, now_ms, a, fx)
            }
            GroupState::CompletingRebalance if same_protocols => {
                // The member lost our JoinGroup answer: give it again.
                let r = group.join_response(&a.member_id, is_leader);
                reply(fx, r)
            }
            GroupState::Stable if same_protocols && !is_leader => {
                // A follower rejoining with nothing new: no rebalance.
                let r = group.join_response(&a.member_id, false);
                reply(fx, r)
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.update_member_and_rebalance(token, now_ms, a, fx)
            }
        }
    }

    fn new_member(&self, id: String, a: &JoinArgs, token: JoinToken, now_ms: i64) -> Member {
        Member {
            id,
            instance_id: a.instance_id.clone(),
            client_id: a.client_id.clone(),
            client_host: a.client_host.clone(),
            session_timeout_ms: a.session_timeout_ms,
            rebalance_timeout_ms: a.rebalance_timeout_ms,
            protocol_type: a.protocol_type.clone(),
            protocols: a.protocols.clone(),
            assignment: Bytes::new(),
            awaiting_join: Some(token),
            awaiting_sync: None,
            joined: true,
            pending_sync: false,
            session_deadline_ms: now_ms + i64::from(a.session_timeout_ms),
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        id: String,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let member = self.new_member(id.clone(), &a, token, now_ms);
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        if group.members.is_empty() {
            group.protocol_type = Some(a.protocol_type.clone());
        }
        if let Some(i) = &a.instance_id {
            group.static_members.insert(i.clone(), id.clone());
        }
        if group.leader.is_none() {
            group.leader = Some(id.clone());
        }
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &member,
            true,
        );
        group.member_id_bytes_max = group.member_id_bytes_max.max(id.len());
        group.members.insert(id, member);
        if group.state == GroupState::PreparingRebalance {
            // A new member extends the initial delay, within the rebalance timeout.
            if let (Some(limit), Some(d)) = (group.initial_delay_limit_ms, group.join_deadline_ms) {
                group.join_deadline_ms = Some((d.max(now_ms + initial_delay)).min(limit));
            }
        }
        Self::prepare_rebalance(group, now_ms, initial_delay, fx);
        Self::maybe_complete_join(group, now_ms, fx);
    }

    fn update_member_and_rebalance(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        let m = group.members.get_mut(&a.member_id).expect("member exists");
        if let Some(old) = m.awaiting_join.replace(token) {
            // A duplicate join: the older request gets the newer one's fate, as in Kafka
            // (the callback is replaced); answer the old one so it does not hang.
            fx.replies.push(Deferred::Join(
                old,
                err_join(ResponseError::UnknownMemberId, &a.member_id),
            ));
        }
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            m,
            false,
        );
        m.protocols = a.protocols;
        m.session_timeout_ms = a.session_timeout_ms;
        m.rebalance_timeout_ms = a.rebalance_timeout_ms;
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            m,
            true,
        );
        if !m.joined {
            group.unjoined = group.unjoined.saturating_sub(1);
        }
        m.joined = true;
        Self::prepare_rebalance(group, now_ms, initial_delay, fx);
        Self::maybe_complete_join(group, now_ms, fx);
    }

    /// A static member rejoined with a new member id (a restarted process).
    fn replace_static_member(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        old_id: String,
        new_id: String,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        let mut m = group.members.remove(&old_id).expect("static member exists");
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &m,
            false,
        );
        if !m.joined {
            group.unjoined = group.unjoined.saturating_sub(1);
        }
        // The old instance's pending requests are fenced.
        if let Some(t) = m.awaiting_join.take() {
            fx.replies.push(Deferred::Join(
                t,
                err_join(ResponseError::FencedInstanceId, &old_id),
            ));
        }
        if let Some(t) = m.awaiting_sync.take() {
            fx.replies
                .push(Deferred::Sync(t, err_sync(ResponseError::FencedInstanceId)));
        }
        m.id = new_id.clone();
        // A new incarnation owes no SyncGroup of the old one's generation (Kafka's
        // replaceStaticMember builds a member that is not pending sync).
        m.pending_sync = false;
        m.client_id = a.client_id.clone();
        m.client_host = a.client_host.clone();
        m.session_timeout_ms = a.session_timeout_ms;
        m.rebalance_timeout_ms = a.rebalance_timeout_ms;
        m.protocols = a.protocols.clone();
        m.session_deadline_ms = now_ms + i64::from(a.session_timeout_ms);
        let instance = a.instance_id.clone().expect("static member");
        group.static_members.insert(instance, new_id.clone());
        let was_leader = group.leader.as_deref() == Some(old_id.as_str());
        if was_leader {
            group.leader = Some(new_id.clone());
        }
        // Kafka rebalances only if the group's protocol would change; the metadata
        // bytes may differ (a restarted consumer owns nothing yet).
        group.members.insert(new_id.clone(), m);
        let protocols_changed = group.select_protocol() != group.protocol;
        let mut m = group.members.remove(&new_id).expect("just inserted");
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &m,
            true,
        );
        group.member_id_bytes_max = group.member_id_bytes_max.max(new_id.len());
        match group.state {
            GroupState::Stable if !protocols_changed => {
                // KIP-345: no rebalance. The member gets its old assignment at SyncGroup.
                // KIP-814: a v9+ leader is told to skip the assignment; older leaders
                // get the member list, compute an assignment and SyncGroup in a stable
                // group returns the stored one.
                m.joined = true;
                group.members.insert(new_id.clone(), m);
                let mut r = group.join_response(&new_id, was_leader);
                r.skip_assignment = was_leader && a.supports_skip_assignment;
                fx.replies.push(Deferred::Join(token, r));
                // The id changed: persist it so a fenced old instance stays fenced.
                fx.records.push(group.metadata_record());
            }
            _ => {
                // In CompletingRebalance the leader was given the old member id and
                // would assign its partitions to it: Kafka always rebalances then
                // (`updateStaticMemberThenRebalanceOrCompleteJoin`). In
                // PreparingRebalance the member simply joins the phase.
                m.awaiting_join = Some(token);
                m.joined = true;
                group.members.insert(new_id, m);
                Self::prepare_rebalance(group, now_ms, initial_delay, fx);
                Self::maybe_complete_join(group, now_ms, fx);
            }
        }
    }

    /// Starts (or continues) a join phase.
    fn prepare_rebalance(group: &mut Group, now_ms: i64, initial_delay_ms: i64, fx: &mut Effects) {
        match group.state {
            GroupState::PreparingRebalance => return,
            GroupState::CompletingRebalance => {
                // Members waiting for their assignment must rejoin.
                for m in group.members.values_mut() {
                    if let Some(t) = m.awaiting_sync.take() {
                        fx.replies.push(Deferred::Sync(
                            t,
                            err_sync(ResponseError::RebalanceInProgress),
                        ));
                    }
                }
            }
            _ => {}
        }
        let was_empty = group.state == GroupState::Empty;
        for m in group.members.values_mut() {
            // Members that were told about this rebalance in their own join count as
            // joined; the others must come back.
            m.joined = m.awaiting_join.is_some();
            // The previous generation's sync phase is over (Kafka clears its pending
            // sync members).
            m.pending_sync = false;
        }
        group.unjoined = group.members.values().filter(|m| !m.joined).count();
        let rebalance_ms = group.max_rebalance_timeout_ms();
        if was_empty {
            // Kafka's initial delay: wait a little for more members before the first
            // generation, so N consumers starting together take one rebalance.
            group.join_deadline_ms = Some(now_ms + initial_delay_ms.min(rebalance_ms));
            group.initial_delay_limit_ms = Some(now_ms + rebalance_ms);
        } else {
            group.join_deadline_ms = Some(now_ms + rebalance_ms);
            group.initial_delay_limit_ms = None;
        }
        group.sync_deadline_ms = None;
        group.transition(GroupState::PreparingRebalance, now_ms);
    }

    fn maybe_complete_join(group: &mut Group, now_ms: i64, fx: &mut Effects) {
        if group.state != GroupState::PreparingRebalance {
            return;
        }
        let in_initial_delay = group.initial_delay_limit_ms.is_some();
        let due = group.join_deadline_ms.is_some_and(|d| now_ms >= d);
        if due || (!in_initial_delay && group.all_joined()) {
            Self::complete_join(group, now_ms, fx);
        }
    }

    /// Ends a join phase (Kafka's `completeClassicGroupJoin`): drop the dynamic members
    /// that did not rejoin, start the next generation and answer every waiting
    /// JoinGroup. Static members that did not rejoin stay in the generation (their
    /// instance id keeps its place in the assignment); one that does not sync either is
    /// removed when the sync phase expires ([`Coordinator::tick`]). If no member
    /// rejoined at all (every one left is static), the join phase runs again.
    fn complete_join(group: &mut Group, now_ms: i64, fx: &mut Effects) {
        let gone: Vec<String> = group
            .members
            .values()
            .filter(|m| m.instance_id.is_none() && (!m.joined || m.awaiting_join.is_none()))
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            Self::remove_member(group, &id);
        }
        // Kafka's `maybeElectNewJoinedLeader`: a leader that did not rejoin is replaced
        // by a member that did.
        let leader_joined = group
            .leader
            .as_ref()
            .and_then(|l| group.members.get(l))
            .is_some_and(|m| m.awaiting_join.is_some());
        if !leader_joined {
            let joined = group
                .members
                .values()
                .find(|m| m.awaiting_join.is_some())
                .map(|m| m.id.clone());
            if let Some(id) = joined {
                group.leader = Some(id);
            } else if !group.members.is_empty() {
                // Only static members that did not rejoin are left: wait another
                // rebalance timeout, until they rejoin or their sessions expire.
                tracing::warn!(group = %group.id, members = group.members.len(),
                    "could not complete rebalance because no members rejoined");
                group.join_deadline_ms = Some(now_ms + group.max_rebalance_timeout_ms());
                group.initial_delay_limit_ms = None;
                return;
            }
        }
        // Pending member ids stay (Kafka's `completeClassicGroupJoin` keeps them): one
        // that comes back joins as a new member, or it expires with its session.
        group.join_deadline_ms = None;
        group.initial_delay_limit_ms = None;
        group.generation += 1;
        if group.members.is_empty() {
            group.protocol = None;
            group.leader = None;
            group.transition(GroupState::Empty, now_ms);
            fx.records.push(group.metadata_record());
            return;
        }
        group.protocol = group.select_protocol();
        if group
            .leader
            .as_ref()
            .is_none_or(|l| !group.members.contains_key(l))
        {
            group.leader = group.members.keys().next().cloned();
        }
        group.transition(GroupState::CompletingRebalance, now_ms);
        group.sync_deadline_ms = Some(now_ms + group.max_rebalance_timeout_ms());
        let leader = group.leader.clone().expect("a leader");
        let ids: Vec<String> = group.members.keys().cloned().collect();
        for id in ids {
            let resp = group.join_response(&id, id == leader);
            let m = group.members.get_mut(&id).expect("member");
            m.joined = false;
            m.pending_sync = true;
            m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
            if let Some(t) = m.awaiting_join.take() {
                fx.replies.push(Deferred::Join(t, resp));
            }
        }
    }

    fn remove_member(group: &mut Group, id: &str) -> Option<Member> {
        let m = group.members.remove(id)?;
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &m,
            false,
        );
        if !m.joined {
            group.unjoined = group.unjoined.saturating_sub(1);
        }
        if let Some(i) = &m.instance_id {
            if group.static_members.get(i).map(String::as_str) == Some(id) {
                group.static_members.remove(i);
            }
        }
        if group.leader.as_deref() == Some(id) {
            group.leader = group.members.keys().next().cloned();
        }
        Some(m)
    }

    /// A member left or expired: the group rebalances, or its join phase may now end.
    fn member_gone(
        group: &mut Group,
        id: &str,
        now_ms: i64,
        initial_delay_ms: i64,
        fx: &mut Effects,
    ) {
        let Some(mut m) = Self::remove_member(group, id) else {
            return;
        };
        if let Some(t) = m.awaiting_join.take() {
            fx.replies.push(Deferred::Join(
                t,
                err_join(ResponseError::UnknownMemberId, id),
            ));
        }
        if let Some(t) = m.awaiting_sync.take() {
            fx.replies
                .push(Deferred::Sync(t, err_sync(ResponseError::UnknownMemberId)));
        }
        match group.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                Self::prepare_rebalance(group, now_ms, initial_delay_ms, fx);
                // Nobody is waiting in a join yet; the remaining members learn of the
                // rebalance from their heartbeats.
                Self::maybe_complete_join(group, now_ms, fx);
            }
            GroupState::PreparingRebalance => Self::maybe_complete_join(group, now_ms, fx),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    // ---------------------------------------------------------------- SyncGroup

    pub fn sync(&mut self, token: SyncToken, now_ms: i64, a: SyncArgs, fx: &mut Effects) {
        let reply = |fx: &mut Effects, r: SyncGroupResponse| {
            fx.replies.push(Deferred::Sync(token, r));
        };
        let Some(group) = self.groups.get_mut(&a.group_id) else {
            return reply(fx, err_sync(ResponseError::UnknownMemberId));
        };
        if group.state == GroupState::Dead {
            return reply(fx, err_sync(ResponseError::CoordinatorNotAvailable));
        }
        if group.is_fenced(a.instance_id.as_deref(), &a.member_id) {
            return reply(fx, err_sync(ResponseError::FencedInstanceId));
        }
        if !group.members.contains_key(&a.member_id) {
            return reply(fx, err_sync(ResponseError::UnknownMemberId));
        }
        if a.generation != group.generation {
            return reply(fx, err_sync(ResponseError::IllegalGeneration));
        }
        let type_ok = a.protocol_type.is_none() || a.protocol_type == group.protocol_type;
        let name_ok = a.protocol_name.is_none() || a.protocol_name == group.protocol;
        if !type_ok || !name_ok {
            return reply(fx, err_sync(ResponseError::InconsistentGroupProtocol));
        }
        let protocol_type = group.protocol_type.clone().map(sb);
        let protocol_name = group.protocol.clone().map(sb);
        match group.state {
            GroupState::Empty => reply(fx, err_sync(ResponseError::UnknownMemberId)),
            GroupState::PreparingRebalance => {
                reply(fx, err_sync(ResponseError::RebalanceInProgress))
            }
            GroupState::Stable => {
                let m = group.members.get_mut(&a.member_id).expect("member");
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                m.pending_sync = false;
                let r = SyncGroupResponse::default()
                    .with_protocol_type(protocol_type)
                    .with_protocol_name(protocol_name)
                    .with_assignment(m.assignment.clone());
                // The last member the sync phase waited for: it is over.
                if !group.members.values().any(|m| m.pending_sync) {
                    group.sync_deadline_ms = None;
                }
                reply(fx, r)
            }
            GroupState::CompletingRebalance => {
                let m = group.members.get_mut(&a.member_id).expect("member");
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                m.pending_sync = false;
                if let Some(old) = m.awaiting_sync.replace(token) {
                    fx.replies.push(Deferred::Sync(
                        old,
                        err_sync(ResponseError::UnknownMemberId),
                    ));
                }
                if group.leader.as_deref() == Some(a.member_id.as_str()) {
                    let mut given: HashMap<String, Bytes> = a.assignments.into_iter().collect();
                    let mut largest = 0;
                    for m in group.members.values_mut() {
                        m.assignment = given.remove(&m.id).unwrap_or_default();
                        largest = largest.max(m.assignment.len());
                    }
                    // Kept even if the record cannot be stored: it is what the leader
                    // assigns, and what the next new member's estimate must expect.
                    group.assignment_bytes_max = largest;
                    group.transition(GroupState::Stable, now_ms);
                    // Members that have not synced yet must still do so before the
                    // sync phase expires (Kafka's pending sync, in Stable too).
                    if !group.members.values().any(|m| m.pending_sync) {
                        group.sync_deadline_ms = None;
                    }
                    fx.records.push(group.metadata_record());
                    for m in group.members.values_mut() {
                        if let Some(t) = m.awaiting_sync.take() {
                            let r = SyncGroupResponse::default()
                                .with_protocol_type(protocol_type.clone())
                                .with_protocol_name(protocol_name.clone())
                                .with_assignment(m.assignment.clone());
                            fx.replies.push(Deferred::Sync(t, r));
                        }
                    }
                }
            }
            GroupState::Dead => unreachable!("checked above"),
        }
    }

    /// The shell could not store `record`, a GroupMetadata record this coordinator
    /// produced. As Kafka's coordinator when its group write fails, the generation the
    /// record describes is not kept: if the group is still Stable at that generation,
    /// its assignments are dropped and a rebalance starts (heartbeats then answer
    /// REBALANCE_IN_PROGRESS and members rejoin), rather than running on state a
    /// restart or a coordinator move would not find. Replies only, never records. The
    /// shell answers the requests that waited on the record with the append's error
    /// ([`Deferred::failed`]). Other records (offsets, tombstones) change nothing here.
    pub fn metadata_not_stored(&mut self, now_ms: i64, record: &Record, fx: &mut Effects) {
        let (Some(value), Ok(Key::Group { group: id })) =
            (record.value.as_deref(), Key::decode(&record.key))
        else {
            return;
        };
        let Ok(stored) = GroupValue::decode(value) else {
            return;
        };
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        if group.state != GroupState::Stable || group.generation != stored.generation {
            return;
        }
        for m in group.members.values_mut() {
            m.assignment = Bytes::new();
        }
        Self::prepare_rebalance(group, now_ms, initial_delay, fx);
    }

    // ---------------------------------------------------------------- Heartbeat

    pub fn heartbeat(
        &mut self,
        now_ms: i64,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Code {
        let Some(group) = self.groups.get_mut(group_id) else {
            return Err(ResponseError::UnknownMemberId);
        };
        if group.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if group.is_fenced(instance_id, member_id) {
            return Err(ResponseError::FencedInstanceId);
        }
        let state = group.state;
        let gen = group.generation;
        let Some(m) = group.members.get_mut(member_id) else {
            return Err(ResponseError::UnknownMemberId);
        };
        if generation != gen {
            return Err(ResponseError::IllegalGeneration);
        }
        match state {
            GroupState::Empty | GroupState::Dead => Err(ResponseError::UnknownMemberId),
            GroupState::CompletingRebalance | GroupState::Stable => {
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                Ok(())
            }
            GroupState::PreparingRebalance => {
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                Err(ResponseError::RebalanceInProgress)
            }
        }
    }

    // ---------------------------------------------------------------- LeaveGroup

    /// LeaveGroup: the group-level error, and one result per member.
    pub fn leave(
        &mut self,
        now_ms: i64,
        group_id: &str,
        members: &[Leaving],
        fx: &mut Effects,
    ) -> (Code, Vec<Code>) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let Some(group) = self.groups.get_mut(group_id) else {
            return (
                Ok(()),
                vec![Err(ResponseError::UnknownMemberId); members.len()],
            );
        };
        if group.state == GroupState::Dead {
            return (Err(ResponseError::CoordinatorNotAvailable), Vec::new());
        }
        let mut results = Vec::with_capacity(members.len());
        for l in members {
            let id = if l.member_id.is_empty() {
                // Admin removal of a static member by instance id (KIP-345).
                match l
                    .instance_id
                    .as_ref()
                    .and_then(|i| group.static_members.get(i))
                {
                    Some(id) => id.clone(),
                    None => {
                        results.push(Err(ResponseError::UnknownMemberId));
                        continue;
                    }
                }
            } else {
                if group.is_fenced(l.instance_id.as_deref(), &l.member_id) {
                    results.push(Err(ResponseError::FencedInstanceId));
                    continue;
                }
                l.member_id.clone()
            };
            if group.pending_members.remove(&id).is_some() {
                results.push(Ok(()));
                Self::maybe_complete_join(group, now_ms, fx);
                continue;
            }
            if !group.members.contains_key(&id) {
                results.push(Err(ResponseError::UnknownMemberId));
                continue;
            }
            Self::member_gone(group, &id, now_ms, initial_delay, fx);
            results.push(Ok(()));
        }
        (Ok(()), results)
    }

    // ---------------------------------------------------------------- timers

    /// Fires due timers: expired sessions and pending member ids, the end of a join or
    /// sync phase, and offset expiry of empty groups and, for topics they no longer
    /// subscribe to, of Stable consumer groups (not of groups of a partition still
    /// being loaded: see `Group::loading`).
    pub fn tick(&mut self, now_ms: i64, fx: &mut Effects) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        for group in self.groups.values_mut() {
            group.pending_members.retain(|_, d| *d > now_ms);
            let expired: Vec<String> = group
                .members
                .values()
                .filter(|m| {
                    // Members waiting in a join or sync are alive by definition.
                    m.awaiting_join.is_none()
                        && m.awaiting_sync.is_none()
                        && m.session_deadline_ms <= now_ms
                })
                .map(|m| m.id.clone())
                .collect();
            for id in expired {
                tracing::debug!(group = %group.id, member = %id, "session expired");
                Self::member_gone(group, &id, now_ms, initial_delay, fx);
            }
            if group.state == GroupState::PreparingRebalance {
                Self::maybe_complete_join(group, now_ms, fx);
            }
            let syncing = matches!(
                group.state,
                GroupState::CompletingRebalance | GroupState::Stable
            );
            if syncing && group.sync_deadline_ms.is_some_and(|d| now_ms >= d) {
                // Kafka's `expirePendingSync`: drop whoever has not synced (the leader
                // never sent the assignment, or a member never came for it).
                group.sync_deadline_ms = None;
                let laggards: Vec<String> = group
                    .members
                    .values()
                    .filter(|m| m.pending_sync)
                    .map(|m| m.id.clone())
                    .collect();
                for id in laggards {
                    Self::member_gone(group, &id, now_ms, initial_delay, fx);
                }
                if group.state == GroupState::CompletingRebalance {
                    Self::prepare_rebalance(group, now_ms, initial_delay, fx);
                }
            }
        }
        if now_ms >= self.next_expiry_check_ms {
            self.next_expiry_check_ms = now_ms + self.config.offsets_retention_check_interval_ms;
            self.expire_offsets(now_ms, fx);
        }
    }

    fn expire_offsets(&mut self, now_ms: i64, fx: &mut Effects) {
        let retention = self.config.offsets_retention_ms;
        let mut dead = Vec::new();
        let none = HashMap::new();
        for group in self.groups.values_mut() {
            // A loading group may look empty and old only because its latest
            // GroupMetadata record is not replayed yet.
            if group.loading {
                continue;
            }
            let committing = self.committing.get(&group.id).unwrap_or(&none);
            let expired: Vec<(String, i32)> = match group.state {
                GroupState::Empty => {
                    let since = group.state_timestamp_ms;
                    group
                        .offsets
                        .iter()
                        .filter(|(_, c)| c.commit_timestamp_ms.max(since) + retention <= now_ms)
                        .map(|(k, _)| k.clone())
                        .collect()
                }
                GroupState::Stable => {
                    // KIP-496: a Stable consumer group whose subscriptions are known
                    // loses the offsets of topics it no longer subscribes to, a
                    // retention after their commit (Kafka's `removeExpiredOffsets`).
                    let Some(subscribed) = group.subscribed_topics() else {
                        continue;
                    };
                    let subscribed: BTreeSet<String> = subscribed.into_iter().collect();
                    group
                        .offsets
                        .iter()
                        .filter(|((topic, _), c)| {
                            !subscribed.contains(topic)
                                && c.commit_timestamp_ms + retention <= now_ms
                        })
                        .map(|(k, _)| k.clone())
                        .collect()
                }
                _ => continue,
            };
            for (topic, partition) in expired {
                let tp = (topic, partition);
                if committing.contains_key(&tp) {
                    continue;
                }
                group.remove_offset(&tp);
                fx.records.push(offset_tombstone(&group.id, &tp.0, tp.1));
            }
            if group.state != GroupState::Empty {
                continue;
            }
            if group.offsets.is_empty()
                && committing.is_empty()
                && group.pending_members.is_empty()
                && !group.has_txn_offsets()
            {
                // An empty group with nothing committed holds nothing: it goes.
                dead.push(group.id.clone());
            }
        }
        for id in dead {
            if let Some(mut g) = self.groups.remove(&id) {
                g.transition(GroupState::Dead, now_ms);
                fx.records.push(group_tombstone(&id));
            }
        }
    }

    // ---------------------------------------------------------------- offsets

    /// Validates an OffsetCommit (Kafka's `validateOffsetCommit`). The shell appends
    /// the plan's records, then calls [`Coordinator::apply_commit`].
    pub fn plan_commit(&mut self, now_ms: i64, a: CommitArgs) -> CommitPlan {
        let group_error = self.commit_error(now_ms, &a);
        let mut plan = CommitPlan {
            group_id: a.group_id.clone(),
            results: Vec::with_capacity(a.offsets.len()),
            records: Vec::new(),
            accepted: Vec::new(),
        };
        for ((topic, partition), c) in a.offsets {
            let tp = (topic.clone(), partition);
            if let Some(e) = group_error {
                plan.results.push((tp, Err(e)));
                continue;
            }
            if metadata_too_large(&c.metadata, self.config.offset_metadata_max_bytes) {
                plan.results
                    .push((tp, Err(ResponseError::OffsetMetadataTooLarge)));
                continue;
            }
            plan.records
                .push(offset_record(&a.group_id, &topic, partition, &c));
            plan.results.push((tp.clone(), Ok(())));
            plan.accepted.push((tp, c));
        }
        self.count_committing(&plan, true);
        plan
    }

    /// Counts a plan's accepted partitions as being written (`start`) or done.
    fn count_committing(&mut self, plan: &CommitPlan, start: bool) {
        if plan.accepted.is_empty() {
            return;
        }
        let group = self.committing.entry(plan.group_id.clone()).or_default();
        for (tp, _) in &plan.accepted {
            let n = group.entry(tp.clone()).or_insert(0);
            if start {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    group.remove(tp);
                }
            }
        }
        if group.is_empty() {
            self.committing.remove(&plan.group_id);
        }
    }

    /// A plan whose records could not be written: nothing changes, and its partitions
    /// are no longer being written.
    pub fn fail_commit(&mut self, plan: &CommitPlan) {
        self.count_committing(plan, false);
    }

    fn commit_error(&mut self, now_ms: i64, a: &CommitArgs) -> Option<ResponseError> {
        let Some(group) = self.groups.get_mut(&a.group_id) else {
            if a.generation < 0 {
                // A client managing its own partitions (or an admin tool): the group
                // exists from now on, empty.
                self.groups
                    .insert(a.group_id.clone(), Group::new(&a.group_id, now_ms));
                return None;
            }
            // Not managed here, or a commit from an older incarnation.
            return Some(ResponseError::IllegalGeneration);
        };
        if group.state == GroupState::Dead {
            return Some(ResponseError::CoordinatorNotAvailable);
        }
        if a.generation >= 0 || !a.member_id.is_empty() || a.instance_id.is_some() {
            if group.is_fenced(a.instance_id.as_deref(), &a.member_id) {
                return Some(ResponseError::FencedInstanceId);
            }
            if !group.members.contains_key(&a.member_id) {
                return Some(ResponseError::UnknownMemberId);
            }
            if a.generation != group.generation {
                return Some(ResponseError::IllegalGeneration);
            }
            if group.state == GroupState::CompletingRebalance {
                // The member has its new generation but not yet its assignment.
                return Some(ResponseError::RebalanceInProgress);
            }
            // Kafka's `doCommitOffsets`: a member's commit counts as a heartbeat (in
            // Stable and PreparingRebalance, the states left here).
            if let Some(m) = group.members.get_mut(&a.member_id) {
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
            }
            return None;
        }
        if group.state != GroupState::Empty {
            // Only members commit to a group that has them.
            return Some(ResponseError::UnknownMemberId);
        }
        None
    }

    /// Makes a plan's offsets visible (after its records are durable).
    pub fn apply_commit(&mut self, now_ms: i64, plan: CommitPlan) {
        self.count_committing(&plan, false);
        let group = self
            .groups
            .entry(plan.group_id.clone())
            .or_insert_with(|| Group::new(&plan.group_id, now_ms));
        for (tp, c) in plan.accepted {
            self.log_seq += 1;
            group.offset_seq.insert(tp.clone(), self.log_seq);
            group.offsets.insert(tp, c);
        }
    }

    /// Committed offsets of a group: all of them, or those of the given partitions
    /// (`None` where nothing is committed).
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<&[(String, i32)]>,
    ) -> Vec<((String, i32), Option<Committed>)> {
        let offsets = self.groups.get(group_id).map(|g| &g.offsets);
        match partitions {
            Some(ps) => ps
                .iter()
                .map(|tp| (tp.clone(), offsets.and_then(|o| o.get(tp)).cloned()))
                .collect(),
            None => offsets
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), Some(v.clone())))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// OffsetDelete: the group error, or per-partition results.
    pub fn delete_offsets(
        &mut self,
        group_id: &str,
        partitions: &[(String, i32)],
        fx: &mut Effects,
    ) -> Result<Vec<Code>, ResponseError> {
        let Some(group) = self.groups.get_mut(group_id) else {
            return Err(ResponseError::GroupIdNotFound);
        };
        // `None`: subscribed to every topic (Kafka's `isSubscribedToTopic` for a consumer
        // group whose subscriptions are unknown or cannot be decoded).
        let subscribed = match group.state {
            GroupState::Dead => return Err(ResponseError::GroupIdNotFound),
            GroupState::Empty => Some(Vec::new()),
            _ if group.protocol_type.as_deref() == Some("consumer") => group.subscribed_topics(),
            _ => return Err(ResponseError::NonEmptyGroup),
        };
        let mut out = Vec::with_capacity(partitions.len());
        for (topic, partition) in partitions {
            if subscribed.as_ref().is_none_or(|s| s.contains(topic)) {
                out.push(Err(ResponseError::GroupSubscribedToTopic));
                continue;
            }
            let tp = (topic.clone(), *partition);
            // Kafka's `removeOffsets`: pending transactional commits go too.
            for pending in group.pending_txn.values_mut() {
                pending.remove(&tp);
            }
            group.pending_txn.retain(|_, p| !p.is_empty());
            if group.remove_offset(&tp).is_some() {
                fx.records
                    .push(offset_tombstone(group_id, topic, *partition));
            }
            out.push(Ok(()));
        }
        Ok(out)
    }

    /// DeleteGroups for one group.
    pub fn delete_group(&mut self, now_ms: i64, group_id: &str, fx: &mut Effects) -> Code {
        let Some(group) = self.groups.get(group_id) else {
            return Err(ResponseError::GroupIdNotFound);
        };
        match group.state {
            GroupState::Dead => return Err(ResponseError::GroupIdNotFound),
            GroupState::Empty => {}
            _ => return Err(ResponseError::NonEmptyGroup),
        }
        let mut group = self.groups.remove(group_id).expect("present");
        group.transition(GroupState::Dead, now_ms);
        for (topic, partition) in group.offsets.keys() {
            fx.records
                .push(offset_tombstone(group_id, topic, *partition));
        }
        fx.records.push(group_tombstone(group_id));
        Ok(())
    }

    pub fn describe(&self, group_id: &str) -> GroupSummary {
        let Some(g) = self.groups.get(group_id) else {
            // Kafka describes an unknown group as Dead, without an error.
            return GroupSummary {
                state: GroupState::Dead,
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            };
        };
        let stable = g.state == GroupState::Stable;
        let protocol = if stable {
            g.protocol.clone().unwrap_or_default()
        } else {
            String::new()
        };
        let members = g
            .members
            .values()
            .map(|m| {
                let (meta, asg) = if stable {
                    (m.metadata(&protocol), m.assignment.clone())
                } else {
                    (Bytes::new(), Bytes::new())
                };
                (
                    m.id.clone(),
                    m.instance_id.clone(),
                    m.client_id.clone(),
                    m.client_host.clone(),
                    meta,
                    asg,
                )
            })
            .collect();
        GroupSummary {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol,
            members,
        }
    }

    /// (group id, protocol type, state) of every group.
    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        let mut v: Vec<_> = self
            .groups
            .values()
            .map(|g| {
                (
                    g.id.clone(),
                    g.protocol_type.clone().unwrap_or_default(),
                    g.state,
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    // ---------------------------------------------------------------- transactions

    /// Validates a TxnOffsetCommit (Kafka's `handleTxnCommitOffsets`: KIP-447 fencing by
    /// generation, member id and group instance id) and registers the accepted offsets as
    /// pending for the producer at once, so that OffsetFetch with require_stable reports
    /// them. The shell appends the plan's records as one transactional batch of
    /// `producer_id`/`producer_epoch` to the group's `__consumer_offsets` partition, then
    /// calls [`Coordinator::apply_txn_commit`], or [`Coordinator::fail_txn_commit`] if
    /// the append failed. The offsets become visible when the transaction's COMMIT marker
    /// is written on that partition ([`Coordinator::complete_txn`]).
    pub fn plan_txn_commit(&mut self, now_ms: i64, a: TxnCommitArgs) -> TxnCommitPlan {
        // Kafka creates the group for a transactional commit whatever the generation.
        let group = self
            .groups
            .entry(a.group_id.clone())
            .or_insert_with(|| Group::new(&a.group_id, now_ms));
        let group_error = txn_commit_error(group, &a);
        let mut plan = TxnCommitPlan {
            group_id: a.group_id.clone(),
            producer_id: a.producer_id,
            producer_epoch: a.producer_epoch,
            results: Vec::with_capacity(a.offsets.len()),
            records: Vec::new(),
            accepted: Vec::new(),
        };
        for (tp, c) in a.offsets {
            if let Some(e) = group_error {
                plan.results.push((tp, Err(e)));
                continue;
            }
            if metadata_too_large(&c.metadata, self.config.offset_metadata_max_bytes) {
                plan.results
                    .push((tp, Err(ResponseError::OffsetMetadataTooLarge)));
                continue;
            }
            plan.records
                .push(offset_record(&a.group_id, &tp.0, tp.1, &c));
            *group
                .inflight_txn
                .entry(a.producer_id)
                .or_default()
                .entry(tp.clone())
                .or_default() += 1;
            plan.results.push((tp.clone(), Ok(())));
            plan.accepted.push((tp, c));
        }
        self.drop_if_unused(&a.group_id);
        plan
    }

    /// A TxnOffsetCommit's records are durable: its offsets wait for the marker (Kafka's
    /// `onTxnOffsetCommitAppend`). If the transaction ended while the append was in
    /// flight, the offsets are dropped, as Kafka drops them.
    pub fn apply_txn_commit(&mut self, plan: TxnCommitPlan) {
        let Some(group) = self.groups.get_mut(&plan.group_id) else {
            return;
        };
        for (tp, c) in plan.accepted {
            if !group.end_inflight(plan.producer_id, &tp) {
                tracing::debug!(group = %group.id, producer_id = plan.producer_id, ?tp, "transaction ended before its offset record was durable");
                continue;
            }
            self.log_seq += 1;
            let p = PendingTxnOffset {
                committed: c,
                seq: self.log_seq,
            };
            group
                .pending_txn
                .entry(plan.producer_id)
                .or_default()
                .insert(tp, p);
        }
    }

    /// A TxnOffsetCommit's append failed: nothing of it is pending any more (Kafka's
    /// `failPendingTxnOffsetCommit`). An earlier commit of the same partition in the same
    /// transaction that is durable stays pending.
    pub fn fail_txn_commit(&mut self, plan: &TxnCommitPlan) {
        let Some(group) = self.groups.get_mut(&plan.group_id) else {
            return;
        };
        for (tp, _) in &plan.accepted {
            group.end_inflight(plan.producer_id, tp);
        }
        self.drop_if_unused(&plan.group_id);
    }

    /// A transaction marker of `producer_id` was written on a `__consumer_offsets`
    /// partition (`in_partition` says which groups live there): a COMMIT makes the
    /// producer's pending offsets of those groups visible, unless a commit written later
    /// already replaced them; an ABORT drops them (Kafka's `handleTxnCompletion`).
    pub fn complete_txn(
        &mut self,
        producer_id: i64,
        commit: bool,
        in_partition: impl Fn(&str) -> bool,
    ) {
        for group in self.groups.values_mut() {
            if group.state == GroupState::Dead || !in_partition(&group.id) {
                continue;
            }
            // Records still in flight are not part of the transaction that ended: their
            // durable report finds nothing to join.
            group.inflight_txn.remove(&producer_id);
            let Some(pending) = group.pending_txn.remove(&producer_id) else {
                continue;
            };
            if !commit {
                continue;
            }
            for (tp, p) in pending {
                if group.offset_seq.get(&tp).is_none_or(|cur| *cur < p.seq) {
                    group.offset_seq.insert(tp.clone(), p.seq);
                    group.offsets.insert(tp, p.committed);
                }
            }
        }
    }

    /// OffsetFetch: as [`Coordinator::fetch_offsets`], and with `require_stable` (v7+)
    /// UNSTABLE_OFFSET_COMMIT for a partition with a transactional commit pending.
    pub fn fetch_offsets_stable(
        &self,
        group_id: &str,
        partitions: Option<&[(String, i32)]>,
        require_stable: bool,
    ) -> StableFetch {
        let group = self.groups.get(group_id);
        self.fetch_offsets(group_id, partitions)
            .into_iter()
            .map(|(tp, c)| {
                let unstable =
                    require_stable && group.is_some_and(|g| g.has_pending_txn_offset(&tp));
                if unstable {
                    (tp, Err(ResponseError::UnstableOffsetCommit))
                } else {
                    (tp, Ok(c))
                }
            })
            .collect()
    }

    /// Replays one record of a transactional batch of `producer_id` (in log order): an
    /// offset commit waits for the batch's marker ([`Coordinator::load_marker`]).
    pub fn load_txn_record(
        &mut self,
        now_ms: i64,
        producer_id: i64,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), crate::records::RecordError> {
        let Key::Offset {
            group,
            topic,
            partition,
        } = Key::decode(key)?
        else {
            // Group metadata is never transactional; load it as Kafka does, regardless.
            return self.load_record(now_ms, key, value);
        };
        let tp = (topic, partition);
        match value {
            Some(v) => {
                let v = OffsetValue::decode(v)?;
                self.log_seq += 1;
                let g = self
                    .groups
                    .entry(group.clone())
                    .or_insert_with(|| Group::new(&group, v.commit_timestamp_ms));
                g.loading = true;
                let committed = Committed {
                    offset: v.offset,
                    leader_epoch: v.leader_epoch,
                    metadata: v.metadata,
                    commit_timestamp_ms: v.commit_timestamp_ms,
                };
                g.pending_txn.entry(producer_id).or_default().insert(
                    tp,
                    PendingTxnOffset {
                        committed,
                        seq: self.log_seq,
                    },
                );
            }
            None => {
                if let Some(pending) = self
                    .groups
                    .get_mut(&group)
                    .and_then(|g| g.pending_txn.get_mut(&producer_id))
                {
                    pending.remove(&tp);
                }
            }
        }
        Ok(())
    }

    /// Replays a control batch (COMMIT or ABORT marker) of `producer_id` found while
    /// loading the `__consumer_offsets` partition whose groups `in_partition` names.
    pub fn load_marker(
        &mut self,
        producer_id: i64,
        commit: bool,
        in_partition: impl Fn(&str) -> bool,
    ) {
        self.complete_txn(producer_id, commit, in_partition);
    }

    // ---------------------------------------------------------------- loading

    /// A `__consumer_offsets` partition is loaded (every record replayed): its groups'
    /// offsets may expire from now on (see `Group::loading`), and, as Kafka's
    /// `onGroupLoaded`, each of its groups with more members than group.max.size (the
    /// limit was lowered since the record was written) starts a rebalance at once. Its
    /// members learn of it from their heartbeats and rejoin; the first group.max.size
    /// of them back are kept, later ones are refused and removed ([`Coordinator::join`]),
    /// and members that do not rejoin are dropped (KIP-389): dynamic ones when the join
    /// phase ends, static ones when the sync phase expires.
    pub fn loaded(&mut self, now_ms: i64, in_partition: impl Fn(&str) -> bool, fx: &mut Effects) {
        let max = self.config.group_max_size;
        let initial_delay = self.config.initial_rebalance_delay_ms;
        for group in self.groups.values_mut() {
            if !in_partition(&group.id) {
                continue;
            }
            group.loading = false;
            if group.state != GroupState::Stable {
                continue;
            }
            if group.members.len() > max {
                tracing::info!(group = %group.id, members = group.members.len(),
                    "loaded group is over group.max.size {max}: rebalancing");
                Self::prepare_rebalance(group, now_ms, initial_delay, fx);
            }
        }
    }

    /// Replays one `__consumer_offsets` record (in log order) into memory. `now_ms` is
    /// the load time: restored members' session timers start from it. The group is
    /// loading until [`Coordinator::loaded`] is called for its partition.
    pub fn load_record(
        &mut self,
        now_ms: i64,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), crate::records::RecordError> {
        match Key::decode(key)? {
            Key::Offset {
                group,
                topic,
                partition,
            } => match value {
                Some(v) => {
                    let v = OffsetValue::decode(v)?;
                    let g = self
                        .groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new(&group, v.commit_timestamp_ms));
                    g.loading = true;
                    self.log_seq += 1;
                    g.offset_seq
                        .insert((topic.clone(), partition), self.log_seq);
                    g.offsets.insert(
                        (topic, partition),
                        Committed {
                            offset: v.offset,
                            leader_epoch: v.leader_epoch,
                            metadata: v.metadata,
                            commit_timestamp_ms: v.commit_timestamp_ms,
                        },
                    );
                }
                None => {
                    if let Some(g) = self.groups.get_mut(&group) {
                        g.remove_offset(&(topic, partition));
                    }
                }
            },
            Key::Group { group } => match value {
                Some(v) => {
                    let v = GroupValue::decode(v)?;
                    let g = self
                        .groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new(&group, v.state_timestamp_ms));
                    g.loading = true;
                    g.restore(v, now_ms);
                }
                None => {
                    self.groups.remove(&group);
                }
            },
        }
        Ok(())
    }
}

pub fn offset_record(group: &str, topic: &str, partition: i32, c: &Committed) -> Record {
    Record {
        group: group.to_string(),
        key: Key::Offset {
            group: group.to_string(),
            topic: topic.to_string(),
            partition,
        }
        .encode(),
        value: Some(
            OffsetValue {
                offset: c.offset,
                leader_epoch: c.leader_epoch,
                metadata: c.metadata.clone(),
                commit_timestamp_ms: c.commit_timestamp_ms,
            }
            .encode(),
        ),
    }
}

fn offset_tombstone(group: &str, topic: &str, partition: i32) -> Record {
    Record {
        group: group.to_string(),
        key: Key::Offset {
            group: group.to_string(),
            topic: topic.to_string(),
            partition,
        }
        .encode(),
        value: None,
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

#[cfg(test)]
mod tests {
    //! Static membership across join and sync phases, and offset expiry while a
    //! partition loads (the helpers follow `group_tests.rs`).

    use super::*;
    use kafka_protocol::error::ResponseError as E;
    use kafka_protocol::messages::JoinGroupResponse;

    const REBALANCE: i32 = 10_000;

    fn coord() -> Coordinator {
        Coordinator::new(CoordinatorConfig {
            initial_rebalance_delay_ms: 0,
            ..CoordinatorConfig::default()
        })
    }

    /// A JoinGroup of static member `instance` (`member` "" for a new incarnation).
    fn join(
        c: &mut Coordinator,
        token: u64,
        now: i64,
        member: &str,
        instance: &str,
        session_ms: i32,
    ) -> Effects {
        let mut fx = Effects::default();
        let a = JoinArgs {
            group_id: "g".into(),
            member_id: member.into(),
            instance_id: Some(instance.into()),
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: session_ms,
            rebalance_timeout_ms: REBALANCE,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from("meta-range"))],
            require_known_member_id: true,
            supports_skip_assignment: false,
        };
        c.join(JoinToken(token), now, a, &mut fx);
        fx
    }

    fn join_reply(fx: &Effects, token: u64) -> Option<JoinGroupResponse> {
        fx.replies.iter().find_map(|r| match r {
            Deferred::Join(t, j) if *t == JoinToken(token) => Some(j.clone()),
            _ => None,
        })
    }

    fn sync_reply(fx: &Effects, token: u64) -> Option<SyncGroupResponse> {
        fx.replies.iter().find_map(|r| match r {
            Deferred::Sync(t, s) if *t == SyncToken(token) => Some(s.clone()),
            _ => None,
        })
    }

    fn sync(
        c: &mut Coordinator,
        token: u64,
        now: i64,
        member: &str,
        instance: &str,
        gen: i32,
        asg: &[(&str, &str)],
    ) -> Effects {
        let mut fx = Effects::default();
        let a = SyncArgs {
            group_id: "g".into(),
            generation: gen,
            member_id: member.into(),
            instance_id: Some(instance.into()),
            protocol_type: Some("consumer".into()),
            protocol_name: None,
            assignments: asg
                .iter()
                .map(|(m, a)| (m.to_string(), Bytes::from(a.to_string())))
                .collect(),
        };
        c.sync(SyncToken(token), now, a, &mut fx);
        fx
    }

    /// Static members i1 (the leader) and i2, Stable at generation 2 with assignments
    /// "A" and "B", all at time 0; returns their member ids.
    fn stable_two_static(c: &mut Coordinator, session_ms: i32) -> (String, String) {
        let fx = join(c, 1, 0, "", "i1", session_ms);
        let a = join_reply(&fx, 1).unwrap().member_id.to_string();
        sync(c, 2, 0, &a, "i1", 1, &[(&a, "A")]);
        let mut fx = join(c, 3, 0, "", "i2", session_ms);
        fx.replies
            .extend(join(c, 4, 0, &a, "i1", session_ms).replies);
        let b = join_reply(&fx, 3).unwrap().member_id.to_string();
        assert_eq!(join_reply(&fx, 4).unwrap().generation_id, 2);
        sync(c, 5, 0, &a, "i1", 2, &[(&a, "A"), (&b, "B")]);
        let fx = sync(c, 6, 0, &b, "i2", 2, &[]);
        assert_eq!(sync_reply(&fx, 6).unwrap().assignment, Bytes::from("B"));
        assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
        (a, b)
    }

    /// Kafka rebalances when a static member restarts while the group waits for its
    /// assignment: the leader was given the old member id and would assign the
    /// instance's partitions to it, leaving the new incarnation with nothing.
    #[test]
    fn static_member_restarting_in_completing_rebalance_rebalances() {
        let mut c = coord();
        let (a, b) = stable_two_static(&mut c, 6_000);
        // i3 joins; i1 and i2 rejoin: generation 3 waits for the leader's assignment.
        let mut fx = join(&mut c, 10, 100, "", "i3", 6_000);
        fx.replies
            .extend(join(&mut c, 11, 100, &a, "i1", 6_000).replies);
        fx.replies
            .extend(join(&mut c, 12, 100, &b, "i2", 6_000).replies);
        let r = join_reply(&fx, 11).unwrap();
        assert_eq!(r.generation_id, 3);
        assert!(r.members.iter().any(|m| m.member_id.as_str() == b));
        let d = join_reply(&fx, 10).unwrap().member_id.to_string();
        assert_eq!(c.group("g").unwrap().state, GroupState::CompletingRebalance);
        // i2's process restarts before syncing: it joins with no member id.
        let fx = join(&mut c, 13, 200, "", "i2", 6_000);
        assert!(
            join_reply(&fx, 13).is_none(),
            "waits for the new join phase"
        );
        let g = c.group("g").unwrap();
        assert_eq!(g.state, GroupState::PreparingRebalance);
        let b2 = g.static_members["i2"].clone();
        assert_ne!(b2, b);
        // The members of generation 3 must rejoin.
        assert_eq!(
            c.heartbeat(300, "g", 3, &a, Some("i1")),
            Err(E::RebalanceInProgress)
        );
        let mut fx = join(&mut c, 14, 300, &a, "i1", 6_000);
        fx.replies
            .extend(join(&mut c, 15, 300, &d, "i3", 6_000).replies);
        let r = join_reply(&fx, 14).unwrap();
        assert_eq!(r.generation_id, 4);
        let ids: BTreeSet<String> = r.members.iter().map(|m| m.member_id.to_string()).collect();
        assert_eq!(ids, BTreeSet::from([a.clone(), b2.clone(), d.clone()]));
        // The leader's assignment reaches the new incarnation.
        sync(
            &mut c,
            16,
            300,
            &a,
            "i1",
            4,
            &[(&a, "A"), (&b2, "B"), (&d, "C")],
        );
        let fx = sync(&mut c, 17, 300, &b2, "i2", 4, &[]);
        assert_eq!(sync_reply(&fx, 17).unwrap().assignment, Bytes::from("B"));
    }

    /// A static member restarting in Stable before it synced is a new incarnation
    /// that owes no SyncGroup of the old one's generation: the expiring sync phase
    /// does not remove it (Kafka's replaceStaticMember).
    #[test]
    fn a_restarted_static_member_owes_no_sync_of_its_old_incarnation() {
        let mut c = coord();
        let fx = join(&mut c, 1, 0, "", "i1", 30_000);
        let a = join_reply(&fx, 1).unwrap().member_id.to_string();
        sync(&mut c, 2, 0, &a, "i1", 1, &[(&a, "A")]);
        // i2 joins, i1 rejoins: generation 2, and only the leader syncs.
        let mut fx = join(&mut c, 3, 0, "", "i2", 30_000);
        fx.replies
            .extend(join(&mut c, 4, 0, &a, "i1", 30_000).replies);
        let b = join_reply(&fx, 3).unwrap().member_id.to_string();
        sync(&mut c, 5, 0, &a, "i1", 2, &[(&a, "A"), (&b, "B")]);
        assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
        // i2 restarts before it synced: a new member id, no rebalance.
        let fx = join(&mut c, 6, 100, "", "i2", 30_000);
        let b2 = join_reply(&fx, 6).unwrap().member_id.to_string();
        assert_ne!(b2, b);
        let mut fx = Effects::default();
        c.tick(i64::from(REBALANCE) + 1_000, &mut fx);
        let g = c.group("g").unwrap();
        assert_eq!(g.state, GroupState::Stable);
        assert!(g.members.contains_key(&b2), "the new incarnation stays");
    }

    /// Kafka's `completeClassicGroupJoin` drops only dynamic members that did not
    /// rejoin; a static one stays in the generation until its sync phase expires, in
    /// CompletingRebalance or Stable.
    #[test]
    fn static_member_that_does_not_rejoin_stays_until_the_sync_phase_expires() {
        let mut c = coord();
        let (a, b) = stable_two_static(&mut c, 30_000);
        // i3 joins and i1 rejoins; i2 stays silent.
        let mut fx = join(&mut c, 10, 0, "", "i3", 30_000);
        fx.replies
            .extend(join(&mut c, 11, 0, &a, "i1", 30_000).replies);
        assert!(join_reply(&fx, 11).is_none(), "waits for i2");
        let mut fx = Effects::default();
        c.tick(10_000, &mut fx);
        let g = c.group("g").unwrap();
        assert_eq!(
            (g.state, g.generation, g.members.len()),
            (GroupState::CompletingRebalance, 3, 3)
        );
        assert_eq!(g.static_members.get("i2"), Some(&b));
        let r = join_reply(&fx, 11).unwrap();
        assert_eq!((r.generation_id, r.leader.as_str()), (3, a.as_str()));
        assert_eq!(r.members.len(), 3, "the leader assigns i2's share too");
        let d = join_reply(&fx, 10).unwrap().member_id.to_string();
        // The leader and i3 sync; i2 never does.
        sync(&mut c, 12, 10_000, &d, "i3", 3, &[]);
        let fx = sync(
            &mut c,
            13,
            10_000,
            &a,
            "i1",
            3,
            &[(&a, "A"), (&b, "B"), (&d, "C")],
        );
        assert_eq!(sync_reply(&fx, 13).unwrap().assignment, Bytes::from("A"));
        assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
        let mut fx = Effects::default();
        c.tick(19_999, &mut fx);
        assert!(c.group("g").unwrap().members.contains_key(&b));
        // One rebalance timeout after the join phase ended: i2 goes (its session has
        // 20 s left) and the group rebalances.
        c.tick(20_000, &mut fx);
        let g = c.group("g").unwrap();
        assert!(!g.members.contains_key(&b));
        assert!(!g.static_members.contains_key("i2"));
        assert_eq!(g.state, GroupState::PreparingRebalance);
    }

    /// If no member rejoined (all are static), Kafka does not complete an empty
    /// generation: the join phase waits another rebalance timeout.
    #[test]
    fn join_phase_that_no_member_rejoined_waits_again() {
        let mut c = coord();
        let (a, b) = stable_two_static(&mut c, 30_000);
        // i3 joins and leaves again: i1 and i2 must rejoin, and neither does.
        let fx = join(&mut c, 10, 0, "", "i3", 30_000);
        assert!(join_reply(&fx, 10).is_none());
        let mut fx = Effects::default();
        let (_, r) = c.leave(
            0,
            "g",
            &[Leaving {
                member_id: String::new(),
                instance_id: Some("i3".into()),
            }],
            &mut fx,
        );
        assert_eq!(r, vec![Ok(())]);
        let mut fx = Effects::default();
        c.tick(10_000, &mut fx);
        let g = c.group("g").unwrap();
        assert_eq!(
            (g.state, g.generation, g.members.len()),
            (GroupState::PreparingRebalance, 2, 2)
        );
        assert!(fx.records.is_empty(), "no empty generation is written");
        // i2 rejoins: it becomes the leader of generation 3 at the next deadline, and
        // i1 stays in it.
        let fx = join(&mut c, 11, 15_000, &b, "i2", 30_000);
        assert!(join_reply(&fx, 11).is_none());
        let mut fx = Effects::default();
        c.tick(20_000, &mut fx);
        let r = join_reply(&fx, 11).unwrap();
        assert_eq!((r.generation_id, r.leader.as_str()), (3, b.as_str()));
        assert_eq!(r.members.len(), 2);
        assert!(c.group("g").unwrap().members.contains_key(&a));
    }

    /// A tick while a `__consumer_offsets` partition is half replayed: the group's
    /// offsets are in, its latest GroupMetadata record (with members) is not yet. The
    /// group must not expire then (Kafka expires only fully loaded groups).
    #[test]
    fn offsets_of_a_partition_being_loaded_do_not_expire() {
        let mut src = coord();
        let (a, _) = stable_two_static(&mut src, 6_000);
        let old = Committed {
            offset: 7,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp_ms: 0,
        };
        let offset = offset_record("g", "t", 0, &old);
        let metadata = src.group("g").unwrap().metadata_record();
        // Another group of the partition holds nothing but an old offset.
        let other = offset_record("h", "t", 0, &old);
        let mut c = Coordinator::new(CoordinatorConfig {
            initial_rebalance_delay_ms: 0,
            offsets_retention_ms: 1_000,
            offsets_retention_check_interval_ms: 100,
            ..CoordinatorConfig::default()
        });
        let now = 5_000;
        for r in [&offset, &other] {
            c.load_record(now, &r.key, r.value.as_deref()).unwrap();
        }
        let mut fx = Effects::default();
        c.tick(now, &mut fx);
        assert!(fx.records.is_empty(), "no tombstones: {:?}", fx.records);
        c.load_record(now, &metadata.key, metadata.value.as_deref())
            .unwrap();
        c.loaded(now, |_| true, &mut fx);
        let g = c.group("g").unwrap();
        assert_eq!((g.state, g.generation), (GroupState::Stable, 2));
        assert!(g.members.contains_key(&a));
        assert_eq!(c.fetch_offsets("g", None)[0].1.as_ref().unwrap().offset, 7);
        // Loaded: the empty group's offsets expire at the next check, g's do not.
        c.tick(now + 100, &mut fx);
        assert!(c.group("h").is_none());
        assert_eq!(fx.records.len(), 2, "h's offset and group tombstones");
        assert!(fx.records.iter().all(|r| r.group == "h"));
        assert_eq!(c.fetch_offsets("g", None).len(), 1);
    }
}
