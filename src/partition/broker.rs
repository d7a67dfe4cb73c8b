//! The shard context and partition host: what one shard knows and owns — its
//! partition logs and their replica state, its copy of the metadata image, its end of
//! the cross-shard mesh — and the partition work that runs on a partition's home shard
//! (produce, read, wait, ListOffsets, DeleteRecords, OffsetForLeaderEpoch).
//!
//! A [`Broker`] lives on one shard (one executor thread) and is `Rc`-shared by that
//! shard's connections and tasks. A request that reaches another shard's partitions
//! fans out by owner over typed calls ([`crate::base::rpc`]) with [`Broker::fan_out`]; the
//! serving side is `crate::serve::dispatch`. Metadata changes run on shard 0 (the controller)
//! and reach every shard as a new image ([`Broker::apply`]).
//!
//! Layering: this module knows nothing of the controller, the group shell or the
//! replica fetchers above it. It tells them what happens to its partitions through
//! [`PartitionEvents`] subscribers installed at start-up (`crate::node`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::sync::Semaphore;
use kafka_protocol::error::ResponseError;
use sluice_protocol::{TopicPartition, TopicPartitionRef};
use sluice_replication::isr;
use sluice_shard::{Mesh, ShardId, ShardTable};
use sluice_storage::{batch, LogConfig, PartitionLog, Storage};

use crate::base::config::BrokerConfig;
use crate::base::error::{self, ApiError};
use crate::base::metadata::{MetadataImage, TopicMeta};
use crate::base::rpc::{
    Answer, Answered, Appended, ProduceItem, ReadItem, ReadOut, ShardCall, ShardReq, Wait,
};
use crate::base::topic_config::TopicConfig;
use crate::base::util::{any_true, join_all};
use crate::partition::replica::{CheckpointWriter, Fetchers, Replica};

/// What the partition host tells the layers above it. Subscribers are installed at
/// start-up (`crate::node`); every method has a do-nothing default.
pub trait PartitionEvents {
    /// This shard now follows `leader` for some partition and no fetcher of this shard
    /// fetches from it yet (the replica fetchers start one).
    fn follow(&self, _broker: &Rc<Broker>, _leader: i32) {}
    /// A leader here wants its ISR changed (the fetchers' layer proposes it).
    fn propose_isr(&self, _broker: &Rc<Broker>, _replica: &Rc<Replica>, _alter: isr::AlterIsr) {}
    /// The leader epoch of a partition on this shard changed (the group shell forgets
    /// the groups of a `__consumer_offsets` partition).
    fn leadership_changed(&self, _topic: &str, _partition: i32) {}
    /// A partition on this shard went offline after an I/O error (the fetchers' layer
    /// asks the controller to move its leadership and ISR membership elsewhere).
    fn partition_offline(&self, _broker: &Rc<Broker>, _topic: &str, _partition: i32) {}
}

/// A partition taken offline by an I/O error on its files.
struct Offline {
    cause: String,
    /// The failed log, closed by the first reopen attempt.
    failed: Option<Rc<PartitionLog>>,
    /// The layers above were told.
    announced: bool,
    /// The leader epoch this replica led in when its log failed. Followers may hold
    /// batches of that epoch its recovered log lost (a leader serves batches whose
    /// write is still running), so it reopens only once the metadata moved past that
    /// epoch (`Command::ReplicaOffline` bumps it) or another broker leads.
    led_in: Option<i32>,
    attempts: u32,
    next_attempt: Instant,
}

/// Reopen attempts of an offline partition: after this, doubling up to the maximum.
const OFFLINE_RETRY_FIRST: Duration = Duration::from_secs(1);
const OFFLINE_RETRY_MAX: Duration = Duration::from_secs(30);
/// New logs a shard opens at once when it adopts an image (see [`Broker::apply`]).
const NEW_LOGS_AT_ONCE: usize = 64;

fn offline_error(key: TopicPartitionRef<'_>, cause: &str) -> ApiError {
    ApiError::with(
        ResponseError::KafkaStorageError,
        format!(
            "{key} is offline after an I/O error ({cause}); it reopens by itself once its files can be read again"
        ),
    )
}

/// Per-shard limits, fixed at start-up.
#[derive(Debug, Clone, Copy)]
pub struct ShardLimits {
    /// Bytes of request frames a shard holds at once (all connections).
    pub request_bytes_max: u64,
    /// Bytes of request frames one connection holds at once (from reading a frame until
    /// its response is written).
    pub connection_request_bytes_max: u64,
    /// Requests one connection may have in flight (pipelined) before the broker stops
    /// reading from it.
    pub connection_inflight_max: usize,
    /// Open connections per shard.
    pub connections_max: u64,
}

pub struct Broker {
    pub config: BrokerConfig,
    pub shard: ShardId,
    pub table: ShardTable,
    pub mesh: Rc<Mesh<ShardReq, Answered>>,
    pub storage: Rc<Storage>,
    pub limits: ShardLimits,
    /// Admission budget for request bytes: the shard's backpressure on clients.
    pub request_bytes: Rc<Semaphore>,
    image: RefCell<Arc<MetadataImage>>,
    /// Looked up by a borrowed `TopicPartitionRef` (no allocation per request).
    logs: RefCell<HashMap<TopicPartition, Rc<PartitionLog>>>,
    /// The replica state of every log above.
    replicas: RefCell<HashMap<TopicPartition, Rc<Replica>>>,
    /// The shard's leader-epoch checkpoint writer, shared by its replicas.
    checkpoints: Rc<CheckpointWriter>,
    fetchers: Fetchers,
    /// Shard 0: the quorum state version whose image every shard has adopted.
    published_version: Cell<u64>,
    published: event_listener::Event,
    /// Parsed configs of every topic in `image`, swapped together with it.
    topic_configs: RefCell<HashMap<String, Rc<TopicConfig>>>,
    /// Serialises image changes on this shard.
    apply_lock: Semaphore,
    /// The layers above, told about partition events.
    subscribers: RefCell<Vec<Rc<dyn PartitionEvents>>>,
    /// Set by `close_all`: the shard is stopping and opens no more logs.
    closing: Cell<bool>,
    /// Partitions of this shard whose log failed, until they reopen.
    offline: RefCell<BTreeMap<TopicPartition, Offline>>,
    /// The data directory's free space: client appends are refused below its minimum.
    pub disk: Rc<crate::partition::disk::DiskWatch>,
    /// The process's metrics: this shard writes its own counters there.
    pub metrics: Arc<crate::observe::metrics::Registry>,
    /// This shard's incremental fetch sessions (KIP-227): a connection's fetches are
    /// handled on its shard, so its session lives there.
    pub fetch_sessions: RefCell<crate::base::fetch_session::Cache>,
}

impl Broker {
    pub fn new(
        config: BrokerConfig,
        mesh: Rc<Mesh<ShardReq, Answered>>,
        storage: Rc<Storage>,
        limits: ShardLimits,
        metrics: Arc<crate::observe::metrics::Registry>,
    ) -> Broker {
        let shard = mesh.id();
        let shards = mesh.shard_count();
        Broker {
            metrics,
            table: ShardTable::new(mesh.shard_count()),
            shard,
            mesh,
            storage,
            request_bytes: Rc::new(Semaphore::new(limits.request_bytes_max)),
            limits,
            image: RefCell::new(Arc::new(MetadataImage {
                epoch: 0,
                cluster_id: String::new(),
                topics: BTreeMap::new(),
                brokers: BTreeMap::new(),
                controller_id: -1,
                registered: false,
                broker_configs: BTreeMap::new(),
            })),
            logs: RefCell::new(HashMap::new()),
            replicas: RefCell::new(HashMap::new()),
            checkpoints: Rc::default(),
            fetchers: Fetchers::default(),
            published_version: Cell::new(0),
            published: event_listener::Event::new(),
            topic_configs: RefCell::new(HashMap::new()),
            apply_lock: Semaphore::new(1),
            subscribers: RefCell::new(Vec::new()),
            closing: Cell::new(false),
            offline: RefCell::new(BTreeMap::new()),
            fetch_sessions: RefCell::new(crate::base::fetch_session::Cache::new(
                config
                    .max_incremental_fetch_session_cache_slots
                    .div_ceil(shards),
                crate::base::fetch_session::EVICTION_MS,
                shard.0 as u32,
                shards as u32,
            )),
            disk: Rc::new(crate::partition::disk::DiskWatch::new(
                &config.data_dir,
                config.disk_min_free,
            )),
            config,
        }
    }

    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// The home shard of a partition of a topic in the current image: by this broker's
    /// slot of its replica, else hashed ([`TopicMeta::owner`]). The publisher keeps a
    /// published partition's slots (`MetadataImage::keep_slots_of`), so its owner never
    /// changes while the process runs.
    pub fn owner(&self, topic: &TopicMeta, partition: i32) -> ShardId {
        topic.owner(&self.table, self.config.node_id, partition)
    }

    /// Installs a subscriber to partition events (start-up only).
    pub fn subscribe(&self, subscriber: Rc<dyn PartitionEvents>) {
        self.subscribers.borrow_mut().push(subscriber);
    }

    fn each_subscriber(&self, f: impl Fn(&dyn PartitionEvents)) {
        let subs: Vec<_> = self.subscribers.borrow().clone();
        for s in subs {
            f(&*s);
        }
    }

    /// Makes a typed call to `shard` (this one included).
    pub async fn call<C: ShardCall>(
        &self,
        shard: ShardId,
        call: C,
    ) -> Result<C::Reply, sluice_shard::MeshError> {
        self.call_then(shard, call, || {}).await
    }

    /// [`Self::call`]; `sent` runs once the call has its place in `shard`'s order
    /// (`sluice_shard::Mesh::call_then`).
    pub async fn call_then<C: ShardCall>(
        &self,
        shard: ShardId,
        call: C,
        sent: impl FnOnce(),
    ) -> Result<C::Reply, sluice_shard::MeshError> {
        let (answer, reply) = Answer::new();
        self.mesh
            .call_then(shard, call.into_request(answer), sent)
            .await?;
        reply.take().ok_or(sluice_shard::MeshError::NoReply(shard))
    }

    /// OffsetForLeaderEpoch on this shard's partitions.
    pub fn epoch_end_local(
        &self,
        items: Vec<(String, i32, i32, i32)>,
    ) -> Vec<Result<(i32, i64), ApiError>> {
        items
            .into_iter()
            .map(|(t, p, current, epoch)| {
                // An offline partition has no replica state left here: as Kafka, a
                // storage error, not NOT_LEADER_OR_FOLLOWER.
                let key = TopicPartitionRef::new(&t, p);
                if let Some(o) = self.offline.borrow().get(key.key()) {
                    return Err(offline_error(key, &o.cause));
                }
                self.replica(&t, p)
                    .and_then(|r| r.epoch_end(current, epoch))
            })
            .collect()
    }

    /// Sends `items` to their home shards (grouped, one message per shard, all shards
    /// concurrently) and returns the replies in the order of `items`.
    pub async fn fan_out<T, R, C: ShardCall<Reply = Vec<R>>>(
        &self,
        items: Vec<(ShardId, T)>,
        make: impl Fn(Vec<T>) -> C,
        on_error: impl Fn(&sluice_shard::MeshError) -> R,
    ) -> Vec<R> {
        self.fan_out_then(items, make, on_error, || {}).await
    }

    /// [`Self::fan_out`]; `issued` runs once every shard's message has its place in
    /// that shard's order ([`Self::call_then`]), long before the replies come: a
    /// produce request then lets the next one of its connection go
    /// ([`crate::base::util::Sequencer`]).
    pub async fn fan_out_then<T, R, C: ShardCall<Reply = Vec<R>>>(
        &self,
        items: Vec<(ShardId, T)>,
        make: impl Fn(Vec<T>) -> C,
        on_error: impl Fn(&sluice_shard::MeshError) -> R,
        issued: impl FnOnce(),
    ) -> Vec<R> {
        let n = items.len();
        let mut groups: BTreeMap<ShardId, (Vec<usize>, Vec<T>)> = BTreeMap::new();
        for (i, (shard, item)) in items.into_iter().enumerate() {
            let g = groups.entry(shard).or_default();
            g.0.push(i);
            g.1.push(item);
        }
        let unsent = Cell::new(groups.len());
        let issued = Cell::new(Some(issued));
        let mut order = Vec::with_capacity(groups.len());
        let mut calls = Vec::with_capacity(groups.len());
        let one_sent = || {
            unsent.set(unsent.get() - 1);
            if unsent.get() == 0 {
                if let Some(f) = issued.take() {
                    f();
                }
            }
        };
        if groups.is_empty() {
            if let Some(f) = issued.take() {
                f();
            }
        }
        for (shard, (idx, its)) in groups {
            order.push(idx);
            calls.push(self.call_then(shard, make(its), one_sent));
        }
        let replies = join_all(calls).await;
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        for (idx, reply) in order.into_iter().zip(replies) {
            match reply {
                Ok(rs) => {
                    assert_eq!(rs.len(), idx.len(), "a shard answers every item");
                    for (i, r) in idx.into_iter().zip(rs) {
                        out[i] = Some(r);
                    }
                }
                Err(e) => {
                    for i in idx {
                        out[i] = Some(on_error(&e));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every item answered"))
            .collect()
    }

    /// The shape every per-partition request shares (ListOffsets, DeleteRecords,
    /// OffsetForLeaderEpoch): each requested partition of a known topic goes to its
    /// home shard as one item (all shards at once); unknown ones are answered
    /// UNKNOWN_TOPIC_OR_PARTITION without reaching a shard. Results come back per
    /// topic, in request order.
    pub async fn per_partition<K, T, R, C: ShardCall<Reply = Vec<Result<R, ApiError>>>>(
        &self,
        request: Vec<(K, Vec<(i32, T)>)>,
        topic: impl Fn(&K) -> &str,
        make: impl Fn(Vec<T>) -> C,
    ) -> Vec<(K, Vec<(i32, Result<R, ApiError>)>)> {
        let image = self.image();
        let mut jobs = Vec::new();
        let mut shape = Vec::with_capacity(request.len());
        for (key, parts) in request {
            let meta = image.topics.get(topic(&key));
            let mut slots = Vec::with_capacity(parts.len());
            for (p, item) in parts {
                match meta.filter(|m| (0..m.partitions).contains(&p)) {
                    Some(m) => {
                        jobs.push((self.owner(m, p), item));
                        slots.push((p, None));
                    }
                    None => slots.push((
                        p,
                        Some(ApiError::new(ResponseError::UnknownTopicOrPartition)),
                    )),
                }
            }
            shape.push((key, slots));
        }
        let mut results = self
            .fan_out(jobs, make, |e| Err(error::from_mesh(e)))
            .await
            .into_iter();
        shape
            .into_iter()
            .map(|(key, slots)| {
                let answered = slots
                    .into_iter()
                    .map(|(p, err)| match err {
                        Some(e) => (p, Err(e)),
                        None => (p, results.next().expect("one result per job")),
                    })
                    .collect();
                (key, answered)
            })
            .collect()
    }

    /// The open log of a partition this shard owns.
    pub(crate) fn log(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<(Rc<PartitionLog>, Rc<TopicConfig>), ApiError> {
        let image = self.image();
        let meta = image
            .topics
            .get(topic)
            .filter(|t| (0..t.partitions).contains(&partition))
            .ok_or_else(|| ApiError::new(ResponseError::UnknownTopicOrPartition))?;
        assert_eq!(
            self.owner(meta, partition),
            self.shard,
            "partition routed to its home shard"
        );
        let key = TopicPartitionRef::new(topic, partition);
        let log = self.logs.borrow().get(key.key()).cloned();
        let me = self.config.node_id;
        let log = log.ok_or_else(|| match self.offline.borrow().get(key.key()) {
            Some(o) => offline_error(key, &o.cause),
            // Not a replica here: the client must ask the leader (as Kafka answers).
            None if meta
                .assignment(partition)
                .is_some_and(|a| !a.replicas.contains(&me)) =>
            {
                ApiError::with(
                    ResponseError::NotLeaderOrFollower,
                    format!("broker {me} holds no replica of {topic}-{partition}"),
                )
            }
            None => ApiError::with(
                ResponseError::KafkaStorageError,
                format!("log of {topic}-{partition} is not open on {}", self.shard),
            ),
        })?;
        if let Some(cause) = log.failure() {
            return Err(self.take_offline(key, cause));
        }
        let tc = self.topic_configs.borrow().get(topic).cloned();
        let tc = tc.ok_or_else(|| {
            ApiError::with(
                ResponseError::KafkaStorageError,
                format!("config of {topic} is not loaded on {}", self.shard),
            )
        })?;
        Ok((log, tc))
    }

    /// The replica state of a partition this shard owns.
    pub fn replica(&self, topic: &str, partition: i32) -> Result<Rc<Replica>, ApiError> {
        self.replicas
            .borrow()
            .get(TopicPartitionRef::new(topic, partition).key())
            .cloned()
            .ok_or_else(|| {
                ApiError::with(
                    ResponseError::NotLeaderOrFollower,
                    format!(
                        "broker {} holds no replica of {topic}-{partition}",
                        self.config.node_id
                    ),
                )
            })
    }

    /// Every replica on this shard.
    pub fn replicas(&self) -> Vec<Rc<Replica>> {
        self.replicas.borrow().values().cloned().collect()
    }

    /// This shard's own metrics counters.
    pub fn shard_metrics(&self) -> &crate::observe::metrics::ShardMetrics {
        self.metrics.shard(self.shard.0)
    }

    /// Every partition replica of this shard as the metrics endpoint shows it (offline
    /// ones included), and the producer ids their logs remember.
    pub fn partition_stats(&self) -> (Vec<crate::observe::metrics::PartitionStat>, u64) {
        use crate::observe::metrics::PartitionStat;
        let mut out = Vec::new();
        let mut producers = 0u64;
        for r in self.replicas.borrow().values() {
            let (leader, isr, replicas) = match &*r.role() {
                crate::partition::replica::Role::Leader(l) => {
                    (true, l.isr().len(), l.replicas().len())
                }
                _ => (false, 0, 0),
            };
            producers += r.log.active_producers().len() as u64;
            out.push(PartitionStat {
                topic: r.topic.clone(),
                partition: r.partition,
                leader,
                high_watermark: r.high_watermark(),
                log_start_offset: r.log.log_start_offset(),
                log_end_offset: r.log.log_end_offset(),
                size_bytes: r.log.size_bytes(),
                isr_size: isr,
                replicas,
                under_replicated: leader && isr < replicas,
                offline: false,
            });
        }
        for key in self.offline.borrow().keys() {
            out.push(PartitionStat {
                topic: key.topic().to_string(),
                partition: key.partition(),
                leader: false,
                high_watermark: 0,
                log_start_offset: 0,
                log_end_offset: 0,
                size_bytes: 0,
                isr_size: 0,
                replicas: 0,
                under_replicated: false,
                offline: true,
            });
        }
        (out, producers)
    }

    /// A follower fetcher found nothing left to fetch from `leader` and stopped.
    pub fn fetcher_stopped(&self, leader: i32) {
        self.fetchers.release(leader);
    }

    /// Wakes the running fetcher for `leader` when a partition joins it.
    pub fn fetcher_wake(&self, leader: i32) -> Option<Rc<crate::partition::replica::FetcherWake>> {
        self.fetchers.wake(leader)
    }

    /// min.insync.replicas of a partition: the topic's setting, else min(2, replicas).
    fn min_insync(&self, topic: &str, partition: i32, tc: &TopicConfig) -> usize {
        let image = self.image();
        let Some(meta) = image.topics.get(topic) else {
            return 1;
        };
        let set = meta.configs.contains_key("min.insync.replicas")
            || image
                .dynamic_broker_config(self.config.node_id, "min.insync.replicas")
                .is_some();
        if set {
            return tc.min_insync_replicas.max(1) as usize;
        }
        meta.assignment(partition)
            .map_or(1, |a| a.replicas.len().min(2))
    }

    /// Appends `records` to a partition this shard leads as acks=all would.
    pub async fn append_replicated(
        &self,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> Result<(), ApiError> {
        let item = ProduceItem {
            topic: topic.to_string(),
            partition,
            records,
            transactional_id: None,
        };
        self.produce_inner(-1, Duration::from_secs(5), item, true)
            .await
            .map(|_| ())
    }

    /// Produce from a client: batches are judged against the partition's producer state.
    pub async fn produce_local(
        &self,
        acks: i16,
        timeout: Duration,
        item: ProduceItem,
    ) -> Result<Appended, ApiError> {
        self.produce_inner(acks, timeout, item, false).await
    }

    /// `trusted`: the broker's own coordinators write (their transactional batches carry
    /// no sequence), appended without the producer checks.
    async fn produce_inner(
        &self,
        acks: i16,
        timeout: Duration,
        item: ProduceItem,
        trusted: bool,
    ) -> Result<Appended, ApiError> {
        let (log, tc) = self.log(&item.topic, item.partition)?;
        let replica = self.replica(&item.topic, item.partition)?;
        // Taken before the first await, so turns follow the order requests arrived in.
        let turn = replica.append_turn();
        turn.wait().await;
        let mut turn = Some(turn);
        let min_insync = self.min_insync(&item.topic, item.partition, &tc);
        let epoch = if acks == -1 {
            replica.check_min_isr(min_insync)?
        } else {
            replica.leader_epoch().ok_or_else(|| {
                ApiError::with(
                    ResponseError::NotLeaderOrFollower,
                    "this broker is not the leader of the partition",
                )
            })?
        };
        // The epoch's checkpoint entry is durable before its first batch (immediate
        // unless the epoch just began); a failed checkpoint fails the partition.
        replica.epochs_durable().await?;
        // The coordinators' own writes (offsets, transaction state) use the reserve.
        if !trusted {
            self.disk.admit(item.records.len())?;
        }
        let batches = batch::split_batches(&item.records)
            .map_err(|e| error::from_storage(&sluice_storage::Error::Batch(e)))?;
        if batches.is_empty() {
            return Err(ApiError::with(
                ResponseError::CorruptMessage,
                "produce request holds no record batch",
            ));
        }
        let (max, limit) = match trusted {
            true => (INTERNAL_BATCH_BYTES_MAX, "the internal batch limit"),
            false => (tc.log.max_message_bytes, "max.message.bytes"),
        };
        if let Some((_, r)) = batches.iter().find(|(_, r)| r.len() > max) {
            return Err(ApiError::with(
                ResponseError::MessageTooLarge,
                format!("batch of {} bytes is larger than {limit} {max}", r.len()),
            ));
        }
        // Per-record rules (KIP-467) fail the whole write before any batch is appended.
        // The coordinators' own writes are trusted.
        if !trusted {
            let bytes = batches.iter().map(|(_, r)| &item.records[r.clone()]);
            let rules = crate::base::record_rules::Rules {
                compacted: tc.log.cleanup_compact,
                create_time: tc.log.timestamp_type == sluice_storage::TimestampType::CreateTime,
                before_max_ms: tc.timestamp_before_max_ms,
                after_max_ms: tc.timestamp_after_max_ms,
                now_ms: crate::base::util::now_ms(),
            };
            crate::base::record_rules::check(&item.topic, item.partition, &rules, bytes)?;
        }
        // The topic's compression.type: a batch with another codec is recompressed
        // (CPU bounded by max.message.bytes per batch; the reactor may run others
        // between batches).
        let mut stored = Vec::with_capacity(batches.len());
        for (_, range) in batches {
            let sent = item.records.slice(range);
            let recompressed = match trusted {
                true => None,
                false => crate::base::record_rules::stored_form(
                    &item.topic,
                    item.partition,
                    tc.compression,
                    tc.compression_levels,
                    &sent,
                )?,
            };
            match recompressed {
                Some(b) if b.len() > max => {
                    return Err(ApiError::with(
                        ResponseError::MessageTooLarge,
                        format!(
                            "batch recompressed with compression.type is {} bytes, larger than max.message.bytes {max}",
                            b.len()
                        ),
                    ))
                }
                Some(b) => {
                    stored.push(Bytes::from(b));
                    glommio::yield_if_needed().await;
                }
                None => stored.push(sent),
            }
        }
        let mut first: Option<sluice_storage::AppendInfo> = None;
        let mut last_offset = 0;
        let gap_deadline = Instant::now() + timeout.min(SEQUENCE_GAP_WAIT);
        let mut writes = Vec::with_capacity(stored.len());
        for batch in &stored {
            let info = if trusted {
                log.append_bounded(batch, epoch, INTERNAL_BATCH_BYTES_MAX)
                    .await
                    .map_err(|e| error::from_storage(&e))?
            } else {
                let started = Instant::now();
                let (info, staged) =
                    append_in_sequence(&log, &replica, batch, epoch, gap_deadline, &mut turn)
                        .await?;
                writes.extend(staged.map(|s| (started, s)));
                let m = self.shard_metrics();
                crate::observe::metrics::ShardMetrics::add(
                    &m.records_in,
                    info.record_count.max(0) as u64,
                );
                info
            };
            last_offset = info.last_offset;
            first.get_or_insert(info);
        }
        // Offsets assigned: the next request's appends may go, and join the write in
        // flight's successor while this request waits for its own (group commit).
        drop(turn);
        for (started, staged) in writes {
            log.written(staged)
                .await
                .map_err(|e| error::from_storage(&e))?;
            self.shard_metrics()
                .append_latency
                .record(started.elapsed());
        }
        // "Acknowledged means on disk": wait for the topic's flush policy (fdatasync by
        // default) before answering or counting it replicated. acks=0 flushes too: only
        // durable data is replicated and becomes visible below the high watermark.
        // Refused if leadership moved meanwhile (the append will be truncated away).
        replica.flush(epoch).await?;
        if acks == -1 {
            replica
                .wait_acked(last_offset + 1, epoch, min_insync, timeout)
                .await?;
        }
        let first = first.expect("at least one batch");
        Ok(Appended {
            base_offset: first.base_offset,
            log_append_time_ms: first.log_append_time_ms,
            log_start_offset: log.log_start_offset(),
        })
    }

    /// Writes a transaction marker on a partition this broker leads (WriteTxnMarkers
    /// from a transaction coordinator) and waits until the in-sync replicas have it,
    /// as Kafka appends markers with acks=all.
    pub async fn write_marker_local(
        &self,
        it: &crate::base::rpc::MarkerItem,
    ) -> Result<(), ApiError> {
        let (log, tc) = self.log(&it.topic, it.partition)?;
        let replica = self.replica(&it.topic, it.partition)?;
        let min_insync = self.min_insync(&it.topic, it.partition, &tc);
        let epoch = replica.check_min_isr(min_insync)?;
        replica.epochs_durable().await?;
        let judged = log
            .append_marker(
                it.producer_id,
                it.producer_epoch,
                it.commit,
                it.coordinator_epoch,
                epoch,
            )
            .await
            .map_err(|e| error::from_storage(&e))?;
        // Producers verifying their first transactional batch here look at this.
        replica.markers.set(replica.markers.get() + 1);
        let last_offset = match judged {
            sluice_storage::Judged::Appended(info) => info.last_offset,
            sluice_storage::Judged::Duplicate(meta) => meta.last_offset,
            sluice_storage::Judged::Refused(e) => return Err(error::from_txn(&e)),
        };
        replica.appended.notify(usize::MAX);
        replica.flush(epoch).await?;
        replica
            .wait_acked(last_offset + 1, epoch, min_insync, Duration::from_secs(10))
            .await?;
        Ok(())
    }

    pub async fn read_local(self: &Rc<Self>, item: ReadItem) -> ReadOut {
        let failed = |e: ApiError| ReadOut {
            error: Some(e),
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            ..Default::default()
        };
        // One lookup: a partition with a replica here has its log open (`apply` and
        // `take_offline` add and remove the two together). A follower's fetch reads
        // every partition of its session, thousands per fetch at scale, so `log`'s
        // lookups (image, topic, log, config) are left to the partitions that fail.
        let replica = match self.replica(&item.topic, item.partition) {
            Ok(r) => r,
            Err(e) => return failed(self.log(&item.topic, item.partition).err().unwrap_or(e)),
        };
        let log = replica.log.clone();
        if let Some(cause) = log.failure() {
            let key = TopicPartitionRef::new(&item.topic, item.partition);
            return failed(self.take_offline(key, cause));
        }
        let (bound, hw, alter) =
            match replica.fetch_bound(item.replica_id, item.current_leader_epoch, item.offset) {
                Ok(x) => x,
                // The log start tells a follower below it where to resume.
                Err(e) => {
                    return ReadOut {
                        log_start_offset: log.log_start_offset(),
                        ..failed(e)
                    }
                }
            };
        if let Some(alter) = alter {
            self.each_subscriber(|s| s.propose_isr(self, &replica, alter.clone()));
        }
        // Kafka's last stable offset: below the first offset of any open transaction.
        let lso = log.first_unstable_offset().map_or(hw, |u| u.min(hw));
        let bound = if item.read_committed {
            bound.min(lso)
        } else {
            bound
        };
        // Nothing new to read (most partitions of a fetch session most of the time):
        // what the read would answer, without it. Below the log start the read answers
        // OFFSET_OUT_OF_RANGE.
        let log_start = log.log_start_offset();
        if item.offset == bound && item.offset >= log_start {
            return ReadOut {
                error: None,
                high_watermark: hw,
                last_stable_offset: lso,
                log_start_offset: log_start,
                records: Bytes::new(),
                aborted: Vec::new(),
            };
        }
        match log
            .read(item.offset, item.max_bytes.max(1), Some(bound))
            .await
        {
            Ok(r) => {
                let aborted = if item.read_committed && !r.records.is_empty() {
                    log.aborted_transactions(item.offset, r.next_offset)
                } else {
                    Vec::new()
                };
                ReadOut {
                    error: None,
                    high_watermark: hw,
                    last_stable_offset: lso,
                    log_start_offset: r.log_start_offset,
                    records: r.records,
                    aborted,
                }
            }
            Err(e) => ReadOut {
                error: Some(error::from_storage(&e)),
                high_watermark: hw,
                last_stable_offset: lso,
                log_start_offset: log.log_start_offset(),
                ..Default::default()
            },
        }
    }

    /// Waits until any partition's visible end (log end for a follower, high
    /// watermark for a consumer) passes its offset, or the timeout (see
    /// [`crate::base::util::wait_any`]: no progress between the check and the wait is missed).
    pub async fn wait_local(
        &self,
        items: Vec<(String, i32, i64)>,
        timeout: Duration,
        follower: bool,
        read_committed: bool,
    ) -> bool {
        let replicas: Vec<_> = items
            .iter()
            .filter_map(|(t, p, offset)| Some((self.replica(t, *p).ok()?, *offset)))
            .collect();
        let mut conditions: Vec<crate::base::util::Condition<'_>> = Vec::new();
        for (r, offset) in &replicas {
            if follower {
                // Woken by the append itself, not its write (see `Replica::fetch_bound`),
                // and by `progress`, which also fires when the role changes.
                for event in [r.log.append_event(), &r.progress] {
                    conditions.push((event, Box::new(move || r.log.log_end_offset() > *offset)));
                }
                continue;
            }
            let holds: Box<dyn Fn() -> bool> = Box::new(move || {
                let visible = if read_committed {
                    // The last stable offset moves only with a marker, whose
                    // replication moves the high watermark: `progress` fires.
                    let hw = r.high_watermark();
                    r.log.first_unstable_offset().map_or(hw, |u| u.min(hw))
                } else {
                    r.high_watermark()
                };
                visible > *offset
            });
            conditions.push((&r.progress, holds));
        }
        crate::base::util::wait_any(conditions, timeout).await
    }

    pub async fn list_offset_local(
        &self,
        topic: String,
        partition: i32,
        ts: i64,
        current_leader_epoch: i32,
        read_committed: bool,
    ) -> Result<(i64, i64, i32), ApiError> {
        let (log, _) = self.log(&topic, partition)?;
        let replica = self.replica(&topic, partition)?;
        let (offset, timestamp) = self
            .list_offset_of(&log, &replica, ts, current_leader_epoch, read_committed)
            .await?;
        // Kafka answers the leader epoch of the record found (`epochForOffset`, a
        // batch's epoch), and the current one for "latest".
        let epoch = match (ts, offset) {
            (_, -1) => -1,
            (-1, _) => replica.leader_epoch().unwrap_or(-1),
            _ => replica.epoch_of(offset),
        };
        Ok((offset, timestamp, epoch))
    }

    /// [`Self::list_offset_local`]'s offset and timestamp.
    async fn list_offset_of(
        &self,
        log: &Rc<PartitionLog>,
        replica: &Rc<Replica>,
        ts: i64,
        current_leader_epoch: i32,
        read_committed: bool,
    ) -> Result<(i64, i64), ApiError> {
        let (_, hw, _) = replica.fetch_bound(-1, current_leader_epoch, 0)?;
        // A new leader's high watermark below its epoch's start is older than what the
        // previous leader answered: "latest", and a lookup it hides, would go back.
        let lagging = replica.high_watermark_lags_epoch_start().then(|| {
            ApiError::with(
                ResponseError::OffsetNotAvailable,
                format!("the high watermark {hw} lags the start of this leader's epoch"),
            )
        });
        // read_committed: "latest" is the last stable offset.
        let hw = if read_committed {
            log.first_unstable_offset().map_or(hw, |u| u.min(hw))
        } else {
            hw
        };
        match ts {
            // Earliest, and earliest-local (-4, v8): the same without tiered storage.
            -2 | -4 => Ok((log.log_start_offset(), -1)),
            // Latest is the high watermark.
            -1 => lagging.map_or(Ok((hw, -1)), Err),
            // Max-timestamp (KIP-734): the first record with the largest timestamp, if
            // it is below the high watermark, as the search by timestamp below.
            -3 => match log.max_timestamp() {
                -1 => lagging.map_or(Ok((-1, -1)), Err),
                max => self.offset_at_timestamp(log, max, hw, lagging).await,
            },
            ts if ts < 0 => Err(ApiError::with(
                ResponseError::InvalidRequest,
                format!("bad timestamp {ts}"),
            )),
            ts => self.offset_at_timestamp(log, ts, hw, lagging).await,
        }
    }

    /// ListOffsets v0's view of a partition's log (see [`crate::base::rpc::SegmentTimes`]),
    /// as Kafka builds it: a leader answers (any replica if not `leader_only`).
    pub fn offsets_before_local(
        &self,
        topic: &str,
        partition: i32,
        leader_only: bool,
    ) -> Result<crate::base::rpc::SegmentTimes, ApiError> {
        let (log, _) = self.log(topic, partition)?;
        let replica = self.replica(topic, partition)?;
        let high_watermark = match replica.fetch_bound(-1, -1, 0) {
            Ok((_, hw, _)) => Some(hw),
            Err(e) if leader_only => return Err(e),
            Err(_) => None,
        };
        let start = log.log_start_offset();
        let segments = log.segment_times();
        let mut offset_times: Vec<(i64, i64)> = segments
            .iter()
            .map(|&(base, _, modified)| (base.max(start), modified))
            .collect();
        if segments.last().is_some_and(|&(_, size, _)| size > 0) {
            offset_times.push((log.log_end_offset(), crate::base::util::now_ms()));
        }
        Ok(crate::base::rpc::SegmentTimes {
            offset_times,
            high_watermark,
        })
    }

    /// The first record at or after timestamp `ts` below `hw`; else `lagging` (the
    /// answer while a new leader's high watermark lags its epoch, see
    /// [`Replica::high_watermark_lags_epoch_start`]) or (-1, -1).
    async fn offset_at_timestamp(
        &self,
        log: &PartitionLog,
        ts: i64,
        hw: i64,
        lagging: Option<ApiError>,
    ) -> Result<(i64, i64), ApiError> {
        match log.offset_for_timestamp(ts).await {
            Ok(Some((o, t))) if o < hw => Ok((o, t)),
            Ok(Some(_)) | Ok(None) => lagging.map_or(Ok((-1, -1)), Err),
            Err(e) => Err(error::from_storage(&e)),
        }
    }

    pub async fn delete_records_local(
        &self,
        topic: String,
        partition: i32,
        offset: i64,
    ) -> Result<i64, ApiError> {
        let (log, _) = self.log(&topic, partition)?;
        let (_, end, _) = self.replica(&topic, partition)?.fetch_bound(-1, -1, 0)?;
        // As Kafka (`Partition.deleteRecordsOnLeader`): only a log whose cleanup.policy
        // deletes may lose records on request (a compacted-only log, such as the group
        // offsets', keeps its latest record per key).
        if !log.config().cleanup_delete {
            return Err(ApiError::with(
                ResponseError::PolicyViolation,
                format!("Records of partition {topic}-{partition} can not be deleted due to the configured policy"),
            ));
        }
        let offset = if offset == -1 { end } else { offset };
        if offset < 0 || offset > end {
            return Err(ApiError::with(
                ResponseError::OffsetOutOfRange,
                format!("offset {offset} is beyond the high watermark {end}"),
            ));
        }
        log.delete_records_before(offset)
            .await
            .map_err(|e| error::from_storage(&e))
    }

    /// Adopts a new metadata image: opens logs of partitions this shard now owns, applies
    /// config changes, and deletes the logs of topics that are gone. New logs open
    /// before the image is published, so a client that sees a topic can use it.
    pub async fn apply(self: &Rc<Self>, image: Arc<MetadataImage>) {
        let Some(_guard) = self.opening_logs().await else {
            return;
        };
        let old = self.image();
        if image.epoch < old.epoch || (image.epoch == old.epoch && !old.cluster_id.is_empty()) {
            return;
        }
        // A topic whose id changed was deleted and re-created: its old logs must go
        // before the new ones open in the same directories. Topics simply removed keep
        // their logs until the new image is published (so no request finds a topic
        // whose log is already gone), and lose them right after.
        let (recreated, removed): (Vec<String>, Vec<String>) = old
            .topics
            .iter()
            .filter(|(name, t)| image.topics.get(*name).is_none_or(|n| n.id != t.id))
            .map(|(name, _)| name.clone())
            .partition(|name| image.topics.contains_key(name));
        self.delete_logs_of(&recreated).await;
        let mut configs = HashMap::with_capacity(image.topics.len());
        let mut to_open: Vec<(Arc<str>, i32, LogConfig)> = Vec::new();
        let me = self.config.node_id;
        for (name, meta) in &image.topics {
            // The topic's own configs over the dynamic broker defaults.
            let effective =
                crate::base::broker_configs::effective_topic_configs(&image, me, &meta.configs);
            let tc = match TopicConfig::parse(&effective) {
                Ok(tc) => tc,
                Err(e) => {
                    tracing::error!(topic = %name, error = %e, "stored topic config does not parse; using defaults");
                    TopicConfig::parse(&BTreeMap::new()).expect("defaults parse")
                }
            };
            let tc = Rc::new(tc);
            configs.insert(name.clone(), tc.clone());
            // The name, shared by the keys of the partitions opened below.
            let mut topic: Option<Arc<str>> = None;
            for p in 0..meta.partitions {
                if self.owner(meta, p) != self.shard {
                    continue;
                }
                let me = self.config.node_id;
                let Some(assignment) = meta.assignment(p) else {
                    continue;
                };
                if !assignment.replicas.contains(&me) {
                    continue;
                }
                let key = TopicPartitionRef::new(name, p);
                if self.offline.borrow().contains_key(key.key()) {
                    continue; // `tend_offline` reopens it
                }
                let existing = self.logs.borrow().get(key.key()).cloned();
                match existing {
                    Some(log) => {
                        if log.config() != tc.log {
                            if let Err(e) = log.set_config(tc.log.clone()) {
                                tracing::error!(topic = %name, partition = p, error = %e, "config change refused");
                            }
                        }
                    }
                    None => {
                        let topic = topic.get_or_insert_with(|| Arc::from(name.as_str()));
                        to_open.push((topic.clone(), p, tc.log.clone()));
                    }
                }
            }
        }
        // New logs open side by side (each creates its directory and files, with their
        // syncs): one at a time, a broker adopting a topic of thousands of partitions
        // (or thousands of topics) waited for each in turn.
        for chunk in to_open.chunks(NEW_LOGS_AT_ONCE) {
            let opens = chunk.iter().map(|(topic, p, config)| async move {
                let dir = format!("{topic}-{p}");
                (topic, *p, self.storage.open_log(&dir, config.clone()).await)
            });
            for (topic, p, opened) in join_all(opens).await {
                match opened {
                    Ok(log) => {
                        tracing::debug!(shard = self.shard.0, topic = %topic, partition = p, "opened log");
                        let replica = Replica::open(topic, p, log.clone(), &self.checkpoints);
                        let key = TopicPartition::new(topic.clone(), p);
                        self.replicas.borrow_mut().insert(key.clone(), replica);
                        self.logs.borrow_mut().insert(key, log);
                    }
                    Err(e) => {
                        tracing::error!(topic = %topic, partition = p, error = %e, "cannot open log")
                    }
                }
            }
        }
        // Roles follow the committed assignments (leader epochs, ISR).
        if image.registered {
            for (key, replica) in self.replicas.borrow().iter() {
                self.adopt_role(&image, key.topic(), key.partition(), replica);
            }
        }
        *self.image.borrow_mut() = image;
        *self.topic_configs.borrow_mut() = configs;
        self.delete_logs_of(&removed).await;
        self.check_invariants();
    }

    /// Gives a replica the role its committed assignment in `image` says (leader
    /// epoch, ISR, whom to follow).
    fn adopt_role(
        self: &Rc<Self>,
        image: &MetadataImage,
        name: &str,
        p: i32,
        replica: &Rc<Replica>,
    ) {
        let Some(a) = image.topics.get(name).and_then(|m| m.assignment(p)) else {
            return;
        };
        let epoch_before = replica.leader_epoch();
        let follow = replica.reconcile(self.config.node_id, a, self.config.replica_lag_time_max_ms);
        if replica.leader_epoch() != epoch_before {
            self.each_subscriber(|s| s.leadership_changed(name, p));
        }
        if let Some(f) = follow {
            // A partition that starts following wakes the running fetcher (or starts
            // one); one that already followed needs only a fetcher to be running.
            let start = if f.joined || self.fetchers.wake(f.leader).is_none() {
                self.fetchers.joined(f.leader)
            } else {
                false
            };
            if start {
                self.each_subscriber(|s| s.follow(self, f.leader));
            }
        }
    }

    /// Takes a partition whose log failed offline: its log and replica leave the maps
    /// (every request then answers KAFKA_STORAGE_ERROR with the cause, logged here
    /// once) until [`Self::tend_offline`] has reopened it, re-reading its files.
    fn take_offline(&self, key: TopicPartitionRef<'_>, cause: String) -> ApiError {
        let log = self.logs.borrow_mut().remove_entry(key.key());
        let replica = self.replicas.borrow_mut().remove(key.key());
        let led_in = replica.and_then(|r| r.leader_epoch());
        if let Some((owned, log)) = log {
            tracing::error!(topic = %key.topic, partition = key.partition, error = %cause, "partition offline after an I/O error: its log is closed and reopened (re-read) once its files can be read and written again");
            self.offline.borrow_mut().insert(
                owned,
                Offline {
                    cause: cause.clone(),
                    failed: Some(log),
                    announced: false,
                    led_in,
                    attempts: 0,
                    next_attempt: Instant::now() + OFFLINE_RETRY_FIRST,
                },
            );
        }
        offline_error(key, &cause)
    }

    /// This shard's logs for DescribeLogDirs.
    pub fn describe_logs_local(&self) -> crate::base::rpc::ShardLogs {
        let replicas = self.replicas.borrow();
        let online = self
            .logs
            .borrow()
            .iter()
            .map(|(key, log)| {
                let end = log.log_end_offset();
                let lag = replicas
                    .get(key)
                    .map_or(0, |r| (end - r.high_watermark()).max(0));
                (
                    key.topic().to_string(),
                    key.partition(),
                    log.size_bytes(),
                    lag,
                )
            })
            .collect();
        let offline = self
            .offline
            .borrow()
            .iter()
            .map(|(key, o)| (key.topic().to_string(), key.partition(), o.cause.clone()))
            .collect();
        crate::base::rpc::ShardLogs { online, offline }
    }

    /// Runs now and then on every shard: takes partitions whose log failed (in a
    /// request or in the background) offline, tells the layers above once (in a cluster
    /// they move its leadership to a healthy in-sync replica), and tries to reopen
    /// offline partitions with backoff. Reopening runs recovery, so nothing is served
    /// from a file whose state after the error was not read back.
    pub async fn tend_offline(self: &Rc<Self>) {
        let failed: Vec<(TopicPartition, String)> = self
            .logs
            .borrow()
            .iter()
            .filter_map(|(k, l)| l.failure().map(|c| (k.clone(), c)))
            .collect();
        for (key, cause) in failed {
            self.take_offline(key.as_ref(), cause);
        }
        let unannounced: Vec<TopicPartition> = self
            .offline
            .borrow_mut()
            .iter_mut()
            .filter_map(|(k, o)| (!std::mem::replace(&mut o.announced, true)).then(|| k.clone()))
            .collect();
        for key in &unannounced {
            self.each_subscriber(|s| s.partition_offline(self, key.topic(), key.partition()));
        }
        let due: Vec<TopicPartition> = self
            .offline
            .borrow()
            .iter()
            .filter(|(_, o)| o.next_attempt <= Instant::now())
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.reopen(&key).await;
        }
    }

    /// Serialises what opens or closes logs on this shard (image changes, reopening
    /// offline partitions, shutdown); None once the shard is closing.
    async fn opening_logs(&self) -> Option<glommio::sync::Permit<'_>> {
        let permit = self
            .apply_lock
            .acquire_permit(1)
            .await
            .expect("apply lock never closes");
        (!self.closing.get()).then_some(permit)
    }

    /// One attempt to bring an offline partition back.
    async fn reopen(self: &Rc<Self>, key: &TopicPartition) {
        let Some(_guard) = self.opening_logs().await else {
            return;
        };
        let failed = match self.offline.borrow_mut().get_mut(key) {
            Some(o) => o.failed.take(),
            None => return,
        };
        if let Some(log) = failed {
            // Its files' state is unknown: close without trusting what it holds (an
            // error here is the failure itself again).
            let _ = log.close().await;
        }
        let image = self.image();
        let (name, p) = (key.topic(), key.partition());
        let owned = image
            .topics
            .get(name)
            .filter(|m| (0..m.partitions).contains(&p) && self.owner(m, p) == self.shard)
            .and_then(|m| m.assignment(p))
            .is_some_and(|a| a.replicas.contains(&self.config.node_id));
        if !owned {
            // Deleted or moved while offline: nothing to bring back.
            self.offline.borrow_mut().remove(key);
            return;
        }
        let led_in = self.offline.borrow().get(key).and_then(|o| o.led_in);
        let same_leadership = led_in.is_some_and(|e| {
            image.topics[name].assignment(p).is_some_and(|a| {
                a.leader == self.config.node_id && a.leader_epoch <= e && a.replicas.len() > 1
            })
        });
        if same_leadership {
            // Not back as leader in the epoch the log failed in (see `Offline::led_in`):
            // wait for the controller's new epoch, and ask for it again (the first
            // proposal may have found no controller in time), with backoff.
            let mut offline = self.offline.borrow_mut();
            let o = offline.get_mut(key).expect("still offline");
            o.attempts += 1;
            let wait = OFFLINE_RETRY_FIRST * 2u32.pow(o.attempts.min(5));
            o.next_attempt = Instant::now() + wait.min(OFFLINE_RETRY_MAX);
            o.announced = false;
            return;
        }
        let effective = crate::base::broker_configs::effective_topic_configs(
            &image,
            self.config.node_id,
            &image.topics[name].configs,
        );
        let tc = TopicConfig::parse(&effective)
            .unwrap_or_else(|_| TopicConfig::parse(&BTreeMap::new()).expect("defaults parse"));
        let dir_name = format!("{name}-{p}");
        // Recovery only reads: first prove the directory takes a durable write again,
        // or a disk that still fails writes would bring the partition back to fail it.
        let probe = self.storage.dir().join(&dir_name).join(".probe");
        let reopened = match sluice_storage::file::write_atomic(&probe, b"probe").await {
            Ok(()) => {
                let _ = sluice_storage::file::remove(&probe).await;
                self.storage.open_log(&dir_name, tc.log.clone()).await
            }
            Err(e) => Err(e),
        };
        match reopened {
            Ok(log) => {
                let replica = Replica::open(name, p, log.clone(), &self.checkpoints);
                self.replicas
                    .borrow_mut()
                    .insert(key.clone(), replica.clone());
                self.logs.borrow_mut().insert(key.clone(), log);
                self.offline.borrow_mut().remove(key);
                tracing::warn!(topic = %name, partition = p, "partition back online: its log reopened and recovered");
                if image.registered {
                    self.adopt_role(&image, name, p, &replica);
                }
            }
            Err(e) => {
                let mut offline = self.offline.borrow_mut();
                let o = offline.get_mut(key).expect("still offline");
                o.attempts += 1;
                let wait = OFFLINE_RETRY_FIRST * 2u32.pow(o.attempts.min(5));
                o.next_attempt = Instant::now() + wait.min(OFFLINE_RETRY_MAX);
                tracing::warn!(topic = %name, partition = p, error = %e, retry_in = ?wait.min(OFFLINE_RETRY_MAX), "offline partition does not reopen yet");
            }
        }
    }

    /// Every open log has its replica and every replica its log, and each partition
    /// here is one this shard owns in the current image.
    fn check_invariants(&self) {
        let logs = self.logs.borrow();
        let replicas = self.replicas.borrow();
        assert_eq!(
            logs.len(),
            replicas.len(),
            "logs and replicas differ on {}",
            self.shard
        );
        let image = self.image();
        for key in logs.keys() {
            assert!(
                replicas.contains_key(key),
                "log {key:?} has no replica on {}",
                self.shard
            );
            if let Some(meta) = image.topics.get(key.topic()) {
                assert_eq!(
                    self.owner(meta, key.partition()),
                    self.shard,
                    "{key:?} open on a shard that does not own it"
                );
            }
        }
    }

    /// Shard 0: every shard runs an image of state `version` or newer.
    pub fn set_published(&self, version: u64) {
        if version > self.published_version.get() {
            self.published_version.set(version);
        }
        self.published.notify(usize::MAX);
    }

    /// Shard 0: waits until the image of quorum state `version` is on every shard.
    pub async fn wait_published(&self, version: u64) {
        loop {
            let listener = self.published.listen();
            if self.published_version.get() >= version {
                return;
            }
            listener.await;
        }
    }

    async fn delete_logs_of(&self, topics: &[String]) {
        if topics.is_empty() {
            return;
        }
        let mut retired = Vec::new();
        let doomed: Vec<Rc<PartitionLog>> = {
            let mut logs = self.logs.borrow_mut();
            let keys: Vec<TopicPartition> = logs
                .keys()
                .filter(|k| topics.iter().any(|t| t == k.topic()))
                .cloned()
                .collect();
            let mut replicas = self.replicas.borrow_mut();
            for k in &keys {
                if let Some(r) = replicas.remove(k) {
                    retired.push(r);
                }
            }
            keys.into_iter().filter_map(|k| logs.remove(&k)).collect()
        };
        // No checkpoint round may write into a directory being removed.
        for r in retired {
            r.retire().await;
        }
        for log in doomed {
            if let Err(e) = self.storage.delete_log(&log).await {
                tracing::error!(log = %log.name(), error = %e, "deleting log failed");
            }
        }
    }

    /// Closes every log of this shard (clean shutdown).
    pub async fn close_all(&self) {
        // No image change may (re)open a log while or after they close: a second
        // instance of a partition's log would recover its directory under the closing
        // one (found by the e2e health check: "closing log failed ... No such file").
        let _guard = self
            .apply_lock
            .acquire_permit(1)
            .await
            .expect("apply lock never closes");
        self.closing.set(true);
        let replicas: Vec<Rc<Replica>> =
            self.replicas.borrow_mut().drain().map(|(_, r)| r).collect();
        for r in replicas {
            r.retire().await;
        }
        let logs: Vec<Rc<PartitionLog>> = self.logs.borrow_mut().drain().map(|(_, l)| l).collect();
        let count = logs.len();
        let started = Instant::now();
        // In rounds with one file-system sync each, not several syncs per log: 10,000
        // logs closed one by one (or 32 at once) took 20-70 s here.
        let report = self.storage.close_logs(logs).await;
        for (log, error) in &report.failed {
            tracing::error!(log = %log, error = %error, "closing log failed");
        }
        tracing::info!(
            shard = self.shard.0,
            logs = count,
            marked_clean = report.marked_clean,
            unchanged = report.unchanged,
            failed = report.failed.len(),
            fs_syncs = report.fs_syncs,
            begin_ms = report.begin.as_millis() as u64,
            write_ms = report.write.as_millis() as u64,
            sync_ms = report.sync.as_millis() as u64,
            records_ms = report.records.as_millis() as u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "logs closed"
        );
    }

    /// Reads a partition of this shard from its log start to its end, handing each
    /// decoded record to `each` (a coordinator replaying its internal topic). The
    /// requesting shard may have seen the partition before this one's image or open
    /// logs did (a topic just created, leadership just moved): that, and a read
    /// failure, is COORDINATOR_LOAD_IN_PROGRESS (what Kafka answers while a coordinator
    /// loads; clients retry it); an undecodable batch is COORDINATOR_NOT_AVAILABLE.
    /// Returns the number of records read.
    pub async fn replay(
        &self,
        topic: &str,
        partition: i32,
        mut each: impl FnMut(kafka_protocol::records::Record),
    ) -> Result<usize, ApiError> {
        const READ_BYTES: usize = 1 << 20;
        let (log, _) = self.log(topic, partition).map_err(|e| {
            ApiError::with(
                ResponseError::CoordinatorLoadInProgress,
                format!("{topic}-{partition} is not ready on this shard: {e}"),
            )
        })?;
        let mut offset = log.log_start_offset();
        let mut n = 0usize;
        loop {
            let r = log.read(offset, READ_BYTES, None).await.map_err(|e| {
                ApiError::with(ResponseError::CoordinatorLoadInProgress, e.to_string())
            })?;
            if r.records.is_empty() || r.next_offset <= offset {
                return Ok(n);
            }
            offset = r.next_offset;
            let mut buf = r.records.clone();
            while !buf.is_empty() {
                let set =
                    kafka_protocol::records::RecordBatchDecoder::decode(&mut buf).map_err(|e| {
                        ApiError::with(
                            ResponseError::CoordinatorNotAvailable,
                            format!("{topic}-{partition}: {e}"),
                        )
                    })?;
                for rec in set.records {
                    n += 1;
                    each(rec);
                }
            }
        }
    }

    /// Creates an internal topic (`__consumer_offsets`, `__transaction_state`) if it
    /// does not exist yet: compacted, Kafka's 100 MiB segments, the default
    /// replication factor.
    pub async fn ensure_internal_topic(&self, name: &str, partitions: i32) -> Result<(), ApiError> {
        if self.image().topics.contains_key(name) {
            return Ok(());
        }
        let topic = crate::base::rpc::NewTopic {
            name: name.to_string(),
            num_partitions: partitions,
            replication_factor: -1,
            configs: vec![
                ("cleanup.policy".into(), Some("compact".into())),
                ("segment.bytes".into(), Some("104857600".into())),
            ],
            assignments: Vec::new(),
        };
        let create = crate::base::rpc::CreateTopics {
            topics: vec![topic],
            validate_only: false,
        };
        match self.control(create).await?.pop() {
            Some(Ok(_)) => {
                tracing::info!("created {name}");
                Ok(())
            }
            Some(Err(e)) if e.code == ResponseError::TopicAlreadyExists => Ok(()),
            Some(Err(e)) => Err(e),
            None => Err(ApiError::new(ResponseError::CoordinatorNotAvailable)),
        }
    }

    /// Asks the controller (shard 0) to make a metadata change.
    pub async fn control<C: ShardCall>(&self, call: C) -> Result<C::Reply, ApiError> {
        self.call(ShardId(0), call)
            .await
            .map_err(|e| error::from_mesh(&e))
    }

    /// Waits (bounded by `deadline`) for a partition of any item to have data past the
    /// given offset. True if one did.
    pub async fn wait_for_data(
        &self,
        items: Vec<(ShardId, (String, i32, i64))>,
        deadline: Instant,
        follower: bool,
        read_committed: bool,
    ) -> bool {
        let timeout = deadline.saturating_duration_since(Instant::now());
        if timeout.is_zero() || items.is_empty() {
            return false;
        }
        let mut groups: BTreeMap<ShardId, Vec<(String, i32, i64)>> = BTreeMap::new();
        for (s, it) in items {
            groups.entry(s).or_default().push(it);
        }
        let calls = groups
            .into_iter()
            .map(|(s, items)| async move {
                let wait = Wait {
                    items,
                    timeout,
                    follower,
                    read_committed,
                };
                matches!(self.call(s, wait).await, Ok(true))
            })
            .collect();
        any_true(calls).await
    }
}

/// The largest batch the broker's own coordinators append (group metadata, offsets,
/// transaction state); it stands in for the topic's `max.message.bytes`, which bounds
/// what clients send. A GroupMetadata record grows with its group (1.6 MB for 10,000
/// `sluice-bench group` members, more with large subscriptions or assignments), and
/// Kafka's default 1 MiB would leave such a group unstored. Reads return a batch
/// larger than their window whole (replay, followers' fetches, the cleaner); 32 MiB
/// keeps it well inside a storage read (64 MiB) and a fetch frame (256 MiB).
pub const INTERNAL_BATCH_BYTES_MAX: usize = 32 << 20;

/// How long a batch whose producer sequence is ahead of the partition's waits for the
/// batches before it. A connection's produce requests issue their appends in request
/// order (`crate::base::util::Sequencer`), as Kafka's one-request-at-a-time handling does,
/// but a producer's next batch can still reach the partition just before the one it
/// follows: one sent on a new connection while the old connection's request is still in
/// flight, or one whose request overtook its predecessor on the owning shard (a yield
/// while recompressing for the topic's `compression.type`). It waits for it rather
/// than failing the producer.
const SEQUENCE_GAP_WAIT: Duration = Duration::from_secs(5);

/// Appends one batch of a produce request through the partition's producer state: a
/// retry of a batch already in the log answers with that batch's offsets; a batch that
/// is ahead of its producer's sequence waits (until `deadline`) for the ones before it,
/// without its append `turn` (see [`Replica::append_turn`]).
async fn append_in_sequence(
    log: &PartitionLog,
    replica: &Replica,
    batch: &Bytes,
    epoch: i32,
    deadline: Instant,
    turn: &mut Option<crate::base::util::Turn>,
) -> Result<(sluice_storage::AppendInfo, Option<sluice_storage::Staged>), ApiError> {
    use sluice_storage::producer::SequenceError;
    use sluice_storage::Judged;
    loop {
        // Listen before trying, so an append between the try and the wait is seen.
        let appended = replica.appended.listen();
        let err = match log.append_judged_staged(batch.clone(), epoch).await {
            Ok((Judged::Appended(info), staged)) => {
                replica.appended.notify(usize::MAX);
                return Ok((info, staged));
            }
            Ok((Judged::Refused(e), _)) => return Err(error::from_txn(&e)),
            Ok((Judged::Duplicate(meta), _)) => {
                let info = sluice_storage::AppendInfo {
                    base_offset: meta.first_offset,
                    last_offset: meta.last_offset,
                    // Kafka answers a duplicate without a log-append time.
                    log_append_time_ms: -1,
                    record_count: (meta.last_offset - meta.first_offset + 1) as i32,
                };
                return Ok((info, None));
            }
            Err(e) => e,
        };
        let ahead = matches!(
            &err,
            sluice_storage::Error::Sequence(SequenceError::OutOfOrder { first_seq, last_seq, .. })
                if *last_seq >= 0 && *first_seq > *last_seq
        );
        let left = deadline.saturating_duration_since(Instant::now());
        if !ahead || left.is_zero() {
            return Err(error::from_storage(&err));
        }
        // A batch ahead of its sequence has its place by sequence, not by arrival: it
        // gives up its turn so that the batches before it (from another connection,
        // after a reconnect) can append.
        turn.take();
        let woke = futures_lite::future::or(
            async {
                appended.await;
                true
            },
            async {
                glommio::timer::sleep(left).await;
                false
            },
        )
        .await;
        if !woke {
            return Err(error::from_storage(&err));
        }
    }
}
