//! `sluice-bench group`: many lightweight consumer-group members (one connection and
//! one task each, classic protocol: JoinGroup with the member-id round trip, SyncGroup,
//! Heartbeat, LeaveGroup) join one group over a topic of many partitions. Reports the
//! time from the first JoinGroup until every member has its assignment in one stable
//! generation, the time from one member's LeaveGroup until every remaining member
//! has its assignment in the next generation, and the time from a new member's first
//! JoinGroup until every member, the new one too, has its assignment in the generation
//! after that. The leader assigns round-robin.
//!
//! With `--protocol consumer` the members speak the next protocol instead (KIP-848:
//! ConsumerGroupHeartbeat, the broker's assignor): the times are until every partition
//! is owned by a live member and every member has reconciled to one epoch. Both
//! protocols also report, for the leave and the join, how many of the other members
//! stopped consuming altogether at some moment and for how long at most (classic:
//! from the heartbeat that announces the rebalance to the SyncGroup answer, as the
//! eager protocol revokes everything; KIP-848: while a member owns nothing after
//! owning something).
//!
//! Each member holds one connection, so the process needs one descriptor per member
//! (checked up front against its open-file limit) and so does the broker. Connecting
//! counts against `--timeout` too: a broker out of descriptors leaves connections in
//! its listen backlog, and the bench then ends with an error instead of waiting.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, GroupId, HeartbeatRequest,
    JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

use crate::kafka::{err, topic_name, Client};

#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupOpts {
    pub bootstrap: SocketAddr,
    pub topic: String,
    pub group: String,
    pub members: usize,
    pub partitions: i32,
    pub session_timeout_ms: i32,
    pub heartbeat_ms: u64,
    pub timeout_s: f64,
    /// "classic" (JoinGroup/SyncGroup) or "consumer" (KIP-848).
    pub protocol: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupResult {
    /// Time to open every member's connection (not part of the other figures).
    pub connect_ms: f64,
    pub join_ms: f64,
    pub join_generation: i32,
    pub rebalance_after_leave_ms: f64,
    pub rebalance_generation: i32,
    pub rebalance_after_join_ms: f64,
    pub rebalance_after_join_generation: i32,
    /// Members other than the leaver that stopped consuming altogether while the
    /// group absorbed the leave, and the longest such stop.
    pub leave_paused_members: usize,
    pub leave_max_pause_ms: f64,
    /// The same for the join of one new member (the joiner not counted).
    pub join_paused_members: usize,
    pub join_max_pause_ms: f64,
}

const JOIN_V: i16 = 5;
const SYNC_V: i16 = 3;
const HEARTBEAT_V: i16 = 3;
const LEAVE_V: i16 = 3;

fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_string())
}

/// Consumer-protocol bytes: a version prefix (i16) then the struct.
fn versioned(v: i16, m: &impl Encodable) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(v);
    m.encode(&mut b, v).expect("encodable");
    b.freeze()
}

/// What the members report to the driver.
#[derive(Default)]
struct Shared {
    /// Per member: the generation in which it last received a non-empty assignment.
    synced_generation: RefCell<Vec<i32>>,
    /// Members told to stop.
    stop: Cell<bool>,
    /// The member told to leave.
    leaver: Cell<Option<usize>>,
    left: Cell<bool>,
    /// Stops of consuming that ended: (member, how long in ms).
    pauses: RefCell<Vec<(usize, f64)>>,
    /// KIP-848: per member, how many partitions it owns.
    owned: RefCell<Vec<usize>>,
    /// KIP-848: the topic's id (assignments name topics by id).
    topic_id: Cell<uuid::Uuid>,
}

impl Shared {
    /// The stops since the last call, not counting `except`: (members, longest ms).
    fn take_pauses(&self, except: usize) -> (usize, f64) {
        let p = std::mem::take(&mut *self.pauses.borrow_mut());
        let mut members: Vec<usize> = p.iter().map(|(i, _)| *i).filter(|i| *i != except).collect();
        members.sort_unstable();
        members.dedup();
        let max = p
            .iter()
            .filter(|(i, _)| *i != except)
            .map(|(_, ms)| *ms)
            .fold(0.0, f64::max);
        (members.len(), max)
    }
}

struct Member {
    idx: usize,
    client: Client,
    id: String,
    opts: Rc<GroupOpts>,
    shared: Rc<Shared>,
}

/// JoinGroup as a consumer of `topic` until the coordinator places member `id` (empty
/// for a new member; updated to the id the coordinator gives) in a generation:
/// (generation, whether this member leads, the members).
pub async fn join(
    client: &mut Client,
    group: &str,
    topic: &str,
    session_timeout_ms: i32,
    id: &mut String,
) -> std::io::Result<(i32, bool, Vec<String>)> {
    let sub = ConsumerProtocolSubscription::default().with_topics(vec![s(topic)]);
    loop {
        let req = JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_session_timeout_ms(session_timeout_ms)
            .with_rebalance_timeout_ms(60_000)
            .with_member_id(s(id))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("roundrobin"))
                .with_metadata(versioned(0, &sub))]);
        let r = client.request(&req, JOIN_V).await?;
        match r.error_code {
            0 => {
                *id = r.member_id.to_string();
                let leader = r.leader.as_str() == id.as_str();
                let members = r.members.iter().map(|m| m.member_id.to_string()).collect();
                return Ok((r.generation_id, leader, members));
            }
            // MEMBER_ID_REQUIRED: join again with the id we were given.
            79 => *id = r.member_id.to_string(),
            // UNKNOWN_MEMBER_ID: start over.
            25 => id.clear(),
            // REBALANCE_IN_PROGRESS and friends: retry.
            27 | 14 | 15 => {}
            e => return Err(err(format!("JoinGroup error {e}"))),
        }
    }
}

/// The leader's round-robin assignment of `partitions` of `topic` over `members`.
fn assignments(
    topic: &str,
    partitions: i32,
    members: &[String],
) -> Vec<SyncGroupRequestAssignment> {
    let mut sorted = members.to_vec();
    sorted.sort();
    let n = sorted.len().max(1);
    let mut per: Vec<Vec<i32>> = vec![Vec::new(); n];
    for p in 0..partitions {
        per[p as usize % n].push(p);
    }
    sorted
        .into_iter()
        .zip(per)
        .map(|(m, ps)| {
            let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
                TopicPartition::default()
                    .with_topic(topic_name(topic))
                    .with_partitions(ps),
            ]);
            SyncGroupRequestAssignment::default()
                .with_member_id(s(&m))
                .with_assignment(versioned(0, &a))
        })
        .collect()
}

/// SyncGroup of member `id` in `generation`, with the assignments if it leads;
/// returns the error code.
async fn sync(
    client: &mut Client,
    group: &str,
    generation: i32,
    id: &str,
    assignments: Vec<SyncGroupRequestAssignment>,
) -> std::io::Result<i16> {
    let req = SyncGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id(generation)
        .with_member_id(s(id))
        .with_assignments(assignments);
    Ok(client.request(&req, SYNC_V).await?.error_code)
}

/// Heartbeat of member `id` in `generation`; returns the error code.
pub async fn heartbeat(
    client: &mut Client,
    group: &str,
    generation: i32,
    id: &str,
) -> std::io::Result<i16> {
    let req = HeartbeatRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id(generation)
        .with_member_id(s(id));
    Ok(client.request(&req, HEARTBEAT_V).await?.error_code)
}

/// LeaveGroup of member `id`, so that the group need not wait out its session.
pub async fn leave(client: &mut Client, group: &str, id: &str) -> std::io::Result<()> {
    let req = LeaveGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_members(vec![MemberIdentity::default().with_member_id(s(id))]);
    client.request(&req, LEAVE_V).await?;
    Ok(())
}

/// Joins `group` as its only member, which leads and takes all `partitions` of
/// `topic`: (generation, member id). Another member in the group is an error (the
/// caller needs every partition).
pub async fn join_alone(
    client: &mut Client,
    group: &str,
    topic: &str,
    partitions: i32,
    session_timeout_ms: i32,
) -> std::io::Result<(i32, String)> {
    let mut id = String::new();
    loop {
        let (generation, leader, members) =
            join(client, group, topic, session_timeout_ms, &mut id).await?;
        if !leader || members.len() != 1 {
            return Err(err(format!(
                "group {group} has other members ({members:?}): use a group of its own"
            )));
        }
        let mine = assignments(topic, partitions, &members);
        match sync(client, group, generation, &id, mine).await? {
            0 => return Ok((generation, id)),
            27 | 22 => {}
            25 => id.clear(),
            e => return Err(err(format!("SyncGroup error {e}"))),
        }
    }
}

impl Member {
    /// Joins, syncs and heartbeats until told to stop; rejoins on rebalance.
    async fn run(mut self) -> std::io::Result<()> {
        if self.opts.protocol == "consumer" {
            return self.run_consumer().await;
        }
        let (group, topic) = (self.opts.group.clone(), self.opts.topic.clone());
        // Since when it consumes nothing: the eager protocol gives everything up when
        // a rebalance is announced, until SyncGroup hands the new assignment out.
        let mut paused_since: Option<Instant> = None;
        'generation: loop {
            let (generation, leader, members) = join(
                &mut self.client,
                &group,
                &topic,
                self.opts.session_timeout_ms,
                &mut self.id,
            )
            .await?;
            let mine = if leader {
                assignments(&topic, self.opts.partitions, &members)
            } else {
                Vec::new()
            };
            match sync(&mut self.client, &group, generation, &self.id, mine).await? {
                0 => {}
                27 | 22 => continue 'generation,
                25 => {
                    self.id.clear();
                    continue 'generation;
                }
                e => return Err(err(format!("SyncGroup error {e}"))),
            }
            // (Empty when there are more members than partitions.)
            self.shared.synced_generation.borrow_mut()[self.idx] = generation;
            if let Some(t) = paused_since.take() {
                let ms = t.elapsed().as_secs_f64() * 1e3;
                self.shared.pauses.borrow_mut().push((self.idx, ms));
            }
            loop {
                glommio::timer::sleep(Duration::from_millis(self.opts.heartbeat_ms)).await;
                if self.shared.stop.get() {
                    return Ok(());
                }
                if self.shared.leaver.get() == Some(self.idx) {
                    leave(&mut self.client, &group, &self.id).await?;
                    self.shared.left.set(true);
                    return Ok(());
                }
                match heartbeat(&mut self.client, &group, generation, &self.id).await? {
                    0 => {}
                    27 | 22 => {
                        paused_since.get_or_insert_with(Instant::now);
                        continue 'generation;
                    }
                    25 => {
                        self.id.clear();
                        continue 'generation;
                    }
                    e => return Err(err(format!("Heartbeat error {e}"))),
                }
            }
        }
    }
}

impl Member {
    /// A KIP-848 member: heartbeats every `heartbeat_ms` (at once after an assignment
    /// change, with what it owns, as librdkafka acknowledges), follows its assignment,
    /// rejoins when fenced, leaves with epoch -1 when told to.
    async fn run_consumer(mut self) -> std::io::Result<()> {
        use kafka_protocol::messages::ConsumerGroupHeartbeatRequest;
        let group = self.opts.group.clone();
        self.id = uuid::Uuid::new_v4().simple().to_string();
        let mut epoch = 0;
        let mut owned: std::collections::BTreeSet<i32> = Default::default();
        let mut ack = false;
        let mut paused_since: Option<Instant> = None;
        loop {
            if self.shared.stop.get() {
                return Ok(());
            }
            let leaving = self.shared.leaver.get() == Some(self.idx);
            let mut req = ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s(&group)))
                .with_member_id(s(&self.id))
                .with_member_epoch(if leaving { -1 } else { epoch })
                .with_rebalance_timeout_ms(-1);
            if epoch == 0 && !leaving {
                req = req
                    .with_rebalance_timeout_ms(60_000)
                    .with_subscribed_topic_names(Some(vec![topic_name(&self.opts.topic)]))
                    .with_topic_partitions(Some(Vec::new()));
            } else if ack {
                req = req.with_topic_partitions(Some(vec![
                    kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions::default()
                        .with_topic_id(self.shared.topic_id.get())
                        .with_partitions(owned.iter().copied().collect()),
                ]));
            }
            let r = self.client.request(&req, 1).await?;
            if leaving {
                self.shared.left.set(true);
                return Ok(());
            }
            ack = false;
            match r.error_code {
                0 => {
                    epoch = r.member_epoch;
                    if let Some(a) = r.assignment {
                        let new: std::collections::BTreeSet<i32> = a
                            .topic_partitions
                            .iter()
                            .filter(|t| t.topic_id == self.shared.topic_id.get())
                            .flat_map(|t| t.partitions.iter().copied())
                            .collect();
                        if new != owned {
                            if new.is_empty() && !owned.is_empty() {
                                paused_since = Some(Instant::now());
                            }
                            if !new.is_empty() {
                                if let Some(t) = paused_since.take() {
                                    let ms = t.elapsed().as_secs_f64() * 1e3;
                                    self.shared.pauses.borrow_mut().push((self.idx, ms));
                                }
                            }
                            owned = new;
                            ack = true;
                        }
                    }
                    self.shared.owned.borrow_mut()[self.idx] = owned.len();
                    self.shared.synced_generation.borrow_mut()[self.idx] = epoch;
                }
                // UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH: join again, owning nothing.
                25 | 110 => {
                    epoch = 0;
                    owned.clear();
                    self.shared.owned.borrow_mut()[self.idx] = 0;
                }
                // Coordinator moving or loading: retry.
                14..=16 => {}
                e => return Err(err(format!("ConsumerGroupHeartbeat error {e}"))),
            }
            if !ack {
                glommio::timer::sleep(Duration::from_millis(self.opts.heartbeat_ms)).await;
            }
        }
    }
}

/// KIP-848: waits until the `live` members own all `partitions`, evenly (at most one
/// apart), and have reconciled to one epoch above `after`; returns that epoch.
async fn all_consuming(
    shared: &Shared,
    after: i32,
    live: impl Fn(usize) -> bool,
    partitions: usize,
    deadline: Instant,
) -> std::io::Result<i32> {
    loop {
        let epochs = shared.synced_generation.borrow().clone();
        let owned = shared.owned.borrow().clone();
        let live: Vec<usize> = (0..epochs.len()).filter(|i| live(*i)).collect();
        let e = live.iter().map(|i| epochs[*i]).min().unwrap_or(0);
        let total: usize = live.iter().map(|i| owned[*i]).sum();
        // Balanced too (the uniform assignor's end state): an epoch every member has
        // reached may still be an early target's, before the later joins were assigned.
        let most = live.iter().map(|i| owned[*i]).max().unwrap_or(0);
        let least = live.iter().map(|i| owned[*i]).min().unwrap_or(0);
        if e > after
            && live.iter().all(|i| epochs[*i] == e)
            && total == partitions
            && most - least <= 1
        {
            return Ok(e);
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "timed out: {total} of {partitions} partitions owned, epochs {}..{}",
                e,
                live.iter().map(|i| epochs[*i]).max().unwrap_or(0)
            )));
        }
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until every member `live` counts has an assignment, all from one generation
/// above `after`; returns that generation.
async fn all_synced(
    shared: &Shared,
    after: i32,
    live: impl Fn(usize) -> bool,
    deadline: Instant,
) -> std::io::Result<i32> {
    loop {
        let gens = shared.synced_generation.borrow().clone();
        let live: Vec<i32> = gens
            .iter()
            .enumerate()
            .filter(|(i, _)| live(*i))
            .map(|(_, g)| *g)
            .collect();
        let g = live.iter().copied().min().unwrap_or(0);
        if g > after && live.iter().all(|x| *x == g) {
            return Ok(g);
        }
        if Instant::now() > deadline {
            let done = live.iter().filter(|x| **x > after).count();
            return Err(err(format!(
                "timed out: {done} of {} members have an assignment",
                live.len()
            )));
        }
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
}

/// The process's soft open-file limit (None if unknown or unlimited).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Connects, or fails once `deadline` passes (a broker out of descriptors or
/// connection slots leaves the connection waiting in its listen backlog).
async fn connect_by(addr: SocketAddr, deadline: Instant) -> std::io::Result<Client> {
    let timeout = async {
        let left = deadline.saturating_duration_since(Instant::now());
        glommio::timer::sleep(left).await;
        Err(err(format!(
            "timed out connecting to {addr} (is the broker out of descriptors?)"
        )))
    };
    futures_lite::future::or(Client::connect(addr), timeout).await
}

pub async fn run(opts: GroupOpts) -> std::io::Result<GroupResult> {
    let opts = Rc::new(opts);
    // Every member's connection, the joiner's and the admin's, plus a few for the
    // executor itself.
    let needed = opts.members + 1 + 64;
    if let Some(limit) = open_files_limit() {
        if limit < needed {
            return Err(err(format!(
                "{} members need {needed} open files, over this process's limit of {limit} \
                 (raise it: ulimit -n)",
                opts.members
            )));
        }
    }
    let deadline = Instant::now() + Duration::from_secs_f64(opts.timeout_s);
    let mut admin = connect_by(opts.bootstrap, deadline).await?;
    admin
        .create_topic(&opts.topic, opts.partitions, 1)
        .await
        .map_err(|e| err(format!("creating {}: {e}", opts.topic)))?;
    // All members talk to the group's coordinator.
    let coordinator = admin.coordinator(&opts.group, 0).await?;
    let shared = Rc::new(Shared::default());
    if opts.protocol == "consumer" {
        // v10+ carries topic ids (the bench's usual Metadata version is older).
        let req = kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(topic_name(&opts.topic))),
        ]));
        let meta = admin.request(&req, 12).await?;
        let id = meta
            .topics
            .first()
            .map(|t| t.topic_id)
            .filter(|id| !id.is_nil())
            .ok_or_else(|| err(format!("no topic id for {} (Metadata v10+)", opts.topic)))?;
        shared.topic_id.set(id);
    }
    *shared.owned.borrow_mut() = vec![0; opts.members + 1];
    // The members, then the one that joins the stable group at the end.
    let joiner = opts.members;
    *shared.synced_generation.borrow_mut() = vec![0; opts.members + 1];
    let connecting = Instant::now();
    let mut clients = Vec::with_capacity(opts.members + 1);
    for i in 0..=opts.members {
        let c = connect_by(coordinator, deadline)
            .await
            .map_err(|e| err(format!("connection {} of {}: {e}", i + 1, opts.members + 1)))?;
        clients.push(c);
    }
    let connect_ms = connecting.elapsed().as_secs_f64() * 1e3;
    let mut members: Vec<Member> = clients
        .into_iter()
        .enumerate()
        .map(|(idx, client)| Member {
            idx,
            client,
            id: String::new(),
            opts: opts.clone(),
            shared: shared.clone(),
        })
        .collect();
    let late = members.pop().expect("the joiner");
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(opts.members + 1);
    for m in members {
        tasks.push(glommio::spawn_local(m.run()));
    }
    let consumer = opts.protocol == "consumer";
    let parts = usize::try_from(opts.partitions).unwrap_or(0);
    let join_generation = if consumer {
        all_consuming(&shared, 0, |i| i < joiner, parts, deadline).await?
    } else {
        all_synced(&shared, 0, |i| i < joiner, deadline).await?
    };
    let join_ms = start.elapsed().as_secs_f64() * 1e3;
    shared.take_pauses(usize::MAX);
    // One member leaves; the rest rebalance.
    let leaver = opts.members / 2;
    shared.leaver.set(Some(leaver));
    while !shared.left.get() {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
    let left_at = Instant::now();
    let staying = |i: usize| i < joiner && i != leaver;
    let rebalance_generation = if consumer {
        all_consuming(&shared, join_generation, staying, parts, deadline).await?
    } else {
        all_synced(&shared, join_generation, staying, deadline).await?
    };
    let rebalance_after_leave_ms = left_at.elapsed().as_secs_f64() * 1e3;
    let (leave_paused_members, leave_max_pause_ms) = shared.take_pauses(leaver);
    // A new member joins; everyone rebalances again.
    let joined_at = Instant::now();
    tasks.push(glommio::spawn_local(late.run()));
    let rebalance_after_join_generation = if consumer {
        all_consuming(
            &shared,
            rebalance_generation,
            |i| i != leaver,
            parts,
            deadline,
        )
        .await?
    } else {
        all_synced(&shared, rebalance_generation, |i| i != leaver, deadline).await?
    };
    let rebalance_after_join_ms = joined_at.elapsed().as_secs_f64() * 1e3;
    let (join_paused_members, join_max_pause_ms) = shared.take_pauses(joiner);
    shared.stop.set(true);
    for t in tasks {
        if let Err(e) = t.await {
            return Err(err(format!("member failed: {e}")));
        }
    }
    Ok(GroupResult {
        connect_ms,
        join_ms,
        join_generation,
        rebalance_after_leave_ms,
        rebalance_generation,
        rebalance_after_join_ms,
        rebalance_after_join_generation,
        leave_paused_members,
        leave_max_pause_ms,
        join_paused_members,
        join_max_pause_ms,
    })
}
