//! Offsets: what each group has committed, until when, and what a transaction has
//! committed but not yet made visible. OffsetCommit is planned, written by the shell,
//! then applied (a partition being written is counted, so expiry leaves it alone);
//! OffsetFetch (with require_stable, KIP-447) and OffsetDelete read and drop offsets;
//! a TxnOffsetCommit's offsets wait per producer id, first in flight and then durable,
//! until the transaction's marker commits or aborts them; expiry
//! (offsets.retention.minutes, and KIP-496 for Stable consumer groups) tombstones old
//! offsets and removes an empty group left with nothing. The offset records
//! ([`offset_record`], `offset_tombstone`) are made here.
//!
//! Why the cut is here: these paths change `Group::offsets`, the pending and in-flight
//! transactional offsets and the log order they are compared by. Of membership they
//! only read (is the committer a current member of this generation?), but for two
//! writes Kafka makes there too: a member's commit counts as its heartbeat, and expiry
//! ends an empty group that has nothing left (Dead, and its tombstone). That is the
//! line Kafka draws between its offset and group metadata managers.

use std::collections::{BTreeSet, HashMap};

use kafka_protocol::error::ResponseError;

use super::{
    group_tombstone, Code, Committed, Coordinator, Effects, Group, GroupState, PendingTxnOffset,
    Record,
};
use crate::records::{Key, OffsetValue};

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
    if let Some(c) = group.consumer.as_deref() {
        if a.generation < 0 && a.member_id.is_empty() {
            return None;
        }
        return Coordinator::consumer_commit_error(c, &a.member_id, a.generation);
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

impl Group {
    pub(super) fn remove_offset(&mut self, tp: &(String, i32)) -> Option<Committed> {
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

    pub(super) fn has_txn_offsets(&self) -> bool {
        !self.pending_txn.is_empty() || !self.inflight_txn.is_empty()
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

impl Coordinator {
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
        if let Some(c) = group.consumer.as_deref() {
            return Self::consumer_commit_error(c, &a.member_id, a.generation);
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
        let live_consumers = group
            .consumer
            .as_ref()
            .filter(|c| !c.members.is_empty())
            .map(|c| c.subscribed_topic_names().into_iter().collect::<Vec<_>>());
        let subscribed = match group.state {
            GroupState::Dead => return Err(ResponseError::GroupIdNotFound),
            // A live KIP-848 group: its members' subscriptions.
            _ if live_consumers.is_some() => live_consumers,
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

    // ---------------------------------------------------------------- expiry

    pub(super) fn expire_offsets(&mut self, now_ms: i64, fx: &mut Effects) {
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
            // A consumer group (KIP-848) with members is live whatever `state` says.
            let live_consumers = group
                .consumer
                .as_ref()
                .filter(|c| !c.members.is_empty())
                .map(|c| c.subscribed_topic_names());
            let expired: Vec<(String, i32)> = match group.state {
                GroupState::Empty if live_consumers.is_none() => {
                    let since = group.state_timestamp_ms;
                    group
                        .offsets
                        .iter()
                        .filter(|(_, c)| c.commit_timestamp_ms.max(since) + retention <= now_ms)
                        .map(|(k, _)| k.clone())
                        .collect()
                }
                GroupState::Stable | GroupState::Empty => {
                    // KIP-496: a Stable consumer group whose subscriptions are known
                    // loses the offsets of topics it no longer subscribes to, a
                    // retention after their commit (Kafka's `removeExpiredOffsets`).
                    let subscribed: BTreeSet<String> = match &live_consumers {
                        Some(s) => s.clone(),
                        None => match group.subscribed_topics() {
                            Some(s) => s.into_iter().collect(),
                            None => continue,
                        },
                    };
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
            if group.state != GroupState::Empty || live_consumers.is_some() {
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
                if g.consumer.is_some() {
                    fx.records.extend(super::consumer::group_tombstones(&id));
                }
                fx.records.push(group_tombstone(&id));
            }
        }
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

pub(super) fn offset_tombstone(group: &str, topic: &str, partition: i32) -> Record {
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
