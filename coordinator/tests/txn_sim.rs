//! Simulation tier for the transaction coordinator: the real [`TxnCoordinator`] with
//! transactional clients, a durable `__transaction_state` log, and a model of data
//! partitions (records with producer id and epoch, control markers, per-producer
//! epoch/sequence/coordinator-epoch checks, KIP-890 part 1 verification, and the last
//! stable offset). Faults: coordinator crashes (it reloads from its durable records
//! only, at a higher coordinator epoch), appends that fail, appends that time out yet
//! became durable, markers lost, duplicated or applied with their answer lost, produce
//! requests delayed past the client's timeout or dropped, clients that crash (zombies)
//! or stall until their transaction times out, and clients that never come back.
//!
//! Checked after every step: a transaction's records on a partition are one segment
//! of one transaction; no transaction is committed on one partition and aborted on
//! another; an EndTxn the client saw succeed decides the transaction that way; a new
//! producer epoch never meets an open transaction of an older one; the LSO (first offset
//! of the earliest open transaction, else the log end) matches a scan of the log, never
//! goes back, and what a read_committed reader sees only grows; every open transaction
//! on a data partition is recorded durably by the coordinator (Ongoing or Prepare* with
//! that partition, same producer id), so a reloaded coordinator always ends it. At the
//! Transactions also commit a consumer group's offset (AddOffsetsToTxn, TxnOffsetCommit
//! written as a transactional record on a modelled `__consumer_offsets` partition, whose
//! markers complete it in the group coordinator, which crashes too and reloads from that
//! partition's log): the group's visible offsets and its require_stable answers must be
//! exactly what the partition's log says. At the
//! end, faults stop and every open transaction must end within a bounded number of steps:
//! each partition's LSO reaches its log end, each committed transaction is visible in
//! full and each aborted one not at all.
//!
//! `SLUICE_TXN_SIM_SEEDS=N` runs N seeds (default 150); `SLUICE_TXN_SIM_SEED=S` replays
//! one seed.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use kafka_protocol::error::ResponseError as E;
use sluice_coordinator::group::{Committed, Coordinator, CoordinatorConfig, TxnCommitArgs};
use sluice_coordinator::partition_for;
use sluice_coordinator::records::{Key, OffsetValue};
use sluice_coordinator::txn::*;
use sluice_coordinator::txn_records::{TxnState, TxnValue};

const STATE_PARTITIONS: i32 = 2;
const DATA_PARTITIONS: i32 = 4;
const DATA_TOPIC: &str = "d";
/// The consumer group whose offsets the transactions commit: client `i` commits the
/// offset of partition `i` of topic `in`, its value being the transaction's number.
const GROUP: &str = "g";
const IN_TOPIC: &str = "in";
/// `data[OFFSETS]` models the group's `__consumer_offsets` partition.
const OFFSETS: usize = DATA_PARTITIONS as usize;
const CLIENTS: usize = 4;
const TXN_TIMEOUT_MS: i32 = 3_000;
const REQUEST_TIMEOUT_MS: i64 = 800;
const PRODUCE_TIMEOUT_MS: i64 = 1_000;
const STEPS: usize = 3_000;
/// Once faults stop, everything must settle within this many steps of 50 ms.
const HEAL_STEPS: usize = 2_000;

/// splitmix64: small, seeded, good enough to pick faults.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

// ------------------------------------------------------------ data partitions

/// The group's `__consumer_offsets` partition (offsets.topic.num.partitions = 50).
fn offsets_tp() -> TopicPartition {
    (OFFSETS_TOPIC.to_string(), partition_for(GROUP, 50))
}

fn tp_of(index: usize) -> TopicPartition {
    if index == OFFSETS {
        offsets_tp()
    } else {
        (DATA_TOPIC.to_string(), index as i32)
    }
}

fn index_of(tp: &TopicPartition) -> usize {
    if *tp == offsets_tp() {
        OFFSETS
    } else {
        assert_eq!(tp.0, DATA_TOPIC);
        tp.1 as usize
    }
}

#[derive(Debug, Clone)]
enum Entry {
    /// `record`: the offset-commit record, on the offsets partition.
    Data {
        pid: i64,
        txn: u64,
        record: Option<Record>,
    },
    Marker {
        pid: i64,
        commit: bool,
    },
}

#[derive(Debug)]
struct ProducerState {
    epoch: i16,
    last_seq: i32,
    coordinator_epoch: i32,
    /// First offset of the producer's open transaction.
    open_first: Option<usize>,
}

#[derive(Debug, Default)]
struct DataPartition {
    log: Vec<Entry>,
    producers: BTreeMap<i64, ProducerState>,
    lso_seen: usize,
    visible_seen: Vec<usize>,
}

impl DataPartition {
    fn state(&mut self, pid: i64) -> &mut ProducerState {
        self.producers.entry(pid).or_insert(ProducerState {
            epoch: -1,
            last_seq: -1,
            coordinator_epoch: -1,
            open_first: None,
        })
    }

    /// A transactional write, as the partition's producer state judges it. `verify`
    /// asks the coordinator whether the partition is in the producer's transaction
    /// (KIP-890 part 1), needed only when the write would open a transaction.
    fn append(
        &mut self,
        pid: i64,
        epoch: i16,
        seq: i32,
        txn: u64,
        record: Option<Record>,
        verify: impl FnOnce() -> bool,
    ) -> Result<(), &'static str> {
        let offset = self.log.len();
        let st = self.state(pid);
        if epoch < st.epoch {
            return Err("fenced epoch");
        }
        if epoch > st.epoch {
            assert!(
                st.open_first.is_none(),
                "producer {pid}: epoch {epoch} arrives while a transaction of epoch {} is open",
                st.epoch
            );
            st.epoch = epoch;
            st.last_seq = -1;
        }
        if seq <= st.last_seq {
            return Err("duplicate sequence");
        }
        if st.open_first.is_none() && !verify() {
            return Err("not in the transaction");
        }
        st.last_seq = seq;
        st.open_first.get_or_insert(offset);
        self.log.push(Entry::Data { pid, txn, record });
        Ok(())
    }

    /// A COMMIT/ABORT marker. Returns the transaction it ended, if any.
    fn marker(
        &mut self,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
        commit: bool,
    ) -> Result<Option<u64>, E> {
        let offset = self.log.len();
        let st = self.state(pid);
        if epoch < st.epoch {
            return Err(E::InvalidProducerEpoch);
        }
        if coordinator_epoch < st.coordinator_epoch {
            return Err(E::TransactionCoordinatorFenced);
        }
        if epoch > st.epoch {
            st.last_seq = -1;
        }
        st.epoch = epoch;
        st.coordinator_epoch = coordinator_epoch;
        let first = st.open_first.take();
        self.log.push(Entry::Marker { pid, commit });
        let Some(first) = first else {
            return Ok(None);
        };
        let txns: BTreeSet<u64> = self.log[first..offset]
            .iter()
            .filter_map(|e| match e {
                Entry::Data { pid: p, txn, .. } if *p == pid => Some(*txn),
                _ => None,
            })
            .collect();
        assert_eq!(
            txns.len(),
            1,
            "producer {pid}: one segment holds transactions {txns:?}"
        );
        Ok(txns.into_iter().next())
    }

    /// Kafka's LSO from the producer states.
    fn lso(&self) -> usize {
        self.producers
            .values()
            .filter_map(|s| s.open_first)
            .min()
            .unwrap_or(self.log.len())
    }

    /// Scans the log: the open transactions' first offsets, and the offsets a
    /// read_committed reader sees (committed data below the LSO).
    fn scan(&self) -> (BTreeMap<i64, usize>, Vec<usize>) {
        let mut open: BTreeMap<i64, usize> = BTreeMap::new();
        let mut segment: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        let mut committed = Vec::new();
        for (off, e) in self.log.iter().enumerate() {
            match e {
                Entry::Data { pid, .. } => {
                    open.entry(*pid).or_insert(off);
                    segment.entry(*pid).or_default().push(off);
                }
                Entry::Marker { pid, commit } => {
                    open.remove(pid);
                    let offs = segment.remove(pid).unwrap_or_default();
                    if *commit {
                        committed.extend(offs);
                    }
                }
            }
        }
        let lso = open.values().copied().min().unwrap_or(self.log.len());
        committed.retain(|o| *o < lso);
        committed.sort_unstable();
        (open, committed)
    }

    fn check(&mut self, p: usize) {
        let (open, visible) = self.scan();
        let lso = self.lso();
        let scanned = open.values().copied().min().unwrap_or(self.log.len());
        assert_eq!(
            lso, scanned,
            "partition {p}: LSO from producer state vs log scan"
        );
        for (pid, first) in &open {
            assert_eq!(self.producers[pid].open_first, Some(*first));
            assert!(
                lso <= *first,
                "partition {p}: LSO {lso} passes open transaction at {first}"
            );
        }
        assert!(
            lso >= self.lso_seen,
            "partition {p}: LSO went back from {} to {lso}",
            self.lso_seen
        );
        assert!(
            visible.starts_with(&self.visible_seen),
            "partition {p}: a read_committed reader lost records"
        );
        self.lso_seen = lso;
        self.visible_seen = visible;
    }
}

// ------------------------------------------------------------------ clients

#[derive(Debug, Clone)]
enum Phase {
    NeedInit {
        expected: Option<ProducerIdAndEpoch>,
    },
    Idle,
    Adding {
        parts: Vec<i32>,
    },
    Producing {
        parts: Vec<i32>,
        total: usize,
        sent: usize,
        resolved: usize,
        failed: bool,
        last_sent_ms: i64,
    },
    Stalled {
        until_ms: i64,
    },
    Ending {
        commit: bool,
        bump_after: bool,
    },
    /// The client died for good: only the coordinator's timeout ends its transaction.
    Gone,
    AddingOffsets {
        commit_after: bool,
    },
    CommittingOffsets {
        commit_after: bool,
    },
}

#[derive(Debug)]
struct Client {
    id: String,
    instance: u64,
    pe: Option<ProducerIdAndEpoch>,
    phase: Phase,
    txn: u64,
    /// (token, sent at)
    inflight: Option<(u64, i64)>,
    seq: BTreeMap<i32, i32>,
}

#[derive(Debug, Clone)]
struct ProduceMsg {
    client: usize,
    instance: u64,
    txn: u64,
    pid: i64,
    epoch: i16,
    seq: i32,
    partition: i32,
    deliver_at_ms: i64,
    txn_id: String,
}

#[derive(Debug, Clone)]
struct MarkerMsg {
    incarnation: u64,
    round: RoundId,
    pid: i64,
    epoch: i16,
    coordinator_epoch: i32,
    commit: bool,
    tp: TopicPartition,
}

/// A `__transaction_state` record: key and value (`None`: a tombstone).
type Record = (Vec<u8>, Option<Vec<u8>>);

struct Ids(i64);

impl ProducerIds for Ids {
    fn next_producer_id(&mut self) -> Result<i64, E> {
        self.0 += 1;
        Ok(self.0)
    }
}

// --------------------------------------------------------------- simulation

struct Sim {
    seed: u64,
    rng: Rng,
    now: i64,
    faults: bool,
    healing: bool,
    coord: Option<TxnCoordinator>,
    incarnation: u64,
    coordinator_epochs: Vec<i32>,
    down_until_ms: i64,
    /// The durable `__transaction_state` log, per partition.
    durable: Vec<Vec<Record>>,
    /// The latest durable value per transactional id.
    latest: HashMap<String, Option<TxnValue>>,
    appends: VecDeque<(u64, TxnAppend)>,
    markers: Vec<MarkerMsg>,
    produces: Vec<ProduceMsg>,
    data: Vec<DataPartition>,
    clients: Vec<Client>,
    /// The client waiting on each token number (one number space for every call kind).
    tokens: HashMap<u64, usize>,
    next_token: u64,
    ids: Ids,
    next_txn: u64,
    /// Each transaction's fate, from the first marker that ended one of its segments.
    decided: BTreeMap<u64, bool>,
    /// Each transaction's fate as its client saw it (an EndTxn that succeeded).
    seen_by_client: BTreeMap<u64, bool>,
    pid_owner: HashMap<i64, String>,
    /// The group coordinator of the offsets partition; `None` while down.
    group: Option<Coordinator>,
    group_down_until_ms: i64,
    stats: Stats,
}

#[derive(Debug, Default)]
struct Stats {
    crashes: u32,
    committed: u32,
    aborted: u32,
    fenced_by_coordinator: u32,
    /// Appends that timed out yet became durable.
    log_ahead: u32,
    /// Transactional ids expired (tombstones written).
    expired: u32,
    /// TxnOffsetCommits made durable.
    offset_commits: u32,
    group_crashes: u32,
}

/// Odd seeds write version 1 (flexible) values, even seeds version 0.
fn config(seed: u64) -> TxnConfig {
    TxnConfig {
        value_version: (seed % 2) as i16,
        state_partitions: STATE_PARTITIONS,
        max_timeout_ms: 60_000,
        id_expiration_ms: 10_000,
        abort_check_interval_ms: 500,
        expiry_check_interval_ms: 1_000,
        ..TxnConfig::default()
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let clients = (0..CLIENTS)
            .map(|i| Client {
                id: format!("tx-{i}"),
                instance: 0,
                pe: None,
                phase: Phase::NeedInit { expected: None },
                txn: 0,
                inflight: None,
                seq: BTreeMap::new(),
            })
            .collect();
        let mut s = Sim {
            seed,
            rng: Rng(seed),
            now: 1_000,
            faults: true,
            healing: false,
            coord: None,
            incarnation: 0,
            coordinator_epochs: vec![0; STATE_PARTITIONS as usize],
            down_until_ms: 0,
            durable: vec![Vec::new(); STATE_PARTITIONS as usize],
            latest: HashMap::new(),
            appends: VecDeque::new(),
            markers: Vec::new(),
            produces: Vec::new(),
            data: (0..=DATA_PARTITIONS)
                .map(|_| DataPartition::default())
                .collect(),
            clients,
            tokens: HashMap::new(),
            next_token: 0,
            ids: Ids(10_000),
            next_txn: 0,
            decided: BTreeMap::new(),
            seen_by_client: BTreeMap::new(),
            pid_owner: HashMap::new(),
            group: Some(Coordinator::new(CoordinatorConfig::default())),
            group_down_until_ms: 0,
            stats: Stats::default(),
        };
        s.restart();
        s
    }

    // ------------------------------------------------------------ coordinator

    /// A coordinator starts and loads every `__transaction_state` partition from its
    /// durable records, at a higher coordinator epoch.
    fn restart(&mut self) {
        self.incarnation += 1;
        let mut c = TxnCoordinator::new(config(self.seed));
        let mut fx = TxnEffects::default();
        for p in 0..STATE_PARTITIONS {
            self.coordinator_epochs[p as usize] += 1;
            c.begin_load(p, self.coordinator_epochs[p as usize], &mut fx);
            for (k, v) in &self.durable[p as usize] {
                c.load_record(k, v.as_deref())
                    .expect("our own records load");
            }
        }
        for p in 0..STATE_PARTITIONS {
            c.loaded(p, self.now, &mut fx);
        }
        self.coord = Some(c);
        self.absorb(fx);
    }

    /// The coordinator dies: appends in flight became durable or not, answers in flight
    /// are lost, and the markers it sent may still arrive.
    fn crash(&mut self) {
        self.stats.crashes += 1;
        self.coord = None;
        for (inc, a) in std::mem::take(&mut self.appends) {
            if inc == self.incarnation && self.rng.chance(500) {
                self.make_durable(&a);
            }
        }
        self.tokens.clear();
        self.down_until_ms = self.now + self.rng.below(1_000) as i64;
    }

    fn make_durable(&mut self, a: &TxnAppend) {
        self.stats.expired += u32::from(a.value.is_none());
        self.durable[a.partition as usize].push((a.key.clone(), a.value.clone()));
        let v = a
            .value
            .as_ref()
            .map(|v| TxnValue::decode(v).expect("valid value"));
        self.latest.insert(a.transactional_id.clone(), v);
    }

    fn absorb(&mut self, fx: TxnEffects) {
        for a in fx.appends {
            assert_eq!(
                a.partition,
                partition_for(&a.transactional_id, STATE_PARTITIONS)
            );
            self.appends.push_back((self.incarnation, a));
        }
        for m in fx.markers {
            for tp in m.partitions {
                self.markers.push(MarkerMsg {
                    incarnation: self.incarnation,
                    round: m.round,
                    pid: m.producer_id,
                    epoch: m.producer_epoch,
                    coordinator_epoch: m.coordinator_epoch,
                    commit: m.commit,
                    tp,
                });
            }
        }
        for reply in fx.replies {
            let token = match &reply {
                TxnReply::InitProducerId(InitToken(t), _)
                | TxnReply::AddPartitions(AddPartitionsToken(t), _)
                | TxnReply::AddOffsets(AddOffsetsToken(t), _)
                | TxnReply::EndTxn(EndToken(t), _) => *t,
            };
            if let Some(c) = self.tokens.remove(&token) {
                self.on_reply(c, token, reply);
            }
        }
    }

    fn resolve_append(&mut self) {
        let Some((inc, a)) = self.appends.pop_front() else {
            return;
        };
        assert_eq!(
            inc, self.incarnation,
            "appends of a dead coordinator are dropped"
        );
        let roll = self.rng.below(100);
        let result = if !self.faults || roll < 85 {
            self.make_durable(&a);
            Ok(())
        } else if roll < 93 {
            Err(if roll.is_multiple_of(2) {
                E::NotEnoughReplicas
            } else {
                E::NotLeaderOrFollower
            })
        } else {
            // Timed out, yet replicated: the log is ahead of the coordinator's memory.
            self.stats.log_ahead += 1;
            self.make_durable(&a);
            Err(E::RequestTimedOut)
        };
        let mut fx = TxnEffects::default();
        let now = self.now;
        self.coord
            .as_mut()
            .expect("up")
            .append_done(a.id, result, now, &mut fx);
        self.absorb(fx);
    }

    fn deliver_marker(&mut self) {
        if self.markers.is_empty() {
            return;
        }
        let i = self.rng.below(self.markers.len() as u64) as usize;
        let m = self.markers.swap_remove(i);
        let roll = if self.faults { self.rng.below(100) } else { 99 };
        let result = match roll {
            0..=7 => MarkerResult::Failed(E::RequestTimedOut), // lost on the way
            8..=13 => MarkerResult::Failed(E::NotLeaderOrFollower),
            14..=21 => {
                // Delivered twice; the first answer counts.
                let r = self.apply_marker(&m);
                let _ = self.apply_marker(&m);
                r.map_or_else(MarkerResult::Failed, |()| MarkerResult::Written)
            }
            22..=27 => {
                // Written, but the answer is lost: the coordinator writes it again.
                let _ = self.apply_marker(&m);
                MarkerResult::Failed(E::RequestTimedOut)
            }
            _ => self
                .apply_marker(&m)
                .map_or_else(MarkerResult::Failed, |()| MarkerResult::Written),
        };
        if m.incarnation == self.incarnation {
            if let Some(c) = self.coord.as_mut() {
                let mut fx = TxnEffects::default();
                c.marker_done(m.round, &m.tp, result, self.now, &mut fx);
                self.absorb(fx);
            }
        }
    }

    fn apply_marker(&mut self, m: &MarkerMsg) -> Result<(), E> {
        let index = index_of(&m.tp);
        let part = &mut self.data[index];
        let ended = part.marker(m.pid, m.epoch, m.coordinator_epoch, m.commit)?;
        if let Some(txn) = ended {
            if let Some(prev) = self.decided.insert(txn, m.commit) {
                assert_eq!(
                    prev, m.commit,
                    "transaction {txn} committed on one partition and aborted on another"
                );
            }
            if let Some(seen) = self.seen_by_client.get(&txn) {
                assert_eq!(
                    *seen, m.commit,
                    "transaction {txn} ended against its EndTxn answer"
                );
            }
        }
        part.check(index);
        if index == OFFSETS {
            // The broker that wrote the marker tells the group coordinator (Kafka's
            // `handleTxnCompletion`); a coordinator that is down replays it on load.
            if let Some(g) = self.group.as_mut() {
                g.complete_txn(m.pid, m.commit, |_| true);
            }
            self.check_group();
        }
        Ok(())
    }

    fn deliver_produce(&mut self) {
        let due: Vec<usize> = (0..self.produces.len())
            .filter(|i| self.produces[*i].deliver_at_ms <= self.now)
            .collect();
        if due.is_empty() {
            return;
        }
        let i = due[self.rng.below(due.len() as u64) as usize];
        let m = self.produces.swap_remove(i);
        let tp = (DATA_TOPIC.to_string(), m.partition);
        let coord = self.coord.as_ref();
        let verify = || {
            coord.is_some_and(|c| {
                c.verify_partitions(&m.txn_id, m.pid, m.epoch, std::slice::from_ref(&tp))
                    .is_ok_and(|v| v[0].1.is_ok())
            })
        };
        let part = &mut self.data[m.partition as usize];
        let r = part.append(m.pid, m.epoch, m.seq, m.txn, None, verify);
        part.check(m.partition as usize);
        let c = &mut self.clients[m.client];
        if c.instance != m.instance || c.txn != m.txn {
            return; // a zombie's or an old transaction's write: nobody waits
        }
        if let Phase::Producing {
            resolved, failed, ..
        } = &mut c.phase
        {
            *resolved += 1;
            *failed |= r.is_err();
        }
    }

    // ---------------------------------------------------------- group coordinator

    /// The group coordinator dies; the offsets partition's log stays.
    fn crash_group(&mut self) {
        self.stats.group_crashes += 1;
        self.group = None;
        self.group_down_until_ms = self.now + self.rng.below(1_000) as i64;
    }

    /// A group coordinator loads the offsets partition: offset records of transactional
    /// batches and the markers that end them.
    fn restart_group(&mut self) {
        let mut g = Coordinator::new(CoordinatorConfig::default());
        for e in &self.data[OFFSETS].log {
            match e {
                Entry::Data {
                    pid,
                    record: Some((k, v)),
                    ..
                } => g
                    .load_txn_record(self.now, *pid, k, v.as_deref())
                    .expect("our own records load"),
                Entry::Data { record: None, .. } => unreachable!("offset records only"),
                Entry::Marker { pid, commit } => g.load_marker(*pid, *commit, |_| true),
            }
        }
        self.group = Some(g);
        self.check_group();
    }

    /// The group coordinator answers as its partition's log says: per client, the
    /// visible offset is the committed offset record latest in the log (Kafka's
    /// `olderThan`), and OffsetFetch with require_stable refuses exactly the partitions
    /// with an offset record in an open transaction.
    fn check_group(&self) {
        let Some(g) = &self.group else {
            return;
        };
        let mut open: BTreeMap<i64, Vec<(usize, &Record)>> = BTreeMap::new();
        let mut visible: BTreeMap<&[u8], (usize, &Record)> = BTreeMap::new();
        for (off, e) in self.data[OFFSETS].log.iter().enumerate() {
            match e {
                Entry::Data {
                    pid,
                    record: Some(r),
                    ..
                } => open.entry(*pid).or_default().push((off, r)),
                Entry::Data { .. } => unreachable!("offset records only"),
                Entry::Marker { pid, commit } => {
                    for (off, r) in open.remove(pid).unwrap_or_default() {
                        let newer = visible.get(r.0.as_slice()).is_none_or(|(o, _)| *o < off);
                        if *commit && newer {
                            visible.insert(&r.0, (off, r));
                        }
                    }
                }
            }
        }
        let unstable: BTreeSet<&[u8]> = open
            .values()
            .flatten()
            .map(|(_, r)| r.0.as_slice())
            .collect();
        for ci in 0..CLIENTS {
            let tp = (IN_TOPIC.to_string(), ci as i32);
            let key = Key::Offset {
                group: GROUP.into(),
                topic: IN_TOPIC.into(),
                partition: ci as i32,
            }
            .encode();
            let want = visible.get(key.as_slice()).map(|(_, r)| {
                OffsetValue::decode(r.1.as_ref().expect("a value"))
                    .expect("valid")
                    .offset
            });
            let got = g.fetch_offsets_stable(GROUP, Some(std::slice::from_ref(&tp)), false);
            let got = got[0]
                .1
                .clone()
                .expect("no error without require_stable")
                .map(|c| c.offset);
            assert_eq!(
                got, want,
                "seed {}: visible offset of client {ci}",
                self.seed
            );
            if let Some(txn) = got {
                assert_eq!(
                    self.decided.get(&(txn as u64)),
                    Some(&true),
                    "seed {}: offset of txn {txn}",
                    self.seed
                );
            }
            let stable = g.fetch_offsets_stable(GROUP, Some(std::slice::from_ref(&tp)), true);
            assert_eq!(
                stable[0].1.is_err(),
                unstable.contains(key.as_slice()),
                "seed {}: require_stable for client {ci}",
                self.seed
            );
        }
    }

    /// TxnOffsetCommit: validated by the group coordinator, written as a transactional
    /// offset record on the offsets partition (verified like any transactional write).
    fn commit_offsets(&mut self, ci: usize, commit_after: bool) {
        let Some(g) = self.group.as_mut() else {
            return; // NOT_COORDINATOR: the client retries
        };
        let c = &mut self.clients[ci];
        let pe = c.pe.expect("initialized");
        let args = TxnCommitArgs {
            group_id: GROUP.into(),
            producer_id: pe.producer_id,
            producer_epoch: pe.epoch,
            generation: -1,
            member_id: String::new(),
            instance_id: None,
            offsets: vec![(
                (IN_TOPIC.to_string(), ci as i32),
                Committed {
                    offset: c.txn as i64,
                    leader_epoch: -1,
                    metadata: String::new(),
                    commit_timestamp_ms: self.now,
                },
            )],
        };
        let plan = g.plan_txn_commit(self.now, args);
        assert!(
            plan.results[0].1.is_ok(),
            "a simple consumer commits to an empty group"
        );
        if self.faults && self.rng.chance(50) {
            g.fail_txn_commit(&plan); // the append failed: the client retries
            return;
        }
        let r = plan.records[0].clone();
        let seq = c.seq.entry(OFFSETS as i32).or_insert(0);
        let tp = offsets_tp();
        let coord = self.coord.as_ref();
        let verify = || {
            coord.is_some_and(|co| {
                co.verify_partitions(&c.id, pe.producer_id, pe.epoch, std::slice::from_ref(&tp))
                    .is_ok_and(|v| v[0].1.is_ok())
            })
        };
        let appended = self.data[OFFSETS].append(
            pe.producer_id,
            pe.epoch,
            *seq,
            c.txn,
            Some((r.key, r.value)),
            verify,
        );
        *seq += 1;
        self.data[OFFSETS].check(OFFSETS);
        match appended {
            Ok(()) => {
                g.apply_txn_commit(plan);
                self.stats.offset_commits += 1;
                c.phase = Phase::Ending {
                    commit: commit_after,
                    bump_after: false,
                };
            }
            Err(_) => {
                g.fail_txn_commit(&plan);
                c.phase = Phase::Ending {
                    commit: false,
                    bump_after: false,
                };
            }
        }
        self.check_group();
    }

    fn tick(&mut self) {
        if let Some(c) = self.coord.as_mut() {
            let mut fx = TxnEffects::default();
            c.tick(self.now, &mut fx);
            self.absorb(fx);
        }
    }

    // ---------------------------------------------------------------- clients

    fn send(
        &mut self,
        ci: usize,
        call: impl FnOnce(&mut TxnCoordinator, u64, i64, &mut Ids, &mut TxnEffects),
    ) {
        self.next_token += 1;
        let token = self.next_token;
        self.clients[ci].inflight = Some((token, self.now));
        self.tokens.insert(token, ci);
        let Some(c) = self.coord.as_mut() else {
            // Nobody listens: the client is told NOT_COORDINATOR at once.
            self.tokens.remove(&token);
            self.clients[ci].inflight = None;
            return;
        };
        let mut fx = TxnEffects::default();
        call(c, token, self.now, &mut self.ids, &mut fx);
        self.absorb(fx);
    }

    fn client_step(&mut self, ci: usize) {
        let now = self.now;
        if let Some((token, at)) = self.clients[ci].inflight {
            if now - at <= REQUEST_TIMEOUT_MS {
                return;
            }
            // No answer in time: forget it and send again.
            self.tokens.remove(&token);
            self.clients[ci].inflight = None;
        }
        let c = &self.clients[ci];
        let id = c.id.clone();
        let pe = c.pe;
        match c.phase.clone() {
            Phase::NeedInit { expected } => {
                let (producer_id, producer_epoch) =
                    expected.map_or((-1, -1), |e| (e.producer_id, e.epoch));
                let a = InitArgs {
                    transactional_id: Some(id),
                    transaction_timeout_ms: TXN_TIMEOUT_MS,
                    producer_id,
                    producer_epoch,
                };
                self.send(ci, |c, t, now, ids, fx| {
                    c.init_producer_id(InitToken(t), now, a, ids, fx)
                });
            }
            Phase::Idle => {
                if self.healing {
                    return;
                }
                self.next_txn += 1;
                let n = 1 + self.rng.below(3) as usize;
                let mut parts: Vec<i32> = (0..DATA_PARTITIONS).collect();
                for k in 0..parts.len() {
                    let j = k + self.rng.below((parts.len() - k) as u64) as usize;
                    parts.swap(k, j);
                }
                parts.truncate(n);
                let c = &mut self.clients[ci];
                c.txn = self.next_txn;
                c.phase = Phase::Adding { parts };
                self.client_step(ci);
            }
            Phase::Adding { parts } => {
                let pe = pe.expect("initialized");
                let a = AddArgs {
                    transactional_id: id,
                    producer_id: pe.producer_id,
                    producer_epoch: pe.epoch,
                    partitions: parts.iter().map(|p| (DATA_TOPIC.to_string(), *p)).collect(),
                };
                self.send(ci, |c, t, now, _, fx| {
                    c.add_partitions(AddPartitionsToken(t), now, a, fx)
                });
            }
            Phase::Producing {
                parts,
                total,
                sent,
                resolved,
                failed,
                last_sent_ms,
            } => {
                let pe = pe.expect("initialized");
                if sent < total {
                    self.produce(ci, pe, parts[sent % parts.len()]);
                    return;
                }
                let timed_out = resolved < sent && now - last_sent_ms > PRODUCE_TIMEOUT_MS;
                if resolved < sent && !timed_out {
                    return; // waiting for acknowledgements
                }
                let c = &mut self.clients[ci];
                c.phase = if failed || timed_out {
                    // KIP-360: after a timeout the producer bumps its epoch once aborted.
                    Phase::Ending {
                        commit: false,
                        bump_after: timed_out,
                    }
                } else if self.faults && self.rng.chance(40) {
                    Phase::Stalled {
                        until_ms: now + i64::from(TXN_TIMEOUT_MS) + 1_500,
                    }
                } else if self.rng.chance(600) {
                    // Consume-transform-produce: the input offset joins the transaction.
                    Phase::AddingOffsets {
                        commit_after: !self.rng.chance(150),
                    }
                } else {
                    Phase::Ending {
                        commit: !self.rng.chance(150),
                        bump_after: false,
                    }
                };
                self.client_step(ci);
            }
            Phase::Stalled { until_ms } => {
                if now >= until_ms {
                    self.clients[ci].phase = Phase::Ending {
                        commit: true,
                        bump_after: false,
                    };
                    self.client_step(ci);
                }
            }
            Phase::Gone => {}
            Phase::AddingOffsets { .. } => {
                let pe = pe.expect("initialized");
                let a = AddOffsetsArgs {
                    transactional_id: id,
                    producer_id: pe.producer_id,
                    producer_epoch: pe.epoch,
                    group_id: GROUP.into(),
                };
                self.send(ci, |c, t, now, _, fx| {
                    c.add_offsets(AddOffsetsToken(t), now, a, fx)
                });
            }
            Phase::CommittingOffsets { commit_after } => self.commit_offsets(ci, commit_after),
            Phase::Ending { commit, .. } => {
                let pe = pe.expect("initialized");
                let a = EndArgs {
                    transactional_id: id,
                    producer_id: pe.producer_id,
                    producer_epoch: pe.epoch,
                    commit,
                };
                self.send(ci, |c, t, now, _, fx| c.end_txn(EndToken(t), now, a, fx));
            }
        }
    }

    fn produce(&mut self, ci: usize, pe: ProducerIdAndEpoch, partition: i32) {
        let delay = if self.faults && self.rng.chance(30) {
            2_000 + self.rng.below(4_000) as i64 // past the client's timeout
        } else {
            self.rng.below(100) as i64
        };
        let dropped = self.faults && self.rng.chance(15);
        let c = &mut self.clients[ci];
        let seq = c.seq.entry(partition).or_insert(0);
        let msg = ProduceMsg {
            client: ci,
            instance: c.instance,
            txn: c.txn,
            pid: pe.producer_id,
            epoch: pe.epoch,
            seq: *seq,
            partition,
            deliver_at_ms: self.now + delay,
            txn_id: c.id.clone(),
        };
        *seq += 1;
        if let Phase::Producing {
            sent, last_sent_ms, ..
        } = &mut c.phase
        {
            *sent += 1;
            *last_sent_ms = self.now;
        }
        if !dropped {
            self.produces.push(msg);
        }
    }

    fn on_reply(&mut self, ci: usize, token: u64, reply: TxnReply) {
        let c = &mut self.clients[ci];
        if c.inflight.map(|(t, _)| t) != Some(token) {
            return;
        }
        c.inflight = None;
        let retriable = |e: &E| {
            matches!(
                e,
                E::ConcurrentTransactions
                    | E::NotCoordinator
                    | E::CoordinatorLoadInProgress
                    | E::CoordinatorNotAvailable
            )
        };
        match reply {
            TxnReply::InitProducerId(_, Ok(pe)) => {
                self.pid_owner.insert(pe.producer_id, c.id.clone());
                if c.pe != Some(pe) {
                    c.seq.clear();
                }
                c.pe = Some(pe);
                c.phase = Phase::Idle;
            }
            TxnReply::InitProducerId(_, Err(e)) if retriable(&e) => {}
            TxnReply::InitProducerId(_, Err(_)) => c.phase = Phase::NeedInit { expected: None },
            TxnReply::AddPartitions(_, Ok(())) => {
                let Phase::Adding { parts } = c.phase.clone() else {
                    panic!("AddPartitions answered in {:?}", c.phase)
                };
                let total = parts.len() * (1 + (c.txn % 2) as usize);
                c.phase = Phase::Producing {
                    parts,
                    total,
                    sent: 0,
                    resolved: 0,
                    failed: false,
                    last_sent_ms: self.now,
                };
            }
            TxnReply::AddPartitions(_, Err(e)) if retriable(&e) => {}
            TxnReply::AddPartitions(_, Err(_)) => c.phase = Phase::NeedInit { expected: None },
            TxnReply::EndTxn(_, Ok(pe)) => {
                let Phase::Ending { commit, bump_after } = c.phase.clone() else {
                    panic!("EndTxn answered in {:?}", c.phase)
                };
                assert_eq!(Some(pe), c.pe);
                if let Some(prev) = self.seen_by_client.insert(c.txn, commit) {
                    assert_eq!(prev, commit);
                }
                if let Some(d) = self.decided.get(&c.txn) {
                    assert_eq!(
                        *d, commit,
                        "seed {}: txn {} answered against its markers",
                        self.seed, c.txn
                    );
                }
                if commit {
                    self.stats.committed += 1;
                } else {
                    self.stats.aborted += 1;
                }
                c.phase = if bump_after {
                    Phase::NeedInit { expected: Some(pe) }
                } else {
                    Phase::Idle
                };
            }
            TxnReply::EndTxn(_, Err(e)) if retriable(&e) => {}
            TxnReply::EndTxn(_, Err(_)) => {
                self.stats.fenced_by_coordinator += 1;
                c.phase = Phase::NeedInit { expected: None };
            }
            TxnReply::AddOffsets(_, Ok(())) => {
                let Phase::AddingOffsets { commit_after } = c.phase.clone() else {
                    panic!("AddOffsetsToTxn answered in {:?}", c.phase)
                };
                c.phase = Phase::CommittingOffsets { commit_after };
            }
            TxnReply::AddOffsets(_, Err(e)) if retriable(&e) => {}
            TxnReply::AddOffsets(_, Err(_)) => c.phase = Phase::NeedInit { expected: None },
        }
    }

    fn client_crash(&mut self) {
        let ci = self.rng.below(CLIENTS as u64) as usize;
        let c = &mut self.clients[ci];
        c.instance += 1;
        if let Some((t, _)) = c.inflight.take() {
            self.tokens.remove(&t);
        }
        c.pe = None;
        c.seq.clear();
        // Some never come back (one client of each seed at most).
        let gone = self.clients.iter().any(|c| matches!(c.phase, Phase::Gone));
        let c = &mut self.clients[ci];
        c.phase = if !gone && self.rng.chance(300) {
            Phase::Gone
        } else {
            Phase::NeedInit { expected: None }
        };
    }

    // ------------------------------------------------------------------ checks

    /// Every open transaction on a data partition is durably known to the coordinator,
    /// so whichever coordinator loads the log will end it.
    fn check_no_hanging(&self) {
        for (p, part) in self.data.iter().enumerate() {
            for (pid, st) in &part.producers {
                if st.open_first.is_none() {
                    continue;
                }
                let id = &self.pid_owner[pid];
                let v = self.latest.get(id).cloned().flatten().unwrap_or_else(|| {
                    panic!(
                        "seed {}: open transaction of {id} on partition {p} with no durable state",
                        self.seed
                    )
                });
                let tp_in = v
                    .partitions
                    .iter()
                    .flatten()
                    .any(|(t, ids)| (t, ids.contains(&tp_of(p).1)) == (&tp_of(p).0, true));
                assert!(
                    v.producer_id == *pid
                        && matches!(v.state, TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort)
                        && tp_in,
                    "seed {}: open transaction of {id} (producer {pid}) on partition {p} is not durably tracked: {v:?}",
                    self.seed
                );
            }
        }
    }

    fn settled(&self) -> bool {
        self.appends.is_empty()
            && self.markers.is_empty()
            && self.produces.is_empty()
            && self.data.iter().all(|d| d.lso() == d.log.len())
            && self
                .clients
                .iter()
                .all(|c| matches!(c.phase, Phase::Idle | Phase::Gone) && c.inflight.is_none())
    }

    fn final_checks(&self) {
        for (p, part) in self.data.iter().enumerate() {
            let (_, visible) = part.scan();
            let visible: BTreeSet<usize> = visible.into_iter().collect();
            for (off, e) in part.log.iter().enumerate() {
                if let Entry::Data { txn, .. } = e {
                    let committed = self.decided.get(txn).copied();
                    assert!(
                        committed.is_some(),
                        "seed {}: txn {txn} undecided at the end",
                        self.seed
                    );
                    assert_eq!(
                        visible.contains(&off),
                        committed == Some(true),
                        "seed {}: partition {p} offset {off} of txn {txn}: visibility against its fate",
                        self.seed
                    );
                }
            }
        }
        for (txn, commit) in &self.seen_by_client {
            if let Some(d) = self.decided.get(txn) {
                assert_eq!(d, commit, "seed {}: txn {txn}", self.seed);
            }
        }
    }

    // -------------------------------------------------------------------- run

    fn step(&mut self) {
        self.now += 1 + self.rng.below(40) as i64;
        if self.coord.is_none() && self.now >= self.down_until_ms {
            self.restart();
        }
        if self.group.is_none() && self.now >= self.group_down_until_ms {
            self.restart_group();
        }
        let roll = self.rng.below(1000);
        match roll {
            0..=399 => {
                let ci = self.rng.below(CLIENTS as u64) as usize;
                self.client_step(ci);
            }
            400..=549 if self.coord.is_some() => self.resolve_append(),
            550..=699 => self.deliver_marker(),
            700..=849 => self.deliver_produce(),
            850..=989 => self.tick(),
            990..=994 if self.faults && self.coord.is_some() => self.crash(),
            995..=997 if self.faults => self.client_crash(),
            998 if self.faults && self.group.is_some() => self.crash_group(),
            _ => {}
        }
        self.check_no_hanging();
    }

    /// No more faults: everything in flight lands, and every open transaction must end.
    fn heal(&mut self) {
        self.faults = false;
        self.healing = true;
        for p in self.produces.iter_mut() {
            p.deliver_at_ms = p.deliver_at_ms.min(self.now);
        }
        for _ in 0..HEAL_STEPS {
            self.now += 50;
            if self.coord.is_none() && self.now >= self.down_until_ms {
                self.restart();
            }
            if self.group.is_none() && self.now >= self.group_down_until_ms {
                self.restart_group();
            }
            while self.coord.is_some() && !self.appends.is_empty() {
                self.resolve_append();
            }
            while !self.markers.is_empty() {
                self.deliver_marker();
            }
            while self.produces.iter().any(|p| p.deliver_at_ms <= self.now) {
                self.deliver_produce();
            }
            self.tick();
            for ci in 0..CLIENTS {
                self.client_step(ci);
            }
            self.check_no_hanging();
            if self.settled() {
                return;
            }
        }
        let open: Vec<(usize, usize, usize)> = self
            .data
            .iter()
            .enumerate()
            .map(|(p, d)| (p, d.lso(), d.log.len()))
            .collect();
        panic!(
            "seed {}: not settled {HEAL_STEPS} steps after the faults stopped; (partition, LSO, end): {open:?}; clients: {:?}",
            self.seed,
            self.clients.iter().map(|c| (&c.phase, c.inflight)).collect::<Vec<_>>()
        );
    }
}

fn run(seed: u64) -> Stats {
    let mut s = Sim::new(seed);
    for _ in 0..STEPS {
        s.step();
    }
    s.heal();
    s.final_checks();
    s.stats
}

#[test]
fn transactions_stay_atomic_through_crashes_lost_markers_and_timeouts() {
    let seeds: Vec<u64> = match std::env::var("SLUICE_TXN_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("a seed number")],
        Err(_) => {
            let n = std::env::var("SLUICE_TXN_SIM_SEEDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(150);
            (1..=n).collect()
        }
    };
    let mut total = Stats::default();
    for seed in seeds {
        let r = std::panic::catch_unwind(|| run(seed));
        let stats = match r {
            Ok(s) => s,
            Err(e) => {
                eprintln!("txn simulation failed; replay: SLUICE_TXN_SIM_SEED={seed} cargo test -p sluice-coordinator --profile unit --test txn_sim");
                std::panic::resume_unwind(e);
            }
        };
        total.crashes += stats.crashes;
        total.committed += stats.committed;
        total.aborted += stats.aborted;
        total.fenced_by_coordinator += stats.fenced_by_coordinator;
        total.log_ahead += stats.log_ahead;
        total.expired += stats.expired;
        total.offset_commits += stats.offset_commits;
        total.group_crashes += stats.group_crashes;
    }
    eprintln!("txn simulation: {total:?}");
    // The faults happened and transactions still got through.
    assert!(total.crashes > 0 && total.committed > 0 && total.aborted > 0);
}
