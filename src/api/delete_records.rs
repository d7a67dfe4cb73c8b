//! DeleteRecords (key 21): moves each partition's log start forward.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_request::DeleteRecordsRequest;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};

use crate::broker::{Broker, ShardReq, ShardResp};
use crate::error::{self, ApiError};

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let image = broker.image();
    let mut jobs = Vec::new();
    let mut shape = Vec::new();
    for t in &req.topics {
        let meta = image.topics.get(t.name.0.as_str());
        let mut parts = Vec::new();
        for p in &t.partitions {
            match meta.filter(|m| (0..m.partitions).contains(&p.partition_index)) {
                Some(m) => {
                    jobs.push((
                        broker.owner(m, p.partition_index),
                        (t.name.0.to_string(), p.partition_index, p.offset),
                    ));
                    parts.push((p.partition_index, None));
                }
                None => parts.push((
                    p.partition_index,
                    Some(ApiError::new(ResponseError::UnknownTopicOrPartition)),
                )),
            }
        }
        shape.push((t.name.clone(), parts));
    }
    let mut results = broker
        .fan_out(
            jobs,
            |items| ShardReq::DeleteRecords { items },
            |r| match r {
                ShardResp::DeleteRecords(v) => v,
                _ => unreachable!("DeleteRecords answers DeleteRecords"),
            },
            |e| Err(error::from_mesh(e)),
        )
        .await
        .into_iter();
    let topics = shape
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, err)| {
                    let r = match err {
                        Some(e) => Err(e),
                        None => results.next().expect("one result per job"),
                    };
                    let base = DeleteRecordsPartitionResult::default().with_partition_index(index);
                    match r {
                        Ok(low) => base.with_low_watermark(low),
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
