//! The I/O shell around the [`Coordinator`] on one shard: it loads the
//! `__consumer_offsets` partitions this shard owns (on first use), passes requests and
//! the time in, appends and flushes the records that come out *before* any answer
//! leaves, and delivers deferred JoinGroup/SyncGroup answers to the waiting requests.
//! A ticker fires the coordinator's timers every [`TICK`].
//!
//! The state is per shard (one executor thread), so it sits in a thread-local and is
//! never shared across cores. Appends go through one permit so records reach the log in
//! the order the coordinator produced them.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use glommio::channels::local_channel::{self, LocalSender};
use glommio::sync::Semaphore;
use kafka_protocol::error::ResponseError;
use kafka_protocol::records::RecordBatchDecoder;

use super::coordinator::{Coordinator, CoordinatorConfig, Deferred, Effects, Record, Token};
use super::{partition_for, GroupReq, GroupResp, OFFSETS_TOPIC};
use crate::broker::Broker;
use crate::error::ApiError;
// Wall-clock time: commit timestamps are stored and compared across restarts.
use crate::util::now_ms;

/// How often timers (session expiry, join/sync deadlines, offset expiry) are checked.
pub const TICK: Duration = Duration::from_millis(100);
/// Bytes read per step while loading a partition.
const LOAD_READ_BYTES: usize = 1 << 20;

struct GroupShard {
    coord: RefCell<Coordinator>,
    loaded: RefCell<HashSet<i32>>,
    load_lock: Semaphore,
    append_lock: Semaphore,
    /// Deferred JoinGroup/SyncGroup answers: the group and where to send it.
    pending: RefCell<HashMap<Token, (String, LocalSender<Deferred>)>>,
    next_token: Cell<Token>,
}

thread_local! {
    static SHARD: RefCell<Option<Rc<GroupShard>>> = const { RefCell::new(None) };
}

fn state(broker: &Rc<Broker>) -> Rc<GroupShard> {
    if let Some(s) = SHARD.with(|s| s.borrow().clone()) {
        return s;
    }
    let s = Rc::new(GroupShard {
        coord: RefCell::new(Coordinator::new(coordinator_config(&broker.config))),
        loaded: RefCell::new(HashSet::new()),
        load_lock: Semaphore::new(1),
        append_lock: Semaphore::new(1),
        pending: RefCell::new(HashMap::new()),
        next_token: Cell::new(1),
    });
    SHARD.with(|cell| *cell.borrow_mut() = Some(s.clone()));
    let (b, st) = (Rc::downgrade(broker), s.clone());
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(TICK).await;
            // The broker is gone: the shard is stopping.
            let Some(b) = b.upgrade() else { return };
            let mut fx = Effects::default();
            st.coord.borrow_mut().tick(now_ms(), &mut fx);
            st.run_effects(&b, fx).await;
        }
    })
    .detach();
    s
}

/// The coordinator's settings from the broker's (the rest keep Kafka's defaults).
pub fn coordinator_config(c: &crate::config::BrokerConfig) -> CoordinatorConfig {
    CoordinatorConfig {
        session_timeout_min_ms: c.group_min_session_timeout_ms,
        session_timeout_max_ms: c.group_max_session_timeout_ms,
        initial_rebalance_delay_ms: c.group_initial_rebalance_delay_ms,
        offsets_retention_ms: c.offsets_retention_minutes * 60_000,
        ..CoordinatorConfig::default()
    }
}

/// The leadership of `__consumer_offsets` partition `partition` changed on this shard:
/// forget its groups, so that they are loaded afresh from the (replicated) log if this
/// broker leads the partition again.
pub fn unload(partition: i32) {
    let Some(s) = SHARD.with(|s| s.borrow().clone()) else {
        return;
    };
    if s.loaded.borrow_mut().remove(&partition) {
        // Waiting JoinGroup/SyncGroup requests of these groups get NOT_COORDINATOR.
        s.pending
            .borrow_mut()
            .retain(|_, (group, _)| partition_for(group) != partition);
        let n = s
            .coord
            .borrow_mut()
            .unload(|g| partition_for(g) != partition);
        tracing::info!(partition, groups = n, "unloaded {OFFSETS_TOPIC} partition");
    }
}

/// Serves one group request on the shard owning its `__consumer_offsets` partition.
pub async fn serve(
    broker: Rc<Broker>,
    partition: i32,
    req: GroupReq,
) -> Result<GroupResp, ApiError> {
    let st = state(&broker);
    // List covers every partition this shard leads (loaded below); the rest are for
    // the one partition the router checked this broker leads.
    if !matches!(req, GroupReq::List) {
        st.ensure_loaded(&broker, partition).await?;
    }
    let now = now_ms();
    let mut fx = Effects::default();
    let resp = match req {
        GroupReq::Join(args) => {
            let (token, rx) = st.waiter(&args.group_id);
            st.coord.borrow_mut().join(token, now, args, &mut fx);
            st.run_effects(&broker, fx).await;
            return wait(rx).await;
        }
        GroupReq::Sync(args) => {
            let (token, rx) = st.waiter(&args.group_id);
            st.coord.borrow_mut().sync(token, now, args, &mut fx);
            st.run_effects(&broker, fx).await;
            return wait(rx).await;
        }
        GroupReq::Heartbeat {
            group,
            generation,
            member,
            instance,
        } => GroupResp::Code(st.coord.borrow_mut().heartbeat(
            now,
            &group,
            generation,
            &member,
            instance.as_deref(),
        )),
        GroupReq::Leave { group, members } => {
            let (g, m) = st.coord.borrow_mut().leave(now, &group, &members, &mut fx);
            GroupResp::Leave(g, m)
        }
        GroupReq::Commit(args) => {
            let plan = st.coord.borrow_mut().plan_commit(now, args);
            let records = std::mem::take(&mut fx.records);
            let mut commit_fx = Effects {
                records: plan.records.clone(),
                replies: Vec::new(),
            };
            commit_fx.records.extend(records);
            if let Err(e) = st.append(&broker, commit_fx.records).await {
                // Not durable: refuse every partition, as Kafka does when the append
                // to the offsets topic fails (the client retries).
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
                return Ok(GroupResp::Commit(results));
            }
            let results = plan.results.clone();
            st.coord.borrow_mut().apply_commit(now, plan);
            GroupResp::Commit(results)
        }
        GroupReq::Fetch { group, partitions } => GroupResp::Fetch(
            st.coord
                .borrow()
                .fetch_offsets(&group, partitions.as_deref()),
        ),
        GroupReq::DeleteOffsets { group, partitions } => GroupResp::DeleteOffsets(
            st.coord
                .borrow_mut()
                .delete_offsets(&group, &partitions, &mut fx),
        ),
        GroupReq::Describe { group } => GroupResp::Describe(st.coord.borrow().describe(&group)),
        GroupReq::List => {
            // Every partition this shard owns must be loaded before it can list.
            st.load_all_owned(&broker).await?;
            GroupResp::List(st.coord.borrow().list())
        }
        GroupReq::DeleteGroup { group } => {
            GroupResp::Code(st.coord.borrow_mut().delete_group(now, &group, &mut fx))
        }
    };
    st.run_effects(&broker, fx).await;
    Ok(resp)
}

async fn wait(rx: local_channel::LocalReceiver<Deferred>) -> Result<GroupResp, ApiError> {
    match rx.recv().await {
        Some(Deferred::Join(r)) => Ok(GroupResp::Join(r)),
        Some(Deferred::Sync(r)) => Ok(GroupResp::Sync(r)),
        // The group's partition moved to another coordinator while the request waited:
        // the client finds the new one and retries.
        None => Err(ApiError::new(ResponseError::NotCoordinator)),
    }
}

impl GroupShard {
    fn waiter(&self, group: &str) -> (Token, local_channel::LocalReceiver<Deferred>) {
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        let (tx, rx) = local_channel::new_bounded(1);
        self.pending
            .borrow_mut()
            .insert(token, (group.to_string(), tx));
        (token, rx)
    }

    /// Appends the records, then answers the deferred requests.
    async fn run_effects(&self, broker: &Broker, fx: Effects) {
        if !fx.records.is_empty() {
            if let Err(e) = self.append(broker, fx.records).await {
                // Group metadata is rewritten at the next generation; offsets are not
                // in these records (commits append on their own path).
                tracing::warn!(error = %e, "writing group metadata to {OFFSETS_TOPIC} failed");
            }
        }
        for (token, reply) in fx.replies {
            if let Some((_, tx)) = self.pending.borrow_mut().remove(&token) {
                // The requester may have gone (connection closed): nothing to do.
                let _ = tx.try_send(reply);
            }
        }
    }

    /// Appends records to their partitions and waits until they are durable.
    async fn append(&self, broker: &Broker, records: Vec<Record>) -> Result<(), ApiError> {
        if records.is_empty() {
            return Ok(());
        }
        let _permit = self
            .append_lock
            .acquire_permit(1)
            .await
            .expect("append lock never closes");
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for r in records {
            by_partition
                .entry(partition_for(&r.group))
                .or_default()
                .push(r);
        }
        for (p, recs) in by_partition {
            let refs: Vec<sluice_storage::batch::build::NullableRecord<'_>> = recs
                .iter()
                .map(|r| (Some(r.key.as_slice()), r.value.as_deref()))
                .collect();
            let batch = sluice_storage::batch::build::batch_nullable(now_ms(), &refs);
            // As Kafka (offsets.commit.required.acks=-1): on every in-sync replica.
            broker
                .append_replicated(OFFSETS_TOPIC, p, bytes::Bytes::from(batch))
                .await?;
        }
        Ok(())
    }

    async fn load_all_owned(&self, broker: &Broker) -> Result<(), ApiError> {
        let image = broker.image();
        let Some(meta) = image.topics.get(OFFSETS_TOPIC) else {
            return Ok(());
        };
        for p in 0..meta.partitions {
            let leads = meta.assignment(p).map(|a| a.leader) == Some(broker.config.node_id);
            if leads && broker.owner(meta, p) == broker.shard {
                self.ensure_loaded(broker, p).await?;
            }
        }
        Ok(())
    }

    /// Replays a partition of `__consumer_offsets` into the coordinator, once.
    async fn ensure_loaded(&self, broker: &Broker, partition: i32) -> Result<(), ApiError> {
        if self.loaded.borrow().contains(&partition) {
            return Ok(());
        }
        let _permit = self
            .load_lock
            .acquire_permit(1)
            .await
            .expect("load lock never closes");
        if self.loaded.borrow().contains(&partition) {
            return Ok(());
        }
        let (log, _) = broker.log(OFFSETS_TOPIC, partition)?;
        let mut offset = log.log_start_offset();
        let mut loaded = 0usize;
        // Restored members' sessions start now (Kafka: onGroupLoaded).
        let now = now_ms();
        loop {
            let r = log.read(offset, LOAD_READ_BYTES, None).await.map_err(|e| {
                ApiError::with(ResponseError::CoordinatorLoadInProgress, e.to_string())
            })?;
            if r.records.is_empty() || r.next_offset <= offset {
                break;
            }
            offset = r.next_offset;
            let mut buf = r.records.clone();
            while !buf.is_empty() {
                let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| {
                    ApiError::with(
                        ResponseError::CoordinatorNotAvailable,
                        format!("{OFFSETS_TOPIC}-{partition}: {e}"),
                    )
                })?;
                let mut coord = self.coord.borrow_mut();
                for rec in set.records {
                    let Some(key) = rec.key else { continue };
                    if let Err(e) = coord.load_record(now, &key, rec.value.as_deref()) {
                        tracing::warn!(partition, offset = rec.offset, error = %e, "skipping record");
                    }
                    loaded += 1;
                }
            }
        }
        tracing::debug!(
            partition,
            records = loaded,
            "loaded {OFFSETS_TOPIC} partition"
        );
        self.loaded.borrow_mut().insert(partition);
        Ok(())
    }
}
