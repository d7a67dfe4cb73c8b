//! Incremental fetch sessions (KIP-227): the per-shard session cache, sans I/O.
//!
//! A Fetch request (v7+) names a session id and epoch:
//! - epoch -1: a full fetch without a session (an id given closes that session);
//! - epoch 0: a full fetch that asks for a new session (an id given closes that one
//!   first); the response carries the new session's id, or 0 when the cache has no
//!   room, and the session then expects epoch 1;
//! - epoch > 0: an incremental fetch in session `id`: the request lists only the
//!   partitions added or changed (fetch offset, log start, max bytes, leader epochs)
//!   and `forgotten_topics_data` the ones removed; the broker reads every partition of
//!   the session (a large follower session: only those that changed, see [`Reads`])
//!   and answers only those with something new: records, a high watermark,
//!   last stable offset or log start offset that changed since the last answer, an
//!   error, or a preferred read replica. An unknown id is FETCH_SESSION_ID_NOT_FOUND, an
//!   epoch other than the expected one INVALID_FETCH_SESSION_EPOCH, a Fetch version on
//!   the other side of v13 (topic ids) than the session's FETCH_SESSION_TOPIC_ID_ERROR;
//!   a session whose last partition is forgotten is closed (the response says id 0).
//!
//! The answered partitions of an incremental fetch that returned records move to the
//! end of the session's order, so the response byte budget rotates over partitions
//! (as Kafka does). Unlike Kafka, a change of the last stable offset alone is answered
//! too (Kafka compares only the high watermark and log start): a read_committed
//! consumer learns of an aborted transaction's end at once.
//!
//! The cache is bounded (Kafka's `max.incremental.fetch.session.cache.slots`, split
//! over the shards) with Kafka's eviction rules: a new session may take the slot of a
//! session unused for longer than the eviction time (the least recently used first);
//! else of the least valuable evictable one — a follower's (privileged) session may
//! evict any consumer's session and any session older than the eviction time with no
//! more partitions than its own; a consumer's session only sessions older than the
//! eviction time, with fewer or as many partitions, that are not followers'. Otherwise
//! the fetch is answered without a session (id 0) and the client keeps fetching in full.
//!
//! Each shard has its own cache and its session ids are `shard + shards * k`, so an id
//! names the shard that made it: a client whose connection lands on another shard gets
//! FETCH_SESSION_ID_NOT_FOUND (and opens a new session there), and closing an id of
//! another shard closes nothing. Time is an argument (milliseconds).

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use kafka_protocol::error::ResponseError;
use uuid::Uuid;

use crate::base::ids::{LeaderEpoch, Offset};

/// Kafka's `max.incremental.fetch.session.cache.slots` default.
pub const DEFAULT_CACHE_SLOTS: usize = 1000;
/// Kafka's `min.incremental.fetch.session.eviction.ms` (a session this old, or unused
/// this long, may be evicted).
pub const EVICTION_MS: u64 = 120_000;
/// A follower's session of this many partitions or more reads, on an incremental
/// fetch, only what changed (see [`Reads::Changed`]).
pub const FEED_MIN_PARTS: usize = 32;
/// Such a session still reads all its partitions this often: a net under the change
/// feed, and how a follower's progress on partitions it did not list is refreshed.
pub const FEED_SWEEP_MS: u64 = 1_000;

/// A partition of a session: by topic name (Fetch v7–v12) or topic id (v13+).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TopicKey {
    Name(std::sync::Arc<str>),
    Id(Uuid),
}

pub type PartKey = (TopicKey, i32);

/// What a request says about one partition (what the session remembers of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartReq {
    pub fetch_offset: Offset,
    pub log_start_offset: Offset,
    pub max_bytes: i32,
    pub current_leader_epoch: LeaderEpoch,
    pub last_fetched_epoch: LeaderEpoch,
}

/// What one partition's answer says, as far as sessions care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartResp {
    pub high_watermark: Offset,
    pub last_stable_offset: Offset,
    pub log_start_offset: Offset,
    pub error: bool,
    pub has_records: bool,
    pub preferred_replica: bool,
    /// Records were there for this fetch but the response had no room for them.
    pub pending: bool,
}

struct Cached {
    req: PartReq,
    /// Position in the session's order.
    seq: u64,
    /// As last answered (-1: never, or the last answer was an error: answer again).
    high_watermark: Offset,
    last_stable_offset: Offset,
    log_start_offset: Offset,
}

struct Session {
    /// The epoch the next incremental request must carry.
    epoch: i32,
    privileged: bool,
    uses_topic_ids: bool,
    created_ms: u64,
    last_used_ms: u64,
    parts: HashMap<PartKey, Cached>,
    order: BTreeMap<u64, PartKey>,
    next_seq: u64,
    /// A large follower session's position in each shard's change feed as of its last
    /// answer (`None`: the next incremental fetch reads every partition).
    feed: Option<Vec<u64>>,
    /// When it last read every partition.
    swept_ms: u64,
    /// Partitions the next incremental fetch reads whatever the feed says: their last
    /// answer was an error, carried records, or had no room for records.
    sticky: HashSet<PartKey>,
}

impl Session {
    fn add(&mut self, key: PartKey, req: PartReq) {
        if let Some(c) = self.parts.get_mut(&key) {
            c.req = req;
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key.clone());
        self.parts.insert(
            key,
            Cached {
                req,
                seq,
                high_watermark: Offset::NONE,
                last_stable_offset: Offset::NONE,
                log_start_offset: Offset::NONE,
            },
        );
    }

    fn forget(&mut self, key: &PartKey) {
        if let Some(c) = self.parts.remove(key) {
            self.order.remove(&c.seq);
        }
        self.sticky.remove(key);
    }

    /// Every partition with what the session remembers of its request, in order.
    fn in_order(&self) -> Vec<(PartKey, PartReq)> {
        self.order
            .values()
            .map(|k| (k.clone(), self.parts[k].req))
            .collect()
    }

    /// Whether an incremental fetch reads only what changed.
    fn reads_changes(&self) -> bool {
        self.privileged && self.parts.len() >= FEED_MIN_PARTS
    }

    fn move_to_end(&mut self, key: &PartKey) {
        let seq = self.next_seq;
        if let Some(c) = self.parts.get_mut(key) {
            self.order.remove(&c.seq);
            c.seq = seq;
            self.order.insert(seq, key.clone());
            self.next_seq += 1;
        }
    }

    /// Kafka's EvictableKey: (privileged, size, id), smallest evicted first.
    fn evictable_key(&self, id: i32) -> (bool, usize, i32) {
        (self.privileged, self.parts.len(), id)
    }
}

/// How a Fetch request is to be served.
#[derive(Debug, PartialEq, Eq)]
pub enum Context {
    /// A full fetch; after it, no session (epoch -1 or a version before v7).
    Sessionless,
    /// A full fetch that may open a session: call [`Cache::open`] with its answers.
    Full,
    /// An incremental fetch: read the partitions `reads` says, then filter the
    /// answers with [`Cache::answered`].
    Incremental {
        id: i32,
        /// The session's epoch after this request (checked again when answering).
        epoch: i32,
        reads: Reads,
    },
    /// The whole request fails with this error (no partitions, session id 0).
    Error(ResponseError),
}

/// What an incremental fetch reads.
#[derive(Debug, PartialEq, Eq)]
pub enum Reads {
    /// Every partition of the session, in its order (as Kafka). `mark`: a large
    /// follower session's sweep: note the shards' change-feed positions before the
    /// read and give them to [`Cache::answered`].
    All {
        parts: Vec<(PartKey, PartReq)>,
        mark: bool,
    },
    /// A large follower session between sweeps: `must` (the partitions the request
    /// listed, and those whose last answer had more to say) and the partitions of the
    /// session that changed on their shard after `positions` (the shards' change
    /// feeds, by shard index; see `crate::partition::changes`). A partition that did
    /// not change answers what it answered last, so leaving it out is what an
    /// incremental answer does anyway. [`Cache::select`] turns keys into partitions
    /// to read.
    Changed {
        positions: Vec<u64>,
        must: Vec<PartKey>,
        /// The session keys topics by id (Fetch v13+).
        by_id: bool,
    },
}

/// A large follower session's feed positions to remember with its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedMark {
    pub positions: Vec<u64>,
    /// Every partition was read (a sweep).
    pub swept: bool,
}

/// Kafka's next epoch: 1 after `i32::MAX`.
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// One shard's fetch session cache.
pub struct Cache {
    max_entries: usize,
    eviction_ms: u64,
    shard: u32,
    shards: u32,
    sessions: HashMap<i32, Session>,
    /// (last used, id): the least recently used first.
    last_used: BTreeSet<(u64, i32)>,
    evictions: u64,
}

impl Cache {
    /// A cache of `max_entries` sessions for shard `shard` of `shards`.
    pub fn new(max_entries: usize, eviction_ms: u64, shard: u32, shards: u32) -> Cache {
        assert!(shards > 0 && shard < shards);
        Cache {
            max_entries,
            eviction_ms,
            shard,
            shards,
            sessions: HashMap::new(),
            last_used: BTreeSet::new(),
            evictions: 0,
        }
    }

    /// Sessions cached now.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Partitions cached over all sessions.
    pub fn partitions(&self) -> usize {
        self.sessions.values().map(|s| s.parts.len()).sum()
    }

    /// Sessions evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Decides how a request is served; for an incremental one, applies its added,
    /// changed and forgotten partitions to the session and advances its epoch.
    /// Fetch v13+ sessions key topics by id.
    pub fn context(
        &mut self,
        version: i16,
        session_id: i32,
        epoch: i32,
        parts: &[(PartKey, PartReq)],
        forgotten: &[PartKey],
        now_ms: u64,
    ) -> Context {
        if version < 7 {
            return Context::Sessionless;
        }
        if epoch == 0 || epoch == -1 {
            // Any session a full fetch names is closed.
            if session_id != 0 {
                self.remove(session_id);
            }
            return if epoch == -1 {
                Context::Sessionless
            } else {
                Context::Full
            };
        }
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return Context::Error(ResponseError::FetchSessionIdNotFound);
        };
        if session.epoch != epoch {
            return Context::Error(ResponseError::InvalidFetchSessionEpoch);
        }
        if session.uses_topic_ids != (version >= 13) {
            return Context::Error(ResponseError::FetchSessionTopicIdError);
        }
        for (key, req) in parts {
            session.add(key.clone(), *req);
        }
        for key in forgotten {
            session.forget(key);
        }
        if session.parts.is_empty() {
            self.remove(session_id);
            return Context::Sessionless;
        }
        session.epoch = next_epoch(session.epoch);
        let epoch = session.epoch;
        let reads = match &session.feed {
            Some(positions)
                if session.reads_changes()
                    && now_ms.saturating_sub(session.swept_ms) < FEED_SWEEP_MS =>
            {
                let mut must: Vec<PartKey> = parts
                    .iter()
                    .map(|(k, _)| k)
                    .filter(|k| session.parts.contains_key(*k))
                    .cloned()
                    .collect();
                must.extend(session.sticky.iter().cloned());
                Reads::Changed {
                    positions: positions.clone(),
                    must,
                    by_id: session.uses_topic_ids,
                }
            }
            _ => Reads::All {
                parts: session.in_order(),
                mark: session.reads_changes(),
            },
        };
        self.touch(session_id, now_ms);
        Context::Incremental {
            id: session_id,
            epoch,
            reads,
        }
    }

    /// After a full fetch ([`Context::Full`]) was answered: opens a session of its
    /// partitions if the cache has room (or can evict), returning its id, else 0.
    pub fn open(
        &mut self,
        privileged: bool,
        uses_topic_ids: bool,
        answered: &[(PartKey, PartReq, PartResp)],
        now_ms: u64,
    ) -> i32 {
        if self.sessions.len() >= self.max_entries
            && !self.try_evict(privileged, answered.len(), now_ms)
        {
            return 0;
        }
        let mut session = Session {
            epoch: 1,
            privileged,
            uses_topic_ids,
            created_ms: now_ms,
            last_used_ms: now_ms,
            parts: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            feed: None,
            swept_ms: now_ms,
            sticky: HashSet::new(),
        };
        for (key, req, resp) in answered {
            session.add(key.clone(), *req);
            remember(session.parts.get_mut(key).expect("added"), resp);
        }
        let id = self.new_id();
        self.last_used.insert((now_ms, id));
        self.sessions.insert(id, session);
        // Room was made above; every session is in the recency order once, under an
        // id of this shard's residue class.
        assert!(
            self.sessions.len() <= self.max_entries
                && self.last_used.len() == self.sessions.len()
                && self.is_mine(id),
            "fetch session cache over its {} entries, or out of step with its recency order",
            self.max_entries
        );
        id
    }

    /// After an incremental fetch was read: which answers to send (true) — the rest
    /// have nothing new. Remembers what is sent. Err(INVALID_FETCH_SESSION_EPOCH) if
    /// another request of the session came in meanwhile (a duplicate); `None` if the
    /// session is gone (evicted meanwhile): send everything.
    /// `feed`: the feed positions noted before a large follower session's read
    /// ([`Reads`]); `None` makes its next incremental fetch read everything.
    pub fn answered(
        &mut self,
        id: i32,
        epoch: i32,
        answers: &[(PartKey, PartResp)],
        feed: Option<FeedMark>,
        now_ms: u64,
    ) -> Result<Option<Vec<bool>>, ResponseError> {
        let Some(session) = self.sessions.get_mut(&id) else {
            return Ok(None);
        };
        if session.epoch != epoch {
            return Err(ResponseError::InvalidFetchSessionEpoch);
        }
        if feed.as_ref().is_some_and(|f| f.swept) {
            session.swept_ms = now_ms;
        }
        session.feed = feed.map(|f| f.positions);
        let mut keep = Vec::with_capacity(answers.len());
        for (key, resp) in answers {
            let Some(c) = session.parts.get_mut(key) else {
                keep.push(true);
                continue;
            };
            let send = resp.has_records
                || resp.error
                || resp.preferred_replica
                || c.high_watermark != resp.high_watermark
                || c.last_stable_offset != resp.last_stable_offset
                || c.log_start_offset != resp.log_start_offset;
            remember(c, resp);
            if resp.has_records {
                session.move_to_end(key);
            }
            if resp.error || resp.has_records || resp.pending {
                session.sticky.insert(key.clone());
            } else {
                session.sticky.remove(key);
            }
            keep.push(send);
        }
        Ok(Some(keep))
    }

    /// The partitions of session `id` among `keys` (each once), in the session's
    /// order, with what the session remembers of their requests.
    pub fn select(
        &self,
        id: i32,
        keys: impl IntoIterator<Item = PartKey>,
    ) -> Vec<(PartKey, PartReq)> {
        let Some(session) = self.sessions.get(&id) else {
            return Vec::new();
        };
        let mut picked: BTreeMap<u64, (PartKey, PartReq)> = BTreeMap::new();
        for key in keys {
            if let Some(c) = session.parts.get(&key) {
                picked.entry(c.seq).or_insert((key, c.req));
            }
        }
        picked.into_values().collect()
    }

    /// Every partition of session `id`, in its order.
    pub fn all(&self, id: i32) -> Vec<(PartKey, PartReq)> {
        self.sessions
            .get(&id)
            .map_or_else(Vec::new, Session::in_order)
    }

    /// Kafka's tryEvict (see the module docs). True if a slot was freed.
    fn try_evict(&mut self, privileged: bool, size: usize, now_ms: u64) -> bool {
        let Some(&(used, oldest)) = self.last_used.first() else {
            return false;
        };
        if now_ms.saturating_sub(used) > self.eviction_ms {
            self.remove(oldest);
            self.evictions += 1;
            return true;
        }
        let eviction_ms = self.eviction_ms;
        let old = |s: &Session| now_ms.saturating_sub(s.created_ms) > eviction_ms;
        let candidate = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                if privileged {
                    !s.privileged || old(s)
                } else {
                    old(s)
                }
            })
            .map(|(id, s)| s.evictable_key(*id))
            .min();
        match candidate {
            Some(key) if (privileged, size, 0) >= key => {
                self.remove(key.2);
                self.evictions += 1;
                true
            }
            _ => false,
        }
    }

    fn touch(&mut self, id: i32, now_ms: u64) {
        if let Some(s) = self.sessions.get_mut(&id) {
            self.last_used.remove(&(s.last_used_ms, id));
            s.last_used_ms = now_ms;
            self.last_used.insert((now_ms, id));
        }
        assert_eq!(
            self.last_used.len(),
            self.sessions.len(),
            "recency order out of step"
        );
    }

    fn remove(&mut self, id: i32) -> bool {
        match self.sessions.remove(&id) {
            Some(s) => {
                self.last_used.remove(&(s.last_used_ms, id));
                assert_eq!(
                    self.last_used.len(),
                    self.sessions.len(),
                    "recency order out of step"
                );
                true
            }
            None => false,
        }
    }

    /// A random id of this shard's residue class, not in use and never 0.
    fn new_id(&self) -> i32 {
        let span = (i32::MAX as u32 - self.shard) / self.shards;
        loop {
            let k = 1 + (Uuid::new_v4().as_u128() as u32) % span;
            let id = (self.shard + self.shards * k) as i32;
            if id > 0 && !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    /// Whether `id` could have been made by this shard's cache.
    pub fn is_mine(&self, id: i32) -> bool {
        id > 0 && (id as u32) % self.shards == self.shard
    }
}

/// Records what was answered; an error clears the high watermark so the partition is
/// answered again once the error is gone.
fn remember(c: &mut Cached, resp: &PartResp) {
    c.high_watermark = if resp.error {
        Offset::NONE
    } else {
        resp.high_watermark
    };
    c.last_stable_offset = resp.last_stable_offset;
    c.log_start_offset = resp.log_start_offset;
}

/// The fetching side of a session (Kafka's FetchSessionHandler): what the next
/// request to one leader says, from the partitions to fetch now and the answers so far.
#[derive(Debug, Default)]
pub struct Handler {
    session_id: i32,
    /// 0: the next request is full (and asks for a session; closing `session_id`).
    epoch: i32,
    /// The session's partitions as the leader was last told them.
    sent: HashMap<PartKey, PartReq>,
}

/// One request's session fields and partitions.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub session_id: i32,
    pub epoch: i32,
    /// Full: every partition; incremental: the added and changed ones.
    pub to_send: Vec<(PartKey, PartReq)>,
    pub forgotten: Vec<PartKey>,
}

impl Handler {
    /// The next request for the partitions `next` (in the order to send them).
    pub fn build(&mut self, next: &[(PartKey, PartReq)]) -> Request {
        let full = self.epoch == 0;
        let (to_send, forgotten) = if full {
            (next.to_vec(), Vec::new())
        } else {
            let now: HashMap<&PartKey, &PartReq> = next.iter().map(|(k, r)| (k, r)).collect();
            let to_send = next
                .iter()
                .filter(|(k, r)| self.sent.get(k) != Some(r))
                .cloned()
                .collect();
            let mut forgotten: Vec<PartKey> = self
                .sent
                .keys()
                .filter(|k| !now.contains_key(k))
                .cloned()
                .collect();
            forgotten.sort();
            (to_send, forgotten)
        };
        self.sent = next.iter().cloned().collect();
        Request {
            session_id: self.session_id,
            epoch: self.epoch,
            to_send,
            forgotten,
        }
    }

    /// Whether the next request is full: [`Self::build`] must be given every partition.
    pub fn is_full(&self) -> bool {
        self.epoch == 0
    }

    /// The next incremental request when the caller knows which partitions differ from
    /// what the leader was last told: `changed` (added, or a new fetch position) and
    /// `forgotten` (left); every other partition stays as sent. What [`Self::build`]
    /// would make of the whole list, without going over it (a follower's session has
    /// thousands of partitions and a few change per round).
    pub fn build_changed(
        &mut self,
        changed: Vec<(PartKey, PartReq)>,
        mut forgotten: Vec<PartKey>,
    ) -> Request {
        assert!(!self.is_full(), "a full request needs every partition");
        for key in &forgotten {
            self.sent.remove(key);
        }
        for (key, req) in &changed {
            self.sent.insert(key.clone(), *req);
        }
        forgotten.sort();
        Request {
            session_id: self.session_id,
            epoch: self.epoch,
            to_send: changed,
            forgotten,
        }
    }

    /// The leader's answer: its top-level error code and session id. False if the
    /// answer is an error: the next request is full.
    pub fn answered(&mut self, error_code: i16, session_id: i32) -> bool {
        if error_code != 0 {
            // An unknown session is gone; any other error closes it with the next fetch.
            if error_code == ResponseError::FetchSessionIdNotFound.code() {
                self.session_id = 0;
            }
            self.epoch = 0;
            return false;
        }
        if session_id == 0 {
            // No session (no room, or the leader closed it): full fetches, asking again.
            self.session_id = 0;
            self.epoch = 0;
        } else if self.epoch == 0 {
            self.session_id = session_id;
            self.epoch = 1;
        } else {
            self.epoch = next_epoch(self.epoch);
        }
        true
    }

    /// The request failed without an answer (connection lost, abandoned): the next
    /// request is full and closes the session.
    pub fn failed(&mut self) {
        self.epoch = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str, p: i32) -> PartKey {
        (TopicKey::Name(t.into()), p)
    }

    fn req(offset: i64) -> PartReq {
        PartReq {
            fetch_offset: Offset::new(offset),
            log_start_offset: Offset::ZERO,
            max_bytes: 1 << 20,
            current_leader_epoch: LeaderEpoch::new(0),
            last_fetched_epoch: LeaderEpoch::NONE,
        }
    }

    fn resp(hw: i64) -> PartResp {
        PartResp {
            high_watermark: Offset::new(hw),
            last_stable_offset: Offset::new(hw),
            log_start_offset: Offset::ZERO,
            error: false,
            has_records: false,
            preferred_replica: false,
            pending: false,
        }
    }

    /// A full fetch of `n` partitions of topic `t`, answered with hw 5: the session id.
    fn open(c: &mut Cache, t: &str, n: i32, privileged: bool, now: u64) -> i32 {
        assert_eq!(c.context(12, 0, 0, &[], &[], now), Context::Full);
        let answered: Vec<_> = (0..n).map(|p| (key(t, p), req(0), resp(5))).collect();
        c.open(privileged, false, &answered, now)
    }

    fn incremental(c: &mut Cache, id: i32, epoch: i32, now: u64) -> Context {
        c.context(12, id, epoch, &[], &[], now)
    }

    #[test]
    fn epochs_advance_and_errors_are_kafkas() {
        let mut c = Cache::new(10, EVICTION_MS, 0, 1);
        // Before v7 and epoch -1: no session.
        assert_eq!(c.context(6, 0, 0, &[], &[], 0), Context::Sessionless);
        assert_eq!(c.context(12, 0, -1, &[], &[], 0), Context::Sessionless);
        let id = open(&mut c, "t", 3, false, 0);
        assert!(id > 0);
        assert_eq!(c.len(), 1);
        let Context::Incremental {
            epoch,
            reads: Reads::All { parts, .. },
            ..
        } = incremental(&mut c, id, 1, 1)
        else {
            panic!("expected an incremental context");
        };
        assert_eq!(epoch, 2);
        assert_eq!(parts.len(), 3);
        // A replayed epoch, a skipped one, an unknown id.
        assert_eq!(
            incremental(&mut c, id, 1, 2),
            Context::Error(ResponseError::InvalidFetchSessionEpoch)
        );
        assert_eq!(
            incremental(&mut c, id, 3, 2),
            Context::Error(ResponseError::InvalidFetchSessionEpoch)
        );
        assert_eq!(
            incremental(&mut c, id + 1, 2, 2),
            Context::Error(ResponseError::FetchSessionIdNotFound)
        );
        // The session's Fetch version side of v13 is kept.
        assert_eq!(
            c.context(13, id, 2, &[], &[], 2),
            Context::Error(ResponseError::FetchSessionTopicIdError)
        );
        assert!(matches!(
            incremental(&mut c, id, 2, 3),
            Context::Incremental { epoch: 3, .. }
        ));
        // A full fetch naming the session closes it.
        assert_eq!(c.context(12, id, 0, &[], &[], 4), Context::Full);
        assert_eq!(c.len(), 0);
        assert_eq!(
            incremental(&mut c, id, 3, 5),
            Context::Error(ResponseError::FetchSessionIdNotFound)
        );
    }

    #[test]
    fn the_epoch_wraps_to_one() {
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(1), 2);
    }

    #[test]
    fn only_changed_partitions_are_answered() {
        let mut c = Cache::new(10, EVICTION_MS, 0, 1);
        let id = open(&mut c, "t", 4, true, 0);
        let Context::Incremental {
            epoch,
            reads: Reads::All { parts, .. },
            ..
        } = incremental(&mut c, id, 1, 1)
        else {
            panic!()
        };
        let keys: Vec<PartKey> = parts.iter().map(|(k, _)| k.clone()).collect();
        // p0 unchanged, p1 new records, p2 hw moved, p3 error.
        let mut with_records = resp(5);
        with_records.has_records = true;
        let mut failed = resp(5);
        failed.error = true;
        let answers = vec![
            (keys[0].clone(), resp(5)),
            (keys[1].clone(), with_records),
            (keys[2].clone(), resp(6)),
            (keys[3].clone(), failed),
        ];
        let keep = c.answered(id, epoch, &answers, None, 0).unwrap().unwrap();
        assert_eq!(keep, vec![false, true, true, true]);
        // Next time: the errored one is answered again once healthy, the rest are quiet;
        // the partition that returned records moved to the end of the order.
        let Context::Incremental {
            epoch,
            reads: Reads::All { parts, .. },
            ..
        } = incremental(&mut c, id, 2, 2)
        else {
            panic!()
        };
        let order: Vec<i32> = parts.iter().map(|(k, _)| k.1).collect();
        assert_eq!(order, vec![0, 2, 3, 1]);
        let answers = vec![
            (key("t", 0), resp(5)),
            (key("t", 2), resp(6)),
            (key("t", 3), resp(5)),
            (key("t", 1), resp(5)),
        ];
        let keep = c.answered(id, epoch, &answers, None, 0).unwrap().unwrap();
        assert_eq!(keep, vec![false, false, true, false]);
        // The last stable offset or the log start moving is news too.
        let Context::Incremental { epoch, .. } = incremental(&mut c, id, 3, 3) else {
            panic!()
        };
        let mut lso = resp(5);
        lso.last_stable_offset = Offset::new(4);
        let mut start = resp(6);
        start.log_start_offset = Offset::new(2);
        let answers = vec![(key("t", 0), lso), (key("t", 2), start)];
        let keep = c.answered(id, epoch, &answers, None, 0).unwrap().unwrap();
        assert_eq!(keep, vec![true, true]);
    }

    /// Whether `ctx` is an incremental read of every partition, and if so its mark.
    fn reads_all(ctx: &Context) -> Option<bool> {
        match ctx {
            Context::Incremental {
                reads: Reads::All { mark, .. },
                ..
            } => Some(*mark),
            _ => None,
        }
    }

    #[test]
    fn a_large_follower_session_reads_what_changed_between_sweeps() {
        let mut c = Cache::new(10, EVICTION_MS, 0, 1);
        let n = FEED_MIN_PARTS as i32;
        // A consumer's session, however large, and a small follower's read everything.
        let consumer = open(&mut c, "c", n, false, 0);
        let small = open(&mut c, "s", n - 1, true, 0);
        for id in [consumer, small] {
            let ctx = incremental(&mut c, id, 1, 1);
            assert_eq!(reads_all(&ctx), Some(false), "{ctx:?}");
        }
        let id = open(&mut c, "t", n, true, 0);
        // No feed position yet: everything, positions to be noted.
        let Context::Incremental {
            epoch,
            reads: Reads::All { parts, mark: true },
            ..
        } = incremental(&mut c, id, 1, 10)
        else {
            panic!("expected a sweep");
        };
        assert_eq!(parts.len(), n as usize);
        let mut answers: Vec<_> = parts.iter().map(|(k, _)| (k.clone(), resp(5))).collect();
        answers[3].1.has_records = true;
        answers[4].1.error = true;
        answers[5].1.pending = true;
        let mark = FeedMark {
            positions: vec![7, 9],
            swept: true,
        };
        c.answered(id, epoch, &answers, Some(mark), 10)
            .unwrap()
            .unwrap();
        // Next: the positions, the listed partition and the three with more to say.
        let listed = (key("t", 20), req(3));
        let ctx = c.context(12, id, epoch, std::slice::from_ref(&listed), &[], 20);
        let Context::Incremental {
            epoch,
            reads:
                Reads::Changed {
                    positions,
                    must,
                    by_id: false,
                },
            ..
        } = ctx
        else {
            panic!("expected a read of changes: {ctx:?}");
        };
        assert_eq!(positions, vec![7, 9]);
        let mut must_sorted = must.clone();
        must_sorted.sort();
        assert_eq!(
            must_sorted,
            vec![key("t", 3), key("t", 4), key("t", 5), key("t", 20)]
        );
        // Selected in the session's order (partition 3 moved to its end with its
        // records), each once, unknown keys dropped, with the session's requests.
        let picked = c.select(
            id,
            must.into_iter()
                .chain([key("t", 1), key("t", 1), key("nope", 0)]),
        );
        let order: Vec<i32> = picked.iter().map(|(k, _)| k.1).collect();
        assert_eq!(order, vec![1, 4, 5, 20, 3]);
        assert_eq!(picked[3].1.fetch_offset.get(), 3);
        // Answered quietly: nothing sticks, and without a mark the next reads all.
        let quiet: Vec<_> = picked.iter().map(|(k, _)| (k.clone(), resp(5))).collect();
        let mark = FeedMark {
            positions: vec![8, 9],
            swept: false,
        };
        c.answered(id, epoch, &quiet, Some(mark), 20)
            .unwrap()
            .unwrap();
        let Context::Incremental {
            epoch,
            reads: Reads::Changed { must, .. },
            ..
        } = incremental(&mut c, id, epoch, 30)
        else {
            panic!("expected a read of changes");
        };
        assert!(must.is_empty(), "{must:?}");
        c.answered(id, epoch, &[], None, 30).unwrap().unwrap();
        let Context::Incremental {
            epoch,
            reads: Reads::All { mark: true, .. },
            ..
        } = incremental(&mut c, id, epoch, 40)
        else {
            panic!("expected a sweep after an answer without positions");
        };
        // And a sweep once FEED_SWEEP_MS passed since the last one.
        let mark = FeedMark {
            positions: vec![9, 9],
            swept: false,
        };
        c.answered(id, epoch, &[], Some(mark), 40).unwrap().unwrap();
        let later = 10 + FEED_SWEEP_MS;
        let ctx = incremental(&mut c, id, epoch, later);
        assert_eq!(reads_all(&ctx), Some(true), "{ctx:?}");
    }

    #[test]
    fn a_duplicate_request_is_refused_when_answered() {
        let mut c = Cache::new(10, EVICTION_MS, 0, 1);
        let id = open(&mut c, "t", 1, false, 0);
        let Context::Incremental { epoch: first, .. } = incremental(&mut c, id, 1, 1) else {
            panic!()
        };
        // The next request came in before the first was answered.
        assert!(matches!(
            incremental(&mut c, id, 2, 1),
            Context::Incremental { .. }
        ));
        assert_eq!(
            c.answered(id, first, &[(key("t", 0), resp(5))], None, 0),
            Err(ResponseError::InvalidFetchSessionEpoch)
        );
    }

    #[test]
    fn added_changed_and_forgotten_partitions_update_the_session() {
        let mut c = Cache::new(10, EVICTION_MS, 0, 1);
        let id = open(&mut c, "t", 2, false, 0);
        let ctx = c.context(
            12,
            id,
            1,
            &[(key("t", 0), req(7)), (key("u", 0), req(0))],
            &[key("t", 1)],
            1,
        );
        let Context::Incremental {
            epoch,
            reads: Reads::All { parts, .. },
            ..
        } = ctx
        else {
            panic!()
        };
        assert_eq!(parts, vec![(key("t", 0), req(7)), (key("u", 0), req(0))]);
        // The added partition is answered the first time even with nothing new.
        let answers = vec![(key("t", 0), resp(5)), (key("u", 0), resp(0))];
        let keep = c.answered(id, epoch, &answers, None, 0).unwrap().unwrap();
        assert_eq!(keep, vec![false, true]);
        assert_eq!(c.partitions(), 2);
        // Forgetting every partition closes the session.
        let ctx = c.context(12, id, 2, &[], &[key("t", 0), key("u", 0)], 2);
        assert_eq!(ctx, Context::Sessionless);
        assert!(c.is_empty());
    }

    #[test]
    fn a_full_cache_evicts_by_kafkas_rules() {
        let e = EVICTION_MS;
        let mut c = Cache::new(2, e, 0, 1);
        let consumer = open(&mut c, "a", 5, false, 0);
        let follower = open(&mut c, "b", 5, true, 0);
        assert!(consumer > 0 && follower > 0);
        // Full and both young: another consumer gets no session.
        assert_eq!(open(&mut c, "c", 100, false, 10), 0);
        // A follower evicts a consumer's session at any age.
        let follower2 = open(&mut c, "d", 1, true, 10);
        assert!(follower2 > 0);
        assert_eq!(c.evictions(), 1);
        assert_eq!(
            incremental(&mut c, consumer, 1, 11),
            Context::Error(ResponseError::FetchSessionIdNotFound)
        );
        // Both followers' sessions are used, so none is stale. A consumer never evicts a
        // follower's session; once older than the eviction time, a follower's session
        // with more partitions evicts the smallest one.
        let now = e + 20;
        assert!(matches!(
            incremental(&mut c, follower, 1, now),
            Context::Incremental { .. }
        ));
        assert!(matches!(
            incremental(&mut c, follower2, 1, now),
            Context::Incremental { .. }
        ));
        assert_eq!(open(&mut c, "f", 100, false, now), 0);
        assert_eq!(
            open(&mut c, "g", 0, true, now),
            0,
            "no smaller session to evict"
        );
        let follower3 = open(&mut c, "h", 3, true, now);
        assert!(follower3 > 0);
        assert!(matches!(
            incremental(&mut c, follower2, 2, now),
            Context::Error(ResponseError::FetchSessionIdNotFound)
        ));
        // A session unused longer than the eviction time goes first, whatever its kind.
        let later = now + e + 1;
        assert!(matches!(
            incremental(&mut c, follower3, 1, later),
            Context::Incremental { .. }
        ));
        assert!(open(&mut c, "i", 1, false, later) > 0);
        assert!(matches!(
            incremental(&mut c, follower, 2, later),
            Context::Error(ResponseError::FetchSessionIdNotFound)
        ));
        assert_eq!(c.evictions(), 3);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn a_cache_of_no_slots_never_opens_a_session() {
        let mut c = Cache::new(0, EVICTION_MS, 0, 1);
        assert_eq!(open(&mut c, "t", 1, true, 0), 0);
    }

    #[test]
    fn session_ids_name_their_shard() {
        let mut c = Cache::new(100, EVICTION_MS, 2, 3);
        for n in 0..50 {
            let id = open(&mut c, "t", 1, false, n);
            assert!(id > 0 && id % 3 == 2);
            assert!(c.is_mine(id));
        }
        let other = Cache::new(100, EVICTION_MS, 1, 3);
        let mut c2 = Cache::new(100, EVICTION_MS, 1, 3);
        let id = open(&mut c2, "t", 1, false, 0);
        assert!(!c.is_mine(id) && other.is_mine(id));
        // Closing another shard's id here closes nothing here.
        let before = c.len();
        assert_eq!(c.context(12, id, 0, &[], &[], 60), Context::Full);
        assert_eq!(c.len(), before);
    }

    #[test]
    fn building_from_the_changes_is_building_from_the_whole_list() {
        let (mut whole, mut changes) = (Handler::default(), Handler::default());
        let all: Vec<_> = (0..5).map(|p| (key("t", p), req(0))).collect();
        assert_eq!(whole.build(&all), changes.build(&all));
        for h in [&mut whole, &mut changes] {
            assert!(h.answered(0, 42));
            assert!(!h.is_full());
        }
        // Partition 1 moved on, 3 left, u-0 joined.
        let mut next = all.clone();
        next[1].1 = req(7);
        next.remove(3);
        next.push((key("u", 0), req(0)));
        let by_whole = whole.build(&next);
        let by_changes = changes.build_changed(
            vec![(key("t", 1), req(7)), (key("u", 0), req(0))],
            vec![key("t", 3)],
        );
        assert_eq!(by_whole, by_changes);
        for h in [&mut whole, &mut changes] {
            assert!(h.answered(0, 42));
        }
        // And the two remember the same: nothing to send for the same list.
        let (a, b) = (whole.build(&next), changes.build(&next));
        assert_eq!(a, b);
        assert!(a.to_send.is_empty() && a.forgotten.is_empty());
    }

    #[test]
    fn the_handler_sends_only_changes_and_falls_back_to_full() {
        let mut h = Handler::default();
        let all = vec![(key("t", 0), req(0)), (key("t", 1), req(0))];
        let r = h.build(&all);
        assert_eq!((r.session_id, r.epoch, r.to_send.len()), (0, 0, 2));
        assert!(h.answered(0, 42));
        // Nothing changed: an empty incremental request.
        let r = h.build(&all);
        assert_eq!((r.session_id, r.epoch), (42, 1));
        assert!(r.to_send.is_empty() && r.forgotten.is_empty());
        assert!(h.answered(0, 42));
        // One offset moved, one partition left, one joined.
        let next = vec![(key("t", 0), req(3)), (key("u", 0), req(0))];
        let r = h.build(&next);
        assert_eq!(r.epoch, 2);
        assert_eq!(r.to_send, next);
        assert_eq!(r.forgotten, vec![key("t", 1)]);
        // A session error: full again, closing the session.
        assert!(!h.answered(ResponseError::InvalidFetchSessionEpoch.code(), 0));
        let r = h.build(&next);
        assert_eq!((r.session_id, r.epoch, r.to_send.len()), (42, 0, 2));
        // An unknown session: full, naming none.
        assert!(!h.answered(ResponseError::FetchSessionIdNotFound.code(), 0));
        let r = h.build(&next);
        assert_eq!((r.session_id, r.epoch), (0, 0));
        // No room at the leader: full fetches go on.
        assert!(h.answered(0, 0));
        assert_eq!(h.build(&next).epoch, 0);
        assert!(h.answered(0, 7));
        assert_eq!(h.build(&next).epoch, 1);
        h.failed();
        let r = h.build(&next);
        assert_eq!((r.session_id, r.epoch, r.to_send.len()), (7, 0, 2));
    }

    /// The broker's cache and the handler together: a follower's idle rounds carry no
    /// partitions either way, and its progress is exactly what it sends.
    #[test]
    fn handler_and_cache_agree() {
        let mut c = Cache::new(10, EVICTION_MS, 0, 1);
        let mut h = Handler::default();
        let mut parts: Vec<(PartKey, PartReq)> = (0..100).map(|p| (key("t", p), req(0))).collect();
        for round in 0..5u64 {
            if round == 3 {
                parts[7].1 = req(10);
            }
            let r = h.build(&parts);
            let ctx = c.context(12, r.session_id, r.epoch, &r.to_send, &r.forgotten, round);
            let (sent, answered) = match ctx {
                Context::Full => {
                    let a: Vec<_> = parts
                        .iter()
                        .map(|(k, q)| (k.clone(), *q, resp(5)))
                        .collect();
                    let id = c.open(true, false, &a, round);
                    (r.to_send.len(), (id, a.len()))
                }
                Context::Incremental {
                    id,
                    epoch,
                    reads: Reads::All { parts: read, .. },
                } => {
                    assert_eq!(read.len(), 100);
                    let offset7 = read
                        .iter()
                        .find(|(k, _)| *k == key("t", 7))
                        .unwrap()
                        .1
                        .fetch_offset;
                    assert_eq!(offset7.get(), if round >= 3 { 10 } else { 0 });
                    let news: Vec<_> = read.iter().map(|(k, _)| (k.clone(), resp(5))).collect();
                    let keep = c.answered(id, epoch, &news, None, 0).unwrap().unwrap();
                    (r.to_send.len(), (id, keep.iter().filter(|k| **k).count()))
                }
                other => panic!("{other:?}"),
            };
            assert!(h.answered(0, answered.0));
            let expect = match round {
                0 => (100, 100),
                3 => (1, 0),
                _ => (0, 0),
            };
            assert_eq!((sent, answered.1), expect, "round {round}");
        }
    }
}
