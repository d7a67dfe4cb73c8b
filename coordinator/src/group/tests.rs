//! Static membership across join and sync phases, and offset expiry while a
//! partition loads (the helpers follow `group_tests.rs`).

use super::*;
use kafka_protocol::error::ResponseError as E;
use kafka_protocol::messages::JoinGroupResponse;
use std::collections::BTreeSet;

const REBALANCE: i32 = 10_000;

fn coord() -> Coordinator {
    Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        ..CoordinatorConfig::default()
    })
}

/// A JoinGroup of static member `instance` (`member` "" for a new incarnation).
fn join(
    c: &mut Coordinator,
    token: u64,
    now: i64,
    member: &str,
    instance: &str,
    session_ms: i32,
) -> Effects {
    let mut fx = Effects::default();
    let a = JoinArgs {
        group_id: "g".into(),
        member_id: member.into(),
        instance_id: Some(instance.into()),
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: session_ms,
        rebalance_timeout_ms: REBALANCE,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from("meta-range"))],
        require_known_member_id: true,
        supports_skip_assignment: false,
    };
    c.join(JoinToken(token), now, a, &mut fx);
    fx
}

fn join_reply(fx: &Effects, token: u64) -> Option<JoinGroupResponse> {
    fx.replies.iter().find_map(|r| match r {
        Deferred::Join(t, j) if *t == JoinToken(token) => Some(j.clone()),
        _ => None,
    })
}

fn sync_reply(fx: &Effects, token: u64) -> Option<SyncGroupResponse> {
    fx.replies.iter().find_map(|r| match r {
        Deferred::Sync(t, s) if *t == SyncToken(token) => Some(s.clone()),
        _ => None,
    })
}

fn sync(
    c: &mut Coordinator,
    token: u64,
    now: i64,
    member: &str,
    instance: &str,
    gen: i32,
    asg: &[(&str, &str)],
) -> Effects {
    let mut fx = Effects::default();
    let a = SyncArgs {
        group_id: "g".into(),
        generation: gen,
        member_id: member.into(),
        instance_id: Some(instance.into()),
        protocol_type: Some("consumer".into()),
        protocol_name: None,
        assignments: asg
            .iter()
            .map(|(m, a)| (m.to_string(), Bytes::from(a.to_string())))
            .collect(),
    };
    c.sync(SyncToken(token), now, a, &mut fx);
    fx
}

/// Static members i1 (the leader) and i2, Stable at generation 2 with assignments
/// "A" and "B", all at time 0; returns their member ids.
fn stable_two_static(c: &mut Coordinator, session_ms: i32) -> (String, String) {
    let fx = join(c, 1, 0, "", "i1", session_ms);
    let a = join_reply(&fx, 1).unwrap().member_id.to_string();
    sync(c, 2, 0, &a, "i1", 1, &[(&a, "A")]);
    let mut fx = join(c, 3, 0, "", "i2", session_ms);
    fx.replies
        .extend(join(c, 4, 0, &a, "i1", session_ms).replies);
    let b = join_reply(&fx, 3).unwrap().member_id.to_string();
    assert_eq!(join_reply(&fx, 4).unwrap().generation_id, 2);
    sync(c, 5, 0, &a, "i1", 2, &[(&a, "A"), (&b, "B")]);
    let fx = sync(c, 6, 0, &b, "i2", 2, &[]);
    assert_eq!(sync_reply(&fx, 6).unwrap().assignment, Bytes::from("B"));
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    (a, b)
}

/// Kafka rebalances when a static member restarts while the group waits for its
/// assignment: the leader was given the old member id and would assign the
/// instance's partitions to it, leaving the new incarnation with nothing.
#[test]
fn static_member_restarting_in_completing_rebalance_rebalances() {
    let mut c = coord();
    let (a, b) = stable_two_static(&mut c, 6_000);
    // i3 joins; i1 and i2 rejoin: generation 3 waits for the leader's assignment.
    let mut fx = join(&mut c, 10, 100, "", "i3", 6_000);
    fx.replies
        .extend(join(&mut c, 11, 100, &a, "i1", 6_000).replies);
    fx.replies
        .extend(join(&mut c, 12, 100, &b, "i2", 6_000).replies);
    let r = join_reply(&fx, 11).unwrap();
    assert_eq!(r.generation_id, 3);
    assert!(r.members.iter().any(|m| m.member_id.as_str() == b));
    let d = join_reply(&fx, 10).unwrap().member_id.to_string();
    assert_eq!(c.group("g").unwrap().state, GroupState::CompletingRebalance);
    // i2's process restarts before syncing: it joins with no member id.
    let fx = join(&mut c, 13, 200, "", "i2", 6_000);
    assert!(
        join_reply(&fx, 13).is_none(),
        "waits for the new join phase"
    );
    let g = c.group("g").unwrap();
    assert_eq!(g.state, GroupState::PreparingRebalance);
    let b2 = g.static_members["i2"].clone();
    assert_ne!(b2, b);
    // The members of generation 3 must rejoin.
    assert_eq!(
        c.heartbeat(300, "g", 3, &a, Some("i1")),
        Err(E::RebalanceInProgress)
    );
    let mut fx = join(&mut c, 14, 300, &a, "i1", 6_000);
    fx.replies
        .extend(join(&mut c, 15, 300, &d, "i3", 6_000).replies);
    let r = join_reply(&fx, 14).unwrap();
    assert_eq!(r.generation_id, 4);
    let ids: BTreeSet<String> = r.members.iter().map(|m| m.member_id.to_string()).collect();
    assert_eq!(ids, BTreeSet::from([a.clone(), b2.clone(), d.clone()]));
    // The leader's assignment reaches the new incarnation.
    sync(
        &mut c,
        16,
        300,
        &a,
        "i1",
        4,
        &[(&a, "A"), (&b2, "B"), (&d, "C")],
    );
    let fx = sync(&mut c, 17, 300, &b2, "i2", 4, &[]);
    assert_eq!(sync_reply(&fx, 17).unwrap().assignment, Bytes::from("B"));
}

/// A static member restarting in Stable before it synced is a new incarnation
/// that owes no SyncGroup of the old one's generation: the expiring sync phase
/// does not remove it (Kafka's replaceStaticMember).
#[test]
fn a_restarted_static_member_owes_no_sync_of_its_old_incarnation() {
    let mut c = coord();
    let fx = join(&mut c, 1, 0, "", "i1", 30_000);
    let a = join_reply(&fx, 1).unwrap().member_id.to_string();
    sync(&mut c, 2, 0, &a, "i1", 1, &[(&a, "A")]);
    // i2 joins, i1 rejoins: generation 2, and only the leader syncs.
    let mut fx = join(&mut c, 3, 0, "", "i2", 30_000);
    fx.replies
        .extend(join(&mut c, 4, 0, &a, "i1", 30_000).replies);
    let b = join_reply(&fx, 3).unwrap().member_id.to_string();
    sync(&mut c, 5, 0, &a, "i1", 2, &[(&a, "A"), (&b, "B")]);
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    // i2 restarts before it synced: a new member id, no rebalance.
    let fx = join(&mut c, 6, 100, "", "i2", 30_000);
    let b2 = join_reply(&fx, 6).unwrap().member_id.to_string();
    assert_ne!(b2, b);
    let mut fx = Effects::default();
    c.tick(i64::from(REBALANCE) + 1_000, &mut fx);
    let g = c.group("g").unwrap();
    assert_eq!(g.state, GroupState::Stable);
    assert!(g.members.contains_key(&b2), "the new incarnation stays");
}

/// Kafka's `completeClassicGroupJoin` drops only dynamic members that did not
/// rejoin; a static one stays in the generation until its sync phase expires, in
/// CompletingRebalance or Stable.
#[test]
fn static_member_that_does_not_rejoin_stays_until_the_sync_phase_expires() {
    let mut c = coord();
    let (a, b) = stable_two_static(&mut c, 30_000);
    // i3 joins and i1 rejoins; i2 stays silent.
    let mut fx = join(&mut c, 10, 0, "", "i3", 30_000);
    fx.replies
        .extend(join(&mut c, 11, 0, &a, "i1", 30_000).replies);
    assert!(join_reply(&fx, 11).is_none(), "waits for i2");
    let mut fx = Effects::default();
    c.tick(10_000, &mut fx);
    let g = c.group("g").unwrap();
    assert_eq!(
        (g.state, g.generation, g.members.len()),
        (GroupState::CompletingRebalance, 3, 3)
    );
    assert_eq!(g.static_members.get("i2"), Some(&b));
    let r = join_reply(&fx, 11).unwrap();
    assert_eq!((r.generation_id, r.leader.as_str()), (3, a.as_str()));
    assert_eq!(r.members.len(), 3, "the leader assigns i2's share too");
    let d = join_reply(&fx, 10).unwrap().member_id.to_string();
    // The leader and i3 sync; i2 never does.
    sync(&mut c, 12, 10_000, &d, "i3", 3, &[]);
    let fx = sync(
        &mut c,
        13,
        10_000,
        &a,
        "i1",
        3,
        &[(&a, "A"), (&b, "B"), (&d, "C")],
    );
    assert_eq!(sync_reply(&fx, 13).unwrap().assignment, Bytes::from("A"));
    assert_eq!(c.group("g").unwrap().state, GroupState::Stable);
    let mut fx = Effects::default();
    c.tick(19_999, &mut fx);
    assert!(c.group("g").unwrap().members.contains_key(&b));
    // One rebalance timeout after the join phase ended: i2 goes (its session has
    // 20 s left) and the group rebalances.
    c.tick(20_000, &mut fx);
    let g = c.group("g").unwrap();
    assert!(!g.members.contains_key(&b));
    assert!(!g.static_members.contains_key("i2"));
    assert_eq!(g.state, GroupState::PreparingRebalance);
}

/// If no member rejoined (all are static), Kafka does not complete an empty
/// generation: the join phase waits another rebalance timeout.
#[test]
fn join_phase_that_no_member_rejoined_waits_again() {
    let mut c = coord();
    let (a, b) = stable_two_static(&mut c, 30_000);
    // i3 joins and leaves again: i1 and i2 must rejoin, and neither does.
    let fx = join(&mut c, 10, 0, "", "i3", 30_000);
    assert!(join_reply(&fx, 10).is_none());
    let mut fx = Effects::default();
    let (_, r) = c.leave(
        0,
        "g",
        &[Leaving {
            member_id: String::new(),
            instance_id: Some("i3".into()),
        }],
        &mut fx,
    );
    assert_eq!(r, vec![Ok(())]);
    let mut fx = Effects::default();
    c.tick(10_000, &mut fx);
    let g = c.group("g").unwrap();
    assert_eq!(
        (g.state, g.generation, g.members.len()),
        (GroupState::PreparingRebalance, 2, 2)
    );
    assert!(fx.records.is_empty(), "no empty generation is written");
    // i2 rejoins: it becomes the leader of generation 3 at the next deadline, and
    // i1 stays in it.
    let fx = join(&mut c, 11, 15_000, &b, "i2", 30_000);
    assert!(join_reply(&fx, 11).is_none());
    let mut fx = Effects::default();
    c.tick(20_000, &mut fx);
    let r = join_reply(&fx, 11).unwrap();
    assert_eq!((r.generation_id, r.leader.as_str()), (3, b.as_str()));
    assert_eq!(r.members.len(), 2);
    assert!(c.group("g").unwrap().members.contains_key(&a));
}

/// A tick while a `__consumer_offsets` partition is half replayed: the group's
/// offsets are in, its latest GroupMetadata record (with members) is not yet. The
/// group must not expire then (Kafka expires only fully loaded groups).
#[test]
fn offsets_of_a_partition_being_loaded_do_not_expire() {
    let mut src = coord();
    let (a, _) = stable_two_static(&mut src, 6_000);
    let old = Committed {
        offset: 7,
        leader_epoch: -1,
        metadata: String::new(),
        commit_timestamp_ms: 0,
    };
    let offset = offset_record("g", "t", 0, &old);
    let metadata = src.group("g").unwrap().metadata_record();
    // Another group of the partition holds nothing but an old offset.
    let other = offset_record("h", "t", 0, &old);
    let mut c = Coordinator::new(CoordinatorConfig {
        initial_rebalance_delay_ms: 0,
        offsets_retention_ms: 1_000,
        offsets_retention_check_interval_ms: 100,
        ..CoordinatorConfig::default()
    });
    let now = 5_000;
    for r in [&offset, &other] {
        c.load_record(now, &r.key, r.value.as_deref()).unwrap();
    }
    let mut fx = Effects::default();
    c.tick(now, &mut fx);
    assert!(fx.records.is_empty(), "no tombstones: {:?}", fx.records);
    c.load_record(now, &metadata.key, metadata.value.as_deref())
        .unwrap();
    c.loaded(now, |_| true, &mut fx);
    let g = c.group("g").unwrap();
    assert_eq!((g.state, g.generation), (GroupState::Stable, 2));
    assert!(g.members.contains_key(&a));
    assert_eq!(c.fetch_offsets("g", None)[0].1.as_ref().unwrap().offset, 7);
    // Loaded: the empty group's offsets expire at the next check, g's do not.
    c.tick(now + 100, &mut fx);
    assert!(c.group("h").is_none());
    assert_eq!(fx.records.len(), 2, "h's offset and group tombstones");
    assert!(fx.records.iter().all(|r| r.group == "h"));
    assert_eq!(c.fetch_offsets("g", None).len(), 1);
}
