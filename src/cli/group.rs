//! `sluice group list|describe|reset-offsets|delete`: the consumer-group admin CLI.
//! It speaks the Kafka protocol ([`sluice_client`]: blocking sockets,
//! `kafka-protocol` codecs) to any Kafka-protocol broker: FindCoordinator, then the group APIs on the coordinator;
//! Metadata and ListOffsets for log end offsets (sent to each partition's leader).
//!
//! `describe` prints what `kafka-consumer-groups.sh --describe` prints: per partition
//! the committed offset, the log end offset, the lag and the owning member.

use std::collections::BTreeMap;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::consumer_group_describe_response;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    BrokerId, ConsumerGroupDescribeRequest, ConsumerProtocolAssignment, DeleteGroupsRequest,
    DescribeGroupsRequest, FindCoordinatorRequest, GroupId, ListGroupsRequest, ListOffsetsRequest,
    MetadataRequest, OffsetCommitRequest, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::Decodable;

use sluice_client::blocking::Conn;
use sluice_client::{code_err, sbs};

/// Why a group command failed; the text is the message printed.
#[derive(Debug, thiserror::Error)]
pub enum GroupCliError {
    /// A broker could not be reached, or answered with an error code.
    #[error(transparent)]
    Client(#[from] sluice_client::Error),
    #[error("empty DescribeGroups response")]
    EmptyDescribe,
    #[error("topic {0} not found")]
    TopicNotFound(String),
}

pub type Res<T> = Result<T, GroupCliError>;

/// The client id the admin CLIs send.
const CLIENT_ID: &str = "sluice-cli";

/// Where `reset-offsets` moves the group.
#[derive(Debug, Clone, Copy)]
pub enum ResetTo {
    Earliest,
    Latest,
    Offset(i64),
}

/// Connects to the coordinator of `group` (found through `bootstrap`).
fn coordinator(bootstrap: &str, group: &str) -> Res<Conn> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let r = c.call(
        3,
        &FindCoordinatorRequest::default()
            .with_key(sbs(group))
            .with_key_type(0),
    )?;
    code_err("FindCoordinator", r.error_code)?;
    Ok(Conn::open(&format!("{}:{}", r.host, r.port), CLIENT_ID)?)
}

pub fn list(bootstrap: &str) -> Res<()> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    // v5 names each group's type (classic or consumer, KIP-848); older brokers: v4.
    let r = match c.call(5, &ListGroupsRequest::default()) {
        Ok(r) => r,
        Err(_) => {
            let mut c = Conn::open(bootstrap, CLIENT_ID)?;
            c.call(4, &ListGroupsRequest::default())?
        }
    };
    code_err("ListGroups", r.error_code)?;
    println!(
        "{:<40} {:<20} {:<14} TYPE",
        "GROUP", "STATE", "PROTOCOL-TYPE"
    );
    for g in r.groups {
        println!(
            "{:<40} {:<20} {:<14} {}",
            g.group_id.as_str(),
            g.group_state.as_str(),
            g.protocol_type.as_str(),
            if g.group_type.is_empty() {
                "classic"
            } else {
                g.group_type.as_str()
            }
        );
    }
    Ok(())
}

/// Partition leaders and log end offsets of topics.
fn log_ends(bootstrap: &str, topics: &[String]) -> Res<BTreeMap<(String, i32), i64>> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let meta = c.call(
        4,
        &MetadataRequest::default().with_topics(Some(
            topics
                .iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(sbs(t)))))
                .collect(),
        )),
    )?;
    let brokers: BTreeMap<BrokerId, String> = meta
        .brokers
        .iter()
        .map(|b| (b.node_id, format!("{}:{}", b.host, b.port)))
        .collect();
    // leader address → (topic → partitions)
    let mut by_leader: BTreeMap<String, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for t in &meta.topics {
        let Some(name) = t.name.as_ref().map(|n| n.to_string()) else {
            continue;
        };
        for p in &t.partitions {
            let addr = brokers
                .get(&p.leader_id)
                .cloned()
                .unwrap_or_else(|| bootstrap.to_string());
            by_leader
                .entry(addr)
                .or_default()
                .entry(name.clone())
                .or_default()
                .push(p.partition_index);
        }
    }
    let mut out = BTreeMap::new();
    for (addr, topics) in by_leader {
        let mut c = Conn::open(&addr, CLIENT_ID)?;
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(
                topics
                    .iter()
                    .map(|(t, ps)| {
                        ListOffsetsTopic::default()
                            .with_name(TopicName(sbs(t)))
                            .with_partitions(
                                ps.iter()
                                    .map(|p| {
                                        ListOffsetsPartition::default()
                                            .with_partition_index(*p)
                                            .with_timestamp(-1)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        let r = c.call(4, &req)?;
        for t in r.topics {
            for p in t.partitions {
                if p.error_code == 0 {
                    out.insert((t.name.to_string(), p.partition_index), p.offset);
                }
            }
        }
    }
    Ok(out)
}

fn earliest(bootstrap: &str, topic: &str, partitions: &[i32]) -> Res<BTreeMap<i32, i64>> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(sbs(topic)))
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(*p)
                            .with_timestamp(-2)
                    })
                    .collect(),
            )]);
    let r = c.call(4, &req)?;
    let mut out = BTreeMap::new();
    for t in r.topics {
        for p in t.partitions {
            code_err("ListOffsets", p.error_code)?;
            out.insert(p.partition_index, p.offset);
        }
    }
    Ok(out)
}

/// The partitions a member's assignment names (consumer protocol).
fn assigned(mut b: Bytes) -> Vec<(String, i32)> {
    if b.len() < 2 {
        return Vec::new();
    }
    let version = b.get_i16();
    match ConsumerProtocolAssignment::decode(&mut b, version.clamp(0, 3)) {
        Ok(a) => a
            .assigned_partitions
            .into_iter()
            .flat_map(|t| {
                let name = t.topic.to_string();
                t.partitions.into_iter().map(move |p| (name.clone(), p))
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// A KIP-848 group as ConsumerGroupDescribe shows it, `None` for a classic group (or a
/// broker without the API).
fn describe_consumer_group(
    c: &mut Conn,
    group: &str,
) -> Res<Option<consumer_group_describe_response::DescribedGroup>> {
    let Ok(d) = c.call(
        0,
        &ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(sbs(group))]),
    ) else {
        return Ok(None);
    };
    let Some(g) = d.groups.into_iter().next() else {
        return Err(GroupCliError::EmptyDescribe);
    };
    if g.error_code == kafka_protocol::error::ResponseError::GroupIdNotFound.code() {
        return Ok(None);
    }
    code_err("ConsumerGroupDescribe", g.error_code)?;
    Ok(Some(g))
}

/// "topic-0,1 other-3": a member's partitions, compactly.
fn partitions_text(a: &consumer_group_describe_response::Assignment) -> String {
    let text: Vec<String> = a
        .topic_partitions
        .iter()
        .map(|t| {
            let ps: Vec<String> = t.partitions.iter().map(i32::to_string).collect();
            format!("{}-{}", t.topic_name.as_str(), ps.join(","))
        })
        .collect();
    if text.is_empty() {
        "-".into()
    } else {
        text.join(" ")
    }
}

pub fn describe(bootstrap: &str, group: &str) -> Res<()> {
    let mut c = coordinator(bootstrap, group)?;
    let mut owner: BTreeMap<(String, i32), (String, String, String)> = BTreeMap::new();
    let (state, members) = if let Some(g) = describe_consumer_group(&mut c, group)? {
        println!(
            "Group {group}: consumer protocol (KIP-848), state {}, group epoch {}, assignment epoch {}, assignor {}",
            g.group_state.as_str(),
            g.group_epoch,
            g.assignment_epoch,
            g.assignor_name.as_str()
        );
        println!(
            "{:<40} {:>6} {:<16} {:<30} {:<30}",
            "MEMBER-ID", "EPOCH", "INSTANCE-ID", "ASSIGNED", "TARGET"
        );
        for m in &g.members {
            println!(
                "{:<40} {:>6} {:<16} {:<30} {:<30}",
                m.member_id.as_str(),
                m.member_epoch,
                m.instance_id.as_deref().unwrap_or("-"),
                partitions_text(&m.assignment),
                partitions_text(&m.target_assignment)
            );
            for t in &m.assignment.topic_partitions {
                for p in &t.partitions {
                    owner.insert(
                        (t.topic_name.to_string(), *p),
                        (
                            m.member_id.to_string(),
                            m.client_host.to_string(),
                            m.client_id.to_string(),
                        ),
                    );
                }
            }
        }
        (g.group_state.to_string(), g.members.len())
    } else {
        let d = c.call(
            5,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(sbs(group))]),
        )?;
        let g = d
            .groups
            .into_iter()
            .next()
            .ok_or(GroupCliError::EmptyDescribe)?;
        code_err("DescribeGroups", g.error_code)?;
        for m in &g.members {
            for tp in assigned(m.member_assignment.clone()) {
                owner.insert(
                    tp,
                    (
                        m.member_id.to_string(),
                        m.client_host.to_string(),
                        m.client_id.to_string(),
                    ),
                );
            }
        }
        (g.group_state.to_string(), g.members.len())
    };
    let f = c.call(
        7,
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(sbs(group)))
            .with_topics(None),
    )?;
    code_err("OffsetFetch", f.error_code)?;
    let mut committed: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for t in f.topics {
        for p in t.partitions {
            committed.insert((t.name.to_string(), p.partition_index), p.committed_offset);
        }
    }
    let mut topics: Vec<String> = committed
        .keys()
        .chain(owner.keys())
        .map(|(t, _)| t.clone())
        .collect();
    topics.sort();
    topics.dedup();
    let ends = if topics.is_empty() {
        BTreeMap::new()
    } else {
        log_ends(bootstrap, &topics)?
    };
    println!("Group {group}: state {state}, {members} member(s)");
    println!(
        "{:<24} {:<24} {:>9} {:>14} {:>14} {:>8} {:<40} {:<16} CLIENT-ID",
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST"
    );
    let mut rows: Vec<(String, i32)> = committed.keys().chain(owner.keys()).cloned().collect();
    rows.sort();
    rows.dedup();
    for tp in rows {
        let cur = committed.get(&tp).copied().filter(|o| *o >= 0);
        let end = ends.get(&tp).copied();
        let lag = match (cur, end) {
            (Some(c), Some(e)) => (e - c).max(0).to_string(),
            _ => "-".into(),
        };
        let (member, host, client) =
            owner
                .get(&tp)
                .cloned()
                .unwrap_or(("-".into(), "-".into(), "-".into()));
        println!(
            "{:<24} {:<24} {:>9} {:>14} {:>14} {:>8} {:<40} {:<16} {}",
            group,
            tp.0,
            tp.1,
            cur.map_or("-".into(), |c| c.to_string()),
            end.map_or("-".into(), |e| e.to_string()),
            lag,
            member,
            if host.is_empty() { "-".into() } else { host },
            client
        );
    }
    Ok(())
}

pub fn reset_offsets(bootstrap: &str, group: &str, topic: &str, to: ResetTo) -> Res<()> {
    let ends = log_ends(bootstrap, &[topic.to_string()])?;
    let partitions: Vec<i32> = ends
        .keys()
        .filter(|(t, _)| t == topic)
        .map(|(_, p)| *p)
        .collect();
    if partitions.is_empty() {
        return Err(GroupCliError::TopicNotFound(topic.to_string()));
    }
    let targets: BTreeMap<i32, i64> = match to {
        ResetTo::Latest => ends.iter().map(|((_, p), o)| (*p, *o)).collect(),
        ResetTo::Earliest => earliest(bootstrap, topic, &partitions)?,
        ResetTo::Offset(n) => {
            let starts = earliest(bootstrap, topic, &partitions)?;
            partitions
                .iter()
                .map(|p| {
                    let end = ends[&(topic.to_string(), *p)];
                    (*p, n.clamp(starts[p], end))
                })
                .collect()
        }
    };
    let mut c = coordinator(bootstrap, group)?;
    // Generation -1, no member: an admin commit, accepted only while the group is empty.
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(sbs(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(sbs(""))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(sbs(topic)))
            .with_partitions(
                targets
                    .iter()
                    .map(|(p, o)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(*p)
                            .with_committed_offset(*o)
                            .with_committed_metadata(Some(sbs("")))
                    })
                    .collect(),
            )]);
    let r = c.call(8, &req)?;
    println!(
        "{:<24} {:<24} {:>9} NEW-OFFSET",
        "GROUP", "TOPIC", "PARTITION"
    );
    for t in r.topics {
        for p in t.partitions {
            code_err(&format!("{topic}-{}", p.partition_index), p.error_code)?;
            println!(
                "{:<24} {:<24} {:>9} {}",
                group,
                t.name.as_str(),
                p.partition_index,
                targets[&p.partition_index]
            );
        }
    }
    Ok(())
}

pub fn delete(bootstrap: &str, group: &str) -> Res<()> {
    let mut c = coordinator(bootstrap, group)?;
    let r = c.call(
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(sbs(group))]),
    )?;
    for g in r.results {
        code_err(
            &format!("deleting group {}", g.group_id.as_str()),
            g.error_code,
        )?;
        println!("Deleted group {}", g.group_id.as_str());
    }
    Ok(())
}
