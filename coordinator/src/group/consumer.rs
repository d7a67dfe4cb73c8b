//! Consumer groups of the next protocol (KIP-848): members heartbeat
//! (ConsumerGroupHeartbeat), the coordinator computes the group's target assignment
//! with a server-side assignor and moves each member towards its target on its own —
//! a member gives up what moves away before anyone else gets it, and nobody waits on a
//! group-wide barrier.
//!
//! Epochs, as Kafka counts them:
//!
//! - the **group epoch** grows whenever what the assignment depends on changes: a member
//!   joins or goes, a subscription changes, a subscribed topic appears, goes or grows;
//! - the **assignment epoch** is the group epoch the target assignment was computed at
//!   (computed on the next heartbeat after a bump);
//! - each **member epoch** is the assignment epoch the member has reconciled to.
//!
//! A member reconciles one step per heartbeat (Kafka's `CurrentAssignmentBuilder`):
//!
//! ```text
//!   Stable ──target moved──► UnrevokedPartitions ──owned no longer holds the revoked──┐
//!     ▲    (it must give up partitions: told its assignment without them,   │
//!     │     its epoch stays until it acknowledges)                          ▼
//!     └──── all partitions free ◄── UnreleasedPartitions ◄── partitions still owned
//!                                  (new epoch; waits until their      by another member
//!                                   owners release them)
//! ```
//!
//! A partition belongs to at most one member at any time (`ConsumerGroup::owners`: the
//! assigned partitions and those pending revocation): a member is given a partition
//! only when nobody else holds it. Members that do not heartbeat within the session
//! timeout, or do not revoke within their rebalance timeout, are removed (fenced).
//!
//! Everything a heartbeat changes is written as Kafka's consumer-group records
//! (`crate::consumer_records`) before it is answered; [`Coordinator::load_consumer_record`]
//! replays them, so a coordinator that moves keeps the groups, their epochs and
//! assignments exactly.
//!
//! Groups of both protocols share the id space and the offsets: an empty classic group
//! becomes a consumer group when a member heartbeats, an empty consumer group becomes
//! classic when a member joins; a non-empty group of the other type is refused
//! (Kafka 4's `group.consumer.migration.policy=disabled`; online migration of live
//! classic members is not served).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kafka_protocol::error::ResponseError;
use uuid::Uuid;

use super::assignor::{self, Assignment, Assignor, Subscriber};
use super::{Coordinator, Effects, Group, GroupState, Record};
use crate::consumer_records::{
    self as rec, ConsumerKey, ConsumerValue, CurrentAssignment, MemberMetadata,
};

/// The member epoch that asks to leave the group.
pub const LEAVE_EPOCH: i32 = -1;
/// The member epoch a static member leaves with (it may come back as itself).
pub const STATIC_LEAVE_EPOCH: i32 = -2;

/// Where a member stands in its reconciliation (Kafka's `MemberState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Stable,
    UnrevokedPartitions,
    UnreleasedPartitions,
}

impl MemberState {
    /// The byte Kafka writes in the CurrentMemberAssignment record.
    pub fn code(self) -> i8 {
        match self {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        }
    }

    pub fn from_code(c: i8) -> MemberState {
        match c {
            1 => MemberState::UnrevokedPartitions,
            2 => MemberState::UnreleasedPartitions,
            _ => MemberState::Stable,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
        }
    }
}

/// The topics a coordinator can see (the shell's view of the metadata image).
pub trait Catalog {
    /// Changes whenever a topic is created, deleted or grows.
    fn version(&self) -> u64;
    /// A topic's id and partition count.
    fn topic(&self, name: &str) -> Option<(Uuid, i32)>;
    /// Every topic a subscription regex may match (internal topics left out).
    fn for_each_name(&self, f: &mut dyn FnMut(&str));
}

/// The consumer-group settings of the broker (Kafka's names and defaults).
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// group.consumer.session.timeout.ms
    pub session_timeout_ms: i32,
    /// group.consumer.heartbeat.interval.ms
    pub heartbeat_interval_ms: i32,
    /// group.consumer.assignors: the first is the default.
    pub assignors: Vec<Assignor>,
    /// group.consumer.max.size
    pub max_size: usize,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            assignors: vec![Assignor::Uniform, Assignor::Range],
            max_size: i32::MAX as usize,
        }
    }
}

/// A ConsumerGroupHeartbeat request, decoupled from the wire. `None` fields are
/// "unchanged since the last heartbeat".
#[derive(Debug, Clone, Default)]
pub struct HeartbeatArgs {
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1: unchanged.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    /// An empty string clears the regex.
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member owns (sent on a join, after a coordinator change, and
    /// when it acknowledges an assignment).
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
    /// The group's own `consumer.session.timeout.ms` and
    /// `consumer.heartbeat.interval.ms` (GROUP configs), if set: they override the
    /// broker's.
    pub session_timeout_ms: Option<i32>,
    pub heartbeat_interval_ms: Option<i32>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's whole assignment, when it changed or the member asked (`None`:
    /// unchanged).
    pub assignment: Option<Assignment>,
}

/// A refused heartbeat: Kafka's error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: ResponseError,
    pub message: String,
}

fn refused(code: ResponseError, message: impl Into<String>) -> Refused {
    Refused {
        code,
        message: message.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMember {
    pub id: String,
    /// What it says about itself: its MemberMetadata record (subscribed names sorted,
    /// without duplicates).
    pub meta: MemberMetadata,
    /// Where it stands: its CurrentMemberAssignment record (`revoking`: partitions it
    /// must give up before its epoch moves on).
    pub current: CurrentAssignment,
    pub(super) session_deadline_ms: i64,
    /// While it has partitions to revoke: when it is fenced if it has not.
    pub(super) revocation_deadline_ms: Option<i64>,
}

impl ConsumerMember {
    fn new(id: &str, now_ms: i64) -> ConsumerMember {
        ConsumerMember {
            id: id.to_string(),
            meta: MemberMetadata {
                rebalance_timeout_ms: 300_000,
                ..MemberMetadata::default()
            },
            current: CurrentAssignment {
                epoch: 0,
                previous_epoch: 0,
                state: MemberState::Stable,
                assigned: Assignment::new(),
                revoking: Assignment::new(),
            },
            session_deadline_ms: now_ms,
            revocation_deadline_ms: None,
        }
    }

    fn subscription_record(&self, group: &str) -> Record {
        rec::member_metadata(group, self)
    }
}

/// A consumer group's KIP-848 state (the group's offsets stay in [`Group::offsets`]).
#[derive(Debug, Clone, Default)]
pub struct ConsumerGroup {
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, ConsumerMember>,
    /// group.instance.id → member id.
    static_members: HashMap<String, String>,
    /// The target assignment of each member, at `assignment_epoch`.
    pub target: BTreeMap<String, Assignment>,
    /// Who holds each partition (assigned or pending revocation).
    owners: HashMap<(Uuid, i32), String>,
    /// The subscribed topics (id → partitions) the group epoch accounts for.
    metadata: BTreeMap<Uuid, i32>,
    /// Topic ids of `metadata` by name (offset expiry and describe speak names).
    pub topic_names: BTreeMap<Uuid, String>,
    /// The catalog version `metadata` was resolved at (`None`: resolve again).
    metadata_version: Option<u64>,
    /// The earliest a new target may be computed (see [`ASSIGNMENT_INTERVAL_MS`]).
    next_assignment_ms: i64,
}

/// The longest session timeout a group's `consumer.session.timeout.ms` may set
/// (Kafka's `group.consumer.max.session.timeout.ms`).
pub const GROUP_SESSION_TIMEOUT_MAX_MS: i32 = 60_000;

/// How often a group's target assignment is computed at most: group epochs that move
/// faster (many members joining at once) are assigned together, at the next heartbeat
/// or timer tick after this much time — not once per joining member, which made a
/// join of N members cost O(N²).
pub const ASSIGNMENT_INTERVAL_MS: i64 = 100;

/// A consumer group as ConsumerGroupDescribe shows it.
#[derive(Debug, Clone)]
pub struct ConsumerGroupView {
    pub state: &'static str,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: &'static str,
    pub members: Vec<(ConsumerMember, Assignment)>,
    pub topic_names: BTreeMap<Uuid, String>,
}

impl ConsumerGroup {
    /// Kafka's consumer-group states, derived.
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.epoch != self.assignment_epoch {
            "Assigning"
        } else if self.members.values().any(|m| {
            m.current.epoch != self.assignment_epoch || m.current.state != MemberState::Stable
        }) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// Every topic name the members subscribe to (by name or regex, as last resolved).
    pub fn subscribed_topic_names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.topic_names.values().cloned().collect();
        for m in self.members.values() {
            names.extend(m.meta.subscribed_names.iter().cloned());
        }
        names
    }

    /// The assignor the group uses: the one most members ask for, else the default.
    fn assignor(&self, cfg: &ConsumerConfig) -> Assignor {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = &m.meta.server_assignor {
                *votes.entry(a.as_str()).or_default() += 1;
            }
        }
        let best = votes.values().copied().max();
        votes
            .iter()
            .find(|(_, n)| Some(**n) == best)
            .and_then(|(a, _)| Assignor::parse(a))
            .unwrap_or_else(|| cfg.assignors.first().copied().unwrap_or(Assignor::Uniform))
    }

    fn take(&mut self, id: &str, a: &Assignment) {
        for (t, ps) in a {
            for p in ps {
                self.owners.insert((*t, *p), id.to_string());
            }
        }
    }

    fn release(&mut self, id: &str, a: &Assignment) {
        for (t, ps) in a {
            for p in ps {
                if self.owners.get(&(*t, *p)).is_some_and(|o| o == id) {
                    self.owners.remove(&(*t, *p));
                }
            }
        }
    }

    fn free_for(&self, id: &str, tp: (Uuid, i32)) -> bool {
        self.owners.get(&tp).is_none_or(|o| o == id)
    }

    /// Rebuilds the owner map from the members (after a load).
    fn rebuild_owners(&mut self) {
        self.owners.clear();
        let members: Vec<(String, Assignment, Assignment)> = self
            .members
            .values()
            .map(|m| {
                (
                    m.id.clone(),
                    m.current.assigned.clone(),
                    m.current.revoking.clone(),
                )
            })
            .collect();
        for (id, a, r) in members {
            self.take(&id, &a);
            self.take(&id, &r);
        }
        self.static_members = self
            .members
            .values()
            .filter_map(|m| m.meta.instance_id.clone().map(|i| (i, m.id.clone())))
            .collect();
    }

    /// Each member's subscribed topic ids, and the group's subscribed topics.
    fn resolve(&self, catalog: &dyn Catalog) -> ResolvedTopics {
        let mut regexes: BTreeMap<&str, Option<BTreeSet<String>>> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(r) = &m.meta.subscribed_regex {
                regexes.entry(r.as_str()).or_insert(None);
            }
        }
        for (r, matched) in regexes.iter_mut() {
            // Checked at the heartbeat that brought it; a full match, as Kafka's.
            let Ok(re) = regex::Regex::new(&format!("^(?:{r})$")) else {
                continue;
            };
            let mut names = BTreeSet::new();
            catalog.for_each_name(&mut |n| {
                if re.is_match(n) {
                    names.insert(n.to_string());
                }
            });
            *matched = Some(names);
        }
        let mut out = ResolvedTopics::default();
        for m in self.members.values() {
            let mut ids = BTreeSet::new();
            let regex_names = m
                .meta
                .subscribed_regex
                .as_deref()
                .and_then(|r| regexes.get(r).cloned().flatten())
                .unwrap_or_default();
            for name in m.meta.subscribed_names.iter().chain(regex_names.iter()) {
                if let Some((id, n)) = catalog.topic(name) {
                    ids.insert(id);
                    out.partitions.insert(id, n);
                    out.names.insert(id, name.clone());
                }
            }
            out.members.insert(m.id.clone(), ids);
        }
        out
    }
}

#[derive(Debug, Default)]
struct ResolvedTopics {
    members: BTreeMap<String, BTreeSet<Uuid>>,
    partitions: BTreeMap<Uuid, i32>,
    names: BTreeMap<Uuid, String>,
}

fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|bs| ps.is_subset(bs)))
}

fn intersects(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .any(|(t, ps)| b.get(t).is_some_and(|bs| !ps.is_disjoint(bs)))
}

fn group_full(max: usize) -> Refused {
    refused(
        ResponseError::GroupMaxSizeReached,
        format!("The consumer group has reached its maximum capacity of {max} members."),
    )
}

/// A static member's join under a member id another member holds.
fn id_taken(member: &str, instance: &str) -> Refused {
    refused(
        ResponseError::InvalidRequest,
        format!("Member {member} already exists without instance id {instance}."),
    )
}

/// Kafka's `throwIfConsumerGroupHeartbeatRequestIsInvalid` (v1: the client names
/// itself).
fn validate(a: &HeartbeatArgs, cfg: &ConsumerConfig) -> Result<(), Refused> {
    let invalid = |m: &str| Err(refused(ResponseError::InvalidRequest, m));
    if a.group_id.is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if a.member_id.is_empty() {
        return invalid("MemberId can't be empty.");
    }
    // The records carry ids as i16-length strings.
    let too_long = |s: &str| s.len() > i16::MAX as usize;
    if too_long(&a.group_id)
        || too_long(&a.member_id)
        || a.instance_id.as_deref().is_some_and(too_long)
    {
        return invalid("GroupId, MemberId and InstanceId must be at most 32767 bytes.");
    }
    if a.instance_id.as_deref() == Some("") {
        return invalid("InstanceId can't be empty.");
    }
    if a.rack_id.as_deref() == Some("") {
        return invalid("RackId can't be empty.");
    }
    match a.member_epoch {
        0 => {
            if a.rebalance_timeout_ms == -1 {
                return invalid("RebalanceTimeoutMs must be provided in first request.");
            }
            if a.owned.as_ref().is_none_or(|o| !o.is_empty()) {
                return invalid("TopicPartitions must be empty when (re-)joining.");
            }
            if a.subscribed_topic_names.is_none()
                && a.subscribed_topic_regex
                    .as_deref()
                    .is_none_or(str::is_empty)
            {
                return invalid(
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                );
            }
        }
        STATIC_LEAVE_EPOCH if a.instance_id.is_none() => {
            return invalid("InstanceId can't be null.");
        }
        e if e < STATIC_LEAVE_EPOCH => {
            return invalid(&format!(
                "MemberEpoch is {e}, but must be greater than or equal to -2."
            ));
        }
        _ => {}
    }
    if let Some(name) = a.server_assignor.as_deref() {
        if !Assignor::parse(name).is_some_and(|x| cfg.assignors.contains(&x)) {
            return Err(refused(
                ResponseError::UnsupportedAssignor,
                format!(
                    "ServerAssignor {name} is not supported. Supported assignors: {}.",
                    cfg.assignors
                        .iter()
                        .map(|x| x.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    if let Some(r) = a
        .subscribed_topic_regex
        .as_deref()
        .filter(|r| !r.is_empty())
    {
        if let Err(e) = regex::Regex::new(r) {
            return Err(refused(
                ResponseError::InvalidRegularExpression,
                format!("SubscribedTopicRegex `{r}` is not a valid regular expression: {e}."),
            ));
        }
    }
    Ok(())
}

impl Coordinator {
    /// ConsumerGroupHeartbeat. Records to make durable before answering go to `fx`; if
    /// they cannot be stored the shell forgets the partition's groups (they reload from
    /// the log) and answers with the append's error.
    pub fn consumer_heartbeat(
        &mut self,
        now_ms: i64,
        a: HeartbeatArgs,
        catalog: &dyn Catalog,
        fx: &mut Effects,
    ) -> Result<HeartbeatReply, Refused> {
        let mut cfg = self.config.consumer.clone();
        validate(&a, &cfg)?;
        if let Some(ms) = a.session_timeout_ms {
            cfg.session_timeout_ms = ms;
        }
        if let Some(ms) = a.heartbeat_interval_ms {
            cfg.heartbeat_interval_ms = ms;
        }
        let joining = a.member_epoch == 0;
        match self.groups.get_mut(&a.group_id) {
            None if !joining => {
                return Err(refused(
                    ResponseError::GroupIdNotFound,
                    format!("Consumer group {} not found.", a.group_id),
                ))
            }
            None => {
                let mut g = Group::new(&a.group_id, now_ms);
                g.consumer = Some(Box::default());
                self.groups.insert(a.group_id.clone(), g);
            }
            Some(g) if g.consumer.is_none() => {
                if g.state != GroupState::Empty || !joining {
                    return Err(refused(
                        ResponseError::GroupIdNotFound,
                        format!("Group {} is not a consumer group.", a.group_id),
                    ));
                }
                // An empty classic group becomes a consumer group (its offsets stay).
                g.consumer = Some(Box::default());
                g.protocol_type = None;
                g.protocol = None;
                g.leader = None;
            }
            Some(_) => {}
        }
        let group = self.groups.get_mut(&a.group_id).expect("present");
        let gid = group.id.clone();
        let c = group.consumer.as_mut().expect("a consumer group");
        if a.member_epoch == LEAVE_EPOCH || a.member_epoch == STATIC_LEAVE_EPOCH {
            return leave(c, &gid, now_ms, &a, fx, &mut group.state_timestamp_ms);
        }

        // The member: joined, replacing a static member that left, or known.
        let mut bump = false;
        // A member new to the group only adds to what the group subscribes to.
        let mut new_member = false;
        let member_id = match (&a.instance_id, joining) {
            (None, true) => {
                if !c.members.contains_key(&a.member_id) {
                    if c.members.len() >= cfg.max_size {
                        return Err(group_full(cfg.max_size));
                    }
                    c.members.insert(
                        a.member_id.clone(),
                        ConsumerMember::new(&a.member_id, now_ms),
                    );
                    bump = true;
                    new_member = true;
                }
                a.member_id.clone()
            }
            (Some(instance), true) => match c.static_members.get(instance).cloned() {
                Some(old) if old == a.member_id => old,
                Some(old) => {
                    if c.members.contains_key(&a.member_id) {
                        return Err(id_taken(&a.member_id, instance));
                    }
                    let prev = c.members.get(&old).expect("static members are members");
                    if prev.current.epoch != STATIC_LEAVE_EPOCH {
                        return Err(refused(
                            ResponseError::UnreleasedInstanceId,
                            format!("Static member {old} with instance id {instance} is not released yet."),
                        ));
                    }
                    // The new member takes over the old one's epoch and assignment:
                    // nothing moves.
                    let mut m = c.members.remove(&old).expect("present");
                    m.id = a.member_id.clone();
                    m.current.epoch = 0;
                    m.current.previous_epoch = 0;
                    fx.records.extend(member_tombstones(&gid, &old));
                    let target = c.target.remove(&old).unwrap_or_default();
                    let (assigned, revoking) =
                        (m.current.assigned.clone(), m.current.revoking.clone());
                    c.release(&old, &assigned);
                    c.release(&old, &revoking);
                    c.take(&m.id, &assigned);
                    c.take(&m.id, &revoking);
                    fx.records.push(rec::target_member(&gid, &m.id, &target));
                    c.target.insert(m.id.clone(), target);
                    fx.records.push(rec::current_assignment(&gid, &m));
                    c.members.insert(m.id.clone(), m);
                    c.static_members
                        .insert(instance.clone(), a.member_id.clone());
                    new_member = true;
                    a.member_id.clone()
                }
                None => {
                    if c.members.len() >= cfg.max_size {
                        return Err(group_full(cfg.max_size));
                    }
                    if c.members.contains_key(&a.member_id) {
                        return Err(id_taken(&a.member_id, instance));
                    }
                    let mut m = ConsumerMember::new(&a.member_id, now_ms);
                    m.meta.instance_id = Some(instance.clone());
                    c.members.insert(a.member_id.clone(), m);
                    c.static_members
                        .insert(instance.clone(), a.member_id.clone());
                    bump = true;
                    new_member = true;
                    a.member_id.clone()
                }
            },
            (instance, false) => {
                let Some(m) = c.members.get(&a.member_id) else {
                    return Err(refused(
                        ResponseError::UnknownMemberId,
                        format!("Member {} is not a member of group {gid}.", a.member_id),
                    ));
                };
                if let Some(i) = instance {
                    if m.meta.instance_id.as_deref() != Some(i.as_str()) {
                        return Err(refused(
                            ResponseError::FencedInstanceId,
                            format!("Static member {} with instance id {i} was fenced by another member.", a.member_id),
                        ));
                    }
                }
                if a.member_epoch > m.current.epoch {
                    return Err(refused(
                        ResponseError::FencedMemberEpoch,
                        format!("The consumer group member has a greater member epoch ({}) than the one known by the group coordinator ({}).", a.member_epoch, m.current.epoch),
                    ));
                }
                if a.member_epoch < m.current.epoch
                    && (a.member_epoch != m.current.previous_epoch
                        || a.owned
                            .as_ref()
                            .is_none_or(|o| !is_subset(o, &m.current.assigned)))
                {
                    return Err(refused(
                        ResponseError::FencedMemberEpoch,
                        format!("The consumer group member has a smaller member epoch ({}) than the one known by the group coordinator ({}).", a.member_epoch, m.current.epoch),
                    ));
                }
                a.member_id.clone()
            }
        };

        // Its subscription and the rest of what it says about itself.
        let m = c.members.get_mut(&member_id).expect("present");
        let before = m.clone();
        if let Some(r) = &a.rack_id {
            m.meta.rack_id = Some(r.clone());
        }
        if a.rebalance_timeout_ms >= 0 {
            m.meta.rebalance_timeout_ms = a.rebalance_timeout_ms;
        }
        if joining && m.current.epoch == STATIC_LEAVE_EPOCH {
            // A static member back under its own id: it reconciles from scratch.
            m.current.epoch = 0;
            m.current.previous_epoch = 0;
        }
        if joining {
            m.meta.client_id = a.client_id.clone();
            m.meta.client_host = a.client_host.clone();
        }
        if let Some(names) = &a.subscribed_topic_names {
            let mut n = names.clone();
            n.sort();
            n.dedup();
            m.meta.subscribed_names = n;
        }
        if let Some(r) = &a.subscribed_topic_regex {
            m.meta.subscribed_regex = (!r.is_empty()).then(|| r.clone());
        }
        if let Some(s) = &a.server_assignor {
            m.meta.server_assignor = Some(s.clone());
        }
        m.session_deadline_ms = now_ms + i64::from(cfg.session_timeout_ms);
        if m.meta.subscribed_names != before.meta.subscribed_names
            || m.meta.subscribed_regex != before.meta.subscribed_regex
            || m.meta.server_assignor != before.meta.server_assignor
        {
            bump = true;
        }
        if new_member
            || bump
            || m.meta.rack_id != before.meta.rack_id
            || m.meta.rebalance_timeout_ms != before.meta.rebalance_timeout_ms
            || m.meta.client_id != before.meta.client_id
            || m.meta.client_host != before.meta.client_host
        {
            fx.records.push(m.subscription_record(&gid));
        }

        // The subscribed topics: resolved again when the topics changed, or a
        // subscription changed in a way that may change them (a new member naming
        // only topics the group has already adds nothing: a thousand joining members
        // do not resolve a thousand members' subscriptions each).
        let m = &c.members[&member_id];
        // A regex another member already has matches nothing new either.
        let known_regex = |r: &String| {
            c.members
                .values()
                .any(|o| o.id != m.id && o.meta.subscribed_regex.as_ref() == Some(r))
        };
        let adds_nothing = new_member
            && m.meta.subscribed_regex.as_ref().is_none_or(known_regex)
            && m.meta.subscribed_names.iter().all(|n| {
                catalog
                    .topic(n)
                    .is_none_or(|(id, _)| c.metadata.contains_key(&id))
            });
        if (bump && !adds_nothing) || c.metadata_version != Some(catalog.version()) {
            let resolved = c.resolve(catalog);
            if resolved.partitions != c.metadata {
                bump = true;
                c.metadata = resolved.partitions;
                let topics = c
                    .metadata
                    .iter()
                    .map(|(id, n)| {
                        (
                            *id,
                            (resolved.names.get(id).cloned().unwrap_or_default(), *n),
                        )
                    })
                    .collect();
                fx.records.push(rec::partition_metadata(&gid, &topics));
            }
            c.topic_names = resolved.names;
            c.metadata_version = Some(catalog.version());
        }
        if bump {
            c.epoch += 1;
            fx.records.push(rec::group_metadata(&gid, c.epoch));
        }
        if c.epoch > c.assignment_epoch && now_ms >= c.next_assignment_ms {
            compute_target(c, &gid, catalog, &cfg, fx);
            c.next_assignment_ms = now_ms + ASSIGNMENT_INTERVAL_MS;
        }

        // One reconciliation step of this member.
        let m = c.members.get(&member_id).expect("present").clone();
        let next = reconcile(c, &m, a.owned.as_ref(), now_ms);
        let changed = next.current.assigned != m.current.assigned
            || next.current.epoch != m.current.epoch
            || next.current.state != m.current.state
            || next.current.revoking != m.current.revoking;
        if changed {
            c.release(&m.id, &m.current.assigned);
            c.release(&m.id, &m.current.revoking);
            c.take(&m.id, &next.current.assigned);
            c.take(&m.id, &next.current.revoking);
            fx.records.push(rec::current_assignment(&gid, &next));
        }
        let reply = HeartbeatReply {
            member_id: member_id.clone(),
            member_epoch: next.current.epoch,
            heartbeat_interval_ms: cfg.heartbeat_interval_ms,
            assignment: (joining || a.owned.is_some() || changed)
                .then(|| next.current.assigned.clone()),
        };
        c.members.insert(member_id, next);
        Ok(reply)
    }

    /// Computes the target assignment of consumer groups whose epoch moved on since
    /// and whose assignment interval is over (the shell's timer calls it; heartbeats
    /// compute it too).
    pub fn assign_due(&mut self, now_ms: i64, catalog: &dyn Catalog, fx: &mut Effects) {
        let cfg = self.config.consumer.clone();
        for g in self.groups.values_mut() {
            if g.loading {
                continue;
            }
            let Some(c) = g.consumer.as_mut() else {
                continue;
            };
            if c.epoch > c.assignment_epoch && now_ms >= c.next_assignment_ms {
                compute_target(c, &g.id, catalog, &cfg, fx);
                c.next_assignment_ms = now_ms + ASSIGNMENT_INTERVAL_MS;
            }
        }
    }

    /// Removes consumer-group members whose session or revocation time is over.
    pub(super) fn expire_consumer_members(&mut self, now_ms: i64, fx: &mut Effects) {
        for g in self.groups.values_mut() {
            if g.loading {
                continue;
            }
            let Some(c) = g.consumer.as_mut() else {
                continue;
            };
            let gone: Vec<String> = c
                .members
                .values()
                .filter(|m| {
                    m.session_deadline_ms <= now_ms
                        || m.revocation_deadline_ms.is_some_and(|d| d <= now_ms)
                })
                .map(|m| m.id.clone())
                .collect();
            for id in gone {
                tracing::info!(group = %g.id, member = %id, "consumer group member fenced: session or rebalance timeout");
                remove_member(c, &g.id, &id, fx);
                if c.members.is_empty() {
                    g.state_timestamp_ms = now_ms;
                }
            }
        }
    }

    /// ConsumerGroupDescribe of one group: `Err(GROUP_ID_NOT_FOUND)` if there is none
    /// or it is classic.
    pub fn describe_consumer_group(&self, group_id: &str) -> Result<ConsumerGroupView, Refused> {
        let g = self
            .groups
            .get(group_id)
            .filter(|g| g.state != GroupState::Dead);
        let Some(c) = g.and_then(|g| g.consumer.as_ref()) else {
            return Err(match g {
                Some(_) => refused(
                    ResponseError::GroupIdNotFound,
                    format!("Group {group_id} is not a consumer group."),
                ),
                None => refused(
                    ResponseError::GroupIdNotFound,
                    format!("Group {group_id} not found."),
                ),
            });
        };
        Ok(ConsumerGroupView {
            state: c.state(),
            epoch: c.epoch,
            assignment_epoch: c.assignment_epoch,
            assignor: c.assignor(&self.config.consumer).name(),
            members: c
                .members
                .values()
                .map(|m| (m.clone(), c.target.get(&m.id).cloned().unwrap_or_default()))
                .collect(),
            topic_names: c.topic_names.clone(),
        })
    }

    /// OffsetFetch v9's check (Kafka's `ConsumerGroup.validateOffsetFetch`): a member
    /// that names itself must be a current member of the KIP-848 group at its epoch
    /// (classic groups and unknown groups are not checked).
    pub fn offset_fetch_member_error(
        &self,
        group_id: &str,
        member_id: &str,
        epoch: i32,
    ) -> Option<ResponseError> {
        let c = self.groups.get(group_id)?.consumer.as_deref()?;
        let Some(m) = c.members.get(member_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        (epoch != m.current.epoch).then_some(ResponseError::StaleMemberEpoch)
    }

    /// Kafka's `ConsumerGroup.validateOffsetCommit`: members commit with their current
    /// epoch; a commit without a member (an admin tool) only to an empty group.
    pub(super) fn consumer_commit_error(
        c: &ConsumerGroup,
        member_id: &str,
        epoch: i32,
    ) -> Option<ResponseError> {
        if member_id.is_empty() && epoch < 0 {
            return (!c.members.is_empty()).then_some(ResponseError::UnknownMemberId);
        }
        let Some(m) = c.members.get(member_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        (epoch != m.current.epoch).then_some(ResponseError::StaleMemberEpoch)
    }
}

impl Coordinator {
    /// Replays one consumer-group record (types 3–8; `key` after its type).
    pub(super) fn load_consumer_record(
        &mut self,
        now_ms: i64,
        record_type: i16,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), crate::records::RecordError> {
        let (gid, k) = ConsumerKey::decode(record_type, key)?;
        let value = value.map(|v| ConsumerValue::decode(&k, v)).transpose()?;
        if value.is_none() && !self.groups.contains_key(&gid) {
            return Ok(());
        }
        let g = self
            .groups
            .entry(gid.clone())
            .or_insert_with(|| Group::new(&gid, now_ms));
        g.loading = true;
        if k == ConsumerKey::Group && value.is_none() {
            // Deleted, or turned classic.
            g.consumer = None;
            return Ok(());
        }
        let c = g.consumer.get_or_insert_with(Box::default);
        match (k, value) {
            (_, Some(ConsumerValue::Group { epoch })) => c.epoch = epoch,
            (_, Some(ConsumerValue::PartitionMetadata(topics))) => {
                c.metadata = topics.iter().map(|(id, (_, n))| (*id, *n)).collect();
                c.topic_names = topics
                    .into_iter()
                    .map(|(id, (name, _))| (id, name))
                    .collect();
            }
            (_, Some(ConsumerValue::TargetMetadata { assignment_epoch })) => {
                c.assignment_epoch = assignment_epoch;
            }
            (ConsumerKey::Member(id), Some(ConsumerValue::Member(v))) => {
                let m = c
                    .members
                    .entry(id.clone())
                    .or_insert_with(|| ConsumerMember::new(&id, now_ms));
                m.meta = v;
            }
            (ConsumerKey::Member(id), None) => {
                c.members.remove(&id);
            }
            (ConsumerKey::TargetMember(id), Some(ConsumerValue::TargetMember(a))) => {
                c.target.insert(id, a);
            }
            (ConsumerKey::TargetMember(id), None) => {
                c.target.remove(&id);
            }
            (ConsumerKey::CurrentAssignment(id), Some(ConsumerValue::CurrentAssignment(v))) => {
                let m = c
                    .members
                    .entry(id.clone())
                    .or_insert_with(|| ConsumerMember::new(&id, now_ms));
                m.current = v;
            }
            _ => {}
        }
        Ok(())
    }
}

impl ConsumerGroup {
    /// After a load: who owns what, and the members' timers, which start now (as a
    /// classic group's sessions do). The session is the longer of the broker's and the
    /// longest a group's own config may set (the group's configs are not known here):
    /// live members heartbeat well within it and reset it to their group's.
    pub(super) fn restored(&mut self, now_ms: i64, session_timeout_ms: i32) {
        self.rebuild_owners();
        self.metadata_version = None;
        let session = session_timeout_ms.max(GROUP_SESSION_TIMEOUT_MAX_MS);
        for m in self.members.values_mut() {
            m.session_deadline_ms = now_ms + i64::from(session);
            m.revocation_deadline_ms = (m.current.state == MemberState::UnrevokedPartitions)
                .then(|| now_ms + i64::from(m.meta.rebalance_timeout_ms));
        }
    }
}

/// A member leaves: a dynamic one (epoch -1) is removed and its partitions freed; a
/// static one (-2) keeps its assignment until it comes back or its session ends.
fn leave(
    c: &mut ConsumerGroup,
    gid: &str,
    now_ms: i64,
    a: &HeartbeatArgs,
    fx: &mut Effects,
    empty_since: &mut i64,
) -> Result<HeartbeatReply, Refused> {
    let id = match (&a.instance_id, c.members.contains_key(&a.member_id)) {
        (Some(i), _) => match c.static_members.get(i) {
            Some(m) if *m == a.member_id => m.clone(),
            Some(_) => {
                return Err(refused(
                    ResponseError::FencedInstanceId,
                    format!(
                        "Static member {} with instance id {i} was fenced.",
                        a.member_id
                    ),
                ))
            }
            None => {
                return Err(refused(
                    ResponseError::UnknownMemberId,
                    format!("Instance id {i} is unknown."),
                ))
            }
        },
        (None, true) => a.member_id.clone(),
        (None, false) => {
            return Err(refused(
                ResponseError::UnknownMemberId,
                format!("Member {} is not a member of group {gid}.", a.member_id),
            ))
        }
    };
    if a.member_epoch == STATIC_LEAVE_EPOCH {
        let m = c.members.get_mut(&id).expect("present");
        m.current.previous_epoch = m.current.epoch;
        m.current.epoch = STATIC_LEAVE_EPOCH;
        let m = m.clone();
        fx.records.push(rec::current_assignment(gid, &m));
    } else {
        remove_member(c, gid, &id, fx);
        if c.members.is_empty() {
            *empty_since = now_ms;
        }
    }
    Ok(HeartbeatReply {
        member_id: id,
        member_epoch: a.member_epoch,
        heartbeat_interval_ms: 0,
        assignment: None,
    })
}

fn member_tombstones(gid: &str, id: &str) -> [Record; 3] {
    [
        rec::tombstone(gid, ConsumerKey::CurrentAssignment(id.to_string())),
        rec::tombstone(gid, ConsumerKey::TargetMember(id.to_string())),
        rec::tombstone(gid, ConsumerKey::Member(id.to_string())),
    ]
}

/// The group-level consumer records' tombstones (the group is deleted or turns
/// classic; its members are gone already).
pub(super) fn group_tombstones(gid: &str) -> Vec<Record> {
    [
        ConsumerKey::TargetMetadata,
        ConsumerKey::PartitionMetadata,
        ConsumerKey::Group,
    ]
    .into_iter()
    .map(|k| rec::tombstone(gid, k))
    .collect()
}

/// Removes a member and frees its partitions; the group epoch moves on.
fn remove_member(c: &mut ConsumerGroup, gid: &str, id: &str, fx: &mut Effects) {
    let Some(m) = c.members.remove(id) else {
        return;
    };
    if let Some(i) = &m.meta.instance_id {
        if c.static_members.get(i).is_some_and(|x| x == id) {
            c.static_members.remove(i);
        }
    }
    c.release(id, &m.current.assigned);
    c.release(id, &m.current.revoking);
    c.target.remove(id);
    fx.records.extend(member_tombstones(gid, id));
    c.epoch += 1;
    fx.records.push(rec::group_metadata(gid, c.epoch));
    // The subscribed topics are resolved again at the next heartbeat.
    c.metadata_version = None;
}

/// The group's next target assignment, at the group epoch.
fn compute_target(
    c: &mut ConsumerGroup,
    gid: &str,
    catalog: &dyn Catalog,
    cfg: &ConsumerConfig,
    fx: &mut Effects,
) {
    let resolved = c.resolve(catalog);
    let empty = Assignment::new();
    let subs: Vec<Subscriber<'_>> = c
        .members
        .values()
        .map(|m| Subscriber {
            id: &m.id,
            topics: resolved.members.get(&m.id).cloned().unwrap_or_default(),
            current: c.target.get(&m.id).unwrap_or(&empty),
        })
        .collect();
    let next = assignor::assign(c.assignor(cfg), &subs, &resolved.partitions);
    for (id, a) in &next {
        if c.target.get(id) != Some(a) {
            fx.records.push(rec::target_member(gid, id, a));
        }
    }
    c.target = next;
    c.assignment_epoch = c.epoch;
    fx.records
        .push(rec::target_metadata(gid, c.assignment_epoch));
}

/// One step of a member towards its target (Kafka's `CurrentAssignmentBuilder`).
fn reconcile(
    c: &ConsumerGroup,
    m: &ConsumerMember,
    owned: Option<&Assignment>,
    now_ms: i64,
) -> ConsumerMember {
    if m.current.epoch == STATIC_LEAVE_EPOCH {
        return m.clone();
    }
    let target_epoch = c.assignment_epoch;
    match m.current.state {
        MemberState::Stable if m.current.epoch == target_epoch => m.clone(),
        MemberState::UnrevokedPartitions => {
            // Acknowledged only by an owned list without the revoked partitions.
            if owned.is_none_or(|o| intersects(o, &m.current.revoking)) {
                return m.clone();
            }
            let mut base = m.clone();
            base.current.revoking.clear();
            next_step(
                c,
                &base,
                (m.current.epoch + 1).min(target_epoch),
                owned,
                now_ms,
            )
        }
        _ => next_step(c, m, m.current.epoch, owned, now_ms),
    }
}

fn next_step(
    c: &ConsumerGroup,
    m: &ConsumerMember,
    epoch: i32,
    owned: Option<&Assignment>,
    now_ms: i64,
) -> ConsumerMember {
    let empty = Assignment::new();
    let target = c.target.get(&m.id).unwrap_or(&empty);
    let mut keep = Assignment::new();
    let mut revoke = Assignment::new();
    for (t, ps) in &m.current.assigned {
        for &p in ps {
            let dst = if target.get(t).is_some_and(|x| x.contains(&p)) {
                &mut keep
            } else {
                &mut revoke
            };
            dst.entry(*t).or_default().insert(p);
        }
    }
    let mut next = m.clone();
    // Revoked already if the member says it no longer owns them.
    if !revoke.is_empty() && owned.is_none_or(|o| intersects(o, &revoke)) {
        next.current.state = MemberState::UnrevokedPartitions;
        if epoch != m.current.epoch {
            next.current.previous_epoch = m.current.epoch;
        }
        next.current.epoch = epoch;
        next.current.assigned = keep;
        next.current.revoking = revoke;
        // Kafka sets the rebalance timer on every move into this state: a member that
        // revoked in time and is asked to revoke more gets its full timeout again.
        if next.current.revoking != m.current.revoking || m.revocation_deadline_ms.is_none() {
            next.revocation_deadline_ms = Some(now_ms + i64::from(m.meta.rebalance_timeout_ms));
        }
        return next;
    }
    let mut unreleased = false;
    for (t, ps) in target {
        for &p in ps {
            if c.free_for(&m.id, (*t, p)) {
                keep.entry(*t).or_default().insert(p);
            } else {
                unreleased = true;
            }
        }
    }
    next.current.assigned = keep;
    next.current.revoking.clear();
    next.revocation_deadline_ms = None;
    next.current.epoch = c.assignment_epoch;
    if next.current.epoch != m.current.epoch {
        next.current.previous_epoch = m.current.epoch;
    }
    next.current.state = if unreleased {
        MemberState::UnreleasedPartitions
    } else {
        MemberState::Stable
    };
    next
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::ConsumerMember;

    pub fn member(id: &str) -> ConsumerMember {
        ConsumerMember::new(id, 0)
    }
}
