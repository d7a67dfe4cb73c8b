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
//! By role: this file is the shard context (the state, the cross-shard call helpers,
//! the accessors and invariants); [`work`] is the partition work, [`apply`] adopts
//! metadata images, [`offline`] takes failed logs offline and reopens them, and
//! [`internal`] creates and replays the internal topics.
//!
//! Layering: this module knows nothing of the controller, the group shell or the
//! replica fetchers above it. It tells them what happens to its partitions through
//! [`PartitionEvents`] subscribers installed at start-up (`crate::node`).

mod apply;
mod internal;
mod offline;
mod work;
pub use work::StagedProduce;

use offline::offline_error;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};
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
use crate::base::ids::{BrokerId, LeaderEpoch};
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
    fn follow(&self, _broker: &Rc<Broker>, _leader: BrokerId) {}
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
    led_in: Option<LeaderEpoch>,
    attempts: u32,
    next_attempt: Instant,
}

/// Reopen attempts of an offline partition: after this, doubling up to the maximum.
const OFFLINE_RETRY_FIRST: Duration = Duration::from_secs(1);
const OFFLINE_RETRY_MAX: Duration = Duration::from_secs(30);
/// New logs a shard opens at once when it adopts an image (see [`Broker::apply`]).
const NEW_LOGS_AT_ONCE: usize = 64;

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
    /// Which of this shard's partitions changed, in order: large fetch sessions read
    /// only those (`crate::partition::changes`).
    pub changes: Rc<crate::partition::changes::ChangeFeed>,
    /// Bumped whenever a partition comes or goes on this shard or a replica adopts a
    /// role: the replica fetchers list the partitions they follow again only then.
    hosting: Cell<u64>,
    /// Tiered storage's reader, with `--remote-storage` (set once at start-up).
    tiered: std::cell::OnceCell<Rc<crate::partition::tiered::Tiered>>,
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
                controller_id: BrokerId::NONE,
                registered: false,
                broker_configs: BTreeMap::new(),
                scram: BTreeMap::new(),
                group_configs: BTreeMap::new(),
                acls: Default::default(),
                quotas: Default::default(),
                remote: Default::default(),
                remote_purge: Vec::new(),
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
            changes: Rc::default(),
            hosting: Cell::new(0),
            tiered: std::cell::OnceCell::new(),
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
                crate::partition::disk::journal_margin(
                    config.journal_chunk_bytes,
                    crate::partition::disk::space_of(&config.data_dir).map_or(0, |s| s.total),
                    shards,
                ),
                shards,
            )),
            config,
        }
    }

    /// Hosts a partition's log and replica on this shard (the two enter the maps
    /// together), its changes told to the shard's change feed from now on.
    pub(crate) fn host(&self, key: TopicPartition, replica: Rc<Replica>, log: Rc<PartitionLog>) {
        let id = self.changes.id(key.topic_arc(), key.partition());
        let feed = Rc::downgrade(&self.changes);
        replica.set_on_change(Rc::new(move || {
            if let Some(feed) = feed.upgrade() {
                feed.changed_id(id);
            }
        }));
        self.replicas.borrow_mut().insert(key.clone(), replica);
        self.logs.borrow_mut().insert(key, log);
        self.changes.changed_id(id);
        self.hosting_changed();
    }

    /// See [`Self::hosting_version`].
    pub(crate) fn hosting_changed(&self) {
        self.hosting.set(self.hosting.get() + 1);
    }

    /// Changes whenever the set of this shard's partitions or any replica's role may
    /// have changed (partitions opened, closed, taken offline; roles adopted).
    pub fn hosting_version(&self) -> u64 {
        self.hosting.get()
    }

    /// Tiered storage on this shard, if the broker has an object store.
    pub fn tiered(&self) -> Option<Rc<crate::partition::tiered::Tiered>> {
        self.tiered.get().cloned()
    }

    /// Gives this shard its tiered storage (once, at start-up).
    pub fn set_tiered(&self, tiered: crate::partition::tiered::Tiered) {
        let _ = self.tiered.set(Rc::new(tiered));
    }

    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// The home shard of a partition of a topic in the current image: by this broker's
    /// slot of its replica, else hashed ([`TopicMeta::owner`]). The publisher keeps a
    /// published partition's slots (`MetadataImage::keep_slots_of`), so its owner never
    /// changes while the process runs.
    pub fn owner(&self, topic: &TopicMeta, partition: i32) -> ShardId {
        topic.owner(&self.table, self.config.broker_id(), partition)
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
        let me = self.config.node_id;
        // Not a replica here: the client must ask the leader (as Kafka answers). A
        // partition reassigned away has no home shard here any more (a call routed by
        // the image before may reach the shard that held it).
        if meta
            .assignment(partition)
            .is_some_and(|a| !a.replicas.contains(&me))
        {
            return Err(ApiError::with(
                ResponseError::NotLeaderOrFollower,
                format!("broker {me} holds no replica of {topic}-{partition}"),
            ));
        }
        assert_eq!(
            self.owner(meta, partition),
            self.shard,
            "partition routed to its home shard"
        );
        let key = TopicPartitionRef::new(topic, partition);
        let log = self.logs.borrow().get(key.key()).cloned();
        let log = log.ok_or_else(|| match self.offline.borrow().get(key.key()) {
            Some(o) => offline_error(key, &o.cause),
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
                topic: r.topic.to_string(),
                partition: r.partition,
                leader,
                high_watermark: r.high_watermark().get(),
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
    pub fn fetcher_stopped(&self, leader: BrokerId) {
        self.fetchers.release(leader);
    }

    /// Wakes the running fetcher for `leader` when a partition joins it.
    pub fn fetcher_wake(
        &self,
        leader: BrokerId,
    ) -> Option<Rc<crate::partition::replica::FetcherWake>> {
        self.fetchers.wake(leader)
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
            // (A replica reassigned away stays open until an image of this run's
            // registration lets it go: it has no home shard meanwhile.)
            let hosted = |meta: &&crate::base::metadata::TopicMeta| {
                let a = meta.assignment(key.partition());
                a.is_some_and(|a| a.replicas.contains(&self.config.node_id))
            };
            if let Some(meta) = image.topics.get(key.topic()).filter(hosted) {
                assert_eq!(
                    self.owner(meta, key.partition()),
                    self.shard,
                    "{key:?} open on a shard that does not own it"
                );
            }
        }
        // Pair assertions on what adoption set (`adopt_role` through
        // `Replica::reconcile`): a replica leads only in the epoch the adopted image
        // names this broker leader in, and that leader is in the ISR it publishes; no
        // replica reports a high watermark past its log.
        let me = self.config.node_id;
        for (key, r) in replicas.iter() {
            assert!(
                r.high_watermark() <= r.log_end(),
                "{key:?}: high watermark {} past the log end {}",
                r.high_watermark(),
                r.log_end()
            );
            let (Some(epoch), true) = (r.leader_epoch(), image.registered) else {
                continue;
            };
            let Some(a) = image
                .topics
                .get(key.topic())
                .and_then(|m| m.assignment(key.partition()))
            else {
                continue;
            };
            assert!(
                a.leader == me && a.leader_epoch == epoch.get() && a.isr.contains(&me),
                "{key:?} leads in epoch {epoch}, the image says leader {} epoch {} ISR {:?}",
                a.leader,
                a.leader_epoch,
                a.isr
            );
        }
    }

    /// Asks the controller (shard 0) to make a metadata change.
    pub async fn control<C: ShardCall>(&self, call: C) -> Result<C::Reply, ApiError> {
        self.call(ShardId(0), call)
            .await
            .map_err(|e| error::from_mesh(&e))
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
