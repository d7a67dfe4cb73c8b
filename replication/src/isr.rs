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
//! - [`ReplicaState`]: one partition replica as a whole: its role (one of the above, or
//!   offline), its leader-epoch cache, durable log end, the high watermark it keeps
//!   across roles and the latest metadata's leader epoch; the follower's log operations
//!   (truncate, append, reset) begin and end through it, and it serialises them with
//!   leadership changes (the partition-lock rule on the type).
//!
//! Offsets are "next offset" style: a log end offset (LEO) of 10 holds offsets 0..=9, and
//! a high watermark of 10 means offsets 0..=9 are committed.
//!
//! Durability differs from Kafka in one place: Sluice fsyncs before it acknowledges, so the
//! leader counts only its *durable* log end offset, and a follower reports (as its fetch
//! offset) only what it has made durable. Whatever the high watermark covers is therefore on
//! disk on every member of the maximal ISR, and a crash that loses unsynced writes never
//! loses a committed record. The leader serves followers its whole log, writes still
//! running included, so a follower's fetch offset may pass the leader's durable end (the
//! two writes overlap instead of following each other); the high watermark waits for
//! both.

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

    /// The epoch `offset` was written in: the newest entry starting at or below it
    /// ([`UNDEFINED_EPOCH`] if none does; Kafka's `epochForOffset`).
    pub fn epoch_for(&self, offset: Offset) -> LeaderEpoch {
        self.entries
            .iter()
            .rev()
            .find(|e| e.start_offset <= offset)
            .map_or(UNDEFINED_EPOCH, |e| e.epoch)
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
    /// Brokers the metadata says are fenced (dead, or stopping with a controlled
    /// shutdown): never proposed into the ISR (KIP-841), since the controller refuses
    /// them and, pending, they would hold the high watermark back.
    ineligible: Vec<BrokerId>,
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
            ineligible: Vec::new(),
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
        self.maximal_isr_iter().collect()
    }

    /// [`Self::maximal_isr`] without collecting it (the high watermark is judged on every
    /// durable append: an allocation there was one per produced batch).
    fn maximal_isr_iter(&self) -> impl Iterator<Item = BrokerId> + '_ {
        let pending = match (&self.pending, self.unsafe_ignore_pending_isr) {
            (Some(p), false) => p.new_isr.as_slice(),
            _ => &[],
        };
        self.isr
            .iter()
            .copied()
            .chain(pending.iter().copied().filter(|b| !self.isr.contains(b)))
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
                // A follower may be past the leader's durable end: it fetches what the
                // leader appended while the leader's own write runs.
                let at_end = p.log_end.is_some_and(|end| end >= leader_end);
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

    /// Adopts the brokers the metadata says are fenced (see `ineligible`). A pending
    /// change that adds one of them is forgotten: the controller refuses it (the fence
    /// is committed before any later copy of it), and counted in the maximal ISR it
    /// would hold the high watermark for a broker that is gone or going (a controlled
    /// shutdown's fetches made it look caught up).
    pub fn set_ineligible(&mut self, ineligible: &[BrokerId]) {
        if self.ineligible == ineligible {
            return; // a pending change never adds one of them (`maybe_expand`)
        }
        self.ineligible = ineligible.to_vec();
        let adds_ineligible = self.pending.as_ref().is_some_and(|p| {
            p.new_isr
                .iter()
                .any(|b| !self.isr.contains(b) && self.ineligible.contains(b))
        });
        if adds_ineligible {
            self.pending = None;
            self.maybe_advance_high_watermark();
        }
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
        for b in self.maximal_isr_iter() {
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
        if self.pending.is_some()
            || self.isr.contains(&follower)
            || self.ineligible.contains(&follower)
        {
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

// ---------------------------------------------------------------------------------------
// Replica state: the role plus what the shell used to keep beside it
// ---------------------------------------------------------------------------------------

/// The partition's role on this broker, as the latest adopted metadata makes it.
#[derive(Debug, Clone)]
pub enum Role {
    /// No live leader, or not a replica, or a leadership waiting for a log operation to
    /// finish ([`ReplicaState::pending_leader_epoch`]): serve nothing.
    Offline,
    Leader(Box<Leader>),
    Follower(Follower),
}

/// A follower's log operation in flight (the shell's I/O between its begin and end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOpKind {
    /// Truncating the log to `to` (after an OffsetForLeaderEpoch answer).
    Truncate { to: Offset },
    /// Appending fetched batches from `from`, then making them durable.
    Append { from: Offset },
    /// Dropping the whole log and starting it over at `to` (behind the leader's log
    /// start, Kafka's truncate-fully-and-start-at).
    Reset { to: Offset },
    /// Making the log durable past the durable end `from` (see
    /// [`ReplicaState::begin_tail_sync`]).
    Sync { from: Offset },
}

/// The ticket of a log operation: only its holder ends it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a log operation must be ended with ReplicaState::end_op"]
pub struct LogOp {
    id: u64,
    /// The leader epoch the follower fetched in when the operation began.
    pub epoch: LeaderEpoch,
    pub kind: LogOpKind,
}

/// Why a [`ReplicaState`] transition was refused. None of these is a bug: they are the
/// stale or racing inputs a shell sees (metadata moved on while its I/O ran); the shell
/// drops the work they belong to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    #[error("not the leader in epoch {epoch}")]
    NotLeader { epoch: LeaderEpoch },
    #[error("not a follower in epoch {epoch}")]
    NotFollowing { epoch: LeaderEpoch },
    #[error("the follower is not in its {expected:?} phase")]
    WrongPhase { expected: FollowerPhase },
    #[error("another log operation is in flight: {0:?}")]
    Busy(LogOpKind),
    #[error("log operation {0} is not the one in flight")]
    NotCurrentOp(u64),
    #[error("the log is at {log_end}, the operation expected {expected}")]
    LogMoved { log_end: Offset, expected: Offset },
    #[error("reset to {to} does not move past the durable end {durable}")]
    ResetBackwards { to: Offset, durable: Offset },
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

/// What adopting an assignment changed ([`ReplicaState::reconcile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reconciled {
    /// Follow this leader (a fetcher must run); `joined`: a new follower (new leader,
    /// epoch or replica), which truncates before fetching.
    pub follow: Option<(BrokerId, bool)>,
    /// The leader-epoch history changed: persist it.
    pub epochs_changed: bool,
    /// The role, the high watermark or the ISR moved: wake waiters.
    pub changed: bool,
}

/// What ending a log operation changed ([`ReplicaState::end_op`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpEnded {
    /// The durable end moved.
    pub durable_moved: bool,
    /// A leadership that waited for this operation took effect (at this epoch).
    pub leading: Option<LeaderEpoch>,
    /// The leader-epoch history changed: persist it.
    pub epochs_changed: bool,
}

/// A leadership adopted while a log operation was in flight, taken up when it ends.
#[derive(Debug, Clone)]
struct PendingLeader {
    me: BrokerId,
    assignment: crate::cluster::PartitionState,
    lag_max_ms: u64,
}

/// Everything about one partition replica that decides correctness, as one pure state
/// machine: the role ([`Leader`] / [`Follower`]), the leader-epoch history, the durable
/// log end, the high watermark kept across roles, and the leader epoch of the latest
/// metadata. The shell (src/partition/replica.rs, src/cluster/fetcher.rs, the simulation) does the I/O and
/// feeds results in; every transition checks its preconditions and returns an error for
/// stale input rather than acting on it.
///
/// ## Leadership changes and the follower's log operations (the partition lock)
///
/// A follower's truncation, append-and-flush or reset is I/O that takes a while; new
/// metadata can make this replica leader meanwhile. Kafka serialises the two with the
/// partition's lock (`makeLeader` waits for the fetcher to let go of the partition). The
/// rule here, in one place:
///
/// 1. A log operation begins only on a follower in the epoch it fetched in, and at most
///    one is in flight ([`Self::begin_truncation`], [`Self::begin_append`],
///    [`Self::begin_reset`]). A truncation lowers the durable end, the high watermark
///    and the epoch history *when it begins*, so nothing ever claims more than the log
///    may hold while the I/O runs.
/// 2. Becoming leader while an operation is in flight does not take effect then: the
///    replica is [`Role::Offline`] (serves nothing; produces get NOT_LEADER and retry)
///    until the operation ends, and [`Self::end_op`] installs the leader at the log end
///    as the I/O left it. So a leader's epoch start, durable end and high watermark are
///    never computed from a log that is still moving.
/// 3. After each await the shell ends its operation whatever happened; the new role
///    decides what the result still counts for (an append's flushed end is a fact about
///    the log and counts; its follower bookkeeping does not if the follower moved on).
///
/// No interleaving of metadata and fetcher work can therefore trip the assertions here;
/// they check only what this type alone maintains (`hw ≤ durable`, the leader's durable
/// end equal to ours, the epoch history strictly ascending).
#[derive(Debug, Clone)]
pub struct ReplicaState {
    role: Role,
    epochs: LeaderEpochCache,
    /// Log end made durable (fsync done, or accepted under an interval flush policy).
    durable: Offset,
    /// The high watermark while no role holds one.
    kept_hw: Offset,
    /// The partition's leader epoch in the latest adopted metadata (whatever the role):
    /// requests naming another epoch are fenced or unknown (KIP-320).
    known_epoch: LeaderEpoch,
    op: Option<(u64, LogOpKind)>,
    next_op: u64,
    /// The log end past the durable end that the latest truncation checked against
    /// the leader's log and kept (nothing to cut); any log operation forgets it. Only
    /// that tail may be synced and counted without truncating again
    /// ([`Self::begin_tail_sync`]): anything appended after that check (a deposed
    /// leader's late append, which the broker's leader fence refuses) was not checked.
    kept_tail: Option<Offset>,
    pending_leader: Option<PendingLeader>,
    /// Simulation knobs (see [`Leader::set_unsafe_ignore_pending_isr`] and
    /// [`Follower::set_unsafe_skip_truncation`]); never set in the broker.
    unsafe_ignore_pending_isr: bool,
    unsafe_skip_truncation: bool,
    /// Fenced brokers, for the leader this replica is or becomes
    /// ([`Leader::set_ineligible`]).
    ineligible: Vec<BrokerId>,
}

impl ReplicaState {
    /// A replica opened on a log ending at `log_end` (all of it durable: recovery kept
    /// only what was on disk), with the epoch history read back from its checkpoint and
    /// the high watermark it remembers (clamped to the log).
    pub fn new(mut epochs: LeaderEpochCache, log_end: Offset, high_watermark: Offset) -> Self {
        // The log may have lost an unsynced tail that an epoch entry points into.
        epochs.truncate_from_end(log_end);
        let s = Self {
            role: Role::Offline,
            epochs,
            durable: log_end,
            kept_hw: high_watermark.clamp(0, log_end.max(0)),
            known_epoch: -1,
            op: None,
            next_op: 1,
            kept_tail: None,
            pending_leader: None,
            unsafe_ignore_pending_isr: false,
            unsafe_skip_truncation: false,
            ineligible: Vec::new(),
        };
        s.check();
        s
    }

    /// The brokers the latest metadata says are fenced: a leader proposes none of
    /// them into the ISR, and forgets a pending change that would add one
    /// ([`Leader::set_ineligible`]).
    pub fn set_ineligible(&mut self, fenced: &[BrokerId]) {
        if self.ineligible != fenced {
            self.ineligible = fenced.to_vec();
        }
        if let Role::Leader(l) = &mut self.role {
            l.set_ineligible(fenced);
            self.check();
        }
    }

    /// Simulation only: break KIP-497 / KIP-101 in the roles this state creates.
    #[doc(hidden)]
    pub fn set_unsafe_knobs(&mut self, ignore_pending_isr: bool, skip_truncation: bool) {
        self.unsafe_ignore_pending_isr = ignore_pending_isr;
        self.unsafe_skip_truncation = skip_truncation;
    }

    /// The invariants this type maintains alone (no input can break them).
    fn check(&self) {
        let hw = self.high_watermark();
        assert!(
            hw <= self.durable,
            "high watermark {hw} above the durable end {}",
            self.durable
        );
        if let Role::Leader(l) = &self.role {
            assert_eq!(
                l.durable_log_end(),
                self.durable,
                "the leader's durable end differs from the replica's"
            );
            assert!(self.op.is_none(), "a leader with a log operation in flight");
        }
        assert!(
            self.epochs
                .entries()
                .windows(2)
                .all(|w| w[0].epoch < w[1].epoch && w[0].start_offset < w[1].start_offset),
            "leader-epoch history not strictly ascending: {:?}",
            self.epochs.entries()
        );
    }

    pub fn role(&self) -> &Role {
        &self.role
    }
    pub fn leader(&self) -> Option<&Leader> {
        match &self.role {
            Role::Leader(l) => Some(l),
            _ => None,
        }
    }
    /// The leader, for the transitions [`Leader`] owns (follower fetches, ISR checks):
    /// none of them moves the durable end.
    pub fn leader_mut(&mut self) -> Option<&mut Leader> {
        match &mut self.role {
            Role::Leader(l) => Some(l),
            _ => None,
        }
    }
    pub fn follower(&self) -> Option<&Follower> {
        match &self.role {
            Role::Follower(f) => Some(f),
            _ => None,
        }
    }
    pub fn epochs(&self) -> &LeaderEpochCache {
        &self.epochs
    }
    pub fn durable(&self) -> Offset {
        self.durable
    }
    pub fn known_epoch(&self) -> LeaderEpoch {
        self.known_epoch
    }
    /// The log operation in flight, if any.
    pub fn op_in_flight(&self) -> Option<LogOpKind> {
        self.op.map(|(_, k)| k)
    }
    /// The epoch of a leadership waiting for the operation in flight.
    pub fn pending_leader_epoch(&self) -> Option<LeaderEpoch> {
        self.pending_leader
            .as_ref()
            .map(|p| p.assignment.leader_epoch)
    }

    pub fn high_watermark(&self) -> Offset {
        match &self.role {
            Role::Leader(l) => l.high_watermark(),
            Role::Follower(f) => f.high_watermark(),
            Role::Offline => self.kept_hw,
        }
    }

    /// The leader epoch if this replica leads.
    pub fn leader_epoch(&self) -> Option<LeaderEpoch> {
        self.leader().map(|l| l.leader_epoch())
    }

    /// True while this replica follows in leader epoch `epoch`.
    pub fn follows_in(&self, epoch: LeaderEpoch) -> bool {
        matches!(&self.role, Role::Follower(f) if f.leader_epoch() == epoch)
    }

    /// KIP-320: a requester's view of the leader epoch against the latest metadata
    /// (negative: the requester does not say).
    pub fn check_known_epoch(&self, requester: LeaderEpoch) -> Result<(), FetchError> {
        let ours = self.known_epoch;
        if requester < 0 {
            return Ok(());
        }
        match requester.cmp(&ours) {
            std::cmp::Ordering::Less => Err(FetchError::FencedLeaderEpoch { requester, ours }),
            std::cmp::Ordering::Greater => Err(FetchError::UnknownLeaderEpoch { requester, ours }),
            std::cmp::Ordering::Equal => Ok(()),
        }
    }

    /// OffsetForLeaderEpoch on the leader: `(epoch, end offset)` of `epoch` in this log.
    pub fn epoch_end(
        &self,
        current_leader_epoch: LeaderEpoch,
        epoch: LeaderEpoch,
        log_end: Offset,
    ) -> Result<(LeaderEpoch, Offset), ReplicaError> {
        self.check_known_epoch(current_leader_epoch)?;
        let l = self.leader().ok_or(ReplicaError::NotLeader {
            epoch: current_leader_epoch,
        })?;
        if current_leader_epoch >= 0 {
            l.check_epoch(current_leader_epoch)?;
        }
        Ok(self.epochs.end_offset_for(epoch, log_end))
    }

    /// Records that `epoch` begins at `start` in this log (a leader's own epoch, or a
    /// fetched batch's). True if the history changed (persist it).
    fn assign_epoch(&mut self, epoch: LeaderEpoch, start: Offset) -> bool {
        self.epochs.assign(epoch, start)
    }

    /// Adopts the committed assignment `a` for this replica `me`. `log_end` is the
    /// local log's end now; `now_ms` and `lag_max_ms` start a leader.
    pub fn reconcile(
        &mut self,
        me: BrokerId,
        a: &crate::cluster::PartitionState,
        log_end: Offset,
        now_ms: u64,
        lag_max_ms: u64,
    ) -> Reconciled {
        self.known_epoch = a.leader_epoch;
        self.kept_hw = self.high_watermark();
        let mut out = Reconciled::default();
        if a.leader == me {
            if let Role::Leader(l) = &mut self.role {
                if l.leader_epoch() == a.leader_epoch {
                    l.on_metadata(a.leader_epoch, a.partition_epoch, &a.isr, &a.replicas);
                    out.changed = true;
                    self.check();
                    return out;
                }
            }
            let pending = PendingLeader {
                me,
                assignment: a.clone(),
                lag_max_ms,
            };
            if self.op.is_some() {
                // Rule 2: the leadership waits for the log operation to end.
                self.role = Role::Offline;
                self.pending_leader = Some(pending);
                out.changed = true;
                self.check();
                return out;
            }
            out.epochs_changed = self.install_leader(pending, log_end, now_ms);
            out.changed = true;
            self.check();
            return out;
        }
        self.pending_leader = None;
        if !a.replicas.contains(&me) || a.leader < 0 {
            self.role = Role::Offline;
            out.changed = true;
            self.check();
            return out;
        }
        if let Role::Follower(f) = &self.role {
            if f.leader() == a.leader && f.leader_epoch() == a.leader_epoch {
                out.follow = Some((a.leader, false));
                return out;
            }
        }
        let mut f = Follower::new(me, a.leader, a.leader_epoch, self.kept_hw);
        f.set_unsafe_skip_truncation(self.unsafe_skip_truncation);
        self.role = Role::Follower(f);
        out.follow = Some((a.leader, true));
        out.changed = true;
        self.check();
        out
    }

    /// Starts leading at the log end `log_end` (no log operation in flight). True if
    /// the epoch history changed.
    fn install_leader(&mut self, p: PendingLeader, log_end: Offset, now_ms: u64) -> bool {
        let a = &p.assignment;
        let epochs_changed = self.assign_epoch(a.leader_epoch, log_end);
        let hw = self.high_watermark();
        self.durable = self.durable.min(log_end);
        let mut l = Leader::new(LeaderInit {
            me: p.me,
            leader_epoch: a.leader_epoch,
            partition_epoch: a.partition_epoch,
            replicas: a.replicas.clone(),
            isr: a.isr.clone(),
            epoch_start_offset: log_end,
            durable_log_end: self.durable,
            high_watermark: hw.min(self.durable),
            now_ms,
            replica_lag_time_max_ms: p.lag_max_ms,
        });
        l.set_unsafe_ignore_pending_isr(self.unsafe_ignore_pending_isr);
        l.set_ineligible(&self.ineligible);
        l.on_local_durable(self.durable);
        self.role = Role::Leader(Box::new(l));
        epochs_changed
    }

    /// A leader in `epoch` made its log durable up to `end` (the log end before its
    /// flush); `log_end` is the log's end now. True if the durable end moved. Refused
    /// once the leadership moved: a deposed leader's late flush never counts.
    pub fn leader_flushed(
        &mut self,
        epoch: LeaderEpoch,
        end: Offset,
        log_end: Offset,
    ) -> Result<bool, ReplicaError> {
        let Role::Leader(l) = &mut self.role else {
            return Err(ReplicaError::NotLeader { epoch });
        };
        if l.leader_epoch() != epoch {
            return Err(ReplicaError::NotLeader { epoch });
        }
        // No truncation happens under a leader (rule 1), but clamp anyway.
        let end = end.min(log_end);
        if end <= self.durable {
            return Ok(false);
        }
        self.durable = end;
        l.on_local_durable(end);
        self.check();
        Ok(true)
    }

    fn fetching_follower(&mut self, epoch: LeaderEpoch) -> Result<&mut Follower, ReplicaError> {
        match &mut self.role {
            Role::Follower(f) if f.leader_epoch() == epoch => Ok(f),
            _ => Err(ReplicaError::NotFollowing { epoch }),
        }
    }

    fn begin(&mut self, epoch: LeaderEpoch, kind: LogOpKind) -> Result<LogOp, ReplicaError> {
        if let Some((_, busy)) = self.op {
            return Err(ReplicaError::Busy(busy));
        }
        let id = self.next_op;
        self.next_op += 1;
        self.op = Some((id, kind));
        self.kept_tail = None;
        Ok(LogOp { id, epoch, kind })
    }

    /// The OffsetForLeaderEpoch request of a truncating follower in `epoch`:
    /// `(current leader epoch, latest local epoch)`.
    pub fn epoch_request(&self) -> Option<(LeaderEpoch, LeaderEpoch)> {
        match &self.role {
            Role::Follower(f) if f.phase() == FollowerPhase::Truncating => {
                Some((f.leader_epoch(), f.epoch_request(&self.epochs)))
            }
            _ => None,
        }
    }

    /// A truncating follower in `epoch` got the OffsetForLeaderEpoch answer
    /// `(response_epoch, response_end)` with its log ending at `log_end`. `Ok(None)`:
    /// nothing to cut. `Ok(Some(op))`: truncate the log to `op.kind`'s offset, then
    /// [`Self::end_op`]; the durable end, high watermark and epoch history are already
    /// cut (rule 1).
    pub fn begin_truncation(
        &mut self,
        epoch: LeaderEpoch,
        log_end: Offset,
        response_epoch: LeaderEpoch,
        response_end: Offset,
    ) -> Result<Option<LogOp>, ReplicaError> {
        if let Some((_, busy)) = self.op {
            return Err(ReplicaError::Busy(busy));
        }
        let durable = self.durable;
        if log_end < durable {
            return Err(ReplicaError::LogMoved {
                log_end,
                expected: durable,
            });
        }
        let Self { role, epochs, .. } = self;
        let f = match role {
            Role::Follower(f) if f.leader_epoch() == epoch => f,
            _ => return Err(ReplicaError::NotFollowing { epoch }),
        };
        if f.phase() != FollowerPhase::Truncating {
            return Err(ReplicaError::WrongPhase {
                expected: FollowerPhase::Truncating,
            });
        }
        let t = f.on_epoch_response(epochs, log_end, response_epoch, response_end);
        if t.offset >= log_end {
            self.kept_tail = (t.complete && log_end > durable).then_some(log_end);
            if !t.complete {
                // Nothing to cut, but the leader named an epoch this history lacks: the
                // epochs from the log end on hold no record (one this replica led
                // without writing), and the next round must ask about an older one, or
                // it would ask the same question for ever.
                self.epochs.truncate_from_end(t.offset);
            }
            self.check();
            return Ok(None);
        }
        self.epochs.truncate_from_end(t.offset);
        self.durable = self.durable.min(t.offset);
        f_truncated(&mut self.role, t.offset);
        let op = self.begin(epoch, LogOpKind::Truncate { to: t.offset })?;
        self.check();
        Ok(Some(op))
    }

    /// Ok if this replica follows in `epoch`, is fetching, and runs no log operation.
    fn idle_fetching(&mut self, epoch: LeaderEpoch) -> Result<(), ReplicaError> {
        if let Some((_, busy)) = self.op {
            return Err(ReplicaError::Busy(busy));
        }
        if self.fetching_follower(epoch)?.phase() != FollowerPhase::Fetching {
            return Err(ReplicaError::WrongPhase {
                expected: FollowerPhase::Fetching,
            });
        }
        Ok(())
    }

    /// A fetching follower in `epoch` is about to append fetched batches to its log,
    /// which must end where its fetch asked from (`fetch_offset`, its durable end).
    pub fn begin_append(
        &mut self,
        epoch: LeaderEpoch,
        fetch_offset: Offset,
        log_end: Offset,
    ) -> Result<LogOp, ReplicaError> {
        self.idle_fetching(epoch)?;
        if log_end != fetch_offset {
            return Err(ReplicaError::LogMoved {
                log_end,
                expected: fetch_offset,
            });
        }
        self.begin(epoch, LogOpKind::Append { from: fetch_offset })
    }

    /// A fetching follower in `epoch` whose log ends past its durable end: an append
    /// that stopped before its sync (the role changed between two of its batches), or
    /// a deposed leader's last appends, whose sync no longer counted. Its fetch asks
    /// from the durable end, where the log does not end, so no append could begin there
    /// ([`ReplicaError::LogMoved`]); if the truncation that made it a fetching follower
    /// checked that tail against the leader's log and kept it, it would truncate again,
    /// forever. `Ok(Some(op))`: make the log durable, then [`Self::end_op`] with the end
    /// it synced; `Ok(None)`: the log ends at its durable end already. A tail that no
    /// truncation kept (it grew since, which the broker's leader fence should prevent) is
    /// [`ReplicaError::LogMoved`], and the follower truncates again first.
    pub fn begin_tail_sync(
        &mut self,
        epoch: LeaderEpoch,
        log_end: Offset,
    ) -> Result<Option<LogOp>, ReplicaError> {
        self.idle_fetching(epoch)?;
        if log_end <= self.durable {
            return Ok(None);
        }
        if self.kept_tail != Some(log_end) {
            return Err(ReplicaError::LogMoved {
                log_end,
                expected: self.kept_tail.unwrap_or(self.durable),
            });
        }
        let from = self.durable;
        self.begin(epoch, LogOpKind::Sync { from }).map(Some)
    }

    /// During an append: a fetched batch of leader epoch `batch_epoch` starts at `base`.
    /// True if the history changed: the shell makes it durable before appending the
    /// batch (a new epoch's entry is on disk before any record of it).
    pub fn fetched_batch(
        &mut self,
        op: &LogOp,
        batch_epoch: LeaderEpoch,
        base: Offset,
    ) -> Result<bool, ReplicaError> {
        self.current(op)?;
        if batch_epoch <= self.epochs.latest_epoch() {
            return Ok(false);
        }
        let changed = self.assign_epoch(batch_epoch, base);
        self.check();
        Ok(changed)
    }

    /// A follower whose log ends below the leader's log start drops its log and starts
    /// over at `start` (its log must still end at its durable end).
    pub fn begin_reset(
        &mut self,
        epoch: LeaderEpoch,
        start: Offset,
        log_end: Offset,
    ) -> Result<LogOp, ReplicaError> {
        if let Some((_, busy)) = self.op {
            return Err(ReplicaError::Busy(busy));
        }
        self.fetching_follower(epoch)?;
        if start <= self.durable {
            return Err(ReplicaError::ResetBackwards {
                to: start,
                durable: self.durable,
            });
        }
        if log_end != self.durable {
            return Err(ReplicaError::LogMoved {
                log_end,
                expected: self.durable,
            });
        }
        self.begin(epoch, LogOpKind::Reset { to: start })
    }

    fn current(&self, op: &LogOp) -> Result<(), ReplicaError> {
        match self.op {
            Some((id, _)) if id == op.id => Ok(()),
            _ => Err(ReplicaError::NotCurrentOp(op.id)),
        }
    }

    /// Ends the log operation `op`; the shell calls it after its I/O whatever happened
    /// (rule 3). `durable_end`: for an append, the end it appended and flushed, `None`
    /// if it did not get that far; for a truncation or a reset, `Some` if the log
    /// operation succeeded. `log_end` is the log's end now. A leadership that waited
    /// takes effect here (rule 2).
    pub fn end_op(
        &mut self,
        op: LogOp,
        durable_end: Option<Offset>,
        log_end: Offset,
        now_ms: u64,
    ) -> Result<OpEnded, ReplicaError> {
        self.current(&op)?;
        self.op = None;
        let mut out = OpEnded::default();
        match (op.kind, durable_end) {
            // Flushed and the log still ends there: a fact about the log, whatever the
            // role is now.
            (LogOpKind::Append { .. } | LogOpKind::Sync { .. }, Some(end))
                if end == log_end && end > self.durable =>
            {
                self.durable = end;
                out.durable_moved = true;
            }
            (LogOpKind::Reset { to }, Some(_)) if log_end == to => {
                // An empty log: no epoch describes any record of it any more (Kafka
                // clears the cache too). Kept, the last entry would claim the leader's
                // records that follow for an epoch they were not written in.
                self.epochs = LeaderEpochCache::new();
                out.epochs_changed = true;
                self.durable = to;
                out.durable_moved = true;
            }
            (LogOpKind::Truncate { .. }, None) | (LogOpKind::Reset { .. }, _) => {
                // Not done: the follower must not fetch from a log that may diverge.
                self.restart_truncation(op.epoch);
            }
            // Cut where the leader's log agrees: an unsynced tail below the cut (a
            // deposed leader's appends its successor holds too) is a kept tail, as if
            // the truncation had found nothing to cut there.
            (LogOpKind::Truncate { to }, Some(_))
                if log_end == to
                    && to > self.durable
                    && self.follower().is_some_and(|f| {
                        f.leader_epoch() == op.epoch && f.phase() == FollowerPhase::Fetching
                    }) =>
            {
                self.kept_tail = Some(to);
            }
            _ => {}
        }
        if let Some(p) = self.pending_leader.take() {
            out.epochs_changed |= self.install_leader(p, log_end, now_ms);
            out.leading = self.leader_epoch();
        }
        self.check();
        Ok(out)
    }

    /// A fetch response in `epoch` carried the leader's high watermark.
    pub fn fetched_high_watermark(
        &mut self,
        epoch: LeaderEpoch,
        leader_hw: Offset,
    ) -> Result<Offset, ReplicaError> {
        let durable = self.durable;
        let f = self.fetching_follower(epoch)?;
        let hw = f.on_fetch_response(leader_hw, durable);
        self.check();
        Ok(hw)
    }

    /// The log's start moved to `start` (the leader's, followed, or retention): the
    /// epoch history follows it.
    pub fn log_start_moved(&mut self, start: Offset) {
        self.epochs.truncate_from_start(start);
        self.check();
    }

    /// Back to OffsetForLeaderEpoch before any further fetch (same leader and epoch).
    pub fn restart_truncation(&mut self, epoch: LeaderEpoch) {
        if let Role::Follower(f) = &mut self.role {
            if f.leader_epoch() == epoch {
                let mut fresh =
                    Follower::new(f.me(), f.leader(), f.leader_epoch(), f.high_watermark());
                fresh.set_unsafe_skip_truncation(self.unsafe_skip_truncation);
                *f = fresh;
            }
        }
    }
}

/// The follower's high watermark follows a cut below it.
fn f_truncated(role: &mut Role, to: Offset) {
    if let Role::Follower(f) = role {
        f.on_local_truncated(to);
    }
}

#[cfg(test)]
#[path = "isr_tests.rs"]
mod tests;
