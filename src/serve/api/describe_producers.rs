//! DescribeProducers (key 61, v0, KIP-664): the producers each partition's log
//! remembers — id, epoch, last sequence, last write's timestamp, coordinator epoch of
//! the last marker, and the first offset of the open transaction (-1 if none) — as
//! Kafka's `kafka-transactions.sh describe-producers` shows them.
//!
//! Answered on the partition's home shard from the storage crate's producer state. As
//! Kafka's, any replica holding the log answers (clients ask the leader); a broker
//! without a replica answers NOT_LEADER_OR_FOLLOWER, an offline partition
//! KAFKA_STORAGE_ERROR, a partition not in the metadata UNKNOWN_TOPIC_OR_PARTITION.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::describe_producers_request::DescribeProducersRequest;
use kafka_protocol::messages::describe_producers_response::{
    DescribeProducersResponse, PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::ProducerId;
use sluice_protocol::TopicPartition;
use sluice_storage::producer::ActiveProducer;

use super::sb;
use crate::base::rpc::DescribeProducers;
use crate::partition::broker::Broker;

fn producer_state(p: &ActiveProducer) -> ProducerState {
    ProducerState::default()
        .with_producer_id(ProducerId(p.producer_id))
        .with_producer_epoch(i32::from(p.epoch))
        .with_last_sequence(p.last_seq)
        .with_last_timestamp(p.last_timestamp)
        .with_coordinator_epoch(p.coordinator_epoch)
        .with_current_txn_start_offset(p.txn_start_offset)
}

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let request = req
        .topics
        .into_iter()
        .map(|t| {
            let name: Arc<str> = t.name.0.as_str().into();
            let parts = t
                .partition_indexes
                .iter()
                .map(|&p| (p, TopicPartition::new(name.clone(), p)))
                .collect();
            (t.name, parts)
        })
        .collect();
    let answered = broker
        .per_partition(
            request,
            |t| t.0.as_str(),
            |items| DescribeProducers { items },
        )
        .await;
    let topics = answered
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, r)| {
                    let base = PartitionResponse::default().with_partition_index(index);
                    match r {
                        Ok(producers) => base
                            .with_active_producers(producers.iter().map(producer_state).collect()),
                        Err(e) => base
                            .with_error_code(e.code())
                            .with_error_message(e.message.clone().map(sb)),
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
