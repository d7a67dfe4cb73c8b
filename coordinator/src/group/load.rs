//! Loading: rebuilding the groups of a `__consumer_offsets` partition in memory when
//! its coordination moves to this shard, and forgetting them when it moves away. The
//! shell reads the partition from its start and feeds every record in log order
//! ([`Coordinator::load_record`]; the records of transactional batches and their
//! markers through [`Coordinator::load_txn_record`] and [`Coordinator::load_marker`]),
//! then ends the load ([`Coordinator::loaded`]); [`Coordinator::unload`] drops the
//! groups of a partition that left. A group's last GroupMetadata value is turned back
//! into members here (`Group::restore`).
//!
//! Why the cut is here: replay is the one path where state comes from records rather
//! than requests. It applies no request's checks and appends nothing, and the groups it
//! touches stay marked loading (their offsets do not expire) until their partition is
//! done. Kept apart, it reads as the inverse of the record writers in `membership.rs`
//! and `offsets.rs` that it must agree with. Kafka keeps the same seam: its loader and the
//! coordinator shard's replay sit apart from the request handlers.

use super::{
    count_member, Committed, Coordinator, Effects, Group, GroupState, Member, PendingTxnOffset,
};
use crate::records::{GroupValue, Key, OffsetValue};

impl Group {
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
}

impl Coordinator {
    // ---------------------------------------------------------------- loading

    /// Replays one `__consumer_offsets` record (in log order) into memory. `now_ms` is
    /// the load time: restored members' session timers start from it. The group is
    /// loading until [`Coordinator::loaded`] is called for its partition.
    pub fn load_record(
        &mut self,
        now_ms: i64,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), crate::records::RecordError> {
        if crate::consumer_records::is_consumer_key(key) {
            let record_type = i16::from_be_bytes([key[0], key[1]]);
            return self.load_consumer_record(now_ms, record_type, &key[2..], value);
        }
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
            if let Some(c) = group.consumer.as_mut() {
                c.restored(now_ms, self.config.consumer.session_timeout_ms);
            }
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

    // ---------------------------------------------------------------- unloading

    /// Forgets every group `keep` refuses (its `__consumer_offsets` partition moved to
    /// another coordinator, or must be reloaded). Returns how many went.
    pub fn unload(&mut self, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.groups.len();
        self.groups.retain(|id, _| keep(id));
        self.committing.retain(|id, _| keep(id));
        before - self.groups.len()
    }
}
