//! The metadata controller's front end, on shard 0 of every broker.
//!
//! Admin requests (CreateTopics, DeleteTopics, CreatePartitions,
//! IncrementalAlterConfigs) and ISR changes from partition leaders become [`Command`]s
//! for the metadata quorum ([`crate::cluster::quorum_io`]): each is validated here against the
//! applied state, proposed, and answered once it is applied on this broker *and* the
//! resulting image has been adopted by every shard here, so a client that hears
//! "created" can use the topic on this broker at once. Changes from one broker run one
//! at a time (so "already exists" checks see each other).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::sync::Semaphore;
use kafka_protocol::error::ResponseError;
use sluice_protocol::TopicPartition;
use sluice_replication::cluster::{
    Applied, ClusterState, Command, Election, PartitionState, ProducerIdBlock, Reassign as Move,
};
use sluice_replication::BrokerId;
use sluice_shard::ShardId;
use uuid::Uuid;

use crate::base::error::ApiError;
use crate::base::metadata::{MetadataImage, TopicMeta};
use crate::base::rpc::{
    AlterConfigOp, AlterConfigs, Apply, ConfigChange, ConfigOp, CreatePartitions, CreateTopics,
    CreatedTopic, DeleteTopics, DeletedTopic, ElectLeaders, ElectedPartition, ManualAssignment,
    NewPartitions, NewTopic, NewTopicConfig, OngoingReassignment, Reassign, TopicRef,
};
use crate::base::topic_config::{validate_topic_name, TopicConfig};
use crate::cluster::quorum_io::{to_api_error, QuorumNode};
use crate::partition::broker::Broker;

/// The config whose default follows a topic's replica count (see [`alter`]).
const MIN_INSYNC: &str = "min.insync.replicas";

/// Largest partition count a topic may have (a bound on per-topic work).
pub const PARTITIONS_MAX: i32 = 10_000;
/// How long a metadata change may take to commit.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(15);

/// Producer ids asked of the quorum at a time (Kafka's block size).
const PRODUCER_ID_BLOCK: i64 = 1000;

pub struct Controller {
    pub quorum: Rc<QuorumNode>,
    lock: Semaphore,
    /// This broker's block of producer ids: the next one and the end (exclusive).
    /// Ids are unique across brokers and restarts: each block is a committed command,
    /// and a restarted broker asks for a new one.
    producer_ids: std::cell::Cell<(i64, i64)>,
    producer_ids_lock: Semaphore,
}

impl Controller {
    pub fn new(quorum: Rc<QuorumNode>) -> Controller {
        Controller {
            quorum,
            lock: Semaphore::new(1),
            producer_ids: std::cell::Cell::new((0, 0)),
            producer_ids_lock: Semaphore::new(1),
        }
    }

    /// Proposes `cmd`, then waits until every shard here runs an image that includes it.
    async fn commit(&self, broker: &Broker, cmd: Command) -> Result<Applied, ApiError> {
        let (r, version) = self.commit_unpublished(cmd).await;
        broker.wait_published(version).await;
        r
    }

    /// Commits `cmd`, returning the state version every shard must publish before the
    /// requester is answered: the command's, or for a refusal the state it was judged
    /// on (so the requester acting on it sees that state).
    async fn commit_unpublished(&self, cmd: Command) -> (Result<Applied, ApiError>, u64) {
        match self.quorum.propose(cmd, COMMIT_TIMEOUT).await {
            Ok((applied, version)) => (Ok(applied), version),
            Err(e) => (Err(e), self.quorum.with_state(|s| s.version)),
        }
    }

    /// An internal command (an ISR change from a partition leader).
    pub async fn propose(&self, broker: &Broker, cmd: Command) -> Result<Applied, ApiError> {
        self.commit(broker, cmd).await
    }

    /// The next producer id of this broker's block, asking the quorum for a new block
    /// when it is used up.
    pub async fn next_producer_id(&self, broker: &Broker) -> Result<i64, ApiError> {
        let _guard = self
            .producer_ids_lock
            .acquire_permit(1)
            .await
            .expect("producer id lock never closes");
        let (mut next, mut end) = self.producer_ids.get();
        if next >= end {
            let ProducerIdBlock { first, count } = self
                .quorum
                .allocate_producer_ids(broker.config.node_id, PRODUCER_ID_BLOCK, COMMIT_TIMEOUT)
                .await?;
            // Blocks are committed in order and never handed out twice: a new block
            // starts at or after the end of this broker's last one, so no producer id
            // is given to two producers.
            assert!(
                count > 0 && first >= end,
                "producer id block [{first}, +{count}) is empty or overlaps the previous block ending at {end}"
            );
            (next, end) = (first, first + count);
        }
        assert!(
            (0..end).contains(&next),
            "producer id {next} outside this broker's block ending at {end}"
        );
        self.producer_ids.set((next + 1, end));
        Ok(next)
    }

    /// Admin changes run one at a time, so "already exists" checks see each other.
    async fn admin_lock(&self) -> glommio::sync::Permit<'_> {
        self.lock
            .acquire_permit(1)
            .await
            .expect("controller lock never closes")
    }

    pub async fn create_topics(
        &self,
        broker: &Broker,
        call: CreateTopics,
    ) -> Vec<Result<CreatedTopic, ApiError>> {
        let _guard = self.admin_lock().await;
        let mut out = Vec::with_capacity(call.topics.len());
        // Each topic is committed in turn (each sees the ones before it), and the answer
        // waits once, for this broker to publish them all: waiting after each topic
        // made a request of 100 topics wait for 100 publications, each opening its
        // logs, one after the other.
        let mut version = 0;
        for t in call.topics {
            let state = self.quorum.state();
            let r = match create(&state, broker, t) {
                Ok((name, _, meta)) if call.validate_only => Ok(CreatedTopic { name, meta }),
                Ok((name, cmd, meta)) => {
                    let (r, v) = self.commit_unpublished(cmd).await;
                    version = version.max(v);
                    r.map(|_| CreatedTopic { name, meta })
                }
                Err(e) => Err(e),
            };
            out.push(r);
        }
        broker.wait_published(version).await;
        out
    }

    pub async fn delete_topics(
        &self,
        broker: &Broker,
        call: DeleteTopics,
    ) -> Vec<Result<DeletedTopic, ApiError>> {
        let _guard = self.admin_lock().await;
        let mut out = Vec::with_capacity(call.topics.len());
        for t in call.topics {
            let r = match resolve(&broker.image(), t) {
                Ok((name, id)) => self
                    .commit(broker, Command::DeleteTopic { name: name.clone() })
                    .await
                    .map(|_| DeletedTopic { name, id }),
                Err(e) => Err(e),
            };
            out.push(r);
        }
        out
    }

    pub async fn create_partitions(
        &self,
        broker: &Broker,
        call: CreatePartitions,
    ) -> Vec<Result<(), ApiError>> {
        let _guard = self.admin_lock().await;
        let plan = |state: &ClusterState, item: NewPartitions| add_partitions(state, item);
        self.commit_each(broker, call.items, call.validate_only, plan)
            .await
    }

    pub async fn alter_configs(
        &self,
        broker: &Broker,
        call: AlterConfigs,
    ) -> Vec<Result<(), ApiError>> {
        let _guard = self.admin_lock().await;
        let items = call
            .items
            .into_iter()
            .map(|t| (Ok(t.topic), t.change))
            .chain(call.brokers.into_iter().map(|b| (Err(b.scope), b.change)))
            .collect();
        let plan = |state: &ClusterState, (target, change): (Result<String, i32>, ConfigChange)| {
            match target {
                Ok(topic) => alter(state, &broker.config, &topic, change),
                Err(scope) => alter_broker(state, &broker.config, scope, change),
            }
        };
        self.commit_each(broker, items, call.validate_only, plan)
            .await
    }

    /// Elects leaders as asked, each partition judged against the latest state first
    /// ([`ClusterState::election`]), so a partition that needs no election (or has no
    /// one to elect) costs no metadata entry; the quorum judges again when it applies.
    /// Answered once every shard here runs an image with the new leaders.
    pub async fn elect_leaders(
        &self,
        broker: &Broker,
        call: ElectLeaders,
    ) -> Vec<ElectedPartition> {
        let _guard = self.admin_lock().await;
        let kind = if call.unclean {
            Election::Unclean
        } else {
            Election::Preferred
        };
        let every = call.partitions.is_none();
        let partitions = call.partitions.unwrap_or_else(|| {
            self.quorum.with_state(|s| {
                s.topics
                    .iter()
                    .flat_map(|(name, t)| {
                        let name: Arc<str> = name.as_str().into();
                        (0..t.partitions.len() as i32)
                            .map(move |p| TopicPartition::new(name.clone(), p))
                    })
                    .collect()
            })
        });
        let mut out = Vec::with_capacity(partitions.len());
        let mut version = 0;
        for tp in partitions {
            let judged = self
                .quorum
                .with_state(|s| s.election(tp.topic(), tp.partition(), kind).map(|_| ()));
            let r = match judged {
                Ok(()) => {
                    let (topic, partition) = (tp.topic().to_string(), tp.partition());
                    let cmd = match kind {
                        Election::Preferred => Command::ElectPreferred { topic, partition },
                        Election::Unclean => Command::ElectUnclean { topic, partition },
                    };
                    let (r, v) = self.commit_unpublished(cmd).await;
                    version = version.max(v);
                    r.map(|_| ())
                }
                Err(e) => Err(to_api_error(&e)),
            };
            // Asked for every partition, Kafka leaves out those that needed nothing.
            let not_needed = matches!(&r, Err(e) if e.code == ResponseError::ElectionNotNeeded);
            if !(every && not_needed) {
                out.push(ElectedPartition {
                    partition: tp,
                    result: r,
                });
            }
        }
        broker.wait_published(version).await;
        out
    }

    /// AlterPartitionReassignments: every partition's move checked against the latest
    /// state here (unknown partitions, a replication factor that must not change), the
    /// rest proposed as one [`Command::Reassign`], whose per-partition verdicts the
    /// quorum gives (see `sluice_replication::cluster`, "Reassignments"). Answered once
    /// every shard here runs the resulting image.
    pub async fn reassign(&self, broker: &Broker, call: Reassign) -> Vec<Result<(), ApiError>> {
        let _guard = self.admin_lock().await;
        let state = self.quorum.state();
        let mut out: Vec<Result<(), ApiError>> = Vec::with_capacity(call.moves.len());
        let mut changes = Vec::new();
        for (tp, target) in call.moves {
            let Some(p) = state.partition(tp.topic(), tp.partition()) else {
                out.push(Err(ApiError::new(ResponseError::UnknownTopicOrPartition)));
                continue;
            };
            if let Some(t) = target.as_ref().filter(|_| call.keep_replication_factor) {
                // Against the size the partition is moving to, as Kafka compares.
                let rf = match state.reassignment(tp.topic(), tp.partition()) {
                    Some(r) => r.target(&p.replicas).len(),
                    None => p.replicas.len(),
                };
                if t.len() != rf {
                    out.push(Err(ApiError::with(
                        ResponseError::InvalidReplicationFactor,
                        format!("The replication factor is changed from {rf} to {}, which is not allowed", t.len()),
                    )));
                    continue;
                }
            }
            out.push(Ok(()));
            changes.push(Move {
                topic: tp.topic().to_string(),
                partition: tp.partition(),
                target,
            });
        }
        if changes.is_empty() {
            return out;
        }
        let verdicts = match self.commit(broker, Command::Reassign { changes }).await {
            Ok(Applied::Partitions(v)) => v
                .into_iter()
                .map(|r| r.map_err(|e| to_api_error(&e)))
                .collect(),
            Ok(other) => {
                unreachable!("a reassignment applies as per-partition results, not {other:?}")
            }
            Err(e) => vec![Err(e); out.iter().filter(|r| r.is_ok()).count()],
        };
        let mut verdicts = verdicts.into_iter();
        for r in out.iter_mut().filter(|r| r.is_ok()) {
            *r = verdicts.next().expect("one verdict per proposed move");
        }
        out
    }

    /// ListPartitionReassignments, from the state this broker has applied.
    pub fn list_reassignments(
        &self,
        call: crate::base::rpc::ListReassignments,
    ) -> Vec<OngoingReassignment> {
        self.quorum.with_state(|s| {
            let ongoing = |topic: &str, partition: i32| {
                let r = s.reassignment(topic, partition)?;
                let p = s.partition(topic, partition)?;
                Some(OngoingReassignment {
                    partition: TopicPartition::new(topic, partition),
                    replicas: p.replicas.clone(),
                    adding: r.adding.clone(),
                    removing: r.removing.clone(),
                })
            };
            match call.partitions {
                Some(asked) => asked
                    .iter()
                    .filter_map(|tp| ongoing(tp.topic(), tp.partition()))
                    .collect(),
                None => s
                    .reassignments
                    .iter()
                    .flat_map(|(t, parts)| parts.keys().map(move |p| (t, *p)))
                    .filter_map(|(t, p)| ongoing(t, p))
                    .collect(),
            }
        })
    }

    /// Plans each item's command against the latest state (each sees the ones before
    /// it committed) and commits it, unless only validating.
    async fn commit_each<T>(
        &self,
        broker: &Broker,
        items: Vec<T>,
        validate_only: bool,
        plan: impl Fn(&ClusterState, T) -> Result<Command, ApiError>,
    ) -> Vec<Result<(), ApiError>> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let state = self.quorum.state();
            let r = match plan(&state, item) {
                Ok(_) if validate_only => Ok(()),
                Ok(cmd) => self.commit(broker, cmd).await.map(|_| ()),
                Err(e) => Err(e),
            };
            out.push(r);
        }
        out
    }
}

/// Hands `image` to every shard and waits until all have adopted it.
pub async fn publish(broker: &Broker, image: Arc<MetadataImage>) {
    let calls = broker.table.shards().map(|s: ShardId| {
        let image = image.clone();
        async move {
            if let Err(e) = broker.call(s, Apply(image)).await {
                tracing::error!(shard = %s, error = %e, "shard did not adopt the metadata image");
            }
        }
    });
    crate::base::util::join_all(calls).await;
}

/// A topic may tier only where the brokers have an object store (Kafka's
/// `remote.log.storage.system.enable`).
fn check_tiered(
    config: &crate::base::config::BrokerConfig,
    tc: &TopicConfig,
) -> Result<(), ApiError> {
    if tc.log.remote_storage && config.remote_storage.is_none() {
        return Err(ApiError::with(
            ResponseError::InvalidConfig,
            "Tiered Storage functionality is disabled in the broker (start it with --remote-storage). Topic cannot be configured with remote log storage.",
        ));
    }
    Ok(())
}

fn configs_map(configs: Vec<NewTopicConfig>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut map = BTreeMap::new();
    for NewTopicConfig { name: k, value: v } in configs {
        match v {
            Some(v) => {
                map.insert(k, v);
            }
            None => {
                return Err(ApiError::with(
                    ResponseError::InvalidConfig,
                    format!("Null value for config {k}"),
                ))
            }
        }
    }
    TopicConfig::parse(&map)
        .map_err(|e| ApiError::with(ResponseError::InvalidConfig, e.to_string()))?;
    Ok(map)
}

fn create(
    state: &ClusterState,
    broker: &Broker,
    t: NewTopic,
) -> Result<(String, Command, TopicMeta), ApiError> {
    validate_topic_name(&t.name)
        .map_err(|e| ApiError::with(ResponseError::InvalidTopicException, e.to_string()))?;
    if state.topics.contains_key(&t.name) {
        return Err(ApiError::with(
            ResponseError::TopicAlreadyExists,
            format!("Topic '{}' already exists.", t.name),
        ));
    }
    // Kafka's `Topic.hasCollision`: metric names replace '.' with '_', so `a.b` and
    // `a_b` cannot both exist.
    let folded = |n: &str| n.replace('.', "_");
    let mine = folded(&t.name);
    if let Some(other) = state.topics.keys().find(|n| folded(n) == mine) {
        return Err(ApiError::with(
            ResponseError::InvalidTopicException,
            format!("Topic '{}' collides with existing topic: {other}", t.name),
        ));
    }
    let assignments = if t.assignments.is_empty() {
        let partitions = if t.num_partitions == -1 {
            broker.config.default_partitions
        } else {
            t.num_partitions
        };
        check_partition_count(partitions)?;
        state
            .place(0, partitions, t.replication_factor)
            .map_err(|e| to_api_error(&e))?
    } else {
        manual_assignments(state, &t)?
    };
    let configs = configs_map(t.configs)?;
    if let Ok(tc) = TopicConfig::parse(&configs) {
        check_tiered(&broker.config, &tc)?;
    }
    let id = Uuid::new_v4();
    let meta = TopicMeta {
        id,
        partitions: assignments.len() as i32,
        configs: configs.clone(),
        // What the topic will start with, for the CreateTopics answer.
        assignments: assignments.iter().map(|r| planned(r)).collect(),
    };
    let cmd = Command::CreateTopic {
        name: t.name.clone(),
        id: *id.as_bytes(),
        configs,
        assignments,
    };
    Ok((t.name, cmd, meta))
}

fn check_partition_count(partitions: i32) -> Result<(), ApiError> {
    if (1..=PARTITIONS_MAX).contains(&partitions) {
        return Ok(());
    }
    Err(ApiError::with(
        ResponseError::InvalidPartitions,
        format!("Number of partitions must be in [1, {PARTITIONS_MAX}], got {partitions}"),
    ))
}

/// A new partition as it starts: led by its first replica, all replicas in sync.
fn planned(replicas: &[BrokerId]) -> PartitionState {
    // Placement and the manual-assignment check give every partition at least one
    // replica, each broker once: the leader is then in the ISR.
    assert!(
        !replicas.is_empty()
            && replicas
                .iter()
                .enumerate()
                .all(|(i, r)| !replicas[..i].contains(r)),
        "a new partition's replicas are non-empty and distinct: {replicas:?}"
    );
    PartitionState {
        replicas: replicas.to_vec(),
        isr: replicas.to_vec(),
        leader: replicas[0],
        leader_epoch: 0,
        partition_epoch: 0,
        // Handed out when the command applies (`ClusterState::apply`).
        slots: Vec::new(),
    }
}

/// A new topic's manual replica assignments, in partition order, checked as Kafka's
/// controller checks them: partition count and replication factor must be left to
/// the assignments (-1), no partition twice, each list valid
/// ([`ClusterState::check_manual_assignment`]) and of the first list's length, and the
/// partitions numbered 0..n.
fn manual_assignments(state: &ClusterState, t: &NewTopic) -> Result<Vec<Vec<BrokerId>>, ApiError> {
    let invalid = |m: &str| ApiError::with(ResponseError::InvalidRequest, m);
    if t.replication_factor != -1 {
        return Err(invalid(
            "A manual replica assignment was given, so the replication factor must be -1",
        ));
    }
    if t.num_partitions != -1 {
        return Err(invalid(
            "A manual replica assignment was given, so the number of partitions must be -1",
        ));
    }
    check_partition_count(t.assignments.len() as i32)?;
    let mut by_index: BTreeMap<i32, Vec<BrokerId>> = BTreeMap::new();
    let mut rf = None;
    for ManualAssignment {
        partition: index,
        broker_ids: replicas,
    } in &t.assignments
    {
        if by_index.contains_key(index) {
            return Err(ApiError::with(
                ResponseError::InvalidReplicaAssignment,
                format!("partition {index} is assigned more than once"),
            ));
        }
        let replicas: Vec<BrokerId> = replicas.iter().map(|b| b.get()).collect();
        state
            .check_manual_assignment(*index, &replicas, rf)
            .map_err(|e| to_api_error(&e))?;
        rf = Some(replicas.len());
        by_index.insert(*index, replicas);
    }
    // Indexes are distinct: they are 0..n exactly when the largest is n - 1.
    let n = by_index.len() as i32;
    if by_index.keys().any(|i| !(0..n).contains(i)) {
        return Err(ApiError::with(
            ResponseError::InvalidReplicaAssignment,
            "partition indexes must be 0, 1, 2, ... without gaps",
        ));
    }
    Ok(by_index.into_values().collect())
}

fn resolve(image: &MetadataImage, t: TopicRef) -> Result<(String, Uuid), ApiError> {
    match t {
        TopicRef::Name(n) => match image.topics.get(&n) {
            Some(m) => Ok((n, m.id)),
            None => Err(ApiError::new(ResponseError::UnknownTopicOrPartition)),
        },
        TopicRef::Id(id) => image
            .topic_by_id(id)
            .map(|(n, _)| (n.clone(), id))
            .ok_or_else(|| ApiError::new(ResponseError::UnknownTopicId)),
    }
}

fn add_partitions(state: &ClusterState, item: NewPartitions) -> Result<Command, ApiError> {
    let NewPartitions {
        topic,
        count,
        assignments,
    } = item;
    let t = state
        .topics
        .get(&topic)
        .ok_or_else(|| ApiError::new(ResponseError::UnknownTopicOrPartition))?;
    let existing = t.partitions.len() as i32;
    if count <= existing {
        return Err(ApiError::with(
            ResponseError::InvalidPartitions,
            format!("Topic currently has {existing} partitions, which is higher than or equal to the requested {count}."),
        ));
    }
    if count > PARTITIONS_MAX {
        return Err(ApiError::with(
            ResponseError::InvalidPartitions,
            format!("at most {PARTITIONS_MAX} partitions"),
        ));
    }
    let rf = t.partitions.first().map_or(-1, |p| p.replicas.len() as i16);
    let assignments = match assignments {
        None => state
            .place(existing, count - existing, rf)
            .map_err(|e| to_api_error(&e))?,
        Some(lists) => {
            // One list per new partition, each of the topic's replication factor.
            let added = count - existing;
            if lists.len() as i32 != added {
                return Err(ApiError::with(
                    ResponseError::InvalidReplicaAssignment,
                    format!(
                        "{added} partitions are added but {} assignments were given",
                        lists.len()
                    ),
                ));
            }
            for (i, replicas) in lists.iter().enumerate() {
                state
                    .check_manual_assignment(existing + i as i32, replicas, Some(rf as usize))
                    .map_err(|e| to_api_error(&e))?;
            }
            lists
        }
    };
    Ok(Command::CreatePartitions {
        name: topic,
        existing: existing as u32,
        assignments,
    })
}

/// The command that changes `topic`'s explicit configs, validated as a whole: an
/// incremental change applies its operations to the current set, a legacy one
/// replaces the set.
fn alter(
    state: &ClusterState,
    config: &crate::base::config::BrokerConfig,
    topic: &str,
    change: ConfigChange,
) -> Result<Command, ApiError> {
    let meta = state
        .topics
        .get(topic)
        .ok_or_else(|| ApiError::new(ResponseError::UnknownTopicOrPartition))?;
    let configs = match change {
        ConfigChange::Incremental(ops) => apply_ops(meta.configs.clone(), ops)?,
        ConfigChange::Replace(mut set) => {
            // A described set written back keeps min.insync.replicas unset where it
            // was and the value is the one described for it (min(2, replicas) by the
            // smallest partition): pinned, it would stop following the replica count.
            let described = meta
                .partitions
                .iter()
                .map(|p| p.replicas.len())
                .min()
                .map(|rf| rf.clamp(1, 2).to_string());
            let unset = !meta.configs.contains_key(MIN_INSYNC);
            if unset && set.get(MIN_INSYNC).cloned() == described {
                set.remove(MIN_INSYNC);
            }
            set
        }
    };
    let tc = TopicConfig::parse(&configs)
        .map_err(|e| ApiError::with(ResponseError::InvalidConfig, e.to_string()))?;
    check_tiered(config, &tc)?;
    // As Kafka before 3.9: a topic whose segments are in the object store stays tiered
    // (off, its remote segments would be neither read by retention nor deleted).
    let remote = state
        .remote
        .get(topic)
        .is_some_and(|t| t.values().any(|l| !l.segments.is_empty()));
    if remote && !tc.log.remote_storage {
        return Err(ApiError::with(
            ResponseError::InvalidConfig,
            format!("remote.storage.enable cannot be turned off on topic {topic}: it has segments in the object store"),
        ));
    }
    Ok(Command::AlterConfigs {
        name: topic.to_string(),
        configs,
    })
}

/// The command that changes the dynamic broker configs of `scope` (-1: cluster-wide),
/// validated as a whole (see [`crate::base::broker_configs::check_dynamic`]).
fn alter_broker(
    state: &ClusterState,
    config: &crate::base::config::BrokerConfig,
    scope: i32,
    change: ConfigChange,
) -> Result<Command, ApiError> {
    let current = state
        .broker_configs
        .get(&scope)
        .cloned()
        .unwrap_or_default();
    let configs = match change {
        ConfigChange::Incremental(ops) => apply_ops(current, ops)?,
        ConfigChange::Replace(mut set) => {
            // The broker-level min.insync.replicas is described as 2, Sluice's default,
            // which applies as min(2, replicas) per topic; written back as an explicit
            // 2 it would make every RF=1 topic refuse acks=all. Kept unset.
            if !current.contains_key(MIN_INSYNC)
                && set.get(MIN_INSYNC).map(String::as_str) == Some("2")
            {
                set.remove(MIN_INSYNC);
            }
            set
        }
    };
    crate::base::broker_configs::check_dynamic(config, scope, &configs)?;
    Ok(Command::AlterBrokerConfigs { scope, configs })
}

/// IncrementalAlterConfigs' operations applied in order to an explicit config set
/// (also a group's, by the GROUP resource's handler).
pub fn apply_ops(
    mut configs: BTreeMap<String, String>,
    ops: Vec<ConfigOp>,
) -> Result<BTreeMap<String, String>, ApiError> {
    for ConfigOp { name, op, value } in ops {
        let bad = |m: String| ApiError::with(ResponseError::InvalidConfig, m);
        match op {
            AlterConfigOp::Set => {
                let v = value.ok_or_else(|| bad(format!("Null value for config {name}")))?;
                configs.insert(name, v);
            }
            AlterConfigOp::Delete => {
                configs.remove(&name);
            }
            // List-valued configs: only cleanup.policy among the ones Sluice knows.
            AlterConfigOp::Append | AlterConfigOp::Subtract
                if name == "cleanup.policy" || name == "log.cleanup.policy" =>
            {
                let v = value.ok_or_else(|| bad(format!("Null value for config {name}")))?;
                let current = configs
                    .get(&name)
                    .cloned()
                    .unwrap_or_else(|| "delete".into());
                let mut items: Vec<String> =
                    current.split(',').map(|s| s.trim().to_string()).collect();
                for x in v.split(',').map(str::trim) {
                    if op == AlterConfigOp::Append {
                        if !items.iter().any(|i| i == x) {
                            items.push(x.to_string());
                        }
                    } else {
                        items.retain(|i| i != x);
                    }
                }
                configs.insert(name, items.join(","));
            }
            AlterConfigOp::Append | AlterConfigOp::Subtract => {
                return Err(bad(format!(
                    "Config {name} is not a list; cannot APPEND or SUBTRACT"
                )))
            }
        }
    }
    Ok(configs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_brokers() -> ClusterState {
        let mut s = ClusterState::default();
        for id in 1..=3 {
            s.apply(&Command::RegisterBroker {
                id,
                host: "127.0.0.1".into(),
                port: 9090 + id,
                incarnation: 1,
            })
            .unwrap();
        }
        s
    }

    fn topic(partitions: i32, rf: i16, assignments: &[(i32, &[i32])]) -> NewTopic {
        NewTopic {
            name: "t".into(),
            num_partitions: partitions,
            replication_factor: rf,
            configs: Vec::new(),
            assignments: assignments
                .iter()
                .map(|(i, r)| ManualAssignment {
                    partition: *i,
                    broker_ids: r
                        .iter()
                        .map(|b| crate::base::ids::BrokerId::new(*b))
                        .collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn manual_assignments_come_back_in_partition_order() {
        let s = three_brokers();
        let t = topic(-1, -1, &[(1, &[3, 1]), (0, &[2, 3]), (2, &[1, 2])]);
        assert_eq!(
            manual_assignments(&s, &t).unwrap(),
            vec![vec![2, 3], vec![3, 1], vec![1, 2]]
        );
    }

    #[test]
    fn manual_assignments_are_checked_as_kafka_checks_them() {
        let s = three_brokers();
        let code = |t: NewTopic| manual_assignments(&s, &t).unwrap_err().code;
        use ResponseError::{InvalidReplicaAssignment, InvalidRequest};
        assert_eq!(code(topic(2, -1, &[(0, &[1]), (1, &[2])])), InvalidRequest);
        assert_eq!(code(topic(-1, 1, &[(0, &[1]), (1, &[2])])), InvalidRequest);
        let bad: &[&[(i32, &[i32])]] = &[
            &[(0, &[1]), (2, &[2])],
            &[(1, &[1]), (2, &[2])],
            &[(0, &[1]), (0, &[2])],
            &[(-1, &[1])],
            &[(0, &[1, 2]), (1, &[3])],
            &[(0, &[1, 1])],
            &[(0, &[4])],
            &[(0, &[])],
        ];
        for a in bad {
            assert_eq!(code(topic(-1, -1, a)), InvalidReplicaAssignment, "{a:?}");
        }
    }
}
