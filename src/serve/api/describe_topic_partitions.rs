//! DescribeTopicPartitions (key 75, v0, KIP-966): topics and their partitions in
//! pages, for clusters with more partitions than one Metadata answer should carry.
//!
//! Kafka's rules (its DescribeTopicPartitionsRequestHandler and metadata cache):
//! - No topics named: every topic; otherwise the named ones. Either way only names at or
//!   after the cursor's topic, in name order.
//! - At most `min(response_partition_limit, max.request.partition.size.limit = 2000)`
//!   partitions per answer; the cursor's topic starts at the cursor's partition, every
//!   other topic at 0. A topic cut short ends the page with `next_cursor` at its first
//!   partition left out; a page that filled up exactly before the next topic points the
//!   cursor at that topic's partition 0.
//! - A named topic that does not exist is answered UNKNOWN_TOPIC_OR_PARTITION (or
//!   INVALID_TOPIC_EXCEPTION for an illegal name) without using up the limit; with no
//!   topics named, nothing is said about missing ones.
//! - A cursor whose topic is not among the named ones, or whose partition is negative,
//!   is an INVALID_REQUEST, answered on every named topic (the response has no
//!   top-level error).
//!
//! Partitions carry no error (a partition without a leader shows leader -1, as Kafka).
//! Sluice has no eligible leader replicas (KIP-966 ELR): both ELR lists are empty.
//! Without an authorizer every topic operation is authorized (see
//! [`super::authorized_ops`]), and the response always carries them.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_topic_partitions_request::DescribeTopicPartitionsRequest;
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponse, DescribeTopicPartitionsResponsePartition,
    DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{BrokerId, TopicName};
use uuid::Uuid;

use super::authorized_ops::TOPIC_ALL;
use super::metadata::is_internal;
use super::sb;
use crate::base::ids::BrokerId as NodeId;
use crate::base::metadata::{MetadataImage, TopicMeta};
use crate::base::topic_config::validate_topic_name;
use crate::partition::broker::Broker;

/// Kafka's `max.request.partition.size.limit` default: the most partitions one answer
/// carries, whatever the client asks.
pub const MAX_REQUEST_PARTITION_SIZE_LIMIT: i32 = 2000;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    describe(&broker.image(), &req)
}

fn topic_entry(name: &str, code: i16) -> DescribeTopicPartitionsResponseTopic {
    DescribeTopicPartitionsResponseTopic::default()
        .with_error_code(code)
        .with_name(Some(TopicName(sb(name))))
        .with_topic_id(Uuid::nil())
        .with_is_internal(is_internal(name))
}

/// The answer to a request Kafka refuses as a whole: the error on every named topic.
fn refused(req: &DescribeTopicPartitionsRequest, why: &str) -> DescribeTopicPartitionsResponse {
    tracing::debug!("DescribeTopicPartitions refused: {why}");
    let topics = req
        .topics
        .iter()
        .map(|t| {
            topic_entry(t.name.as_str(), ResponseError::InvalidRequest.code())
                .with_is_internal(false)
        })
        .collect();
    DescribeTopicPartitionsResponse::default().with_topics(topics)
}

/// The page the request asks for, from the metadata image. Pure.
pub fn describe(
    image: &MetadataImage,
    req: &DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let (cursor_topic, cursor_partition) = match &req.cursor {
        Some(c) => (c.topic_name.as_str(), c.partition_index),
        None => ("", 0),
    };
    let all = req.topics.is_empty();
    let mut names: Vec<&str> = if all {
        image.topics.keys().map(String::as_str).collect()
    } else {
        req.topics.iter().map(|t| t.name.as_str()).collect()
    };
    names.retain(|n| *n >= cursor_topic);
    names.sort_unstable();
    names.dedup();
    if req.cursor.is_some() && !all && !names.contains(&cursor_topic) {
        return refused(req, "the cursor's topic is not among the topics asked for");
    }
    if cursor_partition < 0 {
        return refused(req, "the cursor's partition is negative");
    }
    let mut remaining = req
        .response_partition_limit
        .min(MAX_REQUEST_PARTITION_SIZE_LIMIT);
    let mut resp = DescribeTopicPartitionsResponse::default();
    for name in names {
        if remaining == 0 {
            // The page filled up exactly: the next one starts with this topic.
            resp.next_cursor = Some(cursor(name, 0));
            break;
        }
        if remaining < 0 {
            break;
        }
        let Some(meta) = image.topics.get(name) else {
            if !all {
                let code = match validate_topic_name(name) {
                    Ok(()) => ResponseError::UnknownTopicOrPartition,
                    Err(_) => ResponseError::InvalidTopicException,
                };
                resp.topics.push(topic_entry(name, code.code()));
            }
            continue;
        };
        let start = if name == cursor_topic {
            cursor_partition
        } else {
            0
        };
        let end = meta.partitions.min(start.saturating_add(remaining));
        let partitions: Vec<_> = (start..end)
            .filter_map(|p| partition_entry(image, meta, p))
            .collect();
        remaining -= partitions.len() as i32;
        resp.topics.push(
            topic_entry(name, 0)
                .with_topic_id(meta.id)
                .with_partitions(partitions)
                .with_topic_authorized_operations(TOPIC_ALL),
        );
        if end < meta.partitions {
            resp.next_cursor = Some(cursor(name, end));
            break;
        }
    }
    resp
}

fn cursor(topic: &str, partition: i32) -> Cursor {
    Cursor::default()
        .with_topic_name(TopicName(sb(topic)))
        .with_partition_index(partition)
}

fn partition_entry(
    image: &MetadataImage,
    meta: &TopicMeta,
    p: i32,
) -> Option<DescribeTopicPartitionsResponsePartition> {
    let a = meta.assignment(p)?;
    let ids = |v: &[i32]| v.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
    // Kafka names the leader only while it is registered.
    let leader = if image.brokers.contains_key(&NodeId::new(a.leader)) {
        a.leader
    } else {
        -1
    };
    let offline: Vec<i32> = a
        .replicas
        .iter()
        .copied()
        .filter(|r| image.brokers.get(&NodeId::new(*r)).is_none_or(|b| b.fenced))
        .collect();
    Some(
        DescribeTopicPartitionsResponsePartition::default()
            .with_partition_index(p)
            .with_leader_id(BrokerId(leader))
            .with_leader_epoch(a.leader_epoch)
            .with_replica_nodes(ids(&a.replicas))
            .with_isr_nodes(ids(&a.isr))
            .with_eligible_leader_replicas(Some(Vec::new()))
            .with_last_known_elr(Some(Vec::new()))
            .with_offline_replicas(ids(&offline)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::describe_topic_partitions_request::{
        Cursor as ReqCursor, TopicRequest,
    };
    use sluice_replication::cluster::PartitionState;

    use crate::base::metadata::BrokerMeta;

    fn image(topics: &[(&str, i32)]) -> MetadataImage {
        let mut img = MetadataImage::new_cluster();
        img.brokers.insert(
            NodeId::new(1),
            BrokerMeta {
                host: "h".into(),
                port: 1,
                fenced: false,
                rack: None,
                endpoints: Vec::new(),
            },
        );
        for (name, n) in topics {
            let assignments = (0..*n)
                .map(|_| PartitionState {
                    replicas: vec![1, 2],
                    isr: vec![1],
                    leader: 1,
                    leader_epoch: 3,
                    partition_epoch: 0,
                    slots: Vec::new(),
                })
                .collect();
            img.topics.insert(
                name.to_string(),
                TopicMeta {
                    id: Uuid::new_v4(),
                    partitions: *n,
                    configs: Default::default(),
                    assignments,
                },
            );
        }
        img
    }

    fn request(
        topics: &[&str],
        limit: i32,
        cursor: Option<(&str, i32)>,
    ) -> DescribeTopicPartitionsRequest {
        DescribeTopicPartitionsRequest::default()
            .with_topics(
                topics
                    .iter()
                    .map(|t| TopicRequest::default().with_name(TopicName(sb(*t))))
                    .collect(),
            )
            .with_response_partition_limit(limit)
            .with_cursor(cursor.map(|(t, p)| {
                ReqCursor::default()
                    .with_topic_name(TopicName(sb(t)))
                    .with_partition_index(p)
            }))
    }

    /// A page's (topic, [partitions]) and its cursor.
    type Page = (Vec<(String, Vec<i32>)>, Option<(String, i32)>);

    fn page(r: &DescribeTopicPartitionsResponse) -> Page {
        let topics = r
            .topics
            .iter()
            .map(|t| {
                let name = t.name.as_ref().unwrap().0.to_string();
                (
                    name,
                    t.partitions.iter().map(|p| p.partition_index).collect(),
                )
            })
            .collect();
        let cursor = r
            .next_cursor
            .as_ref()
            .map(|c| (c.topic_name.0.to_string(), c.partition_index));
        (topics, cursor)
    }

    #[test]
    fn pages_through_every_topic_with_a_cursor() {
        let img = image(&[("b", 3), ("a", 2), ("c", 1)]);
        let r = describe(&img, &request(&[], 2, None));
        assert_eq!(
            page(&r),
            (vec![("a".into(), vec![0, 1])], Some(("b".into(), 0)))
        );
        let r = describe(&img, &request(&[], 2, Some(("b", 0))));
        assert_eq!(
            page(&r),
            (vec![("b".into(), vec![0, 1])], Some(("b".into(), 2)))
        );
        let r = describe(&img, &request(&[], 2, Some(("b", 2))));
        assert_eq!(
            page(&r),
            (vec![("b".into(), vec![2]), ("c".into(), vec![0])], None)
        );
        let t = &r.topics[0];
        assert_eq!(t.topic_authorized_operations, TOPIC_ALL);
        let p = &t.partitions[0];
        assert_eq!(p.eligible_leader_replicas, Some(vec![]));
        assert_eq!(p.last_known_elr, Some(vec![]));
        assert_eq!((p.leader_id, p.leader_epoch), (BrokerId(1), 3));
        assert_eq!(
            p.offline_replicas,
            vec![BrokerId(2)],
            "broker 2 is not registered"
        );
    }

    #[test]
    fn named_topics_unknown_ones_and_bad_cursors() {
        let img = image(&[("a", 1), ("b", 1)]);
        let r = describe(&img, &request(&["b", "zz", "a", "bad/name"], 10, None));
        let codes: Vec<(String, i16)> = r
            .topics
            .iter()
            .map(|t| (t.name.as_ref().unwrap().0.to_string(), t.error_code))
            .collect();
        assert_eq!(
            codes,
            vec![
                ("a".into(), 0),
                ("b".into(), 0),
                (
                    "bad/name".into(),
                    ResponseError::InvalidTopicException.code()
                ),
                ("zz".into(), ResponseError::UnknownTopicOrPartition.code()),
            ]
        );
        assert_eq!(r.topics[3].topic_id, Uuid::nil());
        // The cursor's topic must be one of the named ones.
        let r = describe(&img, &request(&["a"], 10, Some(("b", 0))));
        assert_eq!(r.topics.len(), 1);
        assert_eq!(r.topics[0].error_code, ResponseError::InvalidRequest.code());
        let r = describe(&img, &request(&["a"], 10, Some(("a", -1))));
        assert_eq!(r.topics[0].error_code, ResponseError::InvalidRequest.code());
        // The limit is capped at Kafka's default maximum.
        let big = image(&[("x", 2500)]);
        let r = describe(&big, &request(&[], i32::MAX, None));
        assert_eq!(r.topics[0].partitions.len(), 2000);
        assert_eq!(page(&r).1, Some(("x".into(), 2000)));
    }
}
