//! ISR data replication for one partition, as Kafka does it, as pure state machines.
//!
//! Objects here live on the partition's home shard. They never do I/O: the broker's shell
//! feeds them fetches, fsync completions, metadata and the time, and carries out what they
//! return (AlterPartition requests to the controller, truncations of the local log).
//!
//! - [`LeaderEpochCache`]: the `(epoch, start offset)` history of a log, answering
//!   OffsetForLeaderEpoch; persisted as the `leader-epoch-checkpoint` file.
//! - [`Leader`]: follower progress, the high watermark over the *maximal* ISR (KIP-497),
//!   ISR shrink/expand proposals, and the `acks=all` checks.
//! - [`Follower`]: truncation before fetching (KIP-101, KIP-279), then the follower's high
//!   watermark.
//!
//! Offsets are "next offset" style: a log end offset (LEO) of 10 holds offsets 0..=9, and
//! a high watermark of 10 means offsets 0..=9 are committed.
//!
//! Durability differs from Kafka in one place: Sluice fsyncs before it acknowledges, so the
//! leader counts only its *durable* log end offset, and a follower reports (as its fetch
//! offset) only what it has made durable. Whatever the high watermark covers is therefore on
//! disk on every member of the maximal ISR, and a crash that loses unsynced writes never
//! loses a committed record.

use std::collections::BTreeMap;
use std::fmt;

use crate::BrokerId;

/// A Kafka offset (the next offset to be written, when it is an end offset).
pub type Offset = i64;
/// A partition's leader epoch.
pub type LeaderEpoch = i32;

/// Kafka's `UNDEFINED_EPOCH` in OffsetForLeaderEpoch answers.
pub const UNDEFINED_EPOCH: LeaderEpoch = -1;
/// Kafka's `UNDEFINED_EPOCH_OFFSET` in OffsetForLeaderEpoch answers.
pub const UNDEFINED_OFFSET: Offset = -1;

// ---------------------------------------------------------------------------------------
// Leader-epoch cache
// ---------------------------------------------------------------------------------------

/// One entry of the leader-epoch cache: `epoch` began at `start_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: LeaderEpoch,
    pub start_offset: Offset,
}

/// The leader epochs of a log and the offset at which each began, strictly ascending in
/// both epoch and start offset (Kafka's `LeaderEpochFileCache`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    entries: Vec<EpochEntry>,
}

/// Version of the `leader-epoch-checkpoint` text format.
pub const CHECKPOINT_VERSION: u32 = 0;

/// Why a `leader-epoch-checkpoint` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("leader-epoch checkpoint: missing {0} line")]
    Missing(&'static str),
    #[error("leader-epoch checkpoint: unsupported version {0}")]
    Version(String),
    #[error("leader-epoch checkpoint: bad count line {0:?}")]
    Count(String),
    #[error("leader-epoch checkpoint: line {line}: bad entry {text:?}")]
    Entry { line: usize, text: String },
    #[error("leader-epoch checkpoint: expected {expected} entries, found {found}")]
    Length { expected: usize, found: usize },
    #[error("leader-epoch checkpoint: entries not strictly ascending at line {0}")]
    Order(usize),
}

impl LeaderEpochCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The entries, ascending.
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// Records that `epoch` begins at `start_offset`. Ignored (returns false) unless the
    /// epoch is newer than the latest one. Entries starting at or after `start_offset` are
    /// dropped first: they describe a suffix of the log that has been truncated away
    /// without the cache being told (Kafka does the same), so the cache stays ascending in
    /// both fields.
    pub fn assign(&mut self, epoch: LeaderEpoch, start_offset: Offset) -> bool {
        assert!(
            epoch >= 0 && start_offset >= 0,
            "bad epoch entry {epoch}@{start_offset}"
        );
        if self.latest_epoch() >= epoch {
            return false;
        }
        self.truncate_from_end(start_offset);
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        true
    }

    /// The newest epoch, or [`UNDEFINED_EPOCH`] when the cache is empty.
    pub fn latest_epoch(&self) -> LeaderEpoch {
        self.entries.last().map_or(UNDEFINED_EPOCH, |e| e.epoch)
    }

    /// OffsetForLeaderEpoch, as Kafka answers it: `(epoch, end offset)` where `epoch` is
    /// the largest known epoch ≤ `requested` and the end offset is the start offset of the
    /// next higher epoch (or `log_end` when `requested` is the latest epoch).
    ///
    /// Edge cases follow Kafka's `LeaderEpochFileCache.endOffsetFor` rather than intuition:
    /// - `requested` undefined, or greater than every known epoch (a leader never sees this:
    ///   its own epoch is its latest, and KIP-320 fencing rejects newer requesters) →
    ///   `(UNDEFINED_EPOCH, UNDEFINED_OFFSET)`; the follower then truncates to its high
    ///   watermark.
    /// - `requested` below the first known epoch (the older epochs were removed with old
    ///   segments) → `(requested, first start offset)`: the follower keeps nothing past the
    ///   point where the leader's known history begins.
    pub fn end_offset_for(&self, requested: LeaderEpoch, log_end: Offset) -> (LeaderEpoch, Offset) {
        let undefined = (UNDEFINED_EPOCH, UNDEFINED_OFFSET);
        if requested == UNDEFINED_EPOCH {
            return undefined;
        }
        if self.latest_epoch() == requested {
            return (requested, log_end);
        }
        let Some(higher) = self.entries.iter().find(|e| e.epoch > requested) else {
            return undefined;
        };
        match self.entries.iter().rev().find(|e| e.epoch <= requested) {
            Some(floor) => (floor.epoch, higher.start_offset),
            None => (requested, higher.start_offset),
        }
    }

    /// Drops the entries that start at or after `end_offset` (the log was truncated to it).
    pub fn truncate_from_end(&mut self, end_offset: Offset) {
        self.entries.retain(|e| e.start_offset < end_offset);
    }

    /// The log's start moved to `start_offset` (retention): drops the epochs that ended
    /// before it and moves the start of the epoch covering it up to `start_offset`.
    pub fn truncate_from_start(&mut self, start_offset: Offset) {
        let covering = self
            .entries
            .iter()
            .rposition(|e| e.start_offset <= start_offset);
        if let Some(i) = covering {
            self.entries.drain(..i);
            self.entries[0].start_offset = start_offset;
        }
    }

    /// The `leader-epoch-checkpoint` text: a version line, a count line, then one
    /// `"<epoch> <start offset>"` line per entry (the layout Kafka uses, so the files read
    /// the same).
    pub fn encode(&self) -> String {
        let mut out = format!("{CHECKPOINT_VERSION}\n{}\n", self.entries.len());
        for e in &self.entries {
            out.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
        }
        out
    }

    /// Parses [`encode`](Self::encode)'s output, refusing anything malformed: wrong
    /// version, a count that does not match, unparsable or negative entries, entries out of
    /// order.
    pub fn decode(text: &str) -> Result<Self, CheckpointError> {
        let mut lines = text.lines();
        let version = lines.next().ok_or(CheckpointError::Missing("version"))?;
        if version.trim() != CHECKPOINT_VERSION.to_string() {
            return Err(CheckpointError::Version(version.to_string()));
        }
        let count_line = lines.next().ok_or(CheckpointError::Missing("count"))?;
        let expected: usize = count_line
            .trim()
            .parse()
            .map_err(|_| CheckpointError::Count(count_line.to_string()))?;
        let mut cache = Self::default();
        for (i, text) in lines.enumerate() {
            let line = i + 3;
            let entry = parse_entry(text).ok_or_else(|| CheckpointError::Entry {
                line,
                text: text.to_string(),
            })?;
            if let Some(last) = cache.entries.last() {
                if entry.epoch <= last.epoch || entry.start_offset < last.start_offset {
                    return Err(CheckpointError::Order(line));
                }
            }
            cache.entries.push(entry);
        }
        if cache.entries.len() != expected {
            return Err(CheckpointError::Length {
                expected,
                found: cache.entries.len(),
            });
        }
        Ok(cache)
    }
}

fn parse_entry(text: &str) -> Option<EpochEntry> {
    let mut parts = text.split_whitespace();
    let epoch: LeaderEpoch = parts.next()?.parse().ok()?;
    let start_offset: Offset = parts.next()?.parse().ok()?;
    if parts.next().is_some() || epoch < 0 || start_offset < 0 {
        return None;
    }
    Some(EpochEntry {
        epoch,
        start_offset,
    })
}

// ---------------------------------------------------------------------------------------
// Leader
// ---------------------------------------------------------------------------------------

/// Why the leader refused a follower's Fetch (mapped to Kafka error codes at the API edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The requester is not a replica of this partition (NOT_LEADER_OR_FOLLOWER).
    #[error("broker {0} is not a replica of this partition")]
    NotAReplica(BrokerId),
    /// The requester's leader epoch is older than ours (FENCED_LEADER_EPOCH): it must
    /// refresh metadata.
    #[error("requester's leader epoch {requester} is older than {ours}")]
    FencedLeaderEpoch {
        requester: LeaderEpoch,
        ours: LeaderEpoch,
    },
    /// The requester knows a newer epoch than ours (UNKNOWN_LEADER_EPOCH): *we* are stale
    /// and it should retry after our metadata catches up.
    #[error("requester's leader epoch {requester} is newer than {ours}")]
    UnknownLeaderEpoch {
        requester: LeaderEpoch,
        ours: LeaderEpoch,
    },
}

/// What the leader answers a good follower Fetch with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOk {
    /// The leader's high watermark after this fetch, for the response.
    pub high_watermark: Offset,
    /// An ISR change this fetch made the leader propose (send it to the controller).
    pub alter_isr: Option<AlterIsr>,
}

/// A proposed ISR change (an AlterPartition request to the controller), stamped with the
/// epochs it was computed from so that the controller refuses it if either moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterIsr {
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: i32,
    pub new_isr: Vec<BrokerId>,
}

/// `min.insync.replicas` is not met: refuse the `acks=all` produce before appending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ISR has {isr} members, min.insync.replicas is {min_insync}")]
pub struct NotEnoughReplicas {
    pub isr: usize,
    pub min_insync: usize,
}

/// Where an `acks=all` produce whose batch ends at some offset stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckState {
    /// Not yet covered by the high watermark.
    Pending,
    /// Covered by the high watermark with enough in-sync replicas: answer success.
    Acked,
    /// Covered, but the ISR shrank below `min.insync.replicas` meanwhile
    /// (NOT_ENOUGH_REPLICAS_AFTER_APPEND).
    NotEnoughReplicasAfterAppend,
}

/// The leader's view of one follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerProgress {
    /// The follower's durable log end offset (its last fetch offset); `None` until it
    /// fetches from this leader.
    pub log_end: Option<Offset>,
    /// Last time the follower was caught up with the leader (Kafka's lastCaughtUpTimeMs).
    pub last_caught_up_ms: u64,
    /// Time of its last fetch.
    pub last_fetch_ms: u64,
    /// The leader's log end when the follower last fetched.
    leader_end_at_last_fetch: Offset,
}

/// How a new leader starts (see [`Leader::new`]).
#[derive(Debug, Clone)]
pub struct LeaderInit {
    pub me: BrokerId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: i32,
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    /// Where this leader's epoch begins: its whole log end offset when it became leader
    /// (what it assigns in its epoch cache). A follower rejoins the ISR only once past it.
    pub epoch_start_offset: Offset,
    /// The leader's durable log end offset.
    pub durable_log_end: Offset,
    /// The high watermark it had (as follower, or from its checkpoint).
    pub high_watermark: Offset,
    pub now_ms: u64,
    /// `replica.lag.time.max.ms`.
    pub replica_lag_time_max_ms: u64,
}

/// The leader replica of one partition for one leader epoch. When the leader epoch changes
/// the shell drops it (and builds a new `Leader` or a [`Follower`]).
#[derive(Debug, Clone)]
pub struct Leader {
    me: BrokerId,
    leader_epoch: LeaderEpoch,
    partition_epoch: i32,
    replicas: Vec<BrokerId>,
    /// Committed ISR, from metadata.
    isr: Vec<BrokerId>,
    /// The AlterPartition in flight, if any (at most one, as in Kafka).
    pending: Option<AlterIsr>,
    followers: BTreeMap<BrokerId, FollowerProgress>,
    epoch_start_offset: Offset,
    durable_log_end: Offset,
    high_watermark: Offset,
    replica_lag_time_max_ms: u64,
    /// Simulation knob: compute the high watermark over the committed ISR only, ignoring
    /// a pending change (breaks KIP-497; lets the simulation prove it catches it).
    unsafe_ignore_pending_isr: bool,
}

impl Leader {
    /// A leader for a new epoch. Followers start with unknown log end offsets and count as
    /// caught up "now", so no follower is dropped before it had `replica.lag.time.max.ms`
    /// to fetch. The high watermark starts where this replica had it (never above its
    /// durable log end).
    pub fn new(init: LeaderInit) -> Self {
        assert!(init.replicas.contains(&init.me), "leader must be a replica");
        assert!(init.isr.contains(&init.me), "leader must be in the ISR");
        assert!(
            init.isr.iter().all(|b| init.replicas.contains(b)),
            "ISR ⊆ replicas"
        );
        let followers = init
            .replicas
            .iter()
            .filter(|&&b| b != init.me)
            .map(|&b| {
                let progress = FollowerProgress {
                    log_end: None,
                    last_caught_up_ms: init.now_ms,
                    last_fetch_ms: init.now_ms,
                    leader_end_at_last_fetch: UNDEFINED_OFFSET,
                };
                (b, progress)
            })
            .collect();
        let mut leader = Self {
            me: init.me,
            leader_epoch: init.leader_epoch,
            partition_epoch: init.partition_epoch,
            replicas: init.replicas,
            isr: init.isr,
            pending: None,
            followers,
            epoch_start_offset: init.epoch_start_offset,
            durable_log_end: init.durable_log_end,
            high_watermark: init.high_watermark.min(init.durable_log_end).max(0),
            replica_lag_time_max_ms: init.replica_lag_time_max_ms,
            unsafe_ignore_pending_isr: false,
        };
        leader.maybe_advance_high_watermark();
        leader
    }

    /// Simulation only: see the field of the same name. Never set this in the broker.
    #[doc(hidden)]
    pub fn set_unsafe_ignore_pending_isr(&mut self, on: bool) {
        self.unsafe_ignore_pending_isr = on;
    }

    pub fn me(&self) -> BrokerId {
        self.me
    }
    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.leader_epoch
    }
    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch
    }
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }
    pub fn durable_log_end(&self) -> Offset {
        self.durable_log_end
    }
    pub fn epoch_start_offset(&self) -> Offset {
        self.epoch_start_offset
    }
    /// The committed ISR.
    pub fn isr(&self) -> &[BrokerId] {
        &self.isr
    }
    pub fn replicas(&self) -> &[BrokerId] {
        &self.replicas
    }
    /// The AlterPartition in flight (the shell resends it until metadata answers).
    pub fn pending_alter(&self) -> Option<&AlterIsr> {
        self.pending.as_ref()
    }
    pub fn follower(&self, id: BrokerId) -> Option<&FollowerProgress> {
        self.followers.get(&id)
    }

    /// The committed ISR plus the pending change's members (KIP-497): every replica that
    /// some controller decision could leave in the ISR.
    pub fn maximal_isr(&self) -> Vec<BrokerId> {
        let mut all = self.isr.clone();
        if let (Some(p), false) = (&self.pending, self.unsafe_ignore_pending_isr) {
            for b in &p.new_isr {
                if !all.contains(b) {
                    all.push(*b);
                }
            }
        }
        all
    }

    /// The local log has been made durable up to `log_end`.
    pub fn on_local_durable(&mut self, log_end: Offset) {
        assert!(
            log_end >= self.high_watermark,
            "durable end below the high watermark"
        );
        self.durable_log_end = log_end;
        self.maybe_advance_high_watermark();
    }

    /// A follower fetched from `fetch_offset` (its durable log end) with its view of the
    /// leader epoch. Updates its progress, the high watermark and maybe proposes adding it
    /// to the ISR.
    pub fn on_follower_fetch(
        &mut self,
        follower: BrokerId,
        follower_leader_epoch: LeaderEpoch,
        fetch_offset: Offset,
        now_ms: u64,
    ) -> Result<FetchOk, FetchError> {
        self.check_epoch(follower_leader_epoch)?;
        let leader_end = self.durable_log_end;
        let progress = self
            .followers
            .get_mut(&follower)
            .ok_or(FetchError::NotAReplica(follower))?;
        // Kafka's lastCaughtUpTime rule: caught up if it reached our end now, or reached
        // the end we had at its previous fetch (then it was caught up as of that fetch).
        if fetch_offset >= leader_end {
            progress.last_caught_up_ms = progress.last_caught_up_ms.max(now_ms);
        } else if fetch_offset >= progress.leader_end_at_last_fetch {
            progress.last_caught_up_ms = progress.last_caught_up_ms.max(progress.last_fetch_ms);
        }
        progress.leader_end_at_last_fetch = leader_end;
        progress.last_fetch_ms = now_ms;
        progress.log_end = Some(fetch_offset);
        self.maybe_advance_high_watermark();
        let alter_isr = self.maybe_expand(follower);
        Ok(FetchOk {
            high_watermark: self.high_watermark,
            alter_isr,
        })
    }

    /// KIP-320 check of a requester's view of the leader epoch (Fetch and
    /// OffsetForLeaderEpoch from followers).
    pub fn check_epoch(&self, requester: LeaderEpoch) -> Result<(), FetchError> {
        let ours = self.leader_epoch;
        match requester.cmp(&ours) {
            std::cmp::Ordering::Less => Err(FetchError::FencedLeaderEpoch { requester, ours }),
            std::cmp::Ordering::Greater => Err(FetchError::UnknownLeaderEpoch { requester, ours }),
            std::cmp::Ordering::Equal => Ok(()),
        }
    }

    /// Periodic check (Kafka's isr-expiration task): proposes dropping ISR followers that
    /// have not been caught up for longer than `replica.lag.time.max.ms`.
    pub fn tick(&mut self, now_ms: u64) -> Option<AlterIsr> {
        if self.pending.is_some() {
            return None;
        }
        let leader_end = self.durable_log_end;
        let lagging: Vec<BrokerId> = self
            .isr
            .iter()
            .copied()
            .filter(|&b| b != self.me)
            .filter(|b| {
                let p = &self.followers[b];
                let at_end = p.log_end == Some(leader_end);
                let recent =
                    now_ms.saturating_sub(p.last_caught_up_ms) <= self.replica_lag_time_max_ms;
                !at_end && !recent
            })
            .collect();
        if lagging.is_empty() {
            return None;
        }
        let new_isr: Vec<BrokerId> = self
            .isr
            .iter()
            .copied()
            .filter(|b| !lagging.contains(b))
            .collect();
        self.propose(new_isr)
    }

    /// Adopts committed metadata for this leader epoch. A newer partition epoch answers
    /// the pending AlterPartition (accepted or superseded), so it is cleared. Older
    /// metadata (reordered delivery) is ignored.
    pub fn on_metadata(
        &mut self,
        leader_epoch: LeaderEpoch,
        partition_epoch: i32,
        isr: &[BrokerId],
        replicas: &[BrokerId],
    ) {
        assert_eq!(
            leader_epoch, self.leader_epoch,
            "a new leader epoch needs a new Leader"
        );
        if partition_epoch <= self.partition_epoch {
            return;
        }
        assert!(
            isr.contains(&self.me),
            "leader {} missing from ISR {isr:?}",
            self.me
        );
        self.partition_epoch = partition_epoch;
        self.isr = isr.to_vec();
        self.pending = None;
        if replicas != self.replicas.as_slice() {
            self.replicas = replicas.to_vec();
            self.followers.retain(|b, _| replicas.contains(b));
            for &b in replicas {
                if b != self.me {
                    self.followers.entry(b).or_insert(FollowerProgress {
                        log_end: None,
                        last_caught_up_ms: 0,
                        last_fetch_ms: 0,
                        leader_end_at_last_fetch: UNDEFINED_OFFSET,
                    });
                }
            }
        }
        self.maybe_advance_high_watermark();
    }

    /// The controller refused `rejected` (stale epochs, or an ineligible replica): if it is
    /// the pending change, forget it so that a fresh proposal can be computed.
    ///
    /// Only for the answer to the one copy of the request in flight (Kafka sends one
    /// AlterPartition per partition at a time). If other copies may still reach the
    /// controller (resends over a lossy network), one of them may yet be accepted, and
    /// forgetting it would drop a member of the maximal ISR that the controller holds —
    /// the KIP-497 hole. Then wait for metadata instead, as the simulation does.
    pub fn on_alter_rejected(&mut self, rejected: &AlterIsr) {
        if self.pending.as_ref() == Some(rejected) {
            self.pending = None;
        }
    }

    /// `acks=all` gate before appending: the ISR must have `min_insync` members. The
    /// smaller of the committed ISR and a pending shrink counts: a follower this leader
    /// already proposed to drop (it stopped fetching) cannot confirm the write, and the
    /// shrink may not commit soon — e.g. when the controller quorum lost its majority
    /// with the same brokers — so refusing now beats timing out later. Refusing is
    /// always safe.
    pub fn check_min_isr(&self, min_insync: usize) -> Result<(), NotEnoughReplicas> {
        let isr = match &self.pending {
            Some(p) if p.new_isr.len() < self.isr.len() => p.new_isr.len(),
            _ => self.isr.len(),
        };
        if isr >= min_insync {
            Ok(())
        } else {
            Err(NotEnoughReplicas { isr, min_insync })
        }
    }

    /// Where an `acks=all` batch ending at `offset_end` (exclusive) stands. Uses the
    /// committed ISR for the size check: during a pending expansion it is the smaller set
    /// (conservative), during a pending shrink the larger one, whose every member the
    /// high watermark already waited for.
    pub fn acked(&self, offset_end: Offset, min_insync: usize) -> AckState {
        if self.high_watermark < offset_end {
            AckState::Pending
        } else if self.isr.len() >= min_insync {
            AckState::Acked
        } else {
            AckState::NotEnoughReplicasAfterAppend
        }
    }

    /// High watermark = min durable log end over the maximal ISR (the leader's own durable
    /// end included); it only moves forward on a leader.
    fn maybe_advance_high_watermark(&mut self) {
        let mut candidate = self.durable_log_end;
        for b in self.maximal_isr() {
            if b == self.me {
                continue;
            }
            match self.followers.get(&b).and_then(|p| p.log_end) {
                Some(end) => candidate = candidate.min(end),
                None => return,
            }
        }
        if candidate > self.high_watermark {
            self.high_watermark = candidate;
        }
    }

    /// Kafka's in-sync test for a follower outside the ISR: it has everything committed
    /// and has gone past the start of this leader's epoch (so it truncated away any
    /// divergent suffix from older epochs).
    fn maybe_expand(&mut self, follower: BrokerId) -> Option<AlterIsr> {
        if self.pending.is_some() || self.isr.contains(&follower) {
            return None;
        }
        let end = self.followers[&follower].log_end?;
        if end < self.high_watermark || end < self.epoch_start_offset {
            return None;
        }
        let mut new_isr = self.isr.clone();
        new_isr.push(follower);
        self.propose(new_isr)
    }

    fn propose(&mut self, new_isr: Vec<BrokerId>) -> Option<AlterIsr> {
        assert!(
            new_isr.contains(&self.me),
            "a leader proposed an ISR without itself"
        );
        let alter = AlterIsr {
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            new_isr,
        };
        self.pending = Some(alter.clone());
        Some(alter)
    }
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "leader {} epoch {}/{} isr {:?} pending {:?} hw {} durable {}",
            self.me,
            self.leader_epoch,
            self.partition_epoch,
            self.isr,
            self.pending.as_ref().map(|p| &p.new_isr),
            self.high_watermark,
            self.durable_log_end
        )
    }
}

// ---------------------------------------------------------------------------------------
// Follower
// ---------------------------------------------------------------------------------------

/// What a follower does with an OffsetForLeaderEpoch answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// Truncate the local log (and the epoch cache) to this end offset.
    pub offset: Offset,
    /// `false`: the leader's epoch is unknown locally; after truncating, ask again with
    /// the new latest local epoch (KIP-279's extra round trip).
    pub complete: bool,
}

/// Kafka's truncation rule (AbstractFetcherThread, KIP-101 and KIP-279) for a follower
/// whose OffsetForLeaderEpoch request got `(response_epoch, response_end_offset)`:
///
/// - answer UNDEFINED (the leader knows no epoch ≤ ours): truncate to the local high
///   watermark — the only case that falls back to it;
/// - we know the leader's returned epoch: truncate to the smaller of the two end offsets
///   for that epoch — done;
/// - we do not (our largest epoch ≤ the leader's is older): truncate to our own end for
///   that older epoch and ask again with it (KIP-279), since the logs may diverge even
///   earlier;
/// - we know no epoch ≤ the leader's: truncate to the leader's end offset.
///
/// Never past `local_log_end`. The result may be below the local high watermark: Kafka
/// allows it (with a warning) because a correctly elected leader has every committed
/// record, so this only removes records that were never committed cluster-wide.
pub fn truncation_offset(
    cache: &LeaderEpochCache,
    local_log_end: Offset,
    local_high_watermark: Offset,
    response_epoch: LeaderEpoch,
    response_end_offset: Offset,
) -> Truncation {
    if response_end_offset == UNDEFINED_OFFSET {
        return Truncation {
            offset: local_high_watermark.min(local_log_end),
            complete: true,
        };
    }
    if response_epoch == UNDEFINED_EPOCH {
        return Truncation {
            offset: response_end_offset.min(local_log_end),
            complete: true,
        };
    }
    match cache.end_offset_for(response_epoch, local_log_end) {
        (UNDEFINED_EPOCH, _) => Truncation {
            offset: response_end_offset.min(local_log_end),
            complete: true,
        },
        (epoch, end) if epoch == response_epoch => Truncation {
            offset: response_end_offset.min(end).min(local_log_end),
            complete: true,
        },
        (_, end) => Truncation {
            offset: end.min(local_log_end),
            complete: false,
        },
    }
}

/// Where a follower is in its lifecycle for one leader epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowerPhase {
    /// Must truncate (OffsetForLeaderEpoch) before fetching.
    Truncating,
    /// Fetching records from the leader.
    Fetching,
}

/// The follower replica of one partition for one leader epoch.
#[derive(Debug, Clone)]
pub struct Follower {
    me: BrokerId,
    leader: BrokerId,
    leader_epoch: LeaderEpoch,
    phase: FollowerPhase,
    high_watermark: Offset,
    /// Simulation knob: skip truncation (breaks KIP-101).
    unsafe_skip_truncation: bool,
}

impl Follower {
    /// A follower of `leader` in `leader_epoch`; it starts by truncating.
    pub fn new(
        me: BrokerId,
        leader: BrokerId,
        leader_epoch: LeaderEpoch,
        high_watermark: Offset,
    ) -> Self {
        Self {
            me,
            leader,
            leader_epoch,
            phase: FollowerPhase::Truncating,
            high_watermark: high_watermark.max(0),
            unsafe_skip_truncation: false,
        }
    }

    /// Simulation only: go straight to fetching without truncating. Never in the broker.
    #[doc(hidden)]
    pub fn set_unsafe_skip_truncation(&mut self, on: bool) {
        self.unsafe_skip_truncation = on;
        if on {
            self.phase = FollowerPhase::Fetching;
        }
    }

    pub fn me(&self) -> BrokerId {
        self.me
    }
    pub fn leader(&self) -> BrokerId {
        self.leader
    }
    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.leader_epoch
    }
    pub fn phase(&self) -> FollowerPhase {
        self.phase
    }
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    /// The epoch to send in OffsetForLeaderEpoch: our latest local epoch (the request
    /// also carries [`leader_epoch`](Self::leader_epoch) as the current leader epoch).
    pub fn epoch_request(&self, cache: &LeaderEpochCache) -> LeaderEpoch {
        cache.latest_epoch()
    }

    /// Handles the OffsetForLeaderEpoch answer; the caller truncates its log and cache to
    /// the returned offset. When complete, the follower moves to fetching; otherwise the
    /// caller asks again. The high watermark follows a truncation below it.
    pub fn on_epoch_response(
        &mut self,
        cache: &LeaderEpochCache,
        local_log_end: Offset,
        response_epoch: LeaderEpoch,
        response_end_offset: Offset,
    ) -> Truncation {
        let t = truncation_offset(
            cache,
            local_log_end,
            self.high_watermark,
            response_epoch,
            response_end_offset,
        );
        self.high_watermark = self.high_watermark.min(t.offset);
        if t.complete {
            self.phase = FollowerPhase::Fetching;
        }
        t
    }

    /// The local log was truncated or lost its unsynced tail (crash): the high watermark
    /// cannot stay above what is held.
    pub fn on_local_truncated(&mut self, local_log_end: Offset) {
        self.high_watermark = self.high_watermark.min(local_log_end);
    }

    /// A fetch response carried the leader's high watermark and the follower has made its
    /// log durable to `durable_log_end`. The follower's high watermark is
    /// `min(leader hw, durable end)` and does not move back: a leader's answer may be
    /// older than one already seen (reordered responses) or come from a new leader whose
    /// high watermark has not caught up yet — neither un-commits anything.
    pub fn on_fetch_response(
        &mut self,
        leader_high_watermark: Offset,
        durable_log_end: Offset,
    ) -> Offset {
        let hw = leader_high_watermark.min(durable_log_end);
        if hw > self.high_watermark {
            self.high_watermark = hw;
        }
        self.high_watermark
    }
}

#[cfg(test)]
#[path = "isr_tests.rs"]
mod tests;
