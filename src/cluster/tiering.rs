//! The tiered storage task of a shard (issue 44; what it does is in
//! `crate::partition::tiered`'s module doc): uploads of closed segments by the
//! partitions' leaders, remote retention, and emptying deleted topics' folders.

use std::rc::{Rc, Weak};
use std::time::Duration;

use sluice_replication::cluster::{Command, RemoteLog, RemoteSegment};
use sluice_storage::ClosedSegment;
use sluice_tiered::remote::{EPOCHS, INDEX, LOG, SNAPSHOT, TIME_INDEX, TXN_INDEX};
use sluice_tiered::StoreError;

use crate::base::error::ApiError;
use crate::base::rpc::Propose;
use crate::partition::broker::Broker;
use crate::partition::replica::Replica;
use crate::partition::tiered::{partition_prefix, remote_log, segment_ref, Tiered};
use kafka_protocol::error::ResponseError;

/// The shard's tiered storage task: uploads, remote retention and purges, every
/// `interval`, until the broker goes away.
pub async fn run(broker: Weak<Broker>, interval: Duration) {
    loop {
        glommio::timer::sleep(interval).await;
        let Some(b) = broker.upgrade() else { return };
        let Some(t) = b.tiered() else { return };
        round(&b, &t).await;
    }
}

async fn round(b: &Rc<Broker>, t: &Rc<Tiered>) {
    let (mut lag_segments, mut lag_bytes) = (0, 0);
    for r in b.replicas() {
        if r.leader_epoch().is_none() {
            continue;
        }
        let Ok((_, tc)) = b.log(&r.topic, r.partition) else {
            continue;
        };
        if !tc.log.remote_storage {
            continue;
        }
        match upload(b, t, &r).await {
            Ok((segments, bytes)) => {
                lag_segments += segments;
                lag_bytes += bytes;
            }
            Err(e) => {
                t.stats.upload_errors.set(t.stats.upload_errors.get() + 1);
                tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "remote upload failed; retrying next round");
            }
        }
        if let Err(e) = expire(b, t, &r, &tc.log).await {
            tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "remote retention failed; retrying next round");
        }
    }
    t.stats.upload_lag_segments.set(lag_segments);
    t.stats.upload_lag_bytes.set(lag_bytes);
    if b.shard.0 == 0 {
        purge(b, t).await;
    }
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
async fn upload(b: &Rc<Broker>, t: &Tiered, r: &Rc<Replica>) -> Result<(u64, u64), ApiError> {
    let Some(epoch) = r.leader_epoch() else {
        return Ok((0, 0));
    };
    let image = b.image();
    let Some(meta) = image.topics.get(&r.topic) else {
        return Ok((0, 0));
    };
    let prefix = partition_prefix(&r.topic, &meta.id, r.partition);
    let mut end = remote_log(&image, &r.topic, r.partition)
        .and_then(RemoteLog::end_offset)
        .unwrap_or(i64::MIN);
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
            // Deleted under us (DeleteRecords): the next round lists the log again.
            Err(StoreError::NotFound(what)) => {
                tracing::info!(topic = %r.topic, partition = r.partition, %what, "segment gone before its upload");
                delete_attempt(t, &prefix, seg.base_offset, id).await;
                return Ok(left);
            }
            Err(e) => {
                delete_attempt(t, &prefix, seg.base_offset, id).await;
                return Err(failed(e));
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
        };
        let added = Command::AddRemoteSegments {
            topic: r.topic.clone(),
            partition: r.partition,
            leader_epoch: epoch.get(),
            segments: vec![segment],
        };
        if let Err(e) = propose(b, added).await {
            // Not recorded (a deposed leader, or the quorum unreachable): nobody will
            // read these objects.
            delete_attempt(t, &prefix, seg.base_offset, id).await;
            return Err(e);
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
    Ok(left)
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
    t.reader
        .pool()
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

/// Deletes the objects of one upload attempt (or of a remote segment).
async fn delete_attempt(t: &Tiered, prefix: &str, base: i64, id: [u8; 16]) {
    let store = t.reader.store().clone();
    let keys: Vec<String> = [LOG, INDEX, TIME_INDEX, TXN_INDEX, SNAPSHOT, EPOCHS]
        .iter()
        .map(|ext| sluice_tiered::remote::object_key(prefix, base, &id, ext))
        .collect();
    let r = t
        .reader
        .pool()
        .run(
            move || keys.iter().try_for_each(|k| store.delete(k)),
            || Err(StoreError::Failed("remote storage threads stopped".into())),
        )
        .await;
    if let Err(e) = r {
        tracing::warn!(prefix, base, error = %e, "could not delete remote objects; they stay unreferenced");
    }
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
    let Some(meta) = image.topics.get(&r.topic) else {
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
            topic: r.topic.clone(),
            partition: r.partition,
            below,
        },
    )
    .await?;
    for s in &gone {
        t.reader.forget(&segment_ref(&prefix, s));
        delete_attempt(t, &prefix, s.base_offset, s.id).await;
    }
    t.stats
        .deleted_segments
        .set(t.stats.deleted_segments.get() + gone.len() as u64);
    tracing::info!(topic = %r.topic, partition = r.partition, segments = gone.len(), remote_start = below, "remote retention deleted segments");
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
            .reader
            .pool()
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
