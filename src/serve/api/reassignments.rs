//! AlterPartitionReassignments (key 45) and ListPartitionReassignments (key 46),
//! KIP-455: move a partition's replicas to other brokers, cancel a move, list the moves
//! in progress. The controller's algorithm is in `sluice_replication::cluster`
//! ("Reassignments"). Per partition: NONE once the move is started (or cancelled) in
//! this broker's metadata, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (an
//! empty or duplicate target, an unregistered broker, a revert that needs an unclean
//! election), INVALID_REPLICATION_FACTOR (v1 with `allow_replication_factor_change`
//! false and a target of another size), NO_REASSIGNMENT_IN_PROGRESS (cancelling none).
//! A listing leaves out partitions with no move in progress and unknown ones. Also
//! UnregisterBroker (key 64), the last step of taking a broker out.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::alter_partition_reassignments_request::AlterPartitionReassignmentsRequest;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    AlterPartitionReassignmentsResponse, ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsRequest;
use kafka_protocol::messages::list_partition_reassignments_response::{
    ListPartitionReassignmentsResponse, OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    BrokerId, TopicName, UnregisterBrokerRequest, UnregisterBrokerResponse,
};
use sluice_protocol::TopicPartition;

use super::sb;
use crate::base::rpc::{ListReassignments, Reassign, Unregister};
use crate::partition::broker::Broker;

pub async fn alter(
    broker: &Rc<Broker>,
    _version: i16,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let mut moves = Vec::new();
    for t in &req.topics {
        let name: Arc<str> = t.name.0.as_str().into();
        for p in &t.partitions {
            let target = p.replicas.as_ref().map(|r| r.iter().map(|b| b.0).collect());
            moves.push((TopicPartition::new(name.clone(), p.partition_index), target));
        }
    }
    let count = moves.len();
    let call = Reassign {
        moves,
        // v0 has no such field, and its default (true) allows any size.
        keep_replication_factor: !req.allow_replication_factor_change,
    };
    let mut results = match broker.control(call).await {
        Ok(r) => r.into_iter(),
        Err(e) => vec![Err(e); count].into_iter(),
    };
    let responses = req
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let r = ReassignablePartitionResponse::default()
                        .with_partition_index(p.partition_index);
                    match results.next().expect("one result per partition") {
                        Ok(()) => r,
                        Err(e) => r
                            .with_error_code(e.code())
                            .with_error_message(e.message.map(sb)),
                    }
                })
                .collect();
            ReassignableTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    AlterPartitionReassignmentsResponse::default().with_responses(responses)
}

/// UnregisterBroker (key 64): a stopped broker holding no replica leaves the cluster
/// (`Command::UnregisterBroker`): BROKER_ID_NOT_REGISTERED for an unknown one,
/// INVALID_REQUEST with the reason for a live one or one that still holds replicas.
pub async fn unregister(
    broker: &Rc<Broker>,
    _version: i16,
    req: UnregisterBrokerRequest,
) -> UnregisterBrokerResponse {
    match broker
        .control(Unregister(req.broker_id.0))
        .await
        .and_then(|r| r)
    {
        Ok(()) => UnregisterBrokerResponse::default(),
        Err(e) => UnregisterBrokerResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message.map(sb)),
    }
}

pub async fn list(
    broker: &Rc<Broker>,
    _version: i16,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let partitions = req.topics.map(|topics| {
        topics
            .into_iter()
            .flat_map(|t| {
                let name: Arc<str> = t.name.0.as_str().into();
                t.partition_indexes
                    .into_iter()
                    .map(move |p| TopicPartition::new(name.clone(), p))
            })
            .collect()
    });
    let ongoing = match broker.control(ListReassignments { partitions }).await {
        Ok(o) => o,
        Err(e) => {
            return ListPartitionReassignmentsResponse::default()
                .with_error_code(e.code())
                .with_error_message(e.message.map(sb))
        }
    };
    let mut topics: Vec<OngoingTopicReassignment> = Vec::new();
    for o in ongoing {
        let ids = |v: &[i32]| v.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
        let p = OngoingPartitionReassignment::default()
            .with_partition_index(o.partition.partition())
            .with_replicas(ids(&o.replicas))
            .with_adding_replicas(ids(&o.adding))
            .with_removing_replicas(ids(&o.removing));
        match topics.last_mut() {
            Some(t) if t.name.0.as_str() == o.partition.topic() => t.partitions.push(p),
            _ => topics.push(
                OngoingTopicReassignment::default()
                    .with_name(TopicName(sb(o.partition.topic())))
                    .with_partitions(vec![p]),
            ),
        }
    }
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}
