//! DeleteRecords (key 21): moves each partition's log start forward.

use std::rc::Rc;

use kafka_protocol::messages::delete_records_request::DeleteRecordsRequest;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};

use crate::base::ids::Offset;
use crate::base::rpc::{DeleteRecords, DeleteRecordsItem};
use crate::partition::broker::Broker;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let request = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let item = DeleteRecordsItem {
                        topic: name.clone(),
                        partition: p.partition_index,
                        before_offset: Offset::new(p.offset),
                    };
                    (p.partition_index, item)
                })
                .collect();
            (t.name, parts)
        })
        .collect();
    let answered = broker
        .per_partition(request, |t| t.0.as_str(), |items| DeleteRecords { items })
        .await;
    let topics = answered
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, r)| {
                    let base = DeleteRecordsPartitionResult::default().with_partition_index(index);
                    match r {
                        Ok(low) => base.with_low_watermark(low.get()),
                        Err(e) => base.with_error_code(e.code()).with_low_watermark(-1),
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}
