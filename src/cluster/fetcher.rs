//! The replication I/O above the partition host: the follower fetchers (one task per
//! shard and leader broker: OffsetForLeaderEpoch truncation, then Fetch with this
//! broker's replica id, append with offsets, flush, report), the leaders' periodic
//! ISR-shrink check, and ISR proposals to the controller.
//!
//! [`Replication`] subscribes to the partition host's events ([`PartitionEvents`]):
//! the host says when this shard starts following a leader or when a leader wants its
//! ISR changed, and this module does the network work.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{
    FetchPartition, FetchRequest, FetchTopic, ForgottenTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::TopicName;
use sluice_client::aio::Conn;
use sluice_replication::cluster::{Applied, Command, IsrChange};
use sluice_replication::isr::{self, FollowerPhase, LogOpKind};
use sluice_storage::batch;

use crate::base::error::ApiError;
use crate::base::fetch_session::{self, PartKey, PartReq, TopicKey};
use crate::base::ids::{BrokerId as NodeId, LeaderEpoch, Offset};
use crate::base::rpc::Propose;
use crate::base::util::{join_all, last_first, sb};
use crate::cluster::throttle;
use crate::partition::broker::{Broker, PartitionEvents};
use crate::partition::replica::{LogOpGuard, Replica};
use sluice_protocol::{TopicPartition, TopicPartitionRef};

/// Follower fetch parameters (the longest wait is `--replica-fetch-wait-max-ms`).
const FETCH_PARTITION_BYTES: i32 = 4 << 20;
const FETCH_BYTES: i32 = 32 << 20;
/// Back-off after a failed fetch or connection.
const RETRY: Duration = Duration::from_millis(100);
/// The first back-off while the leader refuses a partition it does not know yet (it
/// applies the same metadata a moment later); doubles up to [`RETRY`].
const RETRY_FIRST: Duration = Duration::from_millis(2);
/// How often leaders check for followers that fell out of sync.
pub const ISR_CHECK: Duration = Duration::from_millis(250);

/// The partition host's subscriber that runs fetchers and proposes ISR changes; one
/// per shard.
#[derive(Default)]
pub struct Replication {
    alters: Rc<AlterQueue>,
}

impl Replication {
    /// This shard's ISR changes on their way to the controller (the leaders' periodic
    /// check, [`isr_checker`], adds to them too).
    pub fn alters(&self) -> Rc<AlterQueue> {
        self.alters.clone()
    }
}

impl PartitionEvents for Replication {
    fn follow(&self, broker: &Rc<Broker>, leader: NodeId) {
        glommio::spawn_local(fetcher(Rc::downgrade(broker), leader)).detach();
    }

    fn propose_isr(&self, broker: &Rc<Broker>, replica: &Rc<Replica>, alter: isr::AlterIsr) {
        self.alters.propose(broker, replica, alter);
    }

    fn partition_offline(&self, broker: &Rc<Broker>, topic: &str, partition: i32) {
        propose_offline(broker, topic, partition);
    }
}

/// How long a broker keeps asking the controller to move an offline partition away.
const OFFLINE_PROPOSAL_DEADLINE: Duration = Duration::from_secs(60);

/// Asks the controller to take this broker's offline replica out of the ISR and its
/// leadership to a healthy in-sync replica (Kafka's offline log directory handling).
/// A partition with no other replica stays as it is: nothing to move to.
fn propose_offline(broker: &Rc<Broker>, topic: &str, partition: i32) {
    let replicated = broker
        .image()
        .topics
        .get(topic)
        .and_then(|m| m.assignment(partition))
        .is_some_and(|a| a.replicas.len() > 1);
    if !replicated {
        return;
    }
    let b = broker.clone();
    let cmd = Command::ReplicaOffline {
        broker: b.config.node_id,
        topic: topic.to_string(),
        partition,
    };
    glommio::spawn_local(async move {
        let deadline = std::time::Instant::now() + OFFLINE_PROPOSAL_DEADLINE;
        loop {
            match b.control(Propose(cmd.clone())).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) if e.code != ResponseError::RequestTimedOut => {
                    tracing::warn!(?cmd, error = ?e, "the controller refused to move an offline replica");
                    return;
                }
                _ if std::time::Instant::now() >= deadline => {
                    tracing::warn!(?cmd, "no controller took the offline replica proposal in time");
                    return;
                }
                _ => glommio::timer::sleep(Duration::from_millis(500)).await,
            }
        }
    })
    .detach();
}

/// The most ISR changes in one [`Command::AlterPartitions`]: bounds a raft entry (some
/// 50 bytes a change) when a broker failure changes every ISR at once.
const ALTER_BATCH_MAX: usize = 4096;
/// Back-off before asking again when the controller did not answer in time.
const ALTER_RETRY: Duration = Duration::from_millis(500);

/// One shard's ISR changes on their way to the controller, sent as batches
/// ([`Command::AlterPartitions`], one raft entry each) by one task at a time. Changes
/// raised while a batch is in flight wait for it and go together in the next one, with
/// no timer: a lone change leaves at once, and after a broker failure (thousands of
/// ISRs shrink or expand together) the batches grow with the backlog.
#[derive(Default)]
pub struct AlterQueue {
    /// Raised and not sent yet, in order. Each is sent only while it is still its
    /// partition's pending change (see [`still_pending`]).
    waiting: RefCell<Vec<(Rc<Replica>, isr::AlterIsr)>>,
    /// A sender task runs: it takes everything waiting whenever its batch returns.
    sending: Cell<bool>,
}

impl AlterQueue {
    /// Queues `alter` (the leader's pending change of `replica`) for the next batch.
    pub fn propose(
        self: &Rc<Self>,
        broker: &Rc<Broker>,
        replica: &Rc<Replica>,
        alter: isr::AlterIsr,
    ) {
        tracing::debug!(topic = %replica.topic, partition = replica.partition, isr = ?alter.new_isr, "ISR change queued");
        self.waiting.borrow_mut().push((replica.clone(), alter));
        if !self.sending.replace(true) {
            glommio::spawn_local(send_alters(broker.clone(), self.clone())).detach();
        }
    }

    /// The next batch: what a failed batch must resend, then what waits, without the
    /// changes that are no longer pending; at most [`ALTER_BATCH_MAX`] (the rest waits).
    fn next_batch(
        &self,
        retry: Vec<(Rc<Replica>, isr::AlterIsr)>,
    ) -> Vec<(Rc<Replica>, isr::AlterIsr)> {
        let mut waiting = self.waiting.borrow_mut();
        take_batch(retry, &mut waiting, ALTER_BATCH_MAX, |(r, alter)| {
            still_pending(r, alter)
        })
    }
}

/// `retry` then `waiting`, in order, keeping what `keep` says; at most `max`, the rest
/// left in `waiting` for the next batch.
fn take_batch<T>(
    retry: Vec<T>,
    waiting: &mut Vec<T>,
    max: usize,
    keep: impl Fn(&T) -> bool,
) -> Vec<T> {
    let mut batch = retry;
    batch.append(waiting);
    batch.retain(keep);
    if batch.len() > max {
        *waiting = batch.split_off(max);
    }
    batch
}

/// True while `alter` is the change `r`'s leader waits for: a change superseded (new
/// metadata answered it, or leadership moved) is not sent again.
fn still_pending(r: &Replica, alter: &isr::AlterIsr) -> bool {
    r.state()
        .leader()
        .is_some_and(|l| l.pending_alter() == Some(alter))
}

/// Sends [`AlterQueue`]'s changes in batches until none waits. Each change is answered
/// on its own: a refused one (stale epochs, ineligible replica) is cleared so the next
/// check can compute a fresh one — the image the controller answers after already
/// holds the state it was judged on. A batch the controller did not commit in time
/// (no controller?) stays pending (the high watermark keeps counting the maximal ISR)
/// and is asked again after [`ALTER_RETRY`], with whatever was raised meanwhile.
async fn send_alters(broker: Rc<Broker>, queue: Rc<AlterQueue>) {
    let mut retry = Vec::new();
    loop {
        let batch = queue.next_batch(std::mem::take(&mut retry));
        if batch.is_empty() {
            queue.sending.set(false);
            return;
        }
        let changes = batch
            .iter()
            .map(|(r, alter)| IsrChange {
                topic: r.topic.to_string(),
                partition: r.partition,
                leader_epoch: alter.leader_epoch,
                partition_epoch: alter.partition_epoch,
                new_isr: alter.new_isr.clone(),
            })
            .collect();
        let cmd = Command::AlterPartitions {
            from: broker.config.node_id,
            changes,
        };
        tracing::info!(partitions = batch.len(), "proposing ISR changes");
        match broker.control(Propose(cmd)).await {
            Ok(Ok(Applied::Partitions(results))) if results.len() == batch.len() => {
                for ((r, alter), result) in batch.iter().zip(results) {
                    if let Err(e) = result {
                        tracing::debug!(topic = %r.topic, partition = r.partition, error = %e, "ISR change refused");
                        r.alter_rejected(alter);
                    }
                }
            }
            Ok(Ok(other)) => {
                // Not a batch's answer: a bug, not an input. The changes stay pending;
                // the metadata that answers them clears them.
                tracing::error!(
                    ?other,
                    "the controller answered an ISR batch with something else"
                );
            }
            // Refused as a whole (never for stale changes, which are refused one by
            // one): clear them all so fresh ones can be proposed.
            Ok(Err(e)) if e.code != ResponseError::RequestTimedOut => {
                tracing::warn!(error = ?e, partitions = batch.len(), "the controller refused an ISR batch");
                for (r, alter) in &batch {
                    r.alter_rejected(alter);
                }
            }
            _ => {
                retry = batch;
                glommio::timer::sleep(ALTER_RETRY).await;
            }
        }
    }
}

/// Leaders' periodic ISR-shrink check, per shard; the changes join `alters`. It also
/// flushes a leader's tail that no produce flushes (see `Replica::unflushed_tail`).
pub async fn isr_checker(broker: std::rc::Weak<Broker>, alters: Rc<AlterQueue>) {
    loop {
        glommio::timer::sleep(ISR_CHECK).await;
        let Some(b) = broker.upgrade() else { return };
        for r in b.replicas() {
            if let Some(alter) = r.isr_tick() {
                alters.propose(&b, &r, alter);
            }
            if let Some(epoch) = r.unflushed_tail() {
                glommio::spawn_local(async move {
                    if let Err(e) = r.flush_tail(epoch).await {
                        tracing::debug!(topic = %r.topic, partition = r.partition, error = ?e, "flushing a leader's unflushed tail");
                    }
                })
                .detach();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The follower fetcher: one task per (shard, leader broker).
// ---------------------------------------------------------------------------------------

/// The client id the fetchers send.
const CLIENT_ID: &str = "sluice-replica-fetcher";

/// Why a fetcher round failed (it reconnects and retries after [`RETRY`]).
#[derive(Debug, thiserror::Error)]
pub enum FetcherError {
    #[error("cannot reach the leader: {0}")]
    Connect(#[source] sluice_client::Error),
    #[error("request to the leader failed: {0}")]
    Call(#[source] sluice_client::Error),
    #[error("truncating {topic}-{partition}: {source}")]
    Truncate {
        topic: String,
        partition: i32,
        #[source]
        source: sluice_storage::Error,
    },
    #[error("fetched records of {topic}-{partition} do not parse: {source}")]
    Parse {
        topic: String,
        partition: i32,
        #[source]
        source: sluice_storage::BatchError,
    },
    #[error("appending fetched records to {topic}-{partition}: {source}")]
    Append {
        topic: String,
        partition: i32,
        #[source]
        source: sluice_storage::Error,
    },
    #[error("{0}")]
    Checkpoint(ApiError),
}

/// A Kafka-protocol connection to the leader broker `host:port`, one request at a time.
/// A half-open connection (the leader died or is cut off) must not hold the fetcher
/// forever: each call is bounded by the longest fetch wait plus a margin.
async fn connect(host: &str, port: i32, max_wait: Duration) -> Result<Conn, FetcherError> {
    let conn = Conn::connect_to(host, port, CLIENT_ID, Some(Duration::from_secs(1)))
        .await
        .map_err(FetcherError::Connect)?;
    Ok(conn.with_call_timeout(max_wait + Duration::from_secs(10)))
}

/// How one round of a fetcher ended.
#[derive(Debug, PartialEq, Eq)]
enum Round {
    /// Records came back, or the leader had none (after waiting): fetch again at once.
    Fetched,
    /// The leader refused some partition (not its leader yet, fenced, out of range) or
    /// one could not truncate yet: fetch again after a back-off.
    Refused,
    /// A partition joined while the poll waited at the leader: the poll was abandoned
    /// with its connection, so the new partition is fetched at once.
    Interrupted,
}

/// Fetches for every partition this shard follows from `leader`, until there are none.
pub async fn fetcher(broker: std::rc::Weak<Broker>, leader: NodeId) {
    let mut conn: Option<Conn> = None;
    // The incremental fetch session with the leader (KIP-227): full fetch first, then
    // only the partitions whose fetch position changed, joined or left.
    let mut session = fetch_session::Handler::default();
    let mut following = Following::default();
    let mut backoff = RETRY_FIRST;
    loop {
        let Some(b) = broker.upgrade() else { return };
        // Read before the partitions are listed: one that joins after this interrupts
        // the round's poll.
        let wake = b.fetcher_wake(leader);
        let seen = wake.as_ref().map_or(0, |w| w.joined());
        let version = b.hosting_version();
        if following.version != Some(version) {
            let parts: Vec<Rc<Replica>> = b
                .replicas()
                .into_iter()
                .filter(|r| {
                    r.state()
                        .follower()
                        .is_some_and(|f| f.leader() == leader.get())
                })
                .collect();
            following.relist(version, parts);
        }
        if following.parts.is_empty() {
            b.fetcher_stopped(leader);
            return;
        }
        let max_wait = Duration::from_millis(b.config.replica_fetch_wait_max_ms);
        if conn.is_none() {
            let image = b.image();
            let Some(addr) = image.brokers.get(&leader).cloned() else {
                drop(b);
                glommio::timer::sleep(RETRY).await;
                continue;
            };
            match connect(&addr.host, addr.port, max_wait).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(%leader, error = %e, "replica fetcher cannot reach the leader");
                    drop(b);
                    glommio::timer::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected");
        let me = b.config.broker_id();
        // Replication throttles (partition moves): only when a rate is set, which
        // partitions it bounds this round.
        let throttle = {
            let image = b.image();
            throttle::follower_rate(&image, me, b.config.cores).map(|rate| {
                let each = following.parts.iter();
                let flags = each.map(|r| throttle::throttled(&image, me, &r.topic, r.partition));
                (rate, flags.collect::<Vec<bool>>())
            })
        };
        drop(b);
        let joined = async {
            match &wake {
                Some(w) => w.joined_since(seen).await,
                None => std::future::pending().await,
            }
        };
        following.begin_round(throttle.is_some());
        let result = async {
            let truncating = match following.may_truncate {
                true => truncate_phase(c, me, &mut following).await?,
                false => false,
            };
            // A partition still truncating (its leader does not know it yet) is retried
            // soon: this round's fetch must not wait at the leader.
            let wait = if truncating { Duration::ZERO } else { max_wait };
            let round = fetch_phase(
                c,
                (me, leader),
                &mut following,
                wait,
                joined,
                &mut session,
                throttle,
            )
            .await?;
            Ok::<_, FetcherError>(if truncating && round == Round::Fetched {
                Round::Refused
            } else {
                round
            })
        }
        .await;
        match result {
            Ok(Round::Fetched) => backoff = RETRY_FIRST,
            Ok(Round::Interrupted) => {
                following.full_at = None;
                tracing::debug!(
                    %leader,
                    "a partition joined during the poll; fetching again at once"
                );
                conn = None;
                session.failed();
                backoff = RETRY_FIRST;
            }
            Ok(Round::Refused) => {
                glommio::timer::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY);
            }
            Err(e) => {
                // Cut short: some partitions' requests may have moved unseen.
                following.full_at = None;
                tracing::debug!(%leader, error = %e, "replica fetch failed; reconnecting");
                conn = None;
                session.failed();
                glommio::timer::sleep(RETRY).await;
            }
        }
    }
}

/// The partitions a fetcher follows from its leader: listed again only when the
/// shard's partitions or roles change (`Broker::hosting_version`), so a round of a
/// follower of thousands of partitions allocates nothing per partition and tells the
/// leader only what changed ([`fetch_session::Handler::build_changed`]).
///
/// A round also looks only at the partitions that may have changed: each partition's
/// request is kept ([`Following::current`]) and computed again for those the last
/// round answered, truncated or reset ([`Following::touch`]), for every partition once
/// a second ([`FULL_PASS`]) and at a relist. Only this task appends to, truncates and
/// resets a follower's log, and a new role or leader epoch relists, so between passes
/// nothing else moves a request. At 10,000 partitions RF=3 a round over every followed
/// partition cost a few cold cache lines each: the three brokers spent most of their
/// CPU in those passes even at 1,000 records/s (issue 40).
#[derive(Default)]
struct Following {
    /// The hosting version `parts` was listed at.
    version: Option<u64>,
    parts: Vec<Rc<Replica>>,
    /// What the session last told the leader of each (`None`: not in the session).
    sent: Vec<Option<PartReq>>,
    /// Each partition's request as last computed (`None`: not fetching from this
    /// leader then).
    current: Vec<Option<(LeaderEpoch, PartReq)>>,
    /// Partitions whose request is computed again next round, each once
    /// (`dirty_flag`).
    dirty: Vec<usize>,
    dirty_flag: Vec<bool>,
    /// When the next round computes every partition's request (`None`: at once).
    full_at: Option<Instant>,
    /// Some partition may have to truncate: the truncation phase asks every one.
    may_truncate: bool,
    /// This round computes every partition's request ([`Following::begin_round`]).
    full: bool,
    /// The last round was throttled: the next one computes every request again too.
    throttled: bool,
    /// Each partition's place in `parts`.
    index: HashMap<TopicPartition, usize>,
    /// Listed again since the last request: the next one compares the whole list.
    relisted: bool,
}

/// How often a fetcher computes every partition's request, not only those it knows
/// changed (see [`Following`]).
const FULL_PASS: Duration = Duration::from_secs(1);

impl Following {
    fn relist(&mut self, version: u64, parts: Vec<Rc<Replica>>) {
        self.index = parts
            .iter()
            .enumerate()
            .map(|(i, r)| (TopicPartition::new(&*r.topic, r.partition), i))
            .collect();
        self.sent = vec![None; parts.len()];
        self.current = vec![None; parts.len()];
        self.dirty.clear();
        self.dirty_flag = vec![false; parts.len()];
        self.full_at = None;
        self.parts = parts;
        self.version = Some(version);
        self.relisted = true;
    }

    /// Partition `i`'s request is computed again next round.
    fn touch(&mut self, i: usize) {
        if !std::mem::replace(&mut self.dirty_flag[i], true) {
            self.dirty.push(i);
        }
    }

    /// Starts a round: decides whether it computes every partition's request (a relist, the
    /// pass due, or throttled partitions, whose requests depend on the meter, in this
    /// round or the one before); then the truncation phase asks every partition too.
    fn begin_round(&mut self, throttled: bool) {
        let now = Instant::now();
        let was = std::mem::replace(&mut self.throttled, throttled);
        self.full = throttled || was || self.full_at.is_none_or(|at| now >= at);
        if self.full {
            self.full_at = Some(now + FULL_PASS);
            self.may_truncate = true;
        }
    }

    /// The partitions whose requests this round computes: all of them, or those
    /// touched since the last round.
    fn take_dirty(&mut self) -> Vec<usize> {
        for &i in &self.dirty {
            self.dirty_flag[i] = false;
        }
        let dirty = std::mem::take(&mut self.dirty);
        match self.full {
            true => (0..self.parts.len()).collect(),
            false => dirty,
        }
    }
}

fn part_key(r: &Replica) -> PartKey {
    (TopicKey::Name(r.topic.clone()), r.partition)
}

/// Per-partition request parts grouped by topic (a shared name or a session's key: the
/// request's name is made once per topic), topics in first-seen order.
fn by_topic<K: Clone + Eq + std::hash::Hash, P>(
    parts: impl Iterator<Item = (K, P)>,
) -> impl Iterator<Item = (K, Vec<P>)> {
    let mut out: Vec<(K, Vec<P>)> = Vec::new();
    // Topic → its place in `out`: a search of `out` per partition was quadratic in
    // topics for a session of thousands of partitions.
    let mut at: HashMap<K, usize> = HashMap::new();
    for (topic, p) in parts {
        match at.get(&topic) {
            Some(&i) => out[i].1.push(p),
            None => {
                at.insert(topic.clone(), out.len());
                out.push((topic, vec![p]));
            }
        }
    }
    out.into_iter()
}

fn follower_state(r: &Replica) -> Option<(FollowerPhase, LeaderEpoch)> {
    r.state()
        .follower()
        .map(|f| (f.phase(), LeaderEpoch::new(f.leader_epoch())))
}

/// OffsetForLeaderEpoch for the partitions that must truncate, then the truncations.
/// True if some partition could not truncate in this round (the leader refused it).
///
/// Each truncation is a log operation of the replica's state machine: it begins only
/// while the replica still follows in the epoch the request was made in, and a
/// leadership adopted while the log is being cut waits for the cut to end (see
/// `isr::ReplicaState`); a partition whose state refuses (moved on, or another log
/// operation still running) is skipped and asked again next round.
///
/// It asks every partition while one may have to truncate ([`Following::may_truncate`]),
/// and stops asking once none had to; each partition it found truncating has its fetch
/// request computed again.
async fn truncate_phase(
    c: &mut Conn,
    me: NodeId,
    following: &mut Following,
) -> Result<bool, FetcherError> {
    let todo: Vec<(usize, LeaderEpoch, LeaderEpoch)> = following
        .parts
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let (epoch, latest) = r.state().epoch_request()?;
            Some((i, LeaderEpoch::new(epoch), LeaderEpoch::new(latest)))
        })
        .collect();
    following.may_truncate = !todo.is_empty();
    for &(i, _, _) in &todo {
        following.touch(i);
    }
    if todo.is_empty() {
        return Ok(false);
    }
    let parts = &following.parts;
    let todo: Vec<(&Rc<Replica>, LeaderEpoch, LeaderEpoch)> = todo
        .into_iter()
        .map(|(i, epoch, latest)| (&parts[i], epoch, latest))
        .collect();
    let topics = by_topic(todo.iter().map(|(r, epoch, latest)| {
        let p = OffsetForLeaderPartition::default()
            .with_partition(r.partition)
            .with_current_leader_epoch(epoch.get())
            .with_leader_epoch(latest.get());
        (r.topic.clone(), p)
    }))
    .map(|(topic, partitions)| {
        OffsetForLeaderTopic::default()
            .with_topic(TopicName(sb(&*topic)))
            .with_partitions(partitions)
    })
    .collect();
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(me.into())
        .with_topics(topics);
    let resp = c.call(4, &req).await.map_err(FetcherError::Call)?;
    // Found by index: a search per answered partition was quadratic when thousands of
    // partitions truncate at once (a new topic, a broker's return).
    let index: HashMap<(&str, i32), usize> = todo
        .iter()
        .enumerate()
        .map(|(i, (r, _, _))| ((&*r.topic, r.partition), i))
        .collect();
    for t in resp.topics {
        for p in t.partitions {
            let Some(&i) = index.get(&(t.topic.0.as_str(), p.partition)) else {
                continue;
            };
            let (r, epoch, _) = &todo[i];
            if p.error_code != 0 {
                tracing::debug!(topic = %r.topic, partition = r.partition, code = p.error_code, "OffsetForLeaderEpoch refused");
                continue;
            }
            let local_end = r.log_end();
            let (leader_epoch, leader_end) =
                (LeaderEpoch::new(p.leader_epoch), Offset::new(p.end_offset));
            let op = match r.begin_truncation(*epoch, leader_epoch, leader_end) {
                Ok(Some(op)) => op,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(topic = %r.topic, partition = r.partition, error = %e, "truncation not begun");
                    continue;
                }
            };
            let LogOpKind::Truncate { to } = op.kind() else {
                unreachable!("begin_truncation began {:?}", op.kind())
            };
            tracing::warn!(topic = %r.topic, partition = r.partition, from = %local_end, to, "truncating to the leader's log");
            if let Err(e) = r.log.truncate_to(to).await {
                // Not truncated: ending it as not done sends the follower (if it still
                // follows) back to truncating; it must not fetch from a divergent end.
                op.finish(None);
                return Err(FetcherError::Truncate {
                    topic: r.topic.to_string(),
                    partition: r.partition,
                    source: e,
                });
            }
            op.finish(Some(Offset::new(to)));
            // Pair assertion: the log now ends at or below the cut the state machine
            // asked for (a cut is rounded down to a batch start) and where it ended.
            assert!(
                r.log_end() <= Offset::new(to).min(local_end),
                "{}-{}: truncated from {local_end} to {to}, the log ends at {}",
                r.topic,
                r.partition,
                r.log_end()
            );
        }
    }
    Ok(todo
        .iter()
        .any(|(r, _, _)| matches!(follower_state(r), Some((FollowerPhase::Truncating, _)))))
}

/// Partition `r`'s fetch request while it fetches from `leader`, from its durable end;
/// `throttle`: the shard's follower rate if the partition is throttled.
fn fetch_request(
    r: &Replica,
    leader: NodeId,
    throttle: Option<&(f64, Vec<bool>)>,
) -> Option<(LeaderEpoch, PartReq)> {
    let epoch = {
        let state = r.state();
        let f = state.follower()?;
        let follows = f.phase() == FollowerPhase::Fetching && f.leader() == leader.get();
        follows.then(|| LeaderEpoch::new(f.leader_epoch()))?
    };
    let fetch_offset = r.durable_end();
    // A throttled partition asks for at most a second's worth at the rate, so one round
    // cannot take megabytes past it.
    let max_bytes = match throttle {
        Some((rate, _)) => (*rate as i64).clamp(1, FETCH_PARTITION_BYTES as i64) as i32,
        None => FETCH_PARTITION_BYTES,
    };
    let req = PartReq {
        fetch_offset,
        log_start_offset: r.log_start(),
        max_bytes,
        current_leader_epoch: epoch,
        last_fetched_epoch: LeaderEpoch::NONE,
    };
    // A follower asks from what it holds durably: never past its log.
    assert!(
        fetch_offset <= r.log_end() && req.log_start_offset <= fetch_offset,
        "{}-{}: fetch from {fetch_offset} outside its log [{}, {}]",
        r.topic,
        r.partition,
        req.log_start_offset,
        r.log_end()
    );
    Some((epoch, req))
}

/// One Fetch for the partitions that are fetching, waiting at most `wait` at the leader,
/// abandoned if `joined` completes first. In the fetch session, the request carries only
/// what changed and the answer only partitions with news.
/// `throttle`: the shard's follower rate and, per partition of `following`, whether
/// it is throttled (see [`throttle`]); while the shard's meter is over, the throttled
/// partitions are left out of the round.
async fn fetch_phase(
    c: &mut Conn,
    (me, leader): (NodeId, NodeId),
    following: &mut Following,
    wait: Duration,
    joined: impl std::future::Future<Output = ()>,
    session: &mut fetch_session::Handler,
    throttle: Option<(f64, Vec<bool>)>,
) -> Result<Round, FetcherError> {
    let held = |i: usize| -> bool {
        throttle
            .as_ref()
            .is_some_and(|(_, flags)| flags.get(i).copied().unwrap_or(false))
    };
    let over = throttle
        .as_ref()
        .is_some_and(|(rate, flags)| flags.contains(&true) && throttle::follower_exceeded(*rate));
    let check = following.take_dirty();
    for &i in &check {
        let r = &following.parts[i];
        if r.log_end() > r.durable_end() {
            if let Some((FollowerPhase::Fetching, epoch)) = follower_state(r) {
                sync_tail(r, epoch).await?;
            }
        }
    }
    // Each partition's request while it fetches from this leader, from its durable
    // end (a partition that moved on since the list was made is left out).
    for &i in &check {
        let r = &following.parts[i];
        // Sent back to truncating (a tail that grew, a reset that failed, ...): the
        // next round's truncation phase asks every partition.
        if r.state().epoch_request().is_some() {
            following.may_truncate = true;
        }
        following.current[i] = match over && held(i) {
            true => None,
            false => fetch_request(r, leader, throttle.as_ref().filter(|_| held(i))),
        };
    }
    let (parts, current) = (&following.parts, &following.current);
    if current.iter().all(Option::is_none) {
        return Ok(Round::Refused);
    }
    let built = if session.is_full() || following.relisted {
        let next: Vec<(PartKey, PartReq)> = parts
            .iter()
            .zip(current)
            .filter_map(|(r, c)| c.map(|(_, req)| (part_key(r), req)))
            .collect();
        for (sent, c) in following.sent.iter_mut().zip(current) {
            *sent = c.map(|(_, req)| req);
        }
        session.build(&next)
    } else {
        let (mut changed, mut forgotten) = (Vec::new(), Vec::new());
        for &i in &check {
            let now = current[i].map(|(_, req)| req);
            if now != following.sent[i] {
                match now {
                    Some(req) => changed.push((part_key(&parts[i]), req)),
                    None => forgotten.push(part_key(&parts[i])),
                }
                following.sent[i] = now;
            }
        }
        session.build_changed(changed, forgotten)
    };
    following.relisted = false;
    let req = FetchRequest::default()
        .with_replica_id(me.into())
        .with_max_wait_ms(wait.as_millis() as i32)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_BYTES)
        .with_session_id(built.session_id)
        .with_session_epoch(built.epoch)
        .with_topics(fetch_topics(built.to_send))
        .with_forgotten_topics_data(forgotten_topics(built.forgotten));
    let call = async { Some(c.call(12, &req).await) };
    let interrupt = async {
        joined.await;
        None
    };
    let Some(resp) = futures_lite::future::or(call, interrupt).await else {
        return Ok(Round::Interrupted);
    };
    let resp = resp.map_err(FetcherError::Call)?;
    if !session.answered(resp.error_code, resp.session_id) {
        // A session error (evicted, out of step): the next round fetches in full.
        tracing::debug!(code = ?ResponseError::try_from_code(resp.error_code), "replica fetch session refused");
        return Ok(Round::Fetched);
    }
    let mut got_data = false;
    let mut had_error = false;
    // Partitions answered without error, with their records (maybe none).
    let mut answered = Vec::new();
    // Partitions answered at all: their requests are computed again next round (a
    // round that fails computes every one again, see `fetcher`).
    let mut touched = Vec::new();
    let mut restarted = false;
    for t in resp.responses {
        for p in t.partitions {
            let key = TopicPartitionRef::new(t.topic.0.as_str(), p.partition_index);
            let Some(&i) = following.index.get(key.key()) else {
                continue;
            };
            let Some((epoch, req)) = &current[i] else {
                continue;
            };
            let (r, fetch_offset) = (&parts[i], &req.fetch_offset);
            touched.push(i);
            if p.error_code != 0 {
                had_error = true;
                let code = ResponseError::try_from_code(p.error_code);
                tracing::debug!(topic = %r.topic, partition = r.partition, ?code, "replica fetch refused");
                if code == Some(ResponseError::OffsetOutOfRange) {
                    let leader_start = Offset::new(p.log_start_offset);
                    let reset = match leader_start > *fetch_offset {
                        true => r.begin_reset(*epoch, leader_start).ok(),
                        false => None,
                    };
                    if let Some(op) = reset {
                        // Behind the leader's log start (it deleted what we lack, by
                        // retention or DeleteRecords): drop our log and resume at its
                        // log start, as Kafka's truncate-fully-and-start-at does.
                        let start = leader_start;
                        tracing::warn!(topic = %r.topic, partition = r.partition, from = %fetch_offset, to = %start, "behind the leader's log start; starting over there");
                        if let Err(e) = r.log.reset_to(start.get()).await {
                            tracing::error!(topic = %r.topic, partition = r.partition, error = %e, "cannot move the log to the leader's start");
                            op.finish(None);
                            continue;
                        }
                        op.finish(Some(start));
                    } else {
                        // Our log is ahead of the leader's: truncate again.
                        r.restart_truncation(*epoch);
                        restarted = true;
                    }
                }
                continue;
            }
            let records = p.records.unwrap_or_default();
            if let Some((rate, _)) = throttle.as_ref().filter(|_| held(i)) {
                throttle::follower_fetched(records.len(), *rate);
            }
            let (hw, start) = (
                Offset::new(p.high_watermark),
                Offset::new(p.log_start_offset),
            );
            answered.push((i, records, hw, start));
        }
    }
    // The partitions' appends and syncs run side by side (one after the other, a round
    // that brought records for thousands of partitions waited for each one's sync in
    // turn, and its syncs never met to share a round), in two passes as a leader's
    // produce: every partition's batches staged, then finished with the last journaled
    // one first, whose wait for the shard's journal covers the others' (`last_first`).
    let stages = answered
        .iter()
        .filter(|(_, records, _, _)| !records.is_empty())
        .map(|(i, records, _, _)| {
            let (r, (epoch, req)) = (&parts[*i], current[*i].expect("answered while fetching"));
            async move { (*i, stage_fetched(r, epoch, req.fetch_offset, records).await) }
        });
    let mut appended: HashMap<usize, bool> = HashMap::new();
    let mut failure = None;
    let mut todo = Vec::new();
    for (i, res) in join_all(stages).await {
        match res {
            Ok(Some(staged)) => todo.push((i, staged)),
            Ok(None) => {
                appended.insert(i, false);
            }
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    let journaled =
        |(_, s): &(usize, StagedFetch)| sluice_storage::Staged::all_journaled(&s.writes);
    let finished = last_first(todo, journaled, |(i, staged)| {
        let r = &parts[i];
        async move { (i, finish_fetched(r, staged).await) }
    });
    for (i, res) in finished.await {
        match res {
            Ok(done) => {
                appended.insert(i, done);
            }
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    for (i, records, high_watermark, log_start) in answered {
        let (r, (epoch, _)) = (&parts[i], current[i].expect("answered while fetching"));
        let epoch = &epoch;
        if !records.is_empty() {
            if !appended[&i] {
                r.restart_truncation(*epoch);
                restarted = true;
                continue;
            }
            got_data = true;
        }
        r.fetched_high_watermark(*epoch, high_watermark);
        // The leader's log start moved (DeleteRecords, retention): follow it as far
        // as this log reaches, so deleted records do not come back after a failover.
        let start = log_start.min(r.durable_end());
        if start > r.log_start() && r.follows_in(*epoch) {
            match r.log.delete_records_before(start.get()).await {
                Ok(_) => r.log_start_moved(start),
                Err(e) => {
                    tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "following the leader's log start failed");
                }
            }
        }
        r.notify();
    }
    for i in touched {
        following.touch(i);
    }
    following.may_truncate |= restarted;
    Ok(if got_data || !had_error {
        Round::Fetched
    } else {
        Round::Refused
    })
}

fn topic_name(key: &TopicKey) -> String {
    match key {
        TopicKey::Name(n) => n.to_string(),
        TopicKey::Id(id) => id.to_string(),
    }
}

/// A request's partitions grouped by topic.
fn fetch_topics(parts: Vec<(PartKey, PartReq)>) -> Vec<FetchTopic> {
    by_topic(parts.into_iter().map(|((topic, partition), r)| {
        let p = FetchPartition::default()
            .with_partition(partition)
            .with_current_leader_epoch(r.current_leader_epoch.get())
            .with_fetch_offset(r.fetch_offset.get())
            .with_log_start_offset(r.log_start_offset.get())
            .with_partition_max_bytes(r.max_bytes);
        (topic, p)
    }))
    .map(|(topic, partitions)| {
        FetchTopic::default()
            .with_topic(TopicName(sb(topic_name(&topic))))
            .with_partitions(partitions)
    })
    .collect()
}

/// The partitions leaving the session, grouped by topic.
fn forgotten_topics(parts: Vec<PartKey>) -> Vec<ForgottenTopic> {
    by_topic(parts.into_iter())
        .map(|(topic, partitions)| {
            ForgottenTopic::default()
                .with_topic(TopicName(sb(topic_name(&topic))))
                .with_partitions(partitions)
        })
        .collect()
}

/// Syncs the tail of a fetching follower's log past its durable end, and counts it, as
/// one log operation, if the truncation before checked it and kept it: an append that a
/// role change cut short between two of its batches, or a deposed leader's last
/// appends (its successor holds them too). Without it the fetch would ask from the
/// durable end, where the log does not end, and the follower would truncate again,
/// forever. A tail that grew since that check is sent back to truncation.
async fn sync_tail(r: &Rc<Replica>, epoch: LeaderEpoch) -> Result<(), FetcherError> {
    let op = match r.begin_tail_sync(epoch) {
        Ok(Some(op)) => op,
        // Grown since the truncation kept it (nothing should append to a follower's
        // log outside its operations: the leader fence refuses a deposed leader's late
        // append): check it again.
        Err(isr::ReplicaError::LogMoved { .. }) => {
            r.restart_truncation(epoch);
            return Ok(());
        }
        Ok(None) | Err(_) => return Ok(()),
    };
    let (from, end) = (r.durable_end(), r.log_end());
    tracing::info!(topic = %r.topic, partition = r.partition, %from, to = %end, "syncing the log's tail past its durable end before fetching");
    r.log.flush().await.map_err(|e| FetcherError::Append {
        topic: r.topic.to_string(),
        partition: r.partition,
        source: e,
    })?;
    op.finish(Some(end));
    Ok(())
}

/// Appends fetched batches (asked for from `fetch_offset`) with their offsets, keeping
/// the epoch history, then syncs and counts them as held — one log operation of the
/// replica's state machine, rechecked after every await. `None` if the log is not where
/// this fetch assumed (the role changed meanwhile, or something else appended, which
/// the log's leader fence should have refused): the caller truncates again rather than
/// report anything. The batches are staged, not yet written: [`finish_fetched`].
async fn stage_fetched<'r>(
    r: &'r Rc<Replica>,
    epoch: LeaderEpoch,
    fetch_offset: Offset,
    records: &Bytes,
) -> Result<Option<StagedFetch<'r>>, FetcherError> {
    let batches = batch::split_batches(records).map_err(|e| FetcherError::Parse {
        topic: r.topic.to_string(),
        partition: r.partition,
        source: e,
    })?;
    // Refused if the follower moved on, another log operation runs, or the log does
    // not end where the fetch asked from.
    let Ok(op) = r.begin_append(epoch, fetch_offset) else {
        return Ok(None);
    };
    let mut expected_end = fetch_offset;
    // Each batch is staged, then all are awaited: they go to the device together (a
    // fetch brings several batches per partition), not one write round trip each.
    let mut writes = Vec::new();
    for (h, range) in batches {
        // Anything else appended (the leader fence refuses a deposed leader's late
        // write; this is the second guard): truncate again.
        // (Returning drops `op`: the operation ends as not done.)
        if !r.follows_in(epoch) || r.log_end() != expected_end {
            return Ok(None);
        }
        if Offset::new(h.base_offset) < expected_end {
            return Ok(None);
        }
        let batch_epoch = LeaderEpoch::new(h.leader_epoch);
        let Ok(new_epoch) = op.fetched_batch(batch_epoch, Offset::new(h.base_offset)) else {
            return Ok(None);
        };
        if new_epoch {
            // The new epoch's entry is durable before any batch of that epoch.
            r.epochs_durable().await.map_err(FetcherError::Checkpoint)?;
            if !r.follows_in(epoch) || r.log_end() != expected_end {
                return Ok(None);
            }
        }
        let (_, staged) = r
            .log
            .append_with_offsets_staged(records.slice(range))
            .await
            .map_err(|e| append_error(r, e))?;
        writes.extend(staged);
        expected_end = Offset::new(h.last_offset()).next();
    }
    Ok(Some(StagedFetch {
        op,
        writes,
        epoch,
        expected_end,
    }))
}

/// A partition's fetched batches with their offsets, their log operation still held.
struct StagedFetch<'r> {
    op: LogOpGuard<'r>,
    writes: Vec<sluice_storage::Staged>,
    epoch: LeaderEpoch,
    expected_end: Offset,
}

/// Waits until staged fetched batches are written and flushed, and counts them in
/// the replica's state machine. False as [`stage_fetched`]'s `None`.
async fn finish_fetched(r: &Rc<Replica>, staged: StagedFetch<'_>) -> Result<bool, FetcherError> {
    let StagedFetch {
        op,
        writes,
        epoch,
        expected_end,
    } = staged;
    for staged in writes {
        r.log
            .written(staged)
            .await
            .map_err(|e| append_error(r, e))?;
    }
    r.log.flush().await.map_err(|e| append_error(r, e))?;
    // Flushed: the state machine counts it if the log still ends there, whatever the
    // role is now; the follower reports it only if it still follows in `epoch`.
    let ended = op.finish(Some(expected_end));
    // Pair assertion: an append counted as held moved the durable end to where the
    // fetched batches end.
    assert!(
        !ended.durable_moved || r.durable_end() == expected_end,
        "{}-{}: appended up to {expected_end}, durable end {}",
        r.topic,
        r.partition,
        r.durable_end()
    );
    Ok(ended.durable_moved && r.follows_in(epoch))
}

fn append_error(r: &Replica, source: sluice_storage::Error) -> FetcherError {
    FetcherError::Append {
        topic: r.topic.to_string(),
        partition: r.partition,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_resends_first_drops_what_is_no_longer_pending_and_leaves_the_rest_waiting() {
        // Even numbers stand for changes still pending.
        let mut waiting = vec![4, 5, 6, 8, 10];
        let batch = take_batch(vec![1, 2], &mut waiting, 3, |n| n % 2 == 0);
        assert_eq!(batch, [2, 4, 6]);
        assert_eq!(waiting, [8, 10]);
        let batch = take_batch(Vec::new(), &mut waiting, 3, |n| n % 2 == 0);
        assert_eq!(batch, [8, 10]);
        assert!(waiting.is_empty());
        assert!(take_batch(vec![3], &mut waiting, 3, |n| n % 2 == 0).is_empty());
    }
}
