//! Metadata (key 3): brokers, and topics with their partitions. This broker leads
//! every partition (one replica). Unknown topics are auto-created when the client asks
//! for it and the broker allows it (`--auto-create-topics`, default on, as Kafka).

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, TopicName};

use super::sb;
use crate::broker::{Broker, LEADER_EPOCH};
use crate::controller::{ControlOp, ControlResult, NewTopic};
use crate::error::ApiError;
use crate::topic_config::validate_topic_name;

/// Auto-creates the `names` that do not exist (default partitions and configs).
/// Returns the error per name for those that could not be created.
pub async fn auto_create(broker: &Broker, names: &[String]) -> Vec<(String, ApiError)> {
    let image = broker.image();
    let missing: Vec<String> = names
        .iter()
        .filter(|n| !image.topics.contains_key(*n))
        .cloned()
        .collect();
    if missing.is_empty() || !broker.config.auto_create_topics {
        return Vec::new();
    }
    let topics = missing
        .iter()
        .map(|n| NewTopic {
            name: n.clone(),
            num_partitions: -1,
            replication_factor: -1,
            configs: Vec::new(),
        })
        .collect();
    let mut errors = Vec::new();
    match broker
        .control(ControlOp::CreateTopics {
            topics,
            validate_only: false,
        })
        .await
    {
        Ok(ControlResult::Created(results)) => {
            for (name, r) in missing.into_iter().zip(results) {
                match r {
                    Ok((_, _)) => tracing::info!(topic = %name, "auto-created topic"),
                    // Another request created it meanwhile: fine.
                    Err(e) if e.code == ResponseError::TopicAlreadyExists => {}
                    Err(e) => errors.push((name, e)),
                }
            }
        }
        Ok(_) => unreachable!("CreateTopics answers Created"),
        Err(e) => errors.extend(missing.into_iter().map(|n| (n, e.clone()))),
    }
    errors
}

pub async fn handle(broker: &Rc<Broker>, version: i16, req: MetadataRequest) -> MetadataResponse {
    let c = &broker.config;
    // v0 has no flag: an empty list means all topics and auto-creation is implied.
    let requested: Option<Vec<String>> = req.topics.map(|ts| {
        ts.into_iter()
            .filter_map(|t| t.name.map(|n| n.0.to_string()))
            .collect()
    });
    let requested = match requested {
        Some(v) if v.is_empty() && version == 0 => None,
        other => other,
    };
    let allow_auto = version < 4 || req.allow_auto_topic_creation;
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
    let names: Vec<String> = match requested {
        Some(n) => n,
        None => image.topics.keys().cloned().collect(),
    };
    let node = BrokerId(c.node_id);
    let topics = names
        .into_iter()
        .map(|name| {
            let t = MetadataResponseTopic::default()
                .with_name(Some(TopicName(sb(name.clone()))))
                // Kafka flags its offsets topic internal (v1+), so regex subscriptions
                // and tools leave it alone.
                .with_is_internal(version >= 1 && name == crate::group::OFFSETS_TOPIC);
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
            let partitions = (0..meta.partitions)
                .map(|p| {
                    MetadataResponsePartition::default()
                        .with_partition_index(p)
                        .with_leader_id(node)
                        .with_leader_epoch(LEADER_EPOCH)
                        .with_replica_nodes(vec![node])
                        .with_isr_nodes(vec![node])
                })
                .collect();
            t.with_topic_id(meta.id).with_partitions(partitions)
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(node)
            .with_host(sb(c.advertised_host.clone()))
            .with_port(c.advertised_port)])
        .with_cluster_id(Some(sb(image.cluster_id.clone())))
        .with_controller_id(node)
        .with_topics(topics)
}
