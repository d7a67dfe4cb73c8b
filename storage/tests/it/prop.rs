//! Property tier: random appends, flushes and rolls, then a "crash" that damages the
//! unflushed tail of the active segment and/or its indexes at random. After reopening,
//! the log must be exactly a prefix of what was appended and hold everything that had
//! been flushed.

use crate::common::*;
use proptest::prelude::*;
use sluice_storage::batch::{build, OFF_ATTRIBUTES};
use sluice_storage::LogConfig;

#[derive(Debug, Clone)]
enum Op {
    Append { records: usize, value_bytes: usize },
    Flush,
    Roll,
}

#[derive(Debug, Clone)]
enum Damage {
    None,
    Truncate(f64),
    Garble { at: f64, len: usize, byte: u8 },
    ZeroFrom(f64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1usize..6, 0usize..400).prop_map(|(records, value_bytes)| Op::Append { records, value_bytes }),
        2 => Just(Op::Flush),
        1 => Just(Op::Roll),
    ]
}

/// What a crash can do to an index file: lose its tail (cut or zero pages). Garbage in
/// the middle of an index is bit rot, not a crash, and is not recovered from.
fn index_damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        Just(Damage::None),
        (0.0f64..1.0).prop_map(Damage::Truncate),
        (0.0f64..1.0).prop_map(Damage::ZeroFrom),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        Just(Damage::None),
        (0.0f64..1.0).prop_map(Damage::Truncate),
        (0.0f64..1.0, 1usize..64, any::<u8>()).prop_map(|(at, len, byte)| Damage::Garble {
            at,
            len,
            byte
        }),
    ]
}

fn apply(path: &std::path::Path, from: u64, d: &Damage) {
    let Ok(mut data) = std::fs::read(path) else {
        return;
    };
    let len = data.len() as u64;
    if from >= len {
        return;
    }
    let span = (len - from) as f64;
    match d {
        Damage::None => {}
        Damage::Truncate(f) => {
            data.truncate((from + (span * f) as u64) as usize);
        }
        Damage::ZeroFrom(f) => {
            let start = (from + (span * f) as u64) as usize;
            data[start..].fill(0);
        }
        Damage::Garble { at, len: n, byte } => {
            let start = (from + (span * at) as u64) as usize;
            let end = (start + n).min(data.len());
            for b in &mut data[start..end] {
                *b ^= byte | 1;
            }
        }
    }
    std::fs::write(path, data).unwrap();
}

fn check(ops: Vec<Op>, log_damage: Damage, index_damage: Damage, time_damage: Damage) {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let config = LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 128,
        ..LogConfig::default()
    };
    // Phase 1: build the log, then drop it without closing.
    let (expected, flushed, active_base, durable_len) = {
        let dir = dir.clone();
        let config = config.clone();
        run(move || async move {
            let s = storage(&dir, no_cache()).await;
            let log = s.open_log("p", config).await.unwrap();
            let mut expected: Vec<(i64, Vec<u8>)> = Vec::new();
            let mut flushed = 0usize;
            let mut durable: (i64, u64) = (0, 0);
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Append {
                        records,
                        value_bytes,
                    } => {
                        let b = build::simple(1_000 + i as i64, records, value_bytes);
                        let info = log.append(&b, 0).await.unwrap();
                        expected.push((info.base_offset, b[OFF_ATTRIBUTES..].to_vec()));
                    }
                    Op::Flush => {
                        log.flush().await.unwrap();
                        flushed = expected.len();
                        durable = log.active_segment();
                    }
                    Op::Roll => log.roll().await.unwrap(),
                }
            }
            let (base, _) = log.active_segment();
            // Closed segments were sealed (synced) at roll: only the active one's tail
            // beyond the last flush is undurable.
            let durable_len = if base == durable.0 { durable.1 } else { 0 };
            (expected, flushed, base, durable_len)
        })
    };
    // The crash: damage what was not durable, and the rebuildable indexes anywhere.
    apply(
        &dir.join("p").join(format!("{active_base:020}.log")),
        durable_len,
        &log_damage,
    );
    apply(
        &dir.join("p").join(format!("{active_base:020}.index")),
        0,
        &index_damage,
    );
    apply(
        &dir.join("p").join(format!("{active_base:020}.timeindex")),
        0,
        &time_damage,
    );
    // Phase 2: reopen and compare.
    let got = run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log("p", config).await.unwrap();
        read_all(&log).await
    });
    assert!(
        got.len() <= expected.len(),
        "log grew: {} > {}",
        got.len(),
        expected.len()
    );
    assert_eq!(
        got[..],
        expected[..got.len()],
        "recovered log is not a prefix of what was appended"
    );
    assert!(
        got.len() >= flushed,
        "lost flushed batches: kept {} of {flushed}",
        got.len()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: proptest_cases(40), ..ProptestConfig::default() })]

    #[test]
    fn recovered_log_is_a_prefix_holding_everything_flushed(
        ops in prop::collection::vec(op(), 1..60),
        log_damage in damage(),
        index_damage in index_damage(),
        time_damage in index_damage(),
    ) {
        check(ops, log_damage, index_damage, time_damage);
    }
}
