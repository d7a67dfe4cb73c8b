//! OffsetDelete (v0): tombstones a group's committed offsets for partitions it does not
//! consume.

use std::rc::Rc;

use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse};

use crate::base::rpc::DeleteOffsets;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let group = req.group_id.to_string();
    let partitions: Vec<(String, i32)> = req
        .topics
        .iter()
        .flat_map(|t| {
            let name = t.name.to_string();
            t.partitions
                .iter()
                .map(move |p| (name.clone(), p.partition_index))
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
    for ((topic, p), c) in partitions.into_iter().zip(codes) {
        let part = OffsetDeleteResponsePartition::default()
            .with_partition_index(p)
            .with_error_code(c.err().map_or(0, |e| e.code()));
        match topics.last_mut() {
            Some(t) if t.name.0.as_str() == topic => t.partitions.push(part),
            _ => topics.push(
                OffsetDeleteResponseTopic::default()
                    .with_name(crate::serve::api::sb(topic).into())
                    .with_partitions(vec![part]),
            ),
        }
    }
    OffsetDeleteResponse::default().with_topics(topics)
}
