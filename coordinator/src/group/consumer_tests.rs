//! KIP-848 consumer groups: the heartbeat's rules one by one, then a simulation of
//! members that join, acknowledge, leave, crash and follow the group through coordinator
//! moves (a fresh coordinator replays the records written so far), checking after every
//! step that no partition is held by two members and that a reload is exact.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::error::ResponseError as E;
use uuid::Uuid;

use super::consumer::{Catalog, HeartbeatArgs, HeartbeatReply, MemberState, Refused};
use super::*;

const SESSION: i64 = 45_000;

struct Topics {
    version: u64,
    topics: BTreeMap<String, (Uuid, i32)>,
}

impl Catalog for Topics {
    fn version(&self) -> u64 {
        self.version
    }
    fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
        self.topics.get(name).copied()
    }
    fn for_each_name(&self, f: &mut dyn FnMut(&str)) {
        for n in self.topics.keys() {
            f(n);
        }
    }
}

fn topics(list: &[(&str, u8, i32)]) -> Topics {
    Topics {
        version: 1,
        topics: list
            .iter()
            .map(|(n, id, p)| (n.to_string(), (Uuid::from_bytes([*id; 16]), *p)))
            .collect(),
    }
}

/// A classic JoinGroup of a new member of `group`.
fn classic_join(group: &str) -> JoinArgs {
    JoinArgs {
        group_id: group.into(),
        member_id: String::new(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "h".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 10_000,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), bytes::Bytes::new())],
        require_known_member_id: false,
        supports_skip_assignment: false,
    }
}

fn join_args(member: &str, names: &[&str]) -> HeartbeatArgs {
    HeartbeatArgs {
        group_id: "g".into(),
        member_id: member.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(names.iter().map(|s| s.to_string()).collect()),
        subscribed_topic_regex: Some(String::new()),
        owned: Some(Assignment::new()),
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        ..HeartbeatArgs::default()
    }
}

fn beat(member: &str, epoch: i32, owned: Option<Assignment>) -> HeartbeatArgs {
    HeartbeatArgs {
        group_id: "g".into(),
        member_id: member.into(),
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        owned,
        ..HeartbeatArgs::default()
    }
}

/// `args` from static member `instance` (group.instance.id).
fn as_static(mut args: HeartbeatArgs, instance: &str) -> HeartbeatArgs {
    args.instance_id = Some(instance.into());
    args
}

fn hb(
    c: &mut Coordinator,
    log: &mut Vec<Record>,
    now: i64,
    a: HeartbeatArgs,
    t: &Topics,
) -> Result<HeartbeatReply, Refused> {
    let mut fx = Effects::default();
    let r = c.consumer_heartbeat(now, a, t, &mut fx);
    log.extend(fx.records);
    r
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

/// No partition is held (assigned or pending revocation) by two members.
fn exclusive(c: &Coordinator) {
    let Some(g) = c.group("g").and_then(|g| g.consumer.as_ref()) else {
        return;
    };
    let mut seen = BTreeSet::new();
    for m in g.members.values() {
        for (t, ps) in m.current.assigned.iter().chain(m.current.revoking.iter()) {
            for p in ps {
                assert!(seen.insert((*t, *p)), "{t}-{p} held twice: {:?}", g.members);
            }
        }
    }
}

fn reload(log: &[Record], now: i64) -> Coordinator {
    let mut c = Coordinator::new(CoordinatorConfig::default());
    for r in log {
        c.load_record(now, &r.key, r.value.as_deref()).unwrap();
    }
    let mut fx = Effects::default();
    c.loaded(now, |_| true, &mut fx);
    c
}

#[test]
fn a_second_member_gets_partitions_only_after_the_first_gives_them_up() {
    let t = topics(&[("orders", 1, 4)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    let a = hb(&mut c, &mut log, 0, join_args("a", &["orders"]), &t).unwrap();
    assert_eq!(
        (a.member_epoch, a.assignment.as_ref().map(count)),
        (1, Some(4))
    );
    let all = a.assignment.unwrap();
    let b = hb(&mut c, &mut log, 10000, join_args("b", &["orders"]), &t).unwrap();
    // The target gives b two partitions, but a still holds them: b waits at epoch 2.
    assert_eq!(b.member_epoch, 2);
    assert_eq!(b.assignment.as_ref().map(count), Some(0));
    assert_eq!(
        c.group("g").unwrap().consumer.as_ref().unwrap().members["b"]
            .current
            .state,
        MemberState::UnreleasedPartitions
    );
    // a learns it must give two up, and stays at epoch 1 until it does.
    let a2 = hb(&mut c, &mut log, 20000, beat("a", 1, None), &t).unwrap();
    assert_eq!(a2.member_epoch, 1);
    let kept = a2.assignment.unwrap();
    assert_eq!(count(&kept), 2);
    exclusive(&c);
    // Not acknowledged yet (still owns them): b still gets nothing.
    hb(&mut c, &mut log, 30000, beat("a", 1, Some(all)), &t).unwrap();
    let b2 = hb(&mut c, &mut log, 40000, beat("b", 2, None), &t).unwrap();
    assert!(b2.assignment.is_none_or(|x| count(&x) == 0));
    // a acknowledges: epoch 2; then b gets the two.
    let a3 = hb(
        &mut c,
        &mut log,
        50000,
        beat("a", 1, Some(kept.clone())),
        &t,
    )
    .unwrap();
    assert_eq!(a3.member_epoch, 2);
    let b3 = hb(&mut c, &mut log, 60000, beat("b", 2, None), &t).unwrap();
    assert_eq!(b3.assignment.as_ref().map(count), Some(2));
    exclusive(&c);
    assert_eq!(
        c.group("g").unwrap().consumer.as_ref().unwrap().state(),
        "Stable"
    );
    // The reloaded coordinator has the same group.
    let r = reload(&log, 100_000);
    let (x, y) = (
        c.group("g").unwrap().consumer.as_ref().unwrap(),
        r.group("g").unwrap().consumer.as_ref().unwrap(),
    );
    assert_eq!((x.epoch, x.assignment_epoch), (y.epoch, y.assignment_epoch));
    assert_eq!(x.target, y.target);
    for (id, m) in &x.members {
        let n = &y.members[id];
        assert_eq!(
            (
                m.current.epoch,
                &m.current.assigned,
                &m.meta.subscribed_names
            ),
            (
                n.current.epoch,
                &n.current.assigned,
                &n.meta.subscribed_names
            )
        );
    }
}

#[test]
fn heartbeats_are_refused_with_kafkas_codes() {
    let t = topics(&[("orders", 1, 2)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    let code = |r: Result<HeartbeatReply, Refused>| r.unwrap_err().code;
    // Invalid requests.
    let mut a = join_args("", &["orders"]);
    assert_eq!(
        code(hb(&mut c, &mut log, 0, a.clone(), &t)),
        E::InvalidRequest
    );
    a.member_id = "m".into();
    a.owned = None;
    assert_eq!(
        code(hb(&mut c, &mut log, 0, a.clone(), &t)),
        E::InvalidRequest
    );
    a.owned = Some(Assignment::new());
    a.server_assignor = Some("sticky".into());
    assert_eq!(
        code(hb(&mut c, &mut log, 0, a.clone(), &t)),
        E::UnsupportedAssignor
    );
    a.server_assignor = None;
    a.subscribed_topic_regex = Some("(unclosed".into());
    assert_eq!(
        code(hb(&mut c, &mut log, 0, a.clone(), &t)),
        E::InvalidRegularExpression
    );
    // Unknown group and member, epochs from the future or the past.
    assert_eq!(
        code(hb(&mut c, &mut log, 0, beat("m", 1, None), &t)),
        E::GroupIdNotFound
    );
    hb(&mut c, &mut log, 0, join_args("m", &["orders"]), &t).unwrap();
    assert_eq!(
        code(hb(&mut c, &mut log, 1, beat("x", 1, None), &t)),
        E::UnknownMemberId
    );
    assert_eq!(
        code(hb(&mut c, &mut log, 1, beat("m", 5, None), &t)),
        E::FencedMemberEpoch
    );
    // A classic group with members is not taken over.
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, classic_join("classic"), &mut fx);
    let mut j = join_args("m", &["orders"]);
    j.group_id = "classic".into();
    assert_eq!(code(hb(&mut c, &mut log, 2, j, &t)), E::GroupIdNotFound);
    // A classic member cannot join a live consumer group.
    let mut fx = Effects::default();
    c.join(JoinToken(2), 0, classic_join("g"), &mut fx);
    match &fx.replies[0] {
        Deferred::Join(_, r) => assert_eq!(r.error_code, E::InconsistentGroupProtocol.code()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_static_member_that_left_comes_back_to_its_partitions_without_a_rebalance() {
    let t = topics(&[("orders", 1, 4)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    let s1 = as_static(join_args("s1", &["orders"]), "i1");
    let s2 = as_static(join_args("s2", &["orders"]), "i2");
    hb(&mut c, &mut log, 0, s1, &t).unwrap();
    let r2 = hb(&mut c, &mut log, 0, s2, &t).unwrap();
    // Settle: s1 gives up two, s2 takes them.
    let r1 = hb(&mut c, &mut log, 1000, beat("s1", 1, None), &t).unwrap();
    let b1 = as_static(beat("s1", 1, r1.assignment.clone()), "i1");
    hb(&mut c, &mut log, 2000, b1, &t).unwrap();
    let b2 = as_static(beat("s2", r2.member_epoch, None), "i2");
    let r2 = hb(&mut c, &mut log, 3000, b2, &t).unwrap();
    let mine = r2.assignment.unwrap();
    assert_eq!(count(&mine), 2);
    let epoch = c.group("g").unwrap().consumer.as_ref().unwrap().epoch;
    // s2 leaves as a static member, comes back as s2' with the same instance id.
    let leave = as_static(beat("s2", -2, None), "i2");
    assert_eq!(
        hb(&mut c, &mut log, 4000, leave, &t).unwrap().member_epoch,
        -2
    );
    let back = as_static(join_args("s2-new", &["orders"]), "i2");
    let r = hb(&mut c, &mut log, 5000, back, &t).unwrap();
    assert_eq!(
        r.assignment,
        Some(mine),
        "the same partitions, nothing moved"
    );
    assert_eq!(
        c.group("g").unwrap().consumer.as_ref().unwrap().epoch,
        epoch,
        "no new group epoch"
    );
    // The old member id is gone; a second incarnation while s2-new lives is refused.
    let again = as_static(join_args("s2-third", &["orders"]), "i2");
    assert_eq!(
        hb(&mut c, &mut log, 6000, again, &t).unwrap_err().code,
        E::UnreleasedInstanceId
    );
    exclusive(&c);
}

#[test]
fn a_member_that_stops_heartbeating_is_fenced_and_its_partitions_move() {
    let t = topics(&[("orders", 1, 4)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    let a = hb(&mut c, &mut log, 0, join_args("a", &["orders"]), &t).unwrap();
    hb(&mut c, &mut log, 0, join_args("b", &["orders"]), &t).unwrap();
    // b goes silent; a keeps heartbeating (and gives up what the target moved to b).
    let a = hb(&mut c, &mut log, 1_000, beat("a", a.member_epoch, None), &t).unwrap();
    let kept = a.assignment.clone().unwrap();
    assert_eq!(count(&kept), 2);
    let a = hb(
        &mut c,
        &mut log,
        SESSION - 1_000,
        beat("a", 1, Some(kept)),
        &t,
    )
    .unwrap();
    let mut fx = Effects::default();
    c.tick(SESSION + 1, &mut fx);
    log.extend(fx.records);
    let g = c.group("g").unwrap().consumer.as_ref().unwrap();
    assert!(!g.members.contains_key("b"), "b is fenced");
    assert!(g.members.contains_key("a"));
    let r = hb(
        &mut c,
        &mut log,
        SESSION + 2,
        beat("a", a.member_epoch, None),
        &t,
    )
    .unwrap();
    assert_eq!(
        r.assignment.as_ref().map(count),
        Some(4),
        "b's partitions move to a"
    );
    exclusive(&c);
}

#[test]
fn a_regex_subscription_picks_up_a_topic_created_later() {
    let mut t = topics(&[("logs-a", 1, 2), ("other", 2, 2)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    let mut j = join_args("m", &[]);
    j.subscribed_topic_names = None;
    j.subscribed_topic_regex = Some("logs-.*".into());
    let r = hb(&mut c, &mut log, 0, j, &t).unwrap();
    assert_eq!(r.assignment.as_ref().map(count), Some(2));
    t.topics
        .insert("logs-b".into(), (Uuid::from_bytes([3; 16]), 3));
    t.version += 1;
    let r = hb(&mut c, &mut log, 1000, beat("m", r.member_epoch, None), &t).unwrap();
    assert_eq!(r.assignment.as_ref().map(count), Some(5));
    assert!(!r
        .assignment
        .unwrap()
        .contains_key(&Uuid::from_bytes([2; 16])));
}

#[test]
fn offsets_commit_with_the_member_epoch() {
    let t = topics(&[("orders", 1, 1)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    let r = hb(&mut c, &mut log, 0, join_args("m", &["orders"]), &t).unwrap();
    let commit = |c: &mut Coordinator, member: &str, epoch: i32| {
        let plan = c.plan_commit(
            0,
            CommitArgs {
                group_id: "g".into(),
                generation: epoch,
                member_id: member.into(),
                instance_id: None,
                offsets: vec![(
                    ("orders".into(), 0),
                    Committed {
                        offset: 5,
                        leader_epoch: -1,
                        metadata: String::new(),
                        commit_timestamp_ms: 0,
                    },
                )],
            },
        );
        let code = plan.results[0].1;
        c.fail_commit(&plan);
        code
    };
    assert_eq!(commit(&mut c, "m", r.member_epoch), Ok(()));
    assert_eq!(
        commit(&mut c, "m", r.member_epoch + 1),
        Err(E::StaleMemberEpoch)
    );
    assert_eq!(commit(&mut c, "x", r.member_epoch), Err(E::UnknownMemberId));
    // An admin commit only to an empty group.
    assert_eq!(commit(&mut c, "", -1), Err(E::UnknownMemberId));
    // OffsetFetch v9: the same member checks.
    assert_eq!(c.offset_fetch_member_error("g", "m", r.member_epoch), None);
    assert_eq!(
        c.offset_fetch_member_error("g", "m", r.member_epoch + 1),
        Some(E::StaleMemberEpoch)
    );
    assert_eq!(
        c.offset_fetch_member_error("g", "x", r.member_epoch),
        Some(E::UnknownMemberId)
    );
    assert_eq!(c.offset_fetch_member_error("other", "x", 1), None);
}

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// A simulated client: what it believes it owns and its epoch.
#[derive(Debug, Clone)]
struct Client {
    epoch: i32,
    owned: Assignment,
    /// It got a new assignment and acknowledges it on its next heartbeat.
    ack: bool,
}

#[test]
fn simulation_never_gives_a_partition_to_two_members() {
    let (mut unrevoked, mut unreleased, mut moves) = (0, 0, 0);
    for seed in 1..=40u64 {
        let (a, b, m) = simulate(seed);
        unrevoked += a;
        unreleased += b;
        moves += m;
    }
    // The runs went through the states under test.
    assert!(
        unrevoked > 0 && unreleased > 0 && moves > 0,
        "{unrevoked} {unreleased} {moves}"
    );
}

/// Returns how many steps saw a member waiting to revoke, one waiting for a release,
/// and how many coordinator moves there were.
fn simulate(seed: u64) -> (usize, usize, usize) {
    let (mut unrevoked, mut unreleased, mut moves) = (0, 0, 0);
    let t = topics(&[("a", 1, 7), ("b", 2, 5)]);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log: Vec<Record> = Vec::new();
    let mut clients: BTreeMap<String, Client> = BTreeMap::new();
    let mut next_id = 0;
    let mut now = 0i64;
    for _step in 0..400 {
        now += 100;
        match rng.below(20) {
            // A new member.
            0..=2 if clients.len() < 8 => {
                next_id += 1;
                let id = format!("m{next_id}");
                let subs: &[&str] = match rng.below(3) {
                    0 => &["a"],
                    1 => &["b"],
                    _ => &["a", "b"],
                };
                if let Ok(r) = hb(&mut c, &mut log, now, join_args(&id, subs), &t) {
                    let owned = r.assignment.unwrap_or_default();
                    clients.insert(
                        id,
                        Client {
                            epoch: r.member_epoch,
                            owned,
                            ack: true,
                        },
                    );
                }
            }
            // A member leaves.
            3 if !clients.is_empty() => {
                let id = clients
                    .keys()
                    .nth(rng.below(clients.len() as u64) as usize)
                    .cloned()
                    .unwrap();
                let cl = clients.remove(&id).unwrap();
                let _ = hb(&mut c, &mut log, now, beat(&id, -1, None), &t);
                let _ = cl;
            }
            // A member crashes: it is gone from here on, fenced at its session's end.
            4 if !clients.is_empty() => {
                let id = clients
                    .keys()
                    .nth(rng.below(clients.len() as u64) as usize)
                    .cloned()
                    .unwrap();
                clients.remove(&id);
                // Time passes until it is fenced; the live ones keep heartbeating. (A
                // member restored by a coordinator move has the longest session a group
                // may set until its first heartbeat there.)
                let end = now + i64::from(consumer::GROUP_SESSION_TIMEOUT_MAX_MS) + 1;
                while now < end {
                    now += 5_000;
                    heartbeat_all(&mut c, &mut log, now, &mut clients, &t);
                }
                let mut fx = Effects::default();
                c.tick(now, &mut fx);
                log.extend(fx.records);
            }
            // The coordinator moves: a new one replays the log.
            5 => {
                moves += 1;
                let before = c.group("g").and_then(|g| g.consumer.clone());
                c = reload(&log, now);
                let after = c.group("g").and_then(|g| g.consumer.clone());
                match (before, after) {
                    (Some(x), Some(y)) => {
                        assert_eq!(
                            (x.epoch, x.assignment_epoch, &x.target),
                            (y.epoch, y.assignment_epoch, &y.target),
                            "seed {seed}"
                        );
                        for (id, m) in &x.members {
                            let n = &y.members[id];
                            assert_eq!(
                                (
                                    m.current.epoch,
                                    m.current.state,
                                    &m.current.assigned,
                                    &m.current.revoking
                                ),
                                (
                                    n.current.epoch,
                                    n.current.state,
                                    &n.current.assigned,
                                    &n.current.revoking
                                ),
                                "seed {seed} member {id}"
                            );
                        }
                    }
                    (x, y) => assert_eq!(x.is_none(), y.is_none() || y.unwrap().members.is_empty()),
                }
            }
            _ => heartbeat_all(&mut c, &mut log, now, &mut clients, &t),
        }
        exclusive(&c);
        if let Some(g) = c.group("g").and_then(|g| g.consumer.as_ref()) {
            let has = |s| g.members.values().any(|m| m.current.state == s);
            unrevoked += usize::from(has(MemberState::UnrevokedPartitions));
            unreleased += usize::from(has(MemberState::UnreleasedPartitions));
        }
        // What live clients believe they own is disjoint too.
        let mut seen = BTreeSet::new();
        for (id, cl) in &clients {
            for (tp, ps) in &cl.owned {
                for p in ps {
                    assert!(
                        seen.insert((*tp, *p)),
                        "seed {seed}: {id} and another both own {tp}-{p}"
                    );
                }
            }
        }
    }
    // Quiet heartbeats settle the group: everything assigned, every member stable.
    for _ in 0..6 {
        now += 100;
        heartbeat_all(&mut c, &mut log, now, &mut clients, &t);
    }
    if let Some(g) = c.group("g").and_then(|g| g.consumer.as_ref()) {
        if !clients.is_empty() {
            assert_eq!(g.state(), "Stable", "seed {seed}: {:?}", g.members);
            let owned: usize = clients.values().map(|c| count(&c.owned)).sum();
            let wanted: BTreeSet<&str> = g
                .members
                .values()
                .flat_map(|m| m.meta.subscribed_names.iter().map(String::as_str))
                .collect();
            let total: i32 = wanted.iter().map(|n| t.topics[*n].1).sum();
            assert_eq!(owned, total as usize, "seed {seed}");
        }
    }
    (unrevoked, unreleased, moves)
}

fn heartbeat_all(
    c: &mut Coordinator,
    log: &mut Vec<Record>,
    now: i64,
    clients: &mut BTreeMap<String, Client>,
    t: &Topics,
) {
    let ids: Vec<String> = clients.keys().cloned().collect();
    for id in ids {
        let cl = clients.get_mut(&id).unwrap();
        let owned = cl.ack.then(|| cl.owned.clone());
        match hb(c, log, now, beat(&id, cl.epoch, owned), t) {
            Ok(r) => {
                cl.epoch = r.member_epoch;
                cl.ack = false;
                if let Some(a) = r.assignment {
                    // librdkafka revokes what is gone, takes what is new, then acks.
                    cl.ack = a != cl.owned;
                    cl.owned = a;
                }
            }
            Err(e) if matches!(e.code, E::FencedMemberEpoch | E::UnknownMemberId) => {
                // Rejoin with epoch 0, having dropped everything (lost).
                cl.owned.clear();
                let r = hb(c, log, now, join_args(&id, &["a", "b"]), t).unwrap();
                cl.epoch = r.member_epoch;
                cl.owned = r.assignment.unwrap_or_default();
                cl.ack = true;
            }
            Err(e) => panic!("{id}: {e:?}"),
        }
    }
}

#[test]
fn joins_within_the_assignment_interval_share_one_target_computed_by_the_timer() {
    let t = topics(&[("orders", 1, 6)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    hb(&mut c, &mut log, 0, join_args("a", &["orders"]), &t).unwrap();
    for (i, m) in ["b", "c"].iter().enumerate() {
        let r = hb(
            &mut c,
            &mut log,
            10 + i as i64,
            join_args(m, &["orders"]),
            &t,
        )
        .unwrap();
        // Not assigned yet: the group epoch moved, the target waits for the interval.
        assert_eq!(
            (r.member_epoch, r.assignment.as_ref().map(count)),
            (1, Some(0))
        );
    }
    let g = c.group("g").unwrap().consumer.as_ref().unwrap();
    assert_eq!(
        (g.epoch, g.assignment_epoch, g.state()),
        (3, 1, "Assigning")
    );
    let mut fx = Effects::default();
    c.assign_due(50, &t, &mut fx);
    assert!(fx.records.is_empty(), "not before the interval");
    c.assign_due(consumer::ASSIGNMENT_INTERVAL_MS, &t, &mut fx);
    log.extend(fx.records);
    let g = c.group("g").unwrap().consumer.as_ref().unwrap();
    assert_eq!(g.assignment_epoch, 3, "one computation for both joins");
    assert!(g.target.values().all(|a| count(a) == 2), "{:?}", g.target);
}

#[test]
fn review_cases_a_taken_member_id_offset_delete_and_a_refused_txn_commit() {
    let t = topics(&[("orders", 1, 2)]);
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut log = Vec::new();
    let a = as_static(join_args("Y", &["orders"]), "j");
    hb(&mut c, &mut log, 0, a, &t).unwrap();
    let b = as_static(join_args("X", &["orders"]), "i");
    hb(&mut c, &mut log, 1_000, b, &t).unwrap();
    let leave = as_static(beat("X", -2, None), "i");
    hb(&mut c, &mut log, 2_000, leave, &t).unwrap();
    // Instance i's replacement under Y's id (taken by another member) is refused.
    let steal = as_static(join_args("Y", &["orders"]), "i");
    assert_eq!(
        hb(&mut c, &mut log, 3_000, steal, &t).unwrap_err().code,
        E::InvalidRequest
    );
    assert_eq!(
        c.group("g").unwrap().consumer.as_ref().unwrap().members["Y"]
            .meta
            .instance_id
            .as_deref(),
        Some("j")
    );
    // OffsetDelete of a topic the live group reads is refused.
    let mut fx = Effects::default();
    assert_eq!(
        c.delete_offsets("g", &[("orders".into(), 0)], &mut fx),
        Ok(vec![Err(E::GroupSubscribedToTopic)])
    );
    // A refused TxnOffsetCommit (stale epoch) does not drop the group from memory.
    let plan = c.plan_txn_commit(
        4_000,
        TxnCommitArgs {
            group_id: "g".into(),
            producer_id: 7,
            producer_epoch: 0,
            generation: 99,
            member_id: "Y".into(),
            instance_id: None,
            offsets: vec![(
                ("orders".into(), 0),
                Committed {
                    offset: 1,
                    leader_epoch: -1,
                    metadata: String::new(),
                    commit_timestamp_ms: 0,
                },
            )],
        },
    );
    assert_eq!(plan.results[0].1, Err(E::StaleMemberEpoch));
    assert!(c.group("g").is_some_and(|g| g.consumer.is_some()));
}
