//! The tiered storage task of a shard (issue 44; what it does is in
//! `crate::partition::tiered`'s module doc): uploads of closed segments by the
//! partitions' leaders, remote retention, and emptying deleted topics' folders.

use std::rc::{Rc, Weak};
use std::time::Duration;

use sluice_replication::cluster::{Command, RemoteSegment};
use sluice_storage::ClosedSegment;
use sluice_tiered::remote::{EPOCHS, INDEX, LOG, SNAPSHOT, TIME_INDEX, TXN_INDEX};
use sluice_tiered::StoreError;

use crate::base::error::ApiError;
use crate::base::rpc::Propose;
use crate::partition::broker::Broker;
use crate::partition::replica::Replica;
use crate::partition::tiered::{
    delete_objects, named_keys, partition_prefix, remote_log, segment_ref, Tiered,
};
use kafka_protocol::error::ResponseError;

/// The shard's tiered storage task: uploads, remote retention and purges, every
/// `interval`, until the broker goes away.
pub async fn run(broker: Weak<Broker>, interval: Duration) {
    loop {
        glommio::timer::sleep(interval).await;
        let Some(b) = broker.upgrade() else { return };
        let Some(t) = b.tiered() else { return };
        round(&b, &t, orphan_age(interval)).await;
    }
}

async fn round(b: &Rc<Broker>, t: &Rc<Tiered>, orphan_age: Duration) {
    // Logs grew and truncated since the last image: how far each agrees with its
    // remote log, which is what its retention may delete below.
    let replicas = b.replicas();
    crate::partition::tiered::adopt(&replicas, &b.image());
    let (mut lag_segments, mut lag_bytes) = (0, 0);
    for r in replicas {
        if r.leader_epoch().is_none() {
            continue;
        }
        let Ok((_, tc)) = b.log(&r.topic, r.partition) else {
            continue;
        };
        if !tc.log.remote_storage {
            continue;
        }
        // remote.log.copy.disable: read-only remote data, nothing more uploaded.
        let copying = !tc.log.remote_copy_disabled;
        let ((segments, bytes), done) = match r.leader_epoch() {
            Some(_) if copying => upload(b, t, &r).await,
            // Read-only remote data still gives way to the leader's records where an
            // unclean election made them differ.
            Some(epoch) => ((0, 0), reconcile(b, t, &r, epoch).await),
            None => ((0, 0), Ok(())),
        };
        // What is left counts whether or not the round failed: a store that is down
        // is when the backlog grows.
        lag_segments += segments;
        lag_bytes += bytes;
        if let Err(e) = done {
            t.stats.upload_errors.set(t.stats.upload_errors.get() + 1);
            tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "remote upload failed; retrying next round");
        }
        if let Err(e) = expire(b, t, &r, &tc.log).await {
            tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "remote retention failed; retrying next round");
        }
        if let Err(e) = sweep(b, t, &r, orphan_age).await {
            tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "sweeping orphaned remote objects failed");
        }
    }
    t.stats.upload_lag_segments.set(lag_segments);
    t.stats.upload_lag_bytes.set(lag_bytes);
    backlog_budget(b, t, lag_bytes);
    if b.shard.0 == 0 {
        purge(b, t).await;
    }
}

/// Whether this shard's upload backlog is over its share of
/// `--remote-upload-backlog-max-bytes` (0: half the data directory's file system):
/// appends to its tiered partitions are refused while it is ([`Tiered::admit`]).
fn backlog_budget(b: &Broker, t: &Tiered, lag_bytes: u64) {
    let total = match b.config.remote_upload_backlog_max_bytes {
        0 => b.disk.space().total / 2,
        n => n,
    };
    let share = total / b.config.cores.max(1) as u64;
    t.stats.backlog_budget.set(share);
    let full = share > 0 && lag_bytes > share;
    if t.stats.backlog_full.replace(full) != full {
        if full {
            tracing::warn!(backlog = lag_bytes, budget = share,
                "segments waiting to upload are over the shard's upload backlog budget: appends to tiered topics are refused until uploads catch up");
        } else {
            tracing::info!(
                backlog = lag_bytes,
                budget = share,
                refused = t.stats.backlog_refused.get(),
                "the upload backlog is back within its budget: appends to tiered topics resume"
            );
        }
    }
}

/// The quorum refused the command for good (applied and refused, not merely not
/// answered).
fn refused(e: &ApiError) -> bool {
    matches!(
        e.code,
        ResponseError::FencedLeaderEpoch
            | ResponseError::InvalidRequest
            | ResponseError::UnknownTopicOrPartition
    )
}

fn failed(e: impl std::fmt::Display) -> ApiError {
    ApiError::with(ResponseError::KafkaStorageError, e.to_string())
}

/// Proposes `command` and waits until every shard adopted it.
async fn propose(b: &Broker, command: Command) -> Result<(), ApiError> {
    match b.control(Propose(command)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) | Err(e) => Err(e),
    }
}

/// Uploads what the leader `r` may upload now; what is still to upload (segments and
/// bytes) when it stops.
async fn upload(b: &Rc<Broker>, t: &Tiered, r: &Rc<Replica>) -> ((u64, u64), Result<(), ApiError>) {
    let Some(epoch) = r.leader_epoch() else {
        return ((0, 0), Ok(()));
    };
    if let Err(e) = reconcile(b, t, r, epoch).await {
        return ((0, 0), Err(e));
    }
    let image = b.image();
    let Some(meta) = image.topics.get(&*r.topic) else {
        return ((0, 0), Ok(()));
    };
    let prefix = partition_prefix(&r.topic, &meta.id, r.partition);
    // Past the remote log's start too: a log all of whose segments went (retention,
    // DeleteRecords, an unclean leader's cut) still starts there, and the quorum
    // refuses a segment wholly below it.
    let mut end = image
        .remote
        .get(&*r.topic)
        .and_then(|t| t.get(&r.partition))
        .map_or(i64::MIN, |l| {
            l.end_offset().unwrap_or(i64::MIN).max(l.log_start)
        });
    drop(image);
    // Below the high watermark (every ISR member holds it: no leader change truncates
    // it) and the last stable offset (no open transaction's abort is still to come).
    let hw = r.high_watermark().get();
    let limit = r.log.first_unstable_offset().map_or(hw, |u| u.min(hw));
    let todo: Vec<ClosedSegment> = r
        .log
        .closed_segments()
        .into_iter()
        .filter(|s| s.next_offset > end)
        .collect();
    let mut left = (todo.len() as u64, todo.iter().map(|s| s.size).sum::<u64>());
    for seg in todo {
        if seg.next_offset > limit || r.leader_epoch() != Some(epoch) {
            break;
        }
        let id = *uuid::Uuid::new_v4().as_bytes();
        let epochs = {
            let mut e = r.state().epochs().clone();
            e.truncate_from_end(seg.next_offset);
            e.encode()
        };
        let size = match put_segment(t, &prefix, &seg, id, epochs).await {
            Ok(size) => size,
            // Deleted under us (DeleteRecords): the next round lists the log again. (A
            // store's 404, a missing bucket, is a failure like any other.)
            Err(StoreError::NotFound(what)) if !seg.log.exists() => {
                tracing::info!(topic = %r.topic, partition = r.partition, %what, "segment gone before its upload");
                delete_objects(t, &prefix, seg.base_offset, id).await;
                return (left, Ok(()));
            }
            Err(e) => {
                delete_objects(t, &prefix, seg.base_offset, id).await;
                return (left, Err(failed(e)));
            }
        };
        let segment = RemoteSegment {
            id,
            base_offset: seg.base_offset,
            last_offset: seg.next_offset - 1,
            max_timestamp: seg.max_timestamp,
            size,
            leader_epoch: epoch.get(),
            uploaded_ms: crate::base::util::now_ms(),
            last_epoch: r.state().epochs().epoch_for(seg.next_offset - 1),
        };
        let added = Command::AddRemoteSegments {
            topic: r.topic.to_string(),
            partition: r.partition,
            leader_epoch: epoch.get(),
            segments: vec![segment],
        };
        if let Err(e) = propose(b, added).await {
            // Refused (a deposed leader, a segment that no longer extends the remote
            // log): nobody will read these objects. Any other failure (a timeout, a
            // controller change) may still commit: the objects stay, and the sweep
            // deletes them if no segment names them after all.
            if refused(&e) {
                delete_objects(t, &prefix, seg.base_offset, id).await;
            }
            return (left, Err(e));
        }
        end = seg.next_offset;
        left = (left.0 - 1, left.1 - seg.size.min(left.1));
        t.stats
            .uploaded_segments
            .set(t.stats.uploaded_segments.get() + 1);
        t.stats
            .uploaded_bytes
            .set(t.stats.uploaded_bytes.get() + size);
        tracing::debug!(topic = %r.topic, partition = r.partition, base = seg.base_offset, end, size, "segment uploaded");
    }
    (left, Ok(()))
}

/// Before the leader `r` uploads: if the remote log holds segments its log does not
/// agree with (after an unclean election, what the old leader uploaded past where the
/// logs part), cuts the remote log through the quorum where
/// `crate::partition::tiered::truncation_point` says, then deletes the objects of the
/// segments it dropped (one it cut short keeps its object). Its own records then take
/// those offsets in the remote log as they have in its log.
async fn reconcile(
    b: &Rc<Broker>,
    t: &Tiered,
    r: &Rc<Replica>,
    epoch: crate::base::ids::LeaderEpoch,
) -> Result<(), ApiError> {
    let image = b.image();
    let (Some(remote), Some(meta)) = (
        remote_log(&image, &r.topic, r.partition),
        image.topics.get(&*r.topic),
    ) else {
        return Ok(());
    };
    let Some(from) = crate::partition::tiered::truncation_point(remote, r) else {
        return Ok(());
    };
    let end = remote.end_offset().unwrap_or(i64::MIN);
    // Cut (the one that straddles `from`, if any: its object stays) or dropped.
    let touched: Vec<RemoteSegment> = remote
        .segments
        .iter()
        .filter(|s| s.last_offset >= from)
        .cloned()
        .collect();
    let prefix = partition_prefix(&r.topic, &meta.id, r.partition);
    drop(image);
    tracing::warn!(topic = %r.topic, partition = r.partition, from, end, segments = touched.len(),
        "the remote log holds records this leader's log does not (an unclean election): forgetting its segments from the offset where they part");
    propose(
        b,
        Command::TruncateRemoteSegments {
            topic: r.topic.to_string(),
            partition: r.partition,
            leader_epoch: epoch.get(),
            from,
        },
    )
    .await?;
    let mut deleted = 0;
    for s in &touched {
        t.reader.forget(&segment_ref(&prefix, s));
        if s.base_offset >= from {
            delete_objects(t, &prefix, s.base_offset, s.id).await;
            deleted += 1;
        }
    }
    t.stats
        .deleted_segments
        .set(t.stats.deleted_segments.get() + deleted);
    Ok(())
}

/// Copies one closed segment's files (those that exist; the log must) to the store.
async fn put_segment(
    t: &Tiered,
    prefix: &str,
    seg: &ClosedSegment,
    id: [u8; 16],
    epochs: String,
) -> Result<u64, StoreError> {
    let store = t.reader.store().clone();
    let key = |ext| sluice_tiered::remote::object_key(prefix, seg.base_offset, &id, ext);
    let files = [
        (key(INDEX), seg.index.clone()),
        (key(TIME_INDEX), seg.time_index.clone()),
        (key(TXN_INDEX), seg.txn_index.clone()),
        (key(SNAPSHOT), seg.snapshot.clone()),
    ];
    let (log_key, log_path, epochs_key) = (key(LOG), seg.log.clone(), key(EPOCHS));
    t.uploads
        .run(
            move || {
                for (k, path) in &files {
                    match store.put_file(k, path) {
                        Ok(_) | Err(StoreError::NotFound(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                store.put(&epochs_key, epochs.as_bytes())?;
                store.put_file(&log_key, &log_path)
            },
            || Err(StoreError::Failed("remote storage threads stopped".into())),
        )
        .await
}

/// Remote retention on the leader `r`: forgets, then deletes, the oldest remote
/// segments past `retention.ms` or beyond `retention.bytes`.
async fn expire(
    b: &Rc<Broker>,
    t: &Tiered,
    r: &Rc<Replica>,
    cfg: &sluice_storage::LogConfig,
) -> Result<(), ApiError> {
    let image = b.image();
    let Some(remote) = remote_log(&image, &r.topic, r.partition) else {
        return Ok(());
    };
    let Some(meta) = image.topics.get(&*r.topic) else {
        return Ok(());
    };
    let prefix = partition_prefix(&r.topic, &meta.id, r.partition);
    let now = crate::base::util::now_ms();
    let remote_end = remote.end_offset().unwrap_or(i64::MIN);
    let local_beyond: u64 = r
        .log
        .closed_segments()
        .iter()
        .filter(|s| s.next_offset > remote_end)
        .map(|s| s.size)
        .sum::<u64>()
        + r.log.active_segment().1;
    let mut total: u64 = remote.segments.iter().map(|s| s.size).sum::<u64>() + local_beyond;
    let mut gone = Vec::new();
    for s in &remote.segments {
        let newest = if s.max_timestamp >= 0 {
            s.max_timestamp
        } else {
            s.uploaded_ms
        };
        let by_time = cfg.retention_ms >= 0 && now - newest > cfg.retention_ms;
        let by_size = cfg.retention_bytes >= 0 && total - s.size >= cfg.retention_bytes as u64;
        // A remote segment still on local disk goes with the local one (local
        // retention is within the total).
        if !(by_time || by_size) || s.last_offset >= r.log.log_start_offset() {
            break;
        }
        total -= s.size;
        gone.push(s.clone());
    }
    let Some(last) = gone.last() else {
        return Ok(());
    };
    let below = last.last_offset + 1;
    drop(image);
    propose(
        b,
        Command::DeleteRemoteSegments {
            topic: r.topic.to_string(),
            partition: r.partition,
            below,
        },
    )
    .await?;
    for s in &gone {
        t.reader.forget(&segment_ref(&prefix, s));
        delete_objects(t, &prefix, s.base_offset, s.id).await;
    }
    t.stats
        .deleted_segments
        .set(t.stats.deleted_segments.get() + gone.len() as u64);
    tracing::info!(topic = %r.topic, partition = r.partition, segments = gone.len(), remote_start = below, "remote retention deleted segments");
    Ok(())
}

/// An object no remote segment names is deleted once two sweeps at least this far
/// apart saw it so (the image may lag a commit by a moment, never by this): 60 task
/// intervals, within [5 s, 60 s] (60 s at the default interval).
fn orphan_age(interval: Duration) -> Duration {
    (interval * 60).clamp(Duration::from_secs(5), Duration::from_secs(60))
}
/// A led partition's folder is listed when its leadership begins, this long after
/// suspects were seen, and else this often.
const SWEEP_IDLE: Duration = Duration::from_secs(3600);

/// Deletes objects of the leader `r`'s folder that no remote segment names: uploads
/// cut short (a broker killed between the copy and the quorum's record, a failed
/// delete) and segments DeleteRecords dropped.
async fn sweep(
    b: &Rc<Broker>,
    t: &Tiered,
    r: &Rc<Replica>,
    orphan_age: Duration,
) -> Result<(), ApiError> {
    let Some(epoch) = r.leader_epoch() else {
        return Ok(());
    };
    let key = (r.topic.clone(), r.partition);
    let now = std::time::Instant::now();
    let due = t
        .sweeps
        .borrow()
        .get(&key)
        .is_none_or(|s| s.epoch != epoch.get() || now >= s.next);
    if !due {
        return Ok(());
    }
    let image = b.image();
    let Some(meta) = image.topics.get(&*r.topic) else {
        return Ok(());
    };
    let prefix = partition_prefix(&r.topic, &meta.id, r.partition);
    let named = named_keys(&image, &r.topic, r.partition, &prefix);
    drop(image);
    let store = t.reader.store().clone();
    let p = prefix.clone();
    let listed = t
        .uploads
        .run(
            move || store.list(&p),
            || Err(StoreError::Failed("remote storage threads stopped".into())),
        )
        .await
        .map_err(failed)?;
    let mut doomed = Vec::new();
    {
        let mut sweeps = t.sweeps.borrow_mut();
        let sweep = sweeps
            .entry(key)
            .or_insert_with(|| crate::partition::tiered::Sweep {
                epoch: epoch.get(),
                next: now,
                suspects: Default::default(),
            });
        let mut suspects = std::collections::HashMap::new();
        for (k, _) in listed {
            if named.contains(&k) {
                continue;
            }
            match sweep.suspects.get(&k) {
                Some(seen) if now.duration_since(*seen) >= orphan_age => doomed.push(k),
                Some(seen) => {
                    suspects.insert(k, *seen);
                }
                None => {
                    suspects.insert(k, now);
                }
            }
        }
        sweep.epoch = epoch.get();
        sweep.next = now
            + if suspects.is_empty() {
                SWEEP_IDLE
            } else {
                orphan_age
            };
        sweep.suspects = suspects;
    }
    if doomed.is_empty() {
        return Ok(());
    }
    // Still the leader, by the quorum (a broker cut off from it may think it leads
    // while another uploads): an empty AddRemoteSegments commits only under the
    // current leader epoch, and once it does this shard's image is at least as new as
    // every segment recorded before it.
    propose(
        b,
        Command::AddRemoteSegments {
            topic: r.topic.to_string(),
            partition: r.partition,
            leader_epoch: epoch.get(),
            segments: Vec::new(),
        },
    )
    .await?;
    let image = b.image();
    let named = named_keys(&image, &r.topic, r.partition, &prefix);
    doomed.retain(|k| !named.contains(k));
    drop(image);
    let n = doomed.len();
    let store = t.reader.store().clone();
    t.uploads
        .run(
            move || doomed.iter().try_for_each(|k| store.delete(k)),
            || Err(StoreError::Failed("remote storage threads stopped".into())),
        )
        .await
        .map_err(failed)?;
    tracing::info!(topic = %r.topic, partition = r.partition, objects = n, "orphaned remote objects deleted");
    Ok(())
}

/// Empties the folders of deleted topics (on the quorum leader's broker, shard 0).
async fn purge(b: &Rc<Broker>, t: &Tiered) {
    let image = b.image();
    if image.controller_id.get() != b.config.node_id || image.remote_purge.is_empty() {
        return;
    }
    for prefix in image.remote_purge.clone() {
        let store = t.reader.store().clone();
        let p = prefix.clone();
        let r = t
            .uploads
            .run(
                move || {
                    for (key, _) in store.list(&p)? {
                        store.delete(&key)?;
                    }
                    Ok(())
                },
                || Err(StoreError::Failed("remote storage threads stopped".into())),
            )
            .await;
        match r {
            Ok(()) => {
                if let Err(e) = propose(
                    b,
                    Command::RemotePurged {
                        prefix: prefix.clone(),
                    },
                )
                .await
                {
                    tracing::warn!(%prefix, error = %e, "remote folder emptied; recording it failed");
                } else {
                    tracing::info!(%prefix, "deleted topic's remote segments deleted");
                }
            }
            Err(e) => {
                tracing::warn!(%prefix, error = %e, "emptying a deleted topic's remote folder failed")
            }
        }
    }
}
