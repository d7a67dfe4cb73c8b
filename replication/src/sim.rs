//! A seeded, deterministic simulation of a cluster replicating partitions with the
//! [`isr`](crate::isr) state machines under the [`cluster`](crate::cluster) controller.
//!
//! What is modelled:
//! - Brokers `1..=n`, each with, per partition, a log of records `(offset, leader epoch,
//!   unique payload id)` and the broker's own [`isr::ReplicaState`] (durable end,
//!   leader-epoch cache, an [`isr::Leader`] or [`isr::Follower`] chosen from the
//!   broker's *local*, possibly stale, view of the metadata), driven through the same
//!   transitions the broker's fetcher uses. A follower's truncation is a log operation
//!   that completes some milliseconds later, and its append one that completes at the
//!   next fsync, so metadata (a leadership) can arrive while either runs — the
//!   election-versus-truncation race the partition-lock rule of [`isr::ReplicaState`]
//!   serialises.
//! - The metadata quorum as a linearizable service: commands apply atomically, in order,
//!   to one [`ClusterState`]; each broker receives new versions after random delays (and
//!   not while isolated), so brokers act on stale views. (raft itself is tested in
//!   `quorum`.)
//! - A network that drops, delays and reorders messages (Fetch, OffsetForLeaderEpoch,
//!   AlterPartition) and can isolate one broker from everyone, controller included.
//! - fsync completions; crashes that lose everything past the durable prefix and restart
//!   with a new incarnation (re-registration fences the old one, as KRaft does); a
//!   partition log failing in a running broker (an I/O error: the unsynced tail lost,
//!   `Command::ReplicaOffline`, a reopen that waits for a newer leader epoch when the
//!   replica led);
//!   heartbeats that lapse into fencing; a periodic high-watermark checkpoint.
//! - Clients producing with `acks=all` (min.insync.replicas 2) to whichever broker they
//!   believe leads, sometimes a stale one.
//!
//! Sluice's follower fsyncs what it fetched before it fetches again, so its fetch offset
//! is its durable log end: the leader never counts an unsynced follower record.
//!
//! Invariants checked after every step (a failure names the seed and step):
//! 1. One writer per partition and leader epoch: no two brokers append client records in
//!    the same epoch.
//! 2. A replica's high watermark never moves back, except across a crash, where it restarts
//!    from its last checkpoint (Kafka checkpoints the hw periodically; so does the sim).
//! 3. Every record acknowledged with `acks=all` is, at its offset, in the log (durable
//!    prefix) of every member of the controller's current ISR.
//! 4. Replica logs are prefix-consistent up to their high watermarks (every replica's
//!    prefix below its hw is a prefix of one committed sequence).
//!
//! At the end the faults stop and everything heals; the cluster must converge (full
//! ISRs, identical logs, hw at the log end) and every acknowledged record must be in the
//! final leader's log at its offset.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::cluster::{Applied, ClusterState, Command, IsrChange};
use crate::isr::{
    self, FollowerPhase, LeaderEpoch, LeaderEpochCache, LogOp, LogOpKind, Offset, ReplicaError,
    ReplicaState, Role,
};
use crate::{BrokerId, NO_BROKER};

/// The controller's address on the simulated network.
const CONTROLLER: BrokerId = 0;
const TOPIC: &str = "sim";

// ---------------------------------------------------------------------------------------
// Configuration, results
// ---------------------------------------------------------------------------------------

/// Deliberate bugs, to prove that the invariants catch them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Knobs {
    /// High watermark over the committed ISR only (breaks KIP-497).
    pub ignore_pending_isr: bool,
    /// Followers fetch without truncating first (breaks KIP-101).
    pub skip_truncation: bool,
    /// Followers fetch (and so report as theirs) records they have not fsynced yet.
    pub fetch_unsynced: bool,
    /// A leader whose log failed reopens at once, in the leader epoch it had (the
    /// broker's `Offline::led_in` wait skipped).
    pub reopen_in_same_epoch: bool,
    /// A leader's append is not fenced where it takes its offsets (the broker's
    /// `PartitionLog::set_leader_fence` missing): a produce that passed its epoch
    /// check while this broker led appends after its demotion, stamped with the old
    /// epoch, possibly after records of a newer one that it fetched since.
    pub unfenced_leader_appends: bool,
    /// A fetching follower whose log ends past its durable end never syncs that tail
    /// (`ReplicaState::begin_tail_sync` unused, as in the broker before 2026-12-05):
    /// its fetch from the durable end finds the log ending elsewhere, for ever.
    pub no_tail_sync: bool,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// 3 to 5.
    pub brokers: usize,
    pub partitions: usize,
    /// Steps with faults; the healing phase comes after.
    pub steps: u64,
    pub min_insync: usize,
    pub replica_lag_time_max_ms: u64,
    pub session_timeout_ms: u64,
    pub knobs: Knobs,
    /// Collect a trace of every event.
    pub trace: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            brokers: 3,
            partitions: 2,
            steps: 1_500,
            min_insync: 2,
            replica_lag_time_max_ms: 200,
            session_timeout_ms: 400,
            knobs: Knobs::default(),
            trace: false,
        }
    }
}

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub steps: u64,
    pub produced: u64,
    pub acked: u64,
    pub refused: u64,
    pub leader_changes: u64,
    pub crashes: u64,
    /// Partition logs that failed (an I/O error) in a running broker and reopened.
    pub log_failures: u64,
    pub isolations: u64,
    pub fenced: u64,
    pub isr_changes: u64,
    /// AlterPartitions batches (several ISR changes of one broker at once) applied.
    pub alter_batches: u64,
    pub truncated_records: u64,
    /// Truncations that needed another OffsetForLeaderEpoch round (KIP-279).
    pub truncation_extra_rounds: u64,
    /// Fetching followers that synced a tail past their durable end first
    /// (`ReplicaState::begin_tail_sync`).
    pub tail_syncs: u64,
    /// Records a deposed leader appended after its demotion (a produce that passed its
    /// epoch check before it).
    pub late_appends: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.produced += o.produced;
        self.acked += o.acked;
        self.refused += o.refused;
        self.leader_changes += o.leader_changes;
        self.crashes += o.crashes;
        self.log_failures += o.log_failures;
        self.isolations += o.isolations;
        self.fenced += o.fenced;
        self.isr_changes += o.isr_changes;
        self.alter_batches += o.alter_batches;
        self.truncated_records += o.truncated_records;
        self.truncation_extra_rounds += o.truncation_extra_rounds;
        self.tail_syncs += o.tail_syncs;
        self.late_appends += o.late_appends;
    }
}

/// A broken invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    pub seed: u64,
    pub step: u64,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {} step {}: {}", self.seed, self.step, self.what)
    }
}

thread_local! {
    static CURRENT: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The seed and step this thread is simulating: for a panic hook, since with
/// `panic = "abort"` (the release profile) a panic cannot be turned into a [`Violation`].
pub fn current_seed_and_step() -> (u64, u64) {
    CURRENT.with(|c| c.get())
}

/// Runs one seed. `trace` (if the config asks for it) receives one line per event.
/// A broken invariant is an `Err`; so is a panic inside the state machines (an assert),
/// where panics unwind (tests).
pub fn run(seed: u64, config: &Config, trace: &mut String) -> Result<Stats, Violation> {
    assert!((3..=5).contains(&config.brokers), "3 to 5 brokers");
    CURRENT.with(|c| c.set((seed, 0)));
    let mut sim = Sim::new(seed, config.clone());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run_all()));
    trace.push_str(&sim.trace);
    let outcome = match result {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(format!("panic: {msg}"))
        }
    };
    outcome
        .map(|()| sim.stats.clone())
        .map_err(|what| Violation {
            seed,
            step: sim.step,
            what,
        })
}

// ---------------------------------------------------------------------------------------
// PRNG
// ---------------------------------------------------------------------------------------

/// splitmix64: tiny, fast, and good enough to drive a simulation; same seed, same run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5151_CE00_D1CE_F00D)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// True with probability `per_mille`/1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

// ---------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rec {
    epoch: LeaderEpoch,
    id: u64,
}

/// A request a follower has in flight (one at a time), with when it was sent.
#[derive(Debug, Clone, Copy)]
enum InFlight {
    Idle,
    Fetch {
        offset: Offset,
        sent_ms: u64,
    },
    Epoch {
        requested: LeaderEpoch,
        sent_ms: u64,
    },
}

/// A follower's log operation whose I/O is under way: a truncation completes at
/// `done_ms`, an append (`done_ms` `None`) at the next fsync.
#[derive(Debug)]
struct SimOp {
    op: LogOp,
    done_ms: Option<u64>,
}

#[derive(Debug)]
struct Replica {
    log: Vec<Rec>,
    /// Role, durable end, epoch cache, high watermark: the broker's state machine.
    state: ReplicaState,
    op: Option<SimOp>,
    /// The persisted high-watermark checkpoint.
    hw_checkpoint: Offset,
    in_flight: InFlight,
    alter_sent_ms: u64,
    /// Offline after its log failed: the leader epoch it led in then, and when it next
    /// tries to reopen.
    offline: Option<(Option<LeaderEpoch>, u64)>,
    /// The epoch of this broker's latest append as leader, and when.
    led: Option<(LeaderEpoch, u64)>,
}

impl Replica {
    fn new(knobs: Knobs) -> Self {
        Replica {
            log: Vec::new(),
            state: Self::state(LeaderEpochCache::new(), 0, 0, knobs),
            op: None,
            hw_checkpoint: 0,
            in_flight: InFlight::Idle,
            alter_sent_ms: 0,
            offline: None,
            led: None,
        }
    }

    fn state(cache: LeaderEpochCache, end: Offset, hw: Offset, knobs: Knobs) -> ReplicaState {
        let mut s = ReplicaState::new(cache, end, hw);
        s.set_unsafe_knobs(knobs.ignore_pending_isr, knobs.skip_truncation);
        s
    }

    fn hw(&self) -> Offset {
        self.state.high_watermark()
    }

    fn len(&self) -> Offset {
        self.log.len() as Offset
    }
}

struct Broker {
    id: BrokerId,
    up: bool,
    incarnation: u64,
    registered: bool,
    /// Local metadata view; `None` after a restart until a version at or after its own
    /// registration arrives.
    view: Option<ClusterState>,
    min_view_version: u64,
    parts: Vec<Replica>,
}

#[derive(Debug, Clone)]
enum Msg {
    Fetch {
        part: usize,
        epoch: LeaderEpoch,
        offset: Offset,
    },
    FetchResp {
        part: usize,
        epoch: LeaderEpoch,
        offset: Offset,
        result: Result<(Vec<Rec>, Offset), String>,
    },
    EpochReq {
        part: usize,
        epoch: LeaderEpoch,
        requested: LeaderEpoch,
    },
    EpochResp {
        part: usize,
        epoch: LeaderEpoch,
        requested: LeaderEpoch,
        result: Result<(LeaderEpoch, Offset), String>,
    },
    Alter {
        part: usize,
        alter: isr::AlterIsr,
    },
}

struct Envelope {
    at_ms: u64,
    seq: u64,
    from: BrokerId,
    to: BrokerId,
    msg: Msg,
}

/// An `acks=all` produce waiting for the high watermark.
struct PendingAck {
    broker: BrokerId,
    incarnation: u64,
    part: usize,
    epoch: LeaderEpoch,
    offset: Offset,
    id: u64,
    deadline_ms: u64,
}

struct Sim {
    cfg: Config,
    rng: Rng,
    now_ms: u64,
    step: u64,
    controller: ClusterState,
    last_heartbeat_ms: BTreeMap<BrokerId, u64>,
    brokers: Vec<Broker>,
    net: Vec<Envelope>,
    net_seq: u64,
    drop_per_mille: u64,
    /// Chance per step that a broker receives the latest metadata (per seed, so some
    /// seeds run on very stale views).
    metadata_per_mille: u64,
    isolated: Option<BrokerId>,
    faults: bool,
    next_payload: u64,
    pending_acks: Vec<PendingAck>,
    /// (partition, offset, payload id) of every acknowledged record.
    acked: Vec<(usize, Offset, u64)>,
    /// Invariant 1: who acted as leader, and who appended client records, in
    /// (partition, epoch).
    leaders: BTreeMap<(usize, LeaderEpoch), BrokerId>,
    writers: BTreeMap<(usize, LeaderEpoch), BrokerId>,
    /// Invariant 2: last seen hw per (broker index, partition).
    last_hw: Vec<Vec<Offset>>,
    /// Invariant 4: the committed sequence per partition, and how far each replica's
    /// prefix has been compared with it.
    committed: Vec<Vec<Rec>>,
    checked_upto: Vec<Vec<Offset>>,
    last_leader_epoch: Vec<LeaderEpoch>,
    stats: Stats,
    trace: String,
}

fn b_ix(id: BrokerId) -> usize {
    (id - 1) as usize
}

impl Sim {
    fn new(seed: u64, cfg: Config) -> Self {
        let n = cfg.brokers;
        let parts = cfg.partitions;
        let mut controller = ClusterState::default();
        controller
            .apply(&Command::Init {
                cluster_id: "sim".into(),
            })
            .expect("init");
        let mut last_heartbeat_ms = BTreeMap::new();
        for id in 1..=n as BrokerId {
            controller
                .apply(&Command::RegisterBroker {
                    id,
                    host: "sim".into(),
                    port: 9092,
                    incarnation: 1,
                })
                .expect("register");
            last_heartbeat_ms.insert(id, 0);
        }
        let assignments = controller.place(0, parts as i32, -1).expect("placement");
        controller
            .apply(&Command::CreateTopic {
                name: TOPIC.into(),
                id: [7; 16],
                configs: BTreeMap::new(),
                assignments,
            })
            .expect("create topic");
        let brokers = (1..=n as BrokerId)
            .map(|id| Broker {
                id,
                up: true,
                incarnation: 1,
                registered: true,
                view: None,
                min_view_version: 0,
                parts: (0..parts).map(|_| Replica::new(cfg.knobs)).collect(),
            })
            .collect();
        let mut sim = Sim {
            rng: Rng::new(seed),
            now_ms: 0,
            step: 0,
            controller,
            last_heartbeat_ms,
            brokers,
            net: Vec::new(),
            net_seq: 0,
            drop_per_mille: 0,
            metadata_per_mille: 0,
            isolated: None,
            faults: true,
            next_payload: 1,
            pending_acks: Vec::new(),
            acked: Vec::new(),
            leaders: BTreeMap::new(),
            writers: BTreeMap::new(),
            last_hw: vec![vec![0; parts]; n],
            committed: vec![Vec::new(); parts],
            checked_upto: vec![vec![0; parts]; n],
            last_leader_epoch: vec![0; parts],
            stats: Stats::default(),
            trace: String::new(),
            cfg,
        };
        // Per-seed weather: message loss 0-8%, metadata delivery from sluggish to prompt.
        sim.drop_per_mille = sim.rng.below(80);
        sim.metadata_per_mille = [30, 120, 250, 600][sim.rng.below(4) as usize];
        for id in 1..=n as BrokerId {
            sim.deliver_metadata(id);
        }
        sim
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.cfg.trace {
            let l = line();
            let _ = writeln!(self.trace, "[{:>6} {:>7}ms] {l}", self.step, self.now_ms);
        }
    }

    fn run_all(&mut self) -> Result<(), String> {
        while self.step < self.cfg.steps {
            self.one_step()?;
        }
        self.heal();
        let budget = self.step + 40_000;
        while !self.converged() {
            if self.step >= budget {
                return Err(format!(
                    "did not converge after healing: {}",
                    self.describe()
                ));
            }
            self.one_step()?;
        }
        self.final_check()
    }

    fn one_step(&mut self) -> Result<(), String> {
        self.step += 1;
        self.stats.steps += 1;
        let step = self.step;
        CURRENT.with(|c| c.set((c.get().0, step)));
        self.now_ms += 1 + self.rng.below(8);
        self.deliver_network();
        for id in 1..=self.cfg.brokers as BrokerId {
            self.broker_step(id);
        }
        if self.faults && self.rng.chance(500) {
            self.client_produce();
        }
        self.controller_step();
        if self.faults {
            self.inject_faults();
        }
        self.resolve_acks()?;
        self.check_invariants()
    }

    // --- network --------------------------------------------------------------------

    fn send(&mut self, from: BrokerId, to: BrokerId, msg: Msg) {
        if self.cut(from, to) || self.rng.chance(self.drop_per_mille) {
            return;
        }
        let delay = if self.rng.chance(50) {
            50 + self.rng.below(150)
        } else {
            1 + self.rng.below(25)
        };
        self.net_seq += 1;
        self.net.push(Envelope {
            at_ms: self.now_ms + delay,
            seq: self.net_seq,
            from,
            to,
            msg,
        });
    }

    fn cut(&self, a: BrokerId, b: BrokerId) -> bool {
        self.isolated.is_some_and(|i| i == a || i == b)
    }

    fn deliver_network(&mut self) {
        let now = self.now_ms;
        let mut due: Vec<Envelope> = Vec::new();
        let mut i = 0;
        while i < self.net.len() {
            if self.net[i].at_ms <= now {
                due.push(self.net.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|e| (e.at_ms, e.seq));
        // The ISR changes one broker's requests bring at the same moment reach the
        // controller as one batch (as a shard sends them), in arrival order.
        let mut alters: Vec<(BrokerId, Vec<IsrChange>)> = Vec::new();
        for e in due {
            if self.cut(e.from, e.to) {
                continue;
            }
            if e.to == CONTROLLER {
                let Msg::Alter { part, alter } = e.msg else {
                    unreachable!("only AlterPartition goes to the controller")
                };
                let change = IsrChange {
                    topic: TOPIC.into(),
                    partition: part as i32,
                    leader_epoch: alter.leader_epoch,
                    partition_epoch: alter.partition_epoch,
                    new_isr: alter.new_isr,
                };
                match alters.iter_mut().find(|(from, _)| *from == e.from) {
                    Some((_, changes)) => changes.push(change),
                    None => alters.push((e.from, vec![change])),
                }
            } else if self.brokers[b_ix(e.to)].up {
                self.broker_receive(e.to, e.from, e.msg);
            }
        }
        for (from, changes) in alters {
            self.controller_receive(from, changes);
        }
    }

    // --- metadata and roles ---------------------------------------------------------

    fn deliver_metadata(&mut self, id: BrokerId) {
        let b = &mut self.brokers[b_ix(id)];
        if !b.up || !b.registered || self.controller.version < b.min_view_version {
            return;
        }
        if b.view
            .as_ref()
            .is_some_and(|v| v.version >= self.controller.version)
        {
            return;
        }
        b.view = Some(self.controller.clone());
        for part in 0..self.cfg.partitions {
            self.apply_view(id, part);
        }
    }

    /// Makes the replica's role match the broker's view of the partition.
    fn apply_view(&mut self, id: BrokerId, part: usize) {
        let now = self.now_ms;
        let lag = self.cfg.replica_lag_time_max_ms;
        let b = &mut self.brokers[b_ix(id)];
        let Some(ps) = b
            .view
            .as_ref()
            .and_then(|v| v.partition(TOPIC, part as i32))
            .cloned()
        else {
            return;
        };
        let r = &mut b.parts[part];
        if r.offline.is_some() {
            return;
        }
        if ps.leader == id && r.state.leader_epoch() != Some(ps.leader_epoch) {
            let first = *self.leaders.entry((part, ps.leader_epoch)).or_insert(id);
            assert_eq!(
                first, id,
                "p{part}: two leaders in epoch {}",
                ps.leader_epoch
            );
        }
        let before = r.state.leader_epoch();
        let out = r.state.reconcile(id, &ps, r.log.len() as Offset, now, lag);
        let (after, pending) = (r.state.leader_epoch(), r.state.pending_leader_epoch());
        if !out.changed {
            return;
        }
        if before != after || pending.is_some() || out.follow.is_some_and(|(_, joined)| joined) {
            r.in_flight = InFlight::Idle;
        }
        let line = match (after, pending, out.follow) {
            (Some(e), _, _) if before != after => {
                format!("b{id} p{part}: leader epoch {e} isr {:?}", ps.isr)
            }
            (_, Some(e), _) => {
                format!("b{id} p{part}: leader epoch {e} once its log operation ends")
            }
            (_, _, Some((l, true))) => {
                format!("b{id} p{part}: follow b{l} epoch {}", ps.leader_epoch)
            }
            (None, None, None) => format!("b{id} p{part}: no role"),
            _ => return,
        };
        self.log(|| line);
    }

    // --- brokers ----------------------------------------------------------------------

    fn broker_step(&mut self, id: BrokerId) {
        let ix = b_ix(id);
        if !self.brokers[ix].up {
            return;
        }
        if !self.cut(id, CONTROLLER) {
            if !self.brokers[ix].registered {
                self.register(id);
            } else {
                self.heartbeat(id);
                if self.rng.chance(self.metadata_per_mille) {
                    self.deliver_metadata(id);
                }
            }
        }
        for part in 0..self.cfg.partitions {
            self.maybe_reopen(id, part);
            self.complete_truncation(id, part);
            if self.rng.chance(300) {
                self.fsync(id, part);
            }
            if self.rng.chance(20) {
                let r = &mut self.brokers[ix].parts[part];
                r.hw_checkpoint = r.hw();
            }
            self.replica_step(id, part);
        }
    }

    fn fsync(&mut self, id: BrokerId, part: usize) {
        let now = self.now_ms;
        let r = &mut self.brokers[b_ix(id)].parts[part];
        let end = r.len();
        let ended = match r.op.take() {
            // A follower's append or tail sync completes with its fsync.
            Some(SimOp { op, done_ms: None }) => Some(
                r.state
                    .end_op(op, Some(end), end, now)
                    .expect("the append in flight"),
            ),
            // A truncation under way: nothing to sync yet.
            Some(op) => {
                r.op = Some(op);
                None
            }
            // A follower syncs only within its log operations, as the broker's do (see
            // `begin_tail_sync` in `replica_step`).
            None => {
                if let Some(epoch) = r.state.leader_epoch() {
                    let _ = r.state.leader_flushed(epoch, end, end);
                }
                None
            }
        };
        if let Some(e) = ended.and_then(|e| e.leading) {
            self.log(|| format!("b{id} p{part}: leader epoch {e} after its append"));
        }
    }

    /// A follower's truncation whose I/O is done: the log is cut, the operation ends.
    fn complete_truncation(&mut self, id: BrokerId, part: usize) {
        let now = self.now_ms;
        let r = &mut self.brokers[b_ix(id)].parts[part];
        match &r.op {
            Some(SimOp {
                done_ms: Some(at), ..
            }) if *at <= now => {}
            _ => return,
        }
        let SimOp { op, .. } = r.op.take().expect("checked");
        let LogOpKind::Truncate { to } = op.kind else {
            unreachable!("only truncations complete by time: {op:?}")
        };
        let cut = r.log.len().saturating_sub(to as usize) as u64;
        r.log.truncate(to as usize);
        let ended = r
            .state
            .end_op(op, Some(to), r.len(), now)
            .expect("the truncation in flight");
        self.stats.truncated_records += cut;
        self.log(|| format!("b{id} p{part}: truncated to {to} ({cut} cut)"));
        if let Some(e) = ended.leading {
            self.log(|| format!("b{id} p{part}: leader epoch {e} after its truncation"));
        }
    }

    fn replica_step(&mut self, id: BrokerId, part: usize) {
        let now = self.now_ms;
        let tick = self.rng.chance(200);
        let fetch_unsynced = self.cfg.knobs.fetch_unsynced;
        let no_tail_sync = self.cfg.knobs.no_tail_sync;
        let mut tail_sync = false;
        let r = &mut self.brokers[b_ix(id)].parts[part];
        let durable = r.state.durable();
        let epoch_request = r.state.epoch_request();
        let out = match r.state.role() {
            Role::Offline => None,
            Role::Leader(_) => {
                let l = r.state.leader_mut().expect("leading");
                let mut alter = if tick { l.tick(now) } else { None };
                // AlterPartition may be lost: resend the pending one until metadata
                // answers it.
                if alter.is_none() && now.saturating_sub(r.alter_sent_ms) > 150 {
                    alter = l.pending_alter().cloned();
                }
                alter.map(|alter| {
                    r.alter_sent_ms = now;
                    (CONTROLLER, Msg::Alter { part, alter })
                })
            }
            Role::Follower(f) => {
                let busy = match r.in_flight {
                    InFlight::Idle => false,
                    InFlight::Fetch { sent_ms, .. } | InFlight::Epoch { sent_ms, .. } => {
                        now.saturating_sub(sent_ms) <= 300
                    }
                };
                let epoch = f.leader_epoch();
                let leader = f.leader();
                match f.phase() {
                    // One request, and no log operation, at a time.
                    _ if busy || r.op.is_some() => None,
                    FollowerPhase::Truncating => {
                        let (_, requested) = epoch_request.expect("truncating");
                        r.in_flight = InFlight::Epoch {
                            requested,
                            sent_ms: now,
                        };
                        let msg = Msg::EpochReq {
                            part,
                            epoch,
                            requested,
                        };
                        Some((leader, msg))
                    }
                    // Fetch only once what was fetched is durable: the fetch offset tells
                    // the leader what this replica holds on disk.
                    // A tail past the durable end (an append the role change cut
                    // short, a deposed leader's last appends) is synced first.
                    FollowerPhase::Fetching if durable != r.len() && !fetch_unsynced => {
                        if !no_tail_sync {
                            let len = r.len();
                            match r.state.begin_tail_sync(epoch, len) {
                                Ok(Some(op)) => {
                                    r.op = Some(SimOp { op, done_ms: None });
                                    tail_sync = true;
                                }
                                Ok(None) => {}
                                // Not the tail the truncation kept: check it again,
                                // as the broker's fetcher does.
                                Err(ReplicaError::LogMoved { .. }) => {
                                    r.state.restart_truncation(epoch);
                                }
                                Err(e) => unreachable!("a fetching follower, idle: {e}"),
                            }
                        }
                        None
                    }
                    FollowerPhase::Fetching => {
                        let offset = r.log.len() as Offset;
                        r.in_flight = InFlight::Fetch {
                            offset,
                            sent_ms: now,
                        };
                        Some((
                            leader,
                            Msg::Fetch {
                                part,
                                epoch,
                                offset,
                            },
                        ))
                    }
                }
            }
        };
        self.stats.tail_syncs += u64::from(tail_sync);
        if let Some((to, msg)) = out {
            self.send(id, to, msg);
        }
    }

    fn broker_receive(&mut self, to: BrokerId, from: BrokerId, msg: Msg) {
        match msg {
            Msg::Fetch {
                part,
                epoch,
                offset,
            } => self.leader_fetch(to, from, part, epoch, offset),
            Msg::EpochReq {
                part,
                epoch,
                requested,
            } => {
                let r = &self.brokers[b_ix(to)].parts[part];
                let result = r
                    .state
                    .epoch_end(epoch, requested, r.len())
                    .map_err(|e| e.to_string());
                let resp = Msg::EpochResp {
                    part,
                    epoch,
                    requested,
                    result,
                };
                self.send(to, from, resp);
            }
            Msg::FetchResp {
                part,
                epoch,
                offset,
                result,
            } => self.follower_fetched(to, part, epoch, offset, result),
            Msg::EpochResp {
                part,
                epoch,
                requested,
                result,
            } => self.follower_truncate(to, part, epoch, requested, result),
            Msg::Alter { .. } => unreachable!("AlterPartition goes to the controller"),
        }
    }

    fn leader_fetch(
        &mut self,
        to: BrokerId,
        from: BrokerId,
        part: usize,
        epoch: LeaderEpoch,
        offset: Offset,
    ) {
        let now = self.now_ms;
        let r = &mut self.brokers[b_ix(to)].parts[part];
        let mut alter = None;
        let log_len = r.log.len() as Offset;
        let result = match r.state.leader_mut() {
            Some(_) if offset > log_len => Err("offset out of range".to_string()),
            Some(l) => match l.on_follower_fetch(from, epoch, offset, now) {
                Ok(ok) => {
                    alter = ok.alter_isr;
                    let start = offset as usize;
                    let end = r.log.len().min(start + 16);
                    Ok((r.log[start..end].to_vec(), ok.high_watermark))
                }
                Err(e) => Err(e.to_string()),
            },
            None => Err("not leader".to_string()),
        };
        if let Some(alter) = alter {
            r.alter_sent_ms = now;
            self.send(to, CONTROLLER, Msg::Alter { part, alter });
        }
        let resp = Msg::FetchResp {
            part,
            epoch,
            offset,
            result,
        };
        self.send(to, from, resp);
    }

    fn follower_fetched(
        &mut self,
        id: BrokerId,
        part: usize,
        epoch: LeaderEpoch,
        offset: Offset,
        result: Result<(Vec<Rec>, Offset), String>,
    ) {
        let knobs = self.cfg.knobs;
        let now = self.now_ms;
        let r = &mut self.brokers[b_ix(id)].parts[part];
        let expected = matches!(r.in_flight, InFlight::Fetch { offset: o, .. } if o == offset);
        if !r.state.follows_in(epoch) || !expected || r.len() != offset {
            return;
        }
        r.in_flight = InFlight::Idle;
        match result {
            Ok((recs, leader_hw)) => {
                if !recs.is_empty() {
                    // Refused while another log operation runs (not while fetching).
                    let Ok(op) = r.state.begin_append(epoch, offset, r.len()) else {
                        return;
                    };
                    for rec in recs {
                        r.state
                            .fetched_batch(&op, rec.epoch, r.log.len() as Offset)
                            .expect("the append in flight");
                        r.log.push(rec);
                    }
                    if knobs.fetch_unsynced {
                        // The broken knob: done before any fsync (the fetch offset,
                        // the log end, runs ahead of the durable end).
                        let end = r.len();
                        r.state
                            .end_op(op, None, end, now)
                            .expect("the append in flight");
                    } else {
                        r.op = Some(SimOp { op, done_ms: None });
                    }
                }
                let _ = r.state.fetched_high_watermark(epoch, leader_hw);
            }
            Err(e) if e.contains("out of range") && !knobs.skip_truncation => {
                r.state.restart_truncation(epoch);
            }
            Err(_) => {}
        }
    }

    fn follower_truncate(
        &mut self,
        id: BrokerId,
        part: usize,
        epoch: LeaderEpoch,
        requested: LeaderEpoch,
        result: Result<(LeaderEpoch, Offset), String>,
    ) {
        let now = self.now_ms;
        // The truncation's I/O: usually a few milliseconds, sometimes long enough for
        // metadata to arrive meanwhile, sometimes done at once.
        let delay = match self.rng.below(10) {
            0 => 0,
            1 => 50 + self.rng.below(200),
            _ => 1 + self.rng.below(20),
        };
        let r = &mut self.brokers[b_ix(id)].parts[part];
        let expected =
            matches!(r.in_flight, InFlight::Epoch { requested: q, .. } if q == requested);
        let truncating = r
            .state
            .follower()
            .is_some_and(|f| f.leader_epoch() == epoch && f.phase() == FollowerPhase::Truncating);
        if !truncating || !expected {
            return;
        }
        r.in_flight = InFlight::Idle;
        let Ok((resp_epoch, resp_end)) = result else {
            return;
        };
        let begun = r
            .state
            .begin_truncation(epoch, r.len(), resp_epoch, resp_end)
            .expect("a truncating follower with no log operation");
        let complete = r
            .state
            .follower()
            .is_some_and(|f| f.phase() == FollowerPhase::Fetching);
        self.stats.truncation_extra_rounds += u64::from(!complete);
        let to = match begun {
            Some(op) => {
                let LogOpKind::Truncate { to } = op.kind else {
                    unreachable!("a truncation began {op:?}")
                };
                r.op = Some(SimOp {
                    op,
                    done_ms: Some(now + delay),
                });
                to
            }
            None => r.len(),
        };
        self.log(|| {
            format!(
                "b{id} p{part}: epoch answer ({resp_epoch}, {resp_end}) -> truncate to {to} (complete {complete}, in {delay}ms)"
            )
        });
        if delay == 0 {
            self.complete_truncation(id, part);
        }
    }

    // --- clients ----------------------------------------------------------------------

    fn client_produce(&mut self) {
        let part = self.rng.below(self.cfg.partitions as u64) as usize;
        let target = if self.rng.chance(700) {
            let l = self
                .controller
                .partition(TOPIC, part as i32)
                .map_or(NO_BROKER, |p| p.leader);
            if l == NO_BROKER {
                return;
            }
            l
        } else {
            1 + self.rng.below(self.cfg.brokers as u64) as BrokerId
        };
        let b = &mut self.brokers[b_ix(target)];
        if !b.up {
            return;
        }
        let incarnation = b.incarnation;
        let now = self.now_ms;
        let r = &mut b.parts[part];
        let Some(l) = r.state.leader() else {
            // The broken variant `unfenced_leader_appends`: a produce that passed the
            // epoch check while this broker led, appended after its demotion (the
            // broker's produce path awaits between the two; the leader fence refuses
            // it where offsets are taken); never acknowledged. Not during a log
            // operation: the broker's follower operations notice the log moving under
            // them, the simulated ones do not.
            let late = match r.led {
                Some((epoch, at)) if now.saturating_sub(at) <= 2_000 => Some(epoch),
                _ => None,
            };
            let unfenced = self.cfg.knobs.unfenced_leader_appends;
            if let (Some(epoch), true) = (late, r.op.is_none() && r.state.follower().is_some()) {
                if unfenced && self.rng.chance(100) {
                    let id = self.next_payload;
                    self.next_payload += 1;
                    let offset = r.len();
                    r.log.push(Rec { epoch, id });
                    self.stats.late_appends += 1;
                    self.log(|| {
                        format!("b{target} p{part}: late append #{id} at {offset} epoch {epoch}")
                    });
                }
            }
            return;
        };
        if l.check_min_isr(self.cfg.min_insync).is_err() {
            self.stats.refused += 1;
            return;
        }
        let epoch = l.leader_epoch();
        let id = self.next_payload;
        self.next_payload += 1;
        let offset = r.len();
        r.log.push(Rec { epoch, id });
        r.led = Some((epoch, now));
        self.stats.produced += 1;
        if let Some(&w) = self.writers.get(&(part, epoch)) {
            if w != target {
                panic!("two writers in p{part} epoch {epoch}: b{w} and b{target}");
            }
        }
        self.writers.insert((part, epoch), target);
        self.pending_acks.push(PendingAck {
            broker: target,
            incarnation,
            part,
            epoch,
            offset,
            id,
            deadline_ms: self.now_ms + 3_000,
        });
        self.log(|| format!("b{target} p{part}: append #{id} at {offset} epoch {epoch}"));
    }

    fn resolve_acks(&mut self) -> Result<(), String> {
        let mut i = 0;
        while i < self.pending_acks.len() {
            let a = &self.pending_acks[i];
            let b = &self.brokers[b_ix(a.broker)];
            let state = match b.parts[a.part].state.leader() {
                Some(l)
                    if b.up && b.incarnation == a.incarnation && l.leader_epoch() == a.epoch =>
                {
                    l.acked(a.offset + 1, self.cfg.min_insync)
                }
                _ => isr::AckState::NotEnoughReplicasAfterAppend,
            };
            let expired = self.now_ms > a.deadline_ms;
            match state {
                isr::AckState::Pending if !expired => i += 1,
                isr::AckState::Acked => {
                    let a = self.pending_acks.swap_remove(i);
                    self.acked.push((a.part, a.offset, a.id));
                    self.stats.acked += 1;
                    self.log(|| format!("p{}: acked #{} at {}", a.part, a.id, a.offset));
                }
                _ => {
                    self.pending_acks.swap_remove(i);
                }
            }
        }
        Ok(())
    }

    // --- controller -------------------------------------------------------------------

    fn apply(&mut self, cmd: Command) -> bool {
        let ok = self.controller.apply(&cmd);
        let line = format!("controller: {cmd:?} -> {ok:?}");
        self.log(|| line);
        ok.is_ok()
    }

    fn register(&mut self, id: BrokerId) {
        let incarnation = self.brokers[b_ix(id)].incarnation;
        self.apply(Command::RegisterBroker {
            id,
            host: "sim".into(),
            port: 9092,
            incarnation,
        });
        self.last_heartbeat_ms.insert(id, self.now_ms);
        let b = &mut self.brokers[b_ix(id)];
        b.registered = true;
        b.min_view_version = self.controller.version;
    }

    fn heartbeat(&mut self, id: BrokerId) {
        self.last_heartbeat_ms.insert(id, self.now_ms);
        let fenced = self.controller.brokers.get(&id).is_some_and(|b| b.fenced);
        if fenced {
            self.apply(Command::UnfenceBroker { id });
        }
    }

    /// One broker's ISR changes: a single one as AlterPartition, several as one
    /// AlterPartitions batch (each judged on its own), so the sim runs both paths.
    fn controller_receive(&mut self, from: BrokerId, mut changes: Vec<IsrChange>) {
        if changes.len() == 1 {
            let c = changes.pop().expect("one change");
            let ok = self.apply(Command::AlterPartition {
                from,
                topic: c.topic,
                partition: c.partition,
                leader_epoch: c.leader_epoch,
                partition_epoch: c.partition_epoch,
                new_isr: c.new_isr,
            });
            if ok {
                self.stats.isr_changes += 1;
            }
            return;
        }
        let cmd = Command::AlterPartitions { from, changes };
        let res = self.controller.apply(&cmd);
        let line = format!("controller: {cmd:?} -> {res:?}");
        self.log(|| line);
        self.stats.alter_batches += 1;
        if let Ok(Applied::Partitions(results)) = res {
            self.stats.isr_changes += results.iter().filter(|r| r.is_ok()).count() as u64;
        }
    }

    fn controller_step(&mut self) {
        let now = self.now_ms;
        let lapsed: Vec<BrokerId> = self
            .controller
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .filter(|b| {
                now.saturating_sub(self.last_heartbeat_ms[&b.id]) > self.cfg.session_timeout_ms
            })
            .map(|b| b.id)
            .collect();
        for id in lapsed {
            self.stats.fenced += 1;
            self.apply(Command::FenceBroker { id });
        }
        if self.rng.chance(10) {
            for (topic, partition) in self.controller.preferred_elections() {
                self.apply(Command::ElectPreferred { topic, partition });
            }
        }
        for part in 0..self.cfg.partitions {
            let e = self
                .controller
                .partition(TOPIC, part as i32)
                .map_or(0, |p| p.leader_epoch);
            if e != self.last_leader_epoch[part] {
                self.stats.leader_changes += 1;
                self.last_leader_epoch[part] = e;
            }
        }
    }

    // --- faults -----------------------------------------------------------------------

    fn inject_faults(&mut self) {
        let n = self.cfg.brokers as u64;
        let down = self.brokers.iter().filter(|b| !b.up).count() as u64;
        if down + 1 < n && self.rng.chance(4) {
            let id = 1 + self.rng.below(n) as BrokerId;
            if self.brokers[b_ix(id)].up {
                self.crash(id);
            }
        }
        if self.rng.chance(3) {
            let id = 1 + self.rng.below(n) as BrokerId;
            let part = self.rng.below(self.cfg.partitions as u64) as usize;
            let b = &self.brokers[b_ix(id)];
            if b.up && b.parts[part].offline.is_none() {
                self.fail_log(id, part);
            }
        }
        let downs: Vec<BrokerId> = self
            .brokers
            .iter()
            .filter(|b| !b.up)
            .map(|b| b.id)
            .collect();
        for id in downs {
            if self.rng.chance(15) {
                self.restart(id);
            }
        }
        match self.isolated {
            None if self.rng.chance(3) => {
                let id = 1 + self.rng.below(n) as BrokerId;
                self.isolated = Some(id);
                self.stats.isolations += 1;
                self.log(|| format!("isolate b{id}"));
            }
            Some(id) if self.rng.chance(4) => {
                self.isolated = None;
                self.log(|| format!("heal b{id}"));
            }
            _ => {}
        }
    }

    fn crash(&mut self, id: BrokerId) {
        self.stats.crashes += 1;
        let ix = b_ix(id);
        let b = &mut self.brokers[ix];
        b.up = false;
        b.view = None;
        b.registered = false;
        for part in 0..self.cfg.partitions {
            self.lose_unsynced(ix, part, None);
        }
        self.log(|| format!("crash b{id}"));
    }

    /// What a replica keeps when its log is reopened by recovery (after a crash, or after
    /// its log failed): the durable prefix, an epoch cache rebuilt from it (Kafka
    /// truncates its cache to the recovered log end), the high-watermark checkpoint; a
    /// log operation under way dies. `offline`: the replica's offline state after it.
    fn lose_unsynced(
        &mut self,
        ix: usize,
        part: usize,
        offline: Option<(Option<LeaderEpoch>, u64)>,
    ) {
        let knobs = self.cfg.knobs;
        let r = &mut self.brokers[ix].parts[part];
        r.log.truncate(r.state.durable() as usize);
        let mut cache = LeaderEpochCache::new();
        for (o, rec) in r.log.iter().enumerate() {
            cache.assign(rec.epoch, o as Offset);
        }
        r.state = Replica::state(cache, r.len(), r.hw_checkpoint, knobs);
        r.op = None;
        r.in_flight = InFlight::Idle;
        r.offline = offline;
        // Its produce requests died with the log (or the process).
        r.led = None;
        let hw = r.hw();
        self.last_hw[ix][part] = hw;
        self.checked_upto[ix][part] = self.checked_upto[ix][part].min(hw);
    }

    /// A partition's log fails in a running broker (an I/O error): its unsynced tail is
    /// lost as in a crash, but the process and its registration live on. The broker
    /// asks the controller to move the replica away (`Command::ReplicaOffline`; lost if
    /// the controller is cut off) and reopens the log later.
    fn fail_log(&mut self, id: BrokerId, part: usize) {
        self.stats.log_failures += 1;
        let ix = b_ix(id);
        let delay = 20 + self.rng.below(300);
        let led_in = self.brokers[ix].parts[part].state.leader_epoch();
        self.lose_unsynced(ix, part, Some((led_in, self.now_ms + delay)));
        // Produce requests waiting on the failed log are answered with an error.
        self.pending_acks
            .retain(|a| !(a.broker == id && a.part == part));
        self.log(|| format!("b{id} p{part}: log failed (led in {led_in:?})"));
        self.propose_offline(id, part);
    }

    fn propose_offline(&mut self, id: BrokerId, part: usize) {
        if !self.cut(id, CONTROLLER) {
            self.apply(Command::ReplicaOffline {
                broker: id,
                topic: TOPIC.into(),
                partition: part as i32,
            });
        }
    }

    /// Reopens a failed log when due, unless the broker's view still names it leader in
    /// the epoch it led in when the log failed (or an older one): then it asks the
    /// controller again and waits, as the broker's `reopen` does.
    fn maybe_reopen(&mut self, id: BrokerId, part: usize) {
        let now = self.now_ms;
        let skip_wait = self.cfg.knobs.reopen_in_same_epoch;
        let b = &self.brokers[b_ix(id)];
        let Some((led_in, at)) = b.parts[part].offline else {
            return;
        };
        if now < at {
            return;
        }
        let same = led_in.is_some_and(|e| {
            b.view
                .as_ref()
                .and_then(|v| v.partition(TOPIC, part as i32))
                .is_none_or(|ps| ps.leader == id && ps.leader_epoch <= e)
        });
        if same && !skip_wait {
            self.brokers[b_ix(id)].parts[part].offline = Some((led_in, now + 100));
            self.propose_offline(id, part);
            return;
        }
        self.brokers[b_ix(id)].parts[part].offline = None;
        self.log(|| format!("b{id} p{part}: log reopened"));
        self.apply_view(id, part);
    }

    fn restart(&mut self, id: BrokerId) {
        let b = &mut self.brokers[b_ix(id)];
        b.up = true;
        b.incarnation += 1;
        b.registered = false;
        self.log(|| format!("restart b{id}"));
    }

    fn heal(&mut self) {
        self.faults = false;
        self.isolated = None;
        self.drop_per_mille = 0;
        let downs: Vec<BrokerId> = self
            .brokers
            .iter()
            .filter(|b| !b.up)
            .map(|b| b.id)
            .collect();
        for id in downs {
            self.restart(id);
        }
        self.log(|| "heal everything".into());
    }

    // --- invariants ---------------------------------------------------------------------

    fn check_invariants(&mut self) -> Result<(), String> {
        let n = self.cfg.brokers;
        for part in 0..self.cfg.partitions {
            for ix in 0..n {
                let r = &self.brokers[ix].parts[part];
                let hw = r.hw();
                let id = ix + 1;
                if hw > r.len() {
                    return Err(format!("b{id} p{part}: hw {hw} past log end {}", r.len()));
                }
                if hw < self.last_hw[ix][part] {
                    return Err(format!(
                        "b{id} p{part}: hw went back from {} to {hw}",
                        self.last_hw[ix][part]
                    ));
                }
                self.last_hw[ix][part] = hw;
                // 4: prefix consistency below the hw.
                let from = self.checked_upto[ix][part].min(hw) as usize;
                let committed = &mut self.committed[part];
                for o in from..hw as usize {
                    let rec = r.log[o];
                    if o < committed.len() {
                        if committed[o] != rec {
                            return Err(format!(
                                "b{id} p{part}: offset {o} below hw {hw} is {rec:?}, committed is {:?}",
                                committed[o]
                            ));
                        }
                    } else {
                        committed.push(rec);
                    }
                }
                self.checked_upto[ix][part] = hw;
            }
        }
        // 3: every acked record is on every member of the current ISR.
        for &(part, offset, id) in &self.acked {
            let ps = self
                .controller
                .partition(TOPIC, part as i32)
                .expect("partition");
            for &m in &ps.isr {
                let r = &self.brokers[b_ix(m)].parts[part];
                let got = r.log.get(offset as usize).map(|rec| rec.id);
                if got != Some(id) {
                    return Err(format!(
                        "acked #{id} at p{part}@{offset} missing on ISR member b{m} (found {got:?}; isr {:?})",
                        ps.isr
                    ));
                }
            }
        }
        Ok(())
    }

    fn converged(&self) -> bool {
        (0..self.cfg.partitions).all(|part| {
            let Some(ps) = self.controller.partition(TOPIC, part as i32) else {
                return false;
            };
            if ps.leader == NO_BROKER || ps.isr.len() != ps.replicas.len() {
                return false;
            }
            let lr = &self.brokers[b_ix(ps.leader)].parts[part];
            let Some(l) = lr.state.leader() else {
                return false;
            };
            l.high_watermark() == lr.len()
                && l.pending_alter().is_none()
                && ps.replicas.iter().all(|&m| {
                    let b = &self.brokers[b_ix(m)];
                    b.view
                        .as_ref()
                        .is_some_and(|v| v.version == self.controller.version)
                        && b.parts[part].log == lr.log
                })
        }) && self.pending_acks.is_empty()
    }

    fn final_check(&self) -> Result<(), String> {
        for &(part, offset, id) in &self.acked {
            let ps = self
                .controller
                .partition(TOPIC, part as i32)
                .expect("partition");
            let log = &self.brokers[b_ix(ps.leader)].parts[part].log;
            if log.get(offset as usize).map(|r| r.id) != Some(id) {
                return Err(format!("acked #{id} at p{part}@{offset} lost at the end"));
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let mut s = String::new();
        for part in 0..self.cfg.partitions {
            let ps = self.controller.partition(TOPIC, part as i32);
            let _ = write!(s, "p{part} {ps:?}; ");
            for b in &self.brokers {
                let r = &b.parts[part];
                let role = match r.state.role() {
                    Role::Offline => "none".to_string(),
                    Role::Leader(l) => l.to_string(),
                    Role::Follower(f) => {
                        format!(
                            "follower of b{} e{} {:?}",
                            f.leader(),
                            f.leader_epoch(),
                            f.phase()
                        )
                    }
                };
                let _ = write!(
                    s,
                    "b{} up {} len {} durable {} hw {} {role}; ",
                    b.id,
                    b.up,
                    r.len(),
                    r.state.durable(),
                    r.hw()
                );
            }
        }
        s
    }
}
