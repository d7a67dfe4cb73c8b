//! Unit tests of the group coordinator state machine: every transition and every error
//! code, driven by hand-picked times (no clock, no I/O).

use bytes::Bytes;
use kafka_protocol::error::ResponseError as E;

use crate::group::*;
use crate::records::Key;

const SESSION: i32 = 6_000;
const REBALANCE: i32 = 10_000;

fn coord(initial_delay_ms: i64) -> Coordinator {
    Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: initial_delay_ms,
        ..CoordinatorConfig::default()
    })
}

fn args(member: &str, instance: Option<&str>, protocols: &[&str]) -> JoinArgs {
    JoinArgs {
        group_id: "g".into(),
        member_id: member.into(),
        instance_id: instance.map(String::from),
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: SESSION,
        rebalance_timeout_ms: REBALANCE,
        protocol_type: "consumer".into(),
        protocols: protocols
            .iter()
            .map(|p| (p.to_string(), Bytes::from(format!("meta-{p}"))))
            .collect(),
        require_known_member_id: true,
        supports_skip_assignment: false,
    }
}

/// The tests number requests with plain integers; a join and a sync are told apart by
/// the token type the coordinator answers them under.
type Token = u64;

fn join_reply(fx: &Effects, token: Token) -> Option<kafka_protocol::messages::JoinGroupResponse> {
    fx.replies.iter().find_map(|r| match r {
        Deferred::Join(t, j) if *t == JoinToken(token) => Some(j.clone()),
        _ => None,
    })
}

fn sync_reply(fx: &Effects, token: Token) -> Option<kafka_protocol::messages::SyncGroupResponse> {
    fx.replies.iter().find_map(|r| match r {
        Deferred::Sync(t, s) if *t == SyncToken(token) => Some(s.clone()),
        _ => None,
    })
}

/// Joins with the MEMBER_ID_REQUIRED round trip; returns the member id and the effects
/// of the second join.
fn join_new(c: &mut Coordinator, token: Token, now: i64, protocols: &[&str]) -> (String, Effects) {
    let mut fx = Effects::default();
    c.join(JoinToken(token), now, args("", None, protocols), &mut fx);
    let r = join_reply(&fx, token).expect("immediate answer");
    assert_eq!(r.error_code, E::MemberIdRequired.code());
    let id = r.member_id.to_string();
    assert!(!id.is_empty());
    let mut fx = Effects::default();
    c.join(
        JoinToken(token + 1000),
        now,
        args(&id, None, protocols),
        &mut fx,
    );
    (id, fx)
}

fn sync(
    c: &mut Coordinator,
    token: Token,
    now: i64,
    member: &str,
    gen: i32,
    asg: &[(&str, &str)],
) -> Effects {
    let mut fx = Effects::default();
    c.sync(
        SyncToken(token),
        now,
        SyncArgs {
            group_id: "g".into(),
            generation: gen,
            member_id: member.into(),
            instance_id: None,
            protocol_type: Some("consumer".into()),
            protocol_name: None,
            assignments: asg
                .iter()
                .map(|(m, a)| (m.to_string(), Bytes::from(a.to_string())))
                .collect(),
        },
        &mut fx,
    );
    fx
}

/// One member, Stable at generation 1.
fn stable_one(c: &mut Coordinator) -> String {
    let (id, fx) = join_new(c, 1, 0, &["range"]);
    let r = join_reply(&fx, 1001).expect("join completes (no initial delay)");
    assert_eq!(r.error_code, 0);
    assert_eq!(r.generation_id, 1);
    let fx = sync(c, 2, 0, &id, 1, &[(&id, "A")]);
    assert_eq!(sync_reply(&fx, 2).unwrap().assignment, Bytes::from("A"));
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    id
}

#[test]
fn member_id_required_then_join_then_sync_makes_the_group_stable() {
    let mut c = coord(0);
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, args("", None, &["range"]), &mut fx);
    let r = join_reply(&fx, 1).unwrap();
    assert_eq!(r.error_code, E::MemberIdRequired.code());
    assert_eq!(c.group("g").unwrap().state, GroupState::Empty);
    let id = r.member_id.to_string();
    let mut fx = Effects::default();
    c.join(JoinToken(2), 10, args(&id, None, &["range"]), &mut fx);
    let r = join_reply(&fx, 2).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 1));
    assert_eq!(r.leader.as_str(), id);
    assert_eq!(r.protocol_name.as_ref().unwrap().as_str(), "range");
    assert_eq!(r.members.len(), 1, "the leader gets the member list");
    assert_eq!(r.members[0].metadata, Bytes::from("meta-range"));
    assert_eq!(c.group("g").unwrap().state, GroupState::CompletingRebalance);
    let fx = sync(&mut c, 3, 20, &id, 1, &[(&id, "A")]);
    assert_eq!(sync_reply(&fx, 3).unwrap().assignment, Bytes::from("A"));
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    // The group metadata record is written when the group becomes stable.
    assert_eq!(fx.records.len(), 1);
    assert_eq!(
        Key::decode(&fx.records[0].key).unwrap(),
        Key::Group { group: "g".into() }
    );
}

#[test]
fn old_clients_join_without_the_member_id_round_trip() {
    let mut c = coord(0);
    let mut a = args("", None, &["range"]);
    a.require_known_member_id = false;
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, a, &mut fx);
    let r = join_reply(&fx, 1).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 1));
}

#[test]
fn initial_delay_waits_for_more_members_then_one_generation() {
    let mut c = coord(3_000);
    let (a, fx) = join_new(&mut c, 1, 0, &["range"]);
    assert!(
        join_reply(&fx, 1001).is_none(),
        "waits for the initial delay"
    );
    assert_eq!(c.group("g").unwrap().state, GroupState::PreparingRebalance);
    let (b, fx) = join_new(&mut c, 2, 1_000, &["range"]);
    assert!(join_reply(&fx, 1002).is_none());
    let mut fx = Effects::default();
    c.tick(3_500, &mut fx);
    assert!(
        fx.replies.is_empty(),
        "the second member extended the delay"
    );
    c.tick(4_000, &mut fx);
    let ra = join_reply(&fx, 1001).unwrap();
    let rb = join_reply(&fx, 1002).unwrap();
    assert_eq!((ra.generation_id, rb.generation_id), (1, 1));
    assert_eq!(ra.leader, rb.leader);
    let leader_members = if ra.leader.as_str() == a { &ra } else { &rb };
    assert_eq!(leader_members.members.len(), 2);
    assert!(a != b);
}

#[test]
fn new_member_triggers_rebalance_and_everyone_rejoins() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let (b, fx) = join_new(&mut c, 10, 100, &["range"]);
    assert!(join_reply(&fx, 1010).is_none(), "waits for the old member");
    assert_eq!(c.group("g").unwrap().state, GroupState::PreparingRebalance);
    // The old member learns of it from its heartbeat.
    assert_eq!(
        c.heartbeat(200, "g", 1, &a, None),
        Err(E::RebalanceInProgress)
    );
    // Syncing the old generation now fails.
    let fx = sync(&mut c, 11, 200, &a, 1, &[]);
    assert_eq!(
        sync_reply(&fx, 11).unwrap().error_code,
        E::RebalanceInProgress.code()
    );
    let mut fx = Effects::default();
    c.join(JoinToken(12), 300, args(&a, None, &["range"]), &mut fx);
    let ra = join_reply(&fx, 12).unwrap();
    let rb = join_reply(&fx, 1010).unwrap();
    assert_eq!((ra.generation_id, rb.generation_id), (2, 2));
    assert_eq!(ra.leader.as_str(), a, "the leader stays");
    assert_eq!(ra.members.len(), 2);
    assert!(rb.members.is_empty(), "followers get no member list");
    // The follower's sync waits for the leader's.
    let fx = sync(&mut c, 13, 400, &b, 2, &[]);
    assert!(sync_reply(&fx, 13).is_none());
    assert_eq!(
        c.heartbeat(400, "g", 2, &b, None),
        Ok(()),
        "heartbeats are fine while completing"
    );
    let fx = sync(&mut c, 14, 500, &a, 2, &[(&a, "A"), (&b, "B")]);
    assert_eq!(sync_reply(&fx, 13).unwrap().assignment, Bytes::from("B"));
    assert_eq!(sync_reply(&fx, 14).unwrap().assignment, Bytes::from("A"));
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
}

#[test]
fn heartbeat_error_codes() {
    let mut c = coord(0);
    assert_eq!(
        c.heartbeat(0, "nope", 1, "m", None),
        Err(E::UnknownMemberId)
    );
    let a = stable_one(&mut c);
    assert_eq!(c.heartbeat(0, "g", 1, &a, None), Ok(()));
    assert_eq!(c.heartbeat(0, "g", 0, &a, None), Err(E::IllegalGeneration));
    assert_eq!(
        c.heartbeat(0, "g", 1, "stranger", None),
        Err(E::UnknownMemberId)
    );
}

#[test]
fn sync_error_codes() {
    let mut c = coord(0);
    let fx = sync(&mut c, 1, 0, "m", 1, &[]);
    assert_eq!(
        sync_reply(&fx, 1).unwrap().error_code,
        E::UnknownMemberId.code()
    );
    let a = stable_one(&mut c);
    let fx = sync(&mut c, 2, 0, "stranger", 1, &[]);
    assert_eq!(
        sync_reply(&fx, 2).unwrap().error_code,
        E::UnknownMemberId.code()
    );
    let fx = sync(&mut c, 3, 0, &a, 7, &[]);
    assert_eq!(
        sync_reply(&fx, 3).unwrap().error_code,
        E::IllegalGeneration.code()
    );
    let mut fx = Effects::default();
    c.sync(
        SyncToken(4),
        0,
        SyncArgs {
            group_id: "g".into(),
            generation: 1,
            member_id: a.clone(),
            instance_id: None,
            protocol_type: Some("connect".into()),
            protocol_name: None,
            assignments: vec![],
        },
        &mut fx,
    );
    assert_eq!(
        sync_reply(&fx, 4).unwrap().error_code,
        E::InconsistentGroupProtocol.code()
    );
    // Stable: a sync returns the stored assignment at once.
    let fx = sync(&mut c, 5, 0, &a, 1, &[]);
    assert_eq!(sync_reply(&fx, 5).unwrap().assignment, Bytes::from("A"));
}

#[test]
fn join_error_codes() {
    let mut c = coord(0);
    let mut fx = Effects::default();
    let mut a = args("", None, &["range"]);
    a.group_id = String::new();
    c.join(JoinToken(1), 0, a, &mut fx);
    assert_eq!(
        join_reply(&fx, 1).unwrap().error_code,
        E::InvalidGroupId.code()
    );
    let mut a = args("", None, &["range"]);
    a.session_timeout_ms = 10;
    c.join(JoinToken(2), 0, a, &mut fx);
    assert_eq!(
        join_reply(&fx, 2).unwrap().error_code,
        E::InvalidSessionTimeout.code()
    );
    c.join(JoinToken(3), 0, args("ghost", None, &["range"]), &mut fx);
    assert_eq!(
        join_reply(&fx, 3).unwrap().error_code,
        E::UnknownMemberId.code()
    );
    assert!(
        c.group("g").is_none(),
        "refused joins leave no group behind"
    );
    let _ = stable_one(&mut c);
    c.join(JoinToken(4), 0, args("", None, &["roundrobin"]), &mut fx);
    assert_eq!(
        join_reply(&fx, 4).unwrap().error_code,
        E::InconsistentGroupProtocol.code()
    );
    let mut a = args("", None, &["range"]);
    a.protocol_type = "connect".into();
    c.join(JoinToken(5), 0, a, &mut fx);
    assert_eq!(
        join_reply(&fx, 5).unwrap().error_code,
        E::InconsistentGroupProtocol.code()
    );
    c.join(JoinToken(6), 0, args("stranger", None, &["range"]), &mut fx);
    assert_eq!(
        join_reply(&fx, 6).unwrap().error_code,
        E::UnknownMemberId.code()
    );
}

#[test]
fn protocol_selection_is_a_vote_among_common_protocols() {
    let mut c = coord(10);
    let (_, _) = join_new(&mut c, 1, 0, &["range", "roundrobin"]);
    let (_, _) = join_new(&mut c, 2, 0, &["roundrobin", "range"]);
    let (_, _) = join_new(&mut c, 3, 0, &["roundrobin", "cooperative-sticky"]);
    let mut fx = Effects::default();
    c.tick(100, &mut fx);
    let r = join_reply(&fx, 1001).unwrap();
    assert_eq!(r.protocol_name.unwrap().as_str(), "roundrobin");
}

#[test]
fn session_expiry_removes_the_member_and_rebalances() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let (b, fx) = join_new(&mut c, 10, 0, &["range"]);
    assert!(join_reply(&fx, 1010).is_none());
    // `a` heartbeats (so its session lives) but never rejoins: at the rebalance
    // timeout the join completes without it.
    assert_eq!(
        c.heartbeat(5_000, "g", 1, &a, None),
        Err(E::RebalanceInProgress)
    );
    let mut fx = Effects::default();
    c.tick(i64::from(REBALANCE) - 1, &mut fx);
    assert!(join_reply(&fx, 1010).is_none());
    c.tick(i64::from(REBALANCE), &mut fx);
    let r = join_reply(&fx, 1010).unwrap();
    assert_eq!((r.generation_id, r.leader.as_str()), (2, b.as_str()));
    assert!(!c.group("g").unwrap().members.contains_key(&a));
    let fx = sync(&mut c, 11, 10_000, &b, 2, &[(&b, "B")]);
    assert_eq!(sync_reply(&fx, 11).unwrap().error_code, 0);
    // `b` stops heartbeating: after the session timeout the group is empty.
    let mut fx = Effects::default();
    c.tick(10_000 + i64::from(SESSION) - 1, &mut fx);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    c.tick(10_000 + i64::from(SESSION), &mut fx);
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.generation), (GroupState::Empty, 3));
    assert_eq!(
        c.heartbeat(20_000, "g", 2, &b, None),
        Err(E::UnknownMemberId)
    );
}

#[test]
fn heartbeats_keep_a_member_alive() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let mut fx = Effects::default();
    for t in (1_000..30_000).step_by(2_000) {
        assert_eq!(c.heartbeat(t, "g", 1, &a, None), Ok(()));
        c.tick(t + 1, &mut fx);
    }
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
}

#[test]
fn leader_that_never_syncs_is_dropped_after_the_rebalance_timeout() {
    let mut c = coord(0);
    let (a, _) = join_new(&mut c, 1, 0, &["range"]);
    assert_eq!(c.group("g").unwrap().state, GroupState::CompletingRebalance);
    let mut fx = Effects::default();
    // It heartbeats (the session lives) but never sends SyncGroup.
    assert_eq!(c.heartbeat(5_000, "g", 1, &a, None), Ok(()));
    c.tick(i64::from(REBALANCE) - 1, &mut fx);
    assert!(c.group("g").unwrap().members.contains_key(&a));
    c.tick(i64::from(REBALANCE), &mut fx);
    // Empty, and with nothing committed, removed by the expiry pass.
    assert!(c
        .group("g")
        .is_none_or(|g| g.state == GroupState::Empty && g.members.is_empty()));
}

#[test]
fn session_expiry_during_a_join_phase_drops_the_silent_member() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let (b, _) = join_new(&mut c, 10, 0, &["range"]);
    let mut fx = Effects::default();
    c.tick(i64::from(SESSION), &mut fx);
    let r = join_reply(&fx, 1010).expect("the join ends when the silent member expires");
    assert_eq!((r.generation_id, r.leader.as_str()), (2, b.as_str()));
    assert!(!c.group("g").unwrap().members.contains_key(&a));
}

#[test]
fn leave_rebalances_and_the_last_leave_empties_the_group() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let mut fx = Effects::default();
    let (g, m) = c.leave(
        0,
        "g",
        &[Leaving {
            member_id: "stranger".into(),
            instance_id: None,
        }],
        &mut fx,
    );
    assert_eq!((g, m), (Ok(()), vec![Err(E::UnknownMemberId)]));
    let (g, m) = c.leave(
        0,
        "g",
        &[Leaving {
            member_id: a.clone(),
            instance_id: None,
        }],
        &mut fx,
    );
    assert_eq!((g, m), (Ok(()), vec![Ok(())]));
    let grp = c.group("g").unwrap();
    assert_eq!((grp.state, grp.generation), (GroupState::Empty, 2));
    let (_, m) = c.leave(
        0,
        "nope",
        &[Leaving {
            member_id: a,
            instance_id: None,
        }],
        &mut fx,
    );
    assert_eq!(m, vec![Err(E::UnknownMemberId)]);
}

#[test]
fn leave_during_rebalance_completes_the_join() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let (_b, fx) = join_new(&mut c, 10, 0, &["range"]);
    assert!(join_reply(&fx, 1010).is_none());
    let mut fx = Effects::default();
    let _ = c.leave(
        5,
        "g",
        &[Leaving {
            member_id: a,
            instance_id: None,
        }],
        &mut fx,
    );
    let r = join_reply(&fx, 1010).expect("nobody else to wait for");
    assert_eq!(r.generation_id, 2);
    assert_eq!(r.members.len(), 1, "the new leader gets the member list");
}

#[test]
fn static_member_restart_keeps_generation_and_fences_the_old_instance() {
    let mut c = coord(0);
    // Static members skip the member-id round trip.
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, args("", Some("i1"), &["range"]), &mut fx);
    let r1 = join_reply(&fx, 1).unwrap();
    assert_eq!((r1.error_code, r1.generation_id), (0, 1));
    let old = r1.member_id.to_string();
    let fx = sync(&mut c, 2, 0, &old, 1, &[(&old, "A")]);
    assert_eq!(sync_reply(&fx, 2).unwrap().error_code, 0);
    // A second static member joins and the group settles at generation 2.
    let mut fx = Effects::default();
    c.join(JoinToken(3), 0, args("", Some("i2"), &["range"]), &mut fx);
    c.join(JoinToken(4), 0, args(&old, Some("i1"), &["range"]), &mut fx);
    let r2 = join_reply(&fx, 3).unwrap();
    assert_eq!(r2.generation_id, 2);
    let other = r2.member_id.to_string();
    let fx = sync(&mut c, 5, 0, &old, 2, &[(&old, "A"), (&other, "B")]);
    assert_eq!(sync_reply(&fx, 5).unwrap().error_code, 0);
    // The follower i2 restarts: a new member id, no rebalance, same generation.
    let mut fx = Effects::default();
    c.join(JoinToken(6), 100, args("", Some("i2"), &["range"]), &mut fx);
    let r = join_reply(&fx, 6).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 2));
    assert_ne!(r.member_id.to_string(), other);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    let new_id = r.member_id.to_string();
    let mut fx = Effects::default();
    c.sync(
        SyncToken(7),
        100,
        SyncArgs {
            group_id: "g".into(),
            generation: 2,
            member_id: new_id.clone(),
            instance_id: Some("i2".into()),
            protocol_type: None,
            protocol_name: None,
            assignments: vec![],
        },
        &mut fx,
    );
    assert_eq!(sync_reply(&fx, 7).unwrap().assignment, Bytes::from("B"));
    // The old incarnation is fenced.
    assert_eq!(
        c.heartbeat(100, "g", 2, &other, Some("i2")),
        Err(E::FencedInstanceId)
    );
    let mut fx = Effects::default();
    c.join(
        JoinToken(8),
        100,
        args(&other, Some("i2"), &["range"]),
        &mut fx,
    );
    assert_eq!(
        join_reply(&fx, 8).unwrap().error_code,
        E::FencedInstanceId.code()
    );
    let plan = c.plan_commit(
        100,
        CommitArgs {
            group_id: "g".into(),
            generation: 2,
            member_id: other.clone(),
            instance_id: Some("i2".into()),
            offsets: vec![(("t".into(), 0), committed(1))],
        },
    );
    assert_eq!(plan.results[0].1, Err(E::FencedInstanceId));
    // Admin removal by instance id.
    let (_, m) = c.leave(
        200,
        "g",
        &[Leaving {
            member_id: String::new(),
            instance_id: Some("i2".into()),
        }],
        &mut fx,
    );
    assert_eq!(m, vec![Ok(())]);
    assert_eq!(c.group("g").unwrap().state, GroupState::PreparingRebalance);
}

fn committed(offset: i64) -> Committed {
    Committed {
        offset,
        leader_epoch: -1,
        metadata: String::new(),
        commit_timestamp_ms: 0,
    }
}

fn commit(c: &mut Coordinator, now: i64, gen: i32, member: &str, offset: i64) -> CommitPlan {
    c.plan_commit(
        now,
        CommitArgs {
            group_id: "g".into(),
            generation: gen,
            member_id: member.into(),
            instance_id: None,
            offsets: vec![(
                ("t".into(), 0),
                Committed {
                    commit_timestamp_ms: now,
                    ..committed(offset)
                },
            )],
        },
    )
}

#[test]
fn commit_validation_and_fetch() {
    let mut c = coord(0);
    // No group, a member generation: refused.
    let p = commit(&mut c, 0, 3, "m", 5);
    assert_eq!(p.results[0].1, Err(E::IllegalGeneration));
    // No group, generation -1 (a simple consumer or an admin tool): accepted.
    let p = commit(&mut c, 0, -1, "", 5);
    assert_eq!(p.results[0].1, Ok(()));
    assert_eq!(p.records.len(), 1);
    c.apply_commit(0, p);
    let f = c.fetch_offsets("g", Some(&[("t".into(), 0), ("t".into(), 1)]));
    assert_eq!(f[0].1.as_ref().unwrap().offset, 5);
    assert!(f[1].1.is_none());
    assert_eq!(c.fetch_offsets("g", None).len(), 1);
    assert!(c.fetch_offsets("other", None).is_empty());
    let a = stable_one(&mut c);
    let p = commit(&mut c, 0, 1, &a, 9);
    assert_eq!(p.results[0].1, Ok(()));
    c.apply_commit(0, p);
    assert_eq!(c.fetch_offsets("g", None)[0].1.as_ref().unwrap().offset, 9);
    assert_eq!(
        commit(&mut c, 0, 0, &a, 1).results[0].1,
        Err(E::IllegalGeneration)
    );
    assert_eq!(
        commit(&mut c, 0, 1, "x", 1).results[0].1,
        Err(E::UnknownMemberId)
    );
    // Non-members may not commit to a group that has members.
    assert_eq!(
        commit(&mut c, 0, -1, "", 1).results[0].1,
        Err(E::UnknownMemberId)
    );
    // The member's generation is current but the assignment is not out yet.
    let (_b, _) = join_new(&mut c, 10, 0, &["range"]);
    let mut fx = Effects::default();
    c.join(JoinToken(11), 0, args(&a, None, &["range"]), &mut fx);
    assert_eq!(c.group("g").unwrap().state, GroupState::CompletingRebalance);
    assert_eq!(
        commit(&mut c, 0, 2, &a, 1).results[0].1,
        Err(E::RebalanceInProgress)
    );
    let mut big = commit(&mut c, 0, 1, &a, 1);
    big.results.clear();
    let p = c.plan_commit(
        0,
        CommitArgs {
            group_id: "g".into(),
            generation: -1,
            member_id: String::new(),
            instance_id: None,
            offsets: vec![],
        },
    );
    assert!(p.results.is_empty());
}

#[test]
fn commit_in_preparing_rebalance_with_current_generation_is_accepted() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let _ = join_new(&mut c, 10, 0, &["range"]);
    assert_eq!(c.group("g").unwrap().state, GroupState::PreparingRebalance);
    assert_eq!(commit(&mut c, 0, 1, &a, 3).results[0].1, Ok(()));
}

#[test]
fn oversized_metadata_is_refused() {
    let mut c = coord(0);
    let mut meta = committed(1);
    meta.metadata = "x".repeat(5000);
    let p = c.plan_commit(
        0,
        CommitArgs {
            group_id: "g".into(),
            generation: -1,
            member_id: String::new(),
            instance_id: None,
            offsets: vec![(("t".into(), 0), meta)],
        },
    );
    assert_eq!(p.results[0].1, Err(E::OffsetMetadataTooLarge));
    assert!(p.records.is_empty());
}

#[test]
fn delete_groups_and_offsets() {
    let mut c = coord(0);
    let mut fx = Effects::default();
    assert_eq!(c.delete_group(0, "g", &mut fx), Err(E::GroupIdNotFound));
    assert_eq!(
        c.delete_offsets("g", &[("t".into(), 0)], &mut fx),
        Err(E::GroupIdNotFound)
    );
    let a = stable_one(&mut c);
    let p = commit(&mut c, 0, 1, &a, 4);
    c.apply_commit(0, p);
    assert_eq!(c.delete_group(0, "g", &mut fx), Err(E::NonEmptyGroup));
    // Stable, but the members subscribe to nothing decodable: Kafka counts the group
    // as subscribed to every topic.
    assert_eq!(
        c.delete_offsets("g", &[("t".into(), 0)], &mut fx),
        Ok(vec![Err(E::GroupSubscribedToTopic)])
    );
    let _ = c.leave(
        0,
        "g",
        &[Leaving {
            member_id: a,
            instance_id: None,
        }],
        &mut fx,
    );
    let mut fx = Effects::default();
    assert_eq!(
        c.delete_offsets("g", &[("t".into(), 0)], &mut fx),
        Ok(vec![Ok(())])
    );
    assert_eq!(fx.records.len(), 1);
    assert!(fx.records[0].value.is_none(), "a tombstone");
    let p = commit(&mut c, 0, -1, "", 4);
    c.apply_commit(0, p);
    let mut fx = Effects::default();
    assert_eq!(c.delete_group(0, "g", &mut fx), Ok(()));
    assert!(c.group("g").is_none());
    // One tombstone per offset and one for the group.
    assert_eq!(fx.records.len(), 2);
    assert!(fx.records.iter().all(|r| r.value.is_none()));
    assert_eq!(c.describe("g").state, GroupState::Dead);
}

#[test]
fn offset_delete_refuses_subscribed_topics() {
    use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Encodable;
    let mut c = coord(0);
    let sub = ConsumerProtocolSubscription::default().with_topics(vec![crate::sb("t")]);
    let mut meta = bytes::BytesMut::new();
    meta.extend_from_slice(&1i16.to_be_bytes());
    sub.encode(&mut meta, 1).unwrap();
    let mut a = args("", None, &["range"]);
    a.require_known_member_id = false;
    a.protocols = vec![("range".into(), meta.freeze())];
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, a, &mut fx);
    let id = join_reply(&fx, 1).unwrap().member_id.to_string();
    sync(&mut c, 2, 0, &id, 1, &[]);
    let mut fx = Effects::default();
    let r = c.delete_offsets("g", &[("t".into(), 0), ("u".into(), 0)], &mut fx);
    assert_eq!(r, Ok(vec![Err(E::GroupSubscribedToTopic), Ok(())]));
}

#[test]
fn offsets_of_empty_groups_expire() {
    let mut c = Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        offsets_retention_ms: 1_000,
        offsets_retention_check_interval_ms: 100,
        ..CoordinatorConfig::default()
    });
    let p = commit(&mut c, 0, -1, "", 4);
    c.apply_commit(0, p);
    let mut fx = Effects::default();
    c.tick(500, &mut fx);
    assert_eq!(c.fetch_offsets("g", None).len(), 1);
    c.tick(1_000, &mut fx);
    assert!(c.group("g").is_none());
    assert_eq!(fx.records.len(), 2, "offset and group tombstones");
}

/// An expiry check that runs while a commit of an expired offset is being written
/// leaves that offset and its group alone: its tombstone would land after the commit
/// in the log while memory keeps the commit, and a reload would lose the offset.
#[test]
fn an_offset_being_committed_does_not_expire_under_the_commit() {
    let mut c = Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        offsets_retention_ms: 1_000,
        offsets_retention_check_interval_ms: 100,
        ..CoordinatorConfig::default()
    });
    let p = commit(&mut c, 0, -1, "", 4);
    c.apply_commit(0, p);
    // A new commit of the same partition is being written when the check runs.
    let writing = commit(&mut c, 1_000, -1, "", 5);
    let mut fx = Effects::default();
    c.tick(1_000, &mut fx);
    assert!(
        fx.records.is_empty(),
        "tombstones under a commit: {:?}",
        fx.records
    );
    c.apply_commit(1_000, writing);
    assert_eq!(c.fetch_offsets("g", None).len(), 1);
    // A commit that failed to be written leaves nothing in the way either.
    let failed = commit(&mut c, 1_500, -1, "", 6);
    c.fail_commit(&failed);
    let mut fx = Effects::default();
    c.tick(2_000, &mut fx);
    assert!(
        c.group("g").is_none(),
        "expired once no commit is being written"
    );
    assert_eq!(fx.records.len(), 2, "offset and group tombstones");
}

#[test]
fn offsets_of_active_groups_do_not_expire() {
    let mut c = Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        offsets_retention_ms: 1_000,
        offsets_retention_check_interval_ms: 100,
        ..CoordinatorConfig::default()
    });
    let a = stable_one(&mut c);
    let p = commit(&mut c, 0, 1, &a, 4);
    c.apply_commit(0, p);
    let mut fx = Effects::default();
    for t in (500..5_000).step_by(500) {
        c.heartbeat(t, "g", 1, &a, None).unwrap();
        c.tick(t, &mut fx);
    }
    assert_eq!(c.fetch_offsets("g", None).len(), 1);
}

#[test]
fn load_replays_offsets_groups_and_tombstones() {
    let mut src = coord(0);
    let a = stable_one(&mut src);
    let mut p = commit(&mut src, 0, 1, &a, 7);
    let mut records = std::mem::take(&mut p.records);
    let mut c = coord(0);
    // Group metadata as written at the sync, then the commit.
    let mut fx = Effects::default();
    let _ = src.leave(
        0,
        "g",
        &[Leaving {
            member_id: a,
            instance_id: None,
        }],
        &mut fx,
    );
    records.extend(fx.records);
    for r in &records {
        c.load_record(0, &r.key, r.value.as_deref()).unwrap();
    }
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.generation), (GroupState::Empty, 2));
    assert_eq!(c.fetch_offsets("g", None)[0].1.as_ref().unwrap().offset, 7);
    // A tombstone removes the offset.
    let t = &records[0];
    c.load_record(0, &t.key, None).unwrap();
    assert!(c.fetch_offsets("g", None).is_empty());
    assert!(c.load_record(0, &[0, 9], None).is_err());
}

/// Two static members, Stable at generation 2; returns the coordinator, the member ids
/// (i1's, i2's) and every record it wrote, in order.
fn stable_two_static() -> (Coordinator, String, String, Vec<Record>) {
    let mut c = coord(0);
    let mut records = Vec::new();
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, args("", Some("i1"), &["range"]), &mut fx);
    let a = join_reply(&fx, 1).unwrap().member_id.to_string();
    records.extend(sync(&mut c, 2, 0, &a, 1, &[(&a, "A")]).records);
    let mut fx = Effects::default();
    c.join(JoinToken(3), 0, args("", Some("i2"), &["range"]), &mut fx);
    c.join(JoinToken(4), 0, args(&a, Some("i1"), &["range"]), &mut fx);
    let b = join_reply(&fx, 3).unwrap().member_id.to_string();
    records.extend(fx.records);
    let fx = sync(&mut c, 5, 0, &a, 2, &[(&a, "A"), (&b, "B")]);
    assert_eq!(sync_reply(&fx, 5).unwrap().error_code, 0);
    records.extend(fx.records);
    let fx = sync(&mut c, 6, 0, &b, 2, &[]);
    assert_eq!(sync_reply(&fx, 6).unwrap().assignment, Bytes::from("B"));
    records.extend(fx.records);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    (c, a, b, records)
}

fn load(records: &[Record], now: i64) -> Coordinator {
    let mut c = coord(0);
    for r in records {
        c.load_record(now, &r.key, r.value.as_deref()).unwrap();
    }
    c
}

#[test]
fn load_restores_a_stable_group_with_its_members_and_generation() {
    let (src, a, b, records) = stable_two_static();
    let before = src.group("g").unwrap();
    let t0 = 1_000_000;
    let mut c = load(&records, t0);
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.generation), (GroupState::Stable, 2));
    assert_eq!(g.protocol_type.as_deref(), Some("consumer"));
    assert_eq!(g.protocol.as_deref(), Some("range"));
    assert_eq!(g.leader, before.leader);
    assert_eq!(
        g.members.keys().collect::<Vec<_>>(),
        before.members.keys().collect::<Vec<_>>()
    );
    for (id, m) in &g.members {
        let old = &before.members[id];
        assert_eq!(m.instance_id, old.instance_id);
        assert_eq!(
            (&m.client_id, &m.client_host),
            (&old.client_id, &old.client_host)
        );
        assert_eq!(
            (m.session_timeout_ms, m.rebalance_timeout_ms),
            (SESSION, REBALANCE)
        );
        assert_eq!(m.assignment, old.assignment);
        assert_eq!(m.metadata("range"), Bytes::from("meta-range"));
    }
    assert_eq!(g.static_members.get("i1"), Some(&a));
    assert_eq!(g.static_members.get("i2"), Some(&b));
    // The members carry on at their generation: no rejoin needed.
    assert_eq!(c.heartbeat(t0, "g", 2, &a, Some("i1")), Ok(()));
    assert_eq!(
        c.heartbeat(t0, "g", 1, &b, Some("i2")),
        Err(E::IllegalGeneration)
    );
    let fx = sync(&mut c, 9, t0, &b, 2, &[]);
    assert_eq!(sync_reply(&fx, 9).unwrap().assignment, Bytes::from("B"));
    let d = c.describe("g");
    assert_eq!(
        (d.state, d.protocol.as_str()),
        (GroupState::Stable, "range")
    );
    assert_eq!(d.members.len(), 2);
    // A commit at the restored generation is accepted.
    let plan = commit(&mut c, t0, 2, &a, 5);
    assert_eq!(plan.results[0].1, Ok(()));
}

#[test]
fn restored_sessions_start_at_load_time_and_silent_members_expire() {
    let (_, a, b, records) = stable_two_static();
    // Loaded long after the records were written: nobody has expired yet.
    let t0 = 5_000_000;
    let mut c = load(&records, t0);
    let mut fx = Effects::default();
    c.tick(t0 + i64::from(SESSION) - 1, &mut fx);
    assert_eq!(c.group("g").unwrap().members.len(), 2);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    // a heartbeats, b never comes back: b expires one session after the load.
    assert_eq!(c.heartbeat(t0 + 3_000, "g", 2, &a, Some("i1")), Ok(()));
    c.tick(t0 + i64::from(SESSION), &mut fx);
    let g = c.group("g").unwrap();
    assert!(!g.members.contains_key(&b));
    assert!(g.members.contains_key(&a));
    assert_eq!(g.state, GroupState::PreparingRebalance);
    assert_eq!(
        c.heartbeat(t0 + 3_100, "g", 2, &a, Some("i1")),
        Err(E::RebalanceInProgress)
    );
}

#[test]
fn restored_static_member_restarts_without_a_rebalance() {
    let (_, _, b, records) = stable_two_static();
    let mut c = load(&records, 0);
    let mut fx = Effects::default();
    c.join(JoinToken(1), 10, args("", Some("i2"), &["range"]), &mut fx);
    let r = join_reply(&fx, 1).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 2));
    assert_ne!(r.member_id.to_string(), b);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    assert_eq!(
        c.heartbeat(10, "g", 2, &b, Some("i2")),
        Err(E::FencedInstanceId)
    );
}

#[test]
fn load_keeps_only_the_last_group_value_and_an_empty_one_restores_empty() {
    let (mut src, a, b, mut records) = stable_two_static();
    let mut fx = Effects::default();
    let _ = src.leave(
        10,
        "g",
        &[
            Leaving {
                member_id: a,
                instance_id: Some("i1".into()),
            },
            Leaving {
                member_id: b,
                instance_id: Some("i2".into()),
            },
        ],
        &mut fx,
    );
    records.extend(fx.records);
    let c = load(&records, 20);
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.generation), (GroupState::Empty, 3));
    assert!(g.members.is_empty() && g.static_members.is_empty());
    assert_eq!((g.leader.as_deref(), g.protocol.as_deref()), (None, None));
}

#[test]
fn describe_and_list() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let d = c.describe("g");
    assert_eq!(
        (d.state, d.protocol.as_str(), d.protocol_type.as_str()),
        (GroupState::Stable, "range", "consumer")
    );
    assert_eq!(d.members.len(), 1);
    assert_eq!(d.members[0].0, a);
    assert_eq!(d.members[0].5, Bytes::from("A"));
    assert_eq!(
        c.list(),
        vec![("g".to_string(), "consumer".to_string(), "Stable", "classic")]
    );
}

#[test]
fn pending_member_ids_expire() {
    let mut c = coord(0);
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, args("", None, &["range"]), &mut fx);
    let id = join_reply(&fx, 1).unwrap().member_id.to_string();
    c.tick(i64::from(SESSION), &mut fx);
    let mut fx = Effects::default();
    c.join(
        JoinToken(2),
        i64::from(SESSION),
        args(&id, None, &["range"]),
        &mut fx,
    );
    assert_eq!(
        join_reply(&fx, 2).unwrap().error_code,
        E::UnknownMemberId.code()
    );
}

#[test]
fn leader_rejoin_in_stable_group_rebalances_follower_rejoin_does_not() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let mut fx = Effects::default();
    // A follower-less group: the leader rejoining starts a new generation.
    c.join(JoinToken(5), 0, args(&a, None, &["range"]), &mut fx);
    let r = join_reply(&fx, 5).unwrap();
    assert_eq!(r.generation_id, 2);
    assert_eq!(c.group("g").unwrap().state, GroupState::CompletingRebalance);
    // Rejoining with the same protocols while completing returns the same answer.
    let mut fx = Effects::default();
    c.join(JoinToken(6), 0, args(&a, None, &["range"]), &mut fx);
    assert_eq!(join_reply(&fx, 6).unwrap().generation_id, 2);
}

/// A group of 10,000 members through its first generation, a leave and a rejoin of all
/// the others: every join and sync answered, generations as Kafka numbers them. (The
/// coordinator's per-join work is O(the member's protocols), not O(members): counted
/// protocol support and a count of members yet to rejoin.)
#[test]
fn ten_thousand_members_join_leave_and_rejoin() {
    let n = 10_000u64;
    let mut c = coord(3000);
    let mut ids = Vec::new();
    for i in 0..n {
        let (id, fx) = join_new(&mut c, 1_000_000 + i * 4, 0, &["roundrobin"]);
        assert!(fx.replies.is_empty(), "waits for the initial delay");
        ids.push(id);
    }
    let mut fx = Effects::default();
    c.tick(3_001, &mut fx);
    assert_eq!(fx.replies.len(), n as usize);
    let g = c.group("g").unwrap();
    assert_eq!((g.generation, g.members.len()), (1, n as usize));
    let leader = g.leader.clone().unwrap();
    let sync_args = |id: &str, assignments: Vec<(String, Bytes)>| SyncArgs {
        group_id: "g".into(),
        generation: 1,
        member_id: id.to_string(),
        instance_id: None,
        protocol_type: None,
        protocol_name: None,
        assignments,
    };
    let mut fx = Effects::default();
    for (i, id) in ids.iter().enumerate().filter(|(_, id)| **id != leader) {
        c.sync(
            SyncToken(i as u64),
            3_002,
            sync_args(id, Vec::new()),
            &mut fx,
        );
    }
    assert!(fx.replies.is_empty(), "followers wait for the leader");
    let given = ids
        .iter()
        .map(|m| (m.clone(), Bytes::from(m.clone())))
        .collect();
    c.sync(SyncToken(n), 3_002, sync_args(&leader, given), &mut fx);
    assert_eq!(fx.replies.len(), n as usize);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    // One member leaves; the others learn it from a heartbeat and rejoin.
    let gone = ids.pop().unwrap();
    let mut fx = Effects::default();
    let leaving = [Leaving {
        member_id: gone,
        instance_id: None,
    }];
    assert!(c.leave(3_100, "g", &leaving, &mut fx).0.is_ok());
    for id in &ids {
        assert_eq!(
            c.heartbeat(3_200, "g", 1, id, None),
            Err(E::RebalanceInProgress)
        );
    }
    let mut fx = Effects::default();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(c.group("g").unwrap().generation, 1, "not before the last");
        c.join(
            JoinToken(50_000_000 + i as u64),
            3_300,
            args(id, None, &["roundrobin"]),
            &mut fx,
        );
    }
    // The last rejoin ends the phase: everyone is answered in generation 2.
    let g = c.group("g").unwrap();
    assert_eq!((g.generation, g.members.len()), (2, n as usize - 1));
    assert_eq!(fx.replies.len(), n as usize - 1);
}

#[test]
fn a_generation_whose_metadata_was_not_stored_is_dropped_and_rebalanced() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let (b, fx) = join_new(&mut c, 10, 100, &["range"]);
    assert!(join_reply(&fx, 1010).is_none());
    let mut fx = Effects::default();
    c.join(JoinToken(12), 200, args(&a, None, &["range"]), &mut fx);
    assert_eq!(join_reply(&fx, 12).unwrap().generation_id, 2);
    let fx = sync(&mut c, 13, 300, &b, 2, &[]);
    assert!(
        sync_reply(&fx, 13).is_none(),
        "the follower waits for the leader"
    );
    let fx = sync(&mut c, 14, 400, &a, 2, &[(&a, "A"), (&b, "B")]);
    assert_eq!(fx.records.len(), 1, "the generation's GroupMetadata record");
    assert_eq!(fx.replies.len(), 2);
    // The shell could not append it: both waiting syncs get the store error instead.
    for r in fx.replies {
        match r.failed(E::UnknownServerError) {
            Deferred::Sync(_, s) => {
                assert_eq!(s.error_code, E::UnknownServerError.code());
                assert!(s.assignment.is_empty(), "no assignment leaks out");
            }
            Deferred::Join(..) => panic!("a sync stays a sync"),
        }
    }
    let mut more = Effects::default();
    c.metadata_not_stored(500, &fx.records[0], &mut more);
    assert!(more.records.is_empty());
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.generation), (GroupState::PreparingRebalance, 2));
    assert!(g.members.values().all(|m| m.assignment.is_empty()));
    for m in [&a, &b] {
        assert_eq!(
            c.heartbeat(600, "g", 2, m, None),
            Err(E::RebalanceInProgress),
            "members learn of it and rejoin"
        );
    }
    // Both rejoin: the next generation is formed and, once stored, kept.
    let mut fx = Effects::default();
    c.join(JoinToken(20), 700, args(&a, None, &["range"]), &mut fx);
    c.join(JoinToken(21), 700, args(&b, None, &["range"]), &mut fx);
    assert_eq!(join_reply(&fx, 20).unwrap().generation_id, 3);
    let fx = sync(&mut c, 22, 800, &a, 3, &[(&a, "A"), (&b, "B")]);
    assert_eq!(sync_reply(&fx, 22).unwrap().assignment, Bytes::from("A"));
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    // A failure reported for another generation's record changes nothing, nor one
    // for a group this coordinator does not hold.
    let mut gen2 = fx.records[0].clone();
    let mut v = crate::records::GroupValue::decode(gen2.value.as_deref().unwrap()).unwrap();
    assert_eq!(v.generation, 3);
    v.generation = 2;
    gen2.value = Some(v.encode());
    let mut ignored = Effects::default();
    c.metadata_not_stored(1_000, &gen2, &mut ignored);
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.generation), (GroupState::Stable, 3));
    let mut other = coord(0);
    other.metadata_not_stored(1_000, &fx.records[0], &mut ignored);
    assert!(other.group("g").is_none(), "no group is invented");
    assert!(ignored.replies.is_empty() && ignored.records.is_empty());
}

// ------------------------------------------------------------ group.max.size (KIP-389)

fn coord_max(max: usize) -> Coordinator {
    Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        group_max_size: max,
        ..CoordinatorConfig::default()
    })
}

/// A join's answer must be GROUP_MAX_SIZE_REACHED, with no member id (as Kafka's).
fn assert_refused(fx: &Effects, token: Token) {
    let r = join_reply(fx, token).expect("answered at once");
    assert_eq!(r.error_code, E::GroupMaxSizeReached.code());
    assert_eq!(r.error_code, 81);
    assert_eq!(r.member_id.as_str(), "");
}

fn assert_tally_exact(c: &Coordinator) {
    let (kept, fresh) = c.group("g").unwrap().record_bytes_tally();
    assert_eq!(kept, fresh, "the running record-size tally drifted");
}

#[test]
fn a_group_at_max_size_refuses_new_members_and_lets_current_ones_rejoin() {
    let mut c = coord_max(2);
    let a = stable_one(&mut c);
    // A member id handed out while there is room...
    let mut fx = Effects::default();
    c.join(JoinToken(5), 50, args("", None, &["range"]), &mut fx);
    let pending = join_reply(&fx, 5).unwrap().member_id.to_string();
    // ...then b joins and a rejoins: the join phase waits for the pending id.
    let (b, _) = join_new(&mut c, 10, 100, &["range"]);
    let mut fx = Effects::default();
    c.join(JoinToken(12), 200, args(&a, None, &["range"]), &mut fx);
    assert!(
        join_reply(&fx, 12).is_none(),
        "waits for the pending member"
    );
    // The pending member comes back once two have joined: refused, forgotten, and the
    // phase ends with a and b in generation 2.
    let mut fx = Effects::default();
    c.join(
        JoinToken(21),
        250,
        args(&pending, None, &["range"]),
        &mut fx,
    );
    assert_refused(&fx, 21);
    assert_eq!(join_reply(&fx, 12).unwrap().generation_id, 2);
    assert_eq!(join_reply(&fx, 1010).unwrap().generation_id, 2);
    let fx = sync(&mut c, 13, 300, &a, 2, &[(&a, "A"), (&b, "B")]);
    assert_eq!(sync_reply(&fx, 13).unwrap().error_code, 0);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    assert_tally_exact(&c);
    // A third member is refused at its first join.
    let mut fx = Effects::default();
    c.join(JoinToken(20), 400, args("", None, &["range"]), &mut fx);
    assert_refused(&fx, 20);
    let g = c.group("g").unwrap();
    assert_eq!(
        (g.state, g.generation, g.members.len()),
        (GroupState::Stable, 2, 2)
    );
    assert!(fx.records.is_empty(), "a refusal writes nothing");
    assert_eq!(g.pending_member_count(), 0);
    // Current members are not affected: heartbeats, a follower's rejoin...
    assert_eq!(c.heartbeat(500, "g", 2, &a, None), Ok(()));
    let mut fx = Effects::default();
    c.join(JoinToken(30), 500, args(&b, None, &["range"]), &mut fx);
    let r = join_reply(&fx, 30).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 2));
    // ...and the leader's rejoin, which rebalances: both are in generation 3.
    let mut fx = Effects::default();
    c.join(JoinToken(31), 600, args(&a, None, &["range"]), &mut fx);
    c.join(JoinToken(32), 600, args(&b, None, &["range"]), &mut fx);
    assert_eq!(join_reply(&fx, 31).unwrap().generation_id, 3);
    assert_eq!(join_reply(&fx, 32).unwrap().generation_id, 3);
    assert_eq!(c.group("g").unwrap().members.len(), 2);
    // Once one leaves there is room again.
    let leaving = [Leaving {
        member_id: b.clone(),
        instance_id: None,
    }];
    let mut fx = Effects::default();
    assert_eq!(c.leave(700, "g", &leaving, &mut fx).1, vec![Ok(())]);
    // The refused pending id was forgotten: with room again it is unknown.
    let mut fx = Effects::default();
    c.join(
        JoinToken(22),
        750,
        args(&pending, None, &["range"]),
        &mut fx,
    );
    assert_eq!(
        join_reply(&fx, 22).unwrap().error_code,
        E::UnknownMemberId.code()
    );
    let (_, fx) = join_new(&mut c, 40, 800, &["range"]);
    assert!(
        join_reply(&fx, 1040).is_none(),
        "admitted, waits for a's rejoin"
    );
    assert_tally_exact(&c);
}

#[test]
fn a_static_member_restarting_in_a_full_group_replaces_itself() {
    let mut c = coord_max(2);
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, args("", Some("i1"), &["range"]), &mut fx);
    let a = join_reply(&fx, 1).unwrap().member_id.to_string();
    sync(&mut c, 2, 0, &a, 1, &[(&a, "A")]);
    let mut fx = Effects::default();
    c.join(JoinToken(3), 0, args("", Some("i2"), &["range"]), &mut fx);
    c.join(JoinToken(4), 0, args(&a, Some("i1"), &["range"]), &mut fx);
    let b = join_reply(&fx, 3).unwrap().member_id.to_string();
    let fx = sync(&mut c, 5, 0, &a, 2, &[(&a, "A"), (&b, "B")]);
    assert_eq!(sync_reply(&fx, 5).unwrap().error_code, 0);
    // A third instance is refused.
    let mut fx = Effects::default();
    c.join(JoinToken(6), 100, args("", Some("i3"), &["range"]), &mut fx);
    assert_refused(&fx, 6);
    // i2 restarts (new member id, no rebalance) in the full group: it takes its place.
    let mut fx = Effects::default();
    c.join(JoinToken(7), 200, args("", Some("i2"), &["range"]), &mut fx);
    let r = join_reply(&fx, 7).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 2));
    let b2 = r.member_id.to_string();
    assert_ne!(b2, b);
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.members.len()), (GroupState::Stable, 2));
    assert_eq!(g.static_members["i2"], b2);
    assert_eq!(fx.records.len(), 1, "the new member id is stored");
    assert_tally_exact(&c);
    // The old incarnation stays fenced; the group stays full.
    assert_eq!(
        c.heartbeat(300, "g", 2, &b, Some("i2")),
        Err(E::FencedInstanceId)
    );
    let mut fx = Effects::default();
    c.join(JoinToken(8), 300, args("", None, &["range"]), &mut fx);
    assert_refused(&fx, 8);
}

/// KIP-389: a group loaded with more members than a (lowered) group.max.size rebalances
/// at once; the first members back stay, a later one is refused and removed, and the
/// next generation has group.max.size members.
#[test]
fn a_group_loaded_over_max_size_rebalances_down_to_it() {
    let mut src = coord(0);
    let mut records = Vec::new();
    let mut ids = Vec::new();
    for i in 0..3u64 {
        let (id, fx) = join_new(&mut src, 10 + i, 0, &["range"]);
        records.extend(fx.records);
        ids.push(id);
        let mut fx = Effects::default();
        for (j, id) in ids.iter().enumerate() {
            src.join(
                JoinToken(100 * (i + 1) + j as u64),
                0,
                args(id, None, &["range"]),
                &mut fx,
            );
        }
        let g = src.group("g").unwrap();
        assert_eq!(g.state, GroupState::CompletingRebalance);
        let leader = g.leader.clone().unwrap();
        let gen = g.generation;
        let asg: Vec<(&str, &str)> = ids.iter().map(|m| (m.as_str(), "P")).collect();
        records.extend(sync(&mut src, 900 + i, 0, &leader, gen, &asg).records);
    }
    let gen = src.group("g").unwrap().generation;
    let mut c = coord_max(2);
    for r in &records {
        c.load_record(1_000, &r.key, r.value.as_deref()).unwrap();
    }
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    let mut fx = Effects::default();
    c.loaded(1_000, |g| g == "g", &mut fx);
    assert!(fx.records.is_empty() && fx.replies.is_empty());
    assert_eq!(c.group("g").unwrap().state, GroupState::PreparingRebalance);
    for id in &ids {
        assert_eq!(
            c.heartbeat(1_100, "g", gen, id, None),
            Err(E::RebalanceInProgress)
        );
    }
    // Two rejoin: admitted, waiting for the third.
    let mut fx = Effects::default();
    c.join(
        JoinToken(1),
        1_200,
        args(&ids[2], None, &["range"]),
        &mut fx,
    );
    c.join(
        JoinToken(2),
        1_200,
        args(&ids[0], None, &["range"]),
        &mut fx,
    );
    assert!(fx.replies.is_empty(), "the join phase waits for the third");
    // A brand-new member is refused too (two have rejoined: the limit).
    let mut fx = Effects::default();
    c.join(JoinToken(3), 1_250, args("", None, &["range"]), &mut fx);
    assert_refused(&fx, 3);
    // The third is refused and removed, which ends the join phase.
    let mut fx = Effects::default();
    c.join(
        JoinToken(4),
        1_300,
        args(&ids[1], None, &["range"]),
        &mut fx,
    );
    assert_refused(&fx, 4);
    let r1 = join_reply(&fx, 1).expect("the phase ended");
    let r2 = join_reply(&fx, 2).expect("the phase ended");
    assert_eq!((r1.error_code, r1.generation_id), (0, gen + 1));
    assert_eq!((r2.error_code, r2.generation_id), (0, gen + 1));
    let g = c.group("g").unwrap();
    assert_eq!(g.state, GroupState::CompletingRebalance);
    let mut kept: Vec<&String> = g.members.keys().collect();
    kept.sort();
    let mut want = vec![&ids[0], &ids[2]];
    want.sort();
    assert_eq!(kept, want);
    assert_eq!(
        c.heartbeat(1_400, "g", gen + 1, &ids[1], None),
        Err(E::UnknownMemberId),
        "the evicted member is gone"
    );
    assert_tally_exact(&c);
    // A group loaded within the limit is left alone.
    let mut c = coord_max(3);
    for r in &records {
        c.load_record(1_000, &r.key, r.value.as_deref()).unwrap();
    }
    let mut fx = Effects::default();
    c.loaded(1_000, |_| true, &mut fx);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
}

/// A join whose metadata would take the group's GroupMetadata record past the batch
/// limit is refused before the group rebalances; the estimate is never below the
/// record the group then writes.
#[test]
fn a_new_member_that_would_outgrow_the_metadata_record_is_refused() {
    let limit = 4_000;
    let mut c = Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        metadata_batch_bytes_max: limit,
        ..CoordinatorConfig::default()
    });
    let big = |member: &str| {
        let mut a = args(member, None, &["range"]);
        a.protocols = vec![
            ("range".into(), Bytes::from(vec![b'x'; 900])),
            ("roundrobin".into(), Bytes::from(vec![b'y'; 50])),
        ];
        a
    };
    let mut ids: Vec<String> = Vec::new();
    let mut token = 1;
    loop {
        let estimate = c.group("g").map(|g| g.record_bytes_estimate(&big("")));
        let mut fx = Effects::default();
        c.join(JoinToken(token), 0, big(""), &mut fx);
        let r = join_reply(&fx, token).unwrap();
        if r.error_code == E::GroupMaxSizeReached.code() {
            assert!(estimate.unwrap() > limit, "refused only past the limit");
            break;
        }
        let id = r.member_id.to_string();
        let mut fx = Effects::default();
        c.join(JoinToken(token + 1), 0, big(&id), &mut fx);
        for m in &ids {
            c.join(JoinToken(token + 2), 0, big(m), &mut fx);
        }
        ids.push(id);
        let g = c.group("g").unwrap();
        let (leader, gen) = (g.leader.clone().unwrap(), g.generation);
        let asg: Vec<(&str, &str)> = ids.iter().map(|m| (m.as_str(), "assignment")).collect();
        let fx = sync(&mut c, token + 3, 0, &leader, gen, &asg);
        let record = &fx.records[0];
        let stored =
            RECORD_BATCH_OVERHEAD_BYTES + record.key.len() + record.value.as_ref().unwrap().len();
        if let Some(e) = estimate {
            assert!(
                e >= stored,
                "estimate {e} below the record's {stored} bytes"
            );
        }
        assert!(stored <= limit);
        token += 10;
    }
    assert_eq!(
        ids.len(),
        3,
        "three ~1 KB members fit in 4,000 bytes, four do not"
    );
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.members.len()), (GroupState::Stable, 3));
    assert!(
        g.pending_member_count() == 0,
        "the refused first join left no pending id"
    );
    // A current member's rejoin is not refused by the estimate.
    let mut fx = Effects::default();
    c.join(JoinToken(5_000), 10, big(&ids[1]), &mut fx);
    assert_eq!(join_reply(&fx, 5_000).unwrap().error_code, 0);
    // The estimate counts the largest assignment of the last generation for every
    // member: with 1,000-byte assignments a small member no longer fits.
    let mut c2 = coord(0);
    let a = stable_one(&mut c2);
    let small = args("", None, &["range"]);
    let before = c2.group("g").unwrap().record_bytes_estimate(&small);
    let mut fx = Effects::default();
    c2.join(JoinToken(60), 0, args(&a, None, &["range"]), &mut fx);
    let big_assignment = "z".repeat(1_000);
    sync(&mut c2, 61, 0, &a, 2, &[(&a, &big_assignment)]);
    let after = c2.group("g").unwrap().record_bytes_estimate(&small);
    assert_eq!(
        after - before,
        2 * (1_000 - 1),
        "two members, 999 more bytes each"
    );
    assert_tally_exact(&c);
}

// ------------------------------------------------------------ Kafka parity (review)

/// Kafka's `doCommitOffsets`: a member's OffsetCommit counts as a heartbeat in Stable
/// and in PreparingRebalance.
#[test]
fn a_members_commit_refreshes_its_session() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    // Session 6 s from the sync at 0; the commit at 5 s moves it to 11 s.
    assert_eq!(commit(&mut c, 5_000, 1, &a, 3).results[0].1, Ok(()));
    let mut fx = Effects::default();
    c.tick(8_000, &mut fx);
    let g = c.group("g").unwrap();
    assert!(g.members.contains_key(&a), "the commit was a heartbeat");
    assert_eq!(g.state, GroupState::Stable);
    c.tick(11_000, &mut fx);
    assert!(!c.group("g").unwrap().members.contains_key(&a));

    // In PreparingRebalance too: b's join starts a phase that ends at 10.1 s; a, which
    // has not rejoined, commits at 5 s and is still a member at 8 s.
    let mut c = coord(0);
    let a = stable_one(&mut c);
    let _ = join_new(&mut c, 10, 100, &["range"]);
    assert_eq!(c.group("g").unwrap().state, GroupState::PreparingRebalance);
    // A refused commit (an old generation) is no heartbeat.
    assert_eq!(
        commit(&mut c, 4_000, 0, &a, 3).results[0].1,
        Err(E::IllegalGeneration)
    );
    assert_eq!(commit(&mut c, 5_000, 1, &a, 3).results[0].1, Ok(()));
    let mut fx = Effects::default();
    c.tick(8_000, &mut fx);
    assert!(c.group("g").unwrap().members.contains_key(&a));
}

/// KIP-394 as Kafka has it: pending member ids are not dropped when a join phase
/// completes; one that comes back later joins as a new member (rebalancing the group),
/// and one that does not expires with its session timeout.
#[test]
fn a_pending_member_id_outlives_the_join_phase_and_still_expires() {
    let mut c = coord(0);
    let a = stable_one(&mut c);
    // b joins at 100: the phase ends when a rejoins, or at 10.1 s.
    let (b, _) = join_new(&mut c, 10, 100, &["range"]);
    // Two clients get MEMBER_ID_REQUIRED meanwhile: p (30 s session) and q (12 s).
    let pending = |c: &mut Coordinator, token: Token, session_ms: i32| {
        let mut a = args("", None, &["range"]);
        a.session_timeout_ms = session_ms;
        let mut fx = Effects::default();
        c.join(JoinToken(token), 200, a, &mut fx);
        let r = join_reply(&fx, token).unwrap();
        assert_eq!(r.error_code, E::MemberIdRequired.code());
        r.member_id.to_string()
    };
    let p = pending(&mut c, 20, 30_000);
    let q = pending(&mut c, 21, 12_000);
    let mut fx = Effects::default();
    c.join(JoinToken(30), 300, args(&a, None, &["range"]), &mut fx);
    assert!(join_reply(&fx, 30).is_none(), "waits for the pending ids");
    let mut fx = Effects::default();
    c.tick(10_100, &mut fx);
    assert_eq!(join_reply(&fx, 30).unwrap().generation_id, 2);
    assert_eq!(join_reply(&fx, 1010).unwrap().generation_id, 2);
    let g = c.group("g").unwrap();
    assert_eq!(g.state, GroupState::CompletingRebalance);
    assert_eq!(
        g.pending_member_count(),
        2,
        "the phase's end keeps pending ids"
    );
    // p comes back with its id: it joins, and the group rebalances for it.
    let mut fx = Effects::default();
    c.join(JoinToken(40), 10_200, args(&p, None, &["range"]), &mut fx);
    assert!(
        join_reply(&fx, 40).is_none(),
        "p waits in the new join phase"
    );
    let g = c.group("g").unwrap();
    assert_eq!(g.state, GroupState::PreparingRebalance);
    assert!(g.members.contains_key(&p));
    assert_eq!(g.pending_member_count(), 1);
    // q never comes back: its id expires 12 s after it was handed out.
    let mut fx = Effects::default();
    c.tick(12_199, &mut fx);
    assert_eq!(c.group("g").unwrap().pending_member_count(), 1);
    c.tick(12_200, &mut fx);
    assert_eq!(c.group("g").unwrap().pending_member_count(), 0);
    let mut fx = Effects::default();
    c.join(JoinToken(50), 12_300, args(&q, None, &["range"]), &mut fx);
    assert_eq!(
        join_reply(&fx, 50).unwrap().error_code,
        E::UnknownMemberId.code()
    );
    // a and b rejoin: generation 3 has the three members.
    let mut fx = Effects::default();
    c.join(JoinToken(60), 12_300, args(&a, None, &["range"]), &mut fx);
    c.join(JoinToken(61), 12_300, args(&b, None, &["range"]), &mut fx);
    let r = join_reply(&fx, 40).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 3));
    assert_eq!(c.group("g").unwrap().members.len(), 3);
}

/// Kafka's `validateOffsetMetadataLength` compares the Java string's `length()`:
/// UTF-16 code units, not UTF-8 bytes. For plain and transactional commits.
#[test]
fn offset_metadata_limit_counts_utf16_units() {
    let mut c = Coordinator::new(CoordinatorConfig {
        offset_metadata_max_bytes: 2_500,
        ..CoordinatorConfig::default()
    });
    let plan = |c: &mut Coordinator, metadata: String| {
        let mut m = committed(1);
        m.metadata = metadata;
        c.plan_commit(
            0,
            CommitArgs {
                group_id: "g".into(),
                generation: -1,
                member_id: String::new(),
                instance_id: None,
                offsets: vec![(("t".into(), 0), m)],
            },
        )
        .results[0]
            .1
    };
    // 4,000 bytes, 2,000 units.
    assert_eq!("é".repeat(2_000).len(), 4_000);
    assert_eq!(plan(&mut c, "é".repeat(2_000)), Ok(()));
    assert_eq!(plan(&mut c, "é".repeat(2_500)), Ok(()));
    assert_eq!(
        plan(&mut c, "é".repeat(2_501)),
        Err(E::OffsetMetadataTooLarge)
    );
    // Outside the BMP a character is two units (and four bytes).
    assert_eq!(plan(&mut c, "😀".repeat(1_250)), Ok(()));
    assert_eq!(
        plan(&mut c, format!("{}x", "😀".repeat(1_250))),
        Err(E::OffsetMetadataTooLarge)
    );
    assert_eq!(
        plan(&mut c, "x".repeat(2_501)),
        Err(E::OffsetMetadataTooLarge)
    );
    let txn = |c: &mut Coordinator, metadata: String| {
        let mut m = committed(1);
        m.metadata = metadata;
        let p = c.plan_txn_commit(
            0,
            TxnCommitArgs {
                group_id: "g".into(),
                producer_id: 7,
                producer_epoch: 0,
                generation: -1,
                member_id: String::new(),
                instance_id: None,
                offsets: vec![(("t".into(), 0), m)],
            },
        );
        c.fail_txn_commit(&p);
        p.results[0].1
    };
    assert_eq!(txn(&mut c, "é".repeat(2_000)), Ok(()));
    assert_eq!(
        txn(&mut c, "é".repeat(2_501)),
        Err(E::OffsetMetadataTooLarge)
    );
}

/// ConsumerProtocolSubscription bytes (version 1) for `topics`.
fn subscription(topics: &[&str]) -> Bytes {
    use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Encodable;
    let sub = ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| crate::sb(*t)).collect());
    let mut meta = bytes::BytesMut::new();
    meta.extend_from_slice(&1i16.to_be_bytes());
    sub.encode(&mut meta, 1).unwrap();
    meta.freeze()
}

/// Kafka's `isSubscribedToTopic`: a consumer group whose subscriptions cannot be
/// decoded counts as subscribed to every topic, so OffsetDelete refuses each partition
/// with GROUP_SUBSCRIBED_TO_TOPIC (no group error); a non-empty group of another
/// protocol type is NON_EMPTY_GROUP.
#[test]
fn offset_delete_in_a_consumer_group_with_unknown_subscriptions_refuses_every_topic() {
    let mut c = coord(0);
    let a = stable_one(&mut c); // "meta-range" is no subscription
    let p = commit(&mut c, 0, 1, &a, 4);
    c.apply_commit(0, p);
    let mut fx = Effects::default();
    let r = c.delete_offsets("g", &[("t".into(), 0), ("u".into(), 0)], &mut fx);
    assert_eq!(
        r,
        Ok(vec![
            Err(E::GroupSubscribedToTopic),
            Err(E::GroupSubscribedToTopic)
        ])
    );
    assert!(fx.records.is_empty());
    assert_eq!(c.fetch_offsets("g", None).len(), 1);
    // Another protocol type (Kafka Connect's, say): NON_EMPTY_GROUP.
    let mut c = coord(0);
    let mut j = args("", None, &["range"]);
    j.require_known_member_id = false;
    j.protocol_type = "connect".into();
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, j, &mut fx);
    let id = join_reply(&fx, 1).unwrap().member_id.to_string();
    let mut fx = Effects::default();
    c.sync(
        SyncToken(2),
        0,
        SyncArgs {
            group_id: "g".into(),
            generation: 1,
            member_id: id,
            instance_id: None,
            protocol_type: None,
            protocol_name: None,
            assignments: vec![],
        },
        &mut fx,
    );
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    assert_eq!(
        c.delete_offsets("g", &[("t".into(), 0)], &mut fx),
        Err(E::NonEmptyGroup)
    );
}

/// KIP-496: a Stable consumer group loses the offsets of topics it no longer
/// subscribes to, a retention after their commit; those of subscribed topics stay.
/// Not while its partition is loading.
#[test]
fn stable_consumer_group_expires_offsets_of_unsubscribed_topics() {
    let config = CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        offsets_retention_ms: 1_000,
        offsets_retention_check_interval_ms: 100,
        ..CoordinatorConfig::default()
    };
    let mut c = Coordinator::new(config.clone());
    let mut j = args("", None, &["range"]);
    j.require_known_member_id = false;
    j.protocols = vec![("range".into(), subscription(&["t"]))];
    let mut fx = Effects::default();
    c.join(JoinToken(1), 0, j, &mut fx);
    let a = join_reply(&fx, 1).unwrap().member_id.to_string();
    let group_record = sync(&mut c, 2, 0, &a, 1, &[(&a, "A")]).records[0].clone();
    let p = c.plan_commit(
        0,
        CommitArgs {
            group_id: "g".into(),
            generation: 1,
            member_id: a.clone(),
            instance_id: None,
            offsets: vec![
                (("t".into(), 0), committed(4)),
                (("u".into(), 0), committed(5)),
            ],
        },
    );
    let offset_records = p.records.clone();
    c.apply_commit(0, p);
    let mut fx = Effects::default();
    for t in (100..1_000).step_by(100) {
        c.heartbeat(t, "g", 1, &a, None).unwrap();
        c.tick(t, &mut fx);
    }
    assert!(fx.records.is_empty());
    c.heartbeat(1_000, "g", 1, &a, None).unwrap();
    c.tick(1_000, &mut fx);
    assert_eq!(fx.records.len(), 1, "u's tombstone only: {:?}", fx.records);
    assert!(fx.records[0].value.is_none());
    assert_eq!(
        Key::decode(&fx.records[0].key).unwrap(),
        Key::Offset {
            group: "g".into(),
            topic: "u".into(),
            partition: 0
        }
    );
    let offsets = c.fetch_offsets("g", None);
    assert_eq!(offsets.len(), 1);
    assert_eq!(offsets[0].0, ("t".into(), 0));
    let mut fx = Effects::default();
    for t in (1_500..5_000).step_by(500) {
        c.heartbeat(t, "g", 1, &a, None).unwrap();
        c.tick(t, &mut fx);
    }
    assert!(fx.records.is_empty());
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    assert_eq!(c.fetch_offsets("g", None).len(), 1);

    // Replayed while the partition loads: nothing expires until it is loaded.
    let mut c = Coordinator::new(config);
    let now = 5_000;
    for r in std::iter::once(&group_record).chain(&offset_records) {
        c.load_record(now, &r.key, r.value.as_deref()).unwrap();
    }
    let mut fx = Effects::default();
    c.tick(now, &mut fx);
    assert!(fx.records.is_empty(), "loading: {:?}", fx.records);
    c.loaded(now, |_| true, &mut fx);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    c.tick(now + 100, &mut fx);
    assert_eq!(fx.records.len(), 1);
    assert_eq!(c.fetch_offsets("g", None).len(), 1);
    assert_eq!(c.fetch_offsets("g", None)[0].0, ("t".into(), 0));
}
