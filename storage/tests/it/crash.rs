//! Crash tier over the simulated disk (`sluice_storage::simdisk`): unsynced writes are
//! volatile and a crash drops them or tears them at sector granularity, which a
//! SIGKILL of a real process cannot show (the page cache survives it).
//!
//! - acknowledged appends (flush policy `always`) survive any such crash, with segment
//!   logs written through (`O_DSYNC`, no fdatasync) or synced by fdatasync;
//! - concurrent acknowledgements share fdatasyncs (group commit, counted), and
//!   write-through logs acknowledge with none;
//! - the interval policy acknowledges without syncing, and its background flush makes
//!   the data durable;
//! - a property test runs random appends (plain, idempotent and transactional),
//!   end-transaction markers, flushes, rolls, truncations, resets, DeleteRecords,
//!   retention and compaction, crashes at a random point (also in the middle of an
//!   operation), recovers, and checks the log against a model, and the producer state
//!   recovery rebuilt (from a snapshot and the log after it) against a replay of the
//!   whole surviving log.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use crate::common::*;
use proptest::prelude::*;
use sluice_storage::batch::build;
use sluice_storage::producer::{BatchMeta, ProducerStateTable};
use sluice_storage::simdisk::{self, CrashMode};
use sluice_storage::{compact, FlushPolicy, Judged, LogConfig, PartitionLog, StorageLimits};

/// Storage limits without a tail cache whose segment logs are written through
/// (`O_DSYNC`: a completed write is durable) or, if not, synced by fdatasync.
fn limits(write_through: bool) -> StorageLimits {
    StorageLimits {
        dsync_logs_max: if write_through {
            sluice_storage::file::DEFAULT_DSYNC_LOGS_MAX
        } else {
            0
        },
        ..no_cache()
    }
}

/// Storage limits without a tail cache whose appends are made durable by the shard
/// journal (`sluice_storage::wal`), in chunks this small so that crashes land around
/// chunk rolls and checkpoints too; batches over 600 bytes bypass it (synced in their
/// segment file), so a log mixes both kinds of append.
fn journal_limits() -> StorageLimits {
    StorageLimits {
        journal_chunk_bytes: 8 << 10,
        journal_batch_max: 600,
        ..limits(false)
    }
}

/// The three ways an acknowledged append is made durable, by seed: its segment file
/// written through, its segment file synced, or the shard journal.
fn limits_by_seed(seed: u64) -> StorageLimits {
    match seed % 3 {
        0 => limits(true),
        1 => limits(false),
        _ => journal_limits(),
    }
}

/// A record's identity: its offset and its bytes (which compaction keeps verbatim).
type Rec = (i64, Vec<u8>);

/// The records of concatenated batches, with absolute offsets (markers have none).
fn records_of(buf: &[u8]) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut rest = buf;
    while let Some(total) = sluice_storage::batch::peek_total_bytes(rest) {
        let b = &rest[..total];
        if !sluice_storage::BatchHeader::parse(b).unwrap().is_control() {
            let (_, recs) = compact::records(b).expect("uncompressed batch");
            out.extend(recs.iter().map(|r| (r.offset, r.raw.to_vec())));
        }
        rest = &rest[total..];
    }
    assert!(rest.is_empty(), "trailing bytes after batches");
    out
}

/// The records of a batch built with base offset 0, placed at `base`.
fn records_at(batch: &[u8], base: i64) -> Vec<Rec> {
    records_of(batch)
        .into_iter()
        .map(|(o, raw)| (o + base, raw))
        .collect()
}

async fn read_records(log: &PartitionLog) -> Vec<Rec> {
    try_read_records(log).await.expect("read")
}

/// [`read_records`], failing if a read fails: inside an op the plug may be pulled
/// before the read, and a crashed process reads nothing.
async fn try_read_records(log: &PartitionLog) -> Result<Vec<Rec>, sluice_storage::Error> {
    // Reads return whole batches: records below the offset asked for (below the log
    // start, after DeleteRecords inside a batch) are not the log's any more.
    let chunks = try_read_chunks(log).await?;
    Ok(chunks
        .iter()
        .flat_map(|(asked, b)| records_of(b).into_iter().filter(move |(o, _)| o >= asked))
        .collect())
}

fn keyed_batch(tag: u64, records: usize, value_bytes: usize) -> Vec<u8> {
    let keys: Vec<Vec<u8>> = (0..records)
        .map(|i| format!("k{}", (tag as usize + i) % 5).into_bytes())
        .collect();
    let values: Vec<Vec<u8>> = (0..records)
        .map(|i| {
            let mut v = format!("v{tag}-{i}-").into_bytes();
            v.resize(v.len() + value_bytes, b'x');
            v
        })
        .collect();
    let recs: Vec<(Option<&[u8]>, &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (Some(&k[..]), &v[..]))
        .collect();
    build::batch(1_000 + tag as i64, &recs)
}

fn records_of_producer(i: u64) -> usize {
    1 + (i % 3) as usize
}

/// Appends from many concurrent producers, each acknowledged as the broker does
/// (append, then `flush_for_ack`), crashes after `acks_before_crash` acknowledgements
/// and returns (acknowledged records, every record an append was given offsets for).
async fn produce_then_crash(
    log: Rc<PartitionLog>,
    producers: u64,
    acks_before_crash: usize,
    mode: CrashMode,
) -> (Vec<Rec>, Vec<Rec>) {
    let acked: Rc<RefCell<Vec<Rec>>> = Rc::default();
    let appended: Rc<RefCell<Vec<Rec>>> = Rc::default();
    let mut tasks = Vec::new();
    for i in 0..producers {
        let (log, acked, appended) = (log.clone(), acked.clone(), appended.clone());
        tasks.push(glommio::spawn_local(async move {
            let b = keyed_batch(i, records_of_producer(i), (i * 37 % 700) as usize);
            // Errors are expected once the crash has happened.
            let Ok(info) = log.append(&b, 0).await else {
                return;
            };
            let recs = records_at(&b, info.base_offset);
            appended.borrow_mut().extend(recs.iter().cloned());
            if log.flush_for_ack().await.is_ok() {
                acked.borrow_mut().extend(recs);
            }
        }));
    }
    // Bounded wait for the chosen number of acknowledgements, then pull the plug.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while acked.borrow().len() < acks_before_crash {
        assert!(std::time::Instant::now() < deadline, "appends stalled");
        glommio::timer::sleep(Duration::from_micros(200)).await;
    }
    simdisk::crash(mode).await;
    for t in tasks {
        t.await;
    }
    let acked = acked.borrow().clone();
    let appended = appended.borrow().clone();
    (acked, appended)
}

/// Reopens the log in `dir` (a new process: recovery) and returns its records.
fn recover(dir: std::path::PathBuf, name: &'static str, config: LogConfig) -> (i64, Vec<Rec>) {
    run(move || async move {
        let s = storage(&dir, no_cache()).await;
        let log = s.open_log(name, config).await.expect("recovery");
        (log.log_start_offset(), read_records(&log).await)
    })
}

/// Every acknowledged record is in the recovered log at its offset; what the log holds
/// is exactly the records appended, in offset order, with no gaps.
fn check_acked_survive(acked: &[Rec], appended: &[Rec], got: &[Rec]) {
    let appended: HashMap<i64, &Vec<u8>> = appended.iter().map(|(o, r)| (*o, r)).collect();
    for (i, (o, raw)) in got.iter().enumerate() {
        assert_eq!(*o, i as i64, "recovered offsets have a gap at {i}");
        assert_eq!(
            appended.get(o).copied(),
            Some(raw),
            "recovered record {o} is not what was appended there"
        );
    }
    let got: HashMap<i64, &Vec<u8>> = got.iter().map(|(o, r)| (*o, r)).collect();
    for (o, raw) in acked {
        assert_eq!(
            got.get(o).copied(),
            Some(raw),
            "acknowledged record {o} lost by the crash"
        );
    }
}

#[test]
fn acknowledged_appends_survive_crashes_that_drop_or_tear_unsynced_writes() {
    for seed in 0..12u64 {
        let d = tempdir();
        let dir = d.path().to_path_buf();
        // Small segments: crashes also land around rolls.
        let config = small_segments(16 << 10);
        // Every pairing of durability (seed % 3) and crash mode (seed % 2).
        let mode = if seed % 2 == 0 {
            CrashMode::LoseUnsynced
        } else {
            CrashMode::Torn { seed }
        };
        let (acked, appended) = {
            let (dir, config) = (dir.clone(), config.clone());
            run(move || async move {
                simdisk::enable();
                let s = storage(&dir, limits_by_seed(seed)).await;
                let log = s.open_log("p", config).await.unwrap();
                let acks = 10 + (seed as usize * 23) % 120;
                produce_then_crash(log, 160, acks, mode).await
            })
        };
        assert!(!acked.is_empty());
        let (_, got) = recover(dir, "p", config);
        check_acked_survive(&acked, &appended, &got);
    }
}

/// 64 concurrent producers with 1-3 records each into log `name`, a crash once every
/// record is acknowledged, and recovery: what was acknowledged and appended, the
/// fdatasyncs made, and what recovery read back.
fn all_acked_then_crash(
    dir: &std::path::Path,
    name: &'static str,
    write_through: bool,
) -> (Vec<Rec>, Vec<Rec>, u64, Vec<Rec>) {
    let d = dir.to_path_buf();
    let (acked, appended, syncs) = run(move || async move {
        simdisk::enable();
        let s = storage(&d, limits(write_through)).await;
        let log = s.open_log(name, LogConfig::default()).await.unwrap();
        let before = simdisk::syncs();
        let all = (0..64).map(records_of_producer).sum();
        let (acked, appended) = produce_then_crash(log, 64, all, CrashMode::LoseUnsynced).await;
        (acked, appended, simdisk::syncs() - before)
    });
    let (_, got) = recover(dir.to_path_buf(), name, LogConfig::default());
    (acked, appended, syncs, got)
}

#[test]
fn group_commit_shares_fdatasyncs_across_concurrent_acks() {
    let d = tempdir();
    let (acked, appended, syncs, got) = all_acked_then_crash(d.path(), "gc", false);
    // 64 producers with 1-3 records each: every record acknowledged...
    assert_eq!(acked.len(), appended.len());
    assert!(syncs >= 1);
    // ...with far fewer syncs than acknowledgements (one sync covers every batch
    // written while the previous one was in flight).
    assert!(
        syncs <= 32,
        "{syncs} fdatasyncs for 64 concurrent acknowledgements: group commit is not sharing"
    );
    check_acked_survive(&acked, &appended, &got);
    assert_eq!(got.len(), acked.len());
}

#[test]
fn write_through_logs_acknowledge_durable_appends_without_fdatasync() {
    let d = tempdir();
    let (acked, appended, syncs, got) = all_acked_then_crash(d.path(), "wt", true);
    assert_eq!(acked.len(), appended.len());
    assert_eq!(syncs, 0, "a write-through log still synced");
    // Only the writes themselves made the acknowledged records durable.
    check_acked_survive(&acked, &appended, &got);
    assert_eq!(got.len(), acked.len());
}

#[test]
fn interval_policy_acknowledges_without_syncing_and_its_flusher_makes_data_durable() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let hour = LogConfig {
        flush: FlushPolicy::IntervalMs(3_600_000),
        ..LogConfig::default()
    };
    // An hour's interval: twenty acknowledgements, no sync, and a crash loses them.
    let syncs = {
        let (dir, hour) = (dir.clone(), hour.clone());
        run(move || async move {
            simdisk::enable();
            let s = storage(&dir, no_cache()).await;
            let log = s.open_log("iv", hour).await.unwrap();
            let before = simdisk::syncs();
            for i in 0..20 {
                log.append(&batch(1, 1, i), 0).await.unwrap();
                log.flush_for_ack().await.unwrap();
            }
            let syncs = simdisk::syncs() - before;
            simdisk::crash(CrashMode::LoseUnsynced).await;
            syncs
        })
    };
    assert_eq!(syncs, 0, "the interval policy synced per acknowledgement");
    let (_, got) = recover(dir.clone(), "iv", hour);
    assert!(
        got.is_empty(),
        "unsynced appends survived a simulated power loss"
    );

    // A 10 ms interval: the background flusher syncs them, and then they survive.
    let short = LogConfig {
        flush: FlushPolicy::IntervalMs(10),
        ..LogConfig::default()
    };
    {
        let (dir, short) = (dir.clone(), short.clone());
        run(move || async move {
            simdisk::enable();
            let s = storage(&dir, no_cache()).await;
            let log = s.open_log("iv", short).await.unwrap();
            for i in 0..20 {
                log.append(&batch(1, 1, i), 0).await.unwrap();
                log.flush_for_ack().await.unwrap();
            }
            let before = simdisk::syncs();
            s.spawn_background(3_600_000, 3_600_000, 5).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while simdisk::syncs() == before {
                assert!(std::time::Instant::now() < deadline, "no background flush");
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
            simdisk::crash(CrashMode::LoseUnsynced).await;
        })
    };
    let (_, got) = recover(dir, "iv", short);
    assert_eq!(
        got.len(),
        20,
        "the background flush did not make the appends durable"
    );
}

/// A batch of one record whose whole size is exactly `bytes`.
fn batch_of_exactly(bytes: usize) -> Vec<u8> {
    (0..bytes)
        .rev()
        .map(|v| build::batch(1, &[(None, &vec![b'x'; v][..])]))
        .find(|b| b.len() == bytes)
        .expect("some value size gives that batch size")
}

/// A killed process (SIGKILL, not a power loss) leaves the writes it completed but never
/// synced in the device's volatile cache, where the next process's recovery reads
/// them. Whatever that process then serves (and, as a replica, reports as held) must
/// survive a power loss after the restart: opening the storage syncs them first.
///
/// The log is one whose recovery cuts nothing (no preallocation, batches of whole
/// pages, so no padding either): a cut's own fdatasync would make the bytes durable
/// by itself (the simulated disk counts it), which is not the case under test.
#[test]
fn what_recovery_finds_after_a_kill_survives_a_later_power_loss() {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let limits = StorageLimits {
        preallocated_bytes_max: 0,
        ..limits(false)
    };
    // An hour's flush interval: the appends are written and acknowledged, none synced.
    let hour = LogConfig {
        flush: FlushPolicy::IntervalMs(3_600_000),
        ..LogConfig::default()
    };
    let left = {
        let (dir, hour, limits) = (dir.clone(), hour.clone(), limits.clone());
        run(move || async move {
            simdisk::enable();
            let s = storage(&dir, limits).await;
            let log = s.open_log("k", hour).await.unwrap();
            let b = batch_of_exactly(4096);
            for _ in 0..20 {
                log.append(&b, 0).await.unwrap();
                log.flush_for_ack().await.unwrap();
            }
            simdisk::kill().await
        })
    };
    assert!(
        left.unsynced_files() > 0,
        "the appends were synced before the kill: nothing here could be lost"
    );
    let (served, cut) = {
        let (dir, hour) = (dir.clone(), hour.clone());
        run(move || async move {
            simdisk::enable_after(left);
            let s = storage(&dir, limits).await;
            let (log, report) = s.open_log_with_report("k", hour).await.unwrap();
            let served = read_records(&log).await;
            simdisk::crash(CrashMode::LoseUnsynced).await;
            (served, report.truncated_bytes)
        })
    };
    assert_eq!(
        cut, 0,
        "recovery cut the log: its fdatasync, not the open, synced it"
    );
    assert_eq!(
        served.len(),
        20,
        "recovery after the kill did not find the appends"
    );
    let (_, got) = recover(dir, "k", hour);
    assert_eq!(
        got, served,
        "records recovered and served after a kill were lost by a later power loss"
    );
}

// ---- property tier ----

#[derive(Debug, Clone)]
enum Op {
    Append {
        records: usize,
        value_bytes: usize,
    },
    /// An append of producer `pid` (epoch 0, its next sequence), transactional or not.
    /// Unchecked, as a follower copies it: every replica must replay it the same way.
    ProducerAppend {
        pid: i64,
        txn: bool,
        records: usize,
        value_bytes: usize,
    },
    /// An end-transaction marker for `pid` (closing nothing if nothing is open).
    EndTxn {
        pid: i64,
        commit: bool,
    },
    Flush,
    Roll,
    /// Truncate to this fraction of the way from the log start to its end.
    Truncate(f64),
    /// Reset to this many offsets past the log end.
    ResetTo(i64),
    /// DeleteRecords before this fraction of the way from the log start to its end.
    DeleteRecords(f64),
    Retention,
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1usize..5, 0usize..500).prop_map(|(records, value_bytes)| Op::Append { records, value_bytes }),
        5 => (1i64..4, any::<bool>(), 1usize..4, 0usize..300).prop_map(|(pid, txn, records, value_bytes)| Op::ProducerAppend { pid, txn, records, value_bytes }),
        2 => (1i64..4, any::<bool>()).prop_map(|(pid, commit)| Op::EndTxn { pid, commit }),
        3 => Just(Op::Flush),
        2 => Just(Op::Roll),
        1 => (0.0f64..1.0).prop_map(Op::Truncate),
        1 => (1i64..20).prop_map(Op::ResetTo),
        1 => (0.0f64..1.0).prop_map(Op::DeleteRecords),
        1 => Just(Op::Retention),
        1 => Just(Op::Compact),
    ]
}

fn prop_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 128,
        // Only the explicit Retention op deletes; it keeps ~3 segments.
        retention_bytes: 12 << 10,
        retention_ms: -1,
        cleanup_delete: true,
        cleanup_compact: true,
        min_cleanable_dirty_ratio_bp: 0,
        min_compaction_lag_ms: 0,
        ..LogConfig::default()
    }
}

/// What the log must hold: every record appended and not removed since, by offset.
#[derive(Default, Debug, Clone)]
struct Model {
    records: BTreeMap<i64, Vec<u8>>,
    log_start: i64,
    /// Records below this offset were durable when last flushed (or sealed).
    durable_end: i64,
    /// The producer of each transactional record.
    txn_records: BTreeMap<i64, i64>,
    /// The next sequence of each producer.
    seqs: HashMap<i64, i32>,
    /// A compaction ran (it may rewrite the aborted-transaction index).
    compacted: bool,
}

/// The clock of the property test: near the batches' timestamps (1000 + tag), so
/// no producer expires when a snapshot is loaded.
const PROP_NOW_MS: i64 = 1_000_000;

impl Model {
    fn drop_below(&mut self, offset: i64) {
        self.records = self.records.split_off(&offset);
        self.log_start = self.log_start.max(offset);
    }
}

fn frac_offset(log: &PartitionLog, f: f64) -> i64 {
    let (start, end) = (log.log_start_offset(), log.log_end_offset());
    start + ((end - start) as f64 * f) as i64
}

/// Runs one op and, once it succeeded, updates the model.
async fn run_op(
    log: &Rc<PartitionLog>,
    model: &mut Model,
    i: usize,
    op: &Op,
) -> Result<(), sluice_storage::Error> {
    match op {
        Op::Append {
            records,
            value_bytes,
        } => {
            let b = keyed_batch(i as u64, *records, *value_bytes);
            let info = log.append(&b, 0).await?;
            model.records.extend(records_at(&b, info.base_offset));
        }
        Op::ProducerAppend {
            pid,
            txn,
            records,
            value_bytes,
        } => {
            let mut b = keyed_batch(i as u64, *records, *value_bytes);
            let seq = model.seqs.get(pid).copied().unwrap_or(0);
            set_producer(&mut b, *pid, 0, seq, *txn);
            let info = log.append(&b, 0).await?;
            model.seqs.insert(*pid, seq + *records as i32);
            let recs = records_at(&b, info.base_offset);
            if *txn {
                model
                    .txn_records
                    .extend(recs.iter().map(|(o, _)| (*o, *pid)));
            }
            model.records.extend(recs);
        }
        Op::EndTxn { pid, commit } => match log.append_marker(*pid, 0, *commit, 0, 0).await? {
            Judged::Appended(_) => {}
            other => panic!("marker refused: {other:?}"),
        },
        Op::Flush => {
            log.flush().await?;
            model.durable_end = log.log_end_offset();
        }
        Op::Roll => {
            log.roll().await?;
            // Rolling seals (syncs) the segment it closes.
            model.durable_end = log.log_end_offset();
        }
        Op::Truncate(f) => {
            let to = frac_offset(log, *f);
            log.truncate_to(to).await?;
            // Truncation rounds down to the start of the batch holding `to`.
            let end = log.log_end_offset();
            // (Or at the segment's base, when compaction emptied the offsets
            // between it and `to`.)
            let first_base = log.segment_bases()[0];
            assert!(
                end <= to.max(model.log_start).max(first_base),
                "truncation to {to} kept offsets up to {end} (segments {:?}, start {})",
                log.segment_bases(),
                log.log_start_offset()
            );
            let _ = model.records.split_off(&end);
            model.durable_end = model.durable_end.min(end);
        }
        Op::ResetTo(ahead) => {
            let to = log.log_end_offset() + ahead;
            log.reset_to(to).await?;
            model.drop_below(to);
            model.durable_end = to;
        }
        Op::DeleteRecords(f) => {
            let to = frac_offset(log, *f);
            let start = log.delete_records_before(to).await?;
            model.drop_below(start);
        }
        Op::Retention => {
            log.enforce_retention().await?;
            model.drop_below(log.log_start_offset());
        }
        Op::Compact => {
            // Compaction may drop a record only if a later one has the same key, or
            // if its transaction was aborted; the latest per key of the others (no
            // tombstones here) must stay.
            let aborted_index = log.aborted_index();
            let aborted = |o: &i64| {
                model.txn_records.get(o).is_some_and(|pid| {
                    aborted_index.iter().any(|t| {
                        t.producer_id == *pid && t.first_offset <= *o && *o <= t.last_offset
                    })
                })
            };
            let live: BTreeMap<i64, Vec<u8>> = model
                .records
                .iter()
                .filter(|(o, _)| !aborted(o))
                .map(|(o, r)| (*o, r.clone()))
                .collect();
            log.compact().await?;
            model.compacted = true;
            // A compaction with nothing to clean does no I/O: the crash may come
            // during this read instead, which then fails (the op is interrupted).
            // Only an I/O error may end it so: a corrupt read is a bug either way.
            let now = match try_read_records(log).await {
                Ok(now) => now,
                Err(e @ sluice_storage::Error::Io { .. }) => return Err(e),
                Err(e) => panic!("read after compaction: {e:?}"),
            };
            let now_map: BTreeMap<i64, Vec<u8>> = now.into_iter().collect();
            for o in latest_per_key(&live) {
                assert!(
                    now_map.contains_key(&o),
                    "compaction dropped the latest record of a key at {o}"
                );
            }
            for (o, raw) in &now_map {
                assert_eq!(
                    model.records.get(o),
                    Some(raw),
                    "compaction changed record {o}"
                );
            }
            model.records = now_map;
        }
    }
    Ok(())
}

/// The key of a raw record: length, attributes, timestamp delta, offset delta, key
/// length, key (Kafka's v2 record layout).
fn key_of(raw: &[u8]) -> Vec<u8> {
    use sluice_storage::batch::get_varint;
    let mut r = raw;
    get_varint(&mut r).expect("length");
    r = &r[1..]; // attributes
    get_varint(&mut r).expect("timestamp delta");
    get_varint(&mut r).expect("offset delta");
    let klen = get_varint(&mut r).expect("key length");
    r[..klen as usize].to_vec()
}

fn latest_per_key(records: &BTreeMap<i64, Vec<u8>>) -> Vec<i64> {
    let mut latest: HashMap<Vec<u8>, i64> = HashMap::new();
    for (o, raw) in records {
        latest.insert(key_of(raw), *o);
    }
    latest.into_values().collect()
}

/// `crash_at`: crash while the op at this index runs (after `delay_us` of it), or
/// after the last op when out of range.
fn check(ops: Vec<Op>, crash_at: usize, delay_us: u64, seed: u64) {
    let d = tempdir();
    let dir = d.path().to_path_buf();
    let config = prop_config();
    let (model, interrupted) = {
        let (dir, config) = (dir.clone(), config.clone());
        run(move || async move {
            simdisk::enable();
            // Every way an append is made durable: its segment written through or
            // fdatasync'ed, or the shard journal.
            let (s, _) = storage_at(&dir, limits_by_seed(seed), PROP_NOW_MS).await;
            let log = s.open_log("p", config).await.unwrap();
            let mut model = Model::default();
            let mut interrupted = None;
            for (i, op) in ops.iter().enumerate() {
                if i != crash_at {
                    run_op(&log, &mut model, i, op).await.unwrap();
                    continue;
                }
                // Run the op and pull the plug while it runs. An op that still
                // succeeded finished before the crash, and counts as done.
                let (l, o, mut m) = (log.clone(), op.clone(), model.clone());
                let task = glommio::spawn_local(async move {
                    let r = run_op(&l, &mut m, i, &o).await;
                    (r, m)
                });
                glommio::timer::sleep(Duration::from_micros(delay_us)).await;
                simdisk::crash(CrashMode::Torn { seed }).await;
                match task.await {
                    (Ok(()), m) => model = m,
                    (Err(_), _) => interrupted = Some(op.clone()),
                }
                return (model, interrupted);
            }
            simdisk::crash(CrashMode::Torn { seed }).await;
            (model, interrupted)
        })
    };
    let recovered = recover_with_producers(dir, "p", config);
    judge(
        &model,
        interrupted.as_ref(),
        recovered.log_start,
        &recovered.records,
    );
    judge_producers(&model, &recovered);
}

/// A recovered log, its producer state, and what replaying the whole log gives.
struct Recovered {
    log_start: i64,
    records: Vec<Rec>,
    state: ProducerStateTable,
    replayed: ProducerStateTable,
    first_unstable_offset: Option<i64>,
    aborted: Vec<sluice_storage::AbortedTxn>,
    replayed_aborted: Vec<sluice_storage::AbortedTxn>,
}

fn recover_with_producers(
    dir: std::path::PathBuf,
    name: &'static str,
    config: LogConfig,
) -> Recovered {
    run(move || async move {
        let (s, _) = storage_at(&dir, no_cache(), PROP_NOW_MS).await;
        let log = s.open_log(name, config).await.expect("recovery");
        let (replayed, replayed_aborted) = replayed(&log).await;
        Recovered {
            log_start: log.log_start_offset(),
            records: read_records(&log).await,
            state: log.producer_state(),
            replayed,
            first_unstable_offset: log.first_unstable_offset(),
            aborted: log.aborted_index(),
            replayed_aborted,
        }
    })
}

/// The producer state recovery rebuilt from a snapshot and the log after it must be
/// the one a replay of the whole surviving log gives. Exactly so while the log still
/// starts at 0; once retention, DeleteRecords or a reset removed its beginning, the
/// rebuilt state also remembers producers of the removed batches (as Kafka's does), so
/// the two are compared on what the surviving log determines: each producer's batches
/// at or after the log start, its epoch, and its open transaction's first offset.
fn judge_producers(model: &Model, r: &Recovered) {
    // The log's first unstable offset is the table's raised to the log start.
    assert_eq!(
        r.first_unstable_offset,
        r.state.first_unstable_offset().map(|o| o.max(r.log_start))
    );
    if r.log_start == 0 {
        assert_eq!(
            r.state, r.replayed,
            "rebuilt producer state differs from a replay of the whole log"
        );
        // Compaction may keep an aborted transaction's entry while emptying or dropping
        // its first batches (a replay then starts it later): compare only without it.
        if !model.compacted {
            assert_eq!(r.aborted, r.replayed_aborted, "aborted-transaction index");
        }
    } else {
        // A transaction opened below the log start is open in the rebuilt state; the
        // surviving log cannot tell (its producer's later batches may even be plain,
        // when unchecked appends broke the transaction rule): compare the others.
        let began_below: Vec<i64> = r
            .state
            .iter()
            .filter(|(_, e)| e.txn_first_offset.is_some_and(|f| f < r.log_start))
            .map(|(p, _)| p)
            .collect();
        let project = |t: &ProducerStateTable| {
            let mut m = surviving(t, r.log_start);
            for p in &began_below {
                if let Some(e) = m.get_mut(p) {
                    e.2 = None;
                }
            }
            m
        };
        assert_eq!(
            project(&r.state),
            project(&r.replayed),
            "rebuilt producer state differs from a replay on the surviving log (start {})",
            r.log_start
        );
    }
}

/// Per producer with batches at or after the log start: epoch, those batches, and the
/// first offset of its open transaction.
type Surviving = BTreeMap<i64, (i16, Vec<BatchMeta>, Option<i64>)>;

fn surviving(t: &ProducerStateTable, log_start: i64) -> Surviving {
    t.iter()
        .filter_map(|(pid, e)| {
            let batches: Vec<BatchMeta> = e
                .batches
                .iter()
                .copied()
                .filter(|b| b.first_offset >= log_start)
                .collect();
            (!batches.is_empty()).then_some((pid, (e.epoch, batches, e.txn_first_offset)))
        })
        .collect()
}

/// The recovered log against the model, allowing for an interrupted last op:
/// - every recovered record is the model's record at that offset, or (only when an
///   append was interrupted) a record of that append past the model's end;
/// - offsets increase;
/// - every durable record at or above the model's log start is there, unless the
///   interrupted op may legitimately have removed it.
fn judge(model: &Model, interrupted: Option<&Op>, start: i64, got: &[Rec]) {
    let model_end = model
        .records
        .keys()
        .next_back()
        .map_or(model.log_start, |o| o + 1);
    let mut prev = -1;
    for (o, raw) in got {
        assert!(*o > prev, "offsets not increasing at {o}");
        prev = *o;
        match model.records.get(o) {
            Some(m) => assert_eq!(m, raw, "record {o} differs from what was appended"),
            None => {
                let appending = matches!(
                    interrupted,
                    Some(Op::Append { .. } | Op::ProducerAppend { .. })
                );
                assert!(
                    appending && *o >= model_end,
                    "record {o} recovered that the model does not hold \
                     (interrupted: {interrupted:?}, model end {model_end})"
                );
            }
        }
    }
    // An interrupted truncation removes from the end: what is left is a prefix of
    // the log (a hole would serve records the truncation meant to remove).
    if let Some(Op::Truncate(_)) = interrupted {
        let expected: Vec<i64> = model.records.range(start..).map(|(o, _)| *o).collect();
        let got_offsets: Vec<i64> = got.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            &expected[..got_offsets.len().min(expected.len())],
            &got_offsets[..],
            "an interrupted truncation left a hole"
        );
    }
    // An interrupted truncation, reset, deletion, retention or compaction may have
    // removed durable records (that is what it does): then only the checks above hold.
    let removing = matches!(
        interrupted,
        Some(Op::Truncate(_) | Op::ResetTo(_) | Op::DeleteRecords(_) | Op::Retention | Op::Compact)
    );
    if !removing {
        // Nothing durable at or above the model's start is missing (the recovered
        // start may be later only where compaction left nothing).
        let got_map: HashMap<i64, &Vec<u8>> = got.iter().map(|(o, r)| (*o, r)).collect();
        let from = model.log_start;
        for (o, raw) in model.records.range(from..model.durable_end.max(from)) {
            assert_eq!(
                got_map.get(o).copied(),
                Some(raw),
                "durable record {o} lost (recovered log start {start}, durable end {})",
                model.durable_end
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: proptest_cases(48), ..ProptestConfig::default() })]

    #[test]
    fn crash_anywhere_recovers_a_log_consistent_with_the_model(
        ops in prop::collection::vec(op(), 1..50),
        crash_at in 0usize..60,
        delay_us in 0u64..400,
        seed in any::<u64>(),
    ) {
        check(ops, crash_at, delay_us, seed);
    }
}

/// The simulator itself: what it keeps and drops, so the tests above mean what they
/// say.
#[test]
fn simdisk_keeps_synced_bytes_and_drops_unsynced_ones() {
    let d = tempdir();
    let path = d.path().join("f");
    let p2 = path.clone();
    run(move || async move {
        simdisk::enable();
        let f = sluice_storage::file::AppendFile::open(&p2, 0, 1 << 16, 0)
            .await
            .unwrap();
        f.push(&[1u8; 100]).unwrap();
        f.sync_all().await.unwrap();
        f.push(&[2u8; 100]).unwrap();
        f.wait_written(200).await.unwrap();
        assert_eq!(simdisk::syncs(), 1);
        assert_eq!(simdisk::crash(CrashMode::LoseUnsynced).await, 1);
        // The crashed file refuses further I/O.
        f.push(&[3u8; 1]).unwrap();
        assert!(f.sync_all().await.is_err());
    });
    let data = std::fs::read(&path).unwrap();
    assert!(data.len() >= 100, "synced bytes lost");
    assert_eq!(&data[..100], &[1u8; 100][..]);
    assert!(
        data[100..].iter().all(|&b| b == 0),
        "unsynced bytes survived"
    );
}
