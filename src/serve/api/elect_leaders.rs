//! ElectLeaders (key 43, KIP-460): elections an operator asks for, preferred (leadership
//! back to each partition's first replica, when it is alive and in the ISR) or unclean
//! (a leaderless partition takes a live replica even from outside its ISR, whatever the
//! topic's `unclean.leader.election.enable`). Per partition: NONE once the new leader is
//! in this broker's metadata, ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE,
//! ELIGIBLE_LEADERS_NOT_AVAILABLE or UNKNOWN_TOPIC_OR_PARTITION, as Kafka's controller
//! answers. No topic list (null) means every partition, answered only for those that
//! needed an election; an unknown election type is INVALID_REQUEST.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::elect_leaders_request::ElectLeadersRequest;
use kafka_protocol::messages::elect_leaders_response::{
    ElectLeadersResponse, PartitionResult, ReplicaElectionResult,
};
use kafka_protocol::messages::TopicName;
use sluice_protocol::TopicPartition;

use super::sb;
use crate::base::error::ApiError;
use crate::base::rpc::{ElectLeaders, ElectedPartition};
use crate::partition::broker::Broker;

/// ElectLeaders' election types (Kafka's `ElectionType`).
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: ElectLeadersRequest,
) -> ElectLeadersResponse {
    let asked: Option<Vec<TopicPartition>> = req.topic_partitions.map(|topics| {
        topics
            .into_iter()
            .flat_map(|t| {
                let name: Arc<str> = t.topic.0.as_str().into();
                t.partitions
                    .into_iter()
                    .map(move |p| TopicPartition::new(name.clone(), p))
            })
            .collect()
    });
    let unclean = match req.election_type {
        PREFERRED => false,
        UNCLEAN => true,
        other => {
            let e = ApiError::with(
                ResponseError::InvalidRequest,
                format!("Unknown election type {other}"),
            );
            let results = asked
                .unwrap_or_default()
                .into_iter()
                .map(|partition| ElectedPartition {
                    partition,
                    result: Err(e.clone()),
                })
                .collect();
            return answer(results).with_error_code(e.code());
        }
    };
    if asked.as_ref().is_some_and(Vec::is_empty) {
        return ElectLeadersResponse::default();
    }
    let call = ElectLeaders {
        unclean,
        partitions: asked.clone(),
    };
    let results = match broker.control(call).await {
        Ok(r) => r,
        Err(e) => asked
            .unwrap_or_default()
            .into_iter()
            .map(|partition| ElectedPartition {
                partition,
                result: Err(e.clone()),
            })
            .collect(),
    };
    answer(results)
}

/// The response for per-partition results, grouped by topic in the order first seen.
fn answer(results: Vec<ElectedPartition>) -> ElectLeadersResponse {
    let mut order: Vec<String> = Vec::new();
    let mut by_topic: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    for elected in results {
        let tp = &elected.partition;
        let (topic, partition) = (tp.topic().to_string(), tp.partition());
        let result = PartitionResult::default().with_partition_id(partition);
        let result = match elected.result {
            Ok(()) => result,
            Err(e) => result
                .with_error_code(e.code())
                .with_error_message(e.message.map(sb)),
        };
        if !by_topic.contains_key(&topic) {
            order.push(topic.clone());
        }
        by_topic.entry(topic).or_default().push(result);
    }
    let results = order
        .into_iter()
        .map(|topic| {
            let partitions = by_topic.remove(&topic).unwrap_or_default();
            ReplicaElectionResult::default()
                .with_topic(TopicName(sb(topic)))
                .with_partition_result(partitions)
        })
        .collect();
    ElectLeadersResponse::default().with_replica_election_results(results)
}
