//! Transactions in the broker: the per-shard I/O shell around the pure transaction
//! coordinator of `sluice-coordinator` ([`TxnCoordinator`]), the router that sends
//! transaction calls to the shard coordinating a transactional id, and the sender of
//! transaction markers.
//!
//! Placement: transactional id T belongs to `__transaction_state` partition
//! `abs(javaHashCode(T)) % 50` (Kafka's rule), coordinated by that partition's leader,
//! on the partition's home shard. The shell loads every partition this broker leads as
//! soon as it leads it (replaying its records; within a tick), so forgotten
//! transactions still time out, appends each record the coordinator produces to the partition (acks=all)
//! and reports it before any answer leaves, and writes the markers it asks for with
//! WriteTxnMarkers requests to each partition's leader (this broker included), retried
//! by the coordinator's tick until written. A ticker drives timeouts and retries.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::rc::{Rc, Weak};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{TopicName, WriteTxnMarkersRequest};
use sluice_client::aio::Conn;
use sluice_coordinator::txn::{
    AddOffsetsToken, AddPartitionsToken, AppendId, EndToken, InitArgs, InitToken, ListFilter,
    MarkerResult, MarkerWrite, ProducerIdAndEpoch, ProducerIds, TxnConfig, TxnCoordinator,
    TxnEffects, TxnReply, TXN_STATE_TOPIC,
};

use crate::base::error::{self, ApiError};
use crate::base::ids::{BrokerId, LeaderEpoch, ProducerId};
use crate::base::rpc::{self, PartitionCode, TxnCall};
use crate::base::util::sb;
use crate::coord::runtime::{answer, every, Replay, Runtime, Waiters};
use crate::coord::{coordinator_keys, partition_codes};
use crate::partition::broker::{Broker, PartitionEvents};
use sluice_coordinator::txn_records::TxnRecordError;
use sluice_protocol::TopicPartition;
use sluice_storage::SystemClock;

/// transaction.state.log.num.partitions
pub const TXN_STATE_PARTITIONS: i32 = 50;
/// How often the coordinator's timers (timeouts, marker retries, expiry) are checked.
const TICK: Duration = Duration::from_millis(100);
/// A WriteTxnMarkers round trip to a partition leader may take this long.
const MARKER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The `__transaction_state` partition of a transactional id.
pub fn partition_for(transactional_id: &str) -> i32 {
    sluice_coordinator::partition_for(transactional_id, TXN_STATE_PARTITIONS)
}

/// Sends a transaction call to the shard coordinating its transactional id (the home
/// shard of the id's `__transaction_state` partition, which this broker must lead).
pub async fn route<R, C>(broker: &Broker, call: C) -> Result<R, ApiError>
where
    C: TxnCall<Reply = Result<R, ApiError>>,
{
    broker
        .ensure_internal_topic(TXN_STATE_TOPIC, TXN_STATE_PARTITIONS)
        .await
        .map_err(|e| ApiError::with(ResponseError::CoordinatorNotAvailable, e.to_string()))?;
    let partition = call.partition();
    let image = broker.image();
    let meta = image
        .topics
        .get(TXN_STATE_TOPIC)
        .ok_or_else(|| ApiError::new(ResponseError::CoordinatorNotAvailable))?;
    if meta.assignment(partition).map(|a| a.leader) != Some(broker.config.node_id) {
        return Err(ApiError::with(
            ResponseError::NotCoordinator,
            format!(
                "broker {} does not lead {TXN_STATE_TOPIC}-{partition}",
                broker.config.node_id
            ),
        ));
    }
    let owner = broker.owner(meta, partition);
    match broker.call(owner, call).await {
        Ok(r) => r,
        Err(e) => Err(error::from_mesh(&e)),
    }
}

/// One fresh producer id handed to the coordinator (the shell fetched it from the
/// controller's block before the call).
struct OneId(Option<i64>);

impl ProducerIds for OneId {
    fn next_producer_id(&mut self) -> Result<i64, ResponseError> {
        self.0
            .take()
            .ok_or(ResponseError::CoordinatorLoadInProgress)
    }
}

pub struct TxnShell {
    coord: RefCell<TxnCoordinator>,
    rt: Runtime,
    /// Requests waiting for their deferred answer, one map per call kind keyed by that
    /// kind's token type, so each waiter can only receive its own call's answer.
    pending_inits: Waiters<InitToken, Deferred<ProducerIdAndEpoch>>,
    pending_adds: Waiters<AddPartitionsToken, Deferred<()>>,
    pending_offsets: Waiters<AddOffsetsToken, Deferred<()>>,
    pending_ends: Waiters<EndToken, Deferred<ProducerIdAndEpoch>>,
    /// Marker rounds being written, so a tick does not start the same one twice.
    markers_in_flight: RefCell<HashSet<(u64, String, i32)>>,
    /// A producer id from this broker's block kept for the next InitProducerId that
    /// needs a new one (a new transactional id, or an exhausted epoch): most inits
    /// (an existing id's epoch bump, retries while markers are written) need none, so
    /// an id is asked for only once this one is used.
    spare_id: Cell<Option<i64>>,
    broker: Weak<Broker>,
    /// This shell, for the tasks that write markers.
    this: Weak<TxnShell>,
}

impl TxnShell {
    /// Transactions open on this shard's coordinator partitions (ongoing, or preparing
    /// to commit or abort), for the metrics endpoint; `None` while a partition loads.
    pub fn open_transactions(&self) -> Option<u64> {
        let f = ListFilter {
            states: ["Ongoing", "PrepareCommit", "PrepareAbort"]
                .map(String::from)
                .to_vec(),
            producer_ids: Vec::new(),
            min_duration_ms: -1,
        };
        let listed = self.coord.borrow().list(self.rt.now_ms(), &f).ok()?;
        Some(listed.transactions.len() as u64)
    }

    /// The shard's transaction shell: starts its ticker (it ends with the broker) and
    /// subscribes to leadership changes.
    pub fn start(broker: &Rc<Broker>) -> Rc<TxnShell> {
        let config = TxnConfig {
            state_partitions: TXN_STATE_PARTITIONS,
            max_timeout_ms: broker.config.transaction_max_timeout_ms,
            ..TxnConfig::default()
        };
        let s = Rc::new_cyclic(|this| TxnShell {
            coord: RefCell::new(TxnCoordinator::new(config)),
            rt: Runtime::new(TXN_STATE_TOPIC, Rc::new(SystemClock)),
            pending_inits: Waiters::new(),
            pending_adds: Waiters::new(),
            pending_offsets: Waiters::new(),
            pending_ends: Waiters::new(),
            markers_in_flight: RefCell::new(HashSet::new()),
            spare_id: Cell::new(None),
            broker: Rc::downgrade(broker),
            this: this.clone(),
        });
        broker.subscribe(s.clone());
        every(TICK, broker, &s, |b, st: Rc<TxnShell>| async move {
            // Load every partition led here at once (not on first use): the
            // transactions in it time out, and prepared ones complete, even if no
            // client of theirs comes back.
            if let Err(e) = st.rt.load_all_led(&b, &*st).await {
                tracing::debug!(error = %e, "loading {TXN_STATE_TOPIC} partitions");
            }
            let mut fx = TxnEffects::default();
            st.coord.borrow_mut().tick(st.rt.now_ms(), &mut fx);
            st.run_effects(&b, fx).await;
        });
        s
    }
}

impl PartitionEvents for TxnShell {
    /// Leadership of a `__transaction_state` partition changed here: unload it; it is
    /// loaded afresh (at the new leader epoch) on next use if this broker leads it.
    fn leadership_changed(&self, topic: &str, partition: i32) {
        if topic != TXN_STATE_TOPIC || !self.rt.forget(partition) {
            return;
        }
        let mut fx = TxnEffects::default();
        self.coord.borrow_mut().unload(partition, &mut fx);
        self.deliver(fx.replies);
        tracing::info!(partition, "unloaded {TXN_STATE_TOPIC} partition");
    }
}

/// The calls, served on the shard owning the id's `__transaction_state` partition.
impl TxnShell {
    pub async fn init(&self, b: &Broker, c: rpc::TxnInit) -> Result<ProducerIdAndEpoch, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        // A fresh id for the coordinator to hand out if it needs one (new id, fencing
        // with an exhausted epoch): the spare, else one from the controller.
        let fresh = match self.spare_id.take() {
            Some(id) => id,
            None => b
                .control(rpc::AllocateProducerId)
                .await
                .and_then(|r| r)?
                .get(),
        };
        let token = InitToken(self.rt.next_token());
        let rx = self.pending_inits.register(token, ());
        let mut fx = TxnEffects::default();
        let mut ids = OneId(Some(fresh));
        self.coord.borrow_mut().init_producer_id(
            token,
            self.rt.now_ms(),
            c.args,
            &mut ids,
            &mut fx,
        );
        // Unused: kept for the next init (ids are unique, not dense).
        if let Some(unused) = ids.0 {
            self.spare_id.set(Some(unused));
        }
        self.run_effects(b, fx).await;
        answer(rx).await?.map_err(ApiError::new)
    }

    pub async fn add_partitions(&self, b: &Broker, c: rpc::TxnAdd) -> Result<(), ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let token = AddPartitionsToken(self.rt.next_token());
        let rx = self.pending_adds.register(token, ());
        let mut fx = TxnEffects::default();
        self.coord
            .borrow_mut()
            .add_partitions(token, self.rt.now_ms(), c.args, &mut fx);
        self.run_effects(b, fx).await;
        answer(rx).await?.map_err(ApiError::new)
    }

    pub async fn add_offsets(&self, b: &Broker, c: rpc::TxnAddOffsets) -> Result<(), ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let token = AddOffsetsToken(self.rt.next_token());
        let rx = self.pending_offsets.register(token, ());
        let mut fx = TxnEffects::default();
        self.coord
            .borrow_mut()
            .add_offsets(token, self.rt.now_ms(), c.args, &mut fx);
        self.run_effects(b, fx).await;
        answer(rx).await?.map_err(ApiError::new)
    }

    pub async fn end(&self, b: &Broker, c: rpc::TxnEnd) -> Result<ProducerIdAndEpoch, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let token = EndToken(self.rt.next_token());
        let rx = self.pending_ends.register(token, ());
        let mut fx = TxnEffects::default();
        self.coord
            .borrow_mut()
            .end_txn(token, self.rt.now_ms(), c.args, &mut fx);
        self.run_effects(b, fx).await;
        answer(rx).await?.map_err(ApiError::new)
    }

    pub async fn verify(
        &self,
        b: &Broker,
        c: rpc::TxnVerify,
    ) -> Result<Vec<PartitionCode>, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        self.coord
            .borrow()
            .verify_partitions(
                &c.transactional_id,
                c.producer_id.get(),
                c.producer_epoch,
                &coordinator_keys(&c.partitions),
            )
            .map(partition_codes)
            .map_err(ApiError::new)
    }

    pub async fn describe(
        &self,
        b: &Broker,
        c: rpc::TxnDescribe,
    ) -> Result<sluice_coordinator::txn::TxnDescription, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        self.coord
            .borrow()
            .describe(&c.transactional_id)
            .map_err(ApiError::new)
    }

    /// Every transaction of the partitions this shard coordinates (loaded first).
    pub async fn list(
        &self,
        b: &Broker,
        c: rpc::TxnList,
    ) -> Result<sluice_coordinator::txn::ListedTxns, ApiError> {
        self.rt.load_all_led(b, self).await?;
        self.coord
            .borrow()
            .list(self.rt.now_ms(), &c.filter)
            .map_err(ApiError::new)
    }
}

/// A deferred answer of the transaction coordinator: its reply or its error code.
type Deferred<T> = Result<T, ResponseError>;

impl TxnShell {
    /// Sends each reply to its waiter, in the map of its call kind.
    fn deliver(&self, replies: Vec<TxnReply>) {
        for reply in replies {
            match reply {
                TxnReply::InitProducerId(t, r) => self.pending_inits.deliver(&t, r),
                TxnReply::AddPartitions(t, r) => self.pending_adds.deliver(&t, r),
                TxnReply::AddOffsets(t, r) => self.pending_offsets.deliver(&t, r),
                TxnReply::EndTxn(t, r) => self.pending_ends.deliver(&t, r),
            }
        }
    }

    /// Runs effects until none are left: appends (in order, each reported), then
    /// marker rounds (each in its own task, reported when written), then replies.
    async fn run_effects(&self, broker: &Broker, fx: TxnEffects) {
        let mut queue = vec![fx];
        while let Some(fx) = queue.pop() {
            for a in fx.appends {
                let result = self
                    .append(broker, a.id, a.partition, &a.key, a.value.as_deref())
                    .await;
                let mut next = TxnEffects::default();
                self.coord.borrow_mut().append_done(
                    a.id,
                    result.map_err(|e| e.code),
                    self.rt.now_ms(),
                    &mut next,
                );
                queue.push(next);
            }
            for m in fx.markers {
                self.spawn_markers(m);
            }
            self.deliver(fx.replies);
        }
    }

    fn spawn_markers(&self, m: MarkerWrite) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        // One round trip per (round, partition) at a time. Every partition is
        // reported (written, gone or failed); the coordinator's tick re-emits the
        // failed ones.
        let fresh: Vec<(String, i32)> = {
            let mut inflight = self.markers_in_flight.borrow_mut();
            m.partitions
                .iter()
                .filter(|(t, p)| inflight.insert((m.round, t.clone(), *p)))
                .cloned()
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        let shell = self.this.upgrade();
        glommio::spawn_local(async move {
            let results = write_markers(&broker, &m, &fresh).await;
            let Some(shell) = shell else { return };
            let mut fx = TxnEffects::default();
            for (tp, r) in results {
                shell
                    .markers_in_flight
                    .borrow_mut()
                    .remove(&(m.round, tp.0.clone(), tp.1));
                shell
                    .coord
                    .borrow_mut()
                    .marker_done(m.round, &tp, r, shell.rt.now_ms(), &mut fx);
            }
            shell.run_effects(&broker, fx).await;
        })
        .detach();
    }

    /// Appends one record to `__transaction_state-{partition}` and waits until every
    /// in-sync replica has it. Records reach the log in the order they were produced.
    /// An append whose partition was unloaded while it waited its turn (the coordinator
    /// no longer waits for it), or that this broker no longer leads in the epoch it was
    /// loaded at, is not written: NOT_COORDINATOR.
    async fn append(
        &self,
        broker: &Broker,
        id: AppendId,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), ApiError> {
        let still_led = || {
            let loaded_at = self.coord.borrow().append_epoch(id);
            let leads_at = Self::leads_at(broker, partition);
            if loaded_at.is_none() || loaded_at != leads_at {
                return Err(ApiError::with(
                    ResponseError::NotCoordinator,
                    format!("{TXN_STATE_TOPIC}-{partition} was loaded at epoch {loaded_at:?}, led at {leads_at:?}"),
                ));
            }
            Ok(())
        };
        self.rt
            .append(broker, partition, &[(Some(key), value)], None, still_led)
            .await
    }

    /// The leader epoch this broker leads `partition` at, if it leads it.
    fn leads_at(broker: &Broker, partition: i32) -> Option<i32> {
        broker
            .replica(TXN_STATE_TOPIC, partition)
            .ok()
            .and_then(|r| r.leader_epoch())
            .map(LeaderEpoch::get)
    }
}

/// How a `__transaction_state` partition is replayed into the coordinator, once per
/// leadership, after which the coordinator resumes transactions left half-way.
impl Replay for TxnShell {
    /// The leader epoch the load began at, and what beginning it asked for.
    type Load = (i32, TxnEffects);
    type Effects = TxnEffects;
    type Skip = TxnRecordError;

    fn begin(&self, broker: &Broker, partition: i32, _: i64) -> Result<Self::Load, ApiError> {
        let epoch = broker
            .replica(TXN_STATE_TOPIC, partition)
            .map_err(|e| ApiError::with(ResponseError::CoordinatorLoadInProgress, e.to_string()))?
            .leader_epoch()
            .ok_or_else(|| ApiError::new(ResponseError::NotCoordinator))?
            .get();
        let mut fx = TxnEffects::default();
        self.coord
            .borrow_mut()
            .begin_load(partition, epoch, &mut fx);
        Ok((epoch, fx))
    }

    fn apply(
        &self,
        _: &Self::Load,
        _: i32,
        key: &[u8],
        rec: &kafka_protocol::records::Record,
    ) -> Result<(), TxnRecordError> {
        self.coord
            .borrow_mut()
            .load_record(key, rec.value.as_deref())
    }

    /// The partition stays loading in the coordinator; the next load begins afresh.
    fn abandon(&self, _: Self::Load, _: i32) {}

    fn loaded(
        &self,
        (epoch, mut fx): Self::Load,
        broker: &Broker,
        partition: i32,
        now_ms: i64,
    ) -> Result<TxnEffects, ApiError> {
        // Leadership may have moved during the replay, where `leadership_changed` does
        // not see the partition (not loaded yet): a load at a stale epoch is dropped.
        if Self::leads_at(broker, partition) != Some(epoch) {
            self.coord.borrow_mut().unload(partition, &mut fx);
            self.deliver(fx.replies);
            return Err(ApiError::with(
                ResponseError::NotCoordinator,
                format!("{TXN_STATE_TOPIC}-{partition}: leadership moved while loading"),
            ));
        }
        self.coord.borrow_mut().loaded(partition, now_ms, &mut fx);
        Ok(fx)
    }

    /// Markers of transactions left in PrepareCommit/PrepareAbort go out now.
    async fn run(&self, broker: &Broker, fx: TxnEffects) {
        self.run_effects(broker, fx).await;
    }
}

/// Writes one round of markers: one WriteTxnMarkers request to each partition leader
/// (this broker's own address included). A partition without a leader, or whose leader
/// did not answer, is a failure the coordinator retries; one whose topic is gone is
/// `Gone`.
async fn write_markers(
    broker: &Broker,
    m: &MarkerWrite,
    partitions: &[(String, i32)],
) -> Vec<((String, i32), MarkerResult)> {
    let image = broker.image();
    let mut out = Vec::new();
    let mut by_leader: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    for (t, p) in partitions {
        let tp = (t.clone(), *p);
        match image.topics.get(t) {
            None => out.push((tp, MarkerResult::Gone)),
            Some(meta) if !(0..meta.partitions).contains(p) => out.push((tp, MarkerResult::Gone)),
            Some(meta) => match meta.assignment(*p).map(|a| a.leader) {
                Some(l) if l >= 0 => by_leader.entry(l).or_default().push(tp),
                _ => out.push((tp, MarkerResult::Failed(ResponseError::NotLeaderOrFollower))),
            },
        }
    }
    for (leader, tps) in by_leader {
        let results = match send_markers(broker, &image, leader, m, &tps).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(leader, error = %e, "WriteTxnMarkers failed; the coordinator retries");
                tps.iter()
                    .map(|tp| {
                        (
                            tp.clone(),
                            MarkerResult::Failed(ResponseError::RequestTimedOut),
                        )
                    })
                    .collect()
            }
        };
        out.extend(results);
    }
    out
}

/// A connection to partition leader `leader` as the image registers it, each call
/// bounded by [`MARKER_CALL_TIMEOUT`].
async fn leader_conn(
    image: &crate::base::metadata::MetadataImage,
    leader: i32,
    client_id: &'static str,
) -> Result<Conn, String> {
    let node = image
        .brokers
        .get(&BrokerId::new(leader))
        .ok_or_else(|| format!("broker {leader} is not registered"))?;
    let conn = Conn::connect_to(
        &node.host,
        node.port,
        client_id,
        Some(Duration::from_secs(1)),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(conn.with_call_timeout(MARKER_CALL_TIMEOUT))
}

async fn send_markers(
    _broker: &Broker,
    image: &crate::base::metadata::MetadataImage,
    leader: i32,
    m: &MarkerWrite,
    tps: &[(String, i32)],
) -> Result<Vec<((String, i32), MarkerResult)>, String> {
    let mut conn = leader_conn(image, leader, "sluice-txn-markers").await?;
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in tps {
        topics.entry(t.as_str()).or_default().push(*p);
    }
    let marker = WritableTxnMarker::default()
        .with_producer_id(m.producer_id.into())
        .with_producer_epoch(m.producer_epoch)
        .with_transaction_result(m.commit)
        .with_coordinator_epoch(m.coordinator_epoch)
        .with_topics(
            topics
                .into_iter()
                .map(|(t, ps)| {
                    WritableTxnMarkerTopic::default()
                        .with_name(TopicName(sb(t)))
                        .with_partition_indexes(ps)
                })
                .collect(),
        );
    let req = WriteTxnMarkersRequest::default().with_markers(vec![marker]);
    let resp = conn.call(1, &req).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for r in resp.markers {
        for t in r.topics {
            for p in t.partitions {
                let tp = (t.name.0.to_string(), p.partition_index);
                let result = match p.error_code {
                    0 => MarkerResult::Written,
                    code => match ResponseError::try_from_code(code) {
                        Some(ResponseError::UnknownTopicOrPartition) => MarkerResult::Gone,
                        Some(e) => MarkerResult::Failed(e),
                        None => MarkerResult::Failed(ResponseError::UnknownServerError),
                    },
                };
                out.push((tp, result));
            }
        }
    }
    Ok(out)
}

/// InitProducerId arguments from a request.
pub fn init_args(
    transactional_id: Option<String>,
    timeout_ms: i32,
    producer_id: i64,
    epoch: i16,
) -> InitArgs {
    InitArgs {
        transactional_id,
        transaction_timeout_ms: timeout_ms,
        producer_id,
        producer_epoch: epoch,
    }
}

/// KIP-890 part 1, on a partition's leader: a transactional batch of a producer with
/// no transaction open on this partition may only start one if the coordinator has the
/// partition in the producer's ongoing transaction. Otherwise a produce that arrives
/// after its transaction ended (a late retry, a zombie) would open a transaction the
/// coordinator knows nothing of, and hold the last stable offset forever.
pub async fn verify_produce(broker: &Broker, item: &rpc::ProduceItem) -> Result<(), ApiError> {
    let Some((producer_id, epoch)) = transactional_producer(&item.records) else {
        return Ok(());
    };
    let Some(txn_id) = item.transactional_id.as_deref() else {
        // Kafka's answer to transactional records without a transactional id.
        return Err(ApiError::with(
            ResponseError::TransactionalIdAuthorizationFailed,
            "transactional records without a transactional id",
        ));
    };
    let (log, _) = broker.log(&item.topic, item.partition)?;
    if log.txn_open(producer_id) {
        return Ok(());
    }
    let replica = broker.replica(&item.topic, item.partition)?;
    // A marker written while the coordinator answered may have ended the transaction
    // it vouched for: ask again.
    for _ in 0..3 {
        let before = replica.markers.get();
        // Boxed: only a transaction's first batch here asks, and its future inline
        // would make every produced batch's future kilobytes larger.
        let answer = Box::pin(verify(
            broker,
            txn_id,
            producer_id,
            epoch,
            &item.topic,
            item.partition,
        ))
        .await;
        if replica.markers.get() == before {
            return answer;
        }
    }
    Err(ApiError::with(
        ResponseError::ConcurrentTransactions,
        "transaction markers kept arriving while verifying",
    ))
}

/// The producer id and epoch of `records` if they are transactional, from the first
/// batch's header alone (no allocation on the produce path): a produce request holds
/// one producer's batches, and the append validates every batch afterwards.
fn transactional_producer(records: &bytes::Bytes) -> Option<(i64, i16)> {
    let h = sluice_storage::batch::BatchHeader::parse(records).ok()?;
    h.is_transactional()
        .then_some((h.producer_id, h.producer_epoch))
}

/// Asks the id's coordinator (here, or over AddPartitionsToTxn v4 verify-only) whether
/// `topic-partition` is in the producer's ongoing transaction, with Kafka's mapping of
/// the answer for a produce.
async fn verify(
    broker: &Broker,
    txn_id: &str,
    producer_id: i64,
    epoch: i16,
    topic: &str,
    partition: i32,
) -> Result<(), ApiError> {
    let state_partition = partition_for(txn_id);
    let image = broker.image();
    let leader = image
        .topics
        .get(TXN_STATE_TOPIC)
        .and_then(|m| m.assignment(state_partition))
        .map(|a| a.leader);
    let answer: Result<(), ResponseError> = match leader {
        Some(l) if l == broker.config.node_id => {
            let call = rpc::TxnVerify {
                partition: state_partition,
                transactional_id: txn_id.to_string(),
                producer_id: ProducerId::new(producer_id),
                producer_epoch: epoch,
                partitions: vec![TopicPartition::new(topic, partition)],
            };
            match route(broker, call).await {
                Ok(v) => v.into_iter().next().map_or(Ok(()), |v| v.code),
                Err(e) => Err(e.code),
            }
        }
        Some(l) if l >= 0 => verify_remote(&image, l, txn_id, producer_id, epoch, topic, partition)
            .await
            .unwrap_or_else(|e| {
                tracing::debug!(error = %e, "verification request failed");
                Err(ResponseError::CoordinatorNotAvailable)
            }),
        _ => Err(ResponseError::CoordinatorNotAvailable),
    };
    answer.map_err(|code| {
        use ResponseError::*;
        let code = match code {
            // The coordinator is moving or loading: the client retries the produce.
            CoordinatorNotAvailable
            | NotCoordinator
            | CoordinatorLoadInProgress
            | ConcurrentTransactions => NotEnoughReplicas,
            ProducerFenced => InvalidProducerEpoch,
            other => other,
        };
        ApiError::with(
            code,
            format!("{topic}-{partition} is not in the ongoing transaction of {txn_id}"),
        )
    })
}

async fn verify_remote(
    image: &crate::base::metadata::MetadataImage,
    leader: i32,
    txn_id: &str,
    producer_id: i64,
    epoch: i16,
    topic: &str,
    partition: i32,
) -> Result<Result<(), ResponseError>, String> {
    use kafka_protocol::messages::add_partitions_to_txn_request::{
        AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
    };
    use kafka_protocol::messages::{AddPartitionsToTxnRequest, TransactionalId};
    let mut conn = leader_conn(image, leader, "sluice-txn-verify").await?;
    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![
        AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(sb(txn_id)))
            .with_producer_id(producer_id.into())
            .with_producer_epoch(epoch)
            .with_verify_only(true)
            .with_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(sb(topic)))
                .with_partitions(vec![partition])]),
    ]);
    let resp = conn.call(4, &req).await.map_err(|e| e.to_string())?;
    let code = |c: i16| match c {
        0 => Ok(()),
        c => Err(ResponseError::try_from_code(c).unwrap_or(ResponseError::UnknownServerError)),
    };
    if let Err(e) = code(resp.error_code) {
        return Ok(Err(e));
    }
    Ok(resp
        .results_by_transaction
        .first()
        .and_then(|t| t.topic_results.first())
        .and_then(|t| t.results_by_partition.first())
        .map_or(Err(ResponseError::UnknownServerError), |p| {
            code(p.partition_error_code)
        }))
}
