//! OffsetForLeaderEpoch (key 23, v0–v4; v0–v1 coded by `sluice_protocol::legacy`): the
//! end offset of a leader epoch in the leader's log — where a follower (or a KIP-320
//! consumer) that last saw that epoch must truncate to so its log never diverges from
//! the leader's. Answered by the leader's
//! home shard from the partition's leader-epoch cache.

use std::rc::Rc;

use kafka_protocol::messages::offset_for_leader_epoch_request::OffsetForLeaderEpochRequest;
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderEpochResponse, OffsetForLeaderTopicResult,
};

use crate::base::ids::LeaderEpoch;
use crate::base::rpc::{EpochEnd, EpochEndItem};
use crate::partition::broker::Broker;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let request = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.topic.0.to_string();
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let item = EpochEndItem {
                        topic: name.clone(),
                        partition: p.partition,
                        current_leader_epoch: LeaderEpoch::new(p.current_leader_epoch),
                        leader_epoch: LeaderEpoch::new(p.leader_epoch),
                    };
                    (p.partition, item)
                })
                .collect();
            (t.topic, parts)
        })
        .collect();
    let answered = broker
        .per_partition(request, |t| t.0.as_str(), |items| EpochEnd { items })
        .await;
    let topics = answered
        .into_iter()
        .map(|(topic, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, r)| {
                    let base = EpochEndOffset::default().with_partition(index);
                    match r {
                        Ok(out) => base
                            .with_leader_epoch(out.leader_epoch.get())
                            .with_end_offset(out.end_offset.get()),
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
