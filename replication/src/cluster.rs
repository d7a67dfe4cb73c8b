//! The cluster metadata state machine.
//!
//! [`ClusterState`] is what the metadata quorum agrees on: registered brokers (with
//! their endpoints and whether they are fenced), topics (id, configs, partitions) and
//! each partition's assignment (replicas, leader, leader epoch, ISR, partition epoch),
//! plus the next free producer id. It changes only by [`ClusterState::apply`] of a
//! committed [`Command`], which is deterministic: every voter applies the same log and
//! reaches the same state, so the consequences of a command (who leads after a broker
//! is fenced, which epochs move) are computed here, not by whoever proposed it.
//!
//! The rules follow Kafka's KRaft controller:
//! - A fenced broker leaves the ISR of every partition (unless it is the last member)
//!   and loses every leadership; a new leader comes from the ISR, never from outside it
//!   unless the topic sets `unclean.leader.election.enable=true`. A partition whose ISR
//!   has no live member is leaderless (leader `-1`) until one returns.
//! - Every leader change bumps the leader epoch; every leader or ISR change bumps the
//!   partition epoch. An ISR change (AlterPartition) is refused unless it names the
//!   current leader epoch and partition epoch, so a deposed leader cannot shrink an ISR.
//! - A broker that registers with a new incarnation (it restarted) is treated as fenced
//!   and then unfenced: it cannot stay leader under the epoch it had before the restart,
//!   since its unsynced tail may be gone while followers hold it.
//!
//! ## Encodings and their versions
//!
//! Commands (the journal's entries) and the state (snapshots) are rkyv archives, whose
//! layout is positional: a field added to a struct moves every byte after it. So:
//! - [`Command`] only ever gains variants at its end, each no larger than the largest
//!   one, so the archived enum keeps its size (pinned by a const assertion below) and
//!   every entry written by an older build decodes unchanged. A broker without a rack
//!   still registers with the first [`Command::RegisterBroker`], so an older voter in a
//!   rolling upgrade reads what a newer broker writes unless racks are used. ISR
//!   changes, though, are [`Command::AlterPartitions`], which a build before it
//!   refuses as undecodable while newer voters apply it: there is no feature gate
//!   yet, so every voter must run a build that knows it before a newer leader
//!   proposes ISR changes. The same holds for [`Command::ElectUnclean`] (an unclean
//!   ElectLeaders): no voter may run an older build when one is asked for, nor
//!   when a partition reassignment ([`Command::Reassign`]) or a SCRAM credential
//!   change ([`Command::AlterScramCredentials`]) or a group config change
//!   ([`Command::AlterGroupConfigs`]) is, nor when a broker with several named
//!   listeners registers ([`Command::RegisterBrokerListeners`]; a broker with one
//!   listener still registers with the older commands), nor when tiered storage
//!   records remote segments ([`Command::AddRemoteSegmentsV9`], the two after it,
//!   [`Command::AddRemoteSegments`] and [`Command::TruncateRemoteSegments`]).
//! - A snapshot written by this build starts with [`STATE_MAGIC`] (the format's
//!   version); one without it is the version-1 layout (no racks, no broker configs),
//!   read through [`legacy::ClusterStateV1`]; version 2 (before replica slots) is read
//!   through [`legacy::ClusterStateV2`], version 3 (before reassignments) through
//!   [`legacy::ClusterStateV3`], version 4 (before SCRAM credentials) through
//!   [`legacy::ClusterStateV4`], version 5 (before group configs) through
//!   [`legacy::ClusterStateV5`], version 6 (before ACLs and quotas) through
//!   [`legacy::ClusterStateV6`], version 7 (before named listeners) through
//!   [`legacy::ClusterStateV7`], version 8 (before remote segments) through
//!   [`legacy::ClusterStateV8`], version 9 (before remote segments' last epochs)
//!   through [`legacy::ClusterStateV9`]. Fixtures written by the version-1 to -9 builds
//!   (`replication/testdata/*-v1.hex`, `state-v2.hex` … `state-v9.hex`) are decoded by
//!   the unit tests.
//!
//! ## Replica slots
//!
//! Every replica gets a slot when its partition is created: its sequence number among
//! all replicas ever placed on its broker ([`ClusterState::replicas_placed`]), handed
//! out in partition order. A broker spreads the partitions it hosts over its shards by
//! slot (slot mod shard count, `sluice_shard::ShardTable::owner_of_slot`), so
//! consecutive placements land on consecutive shards and every shard owns the same
//! number of them, within one (deleted topics leave gaps). Slots are computed by
//! [`ClusterState::apply`] from the state, so the journal's commands carry none;
//! partitions restored from a snapshot older than version 3 have none, and their
//! brokers fall back to hashing.
//!
//! ## Reassignments
//!
//! A partition's replicas move as Kafka's controller moves them (KIP-455):
//! [`Command::Reassign`] with target replicas `T` over current replicas `R` makes the
//! replica set `T` followed by `R - T`, and records the ongoing move in
//! [`ClusterState::reassignments`]: `adding = T - R` (new replicas, outside the ISR
//! until their leader finds them caught up), `removing = R - T`. The leader and ISR do
//! not change then. Once every target replica is in the ISR (checked after every
//! command), the move completes: the replica set becomes `T`, the ISR loses the
//! removed replicas, and a leader outside `T` hands over to the first target replica
//! in the ISR (a new leader epoch). Cancelling (a `None` target) reverts to `R`
//! without the added replicas, which also leave the ISR; if the ISR held only added
//! replicas, that would be an unclean election, refused unless the topic allows one.
//! New replicas get new slots; a replica keeps its slot while it stays.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

use crate::acl::Acl;
use crate::quota::{ClientQuota, QuotaChange};
use crate::{BrokerId, NO_BROKER};

/// The first bytes of a snapshot in the current format (version 10: remote segments'
/// last epochs; version 9 tiered storage's remote segments; version 8 named listeners' endpoints; version 7 added ACLs and client quotas, version 6 group configs,
/// version 5 added SCRAM credentials, version 4 reassignments and directory ids,
/// version 3 replica slots, version 2 racks and broker configs); a snapshot without
/// them is version 1.
/// Byte 6 is the version.
pub const STATE_MAGIC: &[u8; 8] = b"SLCST\x00\x0a\x00";
/// The format version [`STATE_MAGIC`] names.
const STATE_VERSION: u8 = STATE_MAGIC[6];

/// The scope key of the cluster-wide dynamic broker configs in
/// [`ClusterState::broker_configs`] (Kafka's `<default>` entity, the empty resource
/// name); any other key is one broker's id.
pub const CLUSTER_DEFAULT: BrokerId = -1;

/// The topic config that allows electing a replica outside the ISR.
pub const UNCLEAN_ELECTION: &str = "unclean.leader.election.enable";

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub id: BrokerId,
    /// Where clients reach its Kafka listener.
    pub host: String,
    pub port: i32,
    /// Changes on every start of the broker process.
    pub incarnation: u64,
    pub fenced: bool,
    /// Kafka's `broker.rack`: the failure domain (zone) placement spreads replicas over.
    pub rack: Option<String>,
}

/// One of a broker's named listeners as clients reach it (Kafka's advertised.listeners
/// entry with its listener.security.protocol.map protocol): see
/// [`Command::RegisterBrokerListeners`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The listener's name (`CLIENT`, `INTERNAL`, `PLAINTEXT` …), upper case.
    pub listener: String,
    pub host: String,
    pub port: i32,
    /// Kafka's SecurityProtocol id: 0 PLAINTEXT, 1 SSL, 2 SASL_PLAINTEXT, 3 SASL_SSL.
    pub security_protocol: i16,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// In preference order: `replicas[0]` is the preferred leader.
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    /// [`NO_BROKER`] when no ISR member is alive.
    pub leader: BrokerId,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    /// Per replica, in the order of `replicas`: its slot (see the module doc), fixed
    /// at creation. Empty for partitions restored from a snapshot older than version 3.
    pub slots: Vec<u64>,
}

impl PartitionState {
    /// The slot of `broker`'s replica; `None` if it holds none, or the partition
    /// predates slots.
    pub fn slot_of(&self, broker: BrokerId) -> Option<u64> {
        let i = self.replicas.iter().position(|b| *b == broker)?;
        self.slots.get(i).copied()
    }
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TopicState {
    /// Kafka's topic id, a UUID's 16 bytes.
    pub id: [u8; 16],
    /// Configs set explicitly (validated by the broker before proposing).
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionState>,
}

/// An ongoing reassignment of one partition (see the module doc): the replica set is
/// the target followed by `removing`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct Reassignment {
    /// Target replicas that were not replicas when the move began.
    pub adding: Vec<BrokerId>,
    /// Replicas the target leaves out; they stay until the move completes.
    pub removing: Vec<BrokerId>,
}

impl Reassignment {
    /// The replicas the move ends with: `replicas` without the removed ones.
    pub fn target(&self, replicas: &[BrokerId]) -> Vec<BrokerId> {
        without(replicas, &self.removing)
    }

    /// The replicas before the move: `replicas` without the added ones.
    pub fn original(&self, replicas: &[BrokerId]) -> Vec<BrokerId> {
        without(replicas, &self.adding)
    }
}

/// `list` in its order, without the members of `gone`.
fn without(list: &[BrokerId], gone: &[BrokerId]) -> Vec<BrokerId> {
    list.iter().copied().filter(|b| !gone.contains(b)).collect()
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterState {
    /// Set by the first command of a new cluster ([`Command::Init`]).
    pub cluster_id: String,
    pub brokers: BTreeMap<BrokerId, BrokerInfo>,
    pub topics: BTreeMap<String, TopicState>,
    pub next_producer_id: i64,
    /// How many commands changed this state: a version every broker can compare.
    pub version: u64,
    /// Dynamic broker configs set at run time (Kafka's names), by scope:
    /// [`CLUSTER_DEFAULT`] for the cluster-wide defaults, else a broker id.
    pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
    /// Per broker: replicas ever placed on it since slots exist, deleted ones
    /// included, which is the next slot it hands out (see the module doc).
    pub replicas_placed: BTreeMap<BrokerId, u64>,
    /// Ongoing reassignments, by topic and partition (see the module doc).
    pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
    /// Per broker, the identity of the data directory it last ran on (KIP-858's
    /// directory id, written when the directory was formatted): see
    /// [`Command::RecordDirectory`].
    pub directories: BTreeMap<BrokerId, String>,
    /// SASL/SCRAM credentials by user name and mechanism (Kafka's ScramMechanism code:
    /// 1 SCRAM-SHA-256, 2 SCRAM-SHA-512): see [`Command::AlterScramCredentials`].
    pub scram: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
    /// Configs set on consumer groups (Kafka's GROUP resource: `consumer.session.timeout.ms`
    /// …), by group id: see [`Command::AlterGroupConfigs`].
    pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Kafka ACL bindings, sorted and each once: see [`Command::CreateAcls`].
    pub acls: Vec<Acl>,
    /// Client quotas by entity, sorted by entity: see [`Command::AlterClientQuotas`].
    pub quotas: Vec<ClientQuota>,
    /// Per broker that registered named listeners, every listener's endpoint, the
    /// inter-broker one first (its host and port are also the [`BrokerInfo`]'s): see
    /// [`Command::RegisterBrokerListeners`]. A broker absent here has one listener,
    /// the [`BrokerInfo`]'s, whatever name a client connected through.
    pub endpoints: BTreeMap<BrokerId, Vec<Endpoint>>,
    /// Tiered storage: per topic and partition, the segments copied to the object store
    /// (see [`Command::AddRemoteSegments`]).
    pub remote: BTreeMap<String, BTreeMap<i32, RemoteLog>>,
    /// Object store folders (`<topic>-<topic id>/`) of deleted topics whose objects are
    /// still to be deleted (see [`Command::RemotePurged`]).
    pub remote_purge: Vec<String>,
}

/// A partition's segments in the object store, in offset order. Each one's last offset
/// is above every earlier one's; they may overlap (a new leader's segment boundaries
/// differ from the old one's) or leave gaps (offsets compacted or deleted away), as in
/// Kafka's remote log.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RemoteLog {
    pub segments: Vec<RemoteSegment>,
    /// Offsets below this were deleted (remote retention, DeleteRecords), even where a
    /// remaining segment still holds them.
    pub log_start: i64,
}

impl RemoteLog {
    /// The offset after the last remote one: where the next upload continues.
    pub fn end_offset(&self) -> Option<i64> {
        self.segments.last().map(|s| s.last_offset + 1)
    }

    /// The first remote offset, the partition's log start while it has remote segments.
    pub fn start_offset(&self) -> Option<i64> {
        self.segments
            .first()
            .map(|s| s.base_offset.max(self.log_start))
    }

    /// The segment to read `offset` from: the first whose last offset is at or past it.
    pub fn segment_for(&self, offset: i64) -> Option<&RemoteSegment> {
        let i = self.segments.partition_point(|s| s.last_offset < offset);
        self.segments.get(i)
    }

    /// Where a leader cuts the remote log ([`Command::TruncateRemoteSegments`]) before
    /// it uploads, if the log holds segments the leader's log does not agree with
    /// ([`agreed_end`](Self::agreed_end), the same arguments): at the end of those it
    /// agrees with, or, where the first other one starts below `known_from`, at
    /// `known_from`. The records below that are ones the leader's log no longer holds,
    /// so nothing says they differ, and the remote log is their only copy: they stay.
    /// From the cut on, the leader's log holds every offset it has, and it uploads
    /// them again.
    pub fn truncation_point(
        &self,
        known_from: i64,
        epoch_of: impl Fn(i64) -> Option<i32>,
    ) -> Option<i64> {
        let agreed = self.agreed_end(known_from, epoch_of);
        if agreed >= self.end_offset()? {
            return None;
        }
        let first = self.segment_for(agreed)?;
        Some(if first.base_offset < known_from {
            agreed.max(known_from)
        } else {
            agreed
        })
    }

    /// [`Command::TruncateRemoteSegments`]: nothing at or past `from` is left. The
    /// first segment that reaches `from` is cut to end below it (if it starts below
    /// it), and every later one goes (last offsets ascend, so they reach it too).
    pub fn truncate(&mut self, from: i64) {
        let i = self.segments.partition_point(|s| s.last_offset < from);
        let cut = self.segments.get(i).is_some_and(|s| s.base_offset < from);
        self.segments.truncate(i + usize::from(cut));
        if cut {
            let s = &mut self.segments[i];
            s.last_offset = from - 1;
            s.last_epoch = UNKNOWN_EPOCH;
        }
    }

    /// How far a replica's log agrees with this remote log: the end of the last
    /// segment whose last batch `epoch_of` (the replica's leader epoch of an offset it
    /// holds, `None` past its log end) places in the segment's
    /// [`RemoteSegment::last_epoch`]. By log matching, the replica then holds the same
    /// records up to there. A segment below `known_from` (where the replica's epoch
    /// history begins: its log no longer holds it) or without a recorded epoch counts
    /// as agreeing, as nothing says otherwise. Agreement only ever holds for a prefix
    /// of the segments (but for a segment without a recorded epoch after ones with
    /// it, which only an old build's leader records in a rolling upgrade), so this is
    /// a binary search.
    ///
    /// Equal to [`end_offset`](Self::end_offset) when the whole remote log agrees; the
    /// first segment's base when none of it does. After an unclean election the new
    /// leader cuts the remote log there ([`Command::TruncateRemoteSegments`]), and no
    /// replica's retention deletes past it (it may be records the remote log lacks).
    pub fn agreed_end(&self, known_from: i64, epoch_of: impl Fn(i64) -> Option<i32>) -> i64 {
        let agrees = |s: &RemoteSegment| {
            s.last_epoch == UNKNOWN_EPOCH
                || s.last_offset < known_from
                || epoch_of(s.last_offset) == Some(s.last_epoch)
        };
        let n = self.segments.partition_point(agrees);
        match n.checked_sub(1).map(|i| &self.segments[i]) {
            Some(last) => last.last_offset + 1,
            None => self.segments.first().map_or(i64::MIN, |s| s.base_offset),
        }
    }
}

/// One segment copied to the object store: its objects are named by the partition,
/// `base_offset` and `id` (one id per upload attempt).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RemoteSegment {
    pub id: [u8; 16],
    pub base_offset: i64,
    pub last_offset: i64,
    /// The largest record timestamp in the segment (-1 if none had one).
    pub max_timestamp: i64,
    /// Bytes of its log object.
    pub size: u64,
    /// The leader epoch it was uploaded under.
    pub leader_epoch: i32,
    /// When the upload was committed (ms since the epoch): retention by time falls
    /// back on it for segments without timestamps.
    pub uploaded_ms: i64,
    /// The leader epoch of its last batch: a replica whose log holds `last_offset` in
    /// this epoch holds the same records up to it (Kafka's log matching), so it agrees
    /// with the remote log that far ([`RemoteLog::agreed_end`]). [`UNKNOWN_EPOCH`] for
    /// segments recorded before it was (snapshot version 9, [`Command::AddRemoteSegmentsV9`]).
    pub last_epoch: i32,
}

/// [`RemoteSegment::last_epoch`] of a segment recorded without one.
pub const UNKNOWN_EPOCH: i32 = -1;

/// A user's SCRAM credential for one mechanism, as RFC 5802's server stores it: the
/// salt, the iteration count, StoredKey and ServerKey — never the password or the
/// salted password, so the state does not let anyone log in as the user.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub iterations: i32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // StoredKey and one overheard exchange give ClientKey: never printed.
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

/// One change of [`Command::AlterScramCredentials`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ScramChange {
    pub user: String,
    /// Kafka's ScramMechanism code (1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
    pub mechanism: i8,
    /// The new credential; `None` deletes the user's credential of this mechanism
    /// (nothing if it has none).
    pub credential: Option<ScramCredential>,
    /// Set only if the user has no credential of this mechanism yet (a broker's
    /// bootstrap user, proposed on every start, must not undo a later password change).
    pub only_if_absent: bool,
}

/// A change to [`ClusterState`], proposed to the quorum and applied once committed.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Names a new cluster; ignored if the cluster already has an id.
    Init {
        cluster_id: String,
    },
    /// A broker process started (or restarted: a new `incarnation`).
    RegisterBroker {
        id: BrokerId,
        host: String,
        port: i32,
        incarnation: u64,
    },
    /// Heartbeats lapsed: the broker is presumed dead.
    FenceBroker {
        id: BrokerId,
    },
    /// A fenced broker heartbeats again.
    UnfenceBroker {
        id: BrokerId,
    },
    CreateTopic {
        name: String,
        id: [u8; 16],
        configs: BTreeMap<String, String>,
        /// Replicas of each partition, from [`ClusterState::place`].
        assignments: Vec<Vec<BrokerId>>,
    },
    DeleteTopic {
        name: String,
    },
    /// Adds partitions `existing..existing + assignments.len()`; refused unless the
    /// topic still has `existing` partitions (a retried copy must not add them twice).
    CreatePartitions {
        name: String,
        existing: u32,
        assignments: Vec<Vec<BrokerId>>,
    },
    /// Replaces the topic's explicit configs.
    AlterConfigs {
        name: String,
        configs: BTreeMap<String, String>,
    },
    /// A leader asks to shrink or expand the ISR of its partition.
    AlterPartition {
        from: BrokerId,
        topic: String,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        new_isr: Vec<BrokerId>,
    },
    /// Move leadership back to the preferred replica if it is in the ISR and alive.
    ElectPreferred {
        topic: String,
        partition: i32,
    },
    /// Hands a block of producer ids to a broker.
    AllocateProducerIds {
        broker: BrokerId,
        count: i64,
    },
    /// A broker's replica of a partition went offline (an I/O error on its files):
    /// it leaves the ISR and its leadership moves to another live ISR member — when
    /// there is one. With none, no clean election is possible: the leader stays and
    /// the partition waits for that replica to reopen, in a new leader epoch. Its
    /// recovered log may be shorter than what followers fetched from it (a leader
    /// serves batches whose write is still running), so it must not lead again in the
    /// epoch those followers hold them under: the new epoch makes them truncate.
    ReplicaOffline {
        broker: BrokerId,
        topic: String,
        partition: i32,
    },
    /// [`Command::RegisterBroker`] of a broker with a rack (`broker.rack`).
    RegisterBrokerInRack {
        id: BrokerId,
        host: String,
        port: i32,
        incarnation: u64,
        rack: String,
    },
    /// Replaces the dynamic broker configs of one scope ([`CLUSTER_DEFAULT`] or a
    /// broker id); validated by the broker before proposing.
    AlterBrokerConfigs {
        scope: BrokerId,
        configs: BTreeMap<String, String>,
    },
    /// Many ISR changes of one leader broker in one entry (Kafka's AlterPartition
    /// request carries many partitions): each is judged as [`Command::AlterPartition`]
    /// would be, in order, and answered on its own in [`Applied::Partitions`], so a
    /// stale change refuses only itself. After a broker failure thousands of ISRs
    /// change at once; this makes that one raft entry per batch, not per partition.
    AlterPartitions {
        from: BrokerId,
        changes: Vec<IsrChange>,
    },
    /// An unclean election asked for (ElectLeaders with election type UNCLEAN): a
    /// leaderless partition takes a live ISR member if it has one, else any live
    /// replica, which then is the whole ISR (records only the old ISR held may be
    /// lost). Refused if the partition has a leader or no replica is alive.
    ElectUnclean {
        topic: String,
        partition: i32,
    },
    /// AlterPartitionReassignments: each change starts, replaces or cancels one
    /// partition's reassignment (see the module doc), judged on its own and answered
    /// in [`Applied::Partitions`].
    Reassign {
        changes: Vec<Reassign>,
    },
    /// A broker starting on a data directory the state does not record for it,
    /// before it registers. The first record is just kept. A different one means the
    /// directory it ran on is lost (wiped, replaced): its replicas hold nothing, so
    /// it is fenced (leaderships move) and leaves every ISR — even where it was the
    /// last member, which leaves that partition leaderless rather than led by an
    /// empty log (an unclean election can still choose it). It rejoins each ISR
    /// once it has fetched what the leader has.
    RecordDirectory {
        id: BrokerId,
        directory: String,
    },
    /// UnregisterBroker: a broker taken out of the cluster for good. Refused while it
    /// is live (stop it first) or still holds a replica (move them first); its
    /// registration, directory record and broker configs go. (Its controller voter
    /// stays a voter: the quorum has no membership changes yet.)
    UnregisterBroker {
        id: BrokerId,
    },
    /// AlterUserScramCredentials (validated by the broker before proposing): each
    /// change upserts or deletes one user's credential of one mechanism, in order.
    AlterScramCredentials {
        changes: Vec<ScramChange>,
    },
    /// Replaces a group's explicit configs (validated by the broker before proposing);
    /// an empty set removes the group's entry.
    AlterGroupConfigs {
        group: String,
        configs: BTreeMap<String, String>,
    },
    /// CreateAcls (each binding validated by the broker before proposing, and again
    /// here): adds the bindings not already present.
    CreateAcls {
        acls: Vec<Acl>,
    },
    /// DeleteAcls: removes exactly these bindings (the ones the broker found matching
    /// the request's filters), any already gone being ignored.
    DeleteAcls {
        acls: Vec<Acl>,
    },
    /// AlterClientQuotas (each change validated by the broker, and again here): sets
    /// or removes one key of one entity, in order.
    AlterClientQuotas {
        changes: Vec<QuotaChange>,
    },
    /// [`Command::RegisterBroker`] (or `…InRack`) of a broker with several named
    /// listeners: `endpoints[0]` is its inter-broker listener, whose host and port the
    /// [`BrokerInfo`] keeps; the rest are kept in [`ClusterState::endpoints`] for the
    /// answers to clients that connected through them.
    RegisterBrokerListeners {
        id: BrokerId,
        incarnation: u64,
        rack: Option<String>,
        endpoints: Vec<Endpoint>,
    },
    /// [`Command::AddRemoteSegments`] as builds before [`RemoteSegment::last_epoch`]
    /// wrote it (still applied: the segments' last epochs are unknown).
    AddRemoteSegmentsV9 {
        topic: String,
        partition: i32,
        leader_epoch: i32,
        segments: Vec<legacy::RemoteSegmentV9>,
    },
    /// Remote retention or DeleteRecords: the remote log starts at `below` at the
    /// earliest; the segments wholly below it are forgotten (their objects are deleted
    /// after this commits).
    DeleteRemoteSegments {
        topic: String,
        partition: i32,
        below: i64,
    },
    /// Every object under `prefix` (a deleted topic's folder) is gone.
    RemotePurged {
        prefix: String,
    },
    /// The leader of `topic`/`partition` under `leader_epoch` finished copying these
    /// segments (in offset order) to the object store. Refused from a deposed leader
    /// (another epoch) and for a segment that does not extend the remote log.
    AddRemoteSegments {
        topic: String,
        partition: i32,
        leader_epoch: i32,
        segments: Vec<RemoteSegment>,
    },
    /// The leader of `topic`/`partition` under `leader_epoch` (elected uncleanly) found
    /// that the remote log may hold records its log does not from `from` on (see
    /// [`RemoteLog::agreed_end`]): the segments that start at or past it are forgotten
    /// (their objects are deleted after this commits), and one that straddles it is
    /// cut to end below it (its last epoch then unknown; its object keeps the rest,
    /// which no read returns). It uploads its own records from there. Refused from a
    /// deposed leader.
    TruncateRemoteSegments {
        topic: String,
        partition: i32,
        leader_epoch: i32,
        from: i64,
    },
}

/// One partition's reassignment in [`Command::Reassign`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Reassign {
    pub topic: String,
    pub partition: i32,
    /// The replicas to move to, in preference order; `None` cancels the ongoing move.
    pub target: Option<Vec<BrokerId>>,
}

/// The kinds of election ElectLeaders asks for (see [`ClusterState::election`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Election {
    /// Back to the first replica, if it is alive and in the ISR.
    Preferred,
    /// A leaderless partition takes any live replica, from outside the ISR if need be.
    Unclean,
}

/// One partition's ISR change in [`Command::AlterPartitions`], with the epochs the
/// leader computed it from (the fields of [`Command::AlterPartition`] but `from`).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IsrChange {
    pub topic: String,
    pub partition: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub new_isr: Vec<BrokerId>,
}

// The archived command's size is part of the journal format (see the module doc): a
// new variant larger than this would make every older entry unreadable.
const _: () = assert!(std::mem::size_of::<ArchivedCommand>() == 48);

/// What a successful [`ClusterState::apply`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Done,
    /// [`Command::AllocateProducerIds`] (and only it): the block handed out.
    ProducerIds(ProducerIdBlock),
    /// [`Command::RecordDirectory`] of a directory other than the recorded one: the
    /// broker's replicas were taken out of every ISR.
    DirectoryReplaced,
    /// [`Command::AlterPartitions`] and [`Command::Reassign`]: each change's own
    /// result, in the command's order.
    Partitions(Vec<Result<(), ApplyError>>),
}

/// Producer ids `first..first + count`, handed to one broker; never empty, and never
/// overlapping another block (blocks are carved from [`ClusterState`]'s next free id in
/// log order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdBlock {
    pub first: i64,
    pub count: i64,
}

/// A journal entry or snapshot that does not decode (the journal's CRCs catch
/// corruption; this is bytes of another format, or a bug).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("undecodable metadata command: {0}")]
    Command(rkyv::rancor::Error),
    #[error("undecodable metadata snapshot (format version {version}): {source}")]
    Snapshot {
        version: u8,
        source: rkyv::rancor::Error,
    },
    /// A snapshot of a format version this build does not know (a newer build's).
    #[error("metadata snapshot of format version {0}, which this build cannot read")]
    SnapshotVersion(u8),
}

/// Why a command was refused; the state is unchanged. Each maps to a Kafka error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("topic '{0}' already exists")]
    TopicAlreadyExists(String),
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("unknown broker {0}")]
    UnknownBroker(BrokerId),
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("invalid replication factor: {0}")]
    InvalidReplicationFactor(String),
    #[error("leader epoch {got} is not the current {current}")]
    FencedLeaderEpoch { got: i32, current: i32 },
    #[error("partition epoch {got} is not the current {current}")]
    InvalidUpdateVersion { got: i32, current: i32 },
    #[error("broker {0} is not the leader")]
    NotLeader(BrokerId),
    #[error("replica {0} cannot join the ISR (fenced or not a replica)")]
    IneligibleReplica(BrokerId),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the partition already has the leader the election would choose")]
    ElectionNotNeeded,
    #[error("the preferred replica is not alive or not in the ISR")]
    PreferredLeaderNotAvailable,
    #[error("no live replica can lead the partition")]
    EligibleLeadersNotAvailable,
    #[error("no reassignment of the partition is in progress")]
    NoReassignmentInProgress,
}

/// The object store folder of a topic's remote segments: `<topic>-<topic id in hex>/`
/// (the id keeps a re-created topic of the same name apart).
pub fn remote_topic_prefix(topic: &str, id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{topic}-{hex}/")
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        rkyv::to_bytes::<rkyv::rancor::Error>(self)
            .expect("commands always serialize")
            .to_vec()
    }

    /// Decodes with validation: a corrupt entry is an error, never undefined behaviour.
    pub fn decode(bytes: &[u8]) -> Result<Command, DecodeError> {
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
        aligned.extend_from_slice(bytes);
        rkyv::from_bytes::<Command, rkyv::rancor::Error>(&aligned).map_err(DecodeError::Command)
    }
}

impl ClusterState {
    /// The state as a snapshot.
    pub fn encode(&self) -> Vec<u8> {
        let body = rkyv::to_bytes::<rkyv::rancor::Error>(self).expect("state always serializes");
        let mut out = Vec::with_capacity(STATE_MAGIC.len() + body.len());
        out.extend_from_slice(STATE_MAGIC);
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a snapshot of any format version so far (see the module doc).
    pub fn decode(bytes: &[u8]) -> Result<ClusterState, DecodeError> {
        if bytes.is_empty() {
            return Ok(ClusterState::default());
        }
        // The magic without its version byte (6) and the padding byte after it.
        let (version, body) = match bytes.strip_prefix(&STATE_MAGIC[..6]) {
            Some([version, _, body @ ..]) => (*version, body),
            _ => (1, bytes),
        };
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(body.len());
        aligned.extend_from_slice(body);
        let failed = |source| DecodeError::Snapshot { version, source };
        match version {
            STATE_VERSION => {
                rkyv::from_bytes::<ClusterState, rkyv::rancor::Error>(&aligned).map_err(failed)
            }
            9 => rkyv::from_bytes::<legacy::ClusterStateV9, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            8 => rkyv::from_bytes::<legacy::ClusterStateV8, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            7 => rkyv::from_bytes::<legacy::ClusterStateV7, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            6 => rkyv::from_bytes::<legacy::ClusterStateV6, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            5 => rkyv::from_bytes::<legacy::ClusterStateV5, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            4 => rkyv::from_bytes::<legacy::ClusterStateV4, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            3 => rkyv::from_bytes::<legacy::ClusterStateV3, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            2 => rkyv::from_bytes::<legacy::ClusterStateV2, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            1 => rkyv::from_bytes::<legacy::ClusterStateV1, rkyv::rancor::Error>(&aligned)
                .map(ClusterState::from)
                .map_err(failed),
            other => Err(DecodeError::SnapshotVersion(other)),
        }
    }

    /// The dynamic broker config `name` in effect on `broker`: its own value, else the
    /// cluster-wide default (Kafka's precedence); `None` when neither is set.
    pub fn dynamic_broker_config(&self, broker: BrokerId, name: &str) -> Option<&str> {
        [broker, CLUSTER_DEFAULT]
            .iter()
            .find_map(|scope| self.broker_configs.get(scope)?.get(name))
            .map(String::as_str)
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionState> {
        self.topics
            .get(topic)?
            .partitions
            .get(usize::try_from(partition).ok()?)
    }

    /// The partition's leader epoch is `leader_epoch`: a command about its remote log
    /// comes from its current leader.
    fn remote_leader(
        &self,
        topic: &str,
        partition: i32,
        leader_epoch: i32,
    ) -> Result<(), ApplyError> {
        let p = self
            .partition(topic, partition)
            .ok_or(ApplyError::UnknownTopicOrPartition)?;
        if p.leader_epoch != leader_epoch {
            return Err(ApplyError::FencedLeaderEpoch {
                got: leader_epoch,
                current: p.leader_epoch,
            });
        }
        Ok(())
    }

    /// [`Command::AddRemoteSegments`].
    fn add_remote_segments(
        &mut self,
        topic: &str,
        partition: i32,
        leader_epoch: i32,
        segments: &[RemoteSegment],
    ) -> Result<(), ApplyError> {
        self.remote_leader(topic, partition, leader_epoch)?;
        let log = self
            .remote
            .entry(topic.to_string())
            .or_default()
            .entry(partition)
            .or_default();
        let mut end = log.end_offset().unwrap_or(i64::MIN).max(log.log_start);
        for seg in segments {
            if seg.last_offset < seg.base_offset || seg.last_offset < end {
                return Err(ApplyError::InvalidRequest(format!(
                    "remote segment {}..={} does not extend the remote log (ends at {end})",
                    seg.base_offset, seg.last_offset
                )));
            }
            end = seg.last_offset + 1;
        }
        log.segments.extend(segments.iter().cloned());
        Ok(())
    }

    fn partition_mut(
        &mut self,
        topic: &str,
        partition: i32,
    ) -> Result<(&BTreeMap<String, String>, &mut PartitionState), ApplyError> {
        let t = self
            .topics
            .get_mut(topic)
            .ok_or(ApplyError::UnknownTopicOrPartition)?;
        let p = usize::try_from(partition)
            .ok()
            .and_then(|i| t.partitions.get_mut(i))
            .ok_or(ApplyError::UnknownTopicOrPartition)?;
        Ok((&t.configs, p))
    }

    pub fn is_alive(&self, id: BrokerId) -> bool {
        self.brokers.get(&id).is_some_and(|b| !b.fenced)
    }

    /// Unfenced brokers, ascending by id.
    pub fn live_brokers(&self) -> Vec<BrokerId> {
        self.brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.id)
            .collect()
    }

    /// Replica assignments for `count` new partitions starting at index `first`, over
    /// the live brokers: partition `p` gets the brokers at positions `start + p + j`
    /// (`j < rf`), so leaders (position 0) and replicas spread evenly. `start` is
    /// chosen by count ([`ClusterState::balanced_start`]): the one that leaves the
    /// fewest preferred leaders, then the fewest replicas, on the busiest live broker,
    /// counting every partition already placed, so topics of any size add up to a
    /// spread within one per broker. `rf` of -1 means the default, min(3, live brokers).
    pub fn place(&self, first: i32, count: i32, rf: i16) -> Result<Vec<Vec<BrokerId>>, ApplyError> {
        let live = self.live_brokers();
        if live.is_empty() {
            return Err(ApplyError::InvalidReplicationFactor(
                "no live brokers to place replicas on".into(),
            ));
        }
        let rf = if rf == -1 {
            live.len().min(3)
        } else if rf < 1 {
            return Err(ApplyError::InvalidReplicationFactor(format!(
                "Replication factor must be larger than 0, got {rf}"
            )));
        } else {
            rf as usize
        };
        if rf > live.len() {
            return Err(ApplyError::InvalidReplicationFactor(format!(
                "Replication factor: {rf} larger than available brokers: {}.",
                live.len()
            )));
        }
        let racks = live.iter().any(|id| self.brokers[id].rack.is_some());
        let order = if racks {
            self.rack_alternating(&live)
        } else {
            live
        };
        let one = |n: usize| -> Vec<BrokerId> {
            if racks {
                self.rack_spread(&order, n, rf)
            } else {
                (0..rf).map(|j| order[(n + j) % order.len()]).collect()
            }
        };
        // With racks the followers' walk also shifts once per round of partitions.
        let len = order.len();
        let starts = if racks { len * (len - 1).max(1) } else { len };
        let start = self.balanced_start(&order, starts.min(256), first, count, &one);
        Ok((first..first + count)
            .map(|p| one(start + p as usize))
            .collect())
    }

    /// Of the first `starts` starting positions, the one whose placement of partitions
    /// `first..first + count` (`one(start + p)`) leaves the live brokers of `order` with
    /// the most even counts of preferred leaders (first replicas), then of replicas,
    /// counted over every partition already placed. Ties keep the topic's number among
    /// the topics as the start (what placement did before it counted), so an empty
    /// cluster places as it always has.
    fn balanced_start(
        &self,
        order: &[BrokerId],
        starts: usize,
        first: i32,
        count: i32,
        one: &dyn Fn(usize) -> Vec<BrokerId>,
    ) -> usize {
        let len = order.len();
        let index: BTreeMap<BrokerId, usize> =
            order.iter().enumerate().map(|(i, b)| (*b, i)).collect();
        let mut leaders = vec![0usize; len];
        let mut replicas = vec![0usize; len];
        for p in self.topics.values().flat_map(|t| &t.partitions) {
            for (j, b) in p.replicas.iter().enumerate() {
                if let Some(&i) = index.get(b) {
                    replicas[i] += 1;
                    if j == 0 {
                        leaders[i] += 1;
                    }
                }
            }
        }
        let spread = |v: &[usize]| {
            v.iter().max().copied().unwrap_or(0) - v.iter().min().copied().unwrap_or(0)
        };
        let preferred = self.topics.len() % starts.max(1);
        let mut best: Option<((usize, usize, usize, usize), usize)> = None;
        for k in 0..starts.max(1) {
            let s = (preferred + k) % starts.max(1);
            let (mut l, mut r) = (leaders.clone(), replicas.clone());
            for p in first..first + count {
                for (j, b) in one(s + p as usize).iter().enumerate() {
                    let i = index[b];
                    r[i] += 1;
                    if j == 0 {
                        l[i] += 1;
                    }
                }
            }
            let score = (
                spread(&l),
                spread(&r),
                l.iter().max().copied().unwrap_or(0),
                r.iter().max().copied().unwrap_or(0),
            );
            if best.as_ref().is_none_or(|(b, _)| score < *b) {
                best = Some((score, s));
            }
        }
        best.map_or(preferred, |(_, s)| s)
    }

    /// `brokers` ordered so that racks alternate: the first broker of each rack (racks
    /// by name), then the second of each, and so on. Walking this list, consecutive
    /// brokers are in different racks as long as racks have brokers left. Brokers
    /// without a rack count as one rack of their own (as Kafka's KRaft placer does).
    fn rack_alternating(&self, brokers: &[BrokerId]) -> Vec<BrokerId> {
        let mut racks: BTreeMap<Option<&str>, Vec<BrokerId>> = BTreeMap::new();
        for id in brokers {
            racks
                .entry(self.brokers[id].rack.as_deref())
                .or_default()
                .push(*id);
        }
        let deepest = racks.values().map(Vec::len).max().unwrap_or(0);
        (0..deepest)
            .flat_map(|i| racks.values().filter_map(move |r| r.get(i).copied()))
            .collect()
    }

    /// The `rf` replicas of the partition numbered `n` (topic offset included) over the
    /// rack-alternating list: the leader is `arranged[n % len]`, so leaders rotate over
    /// every broker and racks; followers are taken walking on from a position that
    /// shifts once per round of partitions (so a leader's followers vary), each from a
    /// rack that has no replica yet while any such rack is left, then from any.
    fn rack_spread(&self, arranged: &[BrokerId], n: usize, rf: usize) -> Vec<BrokerId> {
        let len = arranged.len();
        let rack_of = |id: &BrokerId| self.brokers[id].rack.as_deref();
        let rack_count = {
            let mut racks: Vec<Option<&str>> = arranged.iter().map(rack_of).collect();
            racks.sort_unstable();
            racks.dedup();
            racks.len()
        };
        let leader = n % len;
        let shift = if len > 1 { (n / len) % (len - 1) } else { 0 };
        let mut replicas = vec![arranged[leader]];
        let mut racks_used = vec![rack_of(&arranged[leader])];
        // Two passes over the other brokers: first only unused racks, then any.
        for pass in 0..2 {
            for k in 0..len - 1 {
                if replicas.len() == rf {
                    return replicas;
                }
                let b = arranged[(leader + 1 + (shift + k) % (len - 1)) % len];
                let new_rack = !racks_used.contains(&rack_of(&b));
                let wanted = pass == 1 || new_rack || racks_used.len() == rack_count;
                if wanted && !replicas.contains(&b) {
                    replicas.push(b);
                    racks_used.push(rack_of(&b));
                }
            }
        }
        assert_eq!(replicas.len(), rf, "rf <= live brokers is checked by place");
        replicas
    }

    /// Checks one partition's manual replica assignment (a client's explicit list), by
    /// Kafka's rules: not empty, every broker registered, no broker twice, `rf`
    /// replicas when the topic's replication factor is already known, and at least
    /// one of them unfenced (a partition must start with a leader).
    pub fn check_manual_assignment(
        &self,
        partition: i32,
        replicas: &[BrokerId],
        rf: Option<usize>,
    ) -> Result<(), ApplyError> {
        let bad = |m: String| Err(ApplyError::InvalidReplicaAssignment(m));
        if replicas.is_empty() {
            return bad(format!("partition {partition}: the replica list is empty"));
        }
        let mut sorted = replicas.to_vec();
        sorted.sort_unstable();
        for (i, b) in sorted.iter().enumerate() {
            if !self.brokers.contains_key(b) {
                return bad(format!(
                    "partition {partition}: broker {b} is not registered"
                ));
            }
            if i > 0 && sorted[i - 1] == *b {
                return bad(format!("partition {partition}: broker {b} is listed twice"));
            }
        }
        if let Some(rf) = rf.filter(|rf| *rf != replicas.len()) {
            return bad(format!(
                "partition {partition} has {} replicas, the other partitions {rf}",
                replicas.len()
            ));
        }
        if !replicas.iter().any(|b| self.is_alive(*b)) {
            return bad(format!(
                "partition {partition}: every broker of its assignment is fenced"
            ));
        }
        Ok(())
    }

    /// Applies one committed command. Deterministic: same state + same command gives
    /// the same result on every voter. Refused commands leave the state unchanged.
    pub fn apply(&mut self, cmd: &Command) -> Result<Applied, ApplyError> {
        let r = self.apply_inner(cmd);
        // A batch whose every change was refused changed nothing either.
        let changed = match &r {
            Ok(Applied::Partitions(results)) => results.iter().any(Result::is_ok),
            r => r.is_ok(),
        };
        if changed {
            self.complete_reassignments();
            self.version += 1;
        }
        r
    }

    fn apply_inner(&mut self, cmd: &Command) -> Result<Applied, ApplyError> {
        match cmd {
            Command::Init { cluster_id } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                }
            }
            Command::RegisterBroker {
                id,
                host,
                port,
                incarnation,
            } => {
                self.register(*id, host, *port, *incarnation, None);
                self.endpoints.remove(id);
            }
            Command::RegisterBrokerInRack {
                id,
                host,
                port,
                incarnation,
                rack,
            } => {
                self.register(*id, host, *port, *incarnation, Some(rack));
                self.endpoints.remove(id);
            }
            Command::AlterBrokerConfigs { scope, configs } => {
                if *scope != CLUSTER_DEFAULT && !self.brokers.contains_key(scope) {
                    return Err(ApplyError::UnknownBroker(*scope));
                }
                if configs.is_empty() {
                    self.broker_configs.remove(scope);
                } else {
                    self.broker_configs.insert(*scope, configs.clone());
                }
            }
            Command::FenceBroker { id } => {
                if !self.brokers.contains_key(id) {
                    return Err(ApplyError::UnknownBroker(*id));
                }
                self.fence(*id);
            }
            Command::UnfenceBroker { id } => {
                if !self.brokers.contains_key(id) {
                    return Err(ApplyError::UnknownBroker(*id));
                }
                self.unfence(*id);
            }
            Command::CreateTopic {
                name,
                id,
                configs,
                assignments,
            } => {
                if self.topics.contains_key(name) {
                    return Err(ApplyError::TopicAlreadyExists(name.clone()));
                }
                let mut partitions = assignments
                    .iter()
                    .map(|r| self.new_partition(r))
                    .collect::<Result<Vec<_>, _>>()?;
                if partitions.is_empty() {
                    return Err(ApplyError::InvalidRequest("no partitions".into()));
                }
                self.give_slots(&mut partitions);
                self.topics.insert(
                    name.clone(),
                    TopicState {
                        id: *id,
                        configs: configs.clone(),
                        partitions,
                    },
                );
            }
            Command::DeleteTopic { name } => {
                let t = self
                    .topics
                    .remove(name)
                    .ok_or(ApplyError::UnknownTopicOrPartition)?;
                self.reassignments.remove(name);
                if self.remote.remove(name).is_some() {
                    self.remote_purge.push(remote_topic_prefix(name, &t.id));
                }
            }
            Command::Reassign { changes } => {
                let results = changes.iter().map(|c| self.reassign(c)).collect();
                return Ok(Applied::Partitions(results));
            }
            Command::UnregisterBroker { id } => {
                let b = self.brokers.get(id).ok_or(ApplyError::UnknownBroker(*id))?;
                if !b.fenced {
                    return Err(ApplyError::InvalidRequest(format!(
                        "broker {id} is live: stop it before unregistering it"
                    )));
                }
                let holding = self
                    .topics
                    .values()
                    .flat_map(|t| &t.partitions)
                    .filter(|p| p.replicas.contains(id))
                    .count();
                if holding > 0 {
                    return Err(ApplyError::InvalidRequest(format!(
                        "broker {id} still holds replicas of {holding} partitions: move them first (sluice cluster decommission)"
                    )));
                }
                self.brokers.remove(id);
                self.directories.remove(id);
                self.broker_configs.remove(id);
                self.endpoints.remove(id);
            }
            Command::AlterScramCredentials { changes } => {
                for c in changes {
                    if c.user.is_empty() {
                        return Err(ApplyError::InvalidRequest("an empty user name".into()));
                    }
                }
                for c in changes {
                    let creds = self.scram.entry(c.user.clone()).or_default();
                    match &c.credential {
                        Some(_) if c.only_if_absent && creds.contains_key(&c.mechanism) => {}
                        Some(cred) => {
                            creds.insert(c.mechanism, cred.clone());
                        }
                        None => {
                            creds.remove(&c.mechanism);
                        }
                    }
                    if creds.is_empty() {
                        self.scram.remove(&c.user);
                    }
                }
            }
            Command::AlterGroupConfigs { group, configs } => {
                if group.is_empty() {
                    return Err(ApplyError::InvalidRequest("an empty group id".into()));
                }
                if configs.is_empty() {
                    self.group_configs.remove(group);
                } else {
                    self.group_configs.insert(group.clone(), configs.clone());
                }
            }
            Command::CreateAcls { acls } => {
                if let Some(e) = acls.iter().find_map(|a| a.validate().err()) {
                    return Err(ApplyError::InvalidRequest(e));
                }
                for a in acls {
                    if let Err(at) = self.acls.binary_search(a) {
                        self.acls.insert(at, a.clone());
                    }
                }
            }
            Command::DeleteAcls { acls } => {
                self.acls.retain(|a| !acls.contains(a));
            }
            Command::AlterClientQuotas { changes } => {
                if let Some(e) = changes.iter().find_map(|c| crate::quota::validate(c).err()) {
                    return Err(ApplyError::InvalidRequest(e));
                }
                crate::quota::apply(&mut self.quotas, changes);
            }
            Command::AddRemoteSegmentsV9 {
                topic,
                partition,
                leader_epoch,
                segments,
            } => {
                let segments: Vec<RemoteSegment> =
                    segments.iter().cloned().map(RemoteSegment::from).collect();
                self.add_remote_segments(topic, *partition, *leader_epoch, &segments)?;
            }
            Command::AddRemoteSegments {
                topic,
                partition,
                leader_epoch,
                segments,
            } => self.add_remote_segments(topic, *partition, *leader_epoch, segments)?,
            Command::TruncateRemoteSegments {
                topic,
                partition,
                leader_epoch,
                from,
            } => {
                self.remote_leader(topic, *partition, *leader_epoch)?;
                if let Some(log) = self
                    .remote
                    .get_mut(topic)
                    .and_then(|t| t.get_mut(partition))
                {
                    log.truncate(*from);
                }
            }
            Command::DeleteRemoteSegments {
                topic,
                partition,
                below,
            } => {
                let log = self
                    .remote
                    .get_mut(topic)
                    .and_then(|t| t.get_mut(partition))
                    .ok_or(ApplyError::UnknownTopicOrPartition)?;
                log.segments.retain(|s| s.last_offset >= *below);
                log.log_start = log.log_start.max(*below);
            }
            Command::RemotePurged { prefix } => {
                self.remote_purge.retain(|p| p != prefix);
            }
            Command::RegisterBrokerListeners {
                id,
                incarnation,
                rack,
                endpoints,
            } => {
                let Some(first) = endpoints.first() else {
                    return Err(ApplyError::InvalidRequest(format!(
                        "broker {id} registered no listener"
                    )));
                };
                for (i, e) in endpoints.iter().enumerate() {
                    if e.listener.is_empty() || !(0..=3).contains(&e.security_protocol) {
                        return Err(ApplyError::InvalidRequest(format!(
                            "broker {id}: listener {:?} with security protocol {}",
                            e.listener, e.security_protocol
                        )));
                    }
                    if endpoints[..i].iter().any(|o| o.listener == e.listener) {
                        return Err(ApplyError::InvalidRequest(format!(
                            "broker {id} registered listener {} twice",
                            e.listener
                        )));
                    }
                }
                self.register(*id, &first.host, first.port, *incarnation, rack.as_ref());
                self.endpoints.insert(*id, endpoints.clone());
            }
            Command::RecordDirectory { id, directory } => {
                if directory.is_empty() {
                    return Err(ApplyError::InvalidRequest("an empty directory id".into()));
                }
                let replaced = self.directories.get(id).is_some_and(|d| d != directory);
                if replaced {
                    self.lose_replicas(*id);
                }
                self.directories.insert(*id, directory.clone());
                if replaced {
                    return Ok(Applied::DirectoryReplaced);
                }
            }
            Command::CreatePartitions {
                name,
                existing,
                assignments,
            } => {
                let Some(t) = self.topics.get(name) else {
                    return Err(ApplyError::UnknownTopicOrPartition);
                };
                if t.partitions.len() != *existing as usize {
                    return Err(ApplyError::InvalidRequest(format!(
                        "topic has {} partitions, not {existing}",
                        t.partitions.len()
                    )));
                }
                let mut new = assignments
                    .iter()
                    .map(|r| self.new_partition(r))
                    .collect::<Result<Vec<_>, _>>()?;
                self.give_slots(&mut new);
                let t = self.topics.get_mut(name).expect("checked above");
                t.partitions.extend(new);
            }
            Command::AlterConfigs { name, configs } => {
                let t = self
                    .topics
                    .get_mut(name)
                    .ok_or(ApplyError::UnknownTopicOrPartition)?;
                t.configs = configs.clone();
            }
            Command::AlterPartition {
                from,
                topic,
                partition,
                leader_epoch,
                partition_epoch,
                new_isr,
            } => {
                let alive = self.live_brokers();
                self.alter_partition(
                    *from,
                    &IsrChange {
                        topic: topic.clone(),
                        partition: *partition,
                        leader_epoch: *leader_epoch,
                        partition_epoch: *partition_epoch,
                        new_isr: new_isr.clone(),
                    },
                    &alive,
                )?;
            }
            Command::AlterPartitions { from, changes } => {
                if changes.is_empty() {
                    return Err(ApplyError::InvalidRequest("no ISR changes".into()));
                }
                // Fencing is a command of its own: liveness cannot move within a batch.
                let alive = self.live_brokers();
                let results = changes
                    .iter()
                    .map(|c| self.alter_partition(*from, c, &alive))
                    .collect();
                return Ok(Applied::Partitions(results));
            }
            Command::ElectPreferred { topic, partition } => {
                let (leader, isr) = self.election(topic, *partition, Election::Preferred)?;
                self.elect(topic, *partition, leader, isr)?;
            }
            Command::ElectUnclean { topic, partition } => {
                let (leader, isr) = self.election(topic, *partition, Election::Unclean)?;
                self.elect(topic, *partition, leader, isr)?;
            }
            Command::AllocateProducerIds { broker, count } => {
                if !self.brokers.contains_key(broker) {
                    return Err(ApplyError::UnknownBroker(*broker));
                }
                if !(1..=1_000_000).contains(count) {
                    return Err(ApplyError::InvalidRequest(format!(
                        "producer id block of {count}"
                    )));
                }
                let block = ProducerIdBlock {
                    first: self.next_producer_id,
                    count: *count,
                };
                self.next_producer_id += count;
                return Ok(Applied::ProducerIds(block));
            }
            Command::ReplicaOffline {
                broker,
                topic,
                partition,
            } => {
                let alive = self.live_brokers();
                let (_, p) = self.partition_mut(topic, *partition)?;
                if !p.replicas.contains(broker) {
                    return Err(ApplyError::IneligibleReplica(*broker));
                }
                let successor = p
                    .replicas
                    .iter()
                    .copied()
                    .find(|r| r != broker && p.isr.contains(r) && alive.contains(r));
                match successor {
                    Some(next) => {
                        p.isr.retain(|r| r != broker);
                        if p.leader == *broker {
                            p.leader = next;
                            p.leader_epoch += 1;
                        }
                        p.partition_epoch += 1;
                    }
                    None if p.leader == *broker => {
                        p.leader_epoch += 1;
                        p.partition_epoch += 1;
                    }
                    None => {}
                }
            }
        }
        Ok(Applied::Done)
    }

    /// One leader's ISR change ([`Command::AlterPartition`]): refused unless `from` leads
    /// in the named leader epoch and the partition epoch is current, and every replica
    /// joining the ISR is an assigned, live (`alive`) broker.
    fn alter_partition(
        &mut self,
        from: BrokerId,
        change: &IsrChange,
        alive: &[BrokerId],
    ) -> Result<(), ApplyError> {
        let IsrChange {
            topic,
            partition,
            leader_epoch,
            partition_epoch,
            new_isr,
        } = change;
        let (_, p) = self.partition_mut(topic, *partition)?;
        if *leader_epoch != p.leader_epoch {
            return Err(ApplyError::FencedLeaderEpoch {
                got: *leader_epoch,
                current: p.leader_epoch,
            });
        }
        if p.leader != from {
            return Err(ApplyError::NotLeader(from));
        }
        if *partition_epoch != p.partition_epoch {
            return Err(ApplyError::InvalidUpdateVersion {
                got: *partition_epoch,
                current: p.partition_epoch,
            });
        }
        if !new_isr.contains(&from) {
            return Err(ApplyError::InvalidRequest(
                "the new ISR must contain the leader".into(),
            ));
        }
        let mut seen = Vec::new();
        for r in new_isr {
            if seen.contains(r) {
                return Err(ApplyError::InvalidRequest(format!(
                    "replica {r} listed twice in the ISR"
                )));
            }
            seen.push(*r);
            let joining = !p.isr.contains(r);
            if !p.replicas.contains(r) || (joining && !alive.contains(r)) {
                return Err(ApplyError::IneligibleReplica(*r));
            }
        }
        p.isr = new_isr.clone();
        p.partition_epoch += 1;
        Ok(())
    }

    /// A broker (re)registers; a new incarnation is a restart (see the module doc).
    fn register(
        &mut self,
        id: BrokerId,
        host: &str,
        port: i32,
        incarnation: u64,
        rack: Option<&String>,
    ) {
        let restarted = self
            .brokers
            .get(&id)
            .is_some_and(|b| b.incarnation != incarnation);
        if restarted {
            self.fence(id);
        }
        let b = self.brokers.entry(id).or_insert_with(|| BrokerInfo {
            id,
            host: String::new(),
            port: 0,
            incarnation,
            fenced: true,
            rack: None,
        });
        b.host = host.to_string();
        b.port = port;
        b.incarnation = incarnation;
        b.rack = rack.cloned();
        self.unfence(id);
    }

    /// A new partition led by its first replica, all replicas in the ISR.
    fn new_partition(&self, replicas: &[BrokerId]) -> Result<PartitionState, ApplyError> {
        if replicas.is_empty() {
            return Err(ApplyError::InvalidReplicaAssignment(
                "a partition needs at least one replica".into(),
            ));
        }
        for (i, r) in replicas.iter().enumerate() {
            if !self.brokers.contains_key(r) {
                return Err(ApplyError::InvalidReplicaAssignment(format!(
                    "unknown broker {r}"
                )));
            }
            if replicas[..i].contains(r) {
                return Err(ApplyError::InvalidReplicaAssignment(format!(
                    "broker {r} listed twice"
                )));
            }
        }
        let isr: Vec<BrokerId> = replicas
            .iter()
            .copied()
            .filter(|r| self.is_alive(*r))
            .collect();
        let leader = isr.first().copied().unwrap_or(NO_BROKER);
        Ok(PartitionState {
            replicas: replicas.to_vec(),
            isr: if isr.is_empty() {
                replicas.to_vec()
            } else {
                isr
            },
            leader,
            leader_epoch: 0,
            partition_epoch: 0,
            slots: Vec::new(),
        })
    }

    /// Gives every replica of `partitions` (new, in partition order, already checked)
    /// the next slot of its broker (see the module doc).
    fn give_slots(&mut self, partitions: &mut [PartitionState]) {
        for p in partitions {
            p.slots = p.replicas.iter().map(|b| self.next_slot(*b)).collect();
        }
    }

    /// The next slot of broker `b` (see the module doc).
    fn next_slot(&mut self, b: BrokerId) -> u64 {
        let next = self.replicas_placed.entry(b).or_insert(0);
        *next += 1;
        *next - 1
    }

    /// The ongoing reassignment of a partition, if any.
    pub fn reassignment(&self, topic: &str, partition: i32) -> Option<&Reassignment> {
        self.reassignments.get(topic)?.get(&partition)
    }

    /// Starts, replaces or cancels one partition's reassignment (see the module doc).
    fn reassign(&mut self, change: &Reassign) -> Result<(), ApplyError> {
        let Reassign {
            topic,
            partition,
            target,
        } = change;
        let mut p = self
            .partition(topic, *partition)
            .ok_or(ApplyError::UnknownTopicOrPartition)?
            .clone();
        let ongoing = self.reassignment(topic, *partition).cloned();
        let before = p.replicas.clone();
        let moving = match target {
            Some(target) => {
                self.check_target(*partition, target)?;
                let removing = without(&p.replicas, target);
                let adding = without(target, &p.replicas);
                let merged: Vec<BrokerId> = target.iter().chain(&removing).copied().collect();
                if removing.is_empty() && merged == p.replicas && ongoing.is_none() {
                    return Ok(()); // already there
                }
                self.set_replicas(&mut p, merged);
                (!adding.is_empty() || !removing.is_empty())
                    .then_some(Reassignment { adding, removing })
            }
            None => {
                let ongoing = ongoing.ok_or(ApplyError::NoReassignmentInProgress)?;
                let original = ongoing.original(&p.replicas);
                let mut isr = without(&p.isr, &ongoing.adding);
                if isr.is_empty() {
                    // Only added replicas were in sync: going back means electing
                    // outside the ISR (as Kafka's revert, refused unless allowed).
                    let configs = &self.topics[topic].configs;
                    if !unclean_allowed(configs, self.default_unclean()) {
                        return Err(ApplyError::InvalidReplicaAssignment(format!(
                            "reverting partition {partition}'s reassignment would need an unclean leader election"
                        )));
                    }
                    isr = vec![original[0]];
                }
                p.isr = isr;
                self.set_replicas(&mut p, original);
                None
            }
        };
        let dropped =
            p.replicas.len() < before.len() || !before.iter().all(|b| p.replicas.contains(b));
        self.elect_within_replicas(&mut p, dropped);
        p.partition_epoch += 1;
        let (_, stored) = self.partition_mut(topic, *partition)?;
        *stored = p;
        let ongoing = self.reassignments.entry(topic.clone()).or_default();
        match moving {
            Some(m) => {
                ongoing.insert(*partition, m);
            }
            None => {
                ongoing.remove(partition);
                if ongoing.is_empty() {
                    self.reassignments.remove(topic);
                }
            }
        }
        Ok(())
    }

    /// A reassignment's target, by Kafka's rules for one: not empty, no broker twice,
    /// every broker registered.
    fn check_target(&self, partition: i32, target: &[BrokerId]) -> Result<(), ApplyError> {
        let bad = |m: String| Err(ApplyError::InvalidReplicaAssignment(m));
        if target.is_empty() {
            return bad(format!(
                "partition {partition}: the target replica list is empty"
            ));
        }
        for (i, b) in target.iter().enumerate() {
            if target[..i].contains(b) {
                return bad(format!("partition {partition}: broker {b} is listed twice"));
            }
            if !self.brokers.contains_key(b) {
                return bad(format!(
                    "partition {partition}: broker {b} is not registered"
                ));
            }
        }
        Ok(())
    }

    /// Gives `p` the replica set `replicas`, each replica keeping its slot and each new
    /// one taking its broker's next (partitions without slots stay without).
    fn set_replicas(&mut self, p: &mut PartitionState, replicas: Vec<BrokerId>) {
        if !p.slots.is_empty() {
            p.slots = replicas
                .iter()
                .map(|b| p.slot_of(*b).unwrap_or_else(|| self.next_slot(*b)))
                .collect();
        }
        p.isr.retain(|b| replicas.contains(b));
        p.replicas = replicas;
    }

    /// A partition whose leader is no longer one of its replicas (or left the ISR)
    /// takes the first live ISR member in replica order, else none, in a new epoch.
    /// `dropped`: replicas left the set, which also takes a new leader epoch (as
    /// Kafka's controller does), so that nothing a removed replica asked under the old
    /// epoch (a fetch still on its way) counts once it is added back with an empty log.
    fn elect_within_replicas(&self, p: &mut PartitionState, dropped: bool) {
        let keeps =
            p.leader != NO_BROKER && p.replicas.contains(&p.leader) && p.isr.contains(&p.leader);
        if keeps {
            if dropped {
                p.leader_epoch += 1;
            }
            return;
        }
        let next = p
            .replicas
            .iter()
            .copied()
            .find(|r| p.isr.contains(r) && self.is_alive(*r));
        p.leader = next.unwrap_or(NO_BROKER);
        p.leader_epoch += 1;
    }

    /// Completes every reassignment whose target replicas are all in the ISR.
    fn complete_reassignments(&mut self) {
        let done: Vec<(String, i32, Vec<BrokerId>)> = self
            .reassignments
            .iter()
            .flat_map(|(topic, parts)| parts.iter().map(move |(p, r)| (topic, *p, r)))
            .filter_map(|(topic, i, r)| {
                let p = self.partition(topic, i)?;
                let target = r.target(&p.replicas);
                target
                    .iter()
                    .all(|b| p.isr.contains(b))
                    .then(|| (topic.clone(), i, target))
            })
            .collect();
        for (topic, i, target) in done {
            if let Some(mut p) = self.partition(&topic, i).cloned() {
                let dropped = target.len() < p.replicas.len();
                self.set_replicas(&mut p, target);
                self.elect_within_replicas(&mut p, dropped);
                p.partition_epoch += 1;
                if let Ok((_, stored)) = self.partition_mut(&topic, i) {
                    *stored = p;
                }
            }
            if let Some(parts) = self.reassignments.get_mut(&topic) {
                parts.remove(&i);
                if parts.is_empty() {
                    self.reassignments.remove(&topic);
                }
            }
        }
    }

    /// The cluster-wide `unclean.leader.election.enable`.
    fn default_unclean(&self) -> bool {
        self.dynamic_broker_config(CLUSTER_DEFAULT, UNCLEAN_ELECTION) == Some("true")
    }

    /// Whether fencing `id` now would elect, for some partition it leads, a replica
    /// outside the ISR (no other live in-sync replica, unclean election allowed): a
    /// controlled shutdown must not do that to a broker that still holds the only
    /// in-sync copy.
    pub fn fencing_elects_unclean(&self, id: BrokerId) -> bool {
        let alive = self.live_brokers();
        let default_unclean = self.default_unclean();
        self.topics.values().any(|t| {
            unclean_allowed(&t.configs, default_unclean)
                && t.partitions
                    .iter()
                    .any(|p| p.leader == id && !p.isr.iter().any(|r| *r != id && alive.contains(r)))
        })
    }

    /// Marks `id` fenced, takes it out of every ISR it is not the last member of, moves
    /// its leaderships to live ISR members (or leaves the partition leaderless), and
    /// gives every partition it is a replica of a new partition epoch.
    fn fence(&mut self, id: BrokerId) {
        if let Some(b) = self.brokers.get_mut(&id) {
            b.fenced = true;
        }
        let alive = self.live_brokers();
        let default_unclean = self.default_unclean();
        for t in self.topics.values_mut() {
            let unclean = unclean_allowed(&t.configs, default_unclean);
            for p in &mut t.partitions {
                let mut changed = false;
                if p.isr.contains(&id) && p.isr.len() > 1 {
                    p.isr.retain(|r| *r != id);
                    changed = true;
                }
                if p.leader == id {
                    let next = p
                        .replicas
                        .iter()
                        .copied()
                        .find(|r| *r != id && p.isr.contains(r) && alive.contains(r));
                    match next {
                        Some(n) => p.leader = n,
                        None if unclean => {
                            match p.replicas.iter().copied().find(|r| alive.contains(r)) {
                                Some(n) => {
                                    p.leader = n;
                                    p.isr = vec![n];
                                }
                                None => p.leader = NO_BROKER,
                            }
                        }
                        None => p.leader = NO_BROKER,
                    }
                    p.leader_epoch += 1;
                    changed = true;
                }
                // Every partition it is a replica of takes a new partition epoch, even
                // one it was only catching up on: an ISR change that would add it,
                // computed before the fence (its leader drops such a pending change
                // and stops counting it), must be refused if a copy arrives after it
                // registers again (KIP-497).
                if changed || p.replicas.contains(&id) {
                    p.partition_epoch += 1;
                }
            }
        }
    }

    /// Broker `id`'s data directory is lost (see [`Command::RecordDirectory`]): fenced,
    /// out of every ISR, and every partition it is a replica of in new epochs.
    fn lose_replicas(&mut self, id: BrokerId) {
        if self.brokers.contains_key(&id) {
            self.fence(id);
        }
        for t in self.topics.values_mut() {
            for p in &mut t.partitions {
                if !p.replicas.contains(&id) {
                    continue;
                }
                if p.isr == [id] {
                    p.isr.clear();
                    if p.leader == id {
                        p.leader = NO_BROKER;
                    }
                }
                // Every partition it holds a replica of takes new epochs: an ISR
                // change its leader computed from the lost replica's fetches (or a
                // fetch of the old process still on its way) must not count for the
                // empty one.
                p.leader_epoch += 1;
                p.partition_epoch += 1;
            }
        }
    }

    /// Marks `id` live and makes it leader of the leaderless partitions whose ISR
    /// holds it (clean election). Unclean topics also take it if it is any replica.
    fn unfence(&mut self, id: BrokerId) {
        match self.brokers.get_mut(&id) {
            Some(b) => b.fenced = false,
            None => return,
        }
        let default_unclean = self.default_unclean();
        for t in self.topics.values_mut() {
            let unclean = unclean_allowed(&t.configs, default_unclean);
            for p in &mut t.partitions {
                if p.leader != NO_BROKER || !p.replicas.contains(&id) {
                    continue;
                }
                if p.isr.contains(&id) {
                    p.leader = id;
                } else if unclean {
                    p.leader = id;
                    p.isr = vec![id];
                } else {
                    continue;
                }
                p.leader_epoch += 1;
                p.partition_epoch += 1;
            }
        }
    }

    /// Partitions whose preferred replica is alive, in the ISR and not leading: the
    /// controller proposes [`Command::ElectPreferred`] for them.
    pub fn preferred_elections(&self) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        for (name, t) in &self.topics {
            for i in 0..t.partitions.len() as i32 {
                if self.election(name, i, Election::Preferred).is_ok() {
                    out.push((name.clone(), i));
                }
            }
        }
        out
    }

    /// Who an election of `kind` would make leader of the partition, and the ISR it
    /// would then have if that changes (an unclean choice from outside the ISR); or
    /// why there is no such election, as Kafka's controller answers ElectLeaders: a
    /// preferred election is not needed while the preferred replica leads and not
    /// possible unless it is alive and in the ISR; an unclean one is not needed while
    /// the partition has a leader and not possible with no live replica.
    pub fn election(
        &self,
        topic: &str,
        partition: i32,
        kind: Election,
    ) -> Result<(BrokerId, Option<Vec<BrokerId>>), ApplyError> {
        let p = self
            .partition(topic, partition)
            .ok_or(ApplyError::UnknownTopicOrPartition)?;
        match kind {
            Election::Preferred => {
                let preferred = p.replicas[0];
                if p.leader == preferred {
                    Err(ApplyError::ElectionNotNeeded)
                } else if p.isr.contains(&preferred) && self.is_alive(preferred) {
                    Ok((preferred, None))
                } else {
                    Err(ApplyError::PreferredLeaderNotAvailable)
                }
            }
            Election::Unclean => {
                if p.leader != NO_BROKER {
                    return Err(ApplyError::ElectionNotNeeded);
                }
                let live = |r: &&BrokerId| self.is_alive(**r);
                if let Some(r) = p.replicas.iter().filter(|r| p.isr.contains(r)).find(live) {
                    return Ok((*r, None));
                }
                match p.replicas.iter().find(live) {
                    Some(r) => Ok((*r, Some(vec![*r]))),
                    None => Err(ApplyError::EligibleLeadersNotAvailable),
                }
            }
        }
    }

    /// Makes `leader` the partition's leader in a new leader epoch, with `isr` if given.
    fn elect(
        &mut self,
        topic: &str,
        partition: i32,
        leader: BrokerId,
        isr: Option<Vec<BrokerId>>,
    ) -> Result<(), ApplyError> {
        let (_, p) = self.partition_mut(topic, partition)?;
        p.leader = leader;
        if let Some(isr) = isr {
            p.isr = isr;
        }
        p.leader_epoch += 1;
        p.partition_epoch += 1;
        Ok(())
    }

    /// Partitions whose ISR is smaller than their replica set.
    pub fn under_replicated(&self) -> Vec<(String, i32, &PartitionState)> {
        let mut out = Vec::new();
        for (name, t) in &self.topics {
            for (i, p) in t.partitions.iter().enumerate() {
                if p.isr.len() < p.replicas.len() {
                    out.push((name.clone(), i as i32, p));
                }
            }
        }
        out
    }
}

/// Whether a topic may elect a leader outside its ISR: its own
/// `unclean.leader.election.enable`, else the cluster-wide dynamic default.
fn unclean_allowed(topic_configs: &BTreeMap<String, String>, default: bool) -> bool {
    match topic_configs.get(UNCLEAN_ELECTION) {
        Some(v) => v == "true",
        None => default,
    }
}

/// The snapshot layouts of format versions 1 to 9 (see the module doc), kept to read
/// snapshots written by older builds. Never written.
pub mod legacy {
    use std::collections::BTreeMap;

    use rkyv::{Archive, Deserialize, Serialize};

    use super::{
        Acl, BrokerInfo, ClientQuota, ClusterState, Endpoint, PartitionState, Reassignment,
        RemoteLog, RemoteSegment, ScramCredential, TopicState, UNKNOWN_EPOCH,
    };
    use crate::BrokerId;

    /// A partition in versions 1 and 2: no slots.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct PartitionStateV1 {
        pub replicas: Vec<BrokerId>,
        pub isr: Vec<BrokerId>,
        pub leader: BrokerId,
        pub leader_epoch: i32,
        pub partition_epoch: i32,
    }

    /// A topic in versions 1 and 2.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct TopicStateV1 {
        pub id: [u8; 16],
        pub configs: BTreeMap<String, String>,
        pub partitions: Vec<PartitionStateV1>,
    }

    impl From<TopicStateV1> for TopicState {
        fn from(t: TopicStateV1) -> TopicState {
            TopicState {
                id: t.id,
                configs: t.configs,
                partitions: t
                    .partitions
                    .into_iter()
                    .map(|p| PartitionState {
                        replicas: p.replicas,
                        isr: p.isr,
                        leader: p.leader,
                        leader_epoch: p.leader_epoch,
                        partition_epoch: p.partition_epoch,
                        slots: Vec::new(),
                    })
                    .collect(),
            }
        }
    }

    fn topics_of(topics: BTreeMap<String, TopicStateV1>) -> BTreeMap<String, TopicState> {
        topics
            .into_iter()
            .map(|(name, t)| (name, TopicState::from(t)))
            .collect()
    }

    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV2 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicStateV1>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
    }

    /// Version 3: no reassignments, no directory ids.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV3 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicState>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
        pub replicas_placed: BTreeMap<BrokerId, u64>,
    }

    /// A remote segment in version 9 and in [`super::Command::AddRemoteSegmentsV9`]: no
    /// last epoch.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
    pub struct RemoteSegmentV9 {
        pub id: [u8; 16],
        pub base_offset: i64,
        pub last_offset: i64,
        pub max_timestamp: i64,
        pub size: u64,
        pub leader_epoch: i32,
        pub uploaded_ms: i64,
    }

    impl From<RemoteSegmentV9> for RemoteSegment {
        fn from(s: RemoteSegmentV9) -> RemoteSegment {
            RemoteSegment {
                id: s.id,
                base_offset: s.base_offset,
                last_offset: s.last_offset,
                max_timestamp: s.max_timestamp,
                size: s.size,
                leader_epoch: s.leader_epoch,
                uploaded_ms: s.uploaded_ms,
                last_epoch: UNKNOWN_EPOCH,
            }
        }
    }

    /// A remote log in version 9.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct RemoteLogV9 {
        pub segments: Vec<RemoteSegmentV9>,
        pub log_start: i64,
    }

    /// Version 9: remote segments without their last epochs.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV9 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicState>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
        pub replicas_placed: BTreeMap<BrokerId, u64>,
        pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
        pub directories: BTreeMap<BrokerId, String>,
        pub scram: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
        pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
        pub acls: Vec<Acl>,
        pub quotas: Vec<ClientQuota>,
        pub endpoints: BTreeMap<BrokerId, Vec<Endpoint>>,
        pub remote: BTreeMap<String, BTreeMap<i32, RemoteLogV9>>,
        pub remote_purge: Vec<String>,
    }

    impl From<ClusterStateV9> for ClusterState {
        fn from(v9: ClusterStateV9) -> ClusterState {
            let remote = v9
                .remote
                .into_iter()
                .map(|(topic, logs)| {
                    let logs = logs
                        .into_iter()
                        .map(|(p, l)| {
                            let segments = l.segments.into_iter().map(RemoteSegment::from);
                            let log = RemoteLog {
                                segments: segments.collect(),
                                log_start: l.log_start,
                            };
                            (p, log)
                        })
                        .collect();
                    (topic, logs)
                })
                .collect();
            ClusterState {
                cluster_id: v9.cluster_id,
                brokers: v9.brokers,
                topics: v9.topics,
                next_producer_id: v9.next_producer_id,
                version: v9.version,
                broker_configs: v9.broker_configs,
                replicas_placed: v9.replicas_placed,
                reassignments: v9.reassignments,
                directories: v9.directories,
                scram: v9.scram,
                group_configs: v9.group_configs,
                acls: v9.acls,
                quotas: v9.quotas,
                endpoints: v9.endpoints,
                remote,
                remote_purge: v9.remote_purge,
            }
        }
    }

    /// Version 8: before tiered storage's remote segments.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV8 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicState>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
        pub replicas_placed: BTreeMap<BrokerId, u64>,
        pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
        pub directories: BTreeMap<BrokerId, String>,
        pub scram: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
        pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
        pub acls: Vec<Acl>,
        pub quotas: Vec<ClientQuota>,
        pub endpoints: BTreeMap<BrokerId, Vec<Endpoint>>,
    }

    impl From<ClusterStateV8> for ClusterState {
        fn from(v8: ClusterStateV8) -> ClusterState {
            ClusterState {
                cluster_id: v8.cluster_id,
                brokers: v8.brokers,
                topics: v8.topics,
                next_producer_id: v8.next_producer_id,
                version: v8.version,
                broker_configs: v8.broker_configs,
                replicas_placed: v8.replicas_placed,
                reassignments: v8.reassignments,
                directories: v8.directories,
                scram: v8.scram,
                group_configs: v8.group_configs,
                acls: v8.acls,
                quotas: v8.quotas,
                endpoints: v8.endpoints,
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }

    /// Version 7: before named listeners.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV7 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicState>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
        pub replicas_placed: BTreeMap<BrokerId, u64>,
        pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
        pub directories: BTreeMap<BrokerId, String>,
        pub scram: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
        pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
        pub acls: Vec<Acl>,
        pub quotas: Vec<ClientQuota>,
    }

    impl From<ClusterStateV7> for ClusterState {
        fn from(v7: ClusterStateV7) -> ClusterState {
            ClusterState {
                cluster_id: v7.cluster_id,
                brokers: v7.brokers,
                topics: v7.topics,
                next_producer_id: v7.next_producer_id,
                version: v7.version,
                broker_configs: v7.broker_configs,
                replicas_placed: v7.replicas_placed,
                reassignments: v7.reassignments,
                directories: v7.directories,
                scram: v7.scram,
                group_configs: v7.group_configs,
                acls: v7.acls,
                quotas: v7.quotas,
                endpoints: BTreeMap::new(),
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }

    /// Version 6: before ACLs and client quotas.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV6 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicState>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
        pub replicas_placed: BTreeMap<BrokerId, u64>,
        pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
        pub directories: BTreeMap<BrokerId, String>,
        pub scram: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
        pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
    }

    impl From<ClusterStateV6> for ClusterState {
        fn from(v6: ClusterStateV6) -> ClusterState {
            ClusterState {
                cluster_id: v6.cluster_id,
                brokers: v6.brokers,
                topics: v6.topics,
                next_producer_id: v6.next_producer_id,
                version: v6.version,
                broker_configs: v6.broker_configs,
                replicas_placed: v6.replicas_placed,
                reassignments: v6.reassignments,
                directories: v6.directories,
                scram: v6.scram,
                group_configs: v6.group_configs,
                acls: Vec::new(),
                quotas: Vec::new(),
                endpoints: BTreeMap::new(),
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }

    /// Version 5: before group configs.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV5 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicState>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
        pub replicas_placed: BTreeMap<BrokerId, u64>,
        pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
        pub directories: BTreeMap<BrokerId, String>,
        pub scram: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
    }

    impl From<ClusterStateV5> for ClusterState {
        fn from(v5: ClusterStateV5) -> ClusterState {
            ClusterState {
                cluster_id: v5.cluster_id,
                brokers: v5.brokers,
                topics: v5.topics,
                next_producer_id: v5.next_producer_id,
                version: v5.version,
                broker_configs: v5.broker_configs,
                replicas_placed: v5.replicas_placed,
                reassignments: v5.reassignments,
                directories: v5.directories,
                scram: v5.scram,
                group_configs: BTreeMap::new(),
                acls: Vec::new(),
                quotas: Vec::new(),
                endpoints: BTreeMap::new(),
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }

    /// Version 4: before SCRAM credentials.
    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV4 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfo>,
        pub topics: BTreeMap<String, TopicState>,
        pub next_producer_id: i64,
        pub version: u64,
        pub broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
        pub replicas_placed: BTreeMap<BrokerId, u64>,
        pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
        pub directories: BTreeMap<BrokerId, String>,
    }

    impl From<ClusterStateV4> for ClusterState {
        fn from(v4: ClusterStateV4) -> ClusterState {
            ClusterState {
                cluster_id: v4.cluster_id,
                brokers: v4.brokers,
                topics: v4.topics,
                next_producer_id: v4.next_producer_id,
                version: v4.version,
                broker_configs: v4.broker_configs,
                replicas_placed: v4.replicas_placed,
                reassignments: v4.reassignments,
                directories: v4.directories,
                scram: BTreeMap::new(),
                group_configs: BTreeMap::new(),
                acls: Vec::new(),
                quotas: Vec::new(),
                endpoints: BTreeMap::new(),
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }

    impl From<ClusterStateV3> for ClusterState {
        fn from(v3: ClusterStateV3) -> ClusterState {
            ClusterState {
                cluster_id: v3.cluster_id,
                brokers: v3.brokers,
                topics: v3.topics,
                next_producer_id: v3.next_producer_id,
                version: v3.version,
                broker_configs: v3.broker_configs,
                replicas_placed: v3.replicas_placed,
                reassignments: BTreeMap::new(),
                directories: BTreeMap::new(),
                scram: BTreeMap::new(),
                group_configs: BTreeMap::new(),
                acls: Vec::new(),
                quotas: Vec::new(),
                endpoints: BTreeMap::new(),
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }

    /// Its partitions get no slots, and slot counting starts from zero.
    impl From<ClusterStateV2> for ClusterState {
        fn from(v2: ClusterStateV2) -> ClusterState {
            ClusterState {
                cluster_id: v2.cluster_id,
                brokers: v2.brokers,
                topics: topics_of(v2.topics),
                next_producer_id: v2.next_producer_id,
                version: v2.version,
                broker_configs: v2.broker_configs,
                replicas_placed: BTreeMap::new(),
                reassignments: BTreeMap::new(),
                directories: BTreeMap::new(),
                scram: BTreeMap::new(),
                group_configs: BTreeMap::new(),
                acls: Vec::new(),
                quotas: Vec::new(),
                endpoints: BTreeMap::new(),
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }

    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct BrokerInfoV1 {
        pub id: BrokerId,
        pub host: String,
        pub port: i32,
        pub incarnation: u64,
        pub fenced: bool,
    }

    #[derive(Archive, Serialize, Deserialize, Debug)]
    pub struct ClusterStateV1 {
        pub cluster_id: String,
        pub brokers: BTreeMap<BrokerId, BrokerInfoV1>,
        pub topics: BTreeMap<String, TopicStateV1>,
        pub next_producer_id: i64,
        pub version: u64,
    }

    impl From<ClusterStateV1> for ClusterState {
        fn from(v1: ClusterStateV1) -> ClusterState {
            ClusterState {
                cluster_id: v1.cluster_id,
                brokers: v1
                    .brokers
                    .into_iter()
                    .map(|(id, b)| {
                        let b = BrokerInfo {
                            id: b.id,
                            host: b.host,
                            port: b.port,
                            incarnation: b.incarnation,
                            fenced: b.fenced,
                            rack: None,
                        };
                        (id, b)
                    })
                    .collect(),
                topics: topics_of(v1.topics),
                next_producer_id: v1.next_producer_id,
                version: v1.version,
                broker_configs: BTreeMap::new(),
                replicas_placed: BTreeMap::new(),
                reassignments: BTreeMap::new(),
                directories: BTreeMap::new(),
                scram: BTreeMap::new(),
                group_configs: BTreeMap::new(),
                acls: Vec::new(),
                quotas: Vec::new(),
                endpoints: BTreeMap::new(),
                remote: BTreeMap::new(),
                remote_purge: Vec::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(s: &mut ClusterState, id: BrokerId, incarnation: u64) {
        s.apply(&Command::RegisterBroker {
            id,
            host: "127.0.0.1".into(),
            port: 9091 + id,
            incarnation,
        })
        .unwrap();
    }

    fn cluster(n: i32) -> ClusterState {
        let mut s = ClusterState::default();
        s.apply(&Command::Init {
            cluster_id: "c".into(),
        })
        .unwrap();
        for id in 1..=n {
            register(&mut s, id, 1);
        }
        s
    }

    fn create(s: &mut ClusterState, name: &str, partitions: i32, rf: i16) {
        let assignments = s.place(0, partitions, rf).unwrap();
        s.apply(&Command::CreateTopic {
            name: name.into(),
            id: [7; 16],
            configs: BTreeMap::new(),
            assignments,
        })
        .unwrap();
    }

    #[test]
    fn placement_spreads_leaders_and_defaults_to_three_replicas() {
        let mut s = cluster(3);
        create(&mut s, "t", 6, -1);
        let t = &s.topics["t"];
        let mut leaders = [0; 4];
        for p in &t.partitions {
            assert_eq!(p.replicas.len(), 3);
            assert_eq!(p.isr, p.replicas);
            assert_eq!(p.leader, p.replicas[0]);
            leaders[p.leader as usize] += 1;
        }
        assert_eq!(&leaders[1..], &[2, 2, 2]);
        assert!(matches!(
            s.place(0, 1, 4),
            Err(ApplyError::InvalidReplicationFactor(_))
        ));
        assert!(matches!(
            s.place(0, 1, 0),
            Err(ApplyError::InvalidReplicationFactor(_))
        ));
        let single = cluster(1);
        assert_eq!(single.place(0, 2, -1).unwrap(), vec![vec![1], vec![1]]);
    }

    #[test]
    fn fencing_the_leader_elects_from_the_isr_and_bumps_epochs() {
        let mut s = cluster(3);
        create(&mut s, "t", 1, 3);
        let leader = s.partition("t", 0).unwrap().leader;
        s.apply(&Command::FenceBroker { id: leader }).unwrap();
        let p = s.partition("t", 0).unwrap();
        assert_ne!(p.leader, leader);
        assert_ne!(p.leader, NO_BROKER);
        assert!(!p.isr.contains(&leader));
        assert_eq!(p.isr.len(), 2);
        assert_eq!(p.leader_epoch, 1);
        assert_eq!(p.partition_epoch, 1);
    }

    #[test]
    fn no_live_isr_member_leaves_the_partition_leaderless_until_one_returns() {
        let mut s = cluster(3);
        create(&mut s, "t", 1, 3);
        let p = s.partition("t", 0).unwrap().clone();
        // The leader shrinks the ISR to itself, then dies.
        s.apply(&Command::AlterPartition {
            from: p.leader,
            topic: "t".into(),
            partition: 0,
            leader_epoch: 0,
            partition_epoch: 0,
            new_isr: vec![p.leader],
        })
        .unwrap();
        s.apply(&Command::FenceBroker { id: p.leader }).unwrap();
        let q = s.partition("t", 0).unwrap();
        assert_eq!(q.leader, NO_BROKER, "unclean election is off");
        assert_eq!(q.isr, vec![p.leader], "the last ISR member stays");
        // Another replica coming back does not lead: it may lack acknowledged data.
        let other = p.replicas.iter().copied().find(|r| *r != p.leader).unwrap();
        s.apply(&Command::FenceBroker { id: other }).unwrap();
        s.apply(&Command::UnfenceBroker { id: other }).unwrap();
        assert_eq!(s.partition("t", 0).unwrap().leader, NO_BROKER);
        s.apply(&Command::UnfenceBroker { id: p.leader }).unwrap();
        let q = s.partition("t", 0).unwrap();
        assert_eq!(q.leader, p.leader);
        assert_eq!(q.leader_epoch, 2);
    }

    #[test]
    fn unclean_election_when_the_topic_allows_it() {
        let mut s = cluster(2);
        let assignments = vec![vec![1, 2]];
        s.apply(&Command::CreateTopic {
            name: "u".into(),
            id: [1; 16],
            configs: [(UNCLEAN_ELECTION.to_string(), "true".to_string())].into(),
            assignments,
        })
        .unwrap();
        s.apply(&Command::AlterPartition {
            from: 1,
            topic: "u".into(),
            partition: 0,
            leader_epoch: 0,
            partition_epoch: 0,
            new_isr: vec![1],
        })
        .unwrap();
        // A controlled shutdown of broker 1 would elect out of the ISR: it is told so.
        assert!(s.fencing_elects_unclean(1));
        assert!(!s.fencing_elects_unclean(2), "2 leads nothing");
        s.apply(&Command::FenceBroker { id: 1 }).unwrap();
        let p = s.partition("u", 0).unwrap();
        assert_eq!(p.leader, 2);
        assert_eq!(p.isr, vec![2]);
        // With another live in-sync replica, or unclean election off, it would not.
        let mut s = cluster(2);
        for (name, id, unclean) in [("u", [1; 16], "true"), ("c", [2; 16], "false")] {
            s.apply(&Command::CreateTopic {
                name: name.into(),
                id,
                configs: [(UNCLEAN_ELECTION.to_string(), unclean.to_string())].into(),
                assignments: vec![vec![1, 2]],
            })
            .unwrap();
        }
        assert!(!s.fencing_elects_unclean(1), "ISR [1, 2]");
        s.apply(&Command::AlterPartition {
            from: 1,
            topic: "c".into(),
            partition: 0,
            leader_epoch: 0,
            partition_epoch: 0,
            new_isr: vec![1],
        })
        .unwrap();
        assert!(
            !s.fencing_elects_unclean(1),
            "unclean election is off for c"
        );
    }

    fn elect(s: &mut ClusterState, kind: Election, partition: i32) -> Result<Applied, ApplyError> {
        let (topic, partition) = ("t".to_string(), partition);
        s.apply(&match kind {
            Election::Preferred => Command::ElectPreferred { topic, partition },
            Election::Unclean => Command::ElectUnclean { topic, partition },
        })
    }

    #[test]
    fn elections_asked_for_answer_as_kafkas_controller() {
        let mut s = cluster(3);
        create(&mut s, "t", 1, 3);
        let p = s.partition("t", 0).unwrap().clone();
        let preferred = p.replicas[0];
        assert_eq!(p.leader, preferred);
        // The preferred replica leads: neither election is needed, and nothing moves.
        let before = s.clone();
        for kind in [Election::Preferred, Election::Unclean] {
            assert_eq!(elect(&mut s, kind, 0), Err(ApplyError::ElectionNotNeeded));
        }
        assert_eq!(s, before);
        assert_eq!(
            elect(&mut s, Election::Preferred, 1),
            Err(ApplyError::UnknownTopicOrPartition)
        );
        // Fenced, it loses the leadership and cannot get it back while it is down.
        s.apply(&Command::FenceBroker { id: preferred }).unwrap();
        assert_ne!(s.partition("t", 0).unwrap().leader, preferred);
        assert_eq!(
            elect(&mut s, Election::Preferred, 0),
            Err(ApplyError::PreferredLeaderNotAvailable)
        );
        // Back, but out of the ISR until its leader lets it in: still not available.
        s.apply(&Command::UnfenceBroker { id: preferred }).unwrap();
        assert_eq!(
            elect(&mut s, Election::Preferred, 0),
            Err(ApplyError::PreferredLeaderNotAvailable)
        );
        let q = s.partition("t", 0).unwrap().clone();
        let mut isr = q.isr.clone();
        isr.push(preferred);
        s.apply(&Command::AlterPartition {
            from: q.leader,
            topic: "t".into(),
            partition: 0,
            leader_epoch: q.leader_epoch,
            partition_epoch: q.partition_epoch,
            new_isr: isr,
        })
        .unwrap();
        assert_eq!(s.preferred_elections(), vec![("t".to_string(), 0)]);
        elect(&mut s, Election::Preferred, 0).unwrap();
        let r = s.partition("t", 0).unwrap();
        assert_eq!((r.leader, r.leader_epoch), (preferred, q.leader_epoch + 1));
        assert!(s.preferred_elections().is_empty());
    }

    #[test]
    fn an_unclean_election_asked_for_takes_a_live_replica_outside_the_isr() {
        let mut s = cluster(3);
        create(&mut s, "t", 1, 2);
        let p = s.partition("t", 0).unwrap().clone();
        let (a, b) = (p.replicas[0], p.replicas[1]);
        // b fails first and leaves the ISR; then a, the last ISR member, fails too.
        s.apply(&Command::FenceBroker { id: b }).unwrap();
        s.apply(&Command::FenceBroker { id: a }).unwrap();
        // b returns: outside the ISR, and the topic does not allow unclean elections.
        s.apply(&Command::UnfenceBroker { id: b }).unwrap();
        let q = s.partition("t", 0).unwrap().clone();
        assert_eq!((q.leader, q.isr.clone()), (NO_BROKER, vec![a]));
        // Asked for, the unclean election happens anyway and b is the whole ISR.
        elect(&mut s, Election::Unclean, 0).unwrap();
        let r = s.partition("t", 0).unwrap().clone();
        assert_eq!((r.leader, r.isr), (b, vec![b]));
        assert_eq!(r.leader_epoch, q.leader_epoch + 1);
        assert_eq!(r.partition_epoch, q.partition_epoch + 1);
        assert_eq!(
            elect(&mut s, Election::Unclean, 0),
            Err(ApplyError::ElectionNotNeeded)
        );
        // With every replica down there is no one to elect.
        s.apply(&Command::FenceBroker { id: b }).unwrap();
        assert_eq!(s.partition("t", 0).unwrap().leader, NO_BROKER);
        assert_eq!(
            elect(&mut s, Election::Unclean, 0),
            Err(ApplyError::EligibleLeadersNotAvailable)
        );
        // A live ISR member is preferred over a replica outside the ISR.
        s.apply(&Command::UnfenceBroker { id: a }).unwrap();
        assert_eq!(s.partition("t", 0).unwrap().leader, NO_BROKER);
        s.apply(&Command::UnfenceBroker { id: b }).unwrap();
        assert_eq!(
            s.partition("t", 0).unwrap().leader,
            b,
            "b is the ISR: clean election"
        );
    }

    #[test]
    fn alter_partition_checks_epochs_leader_and_eligibility() {
        let mut s = cluster(3);
        create(&mut s, "t", 1, 3);
        let p = s.partition("t", 0).unwrap().clone();
        let follower = p.replicas[1];
        let alter = |from, le, pe, isr: Vec<BrokerId>| Command::AlterPartition {
            from,
            topic: "t".into(),
            partition: 0,
            leader_epoch: le,
            partition_epoch: pe,
            new_isr: isr,
        };
        assert!(matches!(
            s.apply(&alter(p.leader, 1, 0, vec![p.leader])),
            Err(ApplyError::FencedLeaderEpoch { .. })
        ));
        assert!(matches!(
            s.apply(&alter(follower, 0, 0, vec![follower])),
            Err(ApplyError::NotLeader(_))
        ));
        assert!(matches!(
            s.apply(&alter(p.leader, 0, 5, vec![p.leader])),
            Err(ApplyError::InvalidUpdateVersion { .. })
        ));
        assert!(matches!(
            s.apply(&alter(p.leader, 0, 0, vec![follower])),
            Err(ApplyError::InvalidRequest(_))
        ));
        let version = s.version;
        assert!(s.apply(&alter(p.leader, 0, 0, vec![p.leader, 9])).is_err());
        assert_eq!(s.version, version, "a refused command changes nothing");
        s.apply(&alter(p.leader, 0, 0, vec![p.leader])).unwrap();
        // A fenced broker cannot rejoin; an unfenced one can. Fencing gives every
        // partition it is a replica of a new partition epoch, even outside the ISR:
        // a change computed before the fence is refused after the unfence too.
        s.apply(&Command::FenceBroker { id: follower }).unwrap();
        assert_eq!(s.partition("t", 0).unwrap().partition_epoch, 2);
        assert_eq!(
            s.apply(&alter(p.leader, 0, 2, vec![p.leader, follower])),
            Err(ApplyError::IneligibleReplica(follower))
        );
        s.apply(&Command::UnfenceBroker { id: follower }).unwrap();
        assert!(matches!(
            s.apply(&alter(p.leader, 0, 1, vec![p.leader, follower])),
            Err(ApplyError::InvalidUpdateVersion { .. })
        ));
        s.apply(&alter(p.leader, 0, 2, vec![p.leader, follower]))
            .unwrap();
        assert_eq!(s.partition("t", 0).unwrap().partition_epoch, 3);
    }

    #[test]
    fn a_restarted_broker_loses_its_leaderships_epoch() {
        let mut s = cluster(3);
        create(&mut s, "t", 1, 3);
        let p = s.partition("t", 0).unwrap().clone();
        register(&mut s, p.leader, 2);
        let q = s.partition("t", 0).unwrap();
        assert!(q.leader_epoch > p.leader_epoch);
        assert_ne!(q.leader, p.leader, "another ISR member took over");
        assert!(s.is_alive(p.leader));
        // Same incarnation again (a retried registration): nothing moves.
        let before = s.clone();
        register(&mut s, p.leader, 2);
        assert_eq!(s.topics, before.topics);
        // The preferred leader gets its partition back by preferred election once it
        // is in the ISR again.
        assert!(s.preferred_elections().is_empty());
        let q = s.partition("t", 0).unwrap().clone();
        let mut isr = q.isr.clone();
        isr.push(p.leader);
        s.apply(&Command::AlterPartition {
            from: q.leader,
            topic: "t".into(),
            partition: 0,
            leader_epoch: q.leader_epoch,
            partition_epoch: q.partition_epoch,
            new_isr: isr,
        })
        .unwrap();
        assert_eq!(s.preferred_elections(), vec![("t".to_string(), 0)]);
        s.apply(&Command::ElectPreferred {
            topic: "t".into(),
            partition: 0,
        })
        .unwrap();
        assert_eq!(s.partition("t", 0).unwrap().leader, p.leader);
    }

    #[test]
    fn a_retried_create_partitions_does_not_add_them_twice() {
        let mut s = cluster(3);
        create(&mut s, "t", 2, 3);
        let add = Command::CreatePartitions {
            name: "t".into(),
            existing: 2,
            assignments: s.place(2, 2, 3).unwrap(),
        };
        s.apply(&add).unwrap();
        assert_eq!(s.topics["t"].partitions.len(), 4);
        assert!(matches!(s.apply(&add), Err(ApplyError::InvalidRequest(_))));
        assert_eq!(s.topics["t"].partitions.len(), 4);
    }

    #[test]
    fn producer_id_blocks_do_not_overlap() {
        let mut s = cluster(2);
        let a = s
            .apply(&Command::AllocateProducerIds {
                broker: 1,
                count: 1000,
            })
            .unwrap();
        let b = s
            .apply(&Command::AllocateProducerIds {
                broker: 2,
                count: 1000,
            })
            .unwrap();
        assert_eq!(
            (a, b),
            (
                Applied::ProducerIds(ProducerIdBlock {
                    first: 0,
                    count: 1000
                }),
                Applied::ProducerIds(ProducerIdBlock {
                    first: 1000,
                    count: 1000
                })
            )
        );
    }

    #[test]
    fn an_offline_replica_hands_leadership_to_a_live_isr_member_or_keeps_it_in_a_new_epoch() {
        let mut s = cluster(3);
        s.apply(&Command::CreateTopic {
            name: "t".into(),
            id: [7; 16],
            configs: BTreeMap::new(),
            assignments: vec![vec![1, 2, 3]],
        })
        .unwrap();
        let offline = |s: &mut ClusterState, broker| {
            s.apply(&Command::ReplicaOffline {
                broker,
                topic: "t".into(),
                partition: 0,
            })
            .unwrap();
            s.topics["t"].partitions[0].clone()
        };
        // The leader's replica fails: the next ISR member leads, in a new epoch.
        let p = offline(&mut s, 1);
        assert_eq!(
            (p.leader, p.leader_epoch, p.isr.clone()),
            (2, 1, vec![2, 3])
        );
        // A follower's fails: it only leaves the ISR.
        let p = offline(&mut s, 3);
        assert_eq!((p.leader, p.leader_epoch, p.isr.clone()), (2, 1, vec![2]));
        // The last in-sync replica stays leader (there is no clean successor), in a
        // new leader epoch: its reopened log may be shorter than a follower's.
        let p = offline(&mut s, 2);
        assert_eq!((p.leader, p.leader_epoch, p.isr.clone()), (2, 2, vec![2]));
        // Not a replica of the partition: refused, state unchanged.
        let version = s.version;
        let e = s.apply(&Command::ReplicaOffline {
            broker: 9,
            topic: "t".into(),
            partition: 0,
        });
        assert_eq!(e, Err(ApplyError::IneligibleReplica(9)));
        assert_eq!(s.version, version);
    }

    #[test]
    fn commands_and_snapshots_round_trip_and_garbage_is_refused() {
        let mut s = cluster(3);
        create(&mut s, "t", 4, 2);
        let cmd = Command::AlterPartition {
            from: 1,
            topic: "t".into(),
            partition: 3,
            leader_epoch: 2,
            partition_epoch: 9,
            new_isr: vec![1, 3],
        };
        assert_eq!(Command::decode(&cmd.encode()).unwrap(), cmd);
        let elect = Command::ElectUnclean {
            topic: "t".into(),
            partition: 2,
        };
        assert_eq!(Command::decode(&elect.encode()).unwrap(), elect);
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        assert!(matches!(
            Command::decode(&[0xff; 7]),
            Err(DecodeError::Command(_))
        ));
        // Integrity is the journal's job (CRC per record); decoding still refuses
        // structurally broken bytes rather than reading out of bounds.
        let bytes = s.encode();
        assert!(matches!(
            ClusterState::decode(&bytes[..bytes.len() / 2]),
            Err(DecodeError::Snapshot { version, .. }) if version == STATE_VERSION
        ));
    }

    #[test]
    fn manual_assignments_follow_kafkas_rules() {
        let mut s = cluster(3);
        assert_eq!(s.check_manual_assignment(0, &[2, 1], None), Ok(()));
        assert_eq!(s.check_manual_assignment(3, &[3, 1], Some(2)), Ok(()));
        let refused = |r: Result<(), ApplyError>| {
            assert!(
                matches!(r, Err(ApplyError::InvalidReplicaAssignment(_))),
                "{r:?}"
            )
        };
        refused(s.check_manual_assignment(0, &[], None));
        refused(s.check_manual_assignment(0, &[1, 4], None));
        refused(s.check_manual_assignment(0, &[2, 1, 2], None));
        refused(s.check_manual_assignment(1, &[1, 2, 3], Some(2)));
        s.apply(&Command::FenceBroker { id: 3 }).unwrap();
        refused(s.check_manual_assignment(0, &[3], None));
        assert_eq!(s.check_manual_assignment(0, &[3, 1], None), Ok(()));
    }

    fn hex_fixture(text: &str) -> Vec<u8> {
        let t = text.trim();
        (0..t.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&t[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn version_1_journal_entries_and_snapshots_still_decode() {
        let s =
            ClusterState::decode(&hex_fixture(include_str!("../testdata/state-v1.hex"))).unwrap();
        assert_eq!(s.cluster_id, "legacy-cluster-id-xyz");
        assert_eq!(s.brokers.len(), 2);
        assert_eq!(s.brokers[&2].port, 9092);
        assert_eq!(s.brokers[&2].rack, None);
        assert_eq!(s.topics["orders"].configs["retention.ms"], "1000");
        assert_eq!(s.topics["orders"].partitions[1].replicas, vec![2, 1]);
        assert_eq!((s.next_producer_id, s.version), (42, 4));
        assert!(s.broker_configs.is_empty());
        // Re-encoded, it is the current format and decodes to the same state.
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);

        let reg = Command::decode(&hex_fixture(include_str!(
            "../testdata/register-broker-v1.hex"
        )))
        .unwrap();
        assert_eq!(
            reg,
            Command::RegisterBroker {
                id: 3,
                host: "broker-three.example".into(),
                port: 9093,
                incarnation: 99,
            }
        );
        let alter = Command::decode(&hex_fixture(include_str!(
            "../testdata/alter-configs-v1.hex"
        )))
        .unwrap();
        assert_eq!(
            alter,
            Command::AlterConfigs {
                name: "orders".into(),
                configs: [("retention.ms".to_string(), "5".to_string())].into(),
            }
        );
    }

    /// A topic "t" of one partition on `replicas`, all in the ISR, led by the first.
    fn placed_on(replicas: &[BrokerId]) -> ClusterState {
        let mut s = cluster(4);
        s.apply(&Command::CreateTopic {
            name: "t".into(),
            id: [7; 16],
            configs: BTreeMap::new(),
            assignments: vec![replicas.to_vec()],
        })
        .unwrap();
        s
    }

    fn reassign(s: &mut ClusterState, target: Option<&[BrokerId]>) -> Result<(), ApplyError> {
        let cmd = Command::Reassign {
            changes: vec![Reassign {
                topic: "t".into(),
                partition: 0,
                target: target.map(<[BrokerId]>::to_vec),
            }],
        };
        match s.apply(&cmd) {
            Ok(Applied::Partitions(mut r)) => r.remove(0),
            other => panic!("{other:?}"),
        }
    }

    fn isr_of(
        s: &mut ClusterState,
        leader: BrokerId,
        new_isr: &[BrokerId],
    ) -> Result<(), ApplyError> {
        let p = s.partition("t", 0).unwrap().clone();
        s.apply(&Command::AlterPartition {
            from: leader,
            topic: "t".into(),
            partition: 0,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            new_isr: new_isr.to_vec(),
        })
        .map(|_| ())
    }

    #[test]
    fn a_reassignment_adds_then_waits_for_the_isr_then_drops_and_moves_leadership() {
        let mut s = placed_on(&[1, 2]);
        let before = s.partition("t", 0).unwrap().clone();
        assert_eq!(before.slots, vec![0, 0]);
        reassign(&mut s, Some(&[2, 3])).unwrap();
        let p = s.partition("t", 0).unwrap().clone();
        // Target first, then the leaving replica; leader and ISR unchanged.
        assert_eq!(p.replicas, vec![2, 3, 1]);
        assert_eq!(
            (p.isr.clone(), p.leader, p.leader_epoch),
            (vec![1, 2], 1, 0)
        );
        assert_eq!(p.partition_epoch, before.partition_epoch + 1);
        // Replicas keep their slots; broker 3's new replica takes its next one.
        assert_eq!(
            (p.slot_of(2), p.slot_of(1), p.slot_of(3)),
            (Some(0), Some(0), Some(0))
        );
        let r = s.reassignment("t", 0).unwrap().clone();
        assert_eq!((r.adding.clone(), r.removing.clone()), (vec![3], vec![1]));
        assert_eq!(r.target(&p.replicas), vec![2, 3]);
        assert_eq!(r.original(&p.replicas), vec![2, 1]);
        // The ISR snapshot survives a snapshot round trip with the move in it.
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        // The new replica catches up: the leader adds it to the ISR, and the move
        // completes in the same command.
        isr_of(&mut s, 1, &[1, 2, 3]).unwrap();
        let p = s.partition("t", 0).unwrap();
        assert_eq!(p.replicas, vec![2, 3]);
        assert_eq!(p.isr, vec![2, 3]);
        assert_eq!(
            (p.leader, p.leader_epoch),
            (2, 1),
            "the leaving leader handed over"
        );
        assert_eq!(p.slots, vec![0, 0]);
        assert!(s.reassignment("t", 0).is_none());
        assert!(s.reassignments.is_empty());
        // Nothing in progress now: cancelling says so.
        assert_eq!(
            reassign(&mut s, None),
            Err(ApplyError::NoReassignmentInProgress)
        );
    }

    #[test]
    fn a_reassignment_that_only_removes_or_reorders_completes_at_once() {
        let mut s = placed_on(&[1, 2, 3]);
        reassign(&mut s, Some(&[1, 2])).unwrap();
        let p = s.partition("t", 0).unwrap();
        assert_eq!(
            (p.replicas.clone(), p.isr.clone(), p.leader),
            (vec![1, 2], vec![1, 2], 1)
        );
        // A replica left: a new leader epoch, though the leader stays.
        assert_eq!(p.leader_epoch, 1);
        assert!(s.reassignments.is_empty());
        reassign(&mut s, Some(&[2, 1])).unwrap();
        let p = s.partition("t", 0).unwrap();
        assert_eq!(
            (p.replicas.clone(), p.leader, p.leader_epoch),
            (vec![2, 1], 1, 1)
        );
        // Asking for what is already there changes nothing (the command still counts
        // as one that succeeded).
        let version = s.version;
        reassign(&mut s, Some(&[2, 1])).unwrap();
        assert_eq!(s.version, version + 1, "a command that succeeded counts");
        assert_eq!(s.partition("t", 0).unwrap().replicas, vec![2, 1]);
    }

    #[test]
    fn cancelling_reverts_to_the_original_replicas_and_drops_added_ones_from_the_isr() {
        let mut s = placed_on(&[1, 2]);
        reassign(&mut s, Some(&[3, 4])).unwrap();
        assert_eq!(s.partition("t", 0).unwrap().replicas, vec![3, 4, 1, 2]);
        // Broker 3 caught up and joined the ISR; 4 has not: still moving.
        isr_of(&mut s, 1, &[1, 2, 3]).unwrap();
        assert!(s.reassignment("t", 0).is_some());
        reassign(&mut s, None).unwrap();
        let p = s.partition("t", 0).unwrap();
        assert_eq!(
            (p.replicas.clone(), p.isr.clone(), p.leader),
            (vec![1, 2], vec![1, 2], 1)
        );
        assert_eq!(
            p.leader_epoch, 1,
            "the added replicas left: a new leader epoch"
        );
        assert_eq!(p.slots, vec![0, 0]);
        assert!(s.reassignments.is_empty());
    }

    #[test]
    fn a_revert_that_would_elect_outside_the_isr_is_refused_unless_unclean_is_allowed() {
        let mut s = placed_on(&[1]);
        reassign(&mut s, Some(&[2, 3])).unwrap();
        isr_of(&mut s, 1, &[1, 2]).unwrap();
        // Broker 1 dies: its leadership goes to 2, which only the move added.
        s.apply(&Command::FenceBroker { id: 1 }).unwrap();
        let p = s.partition("t", 0).unwrap();
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]));
        assert!(matches!(
            reassign(&mut s, None),
            Err(ApplyError::InvalidReplicaAssignment(_))
        ));
        s.apply(&Command::AlterConfigs {
            name: "t".into(),
            configs: [(UNCLEAN_ELECTION.to_string(), "true".to_string())].into(),
        })
        .unwrap();
        reassign(&mut s, None).unwrap();
        let p = s.partition("t", 0).unwrap();
        // Back on broker 1 alone, which is fenced: leaderless until it returns.
        assert_eq!(
            (p.replicas.clone(), p.isr.clone(), p.leader),
            (vec![1], vec![1], NO_BROKER)
        );
    }

    #[test]
    fn reassignment_targets_are_checked_and_deleting_the_topic_ends_the_move() {
        let mut s = placed_on(&[1, 2]);
        let bad = |r| matches!(r, Err(ApplyError::InvalidReplicaAssignment(_)));
        assert!(bad(reassign(&mut s, Some(&[]))));
        assert!(bad(reassign(&mut s, Some(&[2, 2]))));
        assert!(bad(reassign(&mut s, Some(&[2, 9]))));
        let unknown = Command::Reassign {
            changes: vec![Reassign {
                topic: "nope".into(),
                partition: 0,
                target: Some(vec![1]),
            }],
        };
        assert_eq!(
            s.apply(&unknown).unwrap(),
            Applied::Partitions(vec![Err(ApplyError::UnknownTopicOrPartition)])
        );
        reassign(&mut s, Some(&[3, 4])).unwrap();
        s.apply(&Command::DeleteTopic { name: "t".into() }).unwrap();
        assert!(s.reassignments.is_empty());
    }

    #[test]
    fn a_broker_back_on_another_directory_leaves_every_isr_and_is_never_elected_empty() {
        let mut s = cluster(3);
        let record = |s: &mut ClusterState, id, d: &str| {
            s.apply(&Command::RecordDirectory {
                id,
                directory: d.into(),
            })
            .unwrap()
        };
        for id in 1..=3 {
            record(&mut s, id, &format!("dir-{id}"));
        }
        // "a"-0 on [3, 1] (3 leads), "b"-0 on [2, 3] whose ISR shrinks to [3] (2 is
        // fenced a while).
        for (name, replicas) in [("a", vec![3, 1]), ("b", vec![2, 3])] {
            s.apply(&Command::CreateTopic {
                name: name.into(),
                id: [1; 16],
                configs: BTreeMap::new(),
                assignments: vec![replicas],
            })
            .unwrap();
        }
        s.apply(&Command::FenceBroker { id: 2 }).unwrap();
        assert_eq!(s.partition("b", 0).unwrap().isr, vec![3]);
        s.apply(&Command::UnfenceBroker { id: 2 }).unwrap();
        // The same directory again changes nothing.
        let before = s.clone();
        record(&mut s, 3, "dir-3");
        assert_eq!(s.topics, before.topics);
        let a_before = s.partition("a", 0).unwrap().clone();
        // Broker 3 comes back on a wiped directory.
        assert_eq!(record(&mut s, 3, "dir-3-new"), Applied::DirectoryReplaced);
        assert_eq!(s.directories[&3], "dir-3-new");
        let a = s.partition("a", 0).unwrap().clone();
        assert_eq!(
            (a.leader, a.isr.clone()),
            (1, vec![1]),
            "leadership moved, 3 left the ISR"
        );
        assert!(
            a.leader_epoch > a_before.leader_epoch && a.partition_epoch > a_before.partition_epoch
        );
        // A stale ISR change (computed from the lost replica's fetches) is refused.
        let stale = Command::AlterPartition {
            from: 1,
            topic: "a".into(),
            partition: 0,
            leader_epoch: a_before.leader_epoch,
            partition_epoch: a_before.partition_epoch,
            new_isr: vec![1, 3],
        };
        assert!(s.clone().apply(&stale).is_err());
        let b = s.partition("b", 0).unwrap().clone();
        assert_eq!(
            (b.leader, b.isr.clone()),
            (NO_BROKER, vec![]),
            "no one may lead b"
        );
        // Registering (a new incarnation) elects it nowhere.
        register(&mut s, 3, 2);
        assert_eq!(s.partition("b", 0).unwrap().leader, NO_BROKER);
        assert_eq!(s.partition("a", 0).unwrap().isr, vec![1]);
        // It rejoins "a"'s ISR as any follower does; "b" waits for an unclean election.
        assert_eq!(s.election("b", 0, Election::Unclean).unwrap().0, 2);
        assert!(s
            .apply(&Command::RecordDirectory {
                id: 3,
                directory: String::new()
            })
            .is_err());
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn a_broker_is_unregistered_only_stopped_and_empty() {
        let mut s = placed_on(&[1, 2]);
        let unregister = |s: &mut ClusterState, id| s.apply(&Command::UnregisterBroker { id });
        assert!(
            matches!(unregister(&mut s, 3), Err(ApplyError::InvalidRequest(m)) if m.contains("live"))
        );
        s.apply(&Command::FenceBroker { id: 3 }).unwrap();
        s.apply(&Command::FenceBroker { id: 2 }).unwrap();
        assert!(
            matches!(unregister(&mut s, 2), Err(ApplyError::InvalidRequest(m)) if m.contains("holds replicas"))
        );
        unregister(&mut s, 3).unwrap();
        assert!(!s.brokers.contains_key(&3));
        assert_eq!(unregister(&mut s, 3), Err(ApplyError::UnknownBroker(3)));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    /// The legacy snapshot fixture `testdata/<file>`, decoded; first (re)written from
    /// `archived` (the rkyv bytes of that version's layout) under `version`'s magic
    /// when the environment variable `var` is set.
    fn legacy_fixture(
        file: &str,
        var: &str,
        version: u8,
        archived: impl FnOnce() -> Vec<u8>,
    ) -> ClusterState {
        let path = format!("{}/testdata/{file}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os(var).is_some() {
            let mut bytes = b"SLCST\x00".to_vec();
            bytes.extend_from_slice(&[version, 0]);
            bytes.extend_from_slice(&archived());
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            std::fs::write(&path, hex + "\n").unwrap();
        }
        ClusterState::decode(&hex_fixture(&std::fs::read_to_string(&path).unwrap())).unwrap()
    }

    /// Writes `testdata/state-v6.hex` (run once with SLUICE_WRITE_STATE_V6=1): the
    /// version-6 layout, [`legacy::ClusterStateV6`], as the version-6 build wrote it.
    #[test]
    fn version_6_snapshots_decode_without_acls() {
        let s = legacy_fixture("state-v6.hex", "SLUICE_WRITE_STATE_V6", 6, || {
            let mut s = cluster(1);
            s.cluster_id = "v6-cluster-id".into();
            s.group_configs.insert(
                "g".into(),
                [(
                    "consumer.session.timeout.ms".to_string(),
                    "50000".to_string(),
                )]
                .into(),
            );
            s.scram
                .entry("alice".into())
                .or_default()
                .insert(1, credential(7));
            let v6 = legacy::ClusterStateV6 {
                cluster_id: s.cluster_id,
                brokers: s.brokers,
                topics: s.topics,
                next_producer_id: s.next_producer_id,
                version: s.version,
                broker_configs: s.broker_configs,
                replicas_placed: s.replicas_placed,
                reassignments: s.reassignments,
                directories: s.directories,
                scram: s.scram,
                group_configs: s.group_configs,
            };
            rkyv::to_bytes::<rkyv::rancor::Error>(&v6).unwrap().to_vec()
        });
        assert_eq!(s.cluster_id, "v6-cluster-id");
        assert_eq!(s.group_configs["g"]["consumer.session.timeout.ms"], "50000");
        assert_eq!(s.scram["alice"][&1], credential(7));
        assert!(s.acls.is_empty());
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    /// Writes `testdata/state-v7.hex` (run once with SLUICE_WRITE_STATE_V7=1): the
    /// version-7 layout, [`legacy::ClusterStateV7`], as the version-7 build wrote it.
    #[test]
    fn version_7_snapshots_decode_without_listeners() {
        let s = legacy_fixture("state-v7.hex", "SLUICE_WRITE_STATE_V7", 7, || {
            let mut s = cluster(2);
            s.cluster_id = "v7-cluster-id".into();
            s.scram
                .entry("alice".into())
                .or_default()
                .insert(1, credential(7));
            let v7 = legacy::ClusterStateV7 {
                cluster_id: s.cluster_id,
                brokers: s.brokers,
                topics: s.topics,
                next_producer_id: s.next_producer_id,
                version: s.version,
                broker_configs: s.broker_configs,
                replicas_placed: s.replicas_placed,
                reassignments: s.reassignments,
                directories: s.directories,
                scram: s.scram,
                group_configs: s.group_configs,
                acls: s.acls,
                quotas: s.quotas,
            };
            rkyv::to_bytes::<rkyv::rancor::Error>(&v7).unwrap().to_vec()
        });
        assert_eq!(s.cluster_id, "v7-cluster-id");
        assert_eq!(s.brokers.len(), 2);
        assert_eq!(s.brokers[&2].port, 9093);
        assert_eq!(s.scram["alice"][&1], credential(7));
        assert!(s.endpoints.is_empty());
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    /// Writes `testdata/state-v8.hex` (run once with SLUICE_WRITE_STATE_V8=1): the
    /// version-8 layout, [`legacy::ClusterStateV8`], as the version-8 build wrote it.
    #[test]
    fn version_8_snapshots_decode_without_remote_segments() {
        let s = legacy_fixture("state-v8.hex", "SLUICE_WRITE_STATE_V8", 8, || {
            let mut s = cluster(2);
            s.cluster_id = "v8-cluster-id".into();
            s.endpoints.insert(2, vec![endpoint("CLIENT", 9300, 3)]);
            let v8 = legacy::ClusterStateV8 {
                cluster_id: s.cluster_id,
                brokers: s.brokers,
                topics: s.topics,
                next_producer_id: s.next_producer_id,
                version: s.version,
                broker_configs: s.broker_configs,
                replicas_placed: s.replicas_placed,
                reassignments: s.reassignments,
                directories: s.directories,
                scram: s.scram,
                group_configs: s.group_configs,
                acls: s.acls,
                quotas: s.quotas,
                endpoints: s.endpoints,
            };
            rkyv::to_bytes::<rkyv::rancor::Error>(&v8).unwrap().to_vec()
        });
        assert_eq!(s.cluster_id, "v8-cluster-id");
        assert_eq!(s.endpoints[&2][0].port, 9300);
        assert!(s.remote.is_empty() && s.remote_purge.is_empty());
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    fn remote_segment(base: i64, last: i64) -> RemoteSegment {
        RemoteSegment {
            id: [base as u8; 16],
            base_offset: base,
            last_offset: last,
            max_timestamp: 1000 + last,
            size: 4096,
            leader_epoch: 0,
            uploaded_ms: 5,
            last_epoch: 0,
        }
    }

    /// `testdata/state-v9.hex` was written by the version-9 build (remote segments
    /// without last epochs) before this one existed. Run with SLUICE_WRITE_STATE_V9=1,
    /// this writes it again through [`legacy::ClusterStateV9`], byte for byte the same.
    #[test]
    fn version_9_snapshots_decode_with_unknown_last_epochs() {
        let s = legacy_fixture("state-v9.hex", "SLUICE_WRITE_STATE_V9", 9, || {
            let mut s = ClusterState::default();
            s.apply(&Command::Init {
                cluster_id: "v9-cluster-id".into(),
            })
            .unwrap();
            let segment = legacy::RemoteSegmentV9 {
                id: [9; 16],
                base_offset: 100,
                last_offset: 199,
                max_timestamp: 1199,
                size: 4096,
                leader_epoch: 3,
                uploaded_ms: 5,
            };
            let log = legacy::RemoteLogV9 {
                segments: vec![segment],
                log_start: 120,
            };
            let v9 = legacy::ClusterStateV9 {
                cluster_id: s.cluster_id,
                brokers: s.brokers,
                topics: s.topics,
                next_producer_id: s.next_producer_id,
                version: s.version,
                broker_configs: s.broker_configs,
                replicas_placed: s.replicas_placed,
                reassignments: s.reassignments,
                directories: s.directories,
                scram: s.scram,
                group_configs: s.group_configs,
                acls: s.acls,
                quotas: s.quotas,
                endpoints: s.endpoints,
                remote: [("t".to_string(), [(0, log)].into())].into(),
                remote_purge: vec!["gone-00/".into()],
            };
            rkyv::to_bytes::<rkyv::rancor::Error>(&v9).unwrap().to_vec()
        });
        assert_eq!(s.cluster_id, "v9-cluster-id");
        let log = &s.remote["t"][&0];
        assert_eq!(log.log_start, 120);
        assert_eq!(
            (log.segments[0].last_offset, log.segments[0].leader_epoch),
            (199, 3)
        );
        assert_eq!(log.segments[0].last_epoch, UNKNOWN_EPOCH);
        assert_eq!(s.remote_purge, vec!["gone-00/".to_string()]);
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    /// Log matching over remote segments: a replica agrees with a segment whose last
    /// batch it holds in the same epoch, and with every one before it.
    #[test]
    fn a_replica_agrees_with_the_remote_segments_whose_last_batch_it_holds_in_that_epoch() {
        let seg = |base, last, epoch| RemoteSegment {
            last_epoch: epoch,
            ..remote_segment(base, last)
        };
        // Epoch 1 wrote 0..=49, epoch 2 wrote 50..=99 (the old leader's, uploaded).
        let log = RemoteLog {
            segments: vec![seg(0, 29, 1), seg(30, 59, 2), seg(60, 99, 2)],
            log_start: 0,
        };
        // A replica with all of it: agrees to the end.
        let same = |o: i64| (o < 100).then_some(if o < 50 { 1 } else { 2 });
        assert_eq!(log.agreed_end(0, same), 100);
        // A replica elected uncleanly with 0..=39 of epoch 1, then its own epoch 3.
        let unclean = |o: i64| (o < 120).then_some(if o < 40 { 1 } else { 3 });
        assert_eq!(log.agreed_end(0, unclean), 30);
        // Behind (its log ends at 70): agrees as far as it holds.
        let behind = |o: i64| (o < 70).then_some(if o < 50 { 1 } else { 2 });
        assert_eq!(log.agreed_end(0, behind), 60);
        // Nothing in common: before the first segment.
        let other = |o: i64| Some(if o < 10 { 0 } else { 5 });
        assert_eq!(log.agreed_end(0, other), 0);
        // What its history no longer covers counts as agreed.
        assert_eq!(log.agreed_end(60, other), 60);
        // Segments recorded without their last epoch agree.
        let old = RemoteLog {
            segments: vec![seg(0, 29, UNKNOWN_EPOCH), seg(30, 59, 2)],
            log_start: 0,
        };
        assert_eq!(old.agreed_end(0, unclean), 30);
        assert_eq!(RemoteLog::default().agreed_end(0, same), i64::MIN);

        // Where a leader cuts: nowhere when it agrees with all of it; at the end of
        // what it agrees with.
        assert_eq!(log.truncation_point(0, same), None);
        assert_eq!(log.truncation_point(0, unclean), Some(30));
        // A leader whose history begins at 45 (its log starts there: a follower that
        // started over at its leader's log start), holding 45..=79 in epoch 3: the
        // segment 30..=59 holds 30..=44, which only the store has, and nothing says
        // they differ. They stay; the cut is at 45, and the leader uploads 45 on.
        let late = |o: i64| (o < 80).then_some(3);
        assert_eq!(log.agreed_end(45, late), 30);
        assert_eq!(log.truncation_point(45, late), Some(45));
        let mut cut = log.clone();
        cut.truncate(45);
        assert_eq!(cut.end_offset(), Some(45));
        assert_eq!(cut.segment_for(44).map(|s| s.base_offset), Some(30));
    }

    #[test]
    fn the_current_leader_truncates_the_remote_log_and_extends_it_from_there() {
        let mut s = cluster(1);
        create(&mut s, "t", 1, 1);
        let epoch = s.topics["t"].partitions[0].leader_epoch;
        let segs = vec![remote_segment(0, 29), remote_segment(30, 59)];
        s.apply(&Command::AddRemoteSegments {
            topic: "t".into(),
            partition: 0,
            leader_epoch: epoch,
            segments: segs,
        })
        .unwrap();
        // Written by a build before last epochs, still applied.
        let old = legacy::RemoteSegmentV9 {
            id: [6; 16],
            base_offset: 60,
            last_offset: 99,
            max_timestamp: -1,
            size: 10,
            leader_epoch: epoch,
            uploaded_ms: 7,
        };
        s.apply(&Command::AddRemoteSegmentsV9 {
            topic: "t".into(),
            partition: 0,
            leader_epoch: epoch,
            segments: vec![old],
        })
        .unwrap();
        assert_eq!(s.remote["t"][&0].segments[2].last_epoch, UNKNOWN_EPOCH);
        let truncate = |leader_epoch, from| Command::TruncateRemoteSegments {
            topic: "t".into(),
            partition: 0,
            leader_epoch,
            from,
        };
        assert!(matches!(
            s.apply(&truncate(epoch - 1, 30)),
            Err(ApplyError::FencedLeaderEpoch { .. })
        ));
        assert_eq!(s.remote["t"][&0].end_offset(), Some(100));
        s.apply(&truncate(epoch, 30)).unwrap();
        assert_eq!(s.remote["t"][&0].end_offset(), Some(30));
        // A cut inside a segment keeps what is below it, its last epoch now unknown.
        s.apply(&truncate(epoch, 20)).unwrap();
        let log = &s.remote["t"][&0];
        assert_eq!((log.segments.len(), log.end_offset()), (1, Some(20)));
        assert_eq!(log.segments[0].last_epoch, UNKNOWN_EPOCH);
        // Overlapping segments that both reach the cut: the first is cut, the rest go.
        let mut overlap = RemoteLog {
            segments: vec![remote_segment(0, 40), remote_segment(10, 50)],
            log_start: 0,
        };
        overlap.truncate(30);
        assert_eq!(overlap.segments.len(), 1);
        assert_eq!(
            (overlap.segments[0].base_offset, overlap.end_offset()),
            (0, Some(30))
        );
        overlap.truncate(0);
        assert!(overlap.segments.is_empty());
        // The leader's own segment continues from the cut, overlapping is fine.
        s.apply(&Command::AddRemoteSegments {
            topic: "t".into(),
            partition: 0,
            leader_epoch: epoch,
            segments: vec![remote_segment(15, 70)],
        })
        .unwrap();
        assert_eq!(s.remote["t"][&0].end_offset(), Some(71));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        let cmd = truncate(epoch, 5);
        assert_eq!(Command::decode(&cmd.encode()).unwrap(), cmd);
    }

    #[test]
    fn remote_segments_extend_the_remote_log_from_the_current_leader_only() {
        let mut s = cluster(1);
        create(&mut s, "t", 1, 1);
        let epoch = s.topics["t"].partitions[0].leader_epoch;
        let add = |s: &mut ClusterState, epoch, segs: Vec<RemoteSegment>| {
            s.apply(&Command::AddRemoteSegments {
                topic: "t".into(),
                partition: 0,
                leader_epoch: epoch,
                segments: segs,
            })
        };
        assert!(matches!(
            add(&mut s, epoch + 1, vec![remote_segment(0, 9)]),
            Err(ApplyError::FencedLeaderEpoch { .. })
        ));
        add(
            &mut s,
            epoch,
            vec![remote_segment(0, 9), remote_segment(10, 19)],
        )
        .unwrap();
        // Overlapping a new leader's boundaries is fine; going backwards is not.
        add(&mut s, epoch, vec![remote_segment(15, 29)]).unwrap();
        assert!(add(&mut s, epoch, vec![remote_segment(20, 28)]).is_err());
        let log = &s.remote["t"][&0];
        assert_eq!((log.start_offset(), log.end_offset()), (Some(0), Some(30)));
        assert_eq!(log.segment_for(12).unwrap().base_offset, 10);
        assert_eq!(log.segment_for(25).unwrap().base_offset, 15);
        assert!(log.segment_for(30).is_none());
        s.apply(&Command::DeleteRemoteSegments {
            topic: "t".into(),
            partition: 0,
            below: 20,
        })
        .unwrap();
        assert_eq!(s.remote["t"][&0].start_offset(), Some(20));
        // DeleteRecords within a segment: the start moves, the segment stays.
        s.apply(&Command::DeleteRemoteSegments {
            topic: "t".into(),
            partition: 0,
            below: 22,
        })
        .unwrap();
        assert_eq!(s.remote["t"][&0].segments.len(), 1);
        assert_eq!(s.remote["t"][&0].start_offset(), Some(22));
        // Past every segment: none left, and an upload that raced it (wholly below the
        // new start) is refused.
        s.apply(&Command::DeleteRemoteSegments {
            topic: "t".into(),
            partition: 0,
            below: 100,
        })
        .unwrap();
        assert!(s.remote["t"][&0].segments.is_empty());
        assert!(add(&mut s, epoch, vec![remote_segment(30, 50)]).is_err());
        add(&mut s, epoch, vec![remote_segment(90, 120)]).unwrap();
        assert_eq!(s.remote["t"][&0].start_offset(), Some(100));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        // Deleting the topic leaves its folder to purge, until purged.
        let id = s.topics["t"].id;
        s.apply(&Command::DeleteTopic { name: "t".into() }).unwrap();
        assert!(s.remote.is_empty());
        assert_eq!(s.remote_purge, vec![remote_topic_prefix("t", &id)]);
        s.apply(&Command::RemotePurged {
            prefix: remote_topic_prefix("t", &id),
        })
        .unwrap();
        assert!(s.remote_purge.is_empty());
    }

    fn endpoint(listener: &str, port: i32, security_protocol: i16) -> Endpoint {
        Endpoint {
            listener: listener.into(),
            host: "127.0.0.1".into(),
            port,
            security_protocol,
        }
    }

    #[test]
    fn named_listeners_register_and_are_kept_in_snapshots() {
        let mut s = cluster(2);
        let eps = vec![endpoint("INTERNAL", 9200, 1), endpoint("CLIENT", 9300, 3)];
        s.apply(&Command::RegisterBrokerListeners {
            id: 2,
            incarnation: 2,
            rack: Some("zone-b".into()),
            endpoints: eps.clone(),
        })
        .unwrap();
        // The inter-broker listener (the first) is the broker's own host and port.
        assert_eq!(
            (s.brokers[&2].port, s.brokers[&2].rack.as_deref()),
            (9200, Some("zone-b"))
        );
        assert!(!s.brokers[&2].fenced);
        assert_eq!(s.endpoints[&2], eps);
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        // Refused: no listener, a name twice, an unknown protocol.
        for bad in [
            vec![],
            vec![endpoint("A", 1, 0), endpoint("A", 2, 0)],
            vec![endpoint("A", 1, 9)],
        ] {
            let r = s.apply(&Command::RegisterBrokerListeners {
                id: 2,
                incarnation: 3,
                rack: None,
                endpoints: bad,
            });
            assert!(matches!(r, Err(ApplyError::InvalidRequest(_))), "{r:?}");
        }
        assert_eq!(s.endpoints[&2], eps);
        // Registering again with one listener drops the named ones.
        register(&mut s, 2, 4);
        assert!(!s.endpoints.contains_key(&2));
    }

    #[test]
    fn client_quotas_are_set_removed_and_kept_in_snapshots() {
        use crate::quota::{EntityName, QuotaEntity, PRODUCER_BYTE_RATE};
        let mut s = cluster(1);
        let alice = QuotaEntity {
            user: Some(EntityName::Named("alice".into())),
            client_id: None,
        };
        let change = |value: Option<&str>| QuotaChange {
            entity: alice.clone(),
            key: PRODUCER_BYTE_RATE.into(),
            value: value.map(str::to_string),
        };
        let set = Command::AlterClientQuotas {
            changes: vec![change(Some("1048576"))],
        };
        assert_eq!(Command::decode(&set.encode()).unwrap(), set);
        s.apply(&set).unwrap();
        assert_eq!(s.quotas[0].values[PRODUCER_BYTE_RATE], "1048576");
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        assert!(matches!(
            s.apply(&Command::AlterClientQuotas {
                changes: vec![change(Some("-1"))]
            }),
            Err(ApplyError::InvalidRequest(_))
        ));
        s.apply(&Command::AlterClientQuotas {
            changes: vec![change(None)],
        })
        .unwrap();
        assert!(s.quotas.is_empty());
    }

    #[test]
    fn acls_are_created_once_deleted_exactly_and_kept_in_snapshots() {
        use crate::acl::{op, pattern, permission, resource};
        let mut s = cluster(1);
        let binding = |name: &str, operation| Acl {
            resource_type: resource::TOPIC,
            resource_name: name.into(),
            pattern_type: pattern::LITERAL,
            principal: "User:alice".into(),
            host: "*".into(),
            operation,
            permission: permission::ALLOW,
        };
        let (a, b) = (binding("a", op::READ), binding("b", op::WRITE));
        let create = Command::CreateAcls {
            acls: vec![b.clone(), a.clone(), b.clone()],
        };
        assert_eq!(Command::decode(&create.encode()).unwrap(), create);
        s.apply(&create).unwrap();
        assert_eq!(s.acls, vec![a.clone(), b.clone()], "sorted, each once");
        let mut invalid = a.clone();
        invalid.principal = "alice".into();
        assert!(matches!(
            s.apply(&Command::CreateAcls {
                acls: vec![binding("c", op::READ), invalid]
            }),
            Err(ApplyError::InvalidRequest(_))
        ));
        assert_eq!(
            s.acls.len(),
            2,
            "a refused command creates none of its bindings"
        );
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        s.apply(&Command::DeleteAcls {
            acls: vec![a.clone(), binding("gone", op::READ)],
        })
        .unwrap();
        assert_eq!(s.acls, vec![b]);
    }

    #[test]
    fn version_5_snapshots_decode_without_group_configs() {
        let s =
            ClusterState::decode(&hex_fixture(include_str!("../testdata/state-v5.hex"))).unwrap();
        assert_eq!(s.cluster_id, "v5-cluster-id");
        assert_eq!(s.topics["orders"].partitions[0].replicas, vec![1, 2]);
        assert_eq!(s.scram["alice"][&1].iterations, 4096);
        assert_eq!(s.scram["alice"][&1].stored_key, vec![2; 32]);
        assert!(s.group_configs.is_empty());
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn group_configs_are_replaced_removed_and_kept_in_snapshots() {
        let mut s = cluster(1);
        let set = |group: &str, kv: &[(&str, &str)]| Command::AlterGroupConfigs {
            group: group.into(),
            configs: kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        s.apply(&set("g", &[("consumer.session.timeout.ms", "50000")]))
            .unwrap();
        s.apply(&set("g", &[("consumer.heartbeat.interval.ms", "6000")]))
            .unwrap();
        assert_eq!(
            s.group_configs["g"].keys().collect::<Vec<_>>(),
            vec!["consumer.heartbeat.interval.ms"]
        );
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        let cmd = set("g", &[]);
        assert_eq!(Command::decode(&cmd.encode()).unwrap(), cmd);
        s.apply(&cmd).unwrap();
        assert!(s.group_configs.is_empty());
        assert!(matches!(
            s.apply(&set("", &[("a", "b")])),
            Err(ApplyError::InvalidRequest(_))
        ));
    }

    #[test]
    fn version_4_snapshots_decode_without_scram_credentials() {
        let s =
            ClusterState::decode(&hex_fixture(include_str!("../testdata/state-v4.hex"))).unwrap();
        assert_eq!(s.cluster_id, "v4-cluster-id");
        assert_eq!(s.topics["orders"].partitions[1].replicas, vec![2, 3]);
        assert_eq!(s.topics["orders"].configs["retention.ms"], "1000");
        assert_eq!(s.dynamic_broker_config(2, "log.retention.ms"), Some("5000"));
        assert_eq!(s.directories[&1], "dir-one");
        assert_eq!(s.reassignments["orders"][&0].adding, vec![3]);
        assert_eq!(s.reassignments["orders"][&0].removing, vec![2]);
        assert!(s.scram.is_empty());
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    fn credential(byte: u8) -> ScramCredential {
        ScramCredential {
            salt: vec![byte; 16],
            iterations: 4096,
            stored_key: vec![byte; 32],
            server_key: vec![byte ^ 1; 32],
        }
    }

    fn scram_change(user: &str, mechanism: i8, credential: Option<ScramCredential>) -> ScramChange {
        ScramChange {
            user: user.into(),
            mechanism,
            credential,
            only_if_absent: false,
        }
    }

    #[test]
    fn scram_credentials_are_set_replaced_deleted_and_kept_in_snapshots() {
        let mut s = cluster(1);
        let set = |changes| Command::AlterScramCredentials { changes };
        s.apply(&set(vec![
            scram_change("alice", 1, Some(credential(1))),
            scram_change("alice", 2, Some(credential(2))),
            scram_change("bob", 1, Some(credential(3))),
        ]))
        .unwrap();
        assert_eq!(s.scram["alice"].len(), 2);
        // A bootstrap proposal does not undo a later change; a plain upsert replaces.
        let mut bootstrap = scram_change("alice", 1, Some(credential(9)));
        bootstrap.only_if_absent = true;
        s.apply(&set(vec![bootstrap.clone()])).unwrap();
        assert_eq!(s.scram["alice"][&1], credential(1));
        bootstrap.user = "carol".into();
        s.apply(&set(vec![bootstrap])).unwrap();
        assert_eq!(s.scram["carol"][&1], credential(9));
        s.apply(&set(vec![scram_change("alice", 1, Some(credential(5)))]))
            .unwrap();
        assert_eq!(s.scram["alice"][&1], credential(5));
        // Deleting the last credential removes the user; deleting nothing is no change.
        s.apply(&set(vec![
            scram_change("bob", 1, None),
            scram_change("bob", 2, None),
        ]))
        .unwrap();
        assert!(!s.scram.contains_key("bob"));
        // An empty user name refuses the whole command.
        let before = s.clone();
        assert!(matches!(
            s.apply(&set(vec![
                scram_change("dave", 1, Some(credential(4))),
                scram_change("", 1, Some(credential(4))),
            ])),
            Err(ApplyError::InvalidRequest(_))
        ));
        assert_eq!(s.scram, before.scram);
        let decoded = ClusterState::decode(&s.encode()).unwrap();
        assert_eq!(decoded, s);
        assert_eq!(decoded.scram["alice"][&2], credential(2));
        let cmd = set(vec![scram_change("x", 2, Some(credential(7)))]);
        assert_eq!(Command::decode(&cmd.encode()).unwrap(), cmd);
    }

    #[test]
    fn version_3_snapshots_decode_without_reassignments() {
        let s =
            ClusterState::decode(&hex_fixture(include_str!("../testdata/state-v3.hex"))).unwrap();
        assert_eq!(s.cluster_id, "v3-cluster-id");
        assert_eq!(s.topics["orders"].partitions[1].replicas, vec![2, 3]);
        assert_eq!(s.topics["orders"].partitions[2].slots, vec![1, 1]);
        assert_eq!(s.replicas_placed[&3], 2);
        assert_eq!(s.dynamic_broker_config(2, "log.retention.ms"), Some("5000"));
        assert_eq!((s.next_producer_id, s.version), (42, 7));
        assert!(s.reassignments.is_empty());
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn version_2_snapshots_decode_without_slots_and_counting_starts_over() {
        let mut s =
            ClusterState::decode(&hex_fixture(include_str!("../testdata/state-v2.hex"))).unwrap();
        assert_eq!(s.cluster_id, "v2-cluster-id");
        assert_eq!(s.brokers[&1].rack.as_deref(), Some("zone-a"));
        assert_eq!(s.brokers[&2].port, 9093);
        assert_eq!(s.topics["orders"].configs["retention.ms"], "1000");
        assert_eq!(s.topics["orders"].partitions[1].replicas, vec![2, 1]);
        assert_eq!(s.topics["logs"].partitions[0].leader, 2);
        assert_eq!(s.dynamic_broker_config(2, "log.retention.ms"), Some("5000"));
        assert_eq!((s.next_producer_id, s.version), (42, 7));
        // Partitions of the old format have no slots: their brokers hash.
        let slotted = s.topics.values().flat_map(|t| &t.partitions);
        assert!(slotted.clone().all(|p| p.slots.is_empty()));
        assert_eq!(s.topics["orders"].partitions[0].slot_of(1), None);
        assert!(s.replicas_placed.is_empty());
        // Re-encoded, it is the current format and decodes to the same state.
        assert!(s.encode().starts_with(STATE_MAGIC));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
        // New topics count from zero.
        s.apply(&Command::CreateTopic {
            name: "new".into(),
            id: [9; 16],
            configs: BTreeMap::new(),
            assignments: vec![vec![2, 1]],
        })
        .unwrap();
        assert_eq!(s.topics["new"].partitions[0].slots, vec![0, 0]);
        // A format version this build does not know is named, not misread as version 1.
        let mut future = s.encode();
        future[6] = STATE_VERSION + 1;
        assert!(matches!(
            ClusterState::decode(&future),
            Err(DecodeError::SnapshotVersion(v)) if v == STATE_VERSION + 1
        ));
    }

    #[test]
    fn replicas_get_per_broker_sequential_slots_in_partition_order() {
        let mut s = cluster(3);
        let topic = |name: &str, id: u8, assignments: Vec<Vec<BrokerId>>| Command::CreateTopic {
            name: name.into(),
            id: [id; 16],
            configs: BTreeMap::new(),
            assignments,
        };
        let slots = |s: &ClusterState, name: &str| -> Vec<Vec<u64>> {
            s.topics[name]
                .partitions
                .iter()
                .map(|p| p.slots.clone())
                .collect()
        };
        s.apply(&topic("a", 1, vec![vec![1, 2], vec![2, 3], vec![3, 1]]))
            .unwrap();
        // Broker 1's replicas: a-0 (slot 0), a-2 (slot 1); broker 2's: a-0, a-1; ...
        assert_eq!(slots(&s, "a"), vec![vec![0, 0], vec![1, 0], vec![1, 1]]);
        assert_eq!(s.topics["a"].partitions[2].slot_of(1), Some(1));
        assert_eq!(s.topics["a"].partitions[2].slot_of(2), None);
        let placed = s.replicas_placed.clone();
        assert_eq!(placed, [(1, 2), (2, 2), (3, 2)].into());
        // Refused commands hand out nothing.
        assert!(s.apply(&topic("a", 2, vec![vec![1]])).is_err());
        assert!(s.apply(&topic("b", 2, vec![vec![1], vec![4]])).is_err());
        assert_eq!(s.replicas_placed, placed);
        // A snapshot carries slots and counters: a voter restored from it goes on
        // exactly as one that applied every command.
        let mut restored = ClusterState::decode(&s.encode()).unwrap();
        assert_eq!(restored, s);
        let rest = [
            Command::DeleteTopic { name: "a".into() },
            topic("b", 2, vec![vec![1], vec![1, 3]]),
            Command::CreatePartitions {
                name: "b".into(),
                existing: 2,
                assignments: vec![vec![3, 1]],
            },
        ];
        for cmd in &rest {
            s.apply(cmd).unwrap();
            restored.apply(cmd).unwrap();
        }
        assert_eq!(restored, s);
        // Deleted topics leave gaps: the counters go on.
        assert_eq!(slots(&s, "b"), vec![vec![2], vec![3, 2], vec![3, 4]]);
        assert_eq!(s.replicas_placed, [(1, 5), (2, 2), (3, 4)].into());
    }

    #[test]
    fn slots_split_many_small_topics_evenly_over_any_shard_count() {
        // 100 one-partition topics on one broker, and 3-partition topics (RF 1) on two.
        let runs: [(i32, i32, i16, usize); 3] = [(1, 1, 1, 100), (2, 3, 1, 33), (3, 2, 2, 25)];
        for (brokers, partitions, rf, topics) in runs {
            let mut s = cluster(brokers);
            for n in 0..topics {
                create(&mut s, &format!("t{n}"), partitions, rf);
            }
            for shards in 1..=4u64 {
                for b in 1..=brokers {
                    let mut per_shard = vec![0usize; shards as usize];
                    for p in s.topics.values().flat_map(|t| &t.partitions) {
                        if let Some(slot) = p.slot_of(b) {
                            per_shard[(slot % shards) as usize] += 1;
                        }
                    }
                    let (max, min) = (per_shard.iter().max(), per_shard.iter().min());
                    assert!(
                        max.unwrap() - min.unwrap() <= 1,
                        "broker {b}, {shards} shards: {per_shard:?}"
                    );
                }
            }
        }
    }

    fn racked(racks: &[(BrokerId, Option<&str>)]) -> ClusterState {
        let mut s = ClusterState::default();
        for (id, rack) in racks {
            let (host, port, incarnation) = ("127.0.0.1".to_string(), 9090 + id, 1);
            let cmd = match rack {
                Some(r) => Command::RegisterBrokerInRack {
                    id: *id,
                    host,
                    port,
                    incarnation,
                    rack: r.to_string(),
                },
                None => Command::RegisterBroker {
                    id: *id,
                    host,
                    port,
                    incarnation,
                },
            };
            s.apply(&cmd).unwrap();
        }
        s
    }

    fn racks_of(s: &ClusterState, replicas: &[BrokerId]) -> Vec<Option<String>> {
        let mut r: Vec<_> = replicas.iter().map(|b| s.brokers[b].rack.clone()).collect();
        r.sort();
        r.dedup();
        r
    }

    fn leader_counts(assignments: &[Vec<BrokerId>]) -> BTreeMap<BrokerId, usize> {
        let mut counts = BTreeMap::new();
        for a in assignments {
            *counts.entry(a[0]).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn rack_aware_placement_spans_every_rack_and_spreads_leaders() {
        // Six brokers in three racks, listed so that id order groups racks together.
        let s = racked(&[
            (1, Some("a")),
            (2, Some("a")),
            (3, Some("b")),
            (4, Some("b")),
            (5, Some("c")),
            (6, Some("c")),
        ]);
        let placed = s.place(0, 12, 3).unwrap();
        for a in &placed {
            assert_eq!(racks_of(&s, a).len(), 3, "{a:?} spans every rack");
            let mut d = a.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 3, "{a:?} has no broker twice");
        }
        assert!(
            leader_counts(&placed).values().all(|c| *c == 2),
            "{placed:?}"
        );
        // Every broker holds the same number of replicas.
        let mut per_broker = BTreeMap::new();
        for b in placed.iter().flatten() {
            *per_broker.entry(*b).or_insert(0) += 1;
        }
        assert!(per_broker.values().all(|c| *c == 6), "{per_broker:?}");
    }

    #[test]
    fn rack_aware_placement_with_fewer_racks_than_replicas() {
        let s = racked(&[(1, Some("a")), (2, Some("a")), (3, Some("b"))]);
        for a in s.place(0, 6, 2).unwrap() {
            assert_eq!(racks_of(&s, &a).len(), 2, "{a:?} spans both racks");
        }
        // RF 3 over two racks: every partition still has both racks.
        for a in s.place(0, 6, 3).unwrap() {
            assert_eq!(racks_of(&s, &a).len(), 2, "{a:?}");
            assert_eq!(a.len(), 3);
        }
        // Uneven racks: leaders still rotate over every broker.
        let placed = s.place(0, 6, 1).unwrap();
        assert!(
            leader_counts(&placed).values().all(|c| *c == 2),
            "{placed:?}"
        );
    }

    /// Per live broker: (replicas, preferred leaders) over every partition.
    fn spread(s: &ClusterState) -> BTreeMap<BrokerId, (usize, usize)> {
        let mut m: BTreeMap<BrokerId, (usize, usize)> =
            s.live_brokers().into_iter().map(|b| (b, (0, 0))).collect();
        for p in s.topics.values().flat_map(|t| &t.partitions) {
            for (j, b) in p.replicas.iter().enumerate() {
                let e = m.get_mut(b).expect("live");
                e.0 += 1;
                if j == 0 {
                    e.1 += 1;
                }
            }
        }
        m
    }

    fn within_one(m: &BTreeMap<BrokerId, (usize, usize)>) -> bool {
        let gap = |f: fn(&(usize, usize)) -> usize| {
            m.values().map(f).max().unwrap() - m.values().map(f).min().unwrap()
        };
        gap(|c| c.0) <= 1 && gap(|c| c.1) <= 1
    }

    #[test]
    fn placement_counts_partitions_already_placed_so_topics_add_up_evenly() {
        // Replication factors mixed 1 and 3 (RF 3 on 3 brokers puts a replica on every
        // broker), then all 2: sizes that do not divide by 3.
        let ones_and_threes = [
            (1, 1),
            (2, 1),
            (4, 3),
            (5, 1),
            (1, 3),
            (7, 1),
            (2, 3),
            (4, 1),
        ];
        let twos = [
            (1, 2),
            (2, 2),
            (4, 2),
            (5, 2),
            (1, 2),
            (7, 2),
            (2, 2),
            (4, 2),
        ];
        let racks = [(1, Some("a")), (2, Some("b")), (3, Some("c"))];
        // Without racks, and with three racks (placement stays rack-aware).
        let runs = [
            (cluster(3), &ones_and_threes),
            (racked(&racks), &ones_and_threes),
            (cluster(3), &twos),
            (racked(&racks), &twos),
        ];
        for (mut s, sizes) in runs {
            for (n, (partitions, rf)) in sizes.iter().enumerate() {
                create(&mut s, &format!("t{n}"), *partitions, *rf);
                assert!(within_one(&spread(&s)), "after t{n}: {:?}", spread(&s));
            }
            for p in s.topics.values().flat_map(|t| &t.partitions) {
                if s.brokers[&1].rack.is_some() {
                    assert_eq!(racks_of(&s, &p.replicas).len(), p.replicas.len());
                }
            }
        }
        // Five brokers, many single-partition topics: leaders rotate over all of them.
        let mut s = cluster(5);
        for n in 0..23 {
            create(&mut s, &format!("one{n}"), 1, 1);
            assert!(within_one(&spread(&s)), "after one{n}: {:?}", spread(&s));
        }
    }

    #[test]
    fn placement_without_racks_is_unchanged_and_rackless_brokers_form_one_rack() {
        let plain = cluster(3);
        let none = racked(&[(1, None), (2, None), (3, None)]);
        assert_eq!(plain.place(0, 5, 2).unwrap(), none.place(0, 5, 2).unwrap());
        assert_eq!(
            plain.place(0, 3, 2).unwrap(),
            vec![vec![1, 2], vec![2, 3], vec![3, 1]]
        );
        // Brokers 1 and 2 have no rack: together they are one rack beside "x".
        let mixed = racked(&[(1, None), (2, None), (3, Some("x"))]);
        for a in mixed.place(0, 4, 2).unwrap() {
            assert_eq!(racks_of(&mixed, &a).len(), 2, "{a:?}");
        }
    }

    #[test]
    fn racks_are_registered_and_broker_configs_apply_by_scope() {
        let mut s = racked(&[(1, Some("a")), (2, None)]);
        assert_eq!(s.brokers[&1].rack.as_deref(), Some("a"));
        // Re-registering without a rack clears it (the process restarted without one).
        s.apply(&Command::RegisterBroker {
            id: 1,
            host: "h".into(),
            port: 1,
            incarnation: 2,
        })
        .unwrap();
        assert_eq!(s.brokers[&1].rack, None);

        let set = |s: &mut ClusterState, scope, kv: &[(&str, &str)]| {
            s.apply(&Command::AlterBrokerConfigs {
                scope,
                configs: kv
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
        };
        set(&mut s, CLUSTER_DEFAULT, &[("log.retention.ms", "1000")]).unwrap();
        set(&mut s, 2, &[("log.retention.ms", "5")]).unwrap();
        assert_eq!(s.dynamic_broker_config(1, "log.retention.ms"), Some("1000"));
        assert_eq!(s.dynamic_broker_config(2, "log.retention.ms"), Some("5"));
        assert_eq!(s.dynamic_broker_config(2, "log.segment.bytes"), None);
        let version = s.version;
        assert_eq!(
            set(&mut s, 9, &[("log.retention.ms", "5")]),
            Err(ApplyError::UnknownBroker(9))
        );
        assert_eq!(s.version, version);
        set(&mut s, 2, &[]).unwrap();
        assert_eq!(s.dynamic_broker_config(2, "log.retention.ms"), Some("1000"));
        assert_eq!(ClusterState::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn the_cluster_wide_unclean_default_applies_to_topics_without_their_own() {
        let mut s = cluster(2);
        create(&mut s, "t", 1, 2);
        s.apply(&Command::AlterBrokerConfigs {
            scope: CLUSTER_DEFAULT,
            configs: [(UNCLEAN_ELECTION.to_string(), "true".to_string())].into(),
        })
        .unwrap();
        let leader = s.topics["t"].partitions[0].leader;
        let other = if leader == 1 { 2 } else { 1 };
        // The follower leaves the ISR, then the leader dies: with unclean election
        // allowed cluster-wide, the out-of-sync follower takes over when it returns.
        s.apply(&Command::FenceBroker { id: other }).unwrap();
        s.apply(&Command::FenceBroker { id: leader }).unwrap();
        assert_eq!(s.topics["t"].partitions[0].leader, NO_BROKER);
        s.apply(&Command::UnfenceBroker { id: other }).unwrap();
        assert_eq!(s.topics["t"].partitions[0].leader, other);
    }

    /// A topic of `n` partitions, each on brokers 1, 2, 3 and led by 1.
    fn led_by_1(s: &mut ClusterState, name: &str, n: usize) {
        s.apply(&Command::CreateTopic {
            name: name.into(),
            id: [7; 16],
            configs: BTreeMap::new(),
            assignments: vec![vec![1, 2, 3]; n],
        })
        .unwrap();
    }

    fn change(partition: i32, le: i32, pe: i32, new_isr: Vec<BrokerId>) -> IsrChange {
        IsrChange {
            topic: "t".into(),
            partition,
            leader_epoch: le,
            partition_epoch: pe,
            new_isr,
        }
    }

    #[test]
    fn a_batch_of_isr_changes_answers_each_and_a_stale_one_refuses_only_itself() {
        let mut s = cluster(3);
        led_by_1(&mut s, "t", 4);
        let before = s.clone();
        let cmd = Command::AlterPartitions {
            from: 1,
            changes: vec![
                change(0, 0, 0, vec![1, 2]),
                // Stale partition epoch, stale leader epoch, unknown partition.
                change(1, 0, 3, vec![1, 2]),
                change(2, 1, 0, vec![1]),
                change(9, 0, 0, vec![1]),
                change(3, 0, 0, vec![1]),
            ],
        };
        let got = s.apply(&cmd).unwrap();
        assert_eq!(
            got,
            Applied::Partitions(vec![
                Ok(()),
                Err(ApplyError::InvalidUpdateVersion { got: 3, current: 0 }),
                Err(ApplyError::FencedLeaderEpoch { got: 1, current: 0 }),
                Err(ApplyError::UnknownTopicOrPartition),
                Ok(()),
            ])
        );
        let p = |i: usize| &s.topics["t"].partitions[i];
        assert_eq!((p(0).isr.clone(), p(0).partition_epoch), (vec![1, 2], 1));
        assert_eq!(p(1), &before.topics["t"].partitions[1]);
        assert_eq!(p(2), &before.topics["t"].partitions[2]);
        assert_eq!((p(3).isr.clone(), p(3).partition_epoch), (vec![1], 1));
        assert_eq!(s.version, before.version + 1, "one entry, one version");
        // Nothing applied: nothing changed, not even the version.
        let all_stale = s.clone();
        let got = s.apply(&cmd).unwrap();
        let Applied::Partitions(results) = got else {
            panic!("a batch answers per partition: {got:?}")
        };
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert_eq!(s, all_stale);
        assert_eq!(
            s.apply(&Command::AlterPartitions {
                from: 1,
                changes: vec![]
            }),
            Err(ApplyError::InvalidRequest("no ISR changes".into()))
        );
    }

    #[test]
    fn a_batch_applies_as_its_changes_would_one_by_one_in_order() {
        let mut batched = cluster(3);
        led_by_1(&mut batched, "t", 3);
        // Broker 3 is fenced: it may stay in an ISR but not join one.
        batched.apply(&Command::FenceBroker { id: 3 }).unwrap();
        let mut single = batched.clone();
        let pe = |s: &ClusterState, i: usize| s.topics["t"].partitions[i].partition_epoch;
        let (pe0, pe1, pe2) = (pe(&single, 0), pe(&single, 1), pe(&single, 2));
        let changes = vec![
            change(0, 0, pe0, vec![1]),
            // Sees the first change's new partition epoch: judged after it.
            change(0, 0, pe0 + 1, vec![1, 2]),
            change(1, 0, pe1, vec![1, 2, 3]),
            change(1, 0, pe1, vec![1, 1]),
            change(2, 0, pe2, vec![2]),
            change(2, 0, pe2, vec![1]),
            // The second change of partition 2 moved its epoch: this one is stale.
            change(2, 0, pe2, vec![1, 2]),
        ];
        let Applied::Partitions(results) = batched
            .apply(&Command::AlterPartitions {
                from: 1,
                changes: changes.clone(),
            })
            .unwrap()
        else {
            panic!("a batch answers per partition")
        };
        let one_by_one: Vec<Result<(), ApplyError>> = changes
            .into_iter()
            .map(|c| {
                single
                    .apply(&Command::AlterPartition {
                        from: 1,
                        topic: c.topic,
                        partition: c.partition,
                        leader_epoch: c.leader_epoch,
                        partition_epoch: c.partition_epoch,
                        new_isr: c.new_isr,
                    })
                    .map(|a| assert_eq!(a, Applied::Done))
            })
            .collect();
        assert_eq!(results, one_by_one);
        assert_eq!(
            results.iter().map(Result::is_ok).collect::<Vec<_>>(),
            [true, true, false, false, false, true, false]
        );
        assert_eq!(batched.topics, single.topics);
        assert_eq!(batched.topics["t"].partitions[0].isr, vec![1, 2]);
        assert_eq!(batched.topics["t"].partitions[2].isr, vec![1]);
    }

    #[test]
    fn a_batch_of_isr_changes_round_trips_through_the_journal_encoding() {
        let cmd = Command::AlterPartitions {
            from: 2,
            changes: (0..1000).map(|i| change(i, 3, i, vec![2, 1])).collect(),
        };
        assert_eq!(Command::decode(&cmd.encode()).unwrap(), cmd);
    }
}
