//! The broker as one shard sees it: its partition logs, its copy of the metadata image,
//! and the messages shards exchange.
//!
//! A [`Broker`] lives on one shard (one executor thread) and is `Rc`-shared by that
//! shard's connections. Partition work ([`ShardReq::Produce`], `Read`, `Wait`, ...) runs
//! on the partition's home shard; the shard that received the client request fans the
//! work out by owner with [`Broker::fan_out`] and merges the replies. Metadata changes
//! run on shard 0 (the controller, see [`crate::controller`]) and reach every shard as
//! a new image ([`ShardReq::Apply`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::sync::Semaphore;
use kafka_protocol::error::ResponseError;
use sluice_shard::{Mesh, ShardId, ShardTable};
use sluice_storage::{batch, PartitionLog, Storage};

use crate::config::BrokerConfig;
use crate::controller::{ControlOp, ControlResult, Controller};
use crate::error::{self, ApiError};
use crate::metadata::{MetadataImage, TopicMeta};
use crate::topic_config::TopicConfig;
use crate::util::{any_true, join_all};

/// Leader epoch of every partition until replication assigns real ones.
pub const LEADER_EPOCH: i32 = 0;

/// Produce work for one partition on its home shard.
#[derive(Debug)]
pub struct ProduceItem {
    pub topic: String,
    pub partition: i32,
    /// One or more v2 batches, a zero-copy slice of the request frame.
    pub records: Bytes,
}

#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub base_offset: i64,
    pub log_append_time_ms: i64,
    pub log_start_offset: i64,
}

#[derive(Debug)]
pub struct ReadItem {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub max_bytes: usize,
}

#[derive(Debug, Default)]
pub struct ReadOut {
    pub error: Option<ApiError>,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records: Bytes,
}

/// A request from one shard to another.
pub enum ShardReq {
    Produce {
        acks: i16,
        items: Vec<ProduceItem>,
    },
    /// Read without waiting.
    Read {
        items: Vec<ReadItem>,
    },
    /// Wait until any partition's log end passes its offset, or the timeout.
    Wait {
        items: Vec<(String, i32, i64)>,
        timeout: Duration,
    },
    /// (topic, partition, timestamp): -2 earliest, -1 latest, else first at or after.
    ListOffsets {
        items: Vec<(String, i32, i64)>,
    },
    /// (topic, partition, delete before this offset; -1 = high watermark).
    DeleteRecords {
        items: Vec<(String, i32, i64)>,
    },
    /// A new metadata image to adopt (from the controller).
    Apply(Arc<MetadataImage>),
    /// A metadata change, for the controller on shard 0.
    Control(ControlOp),
    /// A consumer-group request for the home shard of this `__consumer_offsets`
    /// partition (see [`crate::group`]).
    Group(Box<(i32, crate::group::GroupReq)>),
}

/// The reply to a [`ShardReq`], variant for variant.
pub enum ShardResp {
    Produce(Vec<Result<Appended, ApiError>>),
    Read(Vec<ReadOut>),
    Wait(bool),
    ListOffsets(Vec<Result<(i64, i64), ApiError>>),
    DeleteRecords(Vec<Result<i64, ApiError>>),
    Applied,
    Control(ControlResult),
    Group(Result<crate::group::GroupResp, ApiError>),
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
    pub mesh: Rc<Mesh<ShardReq, ShardResp>>,
    pub storage: Rc<Storage>,
    pub limits: ShardLimits,
    /// Admission budget for request bytes: the shard's backpressure on clients.
    pub request_bytes: Rc<Semaphore>,
    image: RefCell<Arc<MetadataImage>>,
    logs: RefCell<HashMap<(String, i32), Rc<PartitionLog>>>,
    /// Parsed configs of every topic in `image`, swapped together with it.
    topic_configs: RefCell<HashMap<String, Rc<TopicConfig>>>,
    /// Serialises image changes on this shard.
    apply_lock: Semaphore,
    /// Present on shard 0 only.
    pub controller: Option<Controller>,
}

impl Broker {
    pub fn new(
        config: BrokerConfig,
        mesh: Rc<Mesh<ShardReq, ShardResp>>,
        storage: Rc<Storage>,
        limits: ShardLimits,
        controller: Option<Controller>,
    ) -> Broker {
        let shard = mesh.id();
        Broker {
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
            })),
            logs: RefCell::new(HashMap::new()),
            topic_configs: RefCell::new(HashMap::new()),
            apply_lock: Semaphore::new(1),
            controller,
            config,
        }
    }

    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// The home shard of a partition of a topic in the current image.
    pub fn owner(&self, topic: &TopicMeta, partition: i32) -> ShardId {
        self.table.owner(topic.id.as_u128(), partition)
    }

    /// Handles a request from another shard (or this one, via `Mesh::call`).
    pub async fn handle_shard_request(self: Rc<Self>, req: ShardReq) -> ShardResp {
        match req {
            ShardReq::Produce { acks, items } => {
                let futs = items
                    .into_iter()
                    .map(|it| self.produce_local(acks, it))
                    .collect();
                ShardResp::Produce(join_all(futs).await)
            }
            ShardReq::Read { items } => {
                let futs = items.into_iter().map(|it| self.read_local(it)).collect();
                ShardResp::Read(join_all(futs).await)
            }
            ShardReq::Wait { items, timeout } => {
                ShardResp::Wait(self.wait_local(items, timeout).await)
            }
            ShardReq::ListOffsets { items } => {
                let futs = items
                    .into_iter()
                    .map(|(t, p, ts)| self.list_offset_local(t, p, ts))
                    .collect();
                ShardResp::ListOffsets(join_all(futs).await)
            }
            ShardReq::DeleteRecords { items } => {
                let futs = items
                    .into_iter()
                    .map(|(t, p, o)| self.delete_records_local(t, p, o))
                    .collect();
                ShardResp::DeleteRecords(join_all(futs).await)
            }
            ShardReq::Apply(image) => {
                self.apply(image).await;
                ShardResp::Applied
            }
            ShardReq::Group(req) => {
                let (partition, req) = *req;
                ShardResp::Group(crate::group::shard::serve(self, partition, req).await)
            }
            ShardReq::Control(op) => match &self.controller {
                Some(c) => ShardResp::Control(c.execute(&self, op).await),
                None => panic!(
                    "control request sent to {} which is not the controller",
                    self.shard
                ),
            },
        }
    }

    /// Sends `items` to their home shards (grouped, one message per shard, all shards
    /// concurrently) and returns the replies in the order of `items`.
    pub async fn fan_out<T, R>(
        &self,
        items: Vec<(ShardId, T)>,
        make: impl Fn(Vec<T>) -> ShardReq,
        unpack: impl Fn(ShardResp) -> Vec<R>,
        on_error: impl Fn(&sluice_shard::MeshError) -> R,
    ) -> Vec<R> {
        let n = items.len();
        let mut groups: BTreeMap<ShardId, (Vec<usize>, Vec<T>)> = BTreeMap::new();
        for (i, (shard, item)) in items.into_iter().enumerate() {
            let g = groups.entry(shard).or_default();
            g.0.push(i);
            g.1.push(item);
        }
        let mut order = Vec::with_capacity(groups.len());
        let mut calls = Vec::with_capacity(groups.len());
        for (shard, (idx, its)) in groups {
            order.push(idx);
            calls.push(self.mesh.call(shard, make(its)));
        }
        let replies = join_all(calls).await;
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        for (idx, reply) in order.into_iter().zip(replies) {
            match reply {
                Ok(resp) => {
                    let rs = unpack(resp);
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
        debug_assert_eq!(
            self.owner(meta, partition),
            self.shard,
            "partition routed to its home shard"
        );
        let log = self
            .logs
            .borrow()
            .get(&(topic.to_string(), partition))
            .cloned();
        let log = log.ok_or_else(|| {
            ApiError::with(
                ResponseError::KafkaStorageError,
                format!("log of {topic}-{partition} is not open on {}", self.shard),
            )
        })?;
        let tc = self.topic_configs.borrow().get(topic).cloned();
        let tc = tc.ok_or_else(|| {
            ApiError::with(
                ResponseError::KafkaStorageError,
                format!("config of {topic} is not loaded on {}", self.shard),
            )
        })?;
        Ok((log, tc))
    }

    async fn produce_local(&self, acks: i16, item: ProduceItem) -> Result<Appended, ApiError> {
        let (log, tc) = self.log(&item.topic, item.partition)?;
        if acks == -1 && tc.min_insync_replicas > 1 {
            // One replica can never satisfy min.insync.replicas > 1.
            return Err(ApiError::with(
                ResponseError::NotEnoughReplicas,
                format!(
                    "min.insync.replicas={} but this topic has 1 replica",
                    tc.min_insync_replicas
                ),
            ));
        }
        let batches = batch::split_batches(&item.records)
            .map_err(|e| error::from_storage(&sluice_storage::Error::Batch(e)))?;
        if batches.is_empty() {
            return Err(ApiError::with(
                ResponseError::CorruptMessage,
                "produce request holds no record batch",
            ));
        }
        let max = tc.log.max_message_bytes;
        if let Some((_, r)) = batches.iter().find(|(_, r)| r.len() > max) {
            return Err(ApiError::with(
                ResponseError::MessageTooLarge,
                format!(
                    "batch of {} bytes is larger than max.message.bytes {max}",
                    r.len()
                ),
            ));
        }
        let mut first: Option<sluice_storage::AppendInfo> = None;
        for (_, range) in batches {
            let info = log
                .append(&item.records[range], LEADER_EPOCH)
                .await
                .map_err(|e| error::from_storage(&e))?;
            first.get_or_insert(info);
        }
        if acks != 0 {
            // "Acknowledged means on disk": with one replica, acks=1 and acks=-1 both
            // wait for the topic's flush policy (fdatasync by default).
            log.flush_for_ack()
                .await
                .map_err(|e| error::from_storage(&e))?;
        }
        let first = first.expect("at least one batch");
        Ok(Appended {
            base_offset: first.base_offset,
            log_append_time_ms: first.log_append_time_ms,
            log_start_offset: log.log_start_offset(),
        })
    }

    async fn read_local(&self, item: ReadItem) -> ReadOut {
        let (log, _) = match self.log(&item.topic, item.partition) {
            Ok(l) => l,
            Err(e) => {
                return ReadOut {
                    error: Some(e),
                    high_watermark: -1,
                    log_start_offset: -1,
                    records: Bytes::new(),
                }
            }
        };
        // One replica: the high watermark is the log end.
        match log.read(item.offset, item.max_bytes.max(1), None).await {
            Ok(r) => ReadOut {
                error: None,
                high_watermark: r.log_end_offset,
                log_start_offset: r.log_start_offset,
                records: r.records,
            },
            Err(e) => ReadOut {
                error: Some(error::from_storage(&e)),
                high_watermark: log.log_end_offset(),
                log_start_offset: log.log_start_offset(),
                records: Bytes::new(),
            },
        }
    }

    async fn wait_local(&self, items: Vec<(String, i32, i64)>, timeout: Duration) -> bool {
        let logs: Vec<(Rc<PartitionLog>, i64)> = items
            .iter()
            .filter_map(|(t, p, o)| self.log(t, *p).ok().map(|(l, _)| (l, *o)))
            .collect();
        if logs.is_empty() {
            glommio::timer::sleep(timeout).await;
            return false;
        }
        let futs = logs
            .iter()
            .map(|(l, o)| l.wait_for_append(*o, timeout))
            .collect();
        any_true(futs).await
    }

    async fn list_offset_local(
        &self,
        topic: String,
        partition: i32,
        ts: i64,
    ) -> Result<(i64, i64), ApiError> {
        let (log, _) = self.log(&topic, partition)?;
        match ts {
            -2 => Ok((log.log_start_offset(), -1)),
            // Latest, and (KIP-734) max-timestamp, which this broker answers with the
            // log end rather than searching for the record: a documented gap.
            -1 | -3 => Ok((log.log_end_offset(), -1)),
            ts if ts < 0 => Err(ApiError::with(
                ResponseError::InvalidRequest,
                format!("bad timestamp {ts}"),
            )),
            ts => match log.offset_for_timestamp(ts).await {
                Ok(Some((o, t))) => Ok((o, t)),
                Ok(None) => Ok((-1, -1)),
                Err(e) => Err(error::from_storage(&e)),
            },
        }
    }

    async fn delete_records_local(
        &self,
        topic: String,
        partition: i32,
        offset: i64,
    ) -> Result<i64, ApiError> {
        let (log, _) = self.log(&topic, partition)?;
        let end = log.log_end_offset();
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
    pub async fn apply(&self, image: Arc<MetadataImage>) {
        let _guard = self
            .apply_lock
            .acquire_permit(1)
            .await
            .expect("apply lock never closes");
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
        for (name, meta) in &image.topics {
            let tc = match TopicConfig::parse(&meta.configs) {
                Ok(tc) => tc,
                Err(e) => {
                    tracing::error!(topic = %name, error = %e, "stored topic config does not parse; using defaults");
                    TopicConfig::parse(&BTreeMap::new()).expect("defaults parse")
                }
            };
            let tc = Rc::new(tc);
            configs.insert(name.clone(), tc.clone());
            for p in 0..meta.partitions {
                if self.owner(meta, p) != self.shard {
                    continue;
                }
                let key = (name.clone(), p);
                let existing = self.logs.borrow().get(&key).cloned();
                match existing {
                    Some(log) => {
                        if log.config() != tc.log {
                            if let Err(e) = log.set_config(tc.log.clone()) {
                                tracing::error!(topic = %name, partition = p, error = %e, "config change refused");
                            }
                        }
                    }
                    None => match self
                        .storage
                        .open_log(&format!("{name}-{p}"), tc.log.clone())
                        .await
                    {
                        Ok(log) => {
                            tracing::debug!(shard = self.shard.0, topic = %name, partition = p, "opened log");
                            self.logs.borrow_mut().insert(key, log);
                        }
                        Err(e) => {
                            tracing::error!(topic = %name, partition = p, error = %e, "cannot open log")
                        }
                    },
                }
            }
        }
        *self.image.borrow_mut() = image;
        *self.topic_configs.borrow_mut() = configs;
        self.delete_logs_of(&removed).await;
    }

    async fn delete_logs_of(&self, topics: &[String]) {
        if topics.is_empty() {
            return;
        }
        let doomed: Vec<Rc<PartitionLog>> = {
            let mut logs = self.logs.borrow_mut();
            let keys: Vec<(String, i32)> = logs
                .keys()
                .filter(|(t, _)| topics.contains(t))
                .cloned()
                .collect();
            keys.into_iter().filter_map(|k| logs.remove(&k)).collect()
        };
        for log in doomed {
            if let Err(e) = self.storage.delete_log(&log).await {
                tracing::error!(log = %log.name(), error = %e, "deleting log failed");
            }
        }
    }

    /// Closes every log of this shard (clean shutdown).
    pub async fn close_all(&self) {
        let logs: Vec<Rc<PartitionLog>> = self.logs.borrow_mut().drain().map(|(_, l)| l).collect();
        for log in logs {
            if let Err(e) = log.close().await {
                tracing::error!(log = %log.name(), error = %e, "closing log failed");
            }
        }
    }

    /// Asks the controller (shard 0) to make a metadata change.
    pub async fn control(&self, op: ControlOp) -> Result<ControlResult, ApiError> {
        match self.mesh.call(ShardId(0), ShardReq::Control(op)).await {
            Ok(ShardResp::Control(r)) => Ok(r),
            Ok(_) => panic!("controller answered a control request with another reply"),
            Err(e) => Err(error::from_mesh(&e)),
        }
    }

    /// Waits (bounded by `deadline`) for a partition of any item to have data past the
    /// given offset. True if one did.
    pub async fn wait_for_data(
        &self,
        items: Vec<(ShardId, (String, i32, i64))>,
        deadline: Instant,
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
                matches!(
                    self.mesh.call(s, ShardReq::Wait { items, timeout }).await,
                    Ok(ShardResp::Wait(true))
                )
            })
            .collect();
        any_true(calls).await
    }
}
