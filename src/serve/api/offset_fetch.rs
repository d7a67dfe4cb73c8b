//! OffsetFetch (v0–v9; v8 asks for several groups at once, v9 names the asking KIP-848
//! member, checked against its group). Served from the
//! coordinator's memory; a partition without a commit answers offset -1. v0 read
//! ZooKeeper in Kafka; Kafka 3.9 without ZooKeeper (KRaft) answers it
//! UNSUPPORTED_VERSION for every requested partition, and so does Sluice.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse};

use crate::base::rpc::{FetchOffsets, FetchedOffset};
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use crate::serve::api::sb;
use sluice_coordinator::group::Committed;
use sluice_protocol::TopicPartition;

/// A partition's committed offset, or its error (UNSTABLE_OFFSET_COMMIT while a
/// transactional commit is pending and the client asked for stable offsets).
type Item = Result<Option<Committed>, ResponseError>;
type Fetched = Result<Vec<FetchedOffset>, i16>;

async fn fetch(
    broker: &Broker,
    group: String,
    partitions: Option<Vec<TopicPartition>>,
    require_stable: bool,
    member: Option<(String, i32)>,
) -> Fetched {
    let call = FetchOffsets {
        partition: partition_for(&group),
        group,
        partitions,
        require_stable,
        member,
    };
    route(broker, call).await.map_err(|e| e.code())
}

/// (offset, leader epoch, metadata, error code)
fn value(c: &Item) -> (i64, i32, String, i16) {
    match c {
        Ok(Some(c)) => (c.offset, c.leader_epoch, c.metadata.clone(), 0),
        Ok(None) => (-1, -1, String::new(), 0),
        Err(e) => (-1, -1, String::new(), e.code()),
    }
}

/// Groups consecutive partitions' results by topic.
fn by_topic<T>(
    items: Vec<FetchedOffset>,
    mut make: impl FnMut(i32, &Item) -> T,
) -> Vec<(String, Vec<T>)> {
    let mut out: Vec<(String, Vec<T>)> = Vec::new();
    for FetchedOffset { partition, offset } in items {
        let part = make(partition.partition(), &offset);
        match out.last_mut() {
            Some((t, ps)) if t.as_str() == partition.topic() => ps.push(part),
            _ => out.push((partition.topic().to_string(), vec![part])),
        }
    }
    out
}

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: OffsetFetchRequest,
) -> OffsetFetchResponse {
    if version >= 8 {
        let mut groups = Vec::with_capacity(req.groups.len());
        for g in req.groups {
            let parts = g.topics.map(|ts| {
                ts.into_iter()
                    .flat_map(|t| {
                        let name: Arc<str> = t.name.0.as_str().into();
                        t.partition_indexes
                            .into_iter()
                            .map(move |p| TopicPartition::new(name.clone(), p))
                    })
                    .collect()
            });
            let group_id = g.group_id.clone();
            // v9 (KIP-848): a member asking is checked against its group.
            let member = (version >= 9)
                .then(|| {
                    g.member_id
                        .as_ref()
                        .map(|m| (m.to_string(), g.member_epoch))
                })
                .flatten();
            let resp = match fetch(
                broker,
                g.group_id.to_string(),
                parts,
                req.require_stable,
                member,
            )
            .await
            {
                Ok(items) => {
                    let topics = by_topic(items, |p, c| {
                        let (o, e, m, code) = value(c);
                        OffsetFetchResponsePartitions::default()
                            .with_partition_index(p)
                            .with_committed_offset(o)
                            .with_committed_leader_epoch(e)
                            .with_metadata(Some(sb(m)))
                            .with_error_code(code)
                    })
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchResponseTopics::default()
                            .with_name(sb(t).into())
                            .with_partitions(ps)
                    })
                    .collect();
                    OffsetFetchResponseGroup::default()
                        .with_group_id(group_id)
                        .with_topics(topics)
                }
                Err(code) => OffsetFetchResponseGroup::default()
                    .with_group_id(group_id)
                    .with_error_code(code),
            };
            groups.push(resp);
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let parts = req.topics.map(|ts| {
        ts.into_iter()
            .flat_map(|t| {
                let name: Arc<str> = t.name.0.as_str().into();
                t.partition_indexes
                    .into_iter()
                    .map(move |p| TopicPartition::new(name.clone(), p))
            })
            .collect::<Vec<_>>()
    });
    let requested = parts.clone();
    let stable = version >= 7 && req.require_stable;
    let fetched = if version == 0 {
        Err(ResponseError::UnsupportedVersion.code())
    } else {
        fetch(broker, req.group_id.to_string(), parts, stable, None).await
    };
    match fetched {
        Ok(items) => {
            let topics = by_topic(items, |p, c| {
                let (o, e, m, code) = value(c);
                let mut part = OffsetFetchResponsePartition::default()
                    .with_partition_index(p)
                    .with_committed_offset(o)
                    .with_metadata(Some(sb(m)))
                    .with_error_code(code);
                if version >= 5 {
                    part = part.with_committed_leader_epoch(e);
                }
                part
            })
            .into_iter()
            .map(|(t, ps)| {
                OffsetFetchResponseTopic::default()
                    .with_name(sb(t).into())
                    .with_partitions(ps)
            })
            .collect();
            OffsetFetchResponse::default().with_topics(topics)
        }
        Err(code) if version >= 2 => OffsetFetchResponse::default().with_error_code(code),
        Err(code) => {
            // v0 and v1 have no top-level error: every requested partition carries it.
            let items = requested
                .unwrap_or_default()
                .into_iter()
                .map(|partition| FetchedOffset {
                    partition,
                    offset: Ok(None),
                })
                .collect();
            let topics = by_topic(items, |p, _| {
                OffsetFetchResponsePartition::default()
                    .with_partition_index(p)
                    .with_committed_offset(-1)
                    .with_metadata(Some(sb("")))
                    .with_error_code(code)
            })
            .into_iter()
            .map(|(t, ps)| {
                OffsetFetchResponseTopic::default()
                    .with_name(sb(t).into())
                    .with_partitions(ps)
            })
            .collect();
            OffsetFetchResponse::default().with_topics(topics)
        }
    }
}
