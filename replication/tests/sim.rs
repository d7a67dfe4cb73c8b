//! Simulation tier: the replication state machines under the cluster controller, driven
//! by seeded faults (see `sluice_replication::sim`). `make sim` runs thousands of seeds;
//! this runs a few so that `make test` covers it, and proves the invariants have teeth.

use sluice_replication::sim::{self, Config, Knobs, Stats};

fn run_seeds(cfg: &Config, seeds: std::ops::Range<u64>) -> Result<Stats, sim::Violation> {
    let mut total = Stats::default();
    for seed in seeds {
        total.add(&sim::run(seed, cfg, &mut String::new())?);
    }
    Ok(total)
}

/// Fifty seeds of the default cluster (3 brokers, 2 partitions) hold every invariant,
/// and the faults really happened.
#[test]
fn fifty_seeds_hold_every_invariant() {
    let total = run_seeds(&Config::default(), 1..51).unwrap_or_else(|v| panic!("{v}"));
    assert!(total.acked > 1_000, "{total:?}");
    assert!(total.leader_changes > 50, "{total:?}");
    assert!(total.crashes > 20 && total.isolations > 10, "{total:?}");
    assert!(total.log_failures > 10, "{total:?}");
    assert!(
        total.truncated_records > 0 && total.isr_changes > 100,
        "{total:?}"
    );
    assert!(total.tail_syncs > 0, "{total:?}");
}

/// And with a fetching follower that never syncs a tail its truncation kept (a
/// deposed leader's last appends, which its successor holds too; an append cut short
/// by a role change), the follower's fetches from its durable end find its log ending
/// elsewhere, for ever: some seed does not converge.
#[test]
fn a_follower_that_never_syncs_its_kept_tail_is_caught() {
    let cfg = Config {
        knobs: Knobs {
            no_tail_sync: true,
            ..Knobs::default()
        },
        ..Config::default()
    };
    let v = run_seeds(&cfg, 1..51).expect_err("an unsynced kept tail must stall a follower");
    assert!(v.what.contains("did not converge"), "{v}");
}

/// Five brokers, four partitions (RF 3 placed over 5).
#[test]
fn five_brokers_hold_every_invariant() {
    let cfg = Config {
        brokers: 5,
        partitions: 4,
        ..Config::default()
    };
    let total = run_seeds(&cfg, 1..11).unwrap_or_else(|v| panic!("{v}"));
    assert!(
        total.alter_batches > 0,
        "some ISR changes reached the controller as a batch: {total:?}"
    );
}

/// A seed replays exactly: same stats, same trace.
#[test]
fn a_seed_replays() {
    let cfg = Config {
        trace: true,
        ..Config::default()
    };
    let (mut t1, mut t2) = (String::new(), String::new());
    let a = sim::run(7, &cfg, &mut t1).unwrap();
    let b = sim::run(7, &cfg, &mut t2).unwrap();
    assert_eq!(a, b);
    assert_eq!(t1, t2);
    assert!(
        t1.contains("crash b") || t1.contains("isolate b"),
        "faults are traced"
    );
}

/// The invariants have teeth: with the high watermark computed over the committed ISR
/// only (no KIP-497 maximal ISR), some seed loses or misplaces an acknowledged record.
#[test]
fn breaking_kip497_is_caught() {
    let cfg = Config {
        knobs: Knobs {
            ignore_pending_isr: true,
            ..Knobs::default()
        },
        ..Config::default()
    };
    let v = run_seeds(&cfg, 1..51).expect_err("KIP-497 off must break an invariant");
    assert!(v.what.contains("acked"), "{v}");
}

/// And with followers skipping truncation (no KIP-101), logs diverge.
#[test]
fn skipping_truncation_is_caught() {
    let cfg = Config {
        knobs: Knobs {
            skip_truncation: true,
            ..Knobs::default()
        },
        ..Config::default()
    };
    run_seeds(&cfg, 1..51).expect_err("no truncation must break an invariant");
    // Count the seeds that break a safety invariant (not just convergence).
    let unsafe_seeds = (1..21)
        .filter_map(|s| sim::run(s, &cfg, &mut String::new()).err())
        .filter(|v| !v.what.contains("converge"))
        .count();
    assert!(
        unsafe_seeds >= 5,
        "only {unsafe_seeds} of 20 seeds broke safety"
    );
}

/// And with followers reporting records they have not fsynced, a crash loses an
/// acknowledged record from an ISR member.
#[test]
fn fetching_unsynced_records_is_caught() {
    let cfg = Config {
        knobs: Knobs {
            fetch_unsynced: true,
            ..Knobs::default()
        },
        ..Config::default()
    };
    let v = run_seeds(&cfg, 1..51).expect_err("unsynced fetch offsets must break an invariant");
    assert!(v.what.contains("acked"), "{v}");
}

/// And with a leader whose log failed reopening at once in the leader epoch it had
/// (followers may hold batches of that epoch its recovered log lost), some seed
/// acknowledges a record the followers hold differently, or logs diverge.
#[test]
fn reopening_a_failed_leader_in_its_epoch_is_caught() {
    let cfg = Config {
        knobs: Knobs {
            reopen_in_same_epoch: true,
            ..Knobs::default()
        },
        ..Config::default()
    };
    run_seeds(&cfg, 1..501).expect_err("reopening in the same epoch must break an invariant");
}

/// And with a leader's appends not fenced where they take their offsets, a deposed
/// leader's late append (a produce that passed its epoch check before the demotion)
/// lands stamped with its old epoch after records of the newer one, where the
/// truncation by epochs cannot see it: some seed ends with replicas that disagree
/// below their high watermarks.
#[test]
fn unfenced_leader_appends_are_caught() {
    let cfg = Config {
        knobs: Knobs {
            unfenced_leader_appends: true,
            ..Knobs::default()
        },
        ..Config::default()
    };
    let v = run_seeds(&cfg, 1..51).expect_err("late appends must break an invariant");
    assert!(
        v.what.contains("below hw") || v.what.contains("acked"),
        "{v}"
    );
}
