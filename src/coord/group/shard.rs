//! The I/O shell around the [`Coordinator`] on one shard: it loads the
//! `__consumer_offsets` partitions this shard owns (on first use), passes requests and
//! the time in, appends and flushes the records that come out *before* any answer
//! leaves, and delivers deferred JoinGroup/SyncGroup answers to the waiting requests.
//! A ticker fires the coordinator's timers every [`TICK`].
//!
//! One [`GroupShell`] per shard, built at start-up (`crate::node`) and owned by the
//! shard's server (`crate::serve::dispatch`); never shared across cores. It subscribes to the
//! partition host's leadership changes to forget groups whose `__consumer_offsets`
//! partition moved. Appends go through one permit so records reach the log in the
//! order the coordinator produced them.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::time::Duration;

use kafka_protocol::error::ResponseError;

use crate::coord::is_internal;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};
use sluice_coordinator::group::consumer::{Catalog, ConsumerGroupView, HeartbeatReply, Refused};
use sluice_coordinator::group::{
    Code, Coordinator, CoordinatorConfig, Deferred, Effects, GroupSummary, JoinToken, Record,
    SyncToken,
};

use super::writes::{Outcome, Writes};
use super::{partition_for, OFFSETS_TOPIC};
use crate::base::error::ApiError;
use crate::base::rpc::{self, FetchedOffset, PartitionCode};
use crate::coord::runtime::{answer, every, Replay, Runtime, Waiters};
use crate::coord::{coordinator_keys, partition_codes};
use crate::partition::broker::{Broker, PartitionEvents};
use sluice_coordinator::records::RecordError;
use sluice_storage::SystemClock;

/// How often timers (session expiry, join/sync deadlines, offset expiry) are checked.
pub const TICK: Duration = Duration::from_millis(100);

pub struct GroupShell {
    coord: RefCell<Coordinator>,
    rt: Runtime,
    /// Waiting JoinGroup requests: the group and where to send the answer. Joins and
    /// syncs wait in separate maps keyed by separate token types, so each waiter can
    /// only receive its own response type.
    pending_joins: Waiters<JoinToken, JoinGroupResponse, String>,
    pending_syncs: Waiters<SyncToken, SyncGroupResponse, String>,
    /// Every write to `__consumer_offsets`, in the coordinator's order (`writes.rs`).
    pub(super) writes: Writes,
    /// Itself and its broker, for the task that writes the queue.
    pub(super) me: Weak<GroupShell>,
    pub(super) broker: Weak<Broker>,
}

impl GroupShell {
    /// The shard's group shell: starts its timer ticker (it ends with the broker) and
    /// subscribes to the partition host's leadership changes.
    pub fn start(broker: &Rc<Broker>) -> Rc<GroupShell> {
        let s = Rc::new_cyclic(|me| GroupShell {
            coord: RefCell::new(Coordinator::new(coordinator_config(&broker.config))),
            rt: Runtime::new(OFFSETS_TOPIC, Rc::new(SystemClock)),
            pending_joins: Waiters::new(),
            pending_syncs: Waiters::new(),
            writes: Writes::default(),
            me: me.clone(),
            broker: Rc::downgrade(broker),
        });
        broker.subscribe(s.clone());
        every(TICK, broker, &s, |b, st: Rc<GroupShell>| async move {
            let mut fx = Effects::default();
            let now = st.rt.now_ms();
            st.coord.borrow_mut().tick(now, &mut fx);
            st.coord
                .borrow_mut()
                .assign_due(now, &ImageCatalog(b.image()), &mut fx);
            st.run_effects(&b, fx).await;
        });
        s
    }
}

impl GroupShell {
    /// The coordinator, to read (the lag sampler takes the committed offsets).
    pub fn coordinator(&self) -> std::cell::Ref<'_, Coordinator> {
        self.coord.borrow()
    }
}

/// The coordinator's settings from the broker's (the rest keep Kafka's defaults).
pub fn coordinator_config(c: &crate::base::config::BrokerConfig) -> CoordinatorConfig {
    CoordinatorConfig {
        session_timeout_min_ms: c.group_min_session_timeout_ms,
        session_timeout_max_ms: c.group_max_session_timeout_ms,
        initial_rebalance_delay_ms: c.group_initial_rebalance_delay_ms,
        offsets_retention_ms: c.offsets_retention_minutes * 60_000,
        // Checked positive by the config (Kafka: at least 1).
        group_max_size: usize::try_from(c.group_max_size).unwrap_or(1),
        metadata_batch_bytes_max: crate::partition::broker::INTERNAL_BATCH_BYTES_MAX,
        consumer: sluice_coordinator::group::consumer::ConsumerConfig {
            session_timeout_ms: c.group_consumer_session_timeout_ms,
            heartbeat_interval_ms: c.group_consumer_heartbeat_interval_ms,
            assignors: c.group_consumer_assignors.clone(),
            // group.consumer.max.size defaults to group.max.size here.
            max_size: usize::try_from(c.group_max_size).unwrap_or(1),
        },
        ..CoordinatorConfig::default()
    }
}

impl PartitionEvents for GroupShell {
    /// The leadership of a `__consumer_offsets` partition changed on this shard: forget
    /// its groups, so that they are loaded afresh from the (replicated) log if this
    /// broker leads the partition again.
    fn leadership_changed(&self, topic: &str, partition: i32) {
        if topic == OFFSETS_TOPIC {
            self.forget_partition(partition);
        }
    }
}

impl GroupShell {
    /// Forgets the groups of a `__consumer_offsets` partition: the next request loads
    /// them afresh from the (replicated) log.
    pub(super) fn forget_partition(&self, partition: i32) {
        if !self.rt.forget(partition) {
            return;
        }
        // Waiting JoinGroup/SyncGroup requests of these groups get NOT_COORDINATOR.
        self.pending_joins
            .retain(|group| partition_for(group) != partition);
        self.pending_syncs
            .retain(|group| partition_for(group) != partition);
        let n = self
            .coord
            .borrow_mut()
            .unload(|g| partition_for(g) != partition);
        tracing::info!(partition, groups = n, "unloaded {OFFSETS_TOPIC} partition");
    }
}

/// The topics KIP-848 subscriptions resolve against: the broker's metadata image
/// (internal topics are never subscribed by a regex, nor by name).
struct ImageCatalog(std::sync::Arc<crate::base::metadata::MetadataImage>);

impl Catalog for ImageCatalog {
    fn version(&self) -> u64 {
        self.0.epoch
    }

    fn topic(&self, name: &str) -> Option<(uuid::Uuid, i32)> {
        if is_internal(name) {
            return None;
        }
        self.0.topics.get(name).map(|t| (t.id, t.partitions))
    }

    fn for_each_name(&self, f: &mut dyn FnMut(&str)) {
        for name in self.0.topics.keys().filter(|n| !is_internal(n)) {
            f(name);
        }
    }
}

/// The group calls, served on the shard owning the group's `__consumer_offsets`
/// partition (loaded first). Records the coordinator produces are durable before the
/// answer leaves.
impl GroupShell {
    pub async fn join(&self, b: &Broker, c: rpc::JoinGroup) -> Result<JoinGroupResponse, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let token = JoinToken(self.rt.next_token());
        let rx = self
            .pending_joins
            .register(token, c.args.group_id.to_string());
        let mut fx = Effects::default();
        self.coord
            .borrow_mut()
            .join(token, self.rt.now_ms(), c.args, &mut fx);
        self.run_effects(b, fx).await;
        answer(rx).await
    }

    pub async fn sync(&self, b: &Broker, c: rpc::SyncGroup) -> Result<SyncGroupResponse, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let token = SyncToken(self.rt.next_token());
        let rx = self
            .pending_syncs
            .register(token, c.args.group_id.to_string());
        let mut fx = Effects::default();
        self.coord
            .borrow_mut()
            .sync(token, self.rt.now_ms(), c.args, &mut fx);
        self.run_effects(b, fx).await;
        answer(rx).await
    }

    pub async fn heartbeat(&self, b: &Broker, c: rpc::Heartbeat) -> Result<Code, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        Ok(self.coord.borrow_mut().heartbeat(
            self.rt.now_ms(),
            &c.group,
            c.generation,
            &c.member,
            c.instance.as_deref(),
        ))
    }

    pub async fn leave(
        &self,
        b: &Broker,
        c: rpc::LeaveGroup,
    ) -> Result<(Code, Vec<Code>), ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let mut fx = Effects::default();
        let r = self
            .coord
            .borrow_mut()
            .leave(self.rt.now_ms(), &c.group, &c.members, &mut fx);
        self.run_effects(b, fx).await;
        Ok(r)
    }

    pub async fn commit(
        &self,
        b: &Broker,
        c: rpc::CommitOffsets,
    ) -> Result<Vec<PartitionCode>, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let now = self.rt.now_ms();
        let plan = self.coord.borrow_mut().plan_commit(now, c.args);
        // Cancelled while its records are written (its connection went away), the
        // plan is still settled: expiry skips partitions with a commit in flight.
        let mut unsettled = Unsettled {
            coord: &self.coord,
            plan: Some(plan),
            fail: Coordinator::fail_commit,
        };
        let records = unsettled.plan.as_ref().expect("set").records.clone();
        let written = first_error(self.write(records, None, None).await);
        let plan = unsettled.plan.take().expect("set");
        if let Err(e) = written {
            self.coord.borrow_mut().fail_commit(&plan);
            // Not durable: refuse every partition, as Kafka does when the append to the
            // offsets topic fails (the client retries).
            let code = if e.code == ResponseError::KafkaStorageError {
                ResponseError::CoordinatorNotAvailable
            } else {
                e.code
            };
            let results = plan
                .results
                .into_iter()
                .map(|(tp, r)| (tp, r.and(Err(code))))
                .collect();
            return Ok(partition_codes(results));
        }
        let results = partition_codes(plan.results.clone());
        self.coord.borrow_mut().apply_commit(now, plan);
        Ok(results)
    }

    pub async fn fetch(
        &self,
        b: &Broker,
        c: rpc::FetchOffsets,
    ) -> Result<Vec<FetchedOffset>, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        if let Some((member, epoch)) = &c.member {
            if let Some(e) = self
                .coord
                .borrow()
                .offset_fetch_member_error(&c.group, member, *epoch)
            {
                return Err(ApiError::new(e));
            }
        }
        let asked = c.partitions.as_deref().map(coordinator_keys);
        let fetched =
            self.coord
                .borrow()
                .fetch_offsets_stable(&c.group, asked.as_deref(), c.require_stable);
        Ok(fetched
            .into_iter()
            .map(|(tp, offset)| FetchedOffset {
                partition: tp.into(),
                offset,
            })
            .collect())
    }

    /// TxnOffsetCommit: the offsets are written as one transactional batch of the
    /// producer and stay pending until its transaction's marker reaches the partition.
    pub async fn txn_commit(
        &self,
        b: &Broker,
        c: rpc::TxnCommitOffsets,
    ) -> Result<Vec<PartitionCode>, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let plan = self
            .coord
            .borrow_mut()
            .plan_txn_commit(self.rt.now_ms(), c.args);
        if plan.records.is_empty() {
            return Ok(partition_codes(plan.results));
        }
        let mut unsettled = Unsettled {
            coord: &self.coord,
            plan: Some(plan),
            fail: Coordinator::fail_txn_commit,
        };
        let pending = unsettled.plan.as_ref().expect("set");
        let (records, producer) = (
            pending.records.clone(),
            (pending.producer_id, pending.producer_epoch),
        );
        let written = first_error(self.write(records, Some(producer), None).await);
        let plan = unsettled.plan.take().expect("set");
        if let Err(e) = written {
            self.coord.borrow_mut().fail_txn_commit(&plan);
            let code = if e.code == ResponseError::KafkaStorageError {
                ResponseError::CoordinatorNotAvailable
            } else {
                e.code
            };
            return Ok(partition_codes(
                plan.results
                    .into_iter()
                    .map(|(tp, r)| (tp, r.and(Err(code))))
                    .collect(),
            ));
        }
        let results = partition_codes(plan.results.clone());
        self.coord.borrow_mut().apply_txn_commit(plan);
        Ok(results)
    }

    /// A transaction marker of `producer_id` was written on `__consumer_offsets`
    /// partition `partition` of this shard: its pending offsets become visible (commit)
    /// or go (abort).
    pub fn complete_txn(&self, partition: i32, producer_id: i64, commit: bool) {
        if !self.rt.is_loaded(partition) {
            return; // loaded later from the log, marker included
        }
        self.coord
            .borrow_mut()
            .complete_txn(producer_id, commit, |g| partition_for(g) == partition);
    }

    pub async fn delete_offsets(
        &self,
        b: &Broker,
        c: rpc::DeleteOffsets,
    ) -> Result<Result<Vec<Code>, ResponseError>, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let mut fx = Effects::default();
        let r = self.coord.borrow_mut().delete_offsets(
            &c.group,
            &coordinator_keys(&c.partitions),
            &mut fx,
        );
        self.run_effects(b, fx).await;
        Ok(r)
    }

    /// ConsumerGroupHeartbeat: the records it produced are durable before it is
    /// answered. If they cannot be stored, memory is ahead of the log: the partition's
    /// groups are forgotten (they reload from the log at the next request) and the
    /// member gets the append's error, retriable.
    pub async fn consumer_heartbeat(
        &self,
        b: &Broker,
        c: rpc::ConsumerHeartbeat,
    ) -> Result<Result<HeartbeatReply, Refused>, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let image = b.image();
        let mut args = c.args;
        // The group's own configs (IncrementalAlterConfigs on its GROUP resource).
        if let Some(own) = image.group_configs.get(&args.group_id) {
            let ms = |name: &str| own.get(name).and_then(|v| v.trim().parse().ok());
            args.session_timeout_ms = ms("consumer.session.timeout.ms");
            args.heartbeat_interval_ms = ms("consumer.heartbeat.interval.ms");
        }
        let catalog = ImageCatalog(image);
        let mut fx = Effects::default();
        let r =
            self.coord
                .borrow_mut()
                .consumer_heartbeat(self.rt.now_ms(), args, &catalog, &mut fx);
        assert!(fx.replies.is_empty(), "heartbeats defer nothing");
        // Waits for what was queued before for the partition too: the answer reads
        // memory that earlier heartbeats' records made.
        let written = self.write(fx.records, None, Some(c.partition)).await;
        if let Err(e) = first_error(written) {
            // The writer reloads the partition's groups; the member retries.
            return Err(ApiError::with(heartbeat_store_error(e.code), e.to_string()));
        }
        Ok(r)
    }

    pub async fn describe_consumer(
        &self,
        b: &Broker,
        c: rpc::DescribeConsumerGroup,
    ) -> Result<Result<ConsumerGroupView, Refused>, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        Ok(self.coord.borrow().describe_consumer_group(&c.group))
    }

    pub async fn describe(
        &self,
        b: &Broker,
        c: rpc::DescribeGroup,
    ) -> Result<GroupSummary, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        Ok(self.coord.borrow().describe(&c.group))
    }

    /// Every group of every `__consumer_offsets` partition this shard leads.
    pub async fn list(&self, b: &Broker) -> Result<Vec<rpc::GroupListing>, ApiError> {
        self.rt.load_all_led(b, self).await?;
        let groups = self.coord.borrow().list();
        Ok(groups
            .into_iter()
            .map(
                |(group_id, protocol_type, state, group_type)| rpc::GroupListing {
                    group_id,
                    protocol_type,
                    state,
                    group_type,
                },
            )
            .collect())
    }

    pub async fn delete_group(&self, b: &Broker, c: rpc::DeleteGroup) -> Result<Code, ApiError> {
        self.rt.load(b, c.partition, self).await?;
        let mut fx = Effects::default();
        let r = self
            .coord
            .borrow_mut()
            .delete_group(self.rt.now_ms(), &c.group, &mut fx);
        self.run_effects(b, fx).await;
        Ok(r)
    }
}

/// What a JoinGroup/SyncGroup answer carries when its group's records could not be
/// appended (Kafka's `storeGroup` mapping): retriable coordinator errors where the
/// client should find the coordinator again or rejoin, UNKNOWN_SERVER_ERROR for a
/// record too large to store (the client rejoins; the broker log names the group).
fn store_error(append: ResponseError) -> ResponseError {
    use ResponseError as E;
    match append {
        E::UnknownTopicOrPartition
        | E::NotEnoughReplicas
        | E::NotEnoughReplicasAfterAppend
        | E::KafkaStorageError => E::CoordinatorNotAvailable,
        E::NotLeaderOrFollower => E::NotCoordinator,
        E::RequestTimedOut => E::RebalanceInProgress,
        E::MessageTooLarge | E::RecordListTooLarge | E::InvalidFetchSize => E::UnknownServerError,
        other => other,
    }
}

/// What a KIP-848 heartbeat carries when its records could not be stored: codes
/// librdkafka retries on (it finds the coordinator again), never one it takes as fatal
/// (REBALANCE_IN_PROGRESS, say), as Kafka maps them for the new protocol.
fn heartbeat_store_error(append: ResponseError) -> ResponseError {
    use ResponseError as E;
    match append {
        E::NotLeaderOrFollower | E::NotCoordinator => E::NotCoordinator,
        _ => E::CoordinatorNotAvailable,
    }
}

/// The first failed partition's error of a write, if any.
fn first_error(outcome: Outcome) -> Result<(), ApiError> {
    outcome
        .into_values()
        .find_map(Result::err)
        .map_or(Ok(()), Err)
}

impl GroupShell {
    /// Appends the records, then answers the deferred requests. If a partition's
    /// records cannot be stored, the answers of their groups carry the append's error
    /// instead (as Kafka's `storeGroup`) and the coordinator drops the generation the
    /// records describe ([`Coordinator::metadata_not_stored`]): no member is told of
    /// an assignment that a restart or a coordinator move would not find.
    async fn run_effects(&self, _broker: &Broker, fx: Effects) {
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for r in &fx.records {
            by_partition
                .entry(partition_for(&r.group))
                .or_default()
                .push(r.clone());
        }
        let mut outcome = self.write(fx.records, None, None).await;
        let mut failed: HashMap<String, ResponseError> = HashMap::new();
        let mut more = Effects::default();
        for (p, recs) in by_partition {
            let Some(Err(e)) = outcome.remove(&p) else {
                continue;
            };
            let code = store_error(e.code);
            let groups: HashSet<&str> = recs.iter().map(|r| r.group.as_str()).collect();
            if code == ResponseError::UnknownServerError {
                // Not transient: the group's members cannot form a generation until
                // it shrinks; the operator needs to know which group.
                tracing::error!(?groups, partition = p, error = %e,
                    "cannot store group metadata in {OFFSETS_TOPIC}: members get {code:?}");
            } else {
                tracing::warn!(?groups, partition = p, error = %e,
                    "cannot store group metadata in {OFFSETS_TOPIC}: members get {code:?}");
            }
            for r in &recs {
                failed.insert(r.group.clone(), code);
                self.coord
                    .borrow_mut()
                    .metadata_not_stored(self.rt.now_ms(), r, &mut more);
            }
        }
        assert!(
            more.records.is_empty(),
            "dropping a generation writes nothing"
        );
        for reply in fx.replies.into_iter().chain(more.replies) {
            let group = match &reply {
                Deferred::Join(t, _) => self.pending_joins.tag(t),
                Deferred::Sync(t, _) => self.pending_syncs.tag(t),
            };
            let reply = match group.and_then(|g| failed.get(&g).copied()) {
                Some(code) => reply.failed(code),
                None => reply,
            };
            match reply {
                Deferred::Join(token, r) => self.pending_joins.deliver(&token, r),
                Deferred::Sync(token, r) => self.pending_syncs.deliver(&token, r),
            }
        }
    }

    /// Appends records to one partition as one batch (transactional for a producer, if
    /// given) and waits until every in-sync replica has it. Only the writer calls it
    /// (`writes.rs`), one batch at a time, in the coordinator's order.
    pub(super) async fn append_batch(
        &self,
        broker: &Broker,
        partition: i32,
        records: &[Record],
        producer: Option<(i64, i16)>,
    ) -> Result<(), ApiError> {
        let refs: Vec<sluice_storage::batch::build::NullableRecord<'_>> = records
            .iter()
            .map(|r| (Some(r.key.as_slice()), r.value.as_deref()))
            .collect();
        // As Kafka (offsets.commit.required.acks=-1): on every in-sync replica.
        self.rt
            .append(broker, partition, &refs, producer, || Ok(()))
            .await
    }
}

/// How a `__consumer_offsets` partition is replayed into the coordinator.
impl Replay for GroupShell {
    /// When the load began: restored members' sessions start then (Kafka:
    /// onGroupLoaded).
    type Load = i64;
    type Effects = Effects;
    type Skip = RecordError;

    fn begin(&self, _: &Broker, _: i32, now_ms: i64) -> Result<i64, ApiError> {
        Ok(now_ms)
    }

    fn apply(
        &self,
        &began_ms: &i64,
        partition: i32,
        key: &[u8],
        rec: &kafka_protocol::records::Record,
    ) -> Result<(), RecordError> {
        let mut coord = self.coord.borrow_mut();
        if rec.control {
            // An end-transaction marker: key = version i16, type i16 (0 abort, 1 commit).
            if key.len() >= 4 {
                let commit = i16::from_be_bytes([key[2], key[3]]) == 1;
                coord.load_marker(rec.producer_id, commit, |g| partition_for(g) == partition);
            }
            Ok(())
        } else if rec.transactional {
            coord.load_txn_record(began_ms, rec.producer_id, key, rec.value.as_deref())
        } else {
            coord.load_record(began_ms, key, rec.value.as_deref())
        }
    }

    /// What was replayed is partial: forget it (its groups would stay `loading`, never
    /// expiring); the next request loads again.
    fn abandon(&self, _: i64, partition: i32) {
        self.coord
            .borrow_mut()
            .unload(|g| partition_for(g) != partition);
    }

    /// Groups loaded over group.max.size rebalance now (Kafka's onGroupLoaded).
    fn loaded(&self, _: i64, _: &Broker, partition: i32, now_ms: i64) -> Result<Effects, ApiError> {
        let mut fx = Effects::default();
        self.coord
            .borrow_mut()
            .loaded(now_ms, |g| partition_for(g) == partition, &mut fx);
        Ok(fx)
    }

    async fn run(&self, broker: &Broker, fx: Effects) {
        self.run_effects(broker, fx).await;
    }
}

/// A commit plan whose records are being written: dropped before it was settled (the
/// request task was cancelled), it is failed, so the coordinator stops counting it.
struct Unsettled<'a, P> {
    coord: &'a RefCell<Coordinator>,
    plan: Option<P>,
    fail: fn(&mut Coordinator, &P),
}

impl<P> Drop for Unsettled<'_, P> {
    fn drop(&mut self) {
        if let Some(plan) = self.plan.take() {
            if let Ok(mut coord) = self.coord.try_borrow_mut() {
                (self.fail)(&mut coord, &plan);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_group_writes_answer_with_kafkas_codes() {
        use ResponseError as E;
        assert_eq!(store_error(E::MessageTooLarge), E::UnknownServerError);
        assert_eq!(
            store_error(E::NotEnoughReplicas),
            E::CoordinatorNotAvailable
        );
        assert_eq!(
            store_error(E::KafkaStorageError),
            E::CoordinatorNotAvailable
        );
        assert_eq!(store_error(E::NotLeaderOrFollower), E::NotCoordinator);
        assert_eq!(store_error(E::RequestTimedOut), E::RebalanceInProgress);
    }
}
