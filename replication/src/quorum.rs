//! The metadata quorum: a raft-rs group ordering [`Command`]s among the controller
//! voters, applying committed ones to the [`ClusterState`].
//!
//! Sans-I/O: the caller feeds ticks, incoming messages and proposals, and drives the
//! Ready loop as raft-rs documents it, in two halves:
//!
//! 1. [`Quorum::ready`] returns a [`Persist`]: messages that may leave at once (a
//!    leader's appends go out while it persists), then the snapshot, entries and hard
//!    state the caller must make durable.
//! 2. After they are durable, [`Quorum::advance`] returns the messages that had to wait
//!    for persistence (votes, append acknowledgements) and the commands that committed,
//!    already applied to the state, with their results.
//!
//! Every [`Quorum::snapshot_every`] applied entries the state is snapshotted (rkyv) and
//! the in-memory log compacted; [`Applied::snapshot`] hands the snapshot to the caller
//! so it can compact its durable log too.
//!
//! ## Membership
//!
//! The voters a cluster is born with are its bootstrap list (`--controller-quorum`):
//! the configuration at index 0, the same on every node of that list. Any other node
//! starts with no configuration at all and waits to be added: the leader proposes it as
//! a *learner* (raft-rs' non-voting member; KRaft's observer), which receives the log
//! and applies it, and may later be promoted to voter or removed
//! ([`Quorum::propose_membership`], KIP-853's AddRaftVoter and RemoveRaftVoter), one
//! change at a time, each a simple raft conf change (one voter in or out). Committed
//! changes are applied in log order on every node ([`Applied::membership_changed`]),
//! and snapshots carry the configuration they were taken at.
//!
//! A node that starts with neither the bootstrap configuration nor a snapshot must
//! never replay the log from index 1: it would apply the changes since birth to an
//! empty configuration and miss the bootstrap voters. So it takes no entries until a
//! snapshot reached it. A leader takes a snapshot when a member refuses an append and
//! the last snapshot (if any) does not name it (raft-rs installs no snapshot whose
//! configuration lacks the receiver): an empty log then gets that snapshot, as the
//! log it compacted no longer holds index 1, and so does any member behind it.
//!
//! ## A voter that lost its log
//!
//! Raft's safety assumes a voter never forgets what it acknowledged. A voter whose
//! journal is gone (a wiped or replaced disk) and that rejoins under the same id would
//! break that: its vote could elect a candidate lacking entries committed with its
//! help, and a leader that remembers it as holding entries it lacks sends it a commit
//! index past its log (raft-rs aborts on that) and takes its refusals as stale. So:
//! - A voter of a multi-voter quorum that starts with nothing restored is *amnesiac*:
//!   it grants no vote to a candidate whose log is not empty (a brand-new cluster,
//!   where every log is empty, still elects) until it has applied both an entry of the
//!   current leader's term (so it holds every entry committed before that term) and
//!   everything up to the commit index of the first append or heartbeat it had from
//!   that leader (a heartbeat's is the part of the log the leader counted as this
//!   voter's, an append's the leader's own: either covers every entry committed with
//!   this voter's lost acknowledgements, in this term too). If that leader goes, the
//!   next one's first message sets the mark again. It may campaign (with an empty log
//!   no voter that holds anything votes for it) and, elected, is amnesiac no more.
//!   This guards against one lost log among the voters holding it, not a majority of
//!   them (no rule can). The price: in a brand-new cluster, a
//!   voter that starts only after the others committed entries cannot tell it from a
//!   wiped one, so if one of only two voters holding the log is lost before it has
//!   caught up, no controller is elected until that one returns.
//! - A heartbeat's commit index is clamped to the follower's log end (the commit index
//!   is advisory; raft-rs aborts on one past the log); an amnesiac voter takes such a
//!   heartbeat as an append it cannot accept, and its refusal names its log end.
//! - A leader that sees a follower refuse an append with a log end below what it
//!   counted as replicated there knows the follower lost its log: it forgets what it
//!   counted there and probes from the log end the follower reported.

use raft::prelude::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
    Entry, EntryType, HardState, Message, MessageType, Snapshot,
};
use raft::storage::MemStorage;
use raft::{
    GetEntriesContext, RaftState, RawNode, SnapshotStatus, StateRole, Storage, StorageError,
};

use crate::cluster::{self, ClusterState, Command};

/// Raft ticks between heartbeats and (at least) before an election.
pub const HEARTBEAT_TICKS: usize = 2;
pub const ELECTION_TICKS: usize = 10;

/// What a node restored from its durable log at start.
#[derive(Debug, Default, Clone)]
pub struct Restored {
    pub snapshot: Option<Snapshot>,
    /// Entries after the snapshot, in index order, conflicts already resolved.
    pub entries: Vec<Entry>,
    pub hard_state: Option<HardState>,
}

/// The first half of a Ready: send `send_now`, make the rest durable, then call
/// [`Quorum::advance`].
#[derive(Debug, Default)]
pub struct Persist {
    pub send_now: Vec<Message>,
    /// A snapshot received from the leader, replacing the state and the log.
    pub snapshot: Option<Snapshot>,
    pub entries: Vec<Entry>,
    pub hard_state: Option<HardState>,
}

/// One committed command, applied.
#[derive(Debug)]
pub struct AppliedCommand {
    pub index: u64,
    /// The token given to [`Quorum::propose`] if this node proposed it.
    pub token: Option<u64>,
    pub result: Result<cluster::Applied, cluster::ApplyError>,
}

/// The second half of a Ready.
#[derive(Debug, Default)]
pub struct Applied {
    pub send: Vec<Message>,
    pub commands: Vec<AppliedCommand>,
    /// The state changed (a command applied, or a snapshot installed).
    pub state_changed: bool,
    /// A snapshot taken of the state: persist it, then drop log entries up to its index.
    pub snapshot: Option<Snapshot>,
    /// A membership change applied (the voters or learners changed).
    pub membership_changed: bool,
}

/// One change of the quorum's membership ([`Quorum::propose_membership`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// A node joins as a learner: it receives and applies the log, does not vote.
    AddLearner(u64),
    /// A learner becomes a voter (KIP-853's AddRaftVoter).
    Promote(u64),
    /// A voter leaves the configuration (RemoveRaftVoter).
    Remove(u64),
    /// A learner leaves it (one silent too long); refused if it is a voter by then.
    RemoveLearner(u64),
}

/// A conf change's context marking [`Membership::RemoveLearner`].
const LEARNER_ONLY: &[u8] = b"learner";

/// The quorum's members as this node's applied configuration has them, ascending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

/// Why [`Quorum::new`] could not resume a node from what it restored.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("node id 0 is not a raft id")]
    ZeroId,
    #[error(transparent)]
    Snapshot(#[from] cluster::DecodeError),
    #[error("metadata snapshot: {0}")]
    InstallSnapshot(raft::Error),
    #[error("metadata log: {0}")]
    Log(raft::Error),
    #[error("raft config: {0}")]
    Config(raft::Error),
    #[error("raft: {0}")]
    Raft(raft::Error),
}

/// Bytes that are not the raft record they were read as (see [`decode`]).
#[derive(Debug, thiserror::Error)]
#[error("undecodable raft {kind}: {source}")]
pub struct DecodeError {
    /// The protobuf message type (`Entry`, `HardState`, `Snapshot`, `Message`).
    pub kind: &'static str,
    pub source: protobuf::ProtobufError,
}

#[derive(Debug, thiserror::Error)]
pub enum QuorumError {
    #[error("no controller leader is known; retry")]
    NoLeader,
    #[error("another membership change is not applied yet; retry")]
    MembershipChangePending,
    #[error("membership changes are proposed by the leader only")]
    NotLeader,
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
}

/// raft-rs' in-memory storage plus the snapshot *with its data* (MemStorage's own
/// snapshots carry only metadata).
struct Store {
    mem: MemStorage,
    snapshot: Snapshot,
}

impl Storage for Store {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }
    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }
    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }
    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_metadata().index >= request_index
            && self.snapshot.get_metadata().index > 0
        {
            Ok(self.snapshot.clone())
        } else {
            Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ))
        }
    }
}

pub struct Quorum {
    id: u64,
    node: RawNode<Store>,
    state: ClusterState,
    applied: u64,
    snapshot_index: u64,
    pub snapshot_every: u64,
    pending: Option<(raft::Ready, Vec<Entry>)>,
    snapshots_out: Vec<u64>,
    /// Started with nothing restored among other voters (see the module doc).
    amnesiac: bool,
    /// While amnesiac: the current leader's term and the commit index of its first
    /// message here, which the applied index must reach.
    catch_up: Option<(u64, u64)>,
    /// Followers found to have lost their log (see [`Quorum::take_forgotten`]).
    forgotten: Vec<u64>,
    /// Started outside the bootstrap voters with nothing restored: takes no entries
    /// before a snapshot (see "Membership" in the module doc).
    awaiting_snapshot: bool,
    /// A snapshot taken outside `advance` (for a member with an empty log), handed to
    /// the caller with the next [`Applied`].
    snapshot_out: Option<Snapshot>,
}

/// Peers a snapshot was just handed out for. raft-rs keeps a peer in its snapshot state
/// until told how sending went; a snapshot can be lost on the way like any message, so
/// it is reported as sent at once: the peer goes back to probing, and if the snapshot
/// never arrived the leader finds out from the peer's answer and sends it again.
fn snapshot_targets(msgs: &[Message]) -> impl Iterator<Item = u64> + '_ {
    msgs.iter()
        .filter(|m| m.get_msg_type() == MessageType::MsgSnapshot)
        .map(|m| m.to)
}

/// raft-rs' log lines as `tracing` events of target `raft` (debug, or warn for
/// raft's warnings and errors): `RUST_LOG=raft=debug` shows elections, conf
/// changes and rejected appends.
fn logger() -> slog::Logger {
    slog::Logger::root(RaftLog, slog::o!())
}

struct RaftLog;

impl slog::Drain for RaftLog {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        let warn = record.level().is_at_least(slog::Level::Warning);
        let enabled = if warn {
            tracing::enabled!(target: "raft", tracing::Level::WARN)
        } else {
            tracing::enabled!(target: "raft", tracing::Level::DEBUG)
        };
        if !enabled {
            return Ok(());
        }
        let mut kv = KvText(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut kv);
        let _ = slog::KV::serialize(values, record, &mut kv);
        if warn {
            tracing::warn!(target: "raft", "{}{}", record.msg(), kv.0);
        } else {
            tracing::debug!(target: "raft", "{}{}", record.msg(), kv.0);
        }
        Ok(())
    }
}

struct KvText(String);

impl slog::Serializer for KvText {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments) -> slog::Result {
        use std::fmt::Write;
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl Quorum {
    /// Node `id` (≥ 1) of a cluster born with the voters `bootstrap`, resuming from
    /// `restored`. A node outside `bootstrap` starts with no configuration: a learner
    /// once the leader adds it (see "Membership" in the module doc).
    pub fn new(id: u64, bootstrap: &[u64], restored: Restored) -> Result<Quorum, StartError> {
        if id == 0 {
            return Err(StartError::ZeroId);
        }
        let member = bootstrap.contains(&id);
        let nothing = restored.snapshot.is_none()
            && restored.entries.is_empty()
            && restored.hard_state.is_none();
        // Even a lone bootstrap voter: the cluster may have grown since (its own vote
        // for itself never passes through `step`, and leading clears the flag).
        let amnesiac = nothing;
        let awaiting_snapshot = !member && restored.snapshot.is_none();
        let initial = if member {
            ConfState::from((bootstrap.to_vec(), vec![]))
        } else {
            ConfState::default()
        };
        let mem = MemStorage::new_with_conf_state(initial);
        let mut state = ClusterState::default();
        let mut snapshot = Snapshot::default();
        let mut applied = 0;
        if let Some(s) = restored.snapshot {
            state = ClusterState::decode(s.get_data())?;
            applied = s.get_metadata().index;
            mem.wl()
                .apply_snapshot(s.clone())
                .map_err(StartError::InstallSnapshot)?;
            snapshot = s;
        }
        let entries: Vec<Entry> = restored
            .entries
            .into_iter()
            .filter(|e| e.index > applied)
            .collect();
        mem.wl().append(&entries).map_err(StartError::Log)?;
        if let Some(mut hs) = restored.hard_state {
            let last = mem.last_index().unwrap_or(0);
            hs.commit = hs.commit.clamp(applied, last);
            mem.wl().set_hardstate(hs);
        }
        let config = raft::Config {
            id,
            election_tick: ELECTION_TICKS,
            heartbeat_tick: HEARTBEAT_TICKS,
            applied,
            check_quorum: true,
            pre_vote: true,
            max_inflight_msgs: 256,
            max_size_per_msg: 1 << 20,
            ..Default::default()
        };
        config.validate().map_err(StartError::Config)?;
        let store = Store { mem, snapshot };
        let node = RawNode::new(&config, store, &logger()).map_err(StartError::Raft)?;
        Ok(Quorum {
            id,
            node,
            state,
            applied,
            snapshot_index: applied,
            snapshot_every: 1000,
            pending: None,
            snapshots_out: Vec::new(),
            amnesiac,
            catch_up: None,
            forgotten: Vec::new(),
            awaiting_snapshot,
            snapshot_out: None,
        })
    }

    /// The applied configuration's voters and learners.
    pub fn members(&self) -> Members {
        let cs = self.node.raft.prs().conf().to_conf_state();
        let mut m = Members {
            voters: cs.voters,
            learners: cs.learners,
        };
        m.voters.sort_unstable();
        m.learners.sort_unstable();
        m
    }

    /// Whether a membership change was proposed and is not applied yet.
    pub fn membership_change_pending(&self) -> bool {
        self.node.raft.has_pending_conf()
    }

    /// Proposes one membership change (a simple raft conf change) on the leader; its
    /// result comes back from [`Quorum::advance`] with `token`, as a command's.
    /// Refused while another is pending (raft-rs would turn it into an empty entry
    /// silently) and on a follower (its view of the members may be stale). Each change
    /// is checked again where it applies, against the configuration before it (see
    /// `apply_membership`), so a stale one is refused the same way on every node.
    pub fn propose_membership(
        &mut self,
        change: Membership,
        token: u64,
    ) -> Result<(), QuorumError> {
        if self.leader_id() == 0 {
            return Err(QuorumError::NoLeader);
        }
        if !self.is_leader() {
            return Err(QuorumError::NotLeader);
        }
        if self.membership_change_pending() {
            return Err(QuorumError::MembershipChangePending);
        }
        let (change_type, node_id) = match change {
            Membership::AddLearner(id) => (ConfChangeType::AddLearnerNode, id),
            Membership::Promote(id) => (ConfChangeType::AddNode, id),
            Membership::Remove(id) | Membership::RemoveLearner(id) => {
                (ConfChangeType::RemoveNode, id)
            }
        };
        let mut single = ConfChangeSingle::default();
        single.set_change_type(change_type);
        single.node_id = node_id;
        let mut cc = ConfChangeV2::default();
        cc.set_transition(ConfChangeTransition::Auto);
        cc.set_changes(vec![single].into());
        if matches!(change, Membership::RemoveLearner(_)) {
            cc.set_context(LEARNER_ONLY.to_vec().into());
        }
        self.node
            .propose_conf_change(self.context(token), cc)
            .map_err(|e| match e {
                raft::Error::ProposalDropped => QuorumError::NoLeader,
                e => QuorumError::Raft(e),
            })
    }

    /// A proposal's entry context: this node and its token.
    fn context(&self, token: u64) -> Vec<u8> {
        let mut context = Vec::with_capacity(16);
        context.extend_from_slice(&self.id.to_le_bytes());
        context.extend_from_slice(&token.to_le_bytes());
        context
    }

    /// On the leader: whether the voters left after removing `id` would still have a
    /// majority holding the committed log (else they could elect no one until a
    /// lagging voter caught up: one that never did would vote for no one, see "A voter
    /// that lost its log"). RemoveRaftVoter waits for it.
    pub fn removal_leaves_a_caught_up_majority(&self, id: u64) -> bool {
        let Some(ends) = self.voter_log_ends() else {
            return false;
        };
        // A leader knows the committed log once it committed an entry of its own term.
        let commit = self.commit_index();
        if self.node.raft.raft_log.term(commit).ok() != Some(self.term()) {
            return false;
        }
        let left: Vec<u64> = ends
            .iter()
            .filter(|(v, _)| *v != id)
            .map(|(_, e)| *e)
            .collect();
        let caught_up = left.iter().filter(|end| **end >= commit).count();
        !left.is_empty() && caught_up * 2 > left.len()
    }

    /// On the leader: whether a majority of the voters report a commit index of at
    /// least `index` (in their append and heartbeat answers). A configuration change
    /// takes effect where it applies: until a majority of the new voters know it is
    /// committed, losing this leader can leave them counting votes in the old
    /// configuration (for dead voters just removed: no majority at all).
    pub fn committed_on_majority(&self, index: u64) -> bool {
        if !self.is_leader() {
            return false;
        }
        let voters = self.members().voters;
        let knows = |v: u64| {
            if v == self.id {
                self.commit_index() >= index
            } else {
                self.node
                    .raft
                    .prs()
                    .get(v)
                    .is_some_and(|p| p.committed_index >= index)
            }
        };
        let n = voters.iter().filter(|v| knows(**v)).count();
        n * 2 > voters.len()
    }

    /// On the leader: the log end each learner is known to hold (raft's progress).
    pub fn learner_log_ends(&self) -> Option<Vec<(u64, u64)>> {
        self.log_ends(true)
    }

    /// True while this voter started with nothing restored and has not yet caught up
    /// with a leader of the current term (see the module doc): it grants no vote to a
    /// candidate with a non-empty log.
    pub fn amnesiac(&self) -> bool {
        self.amnesiac
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// The leader's id as this node knows it; 0 when unknown.
    pub fn leader_id(&self) -> u64 {
        self.node.raft.leader_id
    }

    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// The highest log index known committed here.
    pub fn commit_index(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// On the leader, each voter's log end as far as the leader knows it replicated
    /// (its own included), ascending by id; `None` elsewhere (DescribeQuorum).
    pub fn voter_log_ends(&self) -> Option<Vec<(u64, u64)>> {
        self.log_ends(false)
    }

    /// On the leader, the learners' or the voters' log ends (raft's progress; the
    /// leader's own is its last index), ascending by id.
    fn log_ends(&self, of_learners: bool) -> Option<Vec<(u64, u64)>> {
        if !self.is_leader() {
            return None;
        }
        let last = self.node.raft.raft_log.last_index();
        let learners = self.node.raft.prs().conf().learners();
        let mut out: Vec<(u64, u64)> = self
            .node
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| learners.contains(id) == of_learners)
            .map(|(id, pr)| (*id, if *id == self.id { last } else { pr.matched }))
            .collect();
        out.sort_unstable();
        Some(out)
    }

    pub fn applied_index(&self) -> u64 {
        self.applied
    }

    /// Starts an election now (a single voter uses it to lead at once).
    pub fn campaign(&mut self) {
        let _ = self.node.campaign();
    }

    /// Asks raft to hand this leader's role to voter `to` (once it is caught up, raft
    /// tells it to campaign at once); proposals are dropped meanwhile. A controlled
    /// shutdown of the leader uses it, so the others need not wait an election timeout.
    pub fn transfer_leader(&mut self, to: u64) {
        self.node.transfer_leader(to);
    }

    /// Advances raft's logical clock by one tick.
    pub fn tick(&mut self) {
        self.node.tick();
    }

    /// A message from a peer. Messages from unknown nodes or stale terms are dropped by
    /// raft itself; a malformed one is an error for the caller to log.
    pub fn step(&mut self, mut msg: Message) -> Result<(), QuorumError> {
        let from_leader = matches!(
            msg.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat
        );
        if self.amnesiac && from_leader && msg.term >= self.node.raft.term {
            // The first word of each leader (a new term) sets the mark to reach.
            if self.catch_up.is_none_or(|(term, _)| term != msg.term) {
                self.catch_up = Some((msg.term, msg.commit));
            }
        }
        match msg.get_msg_type() {
            MessageType::MsgAppend if self.awaiting_snapshot && msg.index == 0 => {
                return Ok(()); // entries from index 1: see "Membership" in the module doc
            }
            MessageType::MsgHeartbeat => {
                let last = self.node.raft.raft_log.last_index();
                if msg.commit > last && self.amnesiac {
                    // The leader counts on entries this voter lost. Taken as an append
                    // after the leader's commit index, it is refused with this log's
                    // end, which tells the leader where to start again.
                    // (raft-rs reads the term of an index past the log as 0: a
                    // non-zero term never matches there.)
                    msg.set_msg_type(MessageType::MsgAppend);
                    msg.index = msg.commit;
                    msg.log_term = msg.term.max(1);
                }
                msg.commit = msg.commit.min(last);
            }
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
                if self.amnesiac && (msg.index > 0 || msg.log_term > 0) =>
            {
                return Ok(()); // no vote: it may lack what this voter forgot
            }
            MessageType::MsgAppendResponse if msg.reject && self.is_leader() => {
                let from = msg.from;
                let hint = msg.reject_hint;
                let member = self.node.raft.prs().get(from).is_some();
                // Before the first snapshot the log starts at index 1: only an empty
                // log (a joiner, a wiped voter) needs one then.
                let behind = self.snapshot_index > 0 || hint == 0;
                if member
                    && behind
                    && self.applied > self.snapshot_index
                    && !self.snapshot_holds(from)
                {
                    // A member behind the log may need a snapshot (an empty log always
                    // does), and raft-rs installs none whose configuration lacks the
                    // receiver (a member added after the last snapshot, or removed and
                    // added again): take one that names it (once: then it does).
                    self.snapshot_out = Some(self.take_snapshot());
                }
                if let Some(pr) = self.node.raft.mut_prs().get_mut(from) {
                    // (A delayed rejection from before the follower had caught up
                    // also reads so; the reset then only resends what it has.)
                    // Nothing there counts as matched until a probe confirms it.
                    if hint < pr.matched {
                        pr.matched = 0;
                        pr.become_probe();
                        pr.next_idx = hint + 1;
                        self.forgotten.push(from);
                    }
                }
            }
            _ => {}
        }
        Ok(self.node.step(msg)?)
    }

    /// Voters this leader found to have lost their log since the last call (each
    /// time one did): for the caller to log.
    pub fn take_forgotten(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.forgotten)
    }

    /// Proposes `cmd`; on a follower raft forwards it to the leader. The result comes
    /// back from [`Quorum::advance`] with `token`, if it commits. A proposal can be lost
    /// (leader change), so callers wait with a deadline.
    pub fn propose(&mut self, cmd: &Command, token: u64) -> Result<(), QuorumError> {
        if self.leader_id() == 0 {
            return Err(QuorumError::NoLeader);
        }
        self.node
            .propose(self.context(token), cmd.encode())
            .map_err(|e| match e {
                raft::Error::ProposalDropped => QuorumError::NoLeader,
                e => QuorumError::Raft(e),
            })
    }

    /// A peer could not be reached: raft stops pipelining to it.
    pub fn report_unreachable(&mut self, peer: u64) {
        self.node.report_unreachable(peer);
    }

    /// The first half of the Ready loop, or `None` when raft has nothing to do.
    /// Must be followed by [`Quorum::advance`] before the next call.
    pub fn ready(&mut self) -> Option<Persist> {
        assert!(self.pending.is_none(), "advance() the previous ready first");
        if !self.node.has_ready() {
            return None;
        }
        let mut rd = self.node.ready();
        let mut out = Persist {
            send_now: rd.take_messages(),
            ..Default::default()
        };
        self.snapshots_out = snapshot_targets(&out.send_now).collect();
        if !rd.snapshot().is_empty() {
            let s = rd.snapshot().clone();
            self.awaiting_snapshot = false;
            let store = self.node.mut_store();
            store
                .mem
                .wl()
                .apply_snapshot(s.clone())
                .expect("raft hands out snapshots newer than the log");
            store.snapshot = s.clone();
            out.snapshot = Some(s);
        }
        let committed = rd.take_committed_entries();
        if !rd.entries().is_empty() {
            out.entries = rd.entries().clone();
            self.node
                .mut_store()
                .mem
                .wl()
                .append(&out.entries)
                .expect("raft appends after its own log");
        }
        if let Some(hs) = rd.hs() {
            out.hard_state = Some(hs.clone());
            self.node.mut_store().mem.wl().set_hardstate(hs.clone());
        }
        self.pending = Some((rd, committed));
        Some(out)
    }

    /// The second half, once the [`Persist`] is durable.
    pub fn advance(&mut self) -> Applied {
        let (mut rd, committed) = self.pending.take().expect("advance() follows a ready()");
        let mut out = Applied {
            send: rd.take_persisted_messages(),
            ..Default::default()
        };
        if let Some(s) = &self.installed_snapshot(&rd) {
            match ClusterState::decode(s.get_data()) {
                Ok(state) => {
                    self.state = state;
                    self.applied = s.get_metadata().index;
                    self.snapshot_index = self.applied;
                    out.state_changed = true;
                }
                Err(e) => panic!("the leader sent a corrupt metadata snapshot: {e}"),
            }
        }
        self.apply_entries(committed, &mut out);
        let mut light = self.node.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.node.mut_store().mem.wl().mut_hard_state().commit = commit;
        }
        out.send.extend(light.take_messages());
        self.apply_entries(light.take_committed_entries(), &mut out);
        self.node.advance_apply();
        if self.amnesiac && self.is_leader() {
            // Elected: the voters that chose it found its log complete enough, and
            // from now on the log is what it writes.
            self.amnesiac = false;
            self.catch_up = None;
        }
        if self.amnesiac && self.applied > 0 {
            let term = self.node.raft.raft_log.term(self.applied);
            let current = self.node.raft.term;
            let reached = self
                .catch_up
                .is_some_and(|(t, commit)| t == current && self.applied >= commit);
            if term.is_ok_and(|t| t == current) && reached && self.leader_id() != 0 {
                self.amnesiac = false;
                self.catch_up = None;
            }
        }
        let targets: Vec<u64> = snapshot_targets(&out.send)
            .chain(std::mem::take(&mut self.snapshots_out))
            .collect();
        for to in targets {
            self.node.report_snapshot(to, SnapshotStatus::Finish);
        }
        if self.applied >= self.snapshot_index + self.snapshot_every {
            out.snapshot = Some(self.take_snapshot());
        }
        // One taken in `step` is handed out unless a newer one replaced it.
        if let Some(s) = self.snapshot_out.take() {
            if out.snapshot.is_none() && s.get_metadata().index == self.snapshot_index {
                out.snapshot = Some(s);
            }
        }
        out
    }

    fn installed_snapshot(&self, rd: &raft::Ready) -> Option<Snapshot> {
        (!rd.snapshot().is_empty()).then(|| rd.snapshot().clone())
    }

    fn apply_entries(&mut self, entries: Vec<Entry>, out: &mut Applied) {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            self.applied = e.index;
            let token = (e.context.len() == 16
                && u64::from_le_bytes(e.context[..8].try_into().unwrap()) == self.id)
                .then(|| u64::from_le_bytes(e.context[8..].try_into().unwrap()));
            if e.get_entry_type() != EntryType::EntryNormal {
                let result = self.apply_membership(&e);
                out.membership_changed |= result.is_ok();
                out.commands.push(AppliedCommand {
                    index: e.index,
                    token,
                    result,
                });
                continue;
            }
            if e.data.is_empty() {
                continue; // the leader's empty entry of a new term
            }
            let result = match Command::decode(&e.data) {
                Ok(cmd) => self.state.apply(&cmd),
                Err(err) => Err(cluster::ApplyError::InvalidRequest(format!(
                    "entry {}: {err}",
                    e.index
                ))),
            };
            out.state_changed |= result.is_ok();
            out.commands.push(AppliedCommand {
                index: e.index,
                token,
                result,
            });
        }
    }

    /// Whether the last snapshot exists and its configuration names `id`.
    fn snapshot_holds(&self, id: u64) -> bool {
        let snapshot = &self.node.store().snapshot;
        let cs = snapshot.get_metadata().get_conf_state();
        snapshot.get_metadata().index > 0 && (cs.voters.contains(&id) || cs.learners.contains(&id))
    }

    /// Applies a committed conf change entry to raft's configuration and the storage's
    /// (which the next snapshot records). A change raft refuses is refused the same
    /// way on every node (it depends only on the configuration before it).
    fn apply_membership(&mut self, e: &Entry) -> Result<cluster::Applied, cluster::ApplyError> {
        let refused = |why: String| {
            cluster::ApplyError::InvalidRequest(format!("membership change {}: {why}", e.index))
        };
        let cc = if e.get_entry_type() == EntryType::EntryConfChange {
            // Version 1 (never proposed here): one change, as its version 2.
            let v1 = decode::<ConfChange>(&e.data).map_err(|err| refused(err.to_string()))?;
            let mut single = ConfChangeSingle::default();
            single.set_change_type(v1.get_change_type());
            single.node_id = v1.node_id;
            let mut cc = ConfChangeV2::default();
            cc.set_changes(vec![single].into());
            cc
        } else {
            decode::<ConfChangeV2>(&e.data).map_err(|err| refused(err.to_string()))?
        };
        let before = self.members();
        for c in cc.get_changes() {
            let id = c.node_id;
            let (voter, learner) = (before.voters.contains(&id), before.learners.contains(&id));
            let fits = match c.get_change_type() {
                ConfChangeType::AddNode => learner,
                ConfChangeType::AddLearnerNode => !voter,
                ConfChangeType::RemoveNode if cc.get_context() == LEARNER_ONLY => learner,
                ConfChangeType::RemoveNode => voter,
            };
            if !fits {
                // Proposed on a view the log has moved past (a promotion of a node
                // removed meanwhile, a learner's removal once it votes, ...).
                return Err(refused(format!(
                    "{:?} of node {id} does not fit the configuration {before:?}",
                    c.get_change_type()
                )));
            }
        }
        let cs = self
            .node
            .apply_conf_change(&cc)
            .map_err(|err| refused(err.to_string()))?;
        let removed = !cs.voters.contains(&self.id);
        self.node.mut_store().mem.wl().set_conf_state(cs);
        if removed && self.is_leader() {
            // raft-rs keeps a leader that removed itself leading, and then fails on its
            // own missing progress: step down, and the voters elect another. (The
            // shell hands the leadership over before removing the leader; this is
            // for a leadership that moved to the removed voter meanwhile.)
            let term = self.node.raft.term;
            self.node.raft.become_follower(term, raft::INVALID_ID);
        }
        Ok(cluster::Applied::Done)
    }

    /// Snapshots the state at the applied index and compacts the in-memory log.
    fn take_snapshot(&mut self) -> Snapshot {
        let store = self.node.mut_store();
        let term = store.mem.term(self.applied).unwrap_or(0);
        let mut s = Snapshot::default();
        s.set_data(self.state.encode().into());
        let meta = s.mut_metadata();
        meta.index = self.applied;
        meta.term = term;
        meta.set_conf_state(store.mem.initial_state().unwrap().conf_state);
        store.snapshot = s.clone();
        store
            .mem
            .wl()
            .compact(self.applied)
            .expect("compacting to the applied index");
        self.snapshot_index = self.applied;
        s
    }
}

/// Wire and disk encoding of raft's protobuf types (messages, entries, hard states,
/// snapshots).
pub fn encode<M: protobuf::Message>(m: &M) -> Vec<u8> {
    m.write_to_bytes().expect("raft's protobuf types encode")
}

pub fn decode<M: protobuf::Message>(b: &[u8]) -> Result<M, DecodeError> {
    M::parse_from_bytes(b).map_err(|source| DecodeError {
        kind: short_type_name::<M>(),
        source,
    })
}

/// `raft_proto::eraftpb::Entry` → `Entry`.
fn short_type_name<M>() -> &'static str {
    let full = std::any::type_name::<M>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Rebuilds a node's durable state from its journal records in write order: a
/// snapshot resets the log, an entry replaces any entries from its index on (raft
/// overwrites a conflicting suffix by appending), the last hard state wins.
#[derive(Default)]
pub struct Replay {
    restored: Restored,
}

impl Replay {
    pub fn snapshot(&mut self, s: Snapshot) {
        let idx = s.get_metadata().index;
        self.restored.entries.retain(|e| e.index > idx);
        self.restored.snapshot = Some(s);
    }
    pub fn entry(&mut self, e: Entry) {
        let entries = &mut self.restored.entries;
        while entries.last().is_some_and(|l| l.index >= e.index) {
            entries.pop();
        }
        entries.push(e);
    }
    pub fn hard_state(&mut self, h: HardState) {
        self.restored.hard_state = Some(h);
    }
    pub fn finish(self) -> Restored {
        self.restored
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, VecDeque};

    /// Nodes exchanging messages in memory, with a durable journal per node kept as
    /// the records `Persist` asked to write.
    struct Net {
        nodes: BTreeMap<u64, Quorum>,
        disks: BTreeMap<u64, Vec<Record>>,
        inflight: VecDeque<Message>,
        down: Vec<u64>,
        results: Vec<(u64, AppliedCommand)>,
        /// The voters the cluster was born with.
        bootstrap: Vec<u64>,
    }

    #[derive(Clone)]
    enum Record {
        Snap(Snapshot),
        Entry(Entry),
        Hs(HardState),
    }

    impl Net {
        fn new(n: u64) -> Net {
            let voters: Vec<u64> = (1..=n).collect();
            let nodes = voters
                .iter()
                .map(|&id| (id, Quorum::new(id, &voters, Restored::default()).unwrap()))
                .collect();
            Net {
                nodes,
                disks: voters.iter().map(|&id| (id, Vec::new())).collect(),
                inflight: VecDeque::new(),
                down: Vec::new(),
                results: Vec::new(),
                bootstrap: voters,
            }
        }

        /// Proposes the registration of brokers `ids` at `at`, one at a time.
        fn register_at(&mut self, at: u64, ids: std::ops::Range<i32>) {
            for id in ids {
                self.nodes
                    .get_mut(&at)
                    .unwrap()
                    .propose(&register(id), 0)
                    .unwrap();
                self.drive();
            }
        }

        /// A node outside the bootstrap voters starts with an empty disk.
        fn join(&mut self, id: u64) {
            let q = Quorum::new(id, &self.bootstrap, Restored::default()).unwrap();
            assert!(
                q.members().voters.is_empty(),
                "a joiner knows no configuration"
            );
            self.nodes.insert(id, q);
            self.disks.insert(id, Vec::new());
        }

        fn ticks(&mut self, n: usize) {
            for _ in 0..n {
                for (id, q) in self.nodes.iter_mut() {
                    if !self.down.contains(id) {
                        q.tick();
                    }
                }
                self.drive();
            }
        }

        /// Proposes a membership change at the leader and drives it.
        fn change_unchecked(&mut self, leader: u64, change: Membership) {
            self.nodes
                .get_mut(&leader)
                .unwrap()
                .propose_membership(change, 98)
                .unwrap();
            self.drive();
            self.ticks(HEARTBEAT_TICKS * 2);
        }

        /// Proposes a membership change at the leader and drives it to be applied there.
        fn change(&mut self, leader: u64, change: Membership) {
            self.nodes
                .get_mut(&leader)
                .unwrap()
                .propose_membership(change, 99)
                .unwrap();
            self.drive();
            self.ticks(HEARTBEAT_TICKS * 2);
            let applied = self
                .results
                .iter()
                .any(|(n, c)| *n == leader && c.token == Some(99) && c.result.is_ok());
            assert!(applied, "{change:?} applied at the leader");
            self.results.clear();
        }

        fn drive(&mut self) {
            for _ in 0..1000 {
                let mut busy = false;
                let ids: Vec<u64> = self.nodes.keys().copied().collect();
                for id in ids {
                    if self.down.contains(&id) {
                        continue;
                    }
                    let q = self.nodes.get_mut(&id).unwrap();
                    while let Some(p) = q.ready() {
                        busy = true;
                        self.inflight.extend(p.send_now);
                        let disk = self.disks.get_mut(&id).unwrap();
                        if let Some(s) = p.snapshot {
                            disk.push(Record::Snap(s));
                        }
                        disk.extend(p.entries.into_iter().map(Record::Entry));
                        if let Some(h) = p.hard_state {
                            disk.push(Record::Hs(h));
                        }
                        let a = q.advance();
                        self.inflight.extend(a.send);
                        if let Some(s) = a.snapshot {
                            disk.push(Record::Snap(s));
                        }
                        self.results.extend(a.commands.into_iter().map(|c| (id, c)));
                    }
                }
                while let Some(m) = self.inflight.pop_front() {
                    busy = true;
                    if self.down.contains(&m.to) || self.down.contains(&m.from) {
                        continue;
                    }
                    let _ = self.nodes.get_mut(&m.to).unwrap().step(m);
                }
                if !busy {
                    return;
                }
            }
            panic!("no quiescence");
        }

        fn tick_until_leader(&mut self) -> u64 {
            for _ in 0..500 {
                for (id, q) in self.nodes.iter_mut() {
                    if !self.down.contains(id) {
                        q.tick();
                    }
                }
                self.drive();
                // The newest term's: a node that was cut off while leading still
                // believes it leads until it hears of a newer term.
                if let Some((id, _)) = self
                    .nodes
                    .iter()
                    .filter(|(id, q)| !self.down.contains(id) && q.is_leader())
                    .max_by_key(|(_, q)| q.term())
                {
                    return *id;
                }
            }
            panic!("no leader elected");
        }

        fn restart(&mut self, id: u64) {
            let mut replay = Replay::default();
            for r in self.disks[&id].clone() {
                match r {
                    Record::Snap(s) => replay.snapshot(s),
                    Record::Entry(e) => replay.entry(e),
                    Record::Hs(h) => replay.hard_state(h),
                }
            }
            self.nodes.insert(
                id,
                Quorum::new(id, &self.bootstrap, replay.finish()).unwrap(),
            );
            self.down.retain(|d| *d != id);
        }
    }

    /// The first log record written is a snapshot (hard states may come before).
    fn starts_from_a_snapshot(disk: &[Record]) -> bool {
        disk.iter()
            .find(|r| !matches!(r, Record::Hs(_)))
            .is_some_and(|r| matches!(r, Record::Snap(_)))
    }

    fn register(id: i32) -> Command {
        Command::RegisterBroker {
            id,
            host: "127.0.0.1".into(),
            port: 9092,
            incarnation: 1,
        }
    }

    #[test]
    fn a_node_joins_as_a_learner_from_a_snapshot_is_promoted_and_replaces_a_voter() {
        let mut net = Net::new(3);
        let leader = net.tick_until_leader();
        net.register_at(leader, 10..10 + 10);
        net.join(4);
        // Not in the configuration: nobody sends it anything.
        net.ticks(20);
        assert!(net.nodes[&4].state().brokers.is_empty());
        net.change(leader, Membership::AddLearner(4));
        net.ticks(HEARTBEAT_TICKS * 4);
        let expect = net.nodes[&leader].state().brokers.clone();
        assert_eq!(expect.len(), 10);
        assert_eq!(
            net.nodes[&4].state().brokers,
            expect,
            "the learner applies the log"
        );
        assert!(
            starts_from_a_snapshot(&net.disks[&4]),
            "a joiner starts from a snapshot, never from index 1"
        );
        let members = net.nodes[&4].members();
        assert_eq!(
            members.voters,
            vec![1, 2, 3],
            "the snapshot carried the voters"
        );
        assert_eq!(members.learners, vec![4]);
        // A second joiner needs a newer snapshot: raft-rs installs none whose
        // configuration lacks the receiver.
        net.join(5);
        net.change(leader, Membership::AddLearner(5));
        net.ticks(HEARTBEAT_TICKS * 4);
        assert_eq!(net.nodes[&5].state().brokers, expect);
        assert!(starts_from_a_snapshot(&net.disks[&5]));
        assert_eq!(net.nodes[&leader].learner_log_ends().unwrap().len(), 2);
        // A learner never campaigns, even with the voters gone.
        net.down.extend([1, 2, 3]);
        net.ticks(ELECTION_TICKS * 5);
        assert!(!net.nodes[&4].is_leader());
        net.down.clear();
        let leader = net.tick_until_leader();
        assert!(matches!(
            net.nodes
                .get_mut(&leader)
                .unwrap()
                .propose_membership(Membership::Promote(4), 1),
            Ok(())
        ));
        assert!(matches!(
            net.nodes
                .get_mut(&leader)
                .unwrap()
                .propose_membership(Membership::Remove(1), 2),
            Err(QuorumError::MembershipChangePending)
        ));
        net.drive();
        net.ticks(HEARTBEAT_TICKS * 2);
        for q in net.nodes.values() {
            assert_eq!(q.members().voters, vec![1, 2, 3, 4], "node {}", q.id());
        }
        // Every voter learns the promotion is committed: the leader sees it.
        let leader = net.tick_until_leader();
        let commit = net.nodes[&leader].commit_index();
        net.ticks(HEARTBEAT_TICKS * 2);
        assert!(net.nodes[&leader].committed_on_majority(commit));
        assert!(!net.nodes[&leader].committed_on_majority(commit + 1));
        // Replace voter 1 (its machine is dead): remove it, and 2 going down as well
        // leaves 3 and 4, a majority of {2, 3, 4}.
        net.down.push(1);
        let leader = net.tick_until_leader();
        net.change(leader, Membership::Remove(1));
        net.down.push(2);
        let leader = net.tick_until_leader();
        assert!([3, 4].contains(&leader), "leader {leader}");
        net.nodes
            .get_mut(&leader)
            .unwrap()
            .propose(&register(42), 5)
            .unwrap();
        net.drive();
        net.ticks(HEARTBEAT_TICKS * 2);
        assert!(net.nodes[&3].state().brokers.contains_key(&42));
        assert!(net.nodes[&4].state().brokers.contains_key(&42));
        // Node 4 restarts from its journal: still a voter, same state.
        net.restart(4);
        net.ticks(ELECTION_TICKS * 3);
        assert_eq!(net.nodes[&4].members().voters, vec![2, 3, 4]);
        assert!(net.nodes[&4].state().brokers.contains_key(&42));
        // Voter 1 comes back with its old journal (it missed its removal): the shell's
        // leader adds it as a learner when it hears it, it learns of its removal and
        // never leads, though it starts out believing it votes.
        net.down.retain(|d| *d != 2);
        net.restart(1);
        let leader = net.tick_until_leader();
        net.change(leader, Membership::AddLearner(1));
        net.ticks(ELECTION_TICKS * 3);
        let members = net.nodes[&1].members();
        assert_eq!(
            (members.voters, members.learners),
            (vec![2, 3, 4], vec![1, 5])
        );
        assert!(net.nodes[&1].state().brokers.contains_key(&42));
        assert!(!net.nodes[&1].is_leader());
    }

    #[test]
    fn membership_changes_are_the_leaders_and_a_stale_one_is_refused_where_it_applies() {
        let mut net = Net::new(3);
        let leader = net.tick_until_leader();
        let follower = (1..=3).find(|i| *i != leader).unwrap();
        assert!(matches!(
            net.nodes
                .get_mut(&follower)
                .unwrap()
                .propose_membership(Membership::AddLearner(4), 1),
            Err(QuorumError::NotLeader)
        ));
        // A promotion of a node that is no learner, a learner's removal of a voter:
        // both refused on every node, the configuration unchanged.
        for (token, change) in [
            (7, Membership::Promote(4)),
            (8, Membership::RemoveLearner(follower)),
        ] {
            net.nodes
                .get_mut(&leader)
                .unwrap()
                .propose_membership(change, token)
                .unwrap();
            net.drive();
            net.ticks(HEARTBEAT_TICKS * 2);
            let at = net
                .results
                .iter()
                .find(|(n, c)| *n == leader && c.token == Some(token))
                .map(|(_, c)| (c.index, c.result.is_err()));
            let Some((index, true)) = at else {
                panic!("{change:?} refused at the leader")
            };
            for id in 1..=3 {
                let refused = net
                    .results
                    .iter()
                    .any(|(n, c)| *n == id && c.index == index && c.result.is_err());
                assert!(refused, "{change:?} refused by node {id} too");
            }
        }
        for q in net.nodes.values() {
            assert_eq!(q.members().voters, vec![1, 2, 3]);
            assert!(q.members().learners.is_empty());
        }
        // The leader removing itself steps down; the others elect one of them.
        net.results.clear();
        net.change_unchecked(leader, Membership::Remove(leader));
        let next = net.tick_until_leader();
        assert_ne!(next, leader);
        assert_eq!(net.nodes[&next].members().voters.len(), 2);
        assert!(!net.nodes[&leader].is_leader());
    }

    #[test]
    fn a_learner_promoted_and_then_wiped_starts_again_from_a_snapshot() {
        let mut net = Net::new(3);
        let leader = net.tick_until_leader();
        net.join(4);
        net.change(leader, Membership::AddLearner(4));
        net.change(leader, Membership::Promote(4));
        net.register_at(leader, 10..10 + 5);
        net.ticks(HEARTBEAT_TICKS * 2);
        // Its disk is wiped: with no snapshot it must not replay from index 1 (it would
        // apply AddLearner(4), Promote(4) to an empty configuration: voters {4}).
        net.disks.insert(4, Vec::new());
        net.restart(4);
        net.ticks(ELECTION_TICKS * 3);
        let q = &net.nodes[&4];
        assert_eq!(q.members().voters, vec![1, 2, 3, 4]);
        assert_eq!(q.state().brokers.len(), 5);
        assert!(starts_from_a_snapshot(&net.disks[&4]));
    }

    #[test]
    fn a_single_voter_commits_alone() {
        let mut net = Net::new(1);
        net.tick_until_leader();
        net.nodes
            .get_mut(&1)
            .unwrap()
            .propose(&register(1), 7)
            .unwrap();
        net.drive();
        assert_eq!(net.results.len(), 1);
        assert_eq!(net.results[0].1.token, Some(7));
        assert!(net.nodes[&1].state().brokers.contains_key(&1));
    }

    #[test]
    fn three_voters_agree_and_followers_forward_proposals() {
        let mut net = Net::new(3);
        let leader = net.tick_until_leader();
        let follower = (1..=3).find(|i| *i != leader).unwrap();
        net.nodes
            .get_mut(&follower)
            .unwrap()
            .propose(&register(5), 1)
            .unwrap();
        net.drive();
        // Heartbeats carry the commit index to followers.
        for _ in 0..HEARTBEAT_TICKS * 2 {
            net.nodes.get_mut(&leader).unwrap().tick();
            net.drive();
        }
        for q in net.nodes.values() {
            assert!(q.state().brokers.contains_key(&5), "node {}", q.id());
        }
        let mine: Vec<_> = net.results.iter().filter(|(n, _)| *n == follower).collect();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].1.token, Some(1), "the proposer learns its result");
    }

    #[test]
    fn a_new_leader_is_elected_and_a_restarted_node_catches_up_from_a_snapshot() {
        let mut net = Net::new(3);
        for q in net.nodes.values_mut() {
            q.snapshot_every = 5;
        }
        let leader = net.tick_until_leader();
        net.down.push(leader);
        let next = net.tick_until_leader();
        assert_ne!(next, leader);
        for i in 0..20 {
            net.nodes
                .get_mut(&next)
                .unwrap()
                .propose(&register(10 + i), 0)
                .unwrap();
            net.drive();
        }
        // The old leader restarts from its journal, far behind a compacted log.
        net.restart(leader);
        for _ in 0..50 {
            for q in net.nodes.values_mut() {
                q.tick();
            }
            net.drive();
        }
        let expect = net.nodes[&next].state().clone();
        assert_eq!(expect.brokers.len(), 20);
        for q in net.nodes.values() {
            assert_eq!(q.state().brokers, expect.brokers, "node {}", q.id());
        }
        // And the restarted node's journal now replays to the same state.
        for q in net.nodes.values_mut() {
            q.snapshot_every = 1000;
        }
        net.restart(leader);
        for _ in 0..30 {
            for q in net.nodes.values_mut() {
                q.tick();
            }
            net.drive();
        }
        assert_eq!(net.nodes[&leader].state().brokers, expect.brokers);
    }

    #[test]
    fn a_voter_that_lost_its_log_never_elects_a_stale_candidate_and_catches_up() {
        let mut net = Net::new(3);
        let leader = net.tick_until_leader();
        net.register_at(leader, 10..10 + 5);
        for _ in 0..HEARTBEAT_TICKS * 2 {
            net.nodes.get_mut(&leader).unwrap().tick();
            net.drive();
        }
        assert!(
            net.nodes.values().all(|q| !q.amnesiac()),
            "a healthy cluster has caught up"
        );
        let wiped = (1..=3).find(|i| *i != leader).unwrap();
        // The wiped voter comes back with nothing: the leader remembers it as holding
        // the log, and its heartbeats carry a commit index past the empty log.
        net.disks.insert(wiped, Vec::new());
        net.restart(wiped);
        assert!(net.nodes[&wiped].amnesiac());
        for _ in 0..HEARTBEAT_TICKS * 4 {
            net.nodes.get_mut(&leader).unwrap().tick();
            net.drive();
        }
        assert_eq!(
            net.nodes.get_mut(&leader).unwrap().take_forgotten(),
            vec![wiped]
        );
        let expect = net.nodes[&leader].state().brokers.clone();
        assert_eq!(
            net.nodes[&wiped].state().brokers,
            expect,
            "it fetched the log again"
        );
        // Applying entries of an older term is not enough to vote again: only one of
        // the current leader's term is.
        assert!(!net.nodes[&wiped].amnesiac() || net.nodes[&wiped].applied_index() > 0);
        net.nodes
            .get_mut(&leader)
            .unwrap()
            .propose(&register(99), 0)
            .unwrap();
        net.drive();
        for _ in 0..HEARTBEAT_TICKS * 2 {
            net.nodes.get_mut(&leader).unwrap().tick();
            net.drive();
        }
        assert!(!net.nodes[&wiped].amnesiac());

        // Now the unsafe case: the voter is wiped again and the leader goes down
        // before it caught up. The wiped voter cannot tell whether `other` has what
        // it once acknowledged, so it votes for no one: no leader (safety over
        // liveness) until the old leader is back.
        net.disks.insert(wiped, Vec::new());
        net.restart(wiped);
        net.down.push(leader);
        for _ in 0..ELECTION_TICKS * 6 {
            for (id, q) in net.nodes.iter_mut() {
                if *id != leader {
                    q.tick();
                }
            }
            net.drive();
        }
        assert!(net
            .nodes
            .iter()
            .all(|(id, q)| *id == leader || !q.is_leader()));
        net.restart(leader);
        net.tick_until_leader();
        for _ in 0..ELECTION_TICKS * 2 {
            for q in net.nodes.values_mut() {
                q.tick();
            }
            net.drive();
        }
        for q in net.nodes.values() {
            assert_eq!(q.state().brokers.len(), expect.len() + 1, "node {}", q.id());
        }
        // An amnesiac voter refuses a candidate with a log, not one without.
        let mut fresh = Quorum::new(1, &[1, 2, 3], Restored::default()).unwrap();
        assert!(fresh.amnesiac());
        let vote = |index, log_term| Message {
            msg_type: MessageType::MsgRequestVote,
            from: 2,
            to: 1,
            term: 5,
            index,
            log_term,
            ..Default::default()
        };
        fresh.step(vote(7, 3)).unwrap();
        assert!(
            fresh.ready().is_none(),
            "no answer to a candidate with a log"
        );
        fresh.step(vote(0, 0)).unwrap();
        let answer = fresh.ready().map(|p| {
            let mut all = p.send_now;
            all.extend(fresh.advance().send);
            all
        });
        let granted = answer
            .unwrap_or_default()
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgRequestVoteResponse && !m.reject);
        assert!(granted, "a brand-new cluster still elects");
    }

    /// Drives one node's Ready loop until quiet (its output is dropped).
    fn settle(q: &mut Quorum) {
        while q.ready().is_some() {
            q.advance();
        }
    }

    #[test]
    fn an_amnesiac_voter_votes_again_only_past_the_first_commit_index_its_leader_sent() {
        let mut q = Quorum::new(3, &[1, 2, 3], Restored::default()).unwrap();
        let entries = |from: u64, to: u64| -> Vec<Entry> {
            (from..=to)
                .map(|index| Entry {
                    index,
                    term: 2,
                    data: register(index as i32).encode().into(),
                    ..Default::default()
                })
                .collect()
        };
        let append = |index, log_term, ents: Vec<Entry>, commit| Message {
            msg_type: MessageType::MsgAppend,
            from: 1,
            to: 3,
            term: 2,
            index,
            log_term,
            entries: ents.into(),
            commit,
            ..Default::default()
        };
        // Leader 1 of term 2 has committed up to 10 (with this voter's help, before
        // its disk was wiped); the first batch brings entries 1-5 of term 2.
        q.step(append(0, 0, entries(1, 5), 10)).unwrap();
        settle(&mut q);
        assert_eq!(q.applied_index(), 5);
        assert!(
            q.amnesiac(),
            "entries of the current term, but short of what was committed"
        );
        q.step(append(5, 2, entries(6, 10), 10)).unwrap();
        settle(&mut q);
        assert_eq!(q.applied_index(), 10);
        assert!(!q.amnesiac());
    }

    #[test]
    fn replay_resolves_overwritten_suffixes() {
        let e = |index, term| Entry {
            index,
            term,
            ..Default::default()
        };
        let mut r = Replay::default();
        for x in [e(1, 1), e(2, 1), e(3, 1), e(2, 2), e(3, 2), e(4, 2)] {
            r.entry(x);
        }
        let got: Vec<(u64, u64)> = r
            .finish()
            .entries
            .iter()
            .map(|e| (e.index, e.term))
            .collect();
        assert_eq!(got, vec![(1, 1), (2, 2), (3, 2), (4, 2)]);
    }

    /// Seeded chaos for the quorum alone: random message loss, delay, reordering and
    /// duplication, network partitions, crashes that restart a node from exactly what it
    /// had persisted, and proposals from any node. Checks after every step that no two
    /// nodes ever apply different commands at the same index (state machine safety) and,
    /// after healing, that every command a proposer saw committed is applied everywhere.
    /// Membership proposals' tokens start here (registrations' are broker ids).
    const MEMBERSHIP_TOKENS: u64 = 1 << 40;

    /// Random ticks, deliveries (reordered, dropped, duplicated), proposals, crashes
    /// with restarts from the persisted records, and a node cut off, over `voters`
    /// bootstrap voters and `joiners` nodes outside them that membership changes add,
    /// promote and remove meanwhile; then heal and check every member converged.
    fn chaos(seed: u64, voters: u64, joiners: u64, steps: usize) -> usize {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let bootstrap: Vec<u64> = (1..=voters).collect();
        let ids: Vec<u64> = (1..=voters + joiners).collect();
        let mut nodes: BTreeMap<u64, Quorum> = ids
            .iter()
            .map(|&id| {
                (
                    id,
                    Quorum::new(id, &bootstrap, Restored::default()).unwrap(),
                )
            })
            .collect();
        for q in nodes.values_mut() {
            q.snapshot_every = 7;
        }
        let mut disks: BTreeMap<u64, Vec<Record>> = ids.iter().map(|&i| (i, Vec::new())).collect();
        let mut inflight: Vec<Message> = Vec::new();
        let mut acked: Vec<i32> = Vec::new();
        let mut cut: Option<u64> = None;
        let mut next_broker = 100;
        let step_node = |q: &mut Quorum,
                         disk: &mut Vec<Record>,
                         inflight: &mut Vec<Message>,
                         acked: &mut Vec<i32>| {
            while let Some(p) = q.ready() {
                inflight.extend(p.send_now);
                if let Some(sn) = p.snapshot {
                    disk.push(Record::Snap(sn));
                }
                disk.extend(p.entries.into_iter().map(Record::Entry));
                if let Some(h) = p.hard_state {
                    disk.push(Record::Hs(h));
                }
                let a = q.advance();
                inflight.extend(a.send);
                if let Some(sn) = a.snapshot {
                    disk.push(Record::Snap(sn));
                }
                for c in a.commands {
                    if let (Some(t), true) = (c.token, c.result.is_ok()) {
                        // Membership changes count as negative entries.
                        acked.push(if t < MEMBERSHIP_TOKENS { t as i32 } else { -1 });
                    }
                }
            }
        };
        for step in 0..steps {
            let r = next() % 100;
            let id = ids[(next() % ids.len() as u64) as usize];
            match r {
                0..=29 => {
                    if let Some(q) = nodes.get_mut(&id) {
                        q.tick();
                    }
                }
                30..=64 if !inflight.is_empty() => {
                    // Deliver a random message (reordering); sometimes drop or duplicate it.
                    let i = (next() % inflight.len() as u64) as usize;
                    let m = inflight.swap_remove(i);
                    let fate = next() % 20;
                    let blocked = cut.is_some_and(|c| c == m.from || c == m.to);
                    if fate == 0 || blocked {
                        continue;
                    }
                    if fate == 1 {
                        inflight.push(m.clone());
                    }
                    if let Some(q) = nodes.get_mut(&m.to) {
                        let _ = q.step(m);
                    }
                }
                65..=79 => {
                    if let Some(q) = nodes.get_mut(&id) {
                        let b = next_broker;
                        next_broker += 1;
                        let _ = q.propose(&register(b), b as u64);
                    }
                }
                80..=82 => {
                    // Crash and restart from the persisted records only.
                    let mut replay = Replay::default();
                    for rec in disks[&id].clone() {
                        match rec {
                            Record::Snap(sn) => replay.snapshot(sn),
                            Record::Entry(e) => replay.entry(e),
                            Record::Hs(h) => replay.hard_state(h),
                        }
                    }
                    let mut q = Quorum::new(id, &bootstrap, replay.finish()).unwrap();
                    q.snapshot_every = 7;
                    nodes.insert(id, q);
                    inflight.retain(|m| m.to != id);
                }
                83..=84 => cut = if cut.is_some() { None } else { Some(id) },
                85..=88 if joiners > 0 => {
                    // A membership change about a random node (the leader's own
                    // removal included: the shell hands over first, but leadership may
                    // move to the removed voter meanwhile).
                    // Proposed at the leader, as the shell does, and a learner
                    // promoted only once it holds the committed log (AddRaftVoter's
                    // check: a voter with nothing would vote for no one), a voter
                    // removed only if a caught-up majority remains (RemoveRaftVoter's).
                    let target = ids[(next() % ids.len() as u64) as usize];
                    let members = nodes[&id].members();
                    let caught_up = nodes[&id].learner_log_ends().is_some_and(|ends| {
                        let commit = nodes[&id].commit_index();
                        ends.iter().any(|&(l, end)| l == target && end >= commit)
                    });
                    let change = if !nodes[&id].is_leader() {
                        None
                    } else if members.voters.contains(&target) {
                        let q = &nodes[&id];
                        (members.voters.len() > 1 && q.removal_leaves_a_caught_up_majority(target))
                            .then_some(Membership::Remove(target))
                    } else if members.learners.contains(&target) {
                        caught_up.then_some(Membership::Promote(target))
                    } else {
                        Some(Membership::AddLearner(target))
                    };
                    if let (Some(change), Some(q)) = (change, nodes.get_mut(&id)) {
                        let token = MEMBERSHIP_TOKENS + next_broker as u64;
                        next_broker += 1;
                        let _ = q.propose_membership(change, token);
                    }
                }
                _ => {}
            }
            let q = nodes.get_mut(&id).unwrap();
            step_node(q, disks.get_mut(&id).unwrap(), &mut inflight, &mut acked);
            // State machine safety: equal applied index ⇒ equal state.
            let mut by_index: BTreeMap<u64, &ClusterState> = BTreeMap::new();
            for q in nodes.values() {
                let st = q.state();
                if let Some(other) = by_index.insert(q.applied_index(), st) {
                    assert_eq!(
                        other,
                        st,
                        "seed {seed} step {step}: states differ at index {}",
                        q.applied_index()
                    );
                }
            }
        }
        // Heal and converge.
        for _ in 0..3000 {
            for (id, q) in nodes.iter_mut() {
                q.tick();
                step_node(q, disks.get_mut(id).unwrap(), &mut inflight, &mut acked);
            }
            let msgs = std::mem::take(&mut inflight);
            for m in msgs {
                if let Some(q) = nodes.get_mut(&m.to) {
                    let _ = q.step(m);
                }
            }
            for (id, q) in nodes.iter_mut() {
                step_node(q, disks.get_mut(id).unwrap(), &mut inflight, &mut acked);
            }
            if inflight.is_empty() && converged(&nodes).is_some() {
                break;
            }
        }
        let first = converged(&nodes).unwrap_or_else(|| {
            let leader = nodes.values().find(|q| q.is_leader());
            leader.unwrap_or(&nodes[&1]).state().clone()
        });
        for q in nodes.values() {
            if std::env::var("CHAOS_DEBUG").is_ok()
                && (nodes.values().any(|o| o.state() != &first)
                    || !nodes.values().any(|o| o.is_leader()))
            {
                let st = q.node.status();
                eprintln!("node {} role {:?} term {} leader {} applied {} commit {} last {} first {:?} snap {} awaiting {} members {:?} prs {:?}", q.id, st.ss.raft_state, st.hs.term, st.ss.leader_id, q.applied, st.hs.commit, q.node.raft.raft_log.last_index(), q.node.store().mem.first_index(), q.node.store().snapshot.get_metadata().index, q.awaiting_snapshot, q.members(), st.progress.map(|p| p.iter().map(|(id, pr)| (*id, pr.matched, pr.next_idx, format!("{:?}", pr.state), pr.pending_snapshot)).collect::<Vec<_>>()));
            }
        }
        let members = nodes.values().find(|q| q.is_leader()).map(|q| q.members());
        let members = members.unwrap_or_else(|| panic!("seed {seed}: no leader at the end"));
        for q in nodes.values() {
            if members.voters.contains(&q.id()) || members.learners.contains(&q.id()) {
                assert_eq!(
                    *q.state(),
                    first,
                    "seed {seed}: no convergence of {}",
                    q.id()
                );
            }
        }
        let changes = acked.iter().filter(|b| **b < 0).count();
        for b in acked.into_iter().filter(|b| *b >= 0) {
            assert!(
                first.brokers.contains_key(&b),
                "seed {seed}: committed registration of {b} lost"
            );
        }
        changes
    }

    /// The leader's state if every member of its configuration holds the same; `None`
    /// without a leader or while a member differs.
    fn converged(nodes: &BTreeMap<u64, Quorum>) -> Option<ClusterState> {
        let leader = nodes.values().find(|q| q.is_leader())?;
        let m = leader.members();
        let all = m.voters.iter().chain(&m.learners);
        let same = all
            .into_iter()
            .all(|id| nodes.get(id).is_some_and(|q| q.state() == leader.state()));
        same.then(|| leader.state().clone())
    }

    #[test]
    fn chaos_seeds_keep_state_machine_safety_and_committed_commands() {
        for seed in 1..=300 {
            assert_eq!(chaos(seed, 3, 0, 1500), 0);
        }
        for seed in 1000..=1100 {
            assert_eq!(chaos(seed, 5, 0, 1500), 0);
        }
        // Voters added, promoted and removed meanwhile (nodes 4 and 5 start outside).
        let changes: usize = (2000..=2300).map(|seed| chaos(seed, 3, 2, 1500)).sum();
        assert!(changes > 150, "membership changes applied: {changes}");
    }

    #[test]
    fn proposing_without_a_leader_is_an_error_not_a_hang() {
        let mut q = Quorum::new(1, &[1, 2, 3], Restored::default()).unwrap();
        assert!(matches!(
            q.propose(&register(1), 1),
            Err(QuorumError::NoLeader)
        ));
        assert!(matches!(
            Quorum::new(0, &[1, 2, 3], Restored::default()),
            Err(StartError::ZeroId)
        ));
    }

    #[test]
    fn garbage_is_a_decode_error_naming_the_record() {
        let e = decode::<Entry>(&[0xff; 7]).unwrap_err();
        assert_eq!(e.kind, "Entry");
        assert!(e.to_string().starts_with("undecodable raft Entry: "), "{e}");
        let mut snapshot = Snapshot::default();
        snapshot.set_data(vec![0xff; 7].into());
        snapshot.mut_metadata().index = 5;
        let restored = Restored {
            snapshot: Some(snapshot),
            ..Restored::default()
        };
        assert!(matches!(
            Quorum::new(1, &[1], restored),
            Err(StartError::Snapshot(cluster::DecodeError::Snapshot {
                version: 1,
                ..
            }))
        ));
    }
}
