//! Unit tests for the ISR state machines: one test per rule, plus the dangerous cases
//! (KIP-101 divergence, KIP-279 multi-round truncation, leader change with followers at
//! different offsets, a pending shrink that must not advance the high watermark).

use super::*;

fn cache(entries: &[(LeaderEpoch, Offset)]) -> LeaderEpochCache {
    let mut c = LeaderEpochCache::new();
    for &(e, o) in entries {
        assert!(c.assign(e, o));
    }
    c
}

#[test]
fn epoch_for_an_offset_is_the_newest_epoch_starting_at_or_below_it() {
    let c = cache(&[(2, 10), (5, 40)]);
    let got: Vec<_> = [0, 9, 10, 39, 40, 1_000].map(|o| c.epoch_for(o)).to_vec();
    assert_eq!(got, [UNDEFINED_EPOCH, UNDEFINED_EPOCH, 2, 2, 5, 5]);
    assert_eq!(LeaderEpochCache::new().epoch_for(0), UNDEFINED_EPOCH);
}

const LAG_MS: u64 = 30_000;

/// Leader 1, replicas 1,2,3, all in the ISR, epoch 5, partition epoch 10, log end 100.
fn leader3(hw: Offset) -> Leader {
    Leader::new(LeaderInit {
        me: 1,
        leader_epoch: 5,
        partition_epoch: 10,
        replicas: vec![1, 2, 3],
        isr: vec![1, 2, 3],
        epoch_start_offset: 100,
        durable_log_end: 100,
        high_watermark: hw,
        now_ms: 0,
        replica_lag_time_max_ms: LAG_MS,
    })
}

// --- leader-epoch cache -----------------------------------------------------------------

#[test]
fn assign_ignores_epochs_that_are_not_newer() {
    let mut c = cache(&[(1, 0), (3, 10)]);
    assert!(!c.assign(3, 12));
    assert!(!c.assign(2, 12));
    assert_eq!(c.latest_epoch(), 3);
    assert!(c.assign(4, 15));
    assert_eq!(c.entries().len(), 3);
}

#[test]
fn assign_drops_entries_past_a_lower_start_offset() {
    let mut c = cache(&[(1, 0), (3, 10)]);
    assert!(c.assign(4, 5));
    assert_eq!(
        c.entries(),
        &[
            EpochEntry {
                epoch: 1,
                start_offset: 0
            },
            EpochEntry {
                epoch: 4,
                start_offset: 5
            }
        ]
    );
}

#[test]
fn end_offset_for_follows_kafka() {
    let c = cache(&[(1, 0), (3, 10), (6, 20)]);
    // Latest epoch: the log end.
    assert_eq!(c.end_offset_for(6, 25), (6, 25));
    // A known older epoch: the start of the next one.
    assert_eq!(c.end_offset_for(3, 25), (3, 20));
    assert_eq!(c.end_offset_for(1, 25), (1, 10));
    // An unknown epoch between known ones: the largest epoch below and the next start.
    assert_eq!(c.end_offset_for(4, 25), (3, 20));
    assert_eq!(c.end_offset_for(2, 25), (1, 10));
    // Below the first epoch: the requested epoch and the first start offset.
    let later = cache(&[(4, 50), (6, 60)]);
    assert_eq!(later.end_offset_for(2, 70), (2, 50));
    // Above the latest, undefined, or empty cache: UNDEFINED.
    assert_eq!(c.end_offset_for(7, 25), (UNDEFINED_EPOCH, UNDEFINED_OFFSET));
    assert_eq!(
        c.end_offset_for(UNDEFINED_EPOCH, 25),
        (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    );
    assert_eq!(
        LeaderEpochCache::new().end_offset_for(0, 0),
        (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    );
}

#[test]
fn truncate_from_end_drops_entries_at_or_after_the_offset() {
    let mut c = cache(&[(1, 0), (3, 10), (6, 20)]);
    c.truncate_from_end(20);
    assert_eq!(c.latest_epoch(), 3);
    c.truncate_from_end(11);
    assert_eq!(c.latest_epoch(), 3);
    c.truncate_from_end(0);
    assert_eq!(c.latest_epoch(), UNDEFINED_EPOCH);
}

#[test]
fn truncate_from_start_moves_the_covering_epoch() {
    let mut c = cache(&[(1, 0), (3, 10), (6, 20)]);
    c.truncate_from_start(15);
    assert_eq!(
        c.entries(),
        &[
            EpochEntry {
                epoch: 3,
                start_offset: 15
            },
            EpochEntry {
                epoch: 6,
                start_offset: 20
            }
        ]
    );
    c.truncate_from_start(20);
    assert_eq!(c.entries().len(), 1);
    assert_eq!(c.entries()[0].start_offset, 20);
    // Before the first entry: nothing changes.
    let mut d = cache(&[(2, 5)]);
    d.truncate_from_start(3);
    assert_eq!(d.entries()[0].start_offset, 5);
}

#[test]
fn checkpoint_round_trips() {
    let c = cache(&[(1, 0), (3, 10), (6, 20)]);
    let text = c.encode();
    assert_eq!(text, "0\n3\n1 0\n3 10\n6 20\n");
    assert_eq!(LeaderEpochCache::decode(&text).unwrap(), c);
    assert_eq!(
        LeaderEpochCache::decode("0\n0\n").unwrap(),
        LeaderEpochCache::new()
    );
}

#[test]
fn checkpoint_refuses_corrupt_input() {
    use CheckpointError::*;
    let dec = LeaderEpochCache::decode;
    assert_eq!(dec(""), Err(Missing("version")));
    assert_eq!(dec("0\n"), Err(Missing("count")));
    assert!(matches!(dec("1\n0\n"), Err(Version(_))));
    assert!(matches!(dec("0\nx\n"), Err(Count(_))));
    assert!(matches!(dec("0\n1\n1\n"), Err(Entry { line: 3, .. })));
    assert!(matches!(dec("0\n1\n1 2 3\n"), Err(Entry { .. })));
    assert!(matches!(dec("0\n1\n-1 2\n"), Err(Entry { .. })));
    assert!(matches!(dec("0\n1\na b\n"), Err(Entry { .. })));
    assert_eq!(
        dec("0\n2\n1 0\n"),
        Err(Length {
            expected: 2,
            found: 1
        })
    );
    assert_eq!(dec("0\n2\n3 0\n2 5\n"), Err(Order(4)));
    assert_eq!(dec("0\n2\n1 5\n2 4\n"), Err(Order(4)));
}

// --- truncation (follower) --------------------------------------------------------------

/// KIP-101's scenario. A (leader, epoch 0) and B hold m0, m1; B's high watermark is 1
/// (the hw covering m1 had not reached it). The old rule truncated B to its hw on restart,
/// losing m1; B then led epoch 1 and wrote m2 at offset 1, while A, back, kept m1 at
/// offset 1: divergence. With epochs, A asks B for the end of epoch 0 and truncates to 1.
#[test]
fn kip101_divergence_is_truncated_away() {
    let a_cache = cache(&[(0, 0)]);
    let b_cache = cache(&[(0, 0), (1, 1)]);
    // B (leader, log end 2: m0 and m2) answers A's request for epoch 0.
    let (epoch, end) = b_cache.end_offset_for(a_cache.latest_epoch(), 2);
    assert_eq!((epoch, end), (0, 1));
    let mut a = Follower::new(10, 20, 1, 2);
    let t = a.on_epoch_response(&a_cache, 2, epoch, end);
    assert_eq!(
        t,
        Truncation {
            offset: 1,
            complete: true
        }
    );
    assert_eq!(a.phase(), FollowerPhase::Fetching);
    // The truncation went below A's hw of 2 (this story needs A's hw to have counted m1
    // while B lost it — the pre-fsync world KIP-101 was written for); the hw follows.
    assert_eq!(a.high_watermark(), 1);
}

/// The KIP-101 scenario where nothing diverged: the follower keeps its whole log even
/// though its high watermark is lower (the pre-KIP-101 rule would have cut it).
#[test]
fn truncation_does_not_cut_to_the_high_watermark_when_epochs_agree() {
    let f_cache = cache(&[(0, 0)]);
    let t = truncation_offset(&f_cache, 10, 4, 0, 10);
    assert_eq!(
        t,
        Truncation {
            offset: 10,
            complete: true
        }
    );
    // The leader has more of epoch 0 than we do: keep ours.
    assert_eq!(truncation_offset(&f_cache, 10, 4, 0, 12).offset, 10);
}

/// KIP-279: the leader's answer names an epoch the follower never saw, so the logs may
/// diverge earlier; the follower truncates to its own end for the older epoch and asks
/// again.
#[test]
fn kip279_unknown_epoch_takes_two_rounds() {
    let leader = cache(&[(0, 0), (1, 5), (2, 7), (4, 9)]);
    let mut f_cache = cache(&[(0, 0), (1, 5), (3, 8)]);
    let mut f = Follower::new(2, 1, 4, 6);
    let mut f_end = 10;
    // Round 1: we ask for epoch 3; the leader's floor is 2, ending at 9.
    let (e, o) = leader.end_offset_for(f.epoch_request(&f_cache), 12);
    assert_eq!((e, o), (2, 9));
    let t = f.on_epoch_response(&f_cache, f_end, e, o);
    assert_eq!(
        t,
        Truncation {
            offset: 8,
            complete: false
        }
    );
    assert_eq!(f.phase(), FollowerPhase::Truncating);
    f_end = t.offset;
    f_cache.truncate_from_end(f_end);
    // Round 2: we ask for epoch 1; the leader says epoch 1 ends at 7.
    let (e, o) = leader.end_offset_for(f.epoch_request(&f_cache), 12);
    assert_eq!((e, o), (1, 7));
    let t = f.on_epoch_response(&f_cache, f_end, e, o);
    assert_eq!(
        t,
        Truncation {
            offset: 7,
            complete: true
        }
    );
    assert_eq!(f.phase(), FollowerPhase::Fetching);
    assert_eq!(f.high_watermark(), 6);
}

#[test]
fn undefined_answer_truncates_to_the_high_watermark() {
    let f_cache = cache(&[(0, 0)]);
    assert_eq!(
        truncation_offset(&f_cache, 10, 4, UNDEFINED_EPOCH, UNDEFINED_OFFSET),
        Truncation {
            offset: 4,
            complete: true
        }
    );
    // An undefined epoch with a defined offset (old message format): the leader's end.
    assert_eq!(
        truncation_offset(&f_cache, 10, 4, UNDEFINED_EPOCH, 7).offset,
        7
    );
    // Our first epoch is newer than the leader's answer: our records from offset 3 are
    // not from epoch ≤ 2, so they go.
    let late = cache(&[(5, 3)]);
    assert_eq!(
        truncation_offset(&late, 10, 2, 2, 6),
        Truncation {
            offset: 3,
            complete: true
        }
    );
    // No local epochs at all: the leader's end.
    assert_eq!(
        truncation_offset(&LeaderEpochCache::new(), 10, 2, 2, 6).offset,
        6
    );
    // Never past our own end.
    assert_eq!(truncation_offset(&f_cache, 3, 3, 0, 9).offset, 3);
}

#[test]
fn follower_high_watermark_is_min_of_leader_hw_and_durable_end_and_never_regresses() {
    let mut f = Follower::new(2, 1, 3, 0);
    assert_eq!(f.on_fetch_response(10, 6), 6);
    assert_eq!(f.on_fetch_response(10, 12), 10);
    // An older (reordered) response or a new leader's lagging hw does not move it back.
    assert_eq!(f.on_fetch_response(8, 12), 10);
    // A crash that loses unsynced data does.
    f.on_local_truncated(7);
    assert_eq!(f.high_watermark(), 7);
}

// --- leader -----------------------------------------------------------------------------

#[test]
fn fetch_is_refused_for_non_replicas_and_wrong_epochs() {
    let mut l = leader3(100);
    assert_eq!(
        l.on_follower_fetch(9, 5, 100, 1),
        Err(FetchError::NotAReplica(9))
    );
    assert_eq!(
        l.on_follower_fetch(2, 4, 100, 1),
        Err(FetchError::FencedLeaderEpoch {
            requester: 4,
            ours: 5
        })
    );
    assert_eq!(
        l.on_follower_fetch(2, 6, 100, 1),
        Err(FetchError::UnknownLeaderEpoch {
            requester: 6,
            ours: 5
        })
    );
    assert!(l.follower(2).unwrap().log_end.is_none());
}

#[test]
fn high_watermark_is_min_over_isr_and_waits_for_unknown_followers() {
    let mut l = leader3(90);
    l.on_local_durable(120);
    assert_eq!(l.high_watermark(), 90);
    let ok = l.on_follower_fetch(2, 5, 110, 1).unwrap();
    // Follower 3 has not fetched yet: unknown, so no advance.
    assert_eq!(ok.high_watermark, 90);
    l.on_follower_fetch(3, 5, 105, 2).unwrap();
    assert_eq!(l.high_watermark(), 105);
    l.on_follower_fetch(3, 5, 125, 3).unwrap();
    assert_eq!(l.high_watermark(), 110);
    // The leader counts only its durable end.
    l.on_follower_fetch(2, 5, 130, 4).unwrap();
    assert_eq!(l.high_watermark(), 120);
    // A follower that restarted and reports less does not move the hw back.
    l.on_follower_fetch(2, 5, 115, 5).unwrap();
    assert_eq!(l.high_watermark(), 120);
}

#[test]
fn new_leader_hw_never_exceeds_its_durable_end() {
    let l = Leader::new(LeaderInit {
        me: 1,
        leader_epoch: 1,
        partition_epoch: 1,
        replicas: vec![1],
        isr: vec![1],
        epoch_start_offset: 12,
        durable_log_end: 10,
        high_watermark: 15,
        now_ms: 0,
        replica_lag_time_max_ms: LAG_MS,
    });
    assert_eq!(l.high_watermark(), 10);
}

#[test]
fn caught_up_time_follows_kafkas_rule() {
    let mut l = leader3(100);
    // Behind the leader's end: not caught up, no previous fetch end to compare with.
    l.on_follower_fetch(2, 5, 90, 1_000).unwrap();
    assert_eq!(l.follower(2).unwrap().last_caught_up_ms, 0);
    l.on_local_durable(110);
    // Reached the end the leader had at its previous fetch (100): caught up as of then.
    l.on_follower_fetch(2, 5, 100, 2_000).unwrap();
    assert_eq!(l.follower(2).unwrap().last_caught_up_ms, 1_000);
    // Reached the current end: caught up now.
    l.on_follower_fetch(2, 5, 110, 3_000).unwrap();
    assert_eq!(l.follower(2).unwrap().last_caught_up_ms, 3_000);
}

#[test]
fn lagging_isr_follower_is_proposed_for_removal_once() {
    let mut l = leader3(100);
    l.on_follower_fetch(2, 5, 100, 10).unwrap();
    l.on_follower_fetch(3, 5, 100, 10).unwrap();
    l.on_local_durable(150);
    l.on_follower_fetch(2, 5, 150, LAG_MS).unwrap();
    assert_eq!(l.tick(LAG_MS + 10), None, "within the lag time");
    let alter = l.tick(LAG_MS + 11).expect("3 lagged");
    assert_eq!(
        alter,
        AlterIsr {
            leader_epoch: 5,
            partition_epoch: 10,
            new_isr: vec![1, 2]
        }
    );
    assert_eq!(l.tick(LAG_MS + 20), None, "one AlterPartition in flight");
    assert_eq!(l.pending_alter(), Some(&alter));
}

#[test]
fn follower_at_leader_end_is_never_out_of_sync() {
    let mut l = leader3(100);
    l.on_follower_fetch(2, 5, 100, 1).unwrap();
    l.on_follower_fetch(3, 5, 100, 1).unwrap();
    // No new data for a long time: followers are at the end, nothing to shrink.
    assert_eq!(l.tick(10 * LAG_MS), None);
}

/// A follower fetches what the leader appended while the leader's own write of it runs,
/// so it can be past the leader's durable end: that is at the end, not lagging, and the
/// high watermark still waits for the leader's write.
#[test]
fn followers_past_the_leaders_durable_end_are_in_sync_and_wait_for_it() {
    let mut l = leader3(100);
    l.on_follower_fetch(2, 5, 130, 1).unwrap();
    l.on_follower_fetch(3, 5, 120, 1).unwrap();
    assert_eq!(
        l.high_watermark(),
        100,
        "the leader's write is still running"
    );
    assert_eq!(l.tick(10 * LAG_MS), None);
    l.on_local_durable(130);
    assert_eq!(l.high_watermark(), 120);
}

/// KIP-497: while the shrink of {1,2,3} to {1,2} is pending, the controller may still hold
/// {1,2,3} and elect 3 after a failure; so the hw keeps waiting for 3.
#[test]
fn pending_shrink_does_not_advance_the_high_watermark() {
    let mut l = leader3(100);
    l.on_follower_fetch(2, 5, 100, 1).unwrap();
    l.on_follower_fetch(3, 5, 100, 1).unwrap();
    l.on_local_durable(200);
    l.on_follower_fetch(2, 5, 200, LAG_MS + 5).unwrap();
    l.tick(LAG_MS + 100).expect("shrink proposed");
    assert_eq!(l.maximal_isr(), vec![1, 2, 3]);
    assert_eq!(l.high_watermark(), 100);
    assert_eq!(l.acked(200, 2), AckState::Pending);
    // Committed: now the hw moves over {1,2}.
    l.on_metadata(5, 11, &[1, 2], &[1, 2, 3]);
    assert!(l.pending_alter().is_none());
    assert_eq!(l.high_watermark(), 200);
    assert_eq!(l.acked(200, 2), AckState::Acked);
}

/// KIP-497: while adding 3 is pending, the controller may already hold {1,2,3} and elect
/// 3; so the hw also waits for 3 (it is past the hw by construction, but must keep up).
#[test]
fn pending_expansion_counts_the_new_member() {
    let mut l = Leader::new(LeaderInit {
        isr: vec![1, 2],
        ..leader3(100).init_for_test()
    });
    l.on_follower_fetch(2, 5, 100, 1).unwrap();
    let ok = l.on_follower_fetch(3, 5, 100, 1).unwrap();
    assert_eq!(ok.alter_isr.map(|a| a.new_isr), Some(vec![1, 2, 3]));
    assert_eq!(l.maximal_isr(), vec![1, 2, 3]);
    l.on_local_durable(150);
    l.on_follower_fetch(2, 5, 150, 2).unwrap();
    assert_eq!(l.high_watermark(), 100, "3 is in the maximal ISR");
    l.on_follower_fetch(3, 5, 140, 2).unwrap();
    assert_eq!(l.high_watermark(), 140);
    // The knob that breaks KIP-497 ignores 3.
    let mut broken = l.clone();
    broken.set_unsafe_ignore_pending_isr(true);
    broken.on_follower_fetch(2, 5, 150, 3).unwrap();
    assert_eq!(broken.high_watermark(), 150);
}

/// KIP-841: a fenced broker (dead, or stopping with a controlled shutdown and still
/// fetching) is never proposed into the ISR, and a pending change that would add one
/// is forgotten once the metadata says it is fenced: the high watermark then no
/// longer waits for it (a rolling restart stalled acks=all producers ~2 s on it).
#[test]
fn fenced_followers_are_never_proposed_and_a_pending_addition_of_one_is_dropped() {
    let mut l = Leader::new(LeaderInit {
        isr: vec![1, 2],
        ..leader3(100).init_for_test()
    });
    l.set_ineligible(&[3]);
    l.on_follower_fetch(2, 5, 100, 1).unwrap();
    let ok = l.on_follower_fetch(3, 5, 100, 1).unwrap();
    assert!(
        ok.alter_isr.is_none() && l.pending_alter().is_none(),
        "3 is fenced"
    );
    // Unfenced, it is proposed; fenced again while that is pending, it is dropped.
    l.set_ineligible(&[]);
    let ok = l.on_follower_fetch(3, 5, 100, 2).unwrap();
    assert_eq!(ok.alter_isr.map(|a| a.new_isr), Some(vec![1, 2, 3]));
    l.on_local_durable(150);
    l.on_follower_fetch(2, 5, 150, 3).unwrap();
    assert_eq!(
        l.high_watermark(),
        100,
        "the pending addition of 3 holds it"
    );
    l.set_ineligible(&[3]);
    assert!(l.pending_alter().is_none());
    assert_eq!(l.high_watermark(), 150, "3 no longer counts");
    // A pending change that adds no fenced broker stays.
    l.set_ineligible(&[]);
    let ok = l.on_follower_fetch(3, 5, 150, 4).unwrap();
    assert!(ok.alter_isr.is_some());
    l.set_ineligible(&[2]);
    assert!(
        l.pending_alter().is_some(),
        "2 is in the committed ISR: not an addition"
    );
}

#[test]
fn expansion_needs_the_high_watermark_and_the_epoch_start() {
    let mut l = Leader::new(LeaderInit {
        isr: vec![1, 2],
        high_watermark: 80,
        ..leader3(0).init_for_test()
    });
    // Below the hw (80): no.
    assert_eq!(l.on_follower_fetch(3, 5, 70, 1).unwrap().alter_isr, None);
    // At the hw but below the epoch start (100): its suffix may still be from an old
    // epoch, so no.
    assert_eq!(l.on_follower_fetch(3, 5, 90, 2).unwrap().alter_isr, None);
    // Past both.
    let alter = l
        .on_follower_fetch(3, 5, 100, 3)
        .unwrap()
        .alter_isr
        .unwrap();
    assert_eq!(alter.new_isr, vec![1, 2, 3]);
    assert_eq!((alter.leader_epoch, alter.partition_epoch), (5, 10));
}

#[test]
fn rejected_or_superseded_proposals_are_cleared() {
    let mut l = Leader::new(LeaderInit {
        isr: vec![1, 2],
        ..leader3(100).init_for_test()
    });
    let first = l
        .on_follower_fetch(3, 5, 100, 1)
        .unwrap()
        .alter_isr
        .unwrap();
    // A rejection of some other proposal does not clear this one.
    let other = AlterIsr {
        new_isr: vec![1],
        ..first.clone()
    };
    l.on_alter_rejected(&other);
    assert_eq!(l.pending_alter(), Some(&first));
    l.on_alter_rejected(&first);
    assert!(l.pending_alter().is_none());
    assert!(l
        .on_follower_fetch(3, 5, 100, 2)
        .unwrap()
        .alter_isr
        .is_some());
    // Stale metadata (same partition epoch) keeps the proposal.
    l.on_metadata(5, 10, &[1, 2], &[1, 2, 3]);
    assert!(l.pending_alter().is_some());
    // A newer partition epoch answers it, whatever it says.
    l.on_metadata(5, 11, &[1], &[1, 2, 3]);
    assert!(l.pending_alter().is_none());
    assert_eq!(l.isr(), &[1]);
}

#[test]
fn min_isr_checks() {
    let mut l = leader3(100);
    assert_eq!(l.check_min_isr(2), Ok(()));
    l.on_metadata(5, 11, &[1], &[1, 2, 3]);
    assert_eq!(
        l.check_min_isr(2),
        Err(NotEnoughReplicas {
            isr: 1,
            min_insync: 2
        })
    );
    l.on_local_durable(110);
    assert_eq!(l.acked(110, 1), AckState::Acked);
    assert_eq!(l.acked(110, 2), AckState::NotEnoughReplicasAfterAppend);
    assert_eq!(l.acked(111, 2), AckState::Pending);
}

/// A follower the leader already proposed to drop cannot confirm writes: refuse acks=all
/// before appending even while the shrink waits for the controller (which may have lost
/// its majority with the same brokers).
#[test]
fn a_pending_shrink_below_min_isr_refuses_before_append() {
    let mut l = leader3(100);
    l.on_local_durable(110);
    let shrink = l.tick(LAG_MS + 1).expect("both followers lag");
    assert_eq!(shrink.new_isr, vec![1]);
    assert_eq!(l.isr(), &[1, 2, 3], "not committed yet");
    assert_eq!(
        l.check_min_isr(2),
        Err(NotEnoughReplicas {
            isr: 1,
            min_insync: 2
        })
    );
    assert_eq!(l.check_min_isr(1), Ok(()));
    // Rejected (say the controller refused it): the committed ISR counts again.
    l.on_alter_rejected(&shrink);
    assert_eq!(l.check_min_isr(2), Ok(()));
}

/// Leader change with followers at different offsets: old leader 1 had 0..120 in epoch
/// 5 (hw 100); follower 2 has 0..115, follower 3 0..105. 2 becomes leader in epoch 6
/// starting at 115; 3 truncates nothing and fetches; 1 comes back and truncates to 115.
#[test]
fn leader_change_with_followers_at_different_offsets() {
    let two_cache = {
        let mut c = cache(&[(5, 0)]);
        c.assign(6, 115);
        c
    };
    let mut two = Leader::new(LeaderInit {
        me: 2,
        leader_epoch: 6,
        partition_epoch: 12,
        replicas: vec![1, 2, 3],
        isr: vec![2, 3],
        epoch_start_offset: 115,
        durable_log_end: 115,
        high_watermark: 100,
        now_ms: 0,
        replica_lag_time_max_ms: LAG_MS,
    });
    // Follower 3 (epoch 5, log end 105) truncates nothing.
    let (e, o) = two_cache.end_offset_for(5, 115);
    assert_eq!((e, o), (5, 115));
    let t3 = truncation_offset(&cache(&[(5, 0)]), 105, 100, e, o);
    assert_eq!(t3.offset, 105);
    // Its fetch from 105 moves the hw to 105 (min of 2's 115 and 3's 105) ...
    assert_eq!(
        two.on_follower_fetch(3, 6, 105, 1).unwrap().high_watermark,
        105
    );
    // ... and the hw reaches 115 only once 3 has it.
    two.on_follower_fetch(3, 6, 115, 2).unwrap();
    assert_eq!(two.high_watermark(), 115);
    // Old leader 1 comes back with 0..120 in epoch 5: truncated to 115.
    let t1 = truncation_offset(&cache(&[(5, 0)]), 120, 100, e, o);
    assert_eq!(
        t1,
        Truncation {
            offset: 115,
            complete: true
        }
    );
    // It rejoins only past the epoch start and hw.
    let alter = two
        .on_follower_fetch(1, 6, 115, 3)
        .unwrap()
        .alter_isr
        .unwrap();
    assert_eq!(alter.new_isr, vec![2, 3, 1]);
}

impl Leader {
    /// This leader's starting parameters, for tests that tweak one field.
    fn init_for_test(&self) -> LeaderInit {
        LeaderInit {
            me: self.me,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            replicas: self.replicas.clone(),
            isr: self.isr.clone(),
            epoch_start_offset: self.epoch_start_offset,
            durable_log_end: self.durable_log_end,
            high_watermark: self.high_watermark,
            now_ms: 0,
            replica_lag_time_max_ms: self.replica_lag_time_max_ms,
        }
    }
}

// --- replica state ----------------------------------------------------------------------

fn assignment(leader: BrokerId, leader_epoch: LeaderEpoch) -> crate::cluster::PartitionState {
    crate::cluster::PartitionState {
        replicas: vec![1, 2, 3],
        isr: vec![1, 2, 3],
        leader,
        leader_epoch,
        partition_epoch: leader_epoch,
        slots: Vec::new(),
    }
}

/// Broker 2's replica of a log ending at 10 (epoch 1 from 0, epoch 2 from 6), following
/// broker 1 in epoch 3.
fn following() -> ReplicaState {
    let mut s = ReplicaState::new(cache(&[(1, 0), (2, 6)]), 10, 4);
    let r = s.reconcile(2, &assignment(1, 3), 10, 0, LAG_MS);
    assert_eq!(r.follow, Some((1, true)));
    s
}

#[test]
fn a_new_replica_clamps_its_history_and_high_watermark_to_the_log() {
    let s = ReplicaState::new(cache(&[(1, 0), (2, 6), (3, 12)]), 10, 50);
    assert_eq!(s.epochs().latest_epoch(), 2);
    assert_eq!(s.durable(), 10);
    assert_eq!(s.high_watermark(), 10);
    assert!(matches!(s.role(), Role::Offline));
}

#[test]
fn becoming_leader_assigns_the_epoch_at_the_log_end() {
    let mut s = ReplicaState::new(cache(&[(1, 0)]), 10, 4);
    let r = s.reconcile(1, &assignment(1, 2), 10, 0, LAG_MS);
    assert!(r.epochs_changed && r.changed && r.follow.is_none());
    assert_eq!(s.leader_epoch(), Some(2));
    assert_eq!(s.epochs().entries().last().unwrap().start_offset, 10);
    assert_eq!(s.high_watermark(), 4);
    // Same epoch again: metadata only, no new leader.
    let r = s.reconcile(1, &assignment(1, 2), 10, 0, LAG_MS);
    assert!(!r.epochs_changed);
    assert_eq!(s.epoch_end(2, 1, 10), Ok((1, 10)));
    // KIP-320 against the latest metadata.
    assert!(matches!(
        s.epoch_end(1, 1, 10),
        Err(ReplicaError::Fetch(FetchError::FencedLeaderEpoch { .. }))
    ));
}

#[test]
fn a_follower_truncates_and_cuts_durable_hw_and_history_when_it_begins() {
    let mut s = following();
    assert_eq!(s.epoch_request(), Some((3, 2)));
    // The leader's epoch 1 ended at 5: everything from 5 goes.
    let op = s.begin_truncation(3, 10, 1, 5).unwrap().expect("a cut");
    assert_eq!(op.kind, LogOpKind::Truncate { to: 5 });
    assert_eq!(s.durable(), 5);
    assert_eq!(s.high_watermark(), 4);
    assert_eq!(s.epochs().latest_epoch(), 1);
    // Another operation while this one runs is refused.
    assert!(matches!(
        s.begin_append(3, 5, 5),
        Err(ReplicaError::Busy(_))
    ));
    let ended = s.end_op(op, Some(5), 5, 0).unwrap();
    assert_eq!(ended.leading, None);
    assert_eq!(s.follower().unwrap().phase(), FollowerPhase::Fetching);
    assert_eq!(s.op_in_flight(), None);
}

#[test]
fn nothing_to_cut_needs_no_operation() {
    let mut s = following();
    assert_eq!(s.begin_truncation(3, 10, 2, 10).unwrap(), None);
    assert_eq!(s.follower().unwrap().phase(), FollowerPhase::Fetching);
    assert_eq!(s.durable(), 10);
}

#[test]
fn truncation_is_refused_for_stale_epochs_wrong_phases_and_moved_logs() {
    let mut s = following();
    assert_eq!(
        s.begin_truncation(2, 10, 2, 10),
        Err(ReplicaError::NotFollowing { epoch: 2 })
    );
    assert!(matches!(
        s.begin_truncation(3, 9, 2, 10),
        Err(ReplicaError::LogMoved { .. })
    ));
    assert_eq!(s.begin_truncation(3, 10, 2, 10).unwrap(), None);
    assert!(matches!(
        s.begin_truncation(3, 10, 2, 10),
        Err(ReplicaError::WrongPhase { .. })
    ));
}

#[test]
fn a_failed_truncation_truncates_again() {
    let mut s = following();
    let op = s.begin_truncation(3, 10, 1, 5).unwrap().unwrap();
    s.end_op(op, None, 10, 0).unwrap();
    assert_eq!(s.follower().unwrap().phase(), FollowerPhase::Truncating);
    assert_eq!(s.durable(), 5);
}

/// The race that once aborted a broker: elected leader while the fetcher truncates.
/// The leadership waits for the truncation and starts at the log end it left.
#[test]
fn leadership_adopted_during_a_truncation_takes_effect_when_it_ends() {
    let mut s = following();
    let op = s.begin_truncation(3, 10, 1, 5).unwrap().unwrap();
    // Metadata: this replica leads in epoch 4. The log is still at 10 (the I/O runs).
    let r = s.reconcile(2, &assignment(2, 4), 10, 0, LAG_MS);
    assert!(r.changed && !r.epochs_changed && r.follow.is_none());
    assert_eq!(s.leader_epoch(), None);
    assert_eq!(s.pending_leader_epoch(), Some(4));
    assert!(!s.follows_in(3));
    // The fetcher's stale work is refused.
    assert!(s.fetched_high_watermark(3, 9).is_err());
    let ended = s.end_op(op, Some(5), 5, 0).unwrap();
    assert_eq!(ended.leading, Some(4));
    assert!(ended.epochs_changed);
    let l = s.leader().unwrap();
    assert_eq!(l.epoch_start_offset(), 5);
    assert_eq!(l.durable_log_end(), 5);
    assert_eq!(
        s.epochs().entries().last(),
        Some(&EpochEntry {
            epoch: 4,
            start_offset: 5
        })
    );
    assert!(s.high_watermark() <= 5);
}

#[test]
fn a_pending_leadership_is_dropped_when_metadata_moves_on() {
    let mut s = following();
    let op = s.begin_truncation(3, 10, 1, 5).unwrap().unwrap();
    s.reconcile(2, &assignment(2, 4), 10, 0, LAG_MS);
    let r = s.reconcile(2, &assignment(3, 5), 10, 0, LAG_MS);
    assert_eq!(r.follow, Some((3, true)));
    assert_eq!(s.pending_leader_epoch(), None);
    // The new follower cannot truncate before the old operation ends.
    assert!(matches!(
        s.begin_truncation(5, 10, 1, 5),
        Err(ReplicaError::Busy(_))
    ));
    let ended = s.end_op(op, Some(5), 5, 0).unwrap();
    assert_eq!(ended.leading, None);
    assert!(s.follows_in(5));
}

#[test]
fn an_append_counts_its_flushed_end_once_the_log_is_there() {
    let mut s = following();
    assert_eq!(s.begin_truncation(3, 10, 2, 10).unwrap(), None);
    // The fetch asked from 10 but the log moved (a deposed leader's late write).
    assert!(matches!(
        s.begin_append(3, 10, 11),
        Err(ReplicaError::LogMoved { .. })
    ));
    let op = s.begin_append(3, 10, 10).unwrap();
    assert_eq!(s.fetched_batch(&op, 3, 10), Ok(true));
    assert_eq!(s.fetched_batch(&op, 3, 12), Ok(false));
    s.end_op(op, Some(15), 15, 0).unwrap();
    assert_eq!(s.durable(), 15);
    assert_eq!(s.fetched_high_watermark(3, 20), Ok(15));
    // An end the log is not at does not count.
    let op = s.begin_append(3, 15, 15).unwrap();
    let ended = s.end_op(op, Some(20), 18, 0).unwrap();
    assert!(!ended.durable_moved);
    assert_eq!(s.durable(), 15);
}

#[test]
fn a_finished_operation_cannot_be_used_again() {
    let mut s = following();
    assert_eq!(s.begin_truncation(3, 10, 2, 10).unwrap(), None);
    let op = s.begin_append(3, 10, 10).unwrap();
    let stale = LogOp {
        id: op.id,
        epoch: op.epoch,
        kind: op.kind,
    };
    s.end_op(op, None, 10, 0).unwrap();
    assert_eq!(
        s.end_op(stale, None, 10, 0),
        Err(ReplicaError::NotCurrentOp(1))
    );
}

#[test]
fn a_follower_behind_the_leaders_start_resets_there() {
    let mut s = following();
    assert_eq!(s.begin_truncation(3, 10, 2, 10).unwrap(), None);
    assert!(matches!(
        s.begin_reset(3, 8, 10),
        Err(ReplicaError::ResetBackwards { .. })
    ));
    let op = s.begin_reset(3, 40, 10).unwrap();
    let ended = s.end_op(op, Some(40), 40, 0).unwrap();
    assert!(ended.durable_moved && ended.epochs_changed);
    assert_eq!(s.durable(), 40);
    // The log is empty: its epochs begin with the first batch fetched.
    assert_eq!(s.epochs().entries(), &[]);
    // A failed reset truncates again.
    let op = s.begin_reset(3, 50, 40).unwrap();
    s.end_op(op, None, 40, 0).unwrap();
    assert_eq!(s.follower().unwrap().phase(), FollowerPhase::Truncating);
    assert_eq!(s.durable(), 40);
}

#[test]
fn a_deposed_leaders_flush_never_counts() {
    let mut s = ReplicaState::new(LeaderEpochCache::new(), 0, 0);
    s.reconcile(1, &assignment(1, 1), 0, 0, LAG_MS);
    assert_eq!(s.leader_flushed(1, 5, 5), Ok(true));
    assert_eq!(s.leader_flushed(1, 5, 5), Ok(false));
    assert_eq!(
        s.leader_flushed(0, 6, 6),
        Err(ReplicaError::NotLeader { epoch: 0 })
    );
    s.reconcile(1, &assignment(2, 2), 5, 0, LAG_MS);
    assert_eq!(
        s.leader_flushed(1, 6, 6),
        Err(ReplicaError::NotLeader { epoch: 1 })
    );
    assert_eq!(s.durable(), 5);
    // Leaving the ISR's replicas: offline, the high watermark kept.
    let mut gone = assignment(2, 3);
    gone.replicas = vec![2, 3];
    gone.isr = vec![2, 3];
    s.reconcile(1, &gone, 5, 0, LAG_MS);
    assert!(matches!(s.role(), Role::Offline));
}

/// Broker 1, which led epoch 1 with offsets 0..5 durable and its log written up to
/// `log_end`, following broker 2 in epoch 2.
fn deposed_with_unsynced_tail(log_end: Offset) -> ReplicaState {
    let mut s = ReplicaState::new(LeaderEpochCache::new(), 0, 0);
    s.reconcile(1, &assignment(1, 1), 0, 0, LAG_MS);
    assert_eq!(s.leader_flushed(1, 5, 5), Ok(true));
    s.reconcile(1, &assignment(2, 2), log_end, 0, LAG_MS);
    s
}

#[test]
fn a_cut_that_leaves_an_unsynced_tail_keeps_it_for_the_sync() {
    // Broker 1 led epoch 1: 0..5 durable, 5..9 written; broker 2, leading epoch 2,
    // holds epoch 1 up to 7.
    let mut s = deposed_with_unsynced_tail(9);
    let op = s.begin_truncation(2, 9, 1, 7).unwrap().expect("a cut");
    assert_eq!(op.kind, LogOpKind::Truncate { to: 7 });
    s.end_op(op, Some(7), 7, 0).unwrap();
    assert_eq!(s.follower().unwrap().phase(), FollowerPhase::Fetching);
    assert_eq!(s.durable(), 5);
    // The cut end was checked against the leader: synced at once, no second round.
    let op = s.begin_tail_sync(2, 7).unwrap().expect("the kept tail");
    s.end_op(op, Some(7), 7, 0).unwrap();
    assert_eq!(s.durable(), 7);
}

#[test]
fn an_incomplete_truncation_with_nothing_to_cut_asks_about_an_older_epoch_next() {
    // Broker 1 holds epoch 1 from 0 to 8; it led epoch 3 from 8 without writing, and
    // now follows broker 2 in epoch 4, whose log has epoch 2 (never seen here) to 12.
    let mut s = ReplicaState::new(cache(&[(1, 0)]), 8, 0);
    s.reconcile(1, &assignment(1, 3), 8, 0, LAG_MS);
    s.reconcile(1, &assignment(2, 4), 8, 0, LAG_MS);
    assert_eq!(s.epoch_request(), Some((4, 3)));
    assert_eq!(s.begin_truncation(4, 8, 2, 12), Ok(None));
    assert_eq!(
        s.follower().unwrap().phase(),
        FollowerPhase::Truncating,
        "KIP-279: another round"
    );
    assert_eq!(
        s.epoch_request(),
        Some((4, 1)),
        "about the epoch its log holds, not the same question again"
    );
    assert_eq!(s.begin_truncation(4, 8, 1, 8), Ok(None));
    assert_eq!(s.follower().unwrap().phase(), FollowerPhase::Fetching);
}

#[test]
fn a_tail_the_truncation_keeps_is_synced_before_the_follower_fetches() {
    // Broker 1 leads epoch 1 and makes offsets 0..5 durable; its appends of 5..7 are
    // written, and the followers fetched them, when broker 2 takes over in epoch 2:
    // their sync no longer counts.
    let mut s = deposed_with_unsynced_tail(7);
    assert_eq!(
        s.leader_flushed(1, 7, 7),
        Err(ReplicaError::NotLeader { epoch: 1 })
    );
    assert_eq!(s.durable(), 5);
    // The new leader holds epoch 1 up to 7 as well: nothing to cut.
    let (epoch, latest) = s.epoch_request().expect("truncating");
    assert_eq!((epoch, latest), (2, 1));
    assert_eq!(s.begin_truncation(2, 7, 1, 7), Ok(None));
    assert_eq!(s.follower().unwrap().phase(), FollowerPhase::Fetching);
    // A fetch asks from the durable end, where the log does not end: no append can
    // begin there (the fetcher would truncate again, and again).
    assert_eq!(
        s.begin_append(2, 5, 7),
        Err(ReplicaError::LogMoved {
            log_end: 7,
            expected: 5
        })
    );
    // A tail that grew after the truncation kept it (a deposed leader's produce that
    // passed its epoch check before the demotion) was not checked: no sync of it.
    assert_eq!(
        s.begin_tail_sync(2, 8),
        Err(ReplicaError::LogMoved {
            log_end: 8,
            expected: 7
        })
    );
    // The kept tail is synced first, as one log operation.
    let op = s.begin_tail_sync(2, 7).unwrap().expect("a tail to sync");
    assert_eq!(op.kind, LogOpKind::Sync { from: 5 });
    assert!(matches!(
        s.begin_truncation(2, 7, 1, 7),
        Err(ReplicaError::Busy(_))
    ));
    let ended = s.end_op(op, Some(7), 7, 0).unwrap();
    assert!(ended.durable_moved);
    assert_eq!(s.durable(), 7);
    assert_eq!(s.begin_tail_sync(2, 7), Ok(None), "nothing left to sync");
    let op = s.begin_append(2, 7, 7).expect("fetching from the log end");
    s.end_op(op, None, 7, 0).unwrap();
    // A sync that did not finish counts nothing, and the tail must be checked again
    // before the next; one of a log that moved meanwhile (cut, say) counts nothing.
    s.reconcile(1, &assignment(3, 3), 9, 0, LAG_MS);
    assert_eq!(s.begin_truncation(3, 9, 1, 9), Ok(None));
    let op = s.begin_tail_sync(3, 9).unwrap().unwrap();
    s.end_op(op, None, 9, 0).unwrap();
    assert_eq!(s.durable(), 7);
    assert!(matches!(
        s.begin_tail_sync(3, 9),
        Err(ReplicaError::LogMoved { .. })
    ));
    s.restart_truncation(3);
    assert_eq!(s.begin_truncation(3, 9, 1, 9), Ok(None));
    let op = s.begin_tail_sync(3, 9).unwrap().unwrap();
    s.end_op(op, Some(9), 8, 0).unwrap();
    assert_eq!(s.durable(), 7);
    assert_eq!(
        s.begin_tail_sync(2, 9),
        Err(ReplicaError::NotFollowing { epoch: 2 })
    );
}

#[test]
fn an_epoch_led_without_writing_is_forgotten_when_nothing_is_cut() {
    // This replica led epoch 4 from its log end (10) and wrote nothing; the leader of
    // epoch 5 never had epoch 4, and wrote epoch-2 records from 10 on.
    let mut s = ReplicaState::new(cache(&[(1, 0), (2, 6), (4, 10)]), 10, 4);
    let r = s.reconcile(2, &assignment(1, 5), 10, 0, LAG_MS);
    assert_eq!(r.follow, Some((1, true)));
    // The leader names an older epoch than the one asked about: nothing to cut, and
    // epoch 4 (no record) is forgotten, so the leader's records from 10 on count as
    // epoch 2 here too, as the leader's history has them (tiered storage compares the
    // two to tell whether a replica holds the same records).
    assert_eq!(s.begin_truncation(5, 10, 2, 30).unwrap(), None);
    assert_eq!(s.epochs().entries(), cache(&[(1, 0), (2, 6)]).entries());
    let op = s.begin_append(5, 10, 10).unwrap();
    assert!(!s.fetched_batch(&op, 2, 10).unwrap());
    assert_eq!(s.epochs().epoch_for(10), 2);
}
