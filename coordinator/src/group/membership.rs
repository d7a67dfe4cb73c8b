//! Membership: who is in a group, in which generation, with which protocol and
//! assignment. JoinGroup, SyncGroup, Heartbeat and LeaveGroup drive the rebalance state
//! machine drawn in `mod.rs` (join phase with its initial delay, sync phase, the
//! protocol vote, the leader, static members and their replacement, pending member ids,
//! refusals at group.max.size or at the GroupMetadata record's batch limit);
//! [`Coordinator::tick`] fires the membership deadlines (sessions, pending member ids,
//! the join and sync phases) and then hands over to offset expiry; DescribeGroups and
//! ListGroups read what this role keeps. A generation's outcome is written as the
//! group's GroupMetadata record (`Group::metadata_record`), and a failed write of it
//! undoes the generation ([`Coordinator::metadata_not_stored`]).
//!
//! Why the cut is here: this file changes members, generations, the chosen protocol and
//! the phases' deadlines, and never a committed offset. The offset paths only ask it
//! whether a committer is a current member (`Group::is_fenced`,
//! `Group::current_member_error`) and have it drop a group that a request created and
//! left unused (`Coordinator::drop_if_unused`); loading reuses
//! `Coordinator::prepare_rebalance` for a group loaded over group.max.size. That is the
//! line Kafka draws between its group and offset metadata managers.

use std::collections::HashMap;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};

use super::{
    count_member, err_join, err_sync, member_record_bytes, Code, Coordinator, Deferred, Effects,
    Group, GroupState, JoinToken, Member, Record, SyncToken, RECORD_BATCH_OVERHEAD_BYTES,
};
use crate::records::{GroupValue, Key, MemberValue};
use crate::sb;

/// A JoinGroup request, decoupled from the wire version.
#[derive(Debug, Clone)]
pub struct JoinArgs {
    pub group_id: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+ clients take the MEMBER_ID_REQUIRED round trip.
    pub require_known_member_id: bool,
    /// JoinGroup v9+: a static leader rejoining a stable group need not reassign.
    pub supports_skip_assignment: bool,
}

#[derive(Debug, Clone)]
pub struct SyncArgs {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

/// One LeaveGroup member.
#[derive(Debug, Clone)]
pub struct Leaving {
    pub member_id: String,
    pub instance_id: Option<String>,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub struct GroupSummary {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    /// (member id, instance id, client id, host, metadata, assignment)
    pub members: Vec<(String, Option<String>, String, String, Bytes, Bytes)>,
}

impl Group {
    /// Kafka's `validateCurrentMember`: a static member must be the one its instance id
    /// names, and the member must exist.
    pub(super) fn current_member_error(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Option<ResponseError> {
        if let Some(i) = instance_id {
            match self.static_members.get(i) {
                Some(m) if m != member_id => return Some(ResponseError::FencedInstanceId),
                Some(_) => {}
                None => return Some(ResponseError::UnknownMemberId),
            }
        }
        (!self.members.contains_key(member_id)).then_some(ResponseError::UnknownMemberId)
    }

    /// A static member whose instance id now belongs to another member id.
    pub(super) fn is_fenced(&self, instance_id: Option<&str>, member_id: &str) -> bool {
        instance_id
            .and_then(|i| self.static_members.get(i))
            .is_some_and(|m| m != member_id)
    }

    /// Protocols every member supports.
    fn candidate_protocols(&self) -> Vec<String> {
        let mut it = self.members.values();
        let Some(first) = it.next() else {
            return Vec::new();
        };
        let mut c: Vec<String> = first.protocols.iter().map(|(n, _)| n.clone()).collect();
        for m in it {
            c.retain(|p| m.protocols.iter().any(|(n, _)| n == p));
        }
        c
    }

    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        // A protocol every member lists is a candidate (see `candidate_protocols`).
        let everyone = self.members.len();
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols
                .iter()
                .any(|(n, _)| self.protocol_support.get(n) == Some(&everyone))
    }

    /// Kafka's vote: each member votes for its most preferred candidate; most votes win
    /// (ties go to the protocol listed first by the first member).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let mut votes: Vec<(String, usize)> = candidates.iter().map(|c| (c.clone(), 0)).collect();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(n)) {
                if let Some(v) = votes.iter_mut().find(|(c, _)| c == n) {
                    v.1 += 1;
                }
            }
        }
        let best = votes.iter().map(|(_, n)| *n).max()?;
        votes.into_iter().find(|(_, n)| *n == best).map(|(c, _)| c)
    }

    /// Every member has joined this phase. The count says when it may be so; the scan
    /// (once per phase when the count reaches 0) is what decides.
    fn all_joined(&self) -> bool {
        self.pending_members.is_empty()
            && self.unjoined == 0
            && self.members.values().all(|m| m.joined)
    }

    fn max_rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    /// The member list a leader gets in its JoinGroup response.
    fn member_list(&self) -> Vec<JoinGroupResponseMember> {
        let protocol = self.protocol.clone().unwrap_or_default();
        self.members
            .values()
            .map(|m| {
                JoinGroupResponseMember::default()
                    .with_member_id(sb(m.id.clone()))
                    .with_group_instance_id(m.instance_id.clone().map(sb))
                    .with_metadata(m.metadata(&protocol))
            })
            .collect()
    }

    fn join_response(&self, member_id: &str, with_members: bool) -> JoinGroupResponse {
        JoinGroupResponse::default()
            .with_generation_id(self.generation)
            .with_protocol_type(self.protocol_type.clone().map(sb))
            .with_protocol_name(self.protocol.clone().map(sb))
            .with_leader(sb(self.leader.clone().unwrap_or_default()))
            .with_member_id(sb(member_id))
            .with_members(if with_members {
                self.member_list()
            } else {
                Vec::new()
            })
    }

    /// A bound on the batch that would carry the group's GroupMetadata record with the
    /// member `a` in it (in place of the static member it replaces, if any), counted as
    /// `records.rs` lays the record out. Exact for what is known — ids, client ids and
    /// hosts, each member's largest protocol metadata (the protocol is chosen later) —
    /// and conservative for what is not: the assignments, which only the leader's
    /// SyncGroup brings, are counted as the largest assignment of the group's last
    /// assignment for every member, the new one included. O(1): the members' share is
    /// a running sum.
    pub fn record_bytes_estimate(&self, a: &JoinArgs) -> usize {
        let id_bytes = if a.member_id.is_empty() {
            new_member_id_bytes(&a.client_id)
        } else {
            a.member_id.len()
        };
        let joining = member_record_bytes(
            "",
            a.instance_id.as_deref(),
            &a.client_id,
            &a.client_host,
            &a.protocols,
        ) + id_bytes;
        let replaced = a
            .member_id
            .is_empty()
            .then_some(a.instance_id.as_ref())
            .flatten()
            .and_then(|i| self.static_members.get(i))
            .and_then(|id| self.members.get(id));
        let members = self.members.len() + usize::from(replaced.is_none());
        let leaving = replaced.map_or(0, Member::record_bytes);
        // The protocol chosen is one the new member lists too.
        let protocol_bytes = a.protocols.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        let leader_bytes = self.member_id_bytes_max.max(id_bytes);
        let key = 2 + 2 + self.id.len();
        // i16 version, STRING protocol type, i32 generation, NULLABLE_STRING protocol
        // and leader, i64 state timestamp, i32 member count.
        let header =
            2 + 2 + a.protocol_type.len() + 4 + 2 + protocol_bytes + 2 + leader_bytes + 8 + 4;
        // Each member's assignment length is in its share already; its bytes are not.
        let assignments = members.saturating_mul(self.assignment_bytes_max);
        (RECORD_BATCH_OVERHEAD_BYTES + key + header)
            .saturating_add(self.members_record_bytes.saturating_sub(leaving))
            .saturating_add(joining)
            .saturating_add(assignments)
    }

    /// Member ids handed out with MEMBER_ID_REQUIRED and not joined yet.
    #[cfg(test)]
    pub(crate) fn pending_member_count(&self) -> usize {
        self.pending_members.len()
    }

    /// The running sum of the members' record shares and the same sum counted afresh
    /// (tests check the tally never drifts).
    #[cfg(test)]
    pub(crate) fn record_bytes_tally(&self) -> (usize, usize) {
        let fresh = self.members.values().map(Member::record_bytes).sum();
        (self.members_record_bytes, fresh)
    }

    /// The GroupMetadata record of the group as it is now.
    pub(super) fn metadata_record(&self) -> Record {
        let protocol = self.protocol.clone().unwrap_or_default();
        let value = GroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            state_timestamp_ms: self.state_timestamp_ms,
            members: self
                .members
                .values()
                .map(|m| MemberValue {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        };
        Record {
            group: self.id.clone(),
            key: Key::Group {
                group: self.id.clone(),
            }
            .encode(),
            value: Some(value.encode()),
        }
    }
}

fn member_id_prefix(client_id: &str) -> &str {
    if client_id.is_empty() {
        "member"
    } else {
        client_id
    }
}

/// The length of the member id [`Coordinator::join`] hands a new member of `client_id`
/// (the prefix, a dash, a hyphenated UUID).
fn new_member_id_bytes(client_id: &str) -> usize {
    member_id_prefix(client_id).len() + 1 + 36
}

/// Why a JoinGroup is refused with GROUP_MAX_SIZE_REACHED.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// group.max.size, Kafka's rule.
    MaxSize(usize),
    /// The GroupMetadata record's estimate with the new member, in bytes, is over the
    /// batch limit.
    RecordTooLarge(usize),
}

impl Coordinator {
    fn new_member_id(&mut self, client_id: &str) -> String {
        self.member_seq += 1;
        // Kafka: client id, a dash and a UUID; unique per coordinator is what matters.
        let id = format!("{}-{}", member_id_prefix(client_id), uuid::Uuid::new_v4());
        assert_eq!(id.len(), new_member_id_bytes(client_id));
        id
    }

    // ---------------------------------------------------------------- JoinGroup

    /// JoinGroup. The answer comes in `fx.replies` under `token`, now or later.
    pub fn join(&mut self, token: JoinToken, now_ms: i64, a: JoinArgs, fx: &mut Effects) {
        let reply = |fx: &mut Effects, r: JoinGroupResponse| {
            fx.replies.push(Deferred::Join(token, r));
        };
        if a.group_id.is_empty() {
            return reply(fx, err_join(ResponseError::InvalidGroupId, &a.member_id));
        }
        let c = &self.config;
        if a.session_timeout_ms < c.session_timeout_min_ms
            || a.session_timeout_ms > c.session_timeout_max_ms
        {
            return reply(
                fx,
                err_join(ResponseError::InvalidSessionTimeout, &a.member_id),
            );
        }
        if !self.groups.contains_key(&a.group_id) {
            if !a.member_id.is_empty() {
                // Kafka: a member id for a group that does not exist is unknown.
                return reply(fx, err_join(ResponseError::UnknownMemberId, &a.member_id));
            }
            if a.protocol_type.is_empty() || a.protocols.is_empty() {
                return reply(
                    fx,
                    err_join(ResponseError::InconsistentGroupProtocol, &a.member_id),
                );
            }
            self.groups
                .insert(a.group_id.clone(), Group::new(&a.group_id, now_ms));
        }
        let group = &self.groups[&a.group_id];
        if group.state == GroupState::Dead {
            // Deleted meanwhile: the client looks the coordinator up again.
            return reply(
                fx,
                err_join(ResponseError::CoordinatorNotAvailable, &a.member_id),
            );
        }
        if group.consumer.is_some() {
            let g = self.groups.get_mut(&a.group_id).expect("present");
            if g.consumer.as_ref().is_some_and(|c| !c.members.is_empty()) {
                // A live KIP-848 group: classic members are not mixed in.
                return reply(
                    fx,
                    err_join(ResponseError::InconsistentGroupProtocol, &a.member_id),
                );
            }
            // An empty consumer group becomes classic (its offsets stay).
            g.consumer = None;
            fx.records.extend(super::consumer::group_tombstones(&g.id));
        }
        // Before the protocol check, as Kafka's `handleJoinGroup` orders them.
        if let Some(refusal) = self.refusal(&a) {
            self.refuse(token, now_ms, &a, refusal, fx);
            self.drop_if_unused(&a.group_id);
            return;
        }
        let group = &self.groups[&a.group_id];
        if !group.supports(&a.protocol_type, &a.protocols) {
            return reply(
                fx,
                err_join(ResponseError::InconsistentGroupProtocol, &a.member_id),
            );
        }
        let group_id = a.group_id.clone();
        if a.member_id.is_empty() {
            self.join_unknown_member(token, now_ms, a, fx);
        } else {
            self.join_known_member(token, now_ms, a, fx);
        }
        self.drop_if_unused(&group_id);
    }

    /// Whether the group must refuse the join `a` with GROUP_MAX_SIZE_REACHED: Kafka's
    /// `acceptJoiningMember` for group.max.size, then, for a member not in the group
    /// yet, the bound on its GroupMetadata record ([`Group::record_bytes_estimate`]).
    fn refusal(&self, a: &JoinArgs) -> Option<Refusal> {
        let group = &self.groups[&a.group_id];
        let max = self.config.group_max_size;
        // A static member rejoining with a new member id takes its own place: the group
        // does not grow. Kafka's classic coordinator counts it as a new member and
        // refuses it in a full group; KAFKA-20601 lets it in for KIP-848 groups, and
        // so does this one, or a full group of static members could not restart.
        let replaces_static = a.member_id.is_empty()
            && a.instance_id
                .as_ref()
                .is_some_and(|i| group.static_members.contains_key(i));
        let full = match group.state {
            _ if replaces_static => false,
            GroupState::Empty | GroupState::Dead => false,
            // Counted by members that have (re)joined this phase, not by the group's
            // size, which can be over the limit (a group loaded over a lowered limit):
            // the first `max` members back stay, later ones are refused and removed.
            // In this phase a member has joined exactly when it awaits its answer.
            GroupState::PreparingRebalance => {
                let awaiting = group
                    .members
                    .get(&a.member_id)
                    .is_some_and(|m| m.awaiting_join.is_some());
                !awaiting && group.members.len().saturating_sub(group.unjoined) >= max
            }
            // A current member is always let back in; the join phase ahead drops
            // whoever does not rejoin.
            GroupState::CompletingRebalance | GroupState::Stable => {
                !group.members.contains_key(&a.member_id) && group.members.len() >= max
            }
        };
        if full {
            return Some(Refusal::MaxSize(max));
        }
        if group.members.contains_key(&a.member_id) {
            // A current member's record share is there already; if its new metadata
            // makes the record too large, the SyncGroup path answers (the last line).
            return None;
        }
        let estimate = group.record_bytes_estimate(a);
        (estimate > self.config.metadata_batch_bytes_max)
            .then_some(Refusal::RecordTooLarge(estimate))
    }

    /// Refuses a join with GROUP_MAX_SIZE_REACHED, as Kafka does: the member id is
    /// forgotten (a pending id, or a current member that rejoined too late in a group
    /// over its limit, which is removed) and the answer carries no member id.
    fn refuse(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        a: &JoinArgs,
        r: Refusal,
        fx: &mut Effects,
    ) {
        let bytes_max = self.config.metadata_batch_bytes_max;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        group.pending_members.remove(&a.member_id);
        let removed = Self::remove_member(group, &a.member_id).is_some();
        match r {
            Refusal::MaxSize(max) => tracing::info!(
                group = %group.id, member = %a.member_id, members = group.members.len(),
                removed, "group.max.size {max} reached: JoinGroup refused with GROUP_MAX_SIZE_REACHED"
            ),
            Refusal::RecordTooLarge(estimate) => tracing::warn!(
                group = %group.id, client = %a.client_id, members = group.members.len(),
                estimate, "group metadata would outgrow the {bytes_max}-byte batch limit with \
                 another member: JoinGroup refused with GROUP_MAX_SIZE_REACHED"
            ),
        }
        fx.replies.push(Deferred::Join(
            token,
            err_join(ResponseError::GroupMaxSizeReached, ""),
        ));
        // A member gone may have been the last one the join phase waited for.
        Self::maybe_complete_join(group, now_ms, fx);
    }

    /// A group created by a join that was refused holds nothing: drop it.
    pub(super) fn drop_if_unused(&mut self, group_id: &str) {
        let unused = self.groups.get(group_id).is_some_and(|g| {
            g.state == GroupState::Empty
                && g.generation == 0
                && g.members.is_empty()
                && g.pending_members.is_empty()
                && g.offsets.is_empty()
                && !g.has_txn_offsets()
                && g.consumer.is_none()
        });
        if unused {
            self.groups.remove(group_id);
        }
    }

    fn join_unknown_member(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let new_id = self.new_member_id(&a.client_id);
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        if let Some(instance) = a.instance_id.clone() {
            if let Some(old_id) = group.static_members.get(&instance).cloned() {
                return self.replace_static_member(token, now_ms, old_id, new_id, a, fx);
            }
            // A new static member: no member-id round trip (KIP-345).
            return self.add_member_and_rebalance(token, now_ms, new_id, a, fx);
        }
        if a.require_known_member_id {
            let deadline = now_ms + i64::from(a.session_timeout_ms);
            group.pending_members.insert(new_id.clone(), deadline);
            fx.replies.push(Deferred::Join(
                token,
                err_join(ResponseError::MemberIdRequired, &new_id),
            ));
            return;
        }
        self.add_member_and_rebalance(token, now_ms, new_id, a, fx);
    }

    fn join_known_member(&mut self, token: JoinToken, now_ms: i64, a: JoinArgs, fx: &mut Effects) {
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        let reply = |fx: &mut Effects, r: JoinGroupResponse| {
            fx.replies.push(Deferred::Join(token, r));
        };
        if group.pending_members.remove(&a.member_id).is_some() {
            let id = a.member_id.clone();
            return self.add_member_and_rebalance(token, now_ms, id, a, fx);
        }
        if group.is_fenced(a.instance_id.as_deref(), &a.member_id) {
            return reply(fx, err_join(ResponseError::FencedInstanceId, &a.member_id));
        }
        let Some(member) = group.members.get(&a.member_id) else {
            return reply(fx, err_join(ResponseError::UnknownMemberId, &a.member_id));
        };
        let same_protocols = member.protocols == a.protocols;
        let is_leader = group.leader.as_deref() == Some(a.member_id.as_str());
        match group.state {
            GroupState::Empty | GroupState::Dead => {
                reply(fx, err_join(ResponseError::UnknownMemberId, &a.member_id))
            }
            GroupState::PreparingRebalance => {
                self.update_member_and_rebalance(token, now_ms, a, fx)
            }
            GroupState::CompletingRebalance if same_protocols => {
                // The member lost our JoinGroup answer: give it again.
                let r = group.join_response(&a.member_id, is_leader);
                reply(fx, r)
            }
            GroupState::Stable if same_protocols && !is_leader => {
                // A follower rejoining with nothing new: no rebalance.
                let r = group.join_response(&a.member_id, false);
                reply(fx, r)
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.update_member_and_rebalance(token, now_ms, a, fx)
            }
        }
    }

    fn new_member(&self, id: String, a: &JoinArgs, token: JoinToken, now_ms: i64) -> Member {
        Member {
            id,
            instance_id: a.instance_id.clone(),
            client_id: a.client_id.clone(),
            client_host: a.client_host.clone(),
            session_timeout_ms: a.session_timeout_ms,
            rebalance_timeout_ms: a.rebalance_timeout_ms,
            protocol_type: a.protocol_type.clone(),
            protocols: a.protocols.clone(),
            assignment: Bytes::new(),
            awaiting_join: Some(token),
            awaiting_sync: None,
            joined: true,
            pending_sync: false,
            session_deadline_ms: now_ms + i64::from(a.session_timeout_ms),
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        id: String,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let member = self.new_member(id.clone(), &a, token, now_ms);
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        if group.members.is_empty() {
            group.protocol_type = Some(a.protocol_type.clone());
        }
        if let Some(i) = &a.instance_id {
            group.static_members.insert(i.clone(), id.clone());
        }
        if group.leader.is_none() {
            group.leader = Some(id.clone());
        }
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &member,
            true,
        );
        group.member_id_bytes_max = group.member_id_bytes_max.max(id.len());
        group.members.insert(id, member);
        if group.state == GroupState::PreparingRebalance {
            // A new member extends the initial delay, within the rebalance timeout.
            if let (Some(limit), Some(d)) = (group.initial_delay_limit_ms, group.join_deadline_ms) {
                group.join_deadline_ms = Some((d.max(now_ms + initial_delay)).min(limit));
            }
        }
        Self::prepare_rebalance(group, now_ms, initial_delay, fx);
        Self::maybe_complete_join(group, now_ms, fx);
    }

    fn update_member_and_rebalance(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        let m = group.members.get_mut(&a.member_id).expect("member exists");
        if let Some(old) = m.awaiting_join.replace(token) {
            // A duplicate join: the older request gets the newer one's fate, as in Kafka
            // (the callback is replaced); answer the old one so it does not hang.
            fx.replies.push(Deferred::Join(
                old,
                err_join(ResponseError::UnknownMemberId, &a.member_id),
            ));
        }
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            m,
            false,
        );
        m.protocols = a.protocols;
        m.session_timeout_ms = a.session_timeout_ms;
        m.rebalance_timeout_ms = a.rebalance_timeout_ms;
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            m,
            true,
        );
        if !m.joined {
            group.unjoined = group.unjoined.saturating_sub(1);
        }
        m.joined = true;
        Self::prepare_rebalance(group, now_ms, initial_delay, fx);
        Self::maybe_complete_join(group, now_ms, fx);
    }

    /// A static member rejoined with a new member id (a restarted process).
    fn replace_static_member(
        &mut self,
        token: JoinToken,
        now_ms: i64,
        old_id: String,
        new_id: String,
        a: JoinArgs,
        fx: &mut Effects,
    ) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let group = self.groups.get_mut(&a.group_id).expect("group exists");
        let mut m = group.members.remove(&old_id).expect("static member exists");
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &m,
            false,
        );
        if !m.joined {
            group.unjoined = group.unjoined.saturating_sub(1);
        }
        // The old instance's pending requests are fenced.
        if let Some(t) = m.awaiting_join.take() {
            fx.replies.push(Deferred::Join(
                t,
                err_join(ResponseError::FencedInstanceId, &old_id),
            ));
        }
        if let Some(t) = m.awaiting_sync.take() {
            fx.replies
                .push(Deferred::Sync(t, err_sync(ResponseError::FencedInstanceId)));
        }
        m.id = new_id.clone();
        // A new incarnation owes no SyncGroup of the old one's generation (Kafka's
        // replaceStaticMember builds a member that is not pending sync).
        m.pending_sync = false;
        m.client_id = a.client_id.clone();
        m.client_host = a.client_host.clone();
        m.session_timeout_ms = a.session_timeout_ms;
        m.rebalance_timeout_ms = a.rebalance_timeout_ms;
        m.protocols = a.protocols.clone();
        m.session_deadline_ms = now_ms + i64::from(a.session_timeout_ms);
        let instance = a.instance_id.clone().expect("static member");
        group.static_members.insert(instance, new_id.clone());
        let was_leader = group.leader.as_deref() == Some(old_id.as_str());
        if was_leader {
            group.leader = Some(new_id.clone());
        }
        // Kafka rebalances only if the group's protocol would change; the metadata
        // bytes may differ (a restarted consumer owns nothing yet).
        group.members.insert(new_id.clone(), m);
        let protocols_changed = group.select_protocol() != group.protocol;
        let mut m = group.members.remove(&new_id).expect("just inserted");
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &m,
            true,
        );
        group.member_id_bytes_max = group.member_id_bytes_max.max(new_id.len());
        match group.state {
            GroupState::Stable if !protocols_changed => {
                // KIP-345: no rebalance. The member gets its old assignment at SyncGroup.
                // KIP-814: a v9+ leader is told to skip the assignment; older leaders
                // get the member list, compute an assignment and SyncGroup in a stable
                // group returns the stored one.
                m.joined = true;
                group.members.insert(new_id.clone(), m);
                let mut r = group.join_response(&new_id, was_leader);
                r.skip_assignment = was_leader && a.supports_skip_assignment;
                fx.replies.push(Deferred::Join(token, r));
                // The id changed: persist it so a fenced old instance stays fenced.
                fx.records.push(group.metadata_record());
            }
            _ => {
                // In CompletingRebalance the leader was given the old member id and
                // would assign its partitions to it: Kafka always rebalances then
                // (`updateStaticMemberThenRebalanceOrCompleteJoin`). In
                // PreparingRebalance the member simply joins the phase.
                m.awaiting_join = Some(token);
                m.joined = true;
                group.members.insert(new_id, m);
                Self::prepare_rebalance(group, now_ms, initial_delay, fx);
                Self::maybe_complete_join(group, now_ms, fx);
            }
        }
    }

    /// Starts (or continues) a join phase.
    pub(super) fn prepare_rebalance(
        group: &mut Group,
        now_ms: i64,
        initial_delay_ms: i64,
        fx: &mut Effects,
    ) {
        match group.state {
            GroupState::PreparingRebalance => return,
            GroupState::CompletingRebalance => {
                // Members waiting for their assignment must rejoin.
                for m in group.members.values_mut() {
                    if let Some(t) = m.awaiting_sync.take() {
                        fx.replies.push(Deferred::Sync(
                            t,
                            err_sync(ResponseError::RebalanceInProgress),
                        ));
                    }
                }
            }
            _ => {}
        }
        let was_empty = group.state == GroupState::Empty;
        for m in group.members.values_mut() {
            // Members that were told about this rebalance in their own join count as
            // joined; the others must come back.
            m.joined = m.awaiting_join.is_some();
            // The previous generation's sync phase is over (Kafka clears its pending
            // sync members).
            m.pending_sync = false;
        }
        group.unjoined = group.members.values().filter(|m| !m.joined).count();
        let rebalance_ms = group.max_rebalance_timeout_ms();
        if was_empty {
            // Kafka's initial delay: wait a little for more members before the first
            // generation, so N consumers starting together take one rebalance.
            group.join_deadline_ms = Some(now_ms + initial_delay_ms.min(rebalance_ms));
            group.initial_delay_limit_ms = Some(now_ms + rebalance_ms);
        } else {
            group.join_deadline_ms = Some(now_ms + rebalance_ms);
            group.initial_delay_limit_ms = None;
        }
        group.sync_deadline_ms = None;
        group.transition(GroupState::PreparingRebalance, now_ms);
    }

    fn maybe_complete_join(group: &mut Group, now_ms: i64, fx: &mut Effects) {
        if group.state != GroupState::PreparingRebalance {
            return;
        }
        let in_initial_delay = group.initial_delay_limit_ms.is_some();
        let due = group.join_deadline_ms.is_some_and(|d| now_ms >= d);
        if due || (!in_initial_delay && group.all_joined()) {
            Self::complete_join(group, now_ms, fx);
        }
    }

    /// Ends a join phase (Kafka's `completeClassicGroupJoin`): drop the dynamic members
    /// that did not rejoin, start the next generation and answer every waiting
    /// JoinGroup. Static members that did not rejoin stay in the generation (their
    /// instance id keeps its place in the assignment); one that does not sync either is
    /// removed when the sync phase expires ([`Coordinator::tick`]). If no member
    /// rejoined at all (every one left is static), the join phase runs again.
    fn complete_join(group: &mut Group, now_ms: i64, fx: &mut Effects) {
        let gone: Vec<String> = group
            .members
            .values()
            .filter(|m| m.instance_id.is_none() && (!m.joined || m.awaiting_join.is_none()))
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            Self::remove_member(group, &id);
        }
        // Kafka's `maybeElectNewJoinedLeader`: a leader that did not rejoin is replaced
        // by a member that did.
        let leader_joined = group
            .leader
            .as_ref()
            .and_then(|l| group.members.get(l))
            .is_some_and(|m| m.awaiting_join.is_some());
        if !leader_joined {
            let joined = group
                .members
                .values()
                .find(|m| m.awaiting_join.is_some())
                .map(|m| m.id.clone());
            if let Some(id) = joined {
                group.leader = Some(id);
            } else if !group.members.is_empty() {
                // Only static members that did not rejoin are left: wait another
                // rebalance timeout, until they rejoin or their sessions expire.
                tracing::warn!(group = %group.id, members = group.members.len(),
                    "could not complete rebalance because no members rejoined");
                group.join_deadline_ms = Some(now_ms + group.max_rebalance_timeout_ms());
                group.initial_delay_limit_ms = None;
                return;
            }
        }
        // Pending member ids stay (Kafka's `completeClassicGroupJoin` keeps them): one
        // that comes back joins as a new member, or it expires with its session.
        group.join_deadline_ms = None;
        group.initial_delay_limit_ms = None;
        group.generation += 1;
        if group.members.is_empty() {
            group.protocol = None;
            group.leader = None;
            group.transition(GroupState::Empty, now_ms);
            fx.records.push(group.metadata_record());
            return;
        }
        group.protocol = group.select_protocol();
        if group
            .leader
            .as_ref()
            .is_none_or(|l| !group.members.contains_key(l))
        {
            group.leader = group.members.keys().next().cloned();
        }
        group.transition(GroupState::CompletingRebalance, now_ms);
        group.sync_deadline_ms = Some(now_ms + group.max_rebalance_timeout_ms());
        let leader = group.leader.clone().expect("a leader");
        let ids: Vec<String> = group.members.keys().cloned().collect();
        for id in ids {
            let resp = group.join_response(&id, id == leader);
            let m = group.members.get_mut(&id).expect("member");
            m.joined = false;
            m.pending_sync = true;
            m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
            if let Some(t) = m.awaiting_join.take() {
                fx.replies.push(Deferred::Join(t, resp));
            }
        }
    }

    fn remove_member(group: &mut Group, id: &str) -> Option<Member> {
        let m = group.members.remove(id)?;
        count_member(
            &mut group.protocol_support,
            &mut group.members_record_bytes,
            &m,
            false,
        );
        if !m.joined {
            group.unjoined = group.unjoined.saturating_sub(1);
        }
        if let Some(i) = &m.instance_id {
            if group.static_members.get(i).map(String::as_str) == Some(id) {
                group.static_members.remove(i);
            }
        }
        if group.leader.as_deref() == Some(id) {
            group.leader = group.members.keys().next().cloned();
        }
        Some(m)
    }

    /// A member left or expired: the group rebalances, or its join phase may now end.
    fn member_gone(
        group: &mut Group,
        id: &str,
        now_ms: i64,
        initial_delay_ms: i64,
        fx: &mut Effects,
    ) {
        let Some(mut m) = Self::remove_member(group, id) else {
            return;
        };
        if let Some(t) = m.awaiting_join.take() {
            fx.replies.push(Deferred::Join(
                t,
                err_join(ResponseError::UnknownMemberId, id),
            ));
        }
        if let Some(t) = m.awaiting_sync.take() {
            fx.replies
                .push(Deferred::Sync(t, err_sync(ResponseError::UnknownMemberId)));
        }
        match group.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                Self::prepare_rebalance(group, now_ms, initial_delay_ms, fx);
                // Nobody is waiting in a join yet; the remaining members learn of the
                // rebalance from their heartbeats.
                Self::maybe_complete_join(group, now_ms, fx);
            }
            GroupState::PreparingRebalance => Self::maybe_complete_join(group, now_ms, fx),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    // ---------------------------------------------------------------- SyncGroup

    pub fn sync(&mut self, token: SyncToken, now_ms: i64, a: SyncArgs, fx: &mut Effects) {
        let reply = |fx: &mut Effects, r: SyncGroupResponse| {
            fx.replies.push(Deferred::Sync(token, r));
        };
        let Some(group) = self.groups.get_mut(&a.group_id) else {
            return reply(fx, err_sync(ResponseError::UnknownMemberId));
        };
        if group.state == GroupState::Dead {
            return reply(fx, err_sync(ResponseError::CoordinatorNotAvailable));
        }
        if group.is_fenced(a.instance_id.as_deref(), &a.member_id) {
            return reply(fx, err_sync(ResponseError::FencedInstanceId));
        }
        if !group.members.contains_key(&a.member_id) {
            return reply(fx, err_sync(ResponseError::UnknownMemberId));
        }
        if a.generation != group.generation {
            return reply(fx, err_sync(ResponseError::IllegalGeneration));
        }
        let type_ok = a.protocol_type.is_none() || a.protocol_type == group.protocol_type;
        let name_ok = a.protocol_name.is_none() || a.protocol_name == group.protocol;
        if !type_ok || !name_ok {
            return reply(fx, err_sync(ResponseError::InconsistentGroupProtocol));
        }
        let protocol_type = group.protocol_type.clone().map(sb);
        let protocol_name = group.protocol.clone().map(sb);
        match group.state {
            GroupState::Empty => reply(fx, err_sync(ResponseError::UnknownMemberId)),
            GroupState::PreparingRebalance => {
                reply(fx, err_sync(ResponseError::RebalanceInProgress))
            }
            GroupState::Stable => {
                let m = group.members.get_mut(&a.member_id).expect("member");
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                m.pending_sync = false;
                let r = SyncGroupResponse::default()
                    .with_protocol_type(protocol_type)
                    .with_protocol_name(protocol_name)
                    .with_assignment(m.assignment.clone());
                // The last member the sync phase waited for: it is over.
                if !group.members.values().any(|m| m.pending_sync) {
                    group.sync_deadline_ms = None;
                }
                reply(fx, r)
            }
            GroupState::CompletingRebalance => {
                let m = group.members.get_mut(&a.member_id).expect("member");
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                m.pending_sync = false;
                if let Some(old) = m.awaiting_sync.replace(token) {
                    fx.replies.push(Deferred::Sync(
                        old,
                        err_sync(ResponseError::UnknownMemberId),
                    ));
                }
                if group.leader.as_deref() == Some(a.member_id.as_str()) {
                    let mut given: HashMap<String, Bytes> = a.assignments.into_iter().collect();
                    let mut largest = 0;
                    for m in group.members.values_mut() {
                        m.assignment = given.remove(&m.id).unwrap_or_default();
                        largest = largest.max(m.assignment.len());
                    }
                    // Kept even if the record cannot be stored: it is what the leader
                    // assigns, and what the next new member's estimate must expect.
                    group.assignment_bytes_max = largest;
                    group.transition(GroupState::Stable, now_ms);
                    // Members that have not synced yet must still do so before the
                    // sync phase expires (Kafka's pending sync, in Stable too).
                    if !group.members.values().any(|m| m.pending_sync) {
                        group.sync_deadline_ms = None;
                    }
                    fx.records.push(group.metadata_record());
                    for m in group.members.values_mut() {
                        if let Some(t) = m.awaiting_sync.take() {
                            let r = SyncGroupResponse::default()
                                .with_protocol_type(protocol_type.clone())
                                .with_protocol_name(protocol_name.clone())
                                .with_assignment(m.assignment.clone());
                            fx.replies.push(Deferred::Sync(t, r));
                        }
                    }
                }
            }
            GroupState::Dead => unreachable!("checked above"),
        }
    }

    /// The shell could not store `record`, a GroupMetadata record this coordinator
    /// produced. As Kafka's coordinator when its group write fails, the generation the
    /// record describes is not kept: if the group is still Stable at that generation,
    /// its assignments are dropped and a rebalance starts (heartbeats then answer
    /// REBALANCE_IN_PROGRESS and members rejoin), rather than running on state a
    /// restart or a coordinator move would not find. Replies only, never records. The
    /// shell answers the requests that waited on the record with the append's error
    /// ([`Deferred::failed`]). Other records (offsets, tombstones) change nothing here.
    pub fn metadata_not_stored(&mut self, now_ms: i64, record: &Record, fx: &mut Effects) {
        let (Some(value), Ok(Key::Group { group: id })) =
            (record.value.as_deref(), Key::decode(&record.key))
        else {
            return;
        };
        let Ok(stored) = GroupValue::decode(value) else {
            return;
        };
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        if group.state != GroupState::Stable || group.generation != stored.generation {
            return;
        }
        for m in group.members.values_mut() {
            m.assignment = Bytes::new();
        }
        Self::prepare_rebalance(group, now_ms, initial_delay, fx);
    }

    // ---------------------------------------------------------------- Heartbeat

    pub fn heartbeat(
        &mut self,
        now_ms: i64,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Code {
        let Some(group) = self.groups.get_mut(group_id) else {
            return Err(ResponseError::UnknownMemberId);
        };
        if group.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if group.is_fenced(instance_id, member_id) {
            return Err(ResponseError::FencedInstanceId);
        }
        let state = group.state;
        let gen = group.generation;
        let Some(m) = group.members.get_mut(member_id) else {
            return Err(ResponseError::UnknownMemberId);
        };
        if generation != gen {
            return Err(ResponseError::IllegalGeneration);
        }
        match state {
            GroupState::Empty | GroupState::Dead => Err(ResponseError::UnknownMemberId),
            GroupState::CompletingRebalance | GroupState::Stable => {
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                Ok(())
            }
            GroupState::PreparingRebalance => {
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
                Err(ResponseError::RebalanceInProgress)
            }
        }
    }

    // ---------------------------------------------------------------- LeaveGroup

    /// LeaveGroup: the group-level error, and one result per member.
    pub fn leave(
        &mut self,
        now_ms: i64,
        group_id: &str,
        members: &[Leaving],
        fx: &mut Effects,
    ) -> (Code, Vec<Code>) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        let Some(group) = self.groups.get_mut(group_id) else {
            return (
                Ok(()),
                vec![Err(ResponseError::UnknownMemberId); members.len()],
            );
        };
        if group.state == GroupState::Dead {
            return (Err(ResponseError::CoordinatorNotAvailable), Vec::new());
        }
        let mut results = Vec::with_capacity(members.len());
        for l in members {
            let id = if l.member_id.is_empty() {
                // Admin removal of a static member by instance id (KIP-345).
                match l
                    .instance_id
                    .as_ref()
                    .and_then(|i| group.static_members.get(i))
                {
                    Some(id) => id.clone(),
                    None => {
                        results.push(Err(ResponseError::UnknownMemberId));
                        continue;
                    }
                }
            } else {
                if group.is_fenced(l.instance_id.as_deref(), &l.member_id) {
                    results.push(Err(ResponseError::FencedInstanceId));
                    continue;
                }
                l.member_id.clone()
            };
            if group.pending_members.remove(&id).is_some() {
                results.push(Ok(()));
                Self::maybe_complete_join(group, now_ms, fx);
                continue;
            }
            if !group.members.contains_key(&id) {
                results.push(Err(ResponseError::UnknownMemberId));
                continue;
            }
            Self::member_gone(group, &id, now_ms, initial_delay, fx);
            results.push(Ok(()));
        }
        (Ok(()), results)
    }

    // ---------------------------------------------------------------- timers

    /// Fires due timers: expired sessions and pending member ids, the end of a join or
    /// sync phase, and offset expiry of empty groups and, for topics they no longer
    /// subscribe to, of Stable consumer groups (not of groups of a partition still
    /// being loaded: see `Group::loading`).
    pub fn tick(&mut self, now_ms: i64, fx: &mut Effects) {
        let initial_delay = self.config.initial_rebalance_delay_ms;
        for group in self.groups.values_mut() {
            group.pending_members.retain(|_, d| *d > now_ms);
            let expired: Vec<String> = group
                .members
                .values()
                .filter(|m| {
                    // Members waiting in a join or sync are alive by definition.
                    m.awaiting_join.is_none()
                        && m.awaiting_sync.is_none()
                        && m.session_deadline_ms <= now_ms
                })
                .map(|m| m.id.clone())
                .collect();
            for id in expired {
                tracing::debug!(group = %group.id, member = %id, "session expired");
                Self::member_gone(group, &id, now_ms, initial_delay, fx);
            }
            if group.state == GroupState::PreparingRebalance {
                Self::maybe_complete_join(group, now_ms, fx);
            }
            let syncing = matches!(
                group.state,
                GroupState::CompletingRebalance | GroupState::Stable
            );
            if syncing && group.sync_deadline_ms.is_some_and(|d| now_ms >= d) {
                // Kafka's `expirePendingSync`: drop whoever has not synced (the leader
                // never sent the assignment, or a member never came for it).
                group.sync_deadline_ms = None;
                let laggards: Vec<String> = group
                    .members
                    .values()
                    .filter(|m| m.pending_sync)
                    .map(|m| m.id.clone())
                    .collect();
                for id in laggards {
                    Self::member_gone(group, &id, now_ms, initial_delay, fx);
                }
                if group.state == GroupState::CompletingRebalance {
                    Self::prepare_rebalance(group, now_ms, initial_delay, fx);
                }
            }
        }
        self.expire_consumer_members(now_ms, fx);
        if now_ms >= self.next_expiry_check_ms {
            self.next_expiry_check_ms = now_ms + self.config.offsets_retention_check_interval_ms;
            self.expire_offsets(now_ms, fx);
        }
    }

    // ---------------------------------------------------------------- DescribeGroups, ListGroups

    pub fn describe(&self, group_id: &str) -> GroupSummary {
        let Some(g) = self.groups.get(group_id).filter(|g| g.consumer.is_none()) else {
            // Kafka describes an unknown group as Dead, without an error (and a
            // consumer group so too, below DescribeGroups v6).
            return GroupSummary {
                state: GroupState::Dead,
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            };
        };
        let stable = g.state == GroupState::Stable;
        let protocol = if stable {
            g.protocol.clone().unwrap_or_default()
        } else {
            String::new()
        };
        let members = g
            .members
            .values()
            .map(|m| {
                let (meta, asg) = if stable {
                    (m.metadata(&protocol), m.assignment.clone())
                } else {
                    (Bytes::new(), Bytes::new())
                };
                (
                    m.id.clone(),
                    m.instance_id.clone(),
                    m.client_id.clone(),
                    m.client_host.clone(),
                    meta,
                    asg,
                )
            })
            .collect();
        GroupSummary {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol,
            members,
        }
    }

    /// (group id, protocol type, state, group type) of every group: classic groups in
    /// their GroupState's names, consumer groups (KIP-848) in theirs.
    pub fn list(&self) -> Vec<(String, String, &'static str, &'static str)> {
        let mut v: Vec<_> = self
            .groups
            .values()
            .map(|g| match &g.consumer {
                Some(c) => (g.id.clone(), "consumer".to_string(), c.state(), "consumer"),
                None => (
                    g.id.clone(),
                    g.protocol_type.clone().unwrap_or_default(),
                    g.state.name(),
                    "classic",
                ),
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}
