//! Metadata (key 3): the live brokers, and topics with each partition's leader, leader
//! epoch, replicas, ISR and offline replicas, from the committed cluster metadata.
//! Unknown topics are auto-created when the client asks for it and the broker allows
//! it (`--auto-create-topics`, default on, as Kafka).

use std::rc::Rc;

use uuid::Uuid;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, TopicName};

use super::authorized_ops::{when_asked, CLUSTER_ALL, TOPIC_ALL};
use super::sb;
use crate::base::error::ApiError;
use crate::base::ids::BrokerId as NodeId;
use crate::base::rpc::{CreateTopics, NewTopic};
use crate::base::topic_config::validate_topic_name;
use crate::partition::broker::Broker;

pub use crate::coord::is_internal;

/// Auto-creates the `names` that do not exist (default partitions and configs).
/// Returns the error per name for those that could not be created.
///
/// An internal topic is created as its coordinator creates it (50 partitions,
/// compacted), as Kafka's auto-creation does: a monitoring tool that asks for
/// `__consumer_offsets` before any group exists (Burrow does at start) must not leave
/// behind a one-partition topic the group coordinator cannot use.
pub async fn auto_create(broker: &Broker, names: &[String]) -> Vec<(String, ApiError)> {
    let image = broker.image();
    let (internal, missing): (Vec<String>, Vec<String>) = names
        .iter()
        .filter(|n| !image.topics.contains_key(*n))
        .cloned()
        .partition(|n| is_internal(n));
    if !broker.config.auto_create_topics {
        return Vec::new();
    }
    let mut errors = Vec::new();
    for name in internal {
        let partitions = if name == crate::coord::group::OFFSETS_TOPIC {
            crate::coord::group::OFFSETS_PARTITIONS
        } else {
            crate::coord::txn::TXN_STATE_PARTITIONS
        };
        if let Err(e) = broker.ensure_internal_topic(&name, partitions).await {
            errors.push((name, e));
        }
    }
    if missing.is_empty() {
        return errors;
    }
    let topics = missing
        .iter()
        .map(|n| NewTopic {
            name: n.clone(),
            num_partitions: -1,
            replication_factor: -1,
            configs: Vec::new(),
            assignments: Vec::new(),
        })
        .collect();
    match broker
        .control(CreateTopics {
            topics,
            validate_only: false,
        })
        .await
    {
        Ok(results) => {
            for (name, r) in missing.into_iter().zip(results) {
                match r {
                    Ok(_) => tracing::info!(topic = %name, "auto-created topic"),
                    // Another request created it meanwhile: fine.
                    Err(e) if e.code == ResponseError::TopicAlreadyExists => {}
                    Err(e) => errors.push((name, e)),
                }
            }
        }
        Err(e) => errors.extend(missing.into_iter().map(|n| (n, e.clone()))),
    }
    errors
}

/// `listener`: the one the client connected through; brokers are answered with their
/// endpoints of that name.
pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    listener: &str,
    req: MetadataRequest,
) -> MetadataResponse {
    // v0 has no flag: an empty list means all topics and auto-creation is implied.
    // From v12 a topic may be named by its id alone (Kafka: never auto-created, an
    // unknown id answered UNKNOWN_TOPIC_ID).
    let mut by_id: Vec<Uuid> = Vec::new();
    let requested: Option<Vec<String>> = req.topics.map(|ts| {
        ts.into_iter()
            .filter_map(|t| match t.name {
                Some(n) => Some(n.0.to_string()),
                None => {
                    if !t.topic_id.is_nil() {
                        by_id.push(t.topic_id);
                    }
                    None
                }
            })
            .collect()
    });
    let requested = match requested {
        Some(v) if v.is_empty() && version == 0 => None,
        other => other,
    };
    let allow_auto = version < 4 || req.allow_auto_topic_creation;
    // KIP-430: asked-for authorized operations (the cluster's only in v8-v10).
    let topic_ops = when_asked(
        version >= 8 && req.include_topic_authorized_operations,
        TOPIC_ALL,
    );
    let cluster_ops = when_asked(
        (8..=10).contains(&version) && req.include_cluster_authorized_operations,
        CLUSTER_ALL,
    );
    let mut create_errors = Vec::new();
    if let (Some(names), true) = (&requested, allow_auto) {
        let valid: Vec<String> = names
            .iter()
            .filter(|n| validate_topic_name(n).is_ok())
            .cloned()
            .collect();
        create_errors = auto_create(broker, &valid).await;
    }
    let image = broker.image();
    let mut names: Vec<String> = match requested {
        Some(n) => n,
        None => image.topics.keys().cloned().collect(),
    };
    let mut unknown_ids = Vec::new();
    for id in by_id {
        match image.topics.iter().find(|(_, t)| t.id == id) {
            Some((name, _)) if !names.contains(name) => names.push(name.clone()),
            Some(_) => {}
            None => unknown_ids.push(id),
        }
    }
    let unknown = unknown_ids.into_iter().map(|id| {
        MetadataResponseTopic::default()
            .with_error_code(ResponseError::UnknownTopicId.code())
            .with_name(None)
            .with_topic_id(id)
    });
    let topics = names
        .into_iter()
        .map(|name| {
            let t = MetadataResponseTopic::default()
                .with_name(Some(TopicName(sb(name.clone()))))
                // Kafka flags its internal topics (v1+), so regex subscriptions and
                // tools leave them alone.
                .with_is_internal(version >= 1 && is_internal(&name))
                .with_topic_authorized_operations(topic_ops);
            if let Err(m) = validate_topic_name(&name) {
                tracing::debug!(topic = %name, "metadata for invalid topic name: {m}");
                return t.with_error_code(ResponseError::InvalidTopicException.code());
            }
            if let Some((_, e)) = create_errors.iter().find(|(n, _)| *n == name) {
                return t.with_error_code(e.code());
            }
            let Some(meta) = image.topics.get(&name) else {
                return t.with_error_code(ResponseError::UnknownTopicOrPartition.code());
            };
            let ids = |v: &[i32]| v.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
            let partitions = meta
                .assignments
                .iter()
                .enumerate()
                .map(|(p, a)| {
                    let offline: Vec<i32> = a
                        .replicas
                        .iter()
                        .copied()
                        .filter(|r| image.brokers.get(&NodeId::new(*r)).is_none_or(|b| b.fenced))
                        .collect();
                    let mut mp = MetadataResponsePartition::default()
                        .with_partition_index(p as i32)
                        .with_leader_id(BrokerId(a.leader))
                        .with_leader_epoch(a.leader_epoch)
                        .with_replica_nodes(ids(&a.replicas))
                        .with_isr_nodes(ids(&a.isr));
                    if version >= 5 {
                        mp = mp.with_offline_replicas(ids(&offline));
                    }
                    if a.leader < 0 {
                        mp = mp.with_error_code(ResponseError::LeaderNotAvailable.code());
                    } else if image
                        .brokers
                        .get(&NodeId::new(a.leader))
                        .is_some_and(|b| b.endpoint(listener).is_none())
                    {
                        // The leader has no listener of the name the client came
                        // through: as Kafka, no leader, LISTENER_NOT_FOUND from v6.
                        let code = match version >= 6 {
                            true => ResponseError::ListenerNotFound,
                            false => ResponseError::LeaderNotAvailable,
                        };
                        mp = mp.with_leader_id(BrokerId(-1)).with_error_code(code.code());
                    }
                    mp
                })
                .collect();
            t.with_topic_id(meta.id).with_partitions(partitions)
        })
        .chain(unknown)
        .collect();
    let me = broker.config.broker_id();
    let mut brokers: Vec<MetadataResponseBroker> = image
        .brokers
        .iter()
        .filter(|(id, b)| !b.fenced || **id == me)
        .filter_map(|(id, b)| {
            let (host, port) = b.endpoint(listener)?;
            Some(
                MetadataResponseBroker::default()
                    .with_node_id((*id).into())
                    .with_host(sb(host.to_string()))
                    .with_port(port)
                    .with_rack(b.rack.clone().map(sb)),
            )
        })
        .collect();
    // An answer always lists at least the broker answering: clients (librdkafka) take
    // a broker list without it as a partial answer. (Its image lacks it only while it
    // re-registers, say after its session lapsed.)
    if !image.brokers.contains_key(&me) {
        let (host, port) = broker.config.advertised_for(listener);
        brokers.push(
            MetadataResponseBroker::default()
                .with_node_id(me.into())
                .with_host(sb(host.to_string()))
                .with_port(port)
                .with_rack(broker.config.rack.clone().map(sb)),
        );
    }
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(sb(image.cluster_id.clone())))
        .with_controller_id(
            image
                .controller_for_clients(broker.config.broker_id())
                .into(),
        )
        .with_topics(topics)
        .with_cluster_authorized_operations(cluster_ops)
}
