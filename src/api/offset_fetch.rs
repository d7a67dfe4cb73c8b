//! OffsetFetch (v1–v8; v8 asks for several groups at once). Served from the
//! coordinator's memory; a partition without a commit answers offset -1.

use std::rc::Rc;

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse};

use crate::api::sb;
use crate::broker::Broker;
use crate::group::{partition_for, route};
use crate::rpc::FetchOffsets;
use sluice_coordinator::group::Committed;

type Fetched = Result<Vec<((String, i32), Option<Committed>)>, i16>;

async fn fetch(broker: &Broker, group: String, partitions: Option<Vec<(String, i32)>>) -> Fetched {
    let call = FetchOffsets {
        partition: partition_for(&group),
        group,
        partitions,
    };
    route(broker, call).await.map_err(|e| e.code())
}

fn value(c: &Option<Committed>) -> (i64, i32, String) {
    match c {
        Some(c) => (c.offset, c.leader_epoch, c.metadata.clone()),
        None => (-1, -1, String::new()),
    }
}

/// Groups consecutive (topic, partition) results by topic.
fn by_topic<T>(
    items: Vec<((String, i32), Option<Committed>)>,
    mut make: impl FnMut(i32, &Option<Committed>) -> T,
) -> Vec<(String, Vec<T>)> {
    let mut out: Vec<(String, Vec<T>)> = Vec::new();
    for ((topic, p), c) in items {
        let part = make(p, &c);
        match out.last_mut() {
            Some((t, ps)) if *t == topic => ps.push(part),
            _ => out.push((topic, vec![part])),
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
                        let name = t.name.to_string();
                        t.partition_indexes
                            .into_iter()
                            .map(move |p| (name.clone(), p))
                    })
                    .collect()
            });
            let group_id = g.group_id.clone();
            let resp = match fetch(broker, g.group_id.to_string(), parts).await {
                Ok(items) => {
                    let topics = by_topic(items, |p, c| {
                        let (o, e, m) = value(c);
                        OffsetFetchResponsePartitions::default()
                            .with_partition_index(p)
                            .with_committed_offset(o)
                            .with_committed_leader_epoch(e)
                            .with_metadata(Some(sb(m)))
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
                let name = t.name.to_string();
                t.partition_indexes
                    .into_iter()
                    .map(move |p| (name.clone(), p))
            })
            .collect::<Vec<_>>()
    });
    let requested = parts.clone();
    match fetch(broker, req.group_id.to_string(), parts).await {
        Ok(items) => {
            let topics = by_topic(items, |p, c| {
                let (o, e, m) = value(c);
                let mut part = OffsetFetchResponsePartition::default()
                    .with_partition_index(p)
                    .with_committed_offset(o)
                    .with_metadata(Some(sb(m)));
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
            // v1 has no top-level error: every requested partition carries it.
            let items = requested
                .unwrap_or_default()
                .into_iter()
                .map(|tp| (tp, None))
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
