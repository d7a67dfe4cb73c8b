//! `sluice topic create|list|describe|alter-config|add-partitions|delete` and `sluice
//! config describe|alter`: what Kafka's `kafka-topics.sh` and `kafka-configs.sh` (and
//! Redpanda's `rpk topic`) do, against any Kafka-protocol broker through
//! [`sluice_client`]: CreateTopics, Metadata, DescribeConfigs, IncrementalAlterConfigs,
//! CreatePartitions and DeleteTopics, each at the highest version both sides speak.
//! Asking ([`describe_topics`]) and printing ([`render_topics`]) are separate so that
//! the printing is unit-tested without a broker.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest,
    DescribeConfigsRequest, DescribeLogDirsRequest, IncrementalAlterConfigsRequest,
    MetadataRequest,
};
use sluice_client::blocking::Conn;
use sluice_client::{error_name, sbs, topic_name};

/// A CLI result: the error is the message printed.
pub type Res<T> = Result<T, String>;

const CLIENT_ID: &str = "sluice-cli";
/// How long a broker may take to create or delete topics (CreateTopics' timeout_ms).
const ADMIN_TIMEOUT_MS: i32 = 30_000;

/// Kafka's resource types of DescribeConfigs / IncrementalAlterConfigs.
pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
pub const RESOURCE_GROUP: i8 = 32;

/// Where a resource's configs are asked: a broker's own at that broker (a broker
/// answers only for itself, as Kafka's do), anything else at the bootstrap.
fn open_for(
    bootstrap: &str,
    resource_type: i8,
    name: &str,
) -> Res<(Conn, sluice_client::Versions)> {
    if resource_type != RESOURCE_BROKER || name.is_empty() {
        return open(bootstrap);
    }
    let (mut c, v) = open(bootstrap)?;
    let version = v.require(ApiKey::Metadata, (1, 12)).map_err(String::from)?;
    let md = c
        .call(
            version,
            &MetadataRequest::default().with_topics(Some(Vec::new())),
        )
        .map_err(String::from)?;
    let id: i32 = name
        .parse()
        .map_err(|_| format!("broker {name}: not a broker id"))?;
    let b = md
        .brokers
        .iter()
        .find(|b| b.node_id.0 == id)
        .ok_or_else(|| format!("broker {id}: not in the cluster's metadata"))?;
    open(&format!("{}:{}", b.host, b.port))
}

/// A connection to `bootstrap` (`host:port`, or a comma-separated list) and the
/// versions it serves.
pub fn open(bootstrap: &str) -> Res<(Conn, sluice_client::Versions)> {
    let mut c = Conn::open(bootstrap, CLIENT_ID).map_err(String::from)?;
    let v = c.api_versions().map_err(String::from)?;
    Ok((c, v))
}

fn failed(what: &str, name: &str, code: i16, message: Option<&str>) -> Res<()> {
    if code == 0 {
        return Ok(());
    }
    let detail = message.filter(|m| !m.is_empty()).map(|m| format!(": {m}"));
    Err(format!(
        "{what} {name}: {}{}",
        error_name(code),
        detail.unwrap_or_default()
    ))
}

/// `k=v` pairs (`--config`, `--set`) as a map; a pair without `=` is refused.
pub fn pairs(items: &[String]) -> Res<BTreeMap<String, String>> {
    items
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("{p}: expected key=value"))
        })
        .collect()
}

/// kafka-configs.sh's `--add-config a=1,b=[x,y]`: `key=value` items separated by
/// commas outside brackets; a bracketed value is a list, given without its brackets.
pub fn config_items(text: &str) -> Vec<String> {
    let (mut items, mut cur, mut depth) = (Vec::new(), String::new(), 0usize);
    for ch in text.chars() {
        match ch {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        if ch != '[' && ch != ']' {
            cur.push(ch);
        }
    }
    items.push(cur);
    items.into_iter().filter(|i| !i.trim().is_empty()).collect()
}

/// `--replica-assignment 1:2:3,2:3:1`: per partition, its replicas (kafka-topics.sh's
/// form).
pub fn assignment(text: &str) -> Res<Vec<Vec<i32>>> {
    text.split(',')
        .map(|part| {
            part.split(':')
                .map(|b| {
                    b.trim().parse::<i32>().map_err(|_| {
                        format!("--replica-assignment {text}: {b:?} is not a broker id")
                    })
                })
                .collect()
        })
        .collect()
}

/// Creates `name`: `partitions` and `replication` (`None`: the broker's defaults), or
/// an explicit `assignment`; `configs` as the topic's own.
pub fn create(
    bootstrap: &str,
    name: &str,
    partitions: Option<i32>,
    replication: Option<i16>,
    assignment: Option<Vec<Vec<i32>>>,
    configs: &BTreeMap<String, String>,
) -> Res<()> {
    let (mut c, v) = open(bootstrap)?;
    let version = v
        .require(ApiKey::CreateTopics, (2, 7))
        .map_err(String::from)?;
    let mut topic = CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(partitions.unwrap_or(-1))
        .with_replication_factor(replication.unwrap_or(-1))
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(sbs(k))
                        .with_value(Some(sbs(v)))
                })
                .collect(),
        );
    if let Some(lists) = assignment {
        topic = topic
            .with_num_partitions(-1)
            .with_replication_factor(-1)
            .with_assignments(
                lists
                    .into_iter()
                    .enumerate()
                    .map(|(i, brokers)| {
                        CreatableReplicaAssignment::default()
                            .with_partition_index(i as i32)
                            .with_broker_ids(brokers.into_iter().map(BrokerId).collect())
                    })
                    .collect(),
            );
    }
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(ADMIN_TIMEOUT_MS);
    let r = c.call(version, &req).map_err(String::from)?;
    for t in &r.topics {
        failed(
            "creating topic",
            name,
            t.error_code,
            t.error_message.as_ref().map(|m| m.as_str()),
        )?;
    }
    println!("created topic {name}");
    Ok(())
}

/// Deletes the topics named.
pub fn delete(bootstrap: &str, names: &[String]) -> Res<()> {
    let (mut c, v) = open(bootstrap)?;
    let version = v
        .require(ApiKey::DeleteTopics, (1, 5))
        .map_err(String::from)?;
    let req = DeleteTopicsRequest::default()
        .with_topic_names(names.iter().map(|n| topic_name(n)).collect())
        .with_timeout_ms(ADMIN_TIMEOUT_MS);
    let r = c.call(version, &req).map_err(String::from)?;
    for t in &r.responses {
        let name = t.name.as_ref().map_or("?", |n| n.0.as_str());
        failed(
            "deleting topic",
            name,
            t.error_code,
            t.error_message.as_ref().map(|m| m.as_str()),
        )?;
        println!("deleted topic {name}");
    }
    Ok(())
}

/// Grows `name` to `total` partitions.
pub fn add_partitions(bootstrap: &str, name: &str, total: i32) -> Res<()> {
    let (mut c, v) = open(bootstrap)?;
    let version = v
        .require(ApiKey::CreatePartitions, (0, 3))
        .map_err(String::from)?;
    let req = CreatePartitionsRequest::default()
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(topic_name(name))
            .with_count(total)
            .with_assignments(None)])
        .with_timeout_ms(ADMIN_TIMEOUT_MS);
    let r = c.call(version, &req).map_err(String::from)?;
    for t in &r.results {
        failed(
            "adding partitions to",
            name,
            t.error_code,
            t.error_message.as_ref().map(|m| m.as_str()),
        )?;
    }
    println!("topic {name} has {total} partitions");
    Ok(())
}

/// One partition as Metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    pub partition: i32,
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub error: i16,
    /// The leader's replica's bytes on disk (DescribeLogDirs), when the leader told.
    pub size: Option<i64>,
}

/// One topic: its partitions and configs (name, value, source name, read-only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicView {
    pub name: String,
    pub internal: bool,
    pub error: i16,
    pub partitions: Vec<PartitionView>,
    pub configs: Vec<(String, Option<String>, &'static str)>,
}

/// Kafka's config source names (DescribeConfigs v1+).
pub fn source_name(source: i8) -> &'static str {
    match source {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        7 => "CLIENT_METRICS_CONFIG",
        8 => "GROUP_CONFIG",
        _ => "UNKNOWN",
    }
}

/// The topics named (none: every topic) with their partitions, and with `configs`
/// their configs.
pub fn describe_topics(bootstrap: &str, names: &[String], configs: bool) -> Res<Vec<TopicView>> {
    let (mut c, v) = open(bootstrap)?;
    let version = v.require(ApiKey::Metadata, (1, 12)).map_err(String::from)?;
    let topics = (!names.is_empty()).then(|| {
        names
            .iter()
            .map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n))))
            .collect()
    });
    let md = c
        .call(
            version,
            &MetadataRequest::default()
                .with_topics(topics)
                .with_allow_auto_topic_creation(false),
        )
        .map_err(String::from)?;
    let mut out: Vec<TopicView> = md
        .topics
        .iter()
        .map(|t| {
            let mut partitions: Vec<PartitionView> = t
                .partitions
                .iter()
                .map(|p| PartitionView {
                    partition: p.partition_index,
                    leader: p.leader_id.0,
                    replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                    isr: p.isr_nodes.iter().map(|b| b.0).collect(),
                    error: p.error_code,
                    size: None,
                })
                .collect();
            partitions.sort_by_key(|p| p.partition);
            TopicView {
                name: t.name.as_ref().map_or(String::new(), |n| n.0.to_string()),
                internal: t.is_internal,
                error: t.error_code,
                partitions,
                configs: Vec::new(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if configs {
        // Sizes: each leader's DescribeLogDirs (a broker that does not answer leaves
        // its partitions' sizes out).
        let brokers: BTreeMap<i32, String> = md
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
            .collect();
        let leaders: std::collections::BTreeSet<i32> = out
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.leader))
            .filter(|l| *l >= 0)
            .collect();
        for id in leaders {
            let Some(sizes) = brokers.get(&id).and_then(|a| log_sizes(a).ok()) else {
                continue;
            };
            for t in &mut out {
                for p in t.partitions.iter_mut().filter(|p| p.leader == id) {
                    p.size = sizes.get(&(t.name.clone(), p.partition)).copied();
                }
            }
        }
        if let Some(cv) = v.pick(ApiKey::DescribeConfigs, (1, 4)) {
            let wanted: Vec<String> = out
                .iter()
                .filter(|t| t.error == 0)
                .map(|t| t.name.clone())
                .collect();
            for (name, entries) in describe_configs(&mut c, cv, RESOURCE_TOPIC, &wanted)? {
                if let Some(t) = out.iter_mut().find(|t| t.name == name) {
                    t.configs = entries;
                }
            }
        }
    }
    Ok(out)
}

/// Every partition's bytes on the broker at `addr`.
fn log_sizes(addr: &str) -> Res<BTreeMap<(String, i32), i64>> {
    let (mut c, v) = open(addr)?;
    let version = v
        .require(ApiKey::DescribeLogDirs, (1, 4))
        .map_err(String::from)?;
    let r = c
        .call(
            version,
            &DescribeLogDirsRequest::default().with_topics(None),
        )
        .map_err(String::from)?;
    Ok(r.results
        .iter()
        .filter(|d| {
            d.error_code == 0
                && !d
                    .log_dir
                    .starts_with(sluice::serve::api::describe_log_dirs::REMOTE_DIR_PREFIX)
        })
        .flat_map(|d| &d.topics)
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| ((t.name.to_string(), p.partition_index), p.partition_size))
        })
        .collect())
}

type Described = Vec<(String, Option<String>, &'static str)>;

fn describe_configs(
    c: &mut Conn,
    version: i16,
    resource_type: i8,
    names: &[String],
) -> Res<Vec<(String, Described)>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let req = DescribeConfigsRequest::default().with_resources(
        names
            .iter()
            .map(|n| {
                DescribeConfigsResource::default()
                    .with_resource_type(resource_type)
                    .with_resource_name(sbs(n))
                    .with_configuration_keys(None)
            })
            .collect(),
    );
    let r = c.call(version, &req).map_err(String::from)?;
    let mut out = Vec::new();
    for res in r.results {
        let name = res.resource_name.to_string();
        failed(
            "describing configs of",
            &name,
            res.error_code,
            res.error_message.as_ref().map(|m| m.as_str()),
        )?;
        let mut entries: Described = res
            .configs
            .iter()
            .map(|e| {
                (
                    e.name.to_string(),
                    e.value.as_ref().map(|v| v.to_string()),
                    source_name(e.config_source),
                )
            })
            .collect();
        entries.sort();
        out.push((name, entries));
    }
    Ok(out)
}

/// `sluice topic list`: name, partitions, replication factor.
pub fn render_list(topics: &[TopicView]) -> String {
    let width = topics
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!("{:<width$}  PARTITIONS  REPLICAS\n", "TOPIC");
    for t in topics {
        let rf = t.partitions.first().map_or(0, |p| p.replicas.len());
        out.push_str(&format!(
            "{:<width$}  {:>10}  {:>8}{}\n",
            t.name,
            t.partitions.len(),
            rf,
            if t.internal { "  (internal)" } else { "" }
        ));
    }
    out
}

fn ids(list: &[i32]) -> String {
    list.iter()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `sluice topic describe`: per topic its partitions (leader, replicas, ISR) and its
/// configs with their sources, as kafka-topics.sh --describe and kafka-configs.sh do.
pub fn render_topics(topics: &[TopicView]) -> String {
    let mut out = String::new();
    for t in topics {
        if t.error != 0 {
            out.push_str(&format!(
                "Topic: {}  Error: {}\n",
                t.name,
                error_name(t.error)
            ));
            continue;
        }
        let rf = t.partitions.first().map_or(0, |p| p.replicas.len());
        out.push_str(&format!(
            "Topic: {}  PartitionCount: {}  ReplicationFactor: {}{}\n",
            t.name,
            t.partitions.len(),
            rf,
            if t.internal { "  Internal: true" } else { "" }
        ));
        for p in &t.partitions {
            let leader = if p.leader < 0 {
                "none".to_string()
            } else {
                p.leader.to_string()
            };
            out.push_str(&format!(
                "  Partition: {}  Leader: {}  Replicas: {}  Isr: {}{}{}\n",
                p.partition,
                leader,
                ids(&p.replicas),
                ids(&p.isr),
                p.size.map_or(String::new(), |b| format!("  Size: {b}")),
                if p.error != 0 {
                    format!("  Error: {}", error_name(p.error))
                } else {
                    String::new()
                }
            ));
        }
        if !t.configs.is_empty() {
            out.push_str("  Configs:\n");
            for (k, v, source) in &t.configs {
                out.push_str(&format!(
                    "    {k}={}  ({source})\n",
                    v.as_deref().unwrap_or("null")
                ));
            }
        }
    }
    out
}

/// The resource type of `sluice config --entity-type`.
pub fn entity_type(name: &str) -> Res<i8> {
    match name {
        "topic" | "topics" => Ok(RESOURCE_TOPIC),
        "broker" | "brokers" => Ok(RESOURCE_BROKER),
        "group" | "groups" => Ok(RESOURCE_GROUP),
        other => Err(format!(
            "--entity-type {other}: topics, brokers, groups, users or clients"
        )),
    }
}

/// `sluice config describe`: every config of one resource with its source (a broker's
/// `--entity-name` is its id; an empty one is the cluster-wide defaults).
pub fn config_describe(bootstrap: &str, resource_type: i8, name: &str) -> Res<()> {
    let (mut c, v) = open_for(bootstrap, resource_type, name)?;
    let version = v
        .require(ApiKey::DescribeConfigs, (1, 4))
        .map_err(String::from)?;
    for (_, entries) in describe_configs(&mut c, version, resource_type, &[name.to_string()])? {
        for (k, v, source) in entries {
            println!("{k}={}  ({source})", v.as_deref().unwrap_or("null"));
        }
    }
    Ok(())
}

/// `sluice config alter` and `sluice topic alter-config`: sets `set` and deletes
/// `delete` (back to the default) on one resource, with IncrementalAlterConfigs.
pub fn config_alter(
    bootstrap: &str,
    resource_type: i8,
    name: &str,
    set: &BTreeMap<String, String>,
    delete: &[String],
) -> Res<()> {
    if set.is_empty() && delete.is_empty() {
        return Err("nothing to change: give --set key=value or --delete key".into());
    }
    let (mut c, v) = open_for(bootstrap, resource_type, name)?;
    let version = v
        .require(ApiKey::IncrementalAlterConfigs, (0, 1))
        .map_err(String::from)?;
    let mut configs: Vec<AlterableConfig> = set
        .iter()
        .map(|(k, v)| {
            AlterableConfig::default()
                .with_name(sbs(k))
                .with_config_operation(0)
                .with_value(Some(sbs(v)))
        })
        .collect();
    configs.extend(delete.iter().map(|k| {
        AlterableConfig::default()
            .with_name(sbs(k))
            .with_config_operation(1)
            .with_value(None)
    }));
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(sbs(name))
            .with_configs(configs),
    ]);
    let r = c.call(version, &req).map_err(String::from)?;
    for res in &r.responses {
        failed(
            "altering configs of",
            name,
            res.error_code,
            res.error_message.as_ref().map(|m| m.as_str()),
        )?;
    }
    println!("altered configs of {name}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse_as_kafkas_tools_take_them() {
        assert_eq!(
            pairs(&[
                "retention.ms=1000".into(),
                "cleanup.policy = compact".into()
            ])
            .unwrap(),
            BTreeMap::from([
                ("retention.ms".to_string(), "1000".to_string()),
                ("cleanup.policy".to_string(), "compact".to_string()),
            ])
        );
        assert!(pairs(&["retention.ms".into()]).is_err());
        assert_eq!(
            config_items("retention.ms=1,cleanup.policy=[compact,delete]"),
            vec!["retention.ms=1", "cleanup.policy=compact,delete"]
        );
        assert_eq!(
            assignment("1:2:3,2:3:1").unwrap(),
            vec![vec![1, 2, 3], vec![2, 3, 1]]
        );
        assert!(assignment("1:x").is_err());
        assert_eq!(entity_type("topics"), Ok(RESOURCE_TOPIC));
        assert!(entity_type("users").is_err());
    }

    #[test]
    fn topics_render_as_kafka_topics_describes_them() {
        let t = TopicView {
            name: "orders".into(),
            internal: false,
            error: 0,
            partitions: vec![
                PartitionView {
                    partition: 0,
                    leader: 1,
                    replicas: vec![1, 2],
                    isr: vec![1, 2],
                    error: 0,
                    size: Some(4096),
                },
                PartitionView {
                    partition: 1,
                    leader: -1,
                    replicas: vec![2, 1],
                    isr: vec![],
                    error: 5,
                    size: None,
                },
            ],
            configs: vec![("retention.ms".into(), Some("1000".into()), source_name(1))],
        };
        let text = render_topics(std::slice::from_ref(&t));
        assert!(text.starts_with("Topic: orders  PartitionCount: 2  ReplicationFactor: 2\n"));
        assert!(text.contains("  Partition: 0  Leader: 1  Replicas: 1,2  Isr: 1,2  Size: 4096\n"));
        assert!(text.contains("Leader: none  Replicas: 2,1  Isr:   Error: LeaderNotAvailable"));
        assert!(text.contains("    retention.ms=1000  (DYNAMIC_TOPIC_CONFIG)\n"));
        let list = render_list(&[t]);
        assert_eq!(
            list.lines()
                .nth(1)
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>(),
            vec!["orders", "2", "2"]
        );
    }
}
