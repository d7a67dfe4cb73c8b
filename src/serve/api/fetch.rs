//! Fetch (key 1): reads on each partition's home shard, long-poll, byte limits.
//!
//! 1. Every partition is read at once on its home shard (one message per shard).
//! 2. The replies are merged in request order and trimmed to `max_bytes`: the first
//!    partition with data always keeps at least one whole batch (as Kafka), later ones
//!    are dropped if they would overflow the budget.
//! 3. If fewer than `min_bytes` came back and `max_wait_ms` has not passed, the shards
//!    are asked to wait for an append to any of the partitions (bounded by the
//!    deadline); then the read is repeated.
//!
//! Fetch v0–v3 clients read message sets: the v2 batches read are down-converted to
//! magic 0 (v0–v1) or magic 1 (v2–v3) by Kafka's rules (`sluice_storage::message_set`:
//! control batches skipped, records before the fetch offset dropped, at least one
//! message even past the partition's byte limit). gzip, snappy and lz4 batches are
//! converted to uncompressed messages; zstd ones cannot be (Kafka allows zstd only in
//! v2 batches): the partition answers UNSUPPORTED_COMPRESSION_TYPE. As Kafka, a topic
//! with `compression.type=zstd` answers every Fetch before v10 (KIP-110) that way, and
//! one with `message.downconversion.enable=false` answers v0–v3 UNSUPPORTED_VERSION.
//!
//! Fetch from follower (KIP-392), as Kafka with `replica.selector.class` set to its
//! rack-aware selector (`--replica-selector rack`, Sluice's default; `leader` turns it
//! off): a consumer's Fetch v11+ naming its rack (`rack_id`, librdkafka's `client.rack`)
//! is answered by the partition's leader, when the leader is in another rack and an
//! in-sync replica is in the consumer's, with that replica as `preferred_read_replica`
//! and no records (at once, without waiting); the consumer then fetches from it. Every
//! in-sync follower's log end is at least the high watermark, so it holds any offset a
//! consumer may fetch. A follower serves consumers' Fetch v11+ up to its own high
//! watermark (`Replica::fetch_bound`); v0–v10 consumers need the leader
//! (NOT_LEADER_OR_FOLLOWER elsewhere), as in Kafka.
//!
//! Fetch sessions (KIP-227, v7+): the shard's session cache (`crate::base::fetch_session`)
//! decides whether a request is sessionless, opens a session or is incremental; an
//! incremental answer lists only the partitions with something new.

use std::ops::Not;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use foldhash::{HashMap, HashMapExt, HashSet};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchResponse, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::BrokerId;
use sluice_shard::ShardId;

use crate::base::error::{self, ApiError};
use crate::base::fetch_session::{
    Cache, Context, FeedMark, PartKey, PartReq, PartResp, Reads, TopicKey,
};
use crate::base::ids::{BrokerId as NodeId, LeaderEpoch, Offset};
use crate::base::metadata::{MetadataImage, TopicMeta};
use crate::base::rpc::{Changes, Read, ReadItem, ReadOut, WaitChange, WaitItem};
use crate::base::topic_config::{downconversion_enabled, stores_zstd};
use crate::partition::broker::Broker;
use crate::partition::changes::Key as ChangedPart;
use crate::partition::replica::ANY_REPLICA_CONSUMER;
use sluice_replication::cluster::PartitionState;
use sluice_storage::message_set::{self, MessageSetError};
use uuid::Uuid;

use crate::base::util::{any_true, join_all, now_ms, sb};

/// Upper bound on how long one fetch may wait, whatever the client asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(30);

struct Slot {
    /// The topic's name, shared by its partitions' slots and read items.
    topic: Arc<str>,
    /// The topic's id (answered by Fetch v13+).
    topic_id: Uuid,
    /// How the fetch session knows this partition.
    key: PartKey,
    /// What the request (or the session) says about it.
    req: PartReq,
    partition: i32,
    offset: Offset,
    max_bytes: usize,
    current_leader_epoch: LeaderEpoch,
    owner: Option<ShardId>,
    /// Fetch v13+ named a topic id this broker does not know.
    unknown_id: bool,
    /// The topic's `message.downconversion.enable` (looked up for Fetch v0–v3 only,
    /// true for later versions).
    downconversion: bool,
    /// The topic's `compression.type` is zstd (looked up for Fetch before v10 only,
    /// false for later versions).
    zstd_topic: bool,
    /// KIP-392: the replica this consumer should fetch this partition from instead.
    preferred: Option<i32>,
}

/// The request's topics in the current image, looked up per topic rather than per
/// partition where the order allows.
struct Topics<'a> {
    image: &'a MetadataImage,
    /// Fetch v13+ names topics by id: each topic's name and metadata (`None`: unknown
    /// id), looked up once per request.
    by_id: HashMap<Uuid, Option<(Arc<str>, &'a TopicMeta)>>,
    /// The topic looked up last by name: a request lists a topic's partitions together
    /// (a session's order, by last data, interleaves them; then this saves less).
    last: Option<(Arc<str>, Option<&'a TopicMeta>)>,
}

impl<'a> Topics<'a> {
    fn new(image: &'a MetadataImage) -> Topics<'a> {
        Topics {
            image,
            by_id: HashMap::new(),
            last: None,
        }
    }

    fn by_id(&mut self, id: Uuid) -> Option<(Arc<str>, &'a TopicMeta)> {
        let image = self.image;
        self.by_id
            .entry(id)
            .or_insert_with(|| {
                image
                    .topic_by_id(id)
                    .map(|(n, m)| (Arc::from(n.as_str()), m))
            })
            .clone()
    }

    fn meta(&mut self, name: &Arc<str>) -> Option<&'a TopicMeta> {
        match &self.last {
            Some((n, meta)) if Arc::ptr_eq(n, name) || **n == **name => *meta,
            _ => {
                let meta = self.image.topics.get(&**name);
                self.last = Some((name.clone(), meta));
                meta
            }
        }
    }
}

/// The request's partitions and forgotten partitions as the session cache keys them.
fn requested(version: i16, req: &FetchRequest) -> (Vec<(PartKey, PartReq)>, Vec<PartKey>) {
    let topic_key = |name: &kafka_protocol::messages::TopicName, id: Uuid| {
        if version >= 13 {
            TopicKey::Id(id)
        } else {
            TopicKey::Name(Arc::from(name.0.as_str()))
        }
    };
    let parts = req
        .topics
        .iter()
        .flat_map(|t| {
            let key = topic_key(&t.topic, t.topic_id);
            t.partitions.iter().map(move |p| {
                let r = PartReq {
                    fetch_offset: Offset::new(p.fetch_offset),
                    log_start_offset: Offset::new(p.log_start_offset),
                    max_bytes: p.partition_max_bytes,
                    current_leader_epoch: LeaderEpoch::new(p.current_leader_epoch),
                    last_fetched_epoch: LeaderEpoch::new(p.last_fetched_epoch),
                };
                ((key.clone(), p.partition), r)
            })
        })
        .collect();
    let forgotten = req
        .forgotten_topics_data
        .iter()
        .flat_map(|t| {
            let key = topic_key(&t.topic, t.topic_id);
            t.partitions.iter().map(move |p| (key.clone(), *p))
        })
        .collect();
    (parts, forgotten)
}

/// The answer to a Fetch refused as a whole (a fetch session error).
fn session_error(code: ResponseError) -> FetchResponse {
    FetchResponse::default()
        .with_error_code(code.code())
        .with_session_id(0)
}

/// Publishes this shard's session count for the metrics endpoint.
fn publish_sessions(broker: &Broker) {
    let cache = broker.fetch_sessions.borrow();
    let m = broker.shard_metrics();
    m.fetch_sessions
        .store(cache.len() as u64, std::sync::atomic::Ordering::Relaxed);
    m.fetch_session_evictions
        .store(cache.evictions(), std::sync::atomic::Ordering::Relaxed);
}

/// The most a fetch response carries whatever its request asks (Kafka's
/// fetch.max.bytes default, 55 MiB); a larger first batch still goes out (KIP-74).
const FETCH_MAX_BYTES: i32 = 55 << 20;

pub async fn handle(broker: &Rc<Broker>, version: i16, req: FetchRequest) -> FetchResponse {
    let start = Instant::now();
    let deadline = start + Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT_CAP);
    // As Kafka: the request's limit, within the broker's fetch.max.bytes; 0 (or less)
    // still returns the first batch found (KIP-74), not everything.
    let max_bytes = req.max_bytes.clamp(0, FETCH_MAX_BYTES) as usize;
    let min_bytes = req.min_bytes.max(0) as usize;
    let image = broker.image();
    // A follower broker fetching for replication (v14 and below carry its id here).
    let replica_id = req.replica_id.0;
    let client_rack = req.rack_id.to_string();
    let select_for = (version >= 11
        && replica_id < 0
        && broker.config.rack_aware_fetch
        && !client_rack.is_empty())
    .then_some(client_rack.as_str());
    let (parts, forgotten) = requested(version, &req);
    let mut context = broker.fetch_sessions.borrow_mut().context(
        version,
        req.session_id,
        req.session_epoch,
        &parts,
        &forgotten,
        now_ms().max(0) as u64,
    );
    publish_sessions(broker);
    // A large follower session reads only what changed (`Reads::Changed`); `feed` is
    // where it stands in the shards' change feeds, noted before reading.
    let mut feed: Option<FeedMark> = None;
    let (parts, changed_reads) = match &mut context {
        Context::Error(code) => return session_error(*code),
        Context::Incremental {
            id,
            reads: Reads::All { parts, mark },
            ..
        } => {
            // A large follower session's sweep: its long poll waits on the feeds too.
            let mut changed_reads = None;
            if *mark {
                feed = Some(FeedMark {
                    positions: feed_positions(broker).await,
                    swept: true,
                });
                changed_reads = Some((*id, version >= 13));
            }
            (std::mem::take(parts), changed_reads)
        }
        Context::Incremental {
            id,
            reads:
                Reads::Changed {
                    positions,
                    must,
                    by_id,
                },
            ..
        } => {
            let (positions, changed) = feed_changes(broker, positions).await;
            let (parts, swept) =
                changed_parts(broker, &image, *id, *by_id, changed, std::mem::take(must));
            feed = Some(FeedMark { positions, swept });
            (parts, Some((*id, *by_id)))
        }
        Context::Full | Context::Sessionless => (parts, None),
    };
    let mut topics = Topics::new(&image);
    let mut slots: Vec<Slot> = parts
        .into_iter()
        .map(|(key, r)| slot(broker, &mut topics, version, select_for, key, r))
        .collect();
    let read_committed = replica_id < 0 && req.isolation_level == 1;
    // Consumers of Fetch v11+ may be served by a follower (KIP-392).
    let item_replica_id = if replica_id < 0 && version >= 11 {
        ANY_REPLICA_CONSUMER
    } else {
        NodeId::new(replica_id)
    };
    let redirected = slots.iter().any(|s| s.preferred.is_some());
    let (mut outs, mut pending) =
        read_all(broker, &slots, max_bytes, item_replica_id, read_committed).await;
    loop {
        let total: usize = outs.iter().map(|o| o.records.len()).sum();
        let any_error = outs.iter().any(|o| o.error.is_some());
        // A preferred read replica is answered at once, as Kafka does.
        if total >= min_bytes || any_error || redirected || Instant::now() >= deadline {
            break;
        }
        if let (Some((id, by_id)), Some(mark)) = (changed_reads, feed.as_mut()) {
            // Wait for the next change on any shard; read again only if it touched the
            // session (what was read already, and what changed since).
            wait_for_changes(broker, &mark.positions, deadline).await;
            let (positions, changed) = feed_changes(broker, &mark.positions).await;
            mark.positions = positions;
            let (touched, _) = changed_parts(broker, &image, id, by_id, changed, Vec::new());
            if touched.is_empty() {
                continue;
            }
            let read: HashSet<&PartKey> = slots.iter().map(|s| &s.key).collect();
            let added: Vec<(PartKey, PartReq)> = touched
                .into_iter()
                .filter(|(k, _)| !read.contains(k))
                .collect();
            drop(read);
            for (key, r) in added {
                slots.push(slot(broker, &mut topics, version, select_for, key, r));
            }
            (outs, pending) =
                read_all(broker, &slots, max_bytes, item_replica_id, read_committed).await;
            continue;
        }
        // Wait for appends past what is there now (not past the fetch offset), so a
        // partition holding less than min_bytes does not wake the wait at once.
        let waits = slots
            .iter()
            .zip(&outs)
            .filter_map(|(s, o)| {
                s.owner.map(|owner| {
                    (
                        owner,
                        WaitItem {
                            topic: s.topic.clone(),
                            partition: s.partition,
                            // What this fetch may see: up to the last stable
                            // offset for read_committed, else the high watermark.
                            offset: s.offset.max(if read_committed {
                                o.last_stable_offset
                            } else {
                                o.high_watermark
                            }),
                        },
                    )
                })
            })
            .collect();
        broker
            .wait_for_data(waits, deadline, replica_id >= 0, read_committed)
            .await;
        (outs, pending) =
            read_all(broker, &slots, max_bytes, item_replica_id, read_committed).await;
    }
    let mut sessions = broker.fetch_sessions.borrow_mut();
    let resp = build_response(
        version,
        slots,
        outs,
        &pending,
        &context,
        feed,
        replica_id >= 0,
        &mut sessions,
    );
    drop(sessions);
    publish_sessions(broker);
    resp
}

/// What the handler needs of one partition to read and answer it.
fn slot(
    broker: &Rc<Broker>,
    topics: &mut Topics<'_>,
    version: i16,
    select_for: Option<&str>,
    key: PartKey,
    r: PartReq,
) -> Slot {
    let image = topics.image;
    let me = broker.config.node_id;
    let (name, meta, topic_id, unknown_id) = match &key.0 {
        TopicKey::Name(n) => {
            let meta = topics.meta(n);
            (n.clone(), meta, meta.map_or(Uuid::nil(), |m| m.id), false)
        }
        TopicKey::Id(id) => match topics.by_id(*id) {
            Some((n, meta)) => (n, Some(meta), *id, false),
            None => (Arc::from(""), None, *id, true),
        },
    };
    let partition = key.1;
    let owner = meta
        .filter(|m| (0..m.partitions).contains(&partition))
        .map(|m| broker.owner(m, partition));
    let preferred = select_for.and_then(|rack| {
        let a = meta?.assignment(partition)?;
        preferred_read_replica(image, me, a, rack, partition)
    });
    Slot {
        topic: name,
        topic_id,
        req: r,
        partition,
        offset: r.fetch_offset,
        // Redirected: the read only fills in the offsets of the answer.
        max_bytes: if preferred.is_some() {
            0
        } else {
            r.max_bytes.max(0) as usize
        },
        current_leader_epoch: r.current_leader_epoch,
        owner,
        unknown_id,
        // Both flags only for the versions that read them: the effective configs are
        // a copy of the topic's map, and a follower's fetch of thousands of partitions
        // made one per partition on every fetch.
        // (the topic's own setting, else a dynamic broker default, as described).
        downconversion: version > 3
            || meta.is_none_or(|m| {
                downconversion_enabled(&crate::base::broker_configs::effective_topic_configs(
                    image,
                    NodeId::new(me),
                    &m.configs,
                ))
            }),
        // The topic's own compression.type, else a dynamic broker default.
        zstd_topic: version < 10
            && meta.is_some_and(|m| {
                stores_zstd(&crate::base::broker_configs::effective_topic_configs(
                    image,
                    NodeId::new(me),
                    &m.configs,
                ))
            }),
        preferred,
        key,
    }
}

/// Every shard's change-feed position now (see `crate::partition::changes`), by
/// shard index.
async fn feed_positions(broker: &Rc<Broker>) -> Vec<u64> {
    let shards = broker.mesh.shard_count();
    feed_changes(broker, &vec![u64::MAX; shards]).await.0
}

/// The partitions changed on every shard after `positions` (by shard index), and the
/// new positions; `None` if some shard cannot say (its feed was not recording then, or
/// it did not answer): read everything.
async fn feed_changes(
    broker: &Rc<Broker>,
    positions: &[u64],
) -> (Vec<u64>, Option<Vec<ChangedPart>>) {
    let shards = broker.mesh.shard_count();
    let calls = (0..shards).map(|i| {
        let since = positions.get(i).copied().unwrap_or(0);
        // A shard that does not answer keeps its position (none if it was asked for one)
        // and reads as unknown.
        async move {
            broker
                .call(ShardId(i), Changes { since })
                .await
                .unwrap_or((if since == u64::MAX { 0 } else { since }, None))
        }
    });
    let answers = join_all(calls).await;
    let mut changed = Some(Vec::new());
    let mut at = Vec::with_capacity(shards);
    for (position, parts) in answers {
        at.push(position);
        match (parts, changed.as_mut()) {
            (Some(parts), Some(all)) => all.extend(parts),
            _ => changed = None,
        }
    }
    (at, changed)
}

/// Waits until any shard's change feed moves past its position, or the deadline.
async fn wait_for_changes(broker: &Rc<Broker>, positions: &[u64], deadline: Instant) {
    let timeout = deadline.saturating_duration_since(Instant::now());
    if timeout.is_zero() {
        return;
    }
    let calls = (0..broker.mesh.shard_count())
        .map(|i| {
            let since = positions.get(i).copied().unwrap_or(0);
            async move {
                matches!(
                    broker.call(ShardId(i), WaitChange { since, timeout }).await,
                    Ok(true)
                )
            }
        })
        .collect();
    any_true(calls).await;
}

/// The partitions of session `id` to read after the feeds said `changed`: those
/// changed and `must`, in the session's order; every partition when a feed could not
/// say (then true: a sweep).
fn changed_parts(
    broker: &Broker,
    image: &MetadataImage,
    id: i32,
    by_id: bool,
    changed: Option<Vec<ChangedPart>>,
    must: Vec<PartKey>,
) -> (Vec<(PartKey, PartReq)>, bool) {
    let sessions = broker.fetch_sessions.borrow();
    match changed.and_then(|c| changed_keys(image, by_id, c)) {
        Some(keys) => (sessions.select(id, must.into_iter().chain(keys)), false),
        None => (sessions.all(id), true),
    }
}

/// Changed partitions as a session keys them (by topic id for Fetch v13+); `None` if
/// a changed topic has no id in the image (deleted: the session reads everything and
/// learns it).
fn changed_keys(
    image: &MetadataImage,
    by_id: bool,
    changed: Vec<ChangedPart>,
) -> Option<Vec<PartKey>> {
    changed
        .into_iter()
        .map(|(topic, p)| {
            let key = if by_id {
                TopicKey::Id(image.topics.get(&*topic)?.id)
            } else {
                TopicKey::Name(topic)
            };
            Some((key, p))
        })
        .collect()
}

/// KIP-392's rack-aware selection (Kafka's RackAwareReplicaSelector), made by the
/// partition's leader only: `None` (read from the leader) unless this broker leads, its
/// rack is not the consumer's, and a live in-sync replica is in the consumer's rack;
/// several such replicas share the partitions by partition number.
fn preferred_read_replica(
    image: &MetadataImage,
    me: i32,
    a: &PartitionState,
    client_rack: &str,
    partition: i32,
) -> Option<i32> {
    let in_rack = |id: &i32| {
        image
            .brokers
            .get(&NodeId::new(*id))
            .is_some_and(|b| !b.fenced && b.rack.as_deref() == Some(client_rack))
    };
    if a.leader != me || in_rack(&me) {
        return None;
    }
    let candidates: Vec<i32> = a
        .isr
        .iter()
        .copied()
        .filter(|r| *r != me && in_rack(r))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    Some(candidates[partition.unsigned_abs() as usize % candidates.len()])
}

/// Reads every slot; the answers, and for each whether records it had were left out
/// for the response's byte budget.
async fn read_all(
    broker: &Rc<Broker>,
    slots: &[Slot],
    max_bytes: usize,
    replica_id: NodeId,
    read_committed: bool,
) -> (Vec<ReadOut>, Vec<bool>) {
    let jobs: Vec<(ShardId, ReadItem)> = slots
        .iter()
        .filter_map(|s| {
            s.owner.map(|o| {
                (
                    o,
                    ReadItem {
                        topic: s.topic.clone(),
                        partition: s.partition,
                        offset: s.offset,
                        max_bytes: s.max_bytes.min(max_bytes),
                        replica_id,
                        current_leader_epoch: s.current_leader_epoch,
                        read_committed,
                    },
                )
            })
        })
        .collect();
    let mut results = broker
        .fan_out(
            jobs,
            |items| Read { items },
            |e| ReadOut {
                error: Some(error::from_mesh(e)),
                high_watermark: Offset::NONE,
                last_stable_offset: Offset::NONE,
                log_start_offset: Offset::NONE,
                ..Default::default()
            },
        )
        .await
        .into_iter();
    let mut outs: Vec<ReadOut> = slots
        .iter()
        .map(|s| match s.owner {
            Some(_) => results.next().expect("one result per job"),
            None => ReadOut {
                error: Some(ApiError::new(if s.unknown_id {
                    ResponseError::UnknownTopicId
                } else {
                    ResponseError::UnknownTopicOrPartition
                })),
                high_watermark: Offset::NONE,
                last_stable_offset: Offset::NONE,
                log_start_offset: Offset::NONE,
                ..Default::default()
            },
        })
        .collect();
    let pending = trim(&mut outs, max_bytes);
    (outs, pending)
}

/// Enforces the response-wide byte budget in request order; says which answers lost
/// their records to it.
fn trim(outs: &mut [ReadOut], max_bytes: usize) -> Vec<bool> {
    let mut used = 0usize;
    let mut dropped = vec![false; outs.len()];
    for (o, dropped) in outs.iter_mut().zip(dropped.iter_mut()) {
        let len = o.records.len();
        if len == 0 {
            continue;
        }
        if used == 0 || used + len <= max_bytes {
            used += len;
        } else {
            o.records = Bytes::new();
            *dropped = true;
        }
    }
    dropped
}

/// The records of one partition for a Fetch v0–v3 client: message sets of the magic the
/// version implies.
fn down_convert(version: i16, s: &Slot, o: &mut ReadOut) {
    if version < 10 && s.zstd_topic {
        *o = ReadOut {
            error: Some(ApiError::with(
                ResponseError::UnsupportedCompressionType,
                "the topic's compression.type is zstd, which Fetch before v10 cannot read",
            )),
            high_watermark: Offset::NONE,
            last_stable_offset: Offset::NONE,
            log_start_offset: Offset::NONE,
            ..Default::default()
        };
        return;
    }
    if version > 3 {
        return;
    }
    if !s.downconversion {
        *o = ReadOut {
            error: Some(ApiError::with(
                ResponseError::UnsupportedVersion,
                "message.downconversion.enable is false for this topic",
            )),
            high_watermark: Offset::NONE,
            last_stable_offset: Offset::NONE,
            log_start_offset: Offset::NONE,
            ..Default::default()
        };
        return;
    }
    if o.records.is_empty() || o.error.is_some() {
        return;
    }
    let magic = if version <= 1 { 0 } else { 1 };
    match message_set::down_convert(&o.records, magic, s.offset.get(), s.max_bytes) {
        Ok(set) => o.records = Bytes::from(set),
        Err(e) => {
            let code = match e {
                MessageSetError::Compressed(_) => ResponseError::UnsupportedCompressionType,
                _ => ResponseError::CorruptMessage,
            };
            o.records = Bytes::new();
            o.error = Some(ApiError::with(code, e.to_string()));
        }
    }
}

/// The response: every partition read for a full fetch (opening a session if asked
/// and there is room), only those with news for an incremental one.
#[allow(clippy::too_many_arguments)]
fn build_response(
    version: i16,
    slots: Vec<Slot>,
    outs: Vec<ReadOut>,
    pending: &[bool],
    context: &Context,
    feed: Option<FeedMark>,
    privileged: bool,
    sessions: &mut Cache,
) -> FetchResponse {
    let mut answered: Vec<(Slot, PartitionData, bool)> = slots
        .into_iter()
        .zip(outs)
        .zip(pending)
        .map(|((s, o), pending)| {
            let pd = partition_data(version, &s, o);
            (s, pd, *pending)
        })
        .collect();
    let session_id = match context {
        Context::Full => {
            let cached: Vec<_> = answered
                .iter()
                .map(|(s, pd, pending)| (s.key.clone(), s.req, part_resp(pd, *pending)))
                .collect();
            sessions.open(privileged, version >= 13, &cached, now_ms().max(0) as u64)
        }
        Context::Incremental { id, epoch, .. } => {
            let news: Vec<_> = answered
                .iter()
                .map(|(s, pd, pending)| (s.key.clone(), part_resp(pd, *pending)))
                .collect();
            match sessions.answered(*id, *epoch, &news, feed, now_ms().max(0) as u64) {
                Err(code) => return session_error(code).with_session_id(*id),
                Ok(Some(keep)) => {
                    let mut keep = keep.into_iter();
                    answered.retain(|_| keep.next().unwrap_or(true));
                }
                // Evicted meanwhile: everything is answered; the next request learns.
                Ok(None) => {}
            }
            *id
        }
        Context::Sessionless | Context::Error(_) => 0,
    };
    let mut topics: Vec<FetchableTopicResponse> = Vec::new();
    for (s, pd, _) in answered {
        match topics.last_mut() {
            Some(t) if *t.topic.0 == *s.topic && t.topic_id == s.topic_id => t.partitions.push(pd),
            // The name is copied into the response once per topic, not per partition.
            _ => topics.push(
                FetchableTopicResponse::default()
                    .with_topic(kafka_protocol::messages::TopicName(sb(&*s.topic)))
                    .with_topic_id(s.topic_id)
                    .with_partitions(vec![pd]),
            ),
        }
    }
    FetchResponse::default()
        .with_session_id(session_id)
        .with_responses(topics)
}

/// What a fetch session compares of one partition's answer.
fn part_resp(pd: &PartitionData, pending: bool) -> PartResp {
    PartResp {
        pending,
        high_watermark: Offset::new(pd.high_watermark),
        last_stable_offset: Offset::new(pd.last_stable_offset),
        log_start_offset: Offset::new(pd.log_start_offset),
        error: pd.error_code != 0,
        has_records: pd.records.as_ref().is_some_and(|r| !r.is_empty()),
        preferred_replica: pd.preferred_read_replica.0 >= 0,
    }
}

fn partition_data(version: i16, s: &Slot, mut o: ReadOut) -> PartitionData {
    // An error (the leader moved meanwhile) is answered without a redirect.
    let preferred = s.preferred.filter(|_| o.error.is_none());
    if s.preferred.is_some() {
        o.records = Bytes::new();
        o.aborted.clear();
    }
    down_convert(version, s, &mut o);
    PartitionData::default()
        .with_partition_index(s.partition)
        .with_error_code(o.error.as_ref().map(|e| e.code()).unwrap_or(0))
        .with_high_watermark(o.high_watermark.get())
        .with_last_stable_offset(o.last_stable_offset.get())
        .with_log_start_offset(o.log_start_offset.get())
        .with_aborted_transactions(o.aborted.is_empty().not().then(|| {
            o.aborted
                .iter()
                .map(|a| {
                    AbortedTransaction::default()
                        .with_producer_id(a.producer_id.into())
                        .with_first_offset(a.first_offset.get())
                })
                .collect()
        }))
        .with_preferred_read_replica(BrokerId(preferred.unwrap_or(-1)))
        .with_records(Some(o.records))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(n: usize) -> ReadOut {
        ReadOut {
            records: Bytes::from(vec![0u8; n]),
            ..Default::default()
        }
    }

    #[test]
    fn the_rack_aware_selector_names_an_in_sync_replica_in_the_consumers_rack() {
        use crate::base::metadata::BrokerMeta;
        let mut image = MetadataImage::new_cluster();
        for (id, rack, fenced) in [
            (1, "a", false),
            (2, "b", false),
            (3, "c", false),
            (4, "b", true),
        ] {
            let b = BrokerMeta {
                host: "h".into(),
                port: 1,
                fenced,
                rack: Some(rack.into()),
                endpoints: Vec::new(),
            };
            image.brokers.insert(NodeId::new(id), b);
        }
        let a = PartitionState {
            replicas: vec![1, 2, 3, 4],
            isr: vec![1, 2, 4],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
            slots: Vec::new(),
        };
        assert_eq!(preferred_read_replica(&image, 1, &a, "b", 0), Some(2));
        // The leader's own rack, a rack whose replica is out of sync, no such rack.
        assert_eq!(preferred_read_replica(&image, 1, &a, "a", 0), None);
        assert_eq!(preferred_read_replica(&image, 1, &a, "c", 0), None);
        assert_eq!(preferred_read_replica(&image, 1, &a, "z", 0), None);
        // Only the leader selects.
        assert_eq!(preferred_read_replica(&image, 2, &a, "b", 0), None);
    }

    #[test]
    fn trim_keeps_the_first_batch_and_respects_the_budget() {
        let mut v = vec![out(0), out(100), out(50), out(10)];
        assert_eq!(trim(&mut v, 60), vec![false, false, true, true]);
        let lens: Vec<usize> = v.iter().map(|o| o.records.len()).collect();
        assert_eq!(lens, vec![0, 100, 0, 0]);
        let mut v = vec![out(10), out(20), out(40)];
        assert_eq!(trim(&mut v, 35), vec![false, false, true]);
        let lens: Vec<usize> = v.iter().map(|o| o.records.len()).collect();
        assert_eq!(lens, vec![10, 20, 0]);
    }
}
