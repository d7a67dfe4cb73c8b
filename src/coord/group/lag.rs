//! The consumer-lag sampler of one shard: every `--lag-sample-interval-ms` it takes the
//! committed offsets of the groups this shard coordinates, asks each partition's leader
//! for its high watermark and the record at the committed offset (this broker's
//! partitions over the shard mesh, other brokers' with a one-record Fetch), feeds the
//! Burrow windows ([`sluice_coordinator::lag`]), publishes the result on the
//! [`LagBoard`] and runs the alert rules ([`sluice_coordinator::alert`]), handing
//! notices to the sink thread.
//!
//! It runs as a task of its own on the coordinating shard, off the request path: one
//! mesh call per shard holding sampled partitions and one Fetch per other leader, each
//! bounded by a timeout.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::{BrokerId, TopicName};
use sluice_client::aio::Conn;
use sluice_coordinator::alert::{Alerts, Observation};
use sluice_coordinator::lag::{group_status, PartitionWindow};
use sluice_protocol::sb;

use super::shard::GroupShell;
use crate::base::ids::{BrokerId as NodeId, LeaderEpoch, Offset};
use crate::base::rpc::{ListOffsets, ListOffsetsItem, Read, ReadItem};
use crate::base::util::now_ms;
use crate::observe::lag::{GroupLag, LagBoard, PartitionLag};
use crate::partition::broker::Broker;

/// One Fetch to another broker, connection included.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a partition leader on another broker gave no sample (logged, then retried at the
/// next sample with a new connection).
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("broker {0} is not registered")]
    Unregistered(i32),
    #[error(transparent)]
    Client(#[from] sluice_client::Error),
}
/// Partitions sampled per shard at most (a bound on the windows kept).
pub const PARTITIONS_MAX: usize = 100_000;

/// A (topic, partition, committed offset) to look at.
type Probe = (String, i32, i64);

/// What the partition's leader said about a probe.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    high_watermark: i64,
    last_stable_offset: i64,
    /// Timestamp of the first data record at or after the probe's offset.
    timestamp_ms: Option<i64>,
}

/// One group's committed offsets as the coordinator holds them.
struct GroupInput {
    group: String,
    state: &'static str,
    members: usize,
    /// (topic, partition) → (offset, commit time)
    offsets: Vec<((String, i32), (i64, i64))>,
}

struct Sampler {
    windows: HashMap<(String, String, i32), PartitionWindow>,
    alerts: Alerts,
    conns: HashMap<i32, Conn>,
}

/// Starts the shard's sampler task (it ends with the broker).
pub fn start(broker: &Rc<Broker>, shell: &Rc<GroupShell>, board: Arc<LagBoard>) {
    let (b, s) = (Rc::downgrade(broker), Rc::downgrade(shell));
    glommio::spawn_local(run(b, s, board)).detach();
}

async fn run(broker: Weak<Broker>, shell: Weak<GroupShell>, board: Arc<LagBoard>) {
    let mut sampler = Sampler {
        windows: HashMap::new(),
        alerts: Alerts::default(),
        conns: HashMap::new(),
    };
    let interval = Duration::from_millis(board.settings.interval_ms.max(1));
    loop {
        glommio::timer::sleep(interval).await;
        let (Some(b), Some(s)) = (broker.upgrade(), shell.upgrade()) else {
            return;
        };
        sampler.sample(&b, &s, &board).await;
    }
}

impl Sampler {
    async fn sample(&mut self, broker: &Rc<Broker>, shell: &GroupShell, board: &LagBoard) {
        // Loads this shard's __consumer_offsets partitions if nothing has yet.
        if let Err(e) = shell.list(broker).await {
            tracing::debug!(error = %e, "lag sampler: groups not loaded");
            return;
        }
        let inputs = inputs(shell);
        let mut probes: HashSet<Probe> = HashSet::new();
        for g in &inputs {
            for ((t, p), (offset, _)) in &g.offsets {
                probes.insert((t.clone(), *p, *offset));
            }
        }
        let seen = self.probe(broker, probes.into_iter().collect()).await;
        let now = now_ms();
        let cfg = board.settings.eval;
        let mut out = Vec::with_capacity(inputs.len());
        let mut live = HashSet::new();
        for g in inputs {
            let mut parts = Vec::with_capacity(g.offsets.len());
            for ((topic, partition), (offset, commit_ms)) in g.offsets {
                let Some(s) = seen.get(&(topic.clone(), partition, offset)) else {
                    continue; // leader unknown or unreachable: no sample this time
                };
                let key = (g.group.clone(), topic.clone(), partition);
                if self.windows.len() >= PARTITIONS_MAX && !self.windows.contains_key(&key) {
                    continue;
                }
                let w = self.windows.entry(key.clone()).or_default();
                live.insert(key);
                w.observe(&cfg, offset, commit_ms, s.high_watermark);
                let e = w.evaluate(&cfg, now);
                let lag_seconds = match s.timestamp_ms {
                    Some(ts) if e.lag > 0 => ((now - ts).max(0)) as f64 / 1000.0,
                    _ => 0.0,
                };
                parts.push(PartitionLag {
                    topic,
                    partition,
                    committed_offset: offset,
                    commit_timestamp_ms: commit_ms,
                    high_watermark: s.high_watermark,
                    last_stable_offset: s.last_stable_offset,
                    lag_records: e.lag,
                    lag_seconds,
                    status: e.status,
                    trend: e.trend,
                    complete: e.complete,
                });
            }
            parts.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
            let evals: Vec<_> = parts
                .iter()
                .map(|p| sluice_coordinator::lag::PartitionEval {
                    status: p.status,
                    lag: p.lag_records,
                    complete: p.complete,
                    trend: p.trend,
                })
                .collect();
            let (status, complete) = group_status(&evals);
            let worst = parts.iter().map(|p| p.status).max().unwrap_or(status);
            out.push(GroupLag {
                group: g.group,
                state: g.state,
                members: g.members,
                status,
                worst,
                complete,
                partitions: parts,
                sampled_at_ms: now,
            });
        }
        // Partitions no longer committed (group deleted, moved, offsets expired).
        self.windows.retain(|k, _| live.contains(k));
        if !board.settings.rules.is_empty() {
            let notices = self
                .alerts
                .evaluate(now, &board.settings.rules, &observations(&out));
            if let Some(sink) = &board.sink {
                sink.send(notices);
            }
        }
        board.publish(broker.shard.0, out);
    }

    /// Asks each probe's leader; answers what it could.
    async fn probe(&mut self, broker: &Rc<Broker>, probes: Vec<Probe>) -> HashMap<Probe, Seen> {
        let image = broker.image();
        let me = broker.config.node_id;
        let mut local: BTreeMap<sluice_shard::ShardId, Vec<Probe>> = BTreeMap::new();
        let mut remote: BTreeMap<i32, Vec<Probe>> = BTreeMap::new();
        for pr in probes {
            let Some(meta) = image.topics.get(&pr.0) else {
                continue;
            };
            let Some(leader) = meta.assignment(pr.1).map(|a| a.leader) else {
                continue;
            };
            if leader == me {
                local.entry(broker.owner(meta, pr.1)).or_default().push(pr);
            } else if leader >= 0 {
                remote.entry(leader).or_default().push(pr);
            }
        }
        let mut seen = HashMap::new();
        for (shard, prs) in local {
            self.probe_local(broker, shard, prs, &mut seen).await;
        }
        for (leader, prs) in remote {
            let r = self.probe_remote(broker, leader, &prs, &mut seen);
            let r = glommio::timer::timeout(REMOTE_TIMEOUT, async { Ok(r.await) }).await;
            if !matches!(r, Ok(Ok(()))) {
                let why = match r {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                tracing::debug!(leader, error = %why, "lag sampler: leader not reachable");
                self.conns.remove(&leader);
            }
        }
        seen
    }

    async fn probe_local(
        &mut self,
        broker: &Rc<Broker>,
        shard: sluice_shard::ShardId,
        prs: Vec<Probe>,
        seen: &mut HashMap<Probe, Seen>,
    ) {
        let items = prs
            .iter()
            .map(|(t, p, o)| ReadItem {
                topic: Arc::from(t.as_str()),
                partition: *p,
                offset: Offset::new(*o),
                // At least one whole batch comes back: the one holding the offset.
                max_bytes: 1,
                replica_id: NodeId::NONE,
                current_leader_epoch: LeaderEpoch::NONE,
                read_committed: false,
            })
            .collect();
        let Ok(outs) = broker.call(shard, Read { items }).await else {
            return;
        };
        let mut retry = Vec::new();
        for (pr, out) in prs.into_iter().zip(outs) {
            if out.error.is_none() {
                let ts = first_timestamp(&out.records, pr.2);
                let (hw, lso) = (out.high_watermark.get(), out.last_stable_offset.get());
                seen.insert(pr, seen_of(hw, lso, ts));
            } else {
                retry.push(pr);
            }
        }
        // Out of range (committed past the end, or below the log start): the end from
        // ListOffsets, and the age of the oldest record still in the log.
        for pr in retry {
            let call = ListOffsets {
                items: [-1, -2]
                    .map(|timestamp| ListOffsetsItem {
                        topic: pr.0.clone(),
                        partition: pr.1,
                        timestamp,
                        current_leader_epoch: LeaderEpoch::NONE,
                    })
                    .into(),
                read_committed: false,
            };
            let Ok(r) = broker.call(shard, call).await else {
                continue;
            };
            let (Some(Ok(latest)), Some(Ok(earliest))) = (r.first(), r.get(1)) else {
                continue;
            };
            let (hw, start) = (latest.offset.get(), earliest.offset.get());
            let mut ts = None;
            if pr.2 < start && start < hw {
                let item = ReadItem {
                    topic: Arc::from(pr.0.as_str()),
                    partition: pr.1,
                    offset: Offset::new(start),
                    max_bytes: 1,
                    replica_id: NodeId::NONE,
                    current_leader_epoch: LeaderEpoch::NONE,
                    read_committed: false,
                };
                if let Ok(outs) = broker.call(shard, Read { items: vec![item] }).await {
                    ts = outs
                        .first()
                        .and_then(|o| first_timestamp(&o.records, start));
                }
            }
            seen.insert(pr, seen_of(hw, hw, ts));
        }
    }

    async fn probe_remote(
        &mut self,
        broker: &Rc<Broker>,
        leader: i32,
        prs: &[Probe],
        seen: &mut HashMap<Probe, Seen>,
    ) -> Result<(), ProbeError> {
        let conn = match self.conns.entry(leader) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                let image = broker.image();
                let node = image
                    .brokers
                    .get(&NodeId::new(leader))
                    .ok_or(ProbeError::Unregistered(leader))?;
                let conn =
                    Conn::connect_to(&node.host, node.port, "sluice-lag", Some(REMOTE_TIMEOUT))
                        .await?
                        .with_call_timeout(REMOTE_TIMEOUT);
                v.insert(conn)
            }
        };
        let mut by_topic: BTreeMap<&str, Vec<FetchPartition>> = BTreeMap::new();
        for (t, p, o) in prs {
            by_topic.entry(t).or_default().push(
                FetchPartition::default()
                    .with_partition(*p)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(*o)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(1),
            );
        }
        let topics = by_topic
            .into_iter()
            .map(|(t, ps)| {
                FetchTopic::default()
                    .with_topic(TopicName(sb(t)))
                    .with_partitions(ps)
            })
            .collect();
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(1 << 20)
            .with_isolation_level(0)
            .with_session_epoch(-1)
            .with_topics(topics);
        let resp = conn.call(12, &req).await?;
        for t in resp.responses {
            for p in t.partitions {
                let Some(pr) = prs
                    .iter()
                    .find(|(tn, pn, _)| tn == t.topic.0.as_str() && *pn == p.partition_index)
                else {
                    continue;
                };
                // Out of range: the high watermark still comes back (Kafka sets it).
                if p.error_code != 0 && p.high_watermark < 0 {
                    continue;
                }
                let records = p.records.unwrap_or_default();
                let ts = first_timestamp(&records, pr.2);
                seen.insert(
                    pr.clone(),
                    seen_of(p.high_watermark, p.last_stable_offset, ts),
                );
            }
        }
        Ok(())
    }
}

fn seen_of(high_watermark: i64, last_stable_offset: i64, timestamp_ms: Option<i64>) -> Seen {
    Seen {
        high_watermark,
        last_stable_offset: if last_stable_offset < 0 {
            high_watermark
        } else {
            last_stable_offset
        },
        timestamp_ms,
    }
}

/// The committed offsets of every group the shell's coordinator holds.
fn inputs(shell: &GroupShell) -> Vec<GroupInput> {
    let coord = shell.coordinator();
    coord
        .groups()
        .map(|g| GroupInput {
            group: g.id.clone(),
            state: g.state_name(),
            members: g.member_count(),
            offsets: g
                .offsets
                .iter()
                .map(|(tp, c)| (tp.clone(), (c.offset, c.commit_timestamp_ms)))
                .collect(),
        })
        .collect()
}

/// Per (group, topic): total lag, largest age and worst status, for the alert rules.
fn observations(groups: &[GroupLag]) -> Vec<Observation> {
    let mut out: Vec<Observation> = Vec::new();
    for g in groups {
        let mut by_topic: BTreeMap<&str, Observation> = BTreeMap::new();
        for p in &g.partitions {
            let o = by_topic.entry(&p.topic).or_insert_with(|| Observation {
                group: g.group.clone(),
                topic: p.topic.clone(),
                lag_records: 0,
                lag_seconds: 0.0,
                status: sluice_coordinator::lag::Status::Ok,
            });
            o.lag_records += p.lag_records;
            o.lag_seconds = o.lag_seconds.max(p.lag_seconds);
            o.status = o.status.max(p.status);
        }
        out.extend(by_topic.into_values());
    }
    out
}

/// The timestamp of the first data record at or after `offset` in `records` (whole
/// stored batches). A compressed batch is not opened: its first timestamp stands for
/// its records (the oldest in it, for a producer's own timestamps).
fn first_timestamp(records: &Bytes, offset: i64) -> Option<i64> {
    use sluice_storage::batch::{record_timestamps, stored_batches, ATTR_TIMESTAMP_LOG_APPEND};
    for (h, bytes) in stored_batches(records) {
        if h.is_control() || h.last_offset() < offset || h.record_count == 0 {
            continue;
        }
        if h.attributes & ATTR_TIMESTAMP_LOG_APPEND != 0 {
            return Some(h.max_timestamp);
        }
        if let Some(ts) = record_timestamps(bytes) {
            if let Some((_, t)) = ts.into_iter().find(|(o, _)| *o >= offset) {
                return Some(t);
            }
            continue;
        }
        return Some(h.base_timestamp);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_at_the_offset_gives_the_timestamp() {
        use sluice_storage::batch::build;
        let mut b1 = build::batch(1_000, &[(None, b"a"), (None, b"b"), (None, b"c")]);
        sluice_storage::batch::assign(&mut b1, 10, 0, None);
        let mut b2 = build::batch(5_000, &[(None, b"d")]);
        sluice_storage::batch::assign(&mut b2, 13, 0, None);
        let all = Bytes::from([b1.clone(), b2].concat());
        // build::batch gives record i the timestamp base + i.
        assert_eq!(first_timestamp(&all, 10), Some(1_000));
        assert_eq!(first_timestamp(&all, 12), Some(1_002));
        assert_eq!(first_timestamp(&all, 13), Some(5_000));
        assert_eq!(first_timestamp(&all, 14), None);
        assert_eq!(first_timestamp(&Bytes::new(), 0), None);
    }
}
