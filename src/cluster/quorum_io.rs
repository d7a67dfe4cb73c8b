//! The I/O shell of the metadata quorum, on shard 0 of every broker.
//!
//! [`QuorumNode`] drives the sans-I/O [`Quorum`] (crate `sluice-replication`): ticks it,
//! feeds it the peers' messages from the controller listener, makes each Ready durable
//! in a [`Journal`] (`<data>/__cluster_metadata/journal`) *before* sending the messages
//! that must wait for persistence, and hands applied commands back to the proposers.
//!
//! Controller duties run on whichever node leads the quorum: it fences brokers whose
//! heartbeats lapse (`broker.session.timeout.ms`), unfences them when heartbeats
//! return, and moves leadership back to preferred replicas. Every broker proposes its
//! own registration at start (a new incarnation each start).
//!
//! A fenced broker is unfenced only by a heartbeat heard after the controller saw it
//! fenced. Controlled shutdown (Kafka's) rests on that: a broker told to stop stops
//! heartbeating, then proposes its own fencing, which moves its leaderships to other
//! in-sync replicas and takes it out of the ISRs; no controller unfences it again (a
//! restart is a new incarnation, which registers and heartbeats as usual).
//!
//! Wire format on the controller port: frames `[len u32 BE][kind u8][payload]`; kind 1
//! is a raft message (protobuf), kind 2 a broker heartbeat `[node i32 LE][incarnation
//! u64 LE]`, kind 3 a hello (below), kinds 4 and 5 a quorum request forwarded to the
//! leader and its answer (DescribeQuorum, AddRaftVoter and RemoveRaftVoter asked of a
//! broker whose node does not lead; the leader may be a controller without the
//! broker role, which has no Kafka listener). Each node keeps one outbound connection per peer;
//! inbound connections only receive. A message that cannot be sent is dropped (raft
//! retransmits).
//!
//! ## Nodes that join
//!
//! The voters named in `--controller-quorum` are the cluster's bootstrap voters, their
//! addresses known to all from the flag. Any other node (a broker-only node, or a
//! controller waiting to be made a voter) announces itself: every heartbeat interval
//! it sends a *hello* to every peer it knows — entries `[id i32 LE][flags u8][len
//! u8][controller address]`, the sender first (bit 0 of flags: it has the controller
//! role), then every other joined node it knows, so a joiner also learns of voters that
//! joined after the flag was written. A node that knows of any joined node sends hellos
//! too (a cluster of bootstrap voters alone sends none, as builds before this one). The
//! controller leader adds every node it hears from (hello or broker heartbeat) and
//! whose address it knows, but which is not in the quorum's configuration, as a raft
//! learner; it receives the log from then on. A learner not heard from for three
//! session timeouts is removed (it is added again when it returns), and a node
//! outside the configuration silent that long is forgotten by everyone (relays carry
//! members and nodes heard from directly within a session timeout, so a departed node
//! does not live on in them, while a joiner reaches a leader that joined after the
//! flag was written through the voters it names). AddRaftVoter
//! promotes a caught-up learner with the controller role; RemoveRaftVoter removes a
//! voter once the voters left hold the log with a majority (a leader removing itself
//! steps down when that applies); a removed node carries on as a learner while it
//! runs. Only the leader proposes membership changes, and each is checked again where
//! it applies (`sluice_replication::quorum`, "Membership").
//!
//! A hello also says whether its sender holds metadata. That guards a cluster born
//! with one voter that then grew: if that voter's disk is lost, its own view is still
//! a quorum of one with an empty log, and electing itself would start a second, empty
//! cluster. So a lone bootstrap voter with a controller listener that starts with an
//! empty log waits a few heartbeat intervals for hellos before electing itself, and
//! if one comes from a node that holds metadata it never does: it waits for a leader
//! of the real configuration to send it the log (or for its disk to come back).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use event_listener::Event;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use kafka_protocol::error::ResponseError;
use sluice_replication::cluster::{Applied, ApplyError, ClusterState, Command, ProducerIdBlock};

use crate::base::rpc::QuorumView;
use sluice_replication::quorum::{self, Membership, Persist, Quorum, Replay};
use sluice_replication::raft;
use sluice_storage::journal::Journal;

use crate::base::error::ApiError;

/// Why the quorum node failed: at start-up (the broker does not start), on a journal
/// write (the process exits), or on one peer connection (it is closed).
#[derive(Debug, thiserror::Error)]
pub enum QuorumIoError {
    #[error("metadata journal: {0}")]
    OpenJournal(sluice_storage::Error),
    #[error("metadata journal: unknown record kind {0}")]
    UnknownRecord(u8),
    #[error("metadata journal: {0}")]
    JournalRecord(quorum::DecodeError),
    /// The restored quorum does not fit this node (or its snapshot does not decode).
    #[error(transparent)]
    Start(#[from] quorum::StartError),
    #[error("binding the controller listener {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// Appending to or rewriting the journal failed.
    #[error(transparent)]
    Write(sluice_storage::Error),
    #[error("unknown controller frame kind {0}")]
    UnknownFrame(u8),
    #[error("bad controller frame length {0}")]
    FrameLength(usize),
    #[error("controller frame: {0}")]
    Frame(quorum::DecodeError),
    /// A peer connection failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

const KIND_RAFT: u8 = 1;
const KIND_HEARTBEAT: u8 = 2;
const KIND_HELLO: u8 = 3;
/// A quorum request forwarded to the leader: `[req u64][from i32][op u8][node
/// i32][timeout_ms u32]` (op: 0 DescribeQuorum, 1 AddRaftVoter, 2 RemoveRaftVoter).
const KIND_ASK: u8 = 4;
/// Its answer: `[req u64][error code i16][message len u16][message]` then, for a
/// description, the view (see `encode_view`).
const KIND_ANSWER: u8 = 5;
/// Hello flags: the node has the controller role (may become a voter).
const HELLO_CONTROLLER: u8 = 1;
/// Hello flags, the sender's own entry: it has applied metadata (holds a log).
const HELLO_HOLDS_LOG: u8 = 2;
const JOURNAL_ENTRY: u8 = 1;
const JOURNAL_HARD_STATE: u8 = 2;
const JOURNAL_SNAPSHOT: u8 = 3;
/// Largest frame accepted on the controller port.
const FRAME_MAX: usize = 64 << 20;
/// Messages queued per peer before new ones are dropped (raft retransmits).
const PEER_QUEUE: usize = 4096;
/// How often the preferred-leader check runs on the controller leader.
const PREFERRED_CHECK: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct QuorumConfig {
    pub node_id: i32,
    /// The bootstrap voters with their controller addresses (`--controller-quorum`;
    /// this node is among them unless it joins).
    pub voters: Vec<(i32, SocketAddr)>,
    pub listen: Option<SocketAddr>,
    /// This node has the controller role (`--process-roles`): a voter, or a learner
    /// that AddRaftVoter may promote.
    pub controller: bool,
    /// This node has the broker role: it registers (a controller without it does not).
    pub broker: bool,
    pub dir: PathBuf,
    /// One raft tick.
    pub tick: Duration,
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    /// This broker's Kafka endpoint and rack, for its registration.
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
    /// With several named listeners, each one's endpoint, the inter-broker one (`host`
    /// and `port`) first; empty with one listener.
    pub endpoints: Vec<sluice_replication::cluster::Endpoint>,
    /// The data directory's id, recorded before registering
    /// (`sluice_replication::cluster::Command::RecordDirectory`).
    pub directory: String,
    /// Whether the controller elects preferred replicas by itself (every
    /// `PREFERRED_CHECK`); without it only ElectLeaders moves leadership back.
    pub auto_leader_rebalance: bool,
}

/// A forwarded request's answer: its payload, or the leader's refusal.
type Answer = Result<Vec<u8>, ApiError>;

/// One peer's controller address and the queue of its connection.
struct Peer {
    addr: SocketAddr,
    queue: Rc<PeerQueue>,
}

/// A node outside the bootstrap voters.
#[derive(Debug, Clone, Copy)]
struct Joined {
    addr: SocketAddr,
    controller: bool,
    /// When its own hello last arrived here (`None`: only relayed by others).
    heard: Option<Instant>,
    /// When this node first learned of it.
    learned: Instant,
}

/// Proposals of this node waiting to be applied here, by token, each for one type of
/// result, with the state version after it.
type Waiters<T> = RefCell<HashMap<u64, LocalSender<(Result<T, ApplyError>, u64)>>>;

pub struct QuorumNode {
    cfg: QuorumConfig,
    incarnation: u64,
    quorum: RefCell<Quorum>,
    journal: RefCell<Journal>,
    /// Entries after the last snapshot, mirrored for journal compaction.
    tail: RefCell<Vec<raft::prelude::Entry>>,
    hard_state: RefCell<raft::prelude::HardState>,
    peers: RefCell<HashMap<u64, Peer>>,
    /// Nodes outside the bootstrap voters (this one included if it is), as hellos
    /// announced them.
    joined: RefCell<HashMap<i32, Joined>>,
    waiters: Waiters<Applied>,
    /// Forwarded requests of this node waiting for the leader's answer, by request id.
    asks: RefCell<HashMap<u64, LocalSender<Answer>>>,
    /// Proposals of `AllocateProducerIds`, answered with the block itself.
    block_waiters: Waiters<ProducerIdBlock>,
    next_token: Cell<u64>,
    drive_lock: Semaphore,
    /// Last heartbeat heard from each broker, with the incarnation it named.
    last_seen: RefCell<HashMap<i32, (Instant, u64)>>,
    /// Fence/unfence proposals in flight, so one lapse makes one proposal.
    proposing: RefCell<HashSet<(i32, bool)>>,
    /// When this node first saw each fenced broker fenced: only a heartbeat heard
    /// after that unfences it (see the module docs).
    fenced_since: RefCell<HashMap<i32, Instant>>,
    /// This broker is in controlled shutdown: it heartbeats no more.
    stopping: Cell<bool>,
    was_leader: Cell<bool>,
    /// A lone bootstrap voter with an empty log elects itself only after this, unless
    /// a hello from a node that holds the metadata log arrives first (then
    /// `lone_voter_lost_log`).
    lone_hold: Cell<Option<Instant>>,
    /// This lone voter lost its log while other nodes hold one: it never elects itself.
    lone_voter_lost_log: Cell<bool>,
    /// When this node last became the controller leader.
    leader_since: Cell<Instant>,
    last_leader: Cell<u64>,
    /// Fires when the state or the leader changed (for the image publisher).
    pub changed: Event,
    change_count: Cell<u64>,
}

fn api_error(e: &ApplyError) -> ApiError {
    let code = match e {
        ApplyError::TopicAlreadyExists(_) => ResponseError::TopicAlreadyExists,
        ApplyError::UnknownTopicOrPartition => ResponseError::UnknownTopicOrPartition,
        ApplyError::UnknownBroker(_) => ResponseError::BrokerIdNotRegistered,
        ApplyError::InvalidReplicaAssignment(_) => ResponseError::InvalidReplicaAssignment,
        ApplyError::InvalidReplicationFactor(_) => ResponseError::InvalidReplicationFactor,
        ApplyError::FencedLeaderEpoch { .. } => ResponseError::FencedLeaderEpoch,
        ApplyError::InvalidUpdateVersion { .. } => ResponseError::InvalidUpdateVersion,
        ApplyError::NotLeader(_) => ResponseError::NotLeaderOrFollower,
        ApplyError::IneligibleReplica(_) => ResponseError::IneligibleReplica,
        ApplyError::InvalidRequest(_) => ResponseError::InvalidRequest,
        ApplyError::ElectionNotNeeded => ResponseError::ElectionNotNeeded,
        ApplyError::PreferredLeaderNotAvailable => ResponseError::PreferredLeaderNotAvailable,
        ApplyError::EligibleLeadersNotAvailable => ResponseError::EligibleLeadersNotAvailable,
        ApplyError::NoReassignmentInProgress => ResponseError::NoReassignmentInProgress,
    };
    ApiError::with(code, e.to_string())
}

pub fn to_api_error(e: &ApplyError) -> ApiError {
    api_error(e)
}

impl QuorumNode {
    /// Opens the journal, restores the quorum and starts the transport and timers.
    pub fn start(cfg: QuorumConfig) -> Result<Rc<QuorumNode>, QuorumIoError> {
        let (journal, records) = Journal::open(&cfg.dir).map_err(QuorumIoError::OpenJournal)?;
        let mut replay = Replay::default();
        let mut hard_state = raft::prelude::HardState::default();
        for (kind, payload) in records {
            match kind {
                JOURNAL_ENTRY => {
                    replay.entry(quorum::decode(&payload).map_err(QuorumIoError::JournalRecord)?)
                }
                JOURNAL_HARD_STATE => {
                    hard_state = quorum::decode(&payload).map_err(QuorumIoError::JournalRecord)?;
                    replay.hard_state(hard_state.clone());
                }
                JOURNAL_SNAPSHOT => {
                    replay.snapshot(quorum::decode(&payload).map_err(QuorumIoError::JournalRecord)?)
                }
                k => return Err(QuorumIoError::UnknownRecord(k)),
            }
        }
        let restored = replay.finish();
        let restored_nothing = restored.snapshot.is_none()
            && restored.entries.is_empty()
            && restored.hard_state.is_none();
        let tail = restored.entries.clone();
        let voters: Vec<u64> = cfg.voters.iter().map(|(id, _)| *id as u64).collect();
        let bootstrap_voter = voters.contains(&(cfg.node_id as u64));
        let mut q = Quorum::new(cfg.node_id as u64, &voters, restored)?;
        if !bootstrap_voter && q.members().learners.is_empty() && q.members().voters.is_empty() {
            tracing::info!(voters = ?cfg.voters, "not a bootstrap voter: joining the metadata quorum as a learner");
        } else if q.amnesiac() {
            tracing::info!("no metadata log here yet (a new cluster, or a lost disk): this voter votes only for candidates with none either until it has caught up with a leader");
        }
        let mut lone_hold = None;
        if voters.len() == 1 && bootstrap_voter {
            if restored_nothing && cfg.listen.is_some() {
                // A lone voter with an empty log may be a new cluster, or one whose
                // disk was lost while other nodes joined: hellos tell them apart.
                // Long enough for the others' connections to notice the restart and
                // their next hellos to arrive; within a session timeout.
                let wait =
                    (cfg.heartbeat_interval * 4 + Duration::from_secs(1)).min(cfg.session_timeout);
                lone_hold = Some(Instant::now() + wait);
            } else {
                // A quorum of one need not wait an election timeout to lead.
                q.campaign();
            }
        }
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (u64::from(std::process::id()) << 32);
        let node = Rc::new(QuorumNode {
            incarnation,
            quorum: RefCell::new(q),
            journal: RefCell::new(journal),
            tail: RefCell::new(tail),
            hard_state: RefCell::new(hard_state),
            peers: RefCell::new(HashMap::new()),
            joined: RefCell::new(HashMap::new()),
            waiters: RefCell::new(HashMap::new()),
            asks: RefCell::new(HashMap::new()),
            block_waiters: RefCell::new(HashMap::new()),
            // Tokens of an earlier process may be replayed from the log: start this
            // process's tokens somewhere else.
            next_token: Cell::new(incarnation),
            drive_lock: Semaphore::new(1),
            last_seen: RefCell::new(HashMap::new()),
            fenced_since: RefCell::new(HashMap::new()),
            stopping: Cell::new(false),
            proposing: RefCell::new(HashSet::new()),
            was_leader: Cell::new(false),
            lone_hold: Cell::new(lone_hold),
            lone_voter_lost_log: Cell::new(false),
            leader_since: Cell::new(Instant::now()),
            last_leader: Cell::new(0),
            changed: Event::new(),
            change_count: Cell::new(0),
            cfg,
        });
        for (id, addr) in node.cfg.voters.clone() {
            node.learn_peer(id, addr);
        }
        if !bootstrap_voter {
            if let Some(addr) = node.cfg.listen {
                node.joined.borrow_mut().insert(
                    node.cfg.node_id,
                    Joined {
                        addr,
                        controller: node.cfg.controller,
                        heard: None,
                        learned: Instant::now(),
                    },
                );
            }
        }
        if let Some(listen) = node.cfg.listen {
            let listener =
                crate::base::util::bind(listen).map_err(|source| QuorumIoError::Bind {
                    addr: listen,
                    source,
                })?;
            glommio::spawn_local(accept_loop(Rc::downgrade(&node), listener)).detach();
        }
        glommio::spawn_local(ticker(Rc::downgrade(&node))).detach();
        glommio::spawn_local(heartbeater(Rc::downgrade(&node))).detach();
        if node.cfg.broker {
            glommio::spawn_local(register_self(Rc::downgrade(&node))).detach();
        }
        Ok(node)
    }

    pub fn node_id(&self) -> i32 {
        self.cfg.node_id
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// A copy of the applied state.
    pub fn state(&self) -> ClusterState {
        self.quorum.borrow().state().clone()
    }

    pub fn with_state<R>(&self, f: impl FnOnce(&ClusterState) -> R) -> R {
        f(self.quorum.borrow().state())
    }

    /// DescribeQuorum: the leader's view (this node must lead; else `None`): term,
    /// high watermark (commit index) and per voter and per learner (observer) its
    /// replicated log end and when this controller last heard from it (ms since the
    /// epoch; its broker heartbeats or hellos).
    pub fn describe(&self) -> Option<QuorumView> {
        let q = self.quorum.borrow();
        let ends = q.voter_log_ends()?;
        let learners = q.learner_log_ends().unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let seen = self.last_seen.borrow();
        let joined = self.joined.borrow();
        let row = |(id, end): (u64, u64)| {
            let id = id as i32;
            let heard = if id == self.cfg.node_id {
                Some(Instant::now())
            } else {
                let beat = seen.get(&id).map(|(at, _)| *at);
                beat.max(joined.get(&id).and_then(|j| j.heard))
            };
            let heard = heard.map(|at| now - at.elapsed().as_millis() as i64);
            (id, end as i64, heard.unwrap_or(-1))
        };
        Some(QuorumView {
            leader: self.cfg.node_id,
            term: q.term() as i32,
            high_watermark: q.commit_index() as i64,
            voters: ends.into_iter().map(row).collect(),
            observers: learners.into_iter().map(row).collect(),
        })
    }

    /// The controller leader's node id, -1 when none is known.
    pub fn leader_id(&self) -> i32 {
        match self.quorum.borrow().leader_id() {
            0 => -1,
            id => id as i32,
        }
    }

    /// This voter's raft term, and whether it leads the quorum (the active controller).
    pub fn raft_status(&self) -> (u64, bool) {
        let q = self.quorum.borrow();
        (q.term(), q.is_leader())
    }

    /// Counts state and leader changes; the publisher compares it.
    pub fn change_count(&self) -> u64 {
        self.change_count.get()
    }

    /// Sends this broker's heartbeat to every peer (none once it is stopping).
    fn send_heartbeat(&self) {
        if self.stopping.get() {
            return;
        }
        let mut frame = Vec::with_capacity(17);
        frame.extend_from_slice(&13u32.to_be_bytes());
        frame.push(KIND_HEARTBEAT);
        frame.extend_from_slice(&self.cfg.node_id.to_le_bytes());
        frame.extend_from_slice(&self.incarnation.to_le_bytes());
        for p in self.peers.borrow().values() {
            p.queue.push(frame.clone());
        }
        self.last_seen
            .borrow_mut()
            .insert(self.cfg.node_id, (Instant::now(), self.incarnation));
    }

    /// Sends to `id` at `addr` from now on (a new connection if the address changed).
    fn learn_peer(self: &Rc<Self>, id: i32, addr: SocketAddr) {
        if id == self.cfg.node_id {
            return;
        }
        let mut peers = self.peers.borrow_mut();
        if peers.get(&(id as u64)).is_some_and(|p| p.addr == addr) {
            return;
        }
        let queue = Rc::new(PeerQueue::default());
        if let Some(old) = peers.insert(
            id as u64,
            Peer {
                addr,
                queue: queue.clone(),
            },
        ) {
            tracing::info!(node = id, from = %old.addr, to = %addr, "controller peer moved");
            old.queue.close();
        }
        glommio::spawn_local(peer_sender(Rc::downgrade(self), id as u64, addr, queue)).detach();
    }

    /// Sends a hello to every peer if any node outside the bootstrap voters is known
    /// (see "Nodes that join" in the module doc).
    fn send_hello(&self) {
        self.forget_departed();
        let joined = self.joined.borrow();
        if joined.is_empty() {
            return;
        }
        let me = self.cfg.node_id;
        let mut payload = Vec::new();
        // Relayed: members, and nodes heard from directly within a session timeout (a
        // joiner the leader cannot hear yet); a node that left stops being relayed.
        let now = Instant::now();
        let relayable = |id: i32, j: &Joined| {
            self.is_member(id)
                || j.heard
                    .is_some_and(|h| now.duration_since(h) < self.cfg.session_timeout)
        };
        let entries = joined.get(&me).map(|j| (me, j)).into_iter().chain(
            joined
                .iter()
                .filter(|(id, j)| **id != me && relayable(**id, j))
                .map(|(id, j)| (*id, j)),
        );
        let mut first = true;
        for (id, j) in entries {
            if first && id != me {
                // A bootstrap voter relaying: its own entry first, address from the flag.
                let addr = self
                    .cfg
                    .voters
                    .iter()
                    .find(|(v, _)| *v == me)
                    .map(|(_, a)| *a)
                    .or(self.cfg.listen);
                let Some(addr) = addr else { return };
                push_hello_entry(&mut payload, me, self.own_hello_flags(), addr);
            }
            let flags = if id == me {
                self.own_hello_flags()
            } else {
                u8::from(j.controller) * HELLO_CONTROLLER
            };
            first = false;
            push_hello_entry(&mut payload, id, flags, j.addr);
        }
        let mut frame = Vec::with_capacity(payload.len() + 5);
        frame.extend_from_slice(&((payload.len() + 1) as u32).to_be_bytes());
        frame.push(KIND_HELLO);
        frame.extend_from_slice(&payload);
        for p in self.peers.borrow().values() {
            p.queue.push(frame.clone());
        }
    }

    /// This lone voter with an empty log heard from `node`, which holds metadata: it
    /// never elects itself alone (see the module doc).
    fn lone_refuses(&self, node: i32) {
        self.lone_hold.set(None);
        if !self.lone_voter_lost_log.replace(true) {
            tracing::warn!(node, "this node is the metadata quorum's only voter as far as it knows and has no metadata log, but node {node} holds one: this voter's disk was lost. It will not elect itself (that would start a second, empty cluster beside the nodes that hold the metadata): it waits for a leader of the real quorum, or for its data directory to be restored");
        }
    }

    /// This node's flags in its hellos: its role, and whether it holds metadata.
    fn own_hello_flags(&self) -> u8 {
        let holds = self.quorum.borrow().applied_index() > 0;
        u8::from(self.cfg.controller) * HELLO_CONTROLLER + u8::from(holds) * HELLO_HOLDS_LOG
    }

    /// The only voter of its configuration, with nothing applied and not leading.
    fn lone_and_empty(&self) -> bool {
        let q = self.quorum.borrow();
        q.applied_index() == 0 && !q.is_leader() && q.members().voters == [self.cfg.node_id as u64]
    }

    fn is_member(&self, id: i32) -> bool {
        let m = self.quorum.borrow().members();
        m.voters.contains(&(id as u64)) || m.learners.contains(&(id as u64))
    }

    /// Forgets joined nodes outside the configuration not heard from (nor learned of)
    /// for three session timeouts, and stops dialling them.
    fn forget_departed(&self) {
        let now = Instant::now();
        let horizon = self.cfg.session_timeout * 3;
        let gone: Vec<i32> = self
            .joined
            .borrow()
            .iter()
            .filter(|(id, j)| {
                let last = j.heard.map_or(j.learned, |h| h.max(j.learned));
                **id != self.cfg.node_id
                    && now.duration_since(last) > horizon
                    && !self.is_member(**id)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.joined.borrow_mut().remove(&id);
            if let Some(p) = self.peers.borrow_mut().remove(&(id as u64)) {
                p.queue.close();
            }
            tracing::info!(node = id, "forgot a node that left the metadata quorum");
        }
    }

    /// A hello: the sender's entry is its own word, the others fill in nodes not known
    /// here yet. Bootstrap voters keep the addresses of the flag.
    fn on_hello(self: &Rc<Self>, payload: &[u8]) -> Result<(), QuorumIoError> {
        let entries = parse_hello(payload).ok_or(QuorumIoError::UnknownFrame(KIND_HELLO))?;
        let now = Instant::now();
        tracing::trace!(?entries, "hello");
        for (i, (id, flags, addr)) in entries.into_iter().enumerate() {
            let direct = i == 0;
            let controller = flags & HELLO_CONTROLLER != 0;
            if direct && flags & HELLO_HOLDS_LOG != 0 && self.lone_and_empty() {
                self.lone_refuses(id);
            }
            if id == self.cfg.node_id || self.cfg.voters.iter().any(|(v, _)| *v == id) {
                continue;
            }
            let mut joined = self.joined.borrow_mut();
            match joined.get_mut(&id) {
                Some(j) if direct => {
                    j.addr = addr;
                    j.controller = controller;
                    j.heard = Some(now);
                }
                Some(_) => continue,
                None => {
                    joined.insert(
                        id,
                        Joined {
                            addr,
                            controller,
                            heard: direct.then_some(now),
                            learned: now,
                        },
                    );
                }
            }
            drop(joined);
            self.learn_peer(id, addr);
        }
        Ok(())
    }

    /// Whether raft's clock stays stopped: a lone voter that lost its log, or one with
    /// an empty log still waiting for hellos (when that wait ends it elects itself).
    fn lone_voter_holds(&self) -> bool {
        if self.lone_voter_lost_log.get() {
            if self.lone_and_empty() {
                return true;
            }
            // A leader of the real configuration sent it the log.
            self.lone_voter_lost_log.set(false);
            self.lone_hold.set(None);
            tracing::info!("the metadata log reached this node from the quorum's leader: it takes part in elections again");
        }
        match self.lone_hold.get() {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                self.lone_hold.set(None);
                self.quorum.borrow_mut().campaign();
                false
            }
            None => false,
        }
    }

    /// The leader's membership duties: a node heard from but outside the configuration
    /// becomes a learner; a learner silent for three session timeouts is removed. One
    /// change at a time.
    fn membership_upkeep(self: &Rc<Self>) {
        let (members, pending) = {
            let q = self.quorum.borrow();
            (q.members(), q.membership_change_pending())
        };
        if pending || self.proposing.borrow().iter().any(|(id, _)| *id < 0) {
            return;
        }
        let now = Instant::now();
        let session = self.cfg.session_timeout;
        let heard = |id: i32| -> Option<Instant> {
            let hello = self.joined.borrow().get(&id).and_then(|j| j.heard);
            let beat = self.last_seen.borrow().get(&id).map(|(t, _)| *t);
            hello.max(beat)
        };
        let member = |id: i32| {
            members.voters.contains(&(id as u64)) || members.learners.contains(&(id as u64))
        };
        let reachable: Vec<i32> = self.peers.borrow().keys().map(|id| *id as i32).collect();
        let join = reachable
            .into_iter()
            .filter(|id| !member(*id))
            .find(|id| heard(*id).is_some_and(|t| now.duration_since(t) < session));
        let change = if let Some(id) = join {
            tracing::info!(
                node = id,
                "adding a node to the metadata quorum as a learner"
            );
            Some((id, Membership::AddLearner(id as u64)))
        } else {
            members
                .learners
                .iter()
                .map(|id| *id as i32)
                .find(|id| {
                    let since = heard(*id).unwrap_or(self.leader_since.get());
                    now.duration_since(since.max(self.leader_since.get())) > session * 3
                })
                .map(|id| {
                    tracing::info!(
                        node = id,
                        "removing a silent learner from the metadata quorum"
                    );
                    (id, Membership::RemoveLearner(id as u64))
                })
        };
        let Some((id, change)) = change else { return };
        // Keyed by the negated id so a fence/unfence proposal of the broker does not
        // block it.
        self.proposing.borrow_mut().insert((-id, true));
        let node = self.clone();
        glommio::spawn_local(async move {
            if let Err(e) = node.change_membership(change, session).await {
                tracing::debug!(error = %e, ?change, "membership change failed");
            }
            node.proposing.borrow_mut().remove(&(-id, true));
        })
        .detach();
    }

    /// Proposes a membership change and waits until it is applied here.
    async fn change_membership(
        self: &Rc<Self>,
        change: Membership,
        timeout: Duration,
    ) -> Result<(), ApiError> {
        let result = self
            .submit(timeout, &self.waiters, |q, token| {
                q.propose_membership(change, token)
            })
            .await
            .map(|_| ());
        // A copy retried after its first one applied unheard is refused as not fitting
        // any more: what was asked is done.
        let m = self.quorum.borrow().members();
        let done = match change {
            Membership::AddLearner(id) => m.learners.contains(&id) || m.voters.contains(&id),
            Membership::Promote(id) => m.voters.contains(&id),
            Membership::Remove(id) => !m.voters.contains(&id),
            Membership::RemoveLearner(id) => !m.learners.contains(&id),
        };
        let result = match result {
            Err(_) if done => Ok(()),
            r => r,
        };
        if result.is_ok() {
            // Answer once a majority of the voters know the change committed (see
            // `Quorum::committed_on_majority`): a dead voter removed and the leader
            // lost right after must not leave the others in the old configuration.
            let index = self.quorum.borrow().commit_index();
            let deadline = Instant::now() + timeout.min(Duration::from_secs(10));
            while !self.quorum.borrow().committed_on_majority(index)
                && self.quorum.borrow().is_leader()
                && Instant::now() < deadline
            {
                glommio::timer::sleep(self.cfg.tick).await;
            }
        }
        result
    }

    /// AddRaftVoter on the controller leader: promotes learner `id`, which must have
    /// the controller role and hold the committed log, waiting up to `timeout` for it
    /// to catch up.
    pub async fn add_voter(self: &Rc<Self>, id: i32, timeout: Duration) -> Result<(), ApiError> {
        let deadline = Instant::now() + timeout;
        loop {
            let (members, caught_up, leader) = {
                let q = self.quorum.borrow();
                let commit = q.commit_index();
                let caught_up = q
                    .learner_log_ends()
                    .unwrap_or_default()
                    .iter()
                    .any(|&(l, end)| l == id as u64 && end >= commit);
                (q.members(), caught_up, q.is_leader())
            };
            if !leader {
                return Err(not_leader(self.leader_id()));
            }
            if members.voters.contains(&(id as u64)) {
                return Err(ApiError::with(
                    ResponseError::DuplicateVoter,
                    format!("node {id} is already a voter"),
                ));
            }
            let controller = self.joined.borrow().get(&id).map(|j| j.controller);
            match controller {
                Some(false) => {
                    return Err(ApiError::with(
                        ResponseError::InvalidRequest,
                        format!("node {id} runs without the controller role (--process-roles broker): it cannot vote"),
                    ))
                }
                None if !members.learners.contains(&(id as u64)) => {
                    return Err(ApiError::with(
                        ResponseError::InvalidRequest,
                        format!("node {id} has not joined the metadata quorum: start it with --node-id {id} --process-roles broker,controller --controller-quorum naming the voters, then ask again"),
                    ))
                }
                // A learner whose hello (with its roles) has not reached this leader
                // yet: wait for one.
                None => {}
                Some(true) if caught_up && members.learners.contains(&(id as u64)) => break,
                Some(true) => {}
            }
            if Instant::now() >= deadline {
                return Err(ApiError::with(
                    ResponseError::RequestTimedOut,
                    format!("node {id} has not caught up with the metadata log (or announced its roles) yet"),
                ));
            }
            glommio::timer::sleep(self.cfg.tick).await;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        self.change_membership(Membership::Promote(id as u64), left.max(self.cfg.tick * 20))
            .await?;
        tracing::info!(node = id, "node promoted to voter of the metadata quorum");
        Ok(())
    }

    /// RemoveRaftVoter on the controller leader: voter `id` leaves the voters, once the
    /// others left hold the log with a majority. A leader that removes itself steps
    /// down when the removal applies, and the voters elect another.
    pub async fn remove_voter(self: &Rc<Self>, id: i32, timeout: Duration) -> Result<(), ApiError> {
        let (members, leader) = {
            let q = self.quorum.borrow();
            (q.members(), q.is_leader())
        };
        if !leader {
            return Err(not_leader(self.leader_id()));
        }
        if !members.voters.contains(&(id as u64)) {
            return Err(ApiError::with(
                ResponseError::VoterNotFound,
                format!("node {id} is not a voter"),
            ));
        }
        if members.voters.len() == 1 {
            return Err(ApiError::with(
                ResponseError::InvalidRequest,
                format!("node {id} is the only voter"),
            ));
        }
        let deadline = Instant::now() + timeout;
        while !self
            .quorum
            .borrow()
            .removal_leaves_a_caught_up_majority(id as u64)
        {
            if Instant::now() >= deadline || !self.quorum.borrow().is_leader() {
                return Err(ApiError::with(
                    ResponseError::RequestTimedOut,
                    format!("without node {id}, fewer than a majority of the voters hold the metadata log: they could elect no leader; bring a lagging voter back or let it catch up first (sluice cluster quorum shows the lag)"),
                ));
            }
            glommio::timer::sleep(self.cfg.tick).await;
        }
        self.change_membership(Membership::Remove(id as u64), timeout)
            .await?;
        tracing::info!(
            node = id,
            "node removed from the voters of the metadata quorum"
        );
        Ok(())
    }

    /// Sends a forwarded request's answer back to node `to`.
    fn answer_ask(&self, to: i32, req: u64, answer: Result<Vec<u8>, ApiError>) {
        let mut payload = req.to_le_bytes().to_vec();
        match answer {
            Ok(rest) => {
                payload.extend_from_slice(&0i16.to_le_bytes());
                payload.extend_from_slice(&0u16.to_le_bytes());
                payload.extend_from_slice(&rest);
            }
            Err(e) => {
                let message = e.message.clone().unwrap_or_default();
                let message = &message.as_bytes()[..message.len().min(4096)];
                payload.extend_from_slice(&e.code().to_le_bytes());
                payload.extend_from_slice(&(message.len() as u16).to_le_bytes());
                payload.extend_from_slice(message);
            }
        }
        self.send_frame(to as u64, KIND_ANSWER, &payload);
    }

    fn send_frame(&self, to: u64, kind: u8, payload: &[u8]) {
        let mut frame = Vec::with_capacity(payload.len() + 5);
        frame.extend_from_slice(&((payload.len() + 1) as u32).to_be_bytes());
        frame.push(kind);
        frame.extend_from_slice(payload);
        if let Some(p) = self.peers.borrow().get(&to) {
            p.queue.push(frame);
        }
    }

    /// Forwards a quorum request to the controller leader (a controller without the
    /// broker role has no Kafka listener to ask) and waits for its answer.
    async fn ask_leader(&self, op: u8, node: i32, timeout: Duration) -> Result<Vec<u8>, ApiError> {
        let leader = self.leader_id();
        if leader < 0 || leader == self.cfg.node_id {
            return Err(ApiError::with(
                ResponseError::NotLeaderOrFollower,
                "no controller leader is known; retry",
            ));
        }
        let req = self.next_token.get();
        self.next_token.set(req.wrapping_add(1));
        let (tx, rx) = local_channel::new_bounded(1);
        self.asks.borrow_mut().insert(req, tx);
        let mut payload = req.to_le_bytes().to_vec();
        payload.extend_from_slice(&self.cfg.node_id.to_le_bytes());
        payload.push(op);
        payload.extend_from_slice(&node.to_le_bytes());
        payload
            .extend_from_slice(&(timeout.as_millis().min(u32::MAX as u128) as u32).to_le_bytes());
        self.send_frame(leader as u64, KIND_ASK, &payload);
        let wait = timeout + Duration::from_secs(5);
        let got = futures_lite::future::or(async { rx.recv().await }, async {
            glommio::timer::sleep(wait).await;
            None
        })
        .await;
        self.asks.borrow_mut().remove(&req);
        got.unwrap_or_else(|| {
            Err(ApiError::with(
                ResponseError::RequestTimedOut,
                format!("the controller leader {leader} did not answer in time"),
            ))
        })
    }

    /// DescribeQuorum from any node: this one's view if it leads, else the leader's,
    /// forwarded; `Err(leader)` when neither answers.
    pub async fn describe_anywhere(&self) -> Result<QuorumView, i32> {
        if let Some(v) = self.describe() {
            return Ok(v);
        }
        let leader = self.leader_id();
        match self.ask_leader(0, 0, Duration::from_secs(5)).await {
            Ok(b) => decode_view(&b).ok_or(leader),
            Err(_) => Err(leader),
        }
    }

    /// AddRaftVoter / RemoveRaftVoter from any node: here if it leads, else forwarded.
    pub async fn change_voters_anywhere(
        self: &Rc<Self>,
        node: i32,
        add: bool,
        timeout: Duration,
    ) -> Result<(), ApiError> {
        if self.quorum.borrow().is_leader() {
            return if add {
                self.add_voter(node, timeout).await
            } else {
                self.remove_voter(node, timeout).await
            };
        }
        self.ask_leader(if add { 1 } else { 2 }, node, timeout)
            .await
            .map(|_| ())
    }

    /// Controlled shutdown: moves this broker's leaderships to other in-sync replicas
    /// and takes it out of the ISRs before it stops, by proposing its own fencing (see
    /// the module docs). Returns the state version that holds it, for the caller to wait
    /// until every shard adopted it; `None` when there is nothing to move to (not
    /// registered, or no other live broker: a single node, the last of a cluster) or the
    /// quorum did not apply it within `timeout` (then the broker stops as it would on a
    /// crash: the others fence it after the session timeout). Also `None`, moving
    /// nothing, when fencing would elect a replica outside the ISR for a partition this
    /// broker leads alone (unclean election allowed): as Kafka's controlled shutdown,
    /// it never elects unclean.
    pub async fn controlled_shutdown(self: &Rc<Self>, timeout: Duration) -> Option<u64> {
        let me = self.cfg.node_id;
        let (others_live, unclean) = self.with_state(|s| {
            (
                s.live_brokers().iter().any(|b| *b != me),
                s.fencing_elects_unclean(me),
            )
        });
        if !self.registered() || !others_live {
            return None;
        }
        if unclean {
            tracing::warn!("controlled shutdown: this broker is the only in-sync replica of a partition whose topic allows unclean election; stopping without moving its leaderships");
            return None;
        }
        // No heartbeat from now on: none reaches a controller after it sees the fencing,
        // so none unfences this incarnation (heartbeats and the proposal share each
        // peer's connection, in order).
        self.stopping.set(true);
        let started = Instant::now();
        let version = match self.propose(Command::FenceBroker { id: me }, timeout).await {
            Ok((_, version)) => version,
            Err(e) => {
                tracing::warn!(error = %e, "controlled shutdown: the quorum did not fence this broker; stopping without moving its leaderships");
                return None;
            }
        };
        self.hand_over_leadership(timeout.saturating_sub(started.elapsed()))
            .await;
        Some(version)
    }

    /// A controller without the broker role stopping: hands its raft leadership over
    /// if it leads (a broker does so in its controlled shutdown).
    pub async fn step_down(&self, timeout: Duration) {
        self.stopping.set(true);
        self.hand_over_leadership(timeout).await;
    }

    /// The active controller stopping: hands the raft leadership to a live voter, so
    /// the quorum goes on without waiting an election timeout (a rolling restart's next
    /// broker hands its own leaderships over through it). Waits until another node
    /// leads or `timeout` (at most a second: after that the others elect one anyway).
    async fn hand_over_leadership(&self, timeout: Duration) {
        let me = self.cfg.node_id;
        if !self.quorum.borrow().is_leader() {
            return;
        }
        let voters: Vec<i32> = self
            .quorum
            .borrow()
            .members()
            .voters
            .iter()
            .map(|id| *id as i32)
            .collect();
        // Live: a broker registered and unfenced, or a controller without the broker
        // role heard from within a session timeout.
        let heard = |v: i32| {
            self.last_seen
                .borrow()
                .get(&v)
                .is_some_and(|(t, _)| t.elapsed() < self.cfg.session_timeout)
        };
        let Some(to) = self.with_state(|s| {
            voters
                .into_iter()
                .filter(|v| {
                    *v != me && (s.is_alive(*v) || (!s.brokers.contains_key(v) && heard(*v)))
                })
                .min()
        }) else {
            return;
        };
        self.quorum.borrow_mut().transfer_leader(to as u64);
        self.drive().await;
        let deadline = Instant::now() + timeout.min(Duration::from_secs(1));
        while self.quorum.borrow().is_leader() && Instant::now() < deadline {
            glommio::timer::sleep(self.cfg.tick).await;
        }
        tracing::info!(
            to,
            moved = !self.quorum.borrow().is_leader(),
            "controlled shutdown: controller leadership handed over"
        );
    }

    /// True once this broker's registration (this incarnation) is applied.
    pub fn registered(&self) -> bool {
        self.with_state(|s| {
            s.brokers
                .get(&self.cfg.node_id)
                .is_some_and(|b| b.incarnation == self.incarnation && !b.fenced)
        })
    }

    /// True once the state holds this process's registration (fenced or not): from then
    /// on it is at least as new as the epochs that registration bumped.
    pub fn incarnation_known(&self) -> bool {
        self.with_state(|s| {
            s.brokers
                .get(&self.cfg.node_id)
                .is_some_and(|b| b.incarnation == self.incarnation)
        })
    }

    /// Proposes `cmd` and waits until it is applied here, retrying while no leader is
    /// known, up to `timeout`. Returns the result and the state version after it.
    pub async fn propose(
        self: &Rc<Self>,
        cmd: Command,
        timeout: Duration,
    ) -> Result<(Applied, u64), ApiError> {
        self.propose_to(&cmd, timeout, &self.waiters).await
    }

    /// Asks the quorum for a block of `count` producer ids for `broker`, waiting as
    /// [`Self::propose`] does.
    pub async fn allocate_producer_ids(
        self: &Rc<Self>,
        broker: i32,
        count: i64,
        timeout: Duration,
    ) -> Result<ProducerIdBlock, ApiError> {
        let cmd = Command::AllocateProducerIds { broker, count };
        let (block, _version) = self.propose_to(&cmd, timeout, &self.block_waiters).await?;
        Ok(block)
    }

    /// [`Self::propose`], waiting in `waiters` (see [`Self::answer`]).
    async fn propose_to<T>(
        &self,
        cmd: &Command,
        timeout: Duration,
        waiters: &Waiters<T>,
    ) -> Result<(T, u64), ApiError> {
        self.submit(timeout, waiters, |q, token| q.propose(cmd, token))
            .await
    }

    /// Proposes with `submit` until applied here (a retry keeps the token), while no
    /// leader is known or a membership change is pending, up to `timeout`.
    async fn submit<T>(
        &self,
        timeout: Duration,
        waiters: &Waiters<T>,
        submit: impl Fn(&mut Quorum, u64) -> Result<(), quorum::QuorumError>,
    ) -> Result<(T, u64), ApiError> {
        let deadline = Instant::now() + timeout;
        // One token for every copy: if an earlier copy commits after all, its result is
        // the one this call returns (a later copy's refusal must not hide it).
        let token = self.next_token.get();
        self.next_token.set(token.wrapping_add(1));
        loop {
            let (tx, rx) = local_channel::new_bounded(1);
            waiters.borrow_mut().insert(token, tx);
            let proposed = submit(&mut self.quorum.borrow_mut(), token);
            match proposed {
                Ok(()) => {
                    self.drive().await;
                    let left = deadline.saturating_duration_since(Instant::now());
                    let got =
                        futures_lite::future::or(async { rx.recv().await.map(Some) }, async {
                            glommio::timer::sleep(left.min(Duration::from_secs(5))).await;
                            Some(None)
                        })
                        .await;
                    waiters.borrow_mut().remove(&token);
                    match got {
                        Some(Some((Ok(a), version))) => return Ok((a, version)),
                        Some(Some((Err(e), _))) => return Err(api_error(&e)),
                        // Lost (a leader change dropped it): try again if time is left.
                        _ => {}
                    }
                }
                Err(
                    quorum::QuorumError::NoLeader | quorum::QuorumError::MembershipChangePending,
                ) => {
                    waiters.borrow_mut().remove(&token);
                    glommio::timer::sleep(self.cfg.tick).await;
                }
                Err(quorum::QuorumError::NotLeader) => {
                    waiters.borrow_mut().remove(&token);
                    return Err(not_leader(self.leader_id()));
                }
                Err(e) => {
                    waiters.borrow_mut().remove(&token);
                    return Err(ApiError::with(
                        ResponseError::UnknownServerError,
                        e.to_string(),
                    ));
                }
            }
            if Instant::now() >= deadline {
                return Err(ApiError::with(
                    ResponseError::RequestTimedOut,
                    "the metadata quorum did not commit the change in time (no controller leader?)",
                ));
            }
        }
    }

    fn send(&self, msgs: Vec<raft::prelude::Message>) {
        for m in msgs {
            let to = m.to;
            let mut frame = Vec::new();
            let payload = quorum::encode(&m);
            frame.extend_from_slice(&((payload.len() + 1) as u32).to_be_bytes());
            frame.push(KIND_RAFT);
            frame.extend_from_slice(&payload);
            if let Some(p) = self.peers.borrow().get(&to) {
                p.queue.push(frame);
            }
        }
    }

    fn persist(&self, p: &Persist) -> Result<(), QuorumIoError> {
        if let Some(s) = &p.snapshot {
            // A snapshot from the leader replaces the whole log (raft's storage drops
            // every entry): rewrite the journal as just that, plus what follows it.
            if let Some(h) = &p.hard_state {
                *self.hard_state.borrow_mut() = h.clone();
            }
            *self.tail.borrow_mut() = p.entries.clone();
            return self.compact(s);
        }
        let mut records: Vec<(u8, Vec<u8>)> = Vec::new();
        let mut tail = self.tail.borrow_mut();
        for e in &p.entries {
            records.push((JOURNAL_ENTRY, quorum::encode(e)));
            while tail.last().is_some_and(|l| l.index >= e.index) {
                tail.pop();
            }
            tail.push(e.clone());
        }
        if let Some(h) = &p.hard_state {
            records.push((JOURNAL_HARD_STATE, quorum::encode(h)));
            *self.hard_state.borrow_mut() = h.clone();
        }
        let refs: Vec<(u8, &[u8])> = records.iter().map(|(k, b)| (*k, b.as_slice())).collect();
        self.journal
            .borrow_mut()
            .append(&refs)
            .map_err(QuorumIoError::Write)
    }

    /// Rewrites the journal as the snapshot, the hard state and the entries after it.
    fn compact(&self, s: &raft::prelude::Snapshot) -> Result<(), QuorumIoError> {
        let idx = s.get_metadata().index;
        let mut tail = self.tail.borrow_mut();
        tail.retain(|e| e.index > idx);
        let mut records = vec![(JOURNAL_SNAPSHOT, quorum::encode(s))];
        records.push((
            JOURNAL_HARD_STATE,
            quorum::encode(&*self.hard_state.borrow()),
        ));
        records.extend(tail.iter().map(|e| (JOURNAL_ENTRY, quorum::encode(e))));
        let refs: Vec<(u8, &[u8])> = records.iter().map(|(k, b)| (*k, b.as_slice())).collect();
        self.journal
            .borrow_mut()
            .rewrite(&refs)
            .map_err(QuorumIoError::Write)
    }

    /// Runs the Ready loop until raft has nothing more to do.
    pub async fn drive(&self) {
        let Ok(_guard) = self.drive_lock.acquire_permit(1).await else {
            return;
        };
        loop {
            let ready = self.quorum.borrow_mut().ready();
            let Some(mut p) = ready else { break };
            self.send(std::mem::take(&mut p.send_now));
            if let Err(e) = self.persist(&p) {
                // Raft's safety rests on this write: without it the node must stop, and
                // stop for good (a supervisor restarts it), not linger half alive with
                // its Kafka port open.
                exit_on_quorum_io_failure(&e.to_string());
            }
            let (applied, caught_up) = {
                let mut q = self.quorum.borrow_mut();
                let amnesiac = q.amnesiac();
                (q.advance(), amnesiac && !q.amnesiac())
            };
            if caught_up {
                tracing::info!(
                    "this voter caught up with the metadata log's leader: it votes again"
                );
            }
            self.send(applied.send);
            if let Some(s) = &applied.snapshot {
                if let Err(e) = self.compact(s) {
                    tracing::warn!(error = %e, "compacting the metadata journal failed");
                }
            }
            let version = self.quorum.borrow().state().version;
            for c in applied.commands {
                if let Err(e) = &c.result {
                    tracing::debug!(index = c.index, error = %e, "metadata command refused");
                }
                if let Some(t) = c.token {
                    self.answer(t, c.result, version);
                }
            }
            if applied.state_changed {
                self.bump_change();
            }
        }
        let leader = self.quorum.borrow().leader_id();
        if leader != self.last_leader.get() {
            self.last_leader.set(leader);
            tracing::info!(node = self.cfg.node_id, leader, "controller leader changed");
            self.bump_change();
        }
    }

    /// Hands a command's result to this node's proposal `token`, if one still waits:
    /// a producer id block, or a refusal, to [`Self::allocate_producer_ids`] when it
    /// proposed it, anything else to [`Self::propose`]. Only `AllocateProducerIds`
    /// applies as a block, so each waiter gets the one type its command yields.
    fn answer(&self, token: u64, result: Result<Applied, ApplyError>, version: u64) {
        let block = match &result {
            Ok(Applied::ProducerIds(block)) => Some(Ok(*block)),
            Err(e) => Some(Err(e.clone())),
            Ok(Applied::Done | Applied::Partitions(_) | Applied::DirectoryReplaced) => None,
        };
        if let Some(block) = block {
            if let Some(w) = self.block_waiters.borrow_mut().remove(&token) {
                let _ = w.try_send((block, version));
                return;
            }
        }
        if let Some(w) = self.waiters.borrow_mut().remove(&token) {
            let _ = w.try_send((result, version));
        }
    }

    fn bump_change(&self) {
        self.change_count.set(self.change_count.get() + 1);
        self.changed.notify(usize::MAX);
    }

    /// The leader's periodic duties.
    fn duties(self: &Rc<Self>, last_preferred: &mut Instant) {
        let is_leader = self.quorum.borrow().is_leader();
        if !is_leader {
            self.was_leader.set(false);
            return;
        }
        let now = Instant::now();
        if !self.was_leader.get() {
            // A new leader grants everyone a full session before judging liveness, and
            // forgets when it saw brokers fenced in an earlier term (a broker may have been
            // unfenced and fenced again meanwhile).
            self.was_leader.set(true);
            self.leader_since.set(now);
            self.fenced_since.borrow_mut().clear();
            // Only live brokers: a fenced one must prove itself with a heartbeat.
            let live: Vec<(i32, u64)> = self.with_state(|s| {
                s.brokers
                    .values()
                    .filter(|b| !b.fenced)
                    .map(|b| (b.id, b.incarnation))
                    .collect()
            });
            let mut seen = self.last_seen.borrow_mut();
            for (id, inc) in live {
                seen.insert(id, (now, inc));
            }
            if self.with_state(|s| s.cluster_id.is_empty()) {
                let id = crate::base::metadata::new_cluster_id();
                self.spawn_propose(Command::Init { cluster_id: id }, None);
            }
        }
        if !self.stopping.get() {
            self.last_seen
                .borrow_mut()
                .insert(self.cfg.node_id, (now, self.incarnation));
        }
        let brokers: Vec<(i32, bool, u64)> = self.with_state(|s| {
            s.brokers
                .values()
                .map(|b| (b.id, b.fenced, b.incarnation))
                .collect()
        });
        for (id, fenced, incarnation) in brokers {
            let seen = self.last_seen.borrow().get(&id).copied();
            let lapsed = |t: Instant| now.duration_since(t) > self.cfg.session_timeout;
            let since = if fenced {
                Some(*self.fenced_since.borrow_mut().entry(id).or_insert(now))
            } else {
                self.fenced_since.borrow_mut().remove(&id);
                None
            };
            if !fenced && seen.is_none_or(|(t, _)| lapsed(t)) {
                tracing::warn!(broker = id, "broker heartbeats lapsed; fencing it");
                self.spawn_propose(Command::FenceBroker { id }, Some((id, true)));
            } else if fenced
                && seen.is_some_and(|(t, inc)| {
                    !lapsed(t) && inc == incarnation && since.is_some_and(|f| t > f)
                })
            {
                tracing::info!(broker = id, "fenced broker heartbeats again; unfencing it");
                self.spawn_propose(Command::UnfenceBroker { id }, Some((id, false)));
            }
        }
        self.membership_upkeep();
        if self.cfg.auto_leader_rebalance && now.duration_since(*last_preferred) >= PREFERRED_CHECK
        {
            *last_preferred = now;
            for (topic, partition) in self.with_state(|s| s.preferred_elections()) {
                self.spawn_propose(Command::ElectPreferred { topic, partition }, None);
            }
        }
    }

    fn spawn_propose(self: &Rc<Self>, cmd: Command, key: Option<(i32, bool)>) {
        if let Some(k) = key {
            if !self.proposing.borrow_mut().insert(k) {
                return;
            }
        }
        let node = self.clone();
        glommio::spawn_local(async move {
            if let Err(e) = node.propose(cmd, node.cfg.session_timeout).await {
                tracing::debug!(error = %e, "controller proposal failed");
            }
            if let Some(k) = key {
                node.proposing.borrow_mut().remove(&k);
            }
        })
        .detach();
    }

    fn on_frame(self: &Rc<Self>, kind: u8, payload: &[u8]) -> Result<(), QuorumIoError> {
        match kind {
            KIND_RAFT => {
                let m = quorum::decode::<raft::prelude::Message>(payload)
                    .map_err(QuorumIoError::Frame)?;
                let from_leader = matches!(
                    m.get_msg_type(),
                    raft::prelude::MessageType::MsgAppend
                        | raft::prelude::MessageType::MsgHeartbeat
                        | raft::prelude::MessageType::MsgSnapshot
                );
                if from_leader && self.lone_and_empty() {
                    // A leader of a configuration this lone voter does not know of yet:
                    // the cluster grew, and this voter lost its log.
                    self.lone_refuses(m.from as i32);
                }
                let mut q = self.quorum.borrow_mut();
                if let Err(e) = q.step(m) {
                    tracing::debug!(error = %e, "raft refused a message");
                }
                for voter in q.take_forgotten() {
                    tracing::warn!(voter, "a controller voter lost its metadata log (a wiped or replaced disk): sending it the log again; it votes only once it has caught up");
                }
                Ok(())
            }
            KIND_HEARTBEAT if payload.len() == 12 => {
                let id = i32::from_le_bytes(payload[..4].try_into().unwrap());
                let incarnation = u64::from_le_bytes(payload[4..].try_into().unwrap());
                self.last_seen
                    .borrow_mut()
                    .insert(id, (Instant::now(), incarnation));
                Ok(())
            }
            KIND_HELLO => self.on_hello(payload),
            KIND_ASK if payload.len() == 21 => {
                let req = u64::from_le_bytes(payload[..8].try_into().unwrap());
                let from = i32::from_le_bytes(payload[8..12].try_into().unwrap());
                let op = payload[12];
                let node = i32::from_le_bytes(payload[13..17].try_into().unwrap());
                let timeout = u32::from_le_bytes(payload[17..21].try_into().unwrap());
                let me = self.clone();
                glommio::spawn_local(async move {
                    let timeout = Duration::from_millis(u64::from(timeout));
                    let answer = match op {
                        0 => me
                            .describe()
                            .map(|v| encode_view(&v))
                            .ok_or_else(|| not_leader(me.leader_id())),
                        1 => me.add_voter(node, timeout).await.map(|()| Vec::new()),
                        2 => me.remove_voter(node, timeout).await.map(|()| Vec::new()),
                        _ => Err(ApiError::with(
                            ResponseError::InvalidRequest,
                            "unknown quorum request",
                        )),
                    };
                    me.answer_ask(from, req, answer);
                })
                .detach();
                Ok(())
            }
            KIND_ANSWER if payload.len() >= 12 => {
                let req = u64::from_le_bytes(payload[..8].try_into().unwrap());
                let code = i16::from_le_bytes(payload[8..10].try_into().unwrap());
                let len = u16::from_le_bytes(payload[10..12].try_into().unwrap()) as usize;
                let Some(message) = payload.get(12..12 + len) else {
                    return Err(QuorumIoError::UnknownFrame(KIND_ANSWER));
                };
                let rest = payload[12 + len..].to_vec();
                let answer = if code == 0 {
                    Ok(rest)
                } else {
                    let code = ResponseError::try_from_code(code)
                        .unwrap_or(ResponseError::UnknownServerError);
                    Err(ApiError::with(
                        code,
                        String::from_utf8_lossy(message).into_owned(),
                    ))
                };
                if let Some(w) = self.asks.borrow_mut().remove(&req) {
                    let _ = w.try_send(answer);
                }
                Ok(())
            }
            k => Err(QuorumIoError::UnknownFrame(k)),
        }
    }
}

/// A [`QuorumView`] as a forwarded DescribeQuorum's answer carries it.
fn encode_view(v: &QuorumView) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&v.leader.to_le_bytes());
    out.extend_from_slice(&v.term.to_le_bytes());
    out.extend_from_slice(&v.high_watermark.to_le_bytes());
    for nodes in [&v.voters, &v.observers] {
        out.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
        for (id, end, heard) in nodes {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&end.to_le_bytes());
            out.extend_from_slice(&heard.to_le_bytes());
        }
    }
    out
}

fn decode_view(b: &[u8]) -> Option<QuorumView> {
    let mut at = 0;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = b.get(at..at + n)?;
        at += n;
        Some(s)
    };
    let leader = i32::from_le_bytes(take(4)?.try_into().ok()?);
    let term = i32::from_le_bytes(take(4)?.try_into().ok()?);
    let high_watermark = i64::from_le_bytes(take(8)?.try_into().ok()?);
    let mut lists = Vec::new();
    for _ in 0..2 {
        let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let mut nodes = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let id = i32::from_le_bytes(take(4)?.try_into().ok()?);
            let end = i64::from_le_bytes(take(8)?.try_into().ok()?);
            let heard = i64::from_le_bytes(take(8)?.try_into().ok()?);
            nodes.push((id, end, heard));
        }
        lists.push(nodes);
    }
    let observers = lists.pop()?;
    let voters = lists.pop()?;
    Some(QuorumView {
        leader,
        term,
        high_watermark,
        voters,
        observers,
    })
}

/// NOT_LEADER_OR_FOLLOWER naming the controller leader.
fn not_leader(leader: i32) -> ApiError {
    ApiError::with(
        ResponseError::NotLeaderOrFollower,
        format!("this node does not lead the metadata quorum; the leader is {leader}"),
    )
}

fn push_hello_entry(out: &mut Vec<u8>, id: i32, flags: u8, addr: SocketAddr) {
    let text = addr.to_string();
    out.extend_from_slice(&id.to_le_bytes());
    out.push(flags);
    out.push(text.len() as u8);
    out.extend_from_slice(text.as_bytes());
}

/// A hello's entries, `None` if it is malformed.
/// A hello's entries `(id, flags, controller address)`, `None` if it is malformed.
fn parse_hello(mut b: &[u8]) -> Option<Vec<(i32, u8, SocketAddr)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 6 {
            return None;
        }
        let id = i32::from_le_bytes(b[..4].try_into().ok()?);
        if id < 1 {
            return None; // not a node id
        }
        let flags = b[4];
        let len = b[5] as usize;
        let text = std::str::from_utf8(b.get(6..6 + len)?).ok()?;
        out.push((id, flags, text.parse().ok()?));
        b = &b[6 + len..];
    }
    (!out.is_empty()).then_some(out)
}

async fn ticker(node: std::rc::Weak<QuorumNode>) {
    let mut last_preferred = Instant::now();
    loop {
        let Some(n) = node.upgrade() else { return };
        let tick = n.cfg.tick;
        if !n.lone_voter_holds() {
            n.quorum.borrow_mut().tick();
        }
        n.duties(&mut last_preferred);
        n.drive().await;
        drop(n);
        glommio::timer::sleep(tick).await;
    }
}

async fn heartbeater(node: std::rc::Weak<QuorumNode>) {
    loop {
        let Some(n) = node.upgrade() else { return };
        let interval = n.cfg.heartbeat_interval;
        n.send_heartbeat();
        n.send_hello();
        drop(n);
        glommio::timer::sleep(interval).await;
    }
}

/// Proposes this broker's registration until it is applied, after its data
/// directory's id, unless the state already records that one for it: a broker back on
/// a lost directory must leave the ISRs before it registers (and is elected anywhere).
async fn register_self(node: std::rc::Weak<QuorumNode>) {
    loop {
        let Some(n) = node.upgrade() else { return };
        if n.registered() {
            tracing::info!(
                node = n.cfg.node_id,
                "broker registered with the controller"
            );
            return;
        }
        let (id, dir) = (n.cfg.node_id, n.cfg.directory.clone());
        let recorded = n.with_state(|s| s.directories.get(&id).cloned());
        if recorded.as_ref() != Some(&dir) {
            let cmd = Command::RecordDirectory {
                id,
                directory: dir.clone(),
            };
            match n.propose(cmd, Duration::from_secs(3)).await {
                Ok((Applied::DirectoryReplaced, _)) => tracing::warn!(
                    node = id,
                    directory = %dir,
                    "this broker runs on another data directory than it did: its replicas hold nothing, so it left every ISR and fetches them again"
                ),
                Ok(_) => tracing::info!(node = id, directory = %dir, "data directory recorded"),
                Err(e) => {
                    tracing::debug!(error = %e, "directory record not committed yet; retrying");
                    let tick = n.cfg.tick;
                    drop(n);
                    glommio::timer::sleep(tick * 3).await;
                }
            }
            continue;
        }
        // Without a rack, the version-1 command: voters of an older build read it.
        let cmd = match &n.cfg.rack {
            _ if !n.cfg.endpoints.is_empty() => Command::RegisterBrokerListeners {
                id: n.cfg.node_id,
                incarnation: n.incarnation,
                rack: n.cfg.rack.clone(),
                endpoints: n.cfg.endpoints.clone(),
            },
            None => Command::RegisterBroker {
                id: n.cfg.node_id,
                host: n.cfg.host.clone(),
                port: n.cfg.port,
                incarnation: n.incarnation,
            },
            Some(rack) => Command::RegisterBrokerInRack {
                id: n.cfg.node_id,
                host: n.cfg.host.clone(),
                port: n.cfg.port,
                incarnation: n.incarnation,
                rack: rack.clone(),
            },
        };
        if let Err(e) = n.propose(cmd, Duration::from_secs(3)).await {
            tracing::debug!(error = %e, "registration not committed yet; retrying");
            let tick = n.cfg.tick;
            drop(n);
            glommio::timer::sleep(tick * 3).await;
        }
    }
}

/// Frames waiting for one peer's connection; bounded, oldest kept (raft resends).
#[derive(Default)]
struct PeerQueue {
    frames: RefCell<std::collections::VecDeque<Vec<u8>>>,
    ready: Event,
    /// The peer moved to another address: its sender stops.
    closed: Cell<bool>,
}

impl PeerQueue {
    fn push(&self, frame: Vec<u8>) {
        let mut q = self.frames.borrow_mut();
        if q.len() >= PEER_QUEUE {
            tracing::debug!("controller queue full; message dropped");
            return;
        }
        q.push_back(frame);
        drop(q);
        self.ready.notify(1);
    }

    fn try_pop(&self) -> Option<Vec<u8>> {
        self.frames.borrow_mut().pop_front()
    }

    /// The next frame, `None` once the queue is closed.
    async fn pop(&self) -> Option<Vec<u8>> {
        loop {
            let listener = self.ready.listen();
            if self.closed.get() {
                return None;
            }
            if let Some(f) = self.try_pop() {
                return Some(f);
            }
            listener.await;
        }
    }

    fn close(&self) {
        self.closed.set(true);
        self.ready.notify(usize::MAX);
    }
}

async fn peer_sender(
    node: std::rc::Weak<QuorumNode>,
    peer: u64,
    addr: SocketAddr,
    rx: Rc<PeerQueue>,
) {
    let mut conn: Option<sluice_client::aio::Stream> = None;
    loop {
        let Some(frame) = rx.pop().await else { return };
        if node.strong_count() == 0 {
            return;
        }
        if conn.is_none() {
            match connect_peer(addr).await {
                Ok(s) => conn = Some(s),
                Err(e) => {
                    tracing::trace!(peer, %addr, error = %e, "controller peer unreachable");
                    if let Some(n) = node.upgrade() {
                        n.quorum.borrow_mut().report_unreachable(peer);
                    }
                    // Drop what is queued: raft resends, and stale heartbeats mislead.
                    while rx.try_pop().is_some() {}
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        let s = conn.as_mut().expect("connected above");
        let mut buf = frame;
        // Batch whatever else is queued into one write.
        while buf.len() < (1 << 20) {
            match rx.try_pop() {
                Some(f) => buf.extend_from_slice(&f),
                None => break,
            }
        }
        let written = match s.write_all(&buf).await {
            // TLS: what a full socket left in the session goes out now.
            Ok(()) => s.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::debug!(peer, error = %e, "controller connection lost");
            conn = None;
            if let Some(n) = node.upgrade() {
                n.quorum.borrow_mut().report_unreachable(peer);
            }
        }
    }
}

/// A connection to a controller peer: TLS with this node's certificate when the
/// cluster's listeners are TLS ([`sluice_client::tls::controller_tls`]), else plain.
async fn connect_peer(addr: SocketAddr) -> std::io::Result<sluice_client::aio::Stream> {
    let s = TcpStream::connect_timeout(addr, Duration::from_millis(500))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let _ = s.set_nodelay(true);
    let Some((_, client)) = sluice_client::tls::controller_tls() else {
        return Ok(sluice_client::aio::Stream::Plain(s));
    };
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let handshake = futures_rustls::TlsConnector::from(client).connect(name, s);
    let tls = futures_lite::future::or(handshake, async {
        glommio::timer::sleep(CONTROLLER_HANDSHAKE_MAX).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no TLS handshake with the controller peer",
        ))
    })
    .await
    .inspect_err(|e| {
        tracing::debug!(target: "sluice::audit", %addr, error = %e, "controller port: TLS handshake with a peer failed")
    })?;
    Ok(sluice_client::aio::Stream::Tls(Box::new(tls)))
}

/// How long a controller connection's TLS handshake may take.
const CONTROLLER_HANDSHAKE_MAX: Duration = Duration::from_secs(5);

async fn accept_loop(node: std::rc::Weak<QuorumNode>, listener: glommio::net::TcpListener) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                let node = node.clone();
                let tls = sluice_client::tls::controller_tls();
                glommio::spawn_local(async move {
                    let peer = stream.peer_addr().ok();
                    let result = match tls {
                        None => receive(node, stream).await,
                        Some((server, _)) => {
                            // Mutual TLS: a node without a certificate of the cluster's
                            // CA cannot speak to the metadata quorum.
                            let accept = futures_rustls::TlsAcceptor::from(server).accept(stream);
                            let handshake = futures_lite::future::or(accept, async {
                                glommio::timer::sleep(CONTROLLER_HANDSHAKE_MAX).await;
                                Err(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    "no TLS handshake",
                                ))
                            });
                            match handshake.await {
                                Ok(s) => receive(node, s).await,
                                Err(e) => {
                                    tracing::info!(target: "sluice::audit", ?peer, error = %e, "controller port: TLS handshake failed: connection refused");
                                    Ok(())
                                }
                            }
                        }
                    };
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "controller connection closed");
                    }
                })
                .detach();
            }
            Err(e) => {
                tracing::warn!(error = %e, "controller accept failed");
                glommio::timer::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn receive<S: futures_lite::AsyncRead + Unpin>(
    node: std::rc::Weak<QuorumNode>,
    mut s: S,
) -> Result<(), QuorumIoError> {
    let mut header = [0u8; 5];
    loop {
        s.read_exact(&mut header[..4]).await?;
        let len = u32::from_be_bytes(header[..4].try_into().unwrap()) as usize;
        if len == 0 || len > FRAME_MAX {
            return Err(QuorumIoError::FrameLength(len));
        }
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).await?;
        let Some(n) = node.upgrade() else {
            return Ok(());
        };
        n.on_frame(body[0], &body[1..])?;
        if body[0] == KIND_RAFT {
            n.drive().await;
        }
    }
}

pub use crate::base::config::parse_quorum;

/// The quorum's state as the broker's metadata image; `previous`, the image published
/// before, lends the remote logs that did not change since (see [`remote_logs`]).
pub fn image_of(
    state: &ClusterState,
    previous: Option<&crate::base::metadata::MetadataImage>,
    controller_id: i32,
    epoch: u64,
    registered: bool,
) -> crate::base::metadata::MetadataImage {
    use crate::base::metadata::{BrokerMeta, MetadataImage, TopicMeta};
    MetadataImage {
        epoch,
        cluster_id: state.cluster_id.clone(),
        controller_id: crate::base::ids::BrokerId::new(controller_id),
        registered,
        brokers: state
            .brokers
            .values()
            .map(|b| {
                (
                    crate::base::ids::BrokerId::new(b.id),
                    BrokerMeta {
                        host: b.host.clone(),
                        port: b.port,
                        fenced: b.fenced,
                        rack: b.rack.clone(),
                        endpoints: state
                            .endpoints
                            .get(&b.id)
                            .map(|eps| {
                                eps.iter()
                                    .map(|e| (e.listener.clone(), e.host.clone(), e.port))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
        broker_configs: state.broker_configs.clone(),
        scram: state.scram.clone(),
        group_configs: state.group_configs.clone(),
        acls: std::sync::Arc::new(sluice_replication::acl::AclIndex::new(&state.acls)),
        quotas: std::sync::Arc::new(state.quotas.clone()),
        remote: std::sync::Arc::new(remote_logs(&state.remote, previous.map(|p| &*p.remote))),
        remote_purge: state.remote_purge.clone(),
        topics: state
            .topics
            .iter()
            .map(|(name, t)| {
                (
                    name.clone(),
                    TopicMeta {
                        id: uuid::Uuid::from_bytes(t.id),
                        partitions: t.partitions.len() as i32,
                        configs: t.configs.clone(),
                        assignments: t.partitions.clone(),
                    },
                )
            })
            .collect(),
    }
}

/// The state's remote logs for an image, each partition's shared with `previous` when
/// it did not change. A remote log only grows at its end (uploads) and loses segments
/// at its start (retention, DeleteRecords) or its end (an unclean leader's
/// truncation, which may also cut the last segment short), and every segment has its
/// own id, so the same count, log start, first and last ids and last offset mean the
/// same log: a new image costs a
/// comparison a partition instead of a copy of every segment (at millions of remote
/// segments, tens of megabytes per metadata change).
pub fn remote_logs(
    state: &BTreeMap<String, BTreeMap<i32, sluice_replication::cluster::RemoteLog>>,
    previous: Option<&crate::base::metadata::RemoteLogs>,
) -> crate::base::metadata::RemoteLogs {
    use sluice_replication::cluster::RemoteLog;
    let same = |a: &RemoteLog, b: &RemoteLog| {
        let ids = |l: &RemoteLog| {
            (
                l.segments.first().map(|s| s.id),
                l.segments.last().map(|s| (s.id, s.last_offset)),
            )
        };
        a.segments.len() == b.segments.len() && a.log_start == b.log_start && ids(a) == ids(b)
    };
    state
        .iter()
        .map(|(topic, logs)| {
            let before = previous.and_then(|p| p.get(topic));
            let logs = logs
                .iter()
                .map(|(p, log)| {
                    let kept = before
                        .and_then(|b| b.get(p))
                        .filter(|b| same(b, log))
                        .cloned();
                    (*p, kept.unwrap_or_else(|| std::sync::Arc::new(log.clone())))
                })
                .collect();
            (topic.clone(), logs)
        })
        .collect()
}

/// The exit code of a broker whose metadata quorum I/O failed (EX_IOERR of sysexits.h).
pub const EXIT_QUORUM_IO: i32 = 74;

/// Ends the process after a failed write of the metadata journal, with the cause on
/// stderr and [`EXIT_QUORUM_IO`]: the node cannot take part in the quorum without it.
fn exit_on_quorum_io_failure(cause: &str) -> ! {
    tracing::error!(error = %cause, "persisting the metadata log failed; exiting");
    eprintln!(
        "sluice: fatal: writing the metadata journal failed ({cause}); exiting with code {EXIT_QUORUM_IO} so that a supervisor restarts the broker once the disk is fixed"
    );
    std::process::exit(EXIT_QUORUM_IO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_description_round_trips_and_truncation_is_refused() {
        let v = QuorumView {
            leader: 2,
            term: 7,
            high_watermark: 99,
            voters: vec![(1, 98, 5), (2, 99, -1)],
            observers: vec![(4, 90, 3)],
        };
        let b = encode_view(&v);
        assert_eq!(decode_view(&b), Some(v));
        assert_eq!(decode_view(&b[..b.len() - 1]), None);
        assert_eq!(
            parse_hello(&[0, 0, 0, 0, 1, 0]),
            None,
            "node id 0 is malformed"
        );
    }

    #[test]
    fn quorum_flag_parses_and_rejects_nonsense() {
        let q = parse_quorum("1@127.0.0.1:9192, 2@127.0.0.1:9193").unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[1].0, 2);
        assert!(parse_quorum("1@127.0.0.1:1,1@127.0.0.1:2").is_err());
        assert!(parse_quorum("x@127.0.0.1:1").is_err());
        assert!(parse_quorum("1-127.0.0.1:1").is_err());
        assert!(parse_quorum("0@127.0.0.1:1").is_err());
        assert!(parse_quorum("").is_err());
    }

    fn segment(id: u8, base: i64, last: i64) -> sluice_replication::cluster::RemoteSegment {
        sluice_replication::cluster::RemoteSegment {
            id: [id; 16],
            base_offset: base,
            last_offset: last,
            max_timestamp: -1,
            size: 100,
            leader_epoch: 0,
            uploaded_ms: 0,
            last_epoch: 0,
        }
    }

    #[test]
    fn an_image_shares_the_remote_logs_that_did_not_change() {
        use sluice_replication::cluster::RemoteLog;
        let log = |ids: &[u8]| RemoteLog {
            segments: ids
                .iter()
                .map(|&i| segment(i, i as i64 * 10, i as i64 * 10 + 9))
                .collect(),
            log_start: 0,
        };
        let mut state: BTreeMap<String, BTreeMap<i32, RemoteLog>> = BTreeMap::new();
        state.insert(
            "t".into(),
            [(0, log(&[1, 2])), (1, log(&[1, 2])), (2, log(&[1]))].into(),
        );
        let first = remote_logs(&state, None);
        // Partition 0 uploads a segment; partition 1 loses its first and gains one (same
        // count); partition 2 moves its log start; partition 3 appears.
        let t = state.get_mut("t").unwrap();
        t.get_mut(&0).unwrap().segments.push(segment(3, 30, 39));
        t.insert(1, log(&[2, 3]));
        t.get_mut(&2).unwrap().log_start = 5;
        t.insert(3, log(&[1]));
        state.insert("u".into(), [(0, log(&[7]))].into());
        let second = remote_logs(&state, Some(&first));
        for (topic, logs) in &state {
            for (p, l) in logs {
                assert_eq!(&*second[topic][p], l, "{topic}-{p} as in the state");
            }
        }
        for p in 0..3 {
            assert!(
                !std::sync::Arc::ptr_eq(&first["t"][&p], &second["t"][&p]),
                "t-{p} changed"
            );
        }
        // Nothing changed since: every partition shared.
        let third = remote_logs(&state, Some(&second));
        for (topic, logs) in &second {
            for (p, l) in logs {
                assert!(
                    std::sync::Arc::ptr_eq(l, &third[topic][p]),
                    "{topic}-{p} shared"
                );
            }
        }
        // An unclean leader cuts the last segment short: same count and ids.
        state
            .get_mut("t")
            .unwrap()
            .get_mut(&2)
            .unwrap()
            .truncate(15);
        let fourth = remote_logs(&state, Some(&third));
        assert_eq!(fourth["t"][&2].end_offset(), Some(15));
        assert!(!std::sync::Arc::ptr_eq(&third["t"][&2], &fourth["t"][&2]));
    }

    /// What a metadata change costs the image at a million remote segments (1,000
    /// partitions of 1,000): `cargo test --profile unit -p sluice --lib
    /// image_at_a_million_remote_segments -- --ignored --nocapture`. A figure, not an
    /// assertion (docs/benchmarks.md, "Tiered storage").
    #[test]
    #[ignore]
    fn image_at_a_million_remote_segments() {
        use sluice_replication::cluster::RemoteLog;
        let mut state: BTreeMap<String, BTreeMap<i32, RemoteLog>> = BTreeMap::new();
        for t in 0..10 {
            let logs = (0..100)
                .map(|p| {
                    let segments = (0..1000).map(|i| segment((i % 251) as u8, i * 10, i * 10 + 9));
                    (
                        p,
                        RemoteLog {
                            segments: segments.collect(),
                            log_start: 0,
                        },
                    )
                })
                .collect();
            state.insert(format!("topic-{t}"), logs);
        }
        let started = std::time::Instant::now();
        let copied = state.clone();
        let copy = started.elapsed();
        let first = remote_logs(&state, None);
        let started = std::time::Instant::now();
        let rounds = 20;
        for i in 0..rounds {
            // One partition uploads a segment, as between two images.
            let log = state.get_mut("topic-3").unwrap().get_mut(&7).unwrap();
            log.segments
                .push(segment(0, 100_000 + i * 10, 100_000 + i * 10 + 9));
            std::hint::black_box(remote_logs(&state, Some(&first)));
        }
        let shared = started.elapsed() / rounds as u32;
        println!(
            "1,000,000 remote segments over 1,000 partitions: a copy of them {copy:?}, an image sharing the unchanged ones {shared:?}"
        );
        drop(copied);
    }
}
