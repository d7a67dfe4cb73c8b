//! OffsetForLeaderEpoch (key 23, v2–v4): the end offset of a leader epoch in the
//! leader's log — where a follower (or a KIP-320 consumer) that last saw that epoch must
//! truncate to so its log never diverges from the leader's. Answered by the leader's
//! home shard from the partition's leader-epoch cache.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_for_leader_epoch_request::OffsetForLeaderEpochRequest;
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderEpochResponse, OffsetForLeaderTopicResult,
};

use crate::broker::{Broker, ShardReq, ShardResp};
use crate::error::{self, ApiError};

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let image = broker.image();
    let mut jobs = Vec::new();
    let mut shape = Vec::new();
    for t in &req.topics {
        let meta = image.topics.get(t.topic.0.as_str());
        let mut parts = Vec::new();
        for p in &t.partitions {
            match meta.filter(|m| (0..m.partitions).contains(&p.partition)) {
                Some(m) => {
                    jobs.push((
                        broker.owner(m, p.partition),
                        (
                            t.topic.0.to_string(),
                            p.partition,
                            p.current_leader_epoch,
                            p.leader_epoch,
                        ),
                    ));
                    parts.push((p.partition, None));
                }
                None => parts.push((
                    p.partition,
                    Some(ApiError::new(ResponseError::UnknownTopicOrPartition)),
                )),
            }
        }
        shape.push((t.topic.clone(), parts));
    }
    let mut results = broker
        .fan_out(
            jobs,
            |items| ShardReq::EpochEnd { items },
            |r| match r {
                ShardResp::EpochEnd(v) => v,
                _ => unreachable!("EpochEnd answers EpochEnd"),
            },
            |e| Err(error::from_mesh(e)),
        )
        .await
        .into_iter();
    let topics = shape
        .into_iter()
        .map(|(topic, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, err)| {
                    let r = match err {
                        Some(e) => Err(e),
                        None => results.next().expect("one result per job"),
                    };
                    let base = EpochEndOffset::default().with_partition(index);
                    match r {
                        Ok((epoch, end)) => base.with_leader_epoch(epoch).with_end_offset(end),
                        Err(e) => base
                            .with_error_code(e.code())
                            .with_leader_epoch(-1)
                            .with_end_offset(-1),
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(topic)
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
