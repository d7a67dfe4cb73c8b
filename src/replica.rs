//! The I/O shell of ISR replication on a partition's home shard.
//!
//! A [`Replica`] wraps a partition's log with its role, from the committed metadata:
//! - **leader**: an [`isr::Leader`] tracks each follower's durable log end (their fetch
//!   offsets), computes the high watermark over the maximal ISR, proposes ISR shrinks
//!   (a periodic check) and expansions (on fetches) to the controller, and answers
//!   `acks=all` produces once the high watermark covers them;
//! - **follower**: an [`isr::Follower`] first truncates its log to where it agrees with
//!   the leader (OffsetForLeaderEpoch, KIP-101/279), then a per-shard fetcher pulls
//!   batches from the leader with Fetch (carrying this broker's replica id), appends
//!   them with their offsets, makes them durable, and only then reports the new end in
//!   its next fetch — so the leader counts nothing that is not on disk.
//!
//! Each replica keeps its leader-epoch history in `leader-epoch-checkpoint` in the
//! partition directory (written atomically before the first batch of a new epoch).
//! Consumers read only up to the high watermark.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use event_listener::Event;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{BrokerId, RequestHeader, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request};
use sluice_replication::cluster::{Command, PartitionState};
use sluice_replication::isr::{self, FollowerPhase, Leader, LeaderEpochCache, LeaderInit};
use sluice_storage::{batch, PartitionLog};

use crate::api::sb;
use crate::broker::Broker;
use crate::controller::{ControlOp, ControlResult};
use crate::error::{self, ApiError};

const CHECKPOINT: &str = "leader-epoch-checkpoint";
/// Follower fetch parameters.
const FETCH_MAX_WAIT_MS: i32 = 200;
const FETCH_PARTITION_BYTES: i32 = 4 << 20;
const FETCH_BYTES: i32 = 32 << 20;
/// Back-off after a failed fetch or connection.
const RETRY: Duration = Duration::from_millis(100);
/// How often leaders check for followers that fell out of sync.
pub const ISR_CHECK: Duration = Duration::from_millis(250);

pub enum Role {
    /// No live leader, or not a replica: serve nothing.
    Offline,
    Leader(Leader),
    Follower(isr::Follower),
}

pub struct Replica {
    pub topic: String,
    pub partition: i32,
    pub log: Rc<PartitionLog>,
    pub role: RefCell<Role>,
    epochs: RefCell<LeaderEpochCache>,
    /// Log end made durable (fdatasync done, or accepted under an interval flush policy).
    durable: Cell<i64>,
    /// The high watermark this replica last knew in any role.
    last_hw: Cell<i64>,
    /// The partition's leader epoch in the latest adopted metadata (whatever our role):
    /// requests naming another epoch are fenced or unknown (KIP-320).
    known_epoch: Cell<i32>,
    /// Fires on durable progress, high-watermark moves and role changes.
    pub progress: Event,
    checkpoint: PathBuf,
}

/// Wall-clock milliseconds, as the ISR state machines take them.
fn now_ms() -> u64 {
    crate::util::now_ms().max(0) as u64
}

fn fetch_error(e: &isr::FetchError) -> ApiError {
    let code = match e {
        isr::FetchError::NotAReplica(_) => ResponseError::NotLeaderOrFollower,
        isr::FetchError::FencedLeaderEpoch { .. } => ResponseError::FencedLeaderEpoch,
        isr::FetchError::UnknownLeaderEpoch { .. } => ResponseError::UnknownLeaderEpoch,
    };
    ApiError::with(code, e.to_string())
}

fn not_leader() -> ApiError {
    ApiError::with(
        ResponseError::NotLeaderOrFollower,
        "this broker is not the leader of the partition",
    )
}

impl Replica {
    pub fn open(topic: &str, partition: i32, log: Rc<PartitionLog>) -> Rc<Replica> {
        let checkpoint = log.dir().join(CHECKPOINT);
        let end = log.log_end_offset();
        let mut epochs = match std::fs::read_to_string(&checkpoint) {
            Ok(text) => LeaderEpochCache::decode(&text).unwrap_or_else(|e| {
                tracing::warn!(path = %checkpoint.display(), error = %e, "unreadable leader-epoch checkpoint; starting empty");
                LeaderEpochCache::default()
            }),
            Err(_) => LeaderEpochCache::default(),
        };
        // The log may have lost an unsynced tail that an epoch entry points into.
        epochs.truncate_from_end(end);
        Rc::new(Replica {
            topic: topic.to_string(),
            partition,
            log,
            role: RefCell::new(Role::Offline),
            epochs: RefCell::new(epochs),
            durable: Cell::new(end),
            last_hw: Cell::new(0),
            known_epoch: Cell::new(-1),
            progress: Event::new(),
            checkpoint,
        })
    }

    fn notify(&self) {
        self.progress.notify(usize::MAX);
    }

    pub fn durable_end(&self) -> i64 {
        self.durable.get()
    }

    pub fn high_watermark(&self) -> i64 {
        match &*self.role.borrow() {
            Role::Leader(l) => l.high_watermark(),
            Role::Follower(f) => f.high_watermark(),
            Role::Offline => self.last_hw.get(),
        }
    }

    /// The leader epoch if this replica leads.
    pub fn leader_epoch(&self) -> Option<i32> {
        match &*self.role.borrow() {
            Role::Leader(l) => Some(l.leader_epoch()),
            _ => None,
        }
    }

    fn persist_epochs(&self) {
        let text = self.epochs.borrow().encode();
        let tmp = self.checkpoint.with_extension("tmp");
        let r = (|| -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.checkpoint)?;
            std::fs::File::open(self.log.dir())?.sync_all()
        })();
        if let Err(e) = r {
            tracing::error!(path = %self.checkpoint.display(), error = %e, "writing leader-epoch checkpoint failed");
        }
    }

    fn assign_epoch(&self, epoch: i32, start: i64) {
        if self.epochs.borrow_mut().assign(epoch, start) {
            self.persist_epochs();
        }
    }

    /// Makes a leader's appends so far durable (as the topic's flush policy asks) and
    /// counts them, if this replica still leads in `epoch`: a deposed leader's late
    /// appends must never count as held (the fetcher truncates them away).
    pub async fn flush(&self, epoch: i32) -> Result<(), ApiError> {
        let end = self.log.log_end_offset();
        self.log
            .flush_for_ack()
            .await
            .map_err(|e| error::from_storage(&e))?;
        let mut role = self.role.borrow_mut();
        let Role::Leader(l) = &mut *role else {
            return Err(not_leader());
        };
        if l.leader_epoch() != epoch {
            return Err(not_leader());
        }
        // A truncation cannot have happened under the same leader epoch, but clamp anyway.
        let end = end.min(self.log.log_end_offset());
        if end > self.durable.get() {
            self.durable.set(end);
            l.on_local_durable(end);
            drop(role);
            self.notify();
        }
        Ok(())
    }

    /// KIP-320: the requester's view of the leader epoch against the latest metadata.
    fn check_known_epoch(&self, requester: i32) -> Result<(), ApiError> {
        let known = self.known_epoch.get();
        if requester < 0 || requester == known {
            Ok(())
        } else if requester < known {
            Err(ApiError::with(
                ResponseError::FencedLeaderEpoch,
                format!("leader epoch {requester} is older than {known}"),
            ))
        } else {
            Err(ApiError::with(
                ResponseError::UnknownLeaderEpoch,
                format!("leader epoch {requester} is newer than {known}"),
            ))
        }
    }

    /// Adopts the committed assignment. Returns the leader to follow if this replica
    /// just became (or stays) a follower.
    pub fn reconcile(&self, me: i32, a: &PartitionState, lag_max_ms: u64) -> Option<i32> {
        self.known_epoch.set(a.leader_epoch);
        let mut role = self.role.borrow_mut();
        let hw = match &*role {
            Role::Leader(l) => l.high_watermark(),
            Role::Follower(f) => f.high_watermark(),
            Role::Offline => self.last_hw.get(),
        };
        self.last_hw.set(hw);
        if a.leader == me {
            if let Role::Leader(l) = &mut *role {
                if l.leader_epoch() == a.leader_epoch {
                    l.on_metadata(a.leader_epoch, a.partition_epoch, &a.isr, &a.replicas);
                    drop(role);
                    self.notify();
                    return None;
                }
            }
            let end = self.log.log_end_offset();
            self.assign_epoch(a.leader_epoch, end);
            let durable = self.durable.get().min(end);
            let mut l = Leader::new(LeaderInit {
                me,
                leader_epoch: a.leader_epoch,
                partition_epoch: a.partition_epoch,
                replicas: a.replicas.clone(),
                isr: a.isr.clone(),
                epoch_start_offset: end,
                durable_log_end: durable,
                high_watermark: hw.min(durable),
                now_ms: now_ms(),
                replica_lag_time_max_ms: lag_max_ms,
            });
            l.on_local_durable(durable);
            tracing::info!(topic = %self.topic, partition = self.partition, epoch = a.leader_epoch, isr = ?a.isr, "leading");
            *role = Role::Leader(l);
            drop(role);
            self.notify();
            return None;
        }
        if !a.replicas.contains(&me) || a.leader < 0 {
            *role = Role::Offline;
            drop(role);
            self.notify();
            return None;
        }
        if let Role::Follower(f) = &*role {
            if f.leader() == a.leader && f.leader_epoch() == a.leader_epoch {
                return Some(a.leader);
            }
        }
        tracing::info!(topic = %self.topic, partition = self.partition, leader = a.leader, epoch = a.leader_epoch, "following");
        *role = Role::Follower(isr::Follower::new(me, a.leader, a.leader_epoch, hw));
        drop(role);
        self.notify();
        Some(a.leader)
    }

    /// acks=all gate before appending.
    pub fn check_min_isr(&self, min_insync: usize) -> Result<i32, ApiError> {
        match &*self.role.borrow() {
            Role::Leader(l) => {
                l.check_min_isr(min_insync)
                    .map_err(|e| ApiError::with(ResponseError::NotEnoughReplicas, e.to_string()))?;
                Ok(l.leader_epoch())
            }
            _ => Err(not_leader()),
        }
    }

    /// Waits until the high watermark covers `end` (acks=all), or the deadline.
    pub async fn wait_acked(
        &self,
        end: i64,
        epoch: i32,
        min_insync: usize,
        timeout: Duration,
    ) -> Result<(), ApiError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let listener = self.progress.listen();
            match &*self.role.borrow() {
                Role::Leader(l) if l.leader_epoch() == epoch => match l.acked(end, min_insync) {
                    isr::AckState::Acked => return Ok(()),
                    isr::AckState::NotEnoughReplicasAfterAppend => {
                        return Err(ApiError::with(
                            ResponseError::NotEnoughReplicasAfterAppend,
                            format!(
                                "the ISR has fewer than min.insync.replicas={min_insync} members"
                            ),
                        ))
                    }
                    isr::AckState::Pending => {}
                },
                // Leadership moved: the record may or may not survive; the client retries.
                _ => return Err(not_leader()),
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(ApiError::with(
                    ResponseError::RequestTimedOut,
                    "the in-sync replicas did not confirm the write in time",
                ));
            }
            futures_lite::future::or(listener, glommio::timer::sleep(left)).await;
        }
    }

    /// What a fetch may read up to: followers read durable data, consumers up to the
    /// high watermark. Also records the follower's progress.
    pub fn fetch_bound(
        &self,
        replica_id: i32,
        current_leader_epoch: i32,
        fetch_offset: i64,
    ) -> Result<(i64, i64, Option<isr::AlterIsr>), ApiError> {
        self.check_known_epoch(current_leader_epoch)?;
        let mut role = self.role.borrow_mut();
        let Role::Leader(l) = &mut *role else {
            return Err(not_leader());
        };
        if replica_id >= 0 {
            // Never record progress the follower cannot have: past our durable end (a
            // divergent log) it must truncate first.
            if fetch_offset > l.durable_log_end() || fetch_offset < self.log.log_start_offset() {
                return Err(ApiError::with(
                    ResponseError::OffsetOutOfRange,
                    format!(
                        "fetch offset {fetch_offset} outside [{}, {}]",
                        self.log.log_start_offset(),
                        l.durable_log_end()
                    ),
                ));
            }
            let before = l.high_watermark();
            let ok = l
                .on_follower_fetch(replica_id, current_leader_epoch, fetch_offset, now_ms())
                .map_err(|e| fetch_error(&e))?;
            let bound = l.durable_log_end();
            if ok.high_watermark != before {
                drop(role);
                self.notify();
            }
            return Ok((bound, ok.high_watermark, ok.alter_isr));
        }
        if current_leader_epoch >= 0 {
            l.check_epoch(current_leader_epoch)
                .map_err(|e| fetch_error(&e))?;
        }
        Ok((l.high_watermark(), l.high_watermark(), None))
    }

    /// OffsetForLeaderEpoch on the leader: the end offset of `epoch` in this log.
    pub fn epoch_end(&self, current_leader_epoch: i32, epoch: i32) -> Result<(i32, i64), ApiError> {
        self.check_known_epoch(current_leader_epoch)?;
        let role = self.role.borrow();
        let Role::Leader(l) = &*role else {
            return Err(not_leader());
        };
        if current_leader_epoch >= 0 {
            l.check_epoch(current_leader_epoch)
                .map_err(|e| fetch_error(&e))?;
        }
        Ok(self
            .epochs
            .borrow()
            .end_offset_for(epoch, self.log.log_end_offset()))
    }

    /// The leader's periodic ISR check.
    pub fn isr_tick(&self) -> Option<isr::AlterIsr> {
        match &mut *self.role.borrow_mut() {
            Role::Leader(l) => l.tick(now_ms()),
            _ => None,
        }
    }

    /// True while this replica follows in leader epoch `epoch`.
    fn follows_in(&self, epoch: i32) -> bool {
        matches!(&*self.role.borrow(), Role::Follower(f) if f.leader_epoch() == epoch)
    }

    /// Back to OffsetForLeaderEpoch before any further fetch (same leader and epoch).
    fn restart_truncation(&self, epoch: i32) {
        if let Role::Follower(f) = &mut *self.role.borrow_mut() {
            if f.leader_epoch() == epoch {
                *f = isr::Follower::new(f.me(), f.leader(), f.leader_epoch(), f.high_watermark());
            }
        }
    }

    fn alter_rejected(&self, alter: &isr::AlterIsr) {
        if let Role::Leader(l) = &mut *self.role.borrow_mut() {
            if l.leader_epoch() == alter.leader_epoch {
                l.on_alter_rejected(alter);
            }
        }
    }
}

/// Sends an ISR change to the controller; a refusal clears it so the next check retries.
pub fn propose_alter(broker: &Rc<Broker>, replica: &Rc<Replica>, alter: isr::AlterIsr) {
    let (b, r) = (broker.clone(), replica.clone());
    glommio::spawn_local(async move {
        let cmd = Command::AlterPartition {
            from: b.config.node_id,
            topic: r.topic.clone(),
            partition: r.partition,
            leader_epoch: alter.leader_epoch,
            partition_epoch: alter.partition_epoch,
            new_isr: alter.new_isr.clone(),
        };
        tracing::info!(topic = %r.topic, partition = r.partition, isr = ?alter.new_isr, "proposing ISR change");
        loop {
            let refused = match b.control(ControlOp::Command(cmd.clone())).await {
                Ok(ControlResult::Command(Ok(_))) => return,
                // The controller applied and refused it (stale epochs, ineligible
                // replica): the image it answers after already holds the state it was
                // judged on, so a fresh proposal can be computed.
                Ok(ControlResult::Command(Err(e))) => e.code != ResponseError::RequestTimedOut,
                _ => false,
            };
            if refused {
                r.alter_rejected(&alter);
                return;
            }
            // Not committed in time (no controller?): keep it pending — the high
            // watermark keeps counting the maximal ISR — and ask again while it is ours.
            glommio::timer::sleep(Duration::from_millis(500)).await;
            let still = match &*r.role.borrow() {
                Role::Leader(l) => l.pending_alter() == Some(&alter),
                _ => false,
            };
            if !still {
                return;
            }
        }
    })
    .detach();
}

/// Leaders' periodic ISR-shrink check, per shard.
pub async fn isr_checker(broker: std::rc::Weak<Broker>) {
    loop {
        glommio::timer::sleep(ISR_CHECK).await;
        let Some(b) = broker.upgrade() else { return };
        for r in b.replicas() {
            if let Some(alter) = r.isr_tick() {
                propose_alter(&b, &r, alter);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The follower fetcher: one task per (shard, leader broker).
// ---------------------------------------------------------------------------------------

/// A Kafka-protocol connection to another broker, one request at a time.
struct Conn {
    stream: TcpStream,
    correlation: i32,
}

impl Conn {
    async fn connect(host: &str, port: i32) -> Result<Conn, String> {
        let addr = format!("{host}:{port}");
        let addr: std::net::SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(&addr)
            .map_err(|e| format!("{addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("{addr} resolves to nothing"))?;
        let stream = TcpStream::connect_timeout(addr, Duration::from_secs(1))
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            correlation: 0,
        })
    }

    async fn call<R: Request + Encodable>(
        &mut self,
        version: i16,
        req: &R,
    ) -> Result<R::Response, String>
    where
        R::Response: Decodable + HeaderVersion,
    {
        // A half-open connection (the leader died or is cut off) must not hold the
        // fetcher forever: bounded by the longest fetch wait plus a margin.
        let limit = Duration::from_millis(FETCH_MAX_WAIT_MS as u64) + Duration::from_secs(10);
        futures_lite::future::or(self.call_inner(version, req), async {
            glommio::timer::sleep(limit).await;
            Err(format!("no answer within {limit:?}"))
        })
        .await
    }

    async fn call_inner<R: Request + Encodable>(
        &mut self,
        version: i16,
        req: &R,
    ) -> Result<R::Response, String>
    where
        R::Response: Decodable + HeaderVersion,
    {
        self.correlation = self.correlation.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(sb("sluice-replica-fetcher")));
        let hv = R::header_version(version);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0u8; 4]);
        header.encode(&mut buf, hv).map_err(|e| e.to_string())?;
        req.encode(&mut buf, version).map_err(|e| e.to_string())?;
        let len = (buf.len() - 4) as u32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        self.stream
            .write_all(&buf)
            .await
            .map_err(|e| e.to_string())?;
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .await
            .map_err(|e| e.to_string())?;
        let len = u32::from_be_bytes(len) as usize;
        if len > 256 << 20 {
            return Err(format!("response frame of {len} bytes"));
        }
        let mut body = vec![0u8; len];
        self.stream
            .read_exact(&mut body)
            .await
            .map_err(|e| e.to_string())?;
        let mut body = Bytes::from(body);
        let rh = ResponseHeader::decode(
            &mut body,
            <R::Response as HeaderVersion>::header_version(version),
        )
        .map_err(|e| e.to_string())?;
        if rh.correlation_id != self.correlation {
            return Err("response correlation id mismatch".into());
        }
        R::Response::decode(&mut body, version).map_err(|e| e.to_string())
    }
}

/// Fetches for every partition this shard follows from `leader`, until there are none.
pub async fn fetcher(broker: std::rc::Weak<Broker>, leader: i32) {
    let mut conn: Option<Conn> = None;
    loop {
        let Some(b) = broker.upgrade() else { return };
        let parts: Vec<Rc<Replica>> = b
            .replicas()
            .into_iter()
            .filter(|r| matches!(&*r.role.borrow(), Role::Follower(f) if f.leader() == leader))
            .collect();
        if parts.is_empty() {
            b.fetcher_stopped(leader);
            return;
        }
        if conn.is_none() {
            let image = b.image();
            let Some(addr) = image.brokers.get(&leader).cloned() else {
                drop(b);
                glommio::timer::sleep(RETRY).await;
                continue;
            };
            match Conn::connect(&addr.host, addr.port).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(leader, error = %e, "replica fetcher cannot reach the leader");
                    drop(b);
                    glommio::timer::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected");
        let me = b.config.node_id;
        let result = async {
            truncate_phase(c, me, &parts).await?;
            fetch_phase(c, me, &parts).await
        }
        .await;
        drop(b);
        match result {
            Ok(true) => {}
            Ok(false) => glommio::timer::sleep(RETRY).await,
            Err(e) => {
                tracing::debug!(leader, error = %e, "replica fetch failed; reconnecting");
                conn = None;
                glommio::timer::sleep(RETRY).await;
            }
        }
    }
}

/// Per-partition request parts grouped by topic, topics in first-seen order.
fn by_topic<P>(parts: impl Iterator<Item = (String, P)>) -> impl Iterator<Item = (String, Vec<P>)> {
    let mut out: Vec<(String, Vec<P>)> = Vec::new();
    for (topic, p) in parts {
        match out.iter_mut().find(|(t, _)| *t == topic) {
            Some((_, v)) => v.push(p),
            None => out.push((topic, vec![p])),
        }
    }
    out.into_iter()
}

fn follower_state(r: &Replica) -> Option<(FollowerPhase, i32)> {
    match &*r.role.borrow() {
        Role::Follower(f) => Some((f.phase(), f.leader_epoch())),
        _ => None,
    }
}

/// OffsetForLeaderEpoch for the partitions that must truncate, then the truncations.
async fn truncate_phase(c: &mut Conn, me: i32, parts: &[Rc<Replica>]) -> Result<(), String> {
    let todo: Vec<(&Rc<Replica>, i32, i32)> = parts
        .iter()
        .filter_map(|r| match follower_state(r) {
            Some((FollowerPhase::Truncating, epoch)) => {
                let latest = r.epochs.borrow().latest_epoch();
                Some((r, epoch, latest))
            }
            _ => None,
        })
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let topics = by_topic(todo.iter().map(|(r, epoch, latest)| {
        let p = OffsetForLeaderPartition::default()
            .with_partition(r.partition)
            .with_current_leader_epoch(*epoch)
            .with_leader_epoch(*latest);
        (r.topic.clone(), p)
    }))
    .map(|(topic, partitions)| {
        OffsetForLeaderTopic::default()
            .with_topic(TopicName(sb(topic)))
            .with_partitions(partitions)
    })
    .collect();
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(me))
        .with_topics(topics);
    let resp = c.call(4, &req).await?;
    for t in resp.topics {
        for p in t.partitions {
            let Some((r, epoch, _)) = todo
                .iter()
                .find(|(r, _, _)| r.topic == t.topic.0.as_str() && r.partition == p.partition)
            else {
                continue;
            };
            if p.error_code != 0 {
                tracing::debug!(topic = %r.topic, partition = r.partition, code = p.error_code, "OffsetForLeaderEpoch refused");
                continue;
            }
            let local_end = r.log.log_end_offset();
            let truncation = {
                let mut role = r.role.borrow_mut();
                match &mut *role {
                    Role::Follower(f) if f.leader_epoch() == *epoch => {
                        let cache = r.epochs.borrow();
                        f.on_epoch_response(&cache, local_end, p.leader_epoch, p.end_offset)
                    }
                    _ => continue,
                }
            };
            if truncation.offset < local_end {
                tracing::warn!(topic = %r.topic, partition = r.partition, from = local_end, to = truncation.offset, "truncating to the leader's log");
                if let Err(e) = r.log.truncate_to(truncation.offset).await {
                    // Not truncated: it must not fetch from a divergent end.
                    r.restart_truncation(*epoch);
                    return Err(format!("truncating {}-{}: {e}", r.topic, r.partition));
                }
                r.epochs.borrow_mut().truncate_from_end(truncation.offset);
                r.persist_epochs();
                r.durable.set(r.durable.get().min(truncation.offset));
                if let Role::Follower(f) = &mut *r.role.borrow_mut() {
                    f.on_local_truncated(truncation.offset);
                }
            }
        }
    }
    Ok(())
}

/// One Fetch for the partitions that are fetching. True if any data came back.
async fn fetch_phase(c: &mut Conn, me: i32, parts: &[Rc<Replica>]) -> Result<bool, String> {
    let fetching: Vec<(&Rc<Replica>, i32)> = parts
        .iter()
        .filter_map(|r| match follower_state(r) {
            Some((FollowerPhase::Fetching, epoch)) => Some((r, epoch)),
            _ => None,
        })
        .collect();
    if fetching.is_empty() {
        return Ok(false);
    }
    let topics = by_topic(fetching.iter().map(|(r, epoch)| {
        let p = FetchPartition::default()
            .with_partition(r.partition)
            .with_current_leader_epoch(*epoch)
            .with_fetch_offset(r.durable_end())
            .with_log_start_offset(r.log.log_start_offset())
            .with_partition_max_bytes(FETCH_PARTITION_BYTES);
        (r.topic.clone(), p)
    }))
    .map(|(topic, partitions)| {
        FetchTopic::default()
            .with_topic(TopicName(sb(topic)))
            .with_partitions(partitions)
    })
    .collect();
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(me))
        .with_max_wait_ms(FETCH_MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_BYTES)
        .with_session_epoch(-1)
        .with_topics(topics);
    let resp = c.call(12, &req).await?;
    let mut got_data = false;
    let mut had_error = false;
    for t in resp.responses {
        for p in t.partitions {
            let Some((r, epoch)) = fetching
                .iter()
                .find(|(r, _)| r.topic == t.topic.0.as_str() && r.partition == p.partition_index)
            else {
                continue;
            };
            if p.error_code != 0 {
                had_error = true;
                let code = ResponseError::try_from_code(p.error_code);
                tracing::debug!(topic = %r.topic, partition = r.partition, ?code, "replica fetch refused");
                if code == Some(ResponseError::OffsetOutOfRange) {
                    if p.log_start_offset > r.durable_end()
                        && r.log.log_end_offset() == r.durable_end()
                        && r.follows_in(*epoch)
                    {
                        // Behind the leader's log start (it deleted what we lack, by
                        // retention or DeleteRecords): drop our log and resume at its
                        // log start, as Kafka's truncate-fully-and-start-at does.
                        let start = p.log_start_offset;
                        tracing::warn!(topic = %r.topic, partition = r.partition, from = r.durable_end(), to = start, "behind the leader's log start; starting over there");
                        if let Err(e) = r.log.reset_to(start).await {
                            tracing::error!(topic = %r.topic, partition = r.partition, error = %e, "cannot move the log to the leader's start");
                            continue;
                        }
                        r.epochs.borrow_mut().truncate_from_start(start);
                        r.persist_epochs();
                        if r.follows_in(*epoch) {
                            r.durable.set(start);
                        }
                    } else {
                        // Our log is ahead of the leader's: truncate again.
                        r.restart_truncation(*epoch);
                    }
                }
                continue;
            }
            let records = p.records.unwrap_or_default();
            if !records.is_empty() {
                if !append_fetched(r, *epoch, &records).await? {
                    r.restart_truncation(*epoch);
                    continue;
                }
                got_data = true;
            }
            if let Role::Follower(f) = &mut *r.role.borrow_mut() {
                if f.leader_epoch() == *epoch {
                    f.on_fetch_response(p.high_watermark, r.durable_end());
                }
            }
            // The leader's log start moved (DeleteRecords, retention): follow it as far
            // as this log reaches, so deleted records do not come back after a failover.
            let start = p.log_start_offset.min(r.durable_end());
            if start > r.log.log_start_offset() && r.follows_in(*epoch) {
                if let Err(e) = r.log.delete_records_before(start).await {
                    tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "following the leader's log start failed");
                }
                r.epochs.borrow_mut().truncate_from_start(start);
            }
            r.notify();
        }
    }
    Ok(got_data || !had_error)
}

/// Appends fetched batches with their offsets, keeping the epoch history, then syncs
/// and counts them as held. False if the log is not where this fetch assumed (the role
/// changed meanwhile, or a deposed leader's late append landed): the caller truncates
/// again rather than report anything.
async fn append_fetched(r: &Replica, epoch: i32, records: &Bytes) -> Result<bool, String> {
    let batches = match batch::split_batches(records) {
        Ok(b) => b,
        Err(e) => return Err(format!("fetched records do not parse: {e}")),
    };
    let mut expected_end = r.durable_end();
    for (h, range) in batches {
        // Anything else appended (a deposed leader's late write): truncate again.
        if !r.follows_in(epoch) || r.log.log_end_offset() != expected_end {
            return Ok(false);
        }
        if h.base_offset < expected_end {
            return Ok(false);
        }
        if h.leader_epoch > r.epochs.borrow().latest_epoch() {
            r.assign_epoch(h.leader_epoch, h.base_offset);
        }
        r.log
            .append_with_offsets(&records[range])
            .await
            .map_err(|e| e.to_string())?;
        expected_end = h.last_offset() + 1;
    }
    r.log.flush().await.map_err(|e| e.to_string())?;
    if !r.follows_in(epoch) || r.log.log_end_offset() != expected_end {
        return Ok(false);
    }
    r.durable.set(expected_end);
    Ok(true)
}

/// Per-shard registry of running fetchers.
#[derive(Default)]
pub struct Fetchers {
    running: RefCell<HashMap<i32, ()>>,
}

impl Fetchers {
    /// True if a fetcher for `leader` must be started.
    pub fn claim(&self, leader: i32) -> bool {
        self.running.borrow_mut().insert(leader, ()).is_none()
    }
    pub fn release(&self, leader: i32) {
        self.running.borrow_mut().remove(&leader);
    }
}
