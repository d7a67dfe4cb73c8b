//! `sluice-bench group`: many lightweight consumer-group members (one connection and
//! one task each, classic protocol: JoinGroup with the member-id round trip, SyncGroup,
//! Heartbeat, LeaveGroup) join one group over a topic of many partitions. Reports the
//! time from the first JoinGroup until every member has its assignment in one stable
//! generation, the time from one member's LeaveGroup until every remaining member
//! has its assignment in the next generation, and the time from a new member's first
//! JoinGroup until every member, the new one too, has its assignment in the generation
//! after that. The leader assigns round-robin.
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
        let (group, topic) = (self.opts.group.clone(), self.opts.topic.clone());
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
                    27 | 22 => continue 'generation,
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
    let join_generation = all_synced(&shared, 0, |i| i < joiner, deadline).await?;
    let join_ms = start.elapsed().as_secs_f64() * 1e3;
    // One member leaves; the rest rebalance.
    let leaver = opts.members / 2;
    shared.leaver.set(Some(leaver));
    while !shared.left.get() {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
    let left_at = Instant::now();
    let rebalance_generation = all_synced(
        &shared,
        join_generation,
        |i| i < joiner && i != leaver,
        deadline,
    )
    .await?;
    let rebalance_after_leave_ms = left_at.elapsed().as_secs_f64() * 1e3;
    // A new member joins; everyone rebalances again.
    let joined_at = Instant::now();
    tasks.push(glommio::spawn_local(late.run()));
    let rebalance_after_join_generation =
        all_synced(&shared, rebalance_generation, |i| i != leaver, deadline).await?;
    let rebalance_after_join_ms = joined_at.elapsed().as_secs_f64() * 1e3;
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
    })
}
