//! OffsetDelete (v0): tombstones a group's committed offsets for partitions it does not
//! consume.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse};

use crate::base::rpc::DeleteOffsets;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use sluice_protocol::TopicPartition;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let group = req.group_id.to_string();
    let partitions: Vec<TopicPartition> = req
        .topics
        .iter()
        .flat_map(|t| {
            let name: Arc<str> = t.name.0.as_str().into();
            t.partitions
                .iter()
                .map(move |p| TopicPartition::new(name.clone(), p.partition_index))
        })
        .collect();
    let call = DeleteOffsets {
        partition: partition_for(&group),
        group: group.clone(),
        partitions: partitions.clone(),
    };
    let codes = match route(broker, call).await {
        Ok(Ok(codes)) => codes,
        Ok(Err(e)) => return OffsetDeleteResponse::default().with_error_code(e.code()),
        Err(e) => return OffsetDeleteResponse::default().with_error_code(e.code()),
    };
    let mut topics: Vec<OffsetDeleteResponseTopic> = Vec::new();
    for (tp, c) in partitions.into_iter().zip(codes) {
        let part = OffsetDeleteResponsePartition::default()
            .with_partition_index(tp.partition())
            .with_error_code(c.err().map_or(0, |e| e.code()));
        match topics.last_mut() {
            Some(t) if t.name.0.as_str() == tp.topic() => t.partitions.push(part),
            _ => topics.push(
                OffsetDeleteResponseTopic::default()
                    .with_name(crate::serve::api::sb(tp.topic()).into())
                    .with_partitions(vec![part]),
            ),
        }
    }
    OffsetDeleteResponse::default().with_topics(topics)
}
