//! OffsetCommit (v0–v8): partitions of unknown topics are refused here; the rest go to
//! the group's coordinator shard, which answers after the commit records are flushed
//! to `__consumer_offsets`. v0 commits went to ZooKeeper in Kafka; Kafka 3.9 without
//! ZooKeeper (KRaft) answers them UNSUPPORTED_VERSION for every partition, and so does
//! Sluice. v1's commit timestamp only set the commit's expiry in Kafka: ignored.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};

use crate::base::rpc::CommitOffsets;
use crate::base::util::now_ms;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use sluice_coordinator::group::{CommitArgs, Committed};

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group = req.group_id.to_string();
    let image = broker.image();
    let now = now_ms();
    // (topic, partition, error decided here)
    let mut order: Vec<(String, i32, Option<i16>)> = Vec::new();
    let mut offsets = Vec::new();
    for t in &req.topics {
        let topic = t.name.to_string();
        let meta = image.topics.get(&topic);
        for p in &t.partitions {
            if version == 0 {
                let code = ResponseError::UnsupportedVersion.code();
                order.push((topic.clone(), p.partition_index, Some(code)));
                continue;
            }
            let known = meta.is_some_and(|m| (0..m.partitions).contains(&p.partition_index));
            if !known {
                order.push((
                    topic.clone(),
                    p.partition_index,
                    Some(ResponseError::UnknownTopicOrPartition.code()),
                ));
                continue;
            }
            order.push((topic.clone(), p.partition_index, None));
            offsets.push((
                (topic.clone(), p.partition_index),
                Committed {
                    offset: p.committed_offset,
                    leader_epoch: if version >= 6 {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|s| s.to_string())
                        .unwrap_or_default(),
                    commit_timestamp_ms: now,
                },
            ));
        }
    }
    let args = CommitArgs {
        group_id: group.clone(),
        generation: req.generation_id_or_member_epoch,
        member_id: req.member_id.to_string(),
        instance_id: if version >= 7 {
            req.group_instance_id.map(|s| s.to_string())
        } else {
            None
        },
        offsets,
    };
    // The coordinator's codes, one per partition sent to it, in the order sent.
    let results: Result<Vec<i16>, i16> = if args.offsets.is_empty() {
        Ok(Vec::new())
    } else {
        let call = CommitOffsets {
            partition: partition_for(&group),
            args,
        };
        match route(broker, call).await {
            Ok(r) => Ok(r
                .into_iter()
                .map(|p| p.code.err().map_or(0, |e| e.code()))
                .collect()),
            Err(e) => Err(e.code()),
        }
    };
    let mut coordinator_codes = match &results {
        Ok(r) => r.clone().into_iter(),
        Err(_) => Vec::new().into_iter(),
    };
    let mut topics: Vec<OffsetCommitResponseTopic> = Vec::new();
    for (topic, partition, local) in order {
        let code = match (local, &results) {
            (Some(c), _) => c,
            (None, Err(c)) => *c,
            (None, Ok(_)) => coordinator_codes.next().unwrap_or(0),
        };
        let part = OffsetCommitResponsePartition::default()
            .with_partition_index(partition)
            .with_error_code(code);
        match topics.last_mut() {
            Some(t) if t.name.0.as_str() == topic => t.partitions.push(part),
            _ => topics.push(
                OffsetCommitResponseTopic::default()
                    .with_name(crate::serve::api::sb(topic).into())
                    .with_partitions(vec![part]),
            ),
        }
    }
    OffsetCommitResponse::default().with_topics(topics)
}
