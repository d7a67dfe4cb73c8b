//! Broker configs by Kafka's names: what DescribeConfigs shows for a BROKER resource
//! and for a topic's synonyms, which broker configs may change at run time, and the
//! topic defaults those dynamic configs set.
//!
//! Sources, as Kafka reports them: a broker setting given by flag or config file is
//! STATIC_BROKER_CONFIG, one left at Sluice's default DEFAULT_CONFIG. The broker-wide
//! defaults of topic configs ([`LOG_DEFAULTS`]: `log.retention.ms` for `retention.ms`,
//! `message.max.bytes` for `max.message.bytes`, ...) are the ones Kafka lets an operator
//! change while the cluster runs: IncrementalAlterConfigs/AlterConfigs on the BROKER
//! resource set them for the whole cluster (empty resource name,
//! DYNAMIC_DEFAULT_BROKER_CONFIG) or for one broker (its id, DYNAMIC_BROKER_CONFIG).
//! They are a command through the metadata quorum ([`Command::AlterBrokerConfigs`]), so
//! every broker sees them and they survive restarts, and they are the defaults of every
//! topic that does not set the config itself ([`effective_topic_configs`]); a broker's
//! own value wins over the cluster-wide one. Every other broker config is read-only:
//! altering it is INVALID_REQUEST, as in Kafka.
//!
//! [`Command::AlterBrokerConfigs`]: sluice_replication::cluster::Command::AlterBrokerConfigs

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;

use crate::base::config::BrokerConfig;
use crate::base::error::ApiError;
use crate::base::ids::BrokerId;
use crate::base::metadata::MetadataImage;
use crate::base::topic_config::{TopicConfig, KNOWN};

/// The topic config whose default depends on the topic (see [`describe_topic`]).
const MIN_INSYNC: &str = "min.insync.replicas";

/// Config sources (Kafka's numbering).
pub const SOURCE_DYNAMIC_TOPIC: i8 = 1;
pub const SOURCE_DYNAMIC_BROKER: i8 = 2;
pub const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
pub const SOURCE_STATIC_BROKER: i8 = 4;
pub const SOURCE_DEFAULT: i8 = 5;

/// The broker-wide default of each topic config that has one (Kafka's synonyms), as
/// (broker config, topic config). These are the dynamically changeable broker configs.
pub const LOG_DEFAULTS: &[(&str, &str)] = &[
    ("log.cleanup.policy", "cleanup.policy"),
    ("compression.type", "compression.type"),
    ("compression.gzip.level", "compression.gzip.level"),
    ("compression.lz4.level", "compression.lz4.level"),
    ("compression.zstd.level", "compression.zstd.level"),
    ("log.cleaner.delete.retention.ms", "delete.retention.ms"),
    ("log.segment.delete.delay.ms", "file.delete.delay.ms"),
    ("log.flush.interval.messages", "flush.messages"),
    ("log.flush.interval.ms", "flush.ms"),
    ("log.index.interval.bytes", "index.interval.bytes"),
    ("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms"),
    ("message.max.bytes", "max.message.bytes"),
    (
        "log.message.downconversion.enable",
        "message.downconversion.enable",
    ),
    (
        "log.message.timestamp.after.max.ms",
        "message.timestamp.after.max.ms",
    ),
    (
        "log.message.timestamp.before.max.ms",
        "message.timestamp.before.max.ms",
    ),
    (
        "log.message.timestamp.difference.max.ms",
        "message.timestamp.difference.max.ms",
    ),
    ("log.message.timestamp.type", "message.timestamp.type"),
    (
        "log.cleaner.min.cleanable.ratio",
        "min.cleanable.dirty.ratio",
    ),
    ("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms"),
    ("min.insync.replicas", "min.insync.replicas"),
    ("log.preallocate", "preallocate"),
    ("log.retention.bytes", "retention.bytes"),
    ("log.retention.ms", "retention.ms"),
    ("log.segment.bytes", "segment.bytes"),
    ("log.index.size.max.bytes", "segment.index.bytes"),
    ("log.roll.jitter.ms", "segment.jitter.ms"),
    ("log.roll.ms", "segment.ms"),
    (
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
    ),
];

/// Dynamic broker configs that are no topic's default: (name, default, doc). The
/// replication throttles of partition moves (`crate::cluster::throttle`).
pub const BROKER_DYNAMIC: &[(&str, &str, &str)] = &[
    (
        "follower.replication.throttled.rate",
        "9223372036854775807",
        "Bytes/s this broker's followers may fetch for the replicas topics list in follower.replication.throttled.replicas while those are outside the ISR (partition moves).",
    ),
    (
        "leader.replication.throttled.rate",
        "9223372036854775807",
        "Bytes/s of leader.replication.throttled.replicas a leader sends (accepted without effect: the follower side throttles the same traffic).",
    ),
];

/// One described config: the response entry of DescribeConfigs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub name: String,
    pub value: Option<String>,
    pub source: i8,
    pub read_only: bool,
    /// (name, value, source), highest precedence first; the first is the value's.
    pub synonyms: Vec<(String, Option<String>, i8)>,
    pub documentation: String,
}

fn broker_name_of(topic_config: &str) -> Option<&'static str> {
    LOG_DEFAULTS
        .iter()
        .find(|(_, t)| *t == topic_config)
        .map(|(b, _)| *b)
}

fn topic_name_of(broker_config: &str) -> Option<&'static str> {
    LOG_DEFAULTS
        .iter()
        .find(|(b, _)| *b == broker_config)
        .map(|(_, t)| *t)
}

fn topic_default(topic_config: &str) -> &'static str {
    KNOWN
        .iter()
        .find(|(n, _)| *n == topic_config)
        .map_or("", |(_, d)| d)
}

/// A topic's configs as its partitions apply them: its own explicit ones, and for
/// every other config with a dynamic broker default, that default (this broker's own
/// value, else the cluster-wide one).
pub fn effective_topic_configs(
    image: &MetadataImage,
    me: BrokerId,
    own: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = own.clone();
    if image.broker_configs.is_empty() {
        return out;
    }
    for (broker, topic) in LOG_DEFAULTS {
        if own.contains_key(*topic) {
            continue;
        }
        if let Some((v, _)) = image.dynamic_broker_config(me, broker) {
            out.insert(topic.to_string(), v.to_string());
        }
    }
    out
}

/// The synonyms of a broker log default on broker `me`, highest precedence first:
/// its own dynamic value, the cluster-wide one, then Sluice's default.
fn log_default_synonyms(
    image: &MetadataImage,
    me: BrokerId,
    broker: &str,
    default: &str,
) -> Vec<(String, Option<String>, i8)> {
    let mut out = Vec::new();
    let scopes = [
        (me, SOURCE_DYNAMIC_BROKER),
        (
            BrokerId::new(sluice_replication::cluster::CLUSTER_DEFAULT),
            SOURCE_DYNAMIC_DEFAULT_BROKER,
        ),
    ];
    for (scope, source) in scopes {
        if let Some(v) = image
            .broker_configs
            .get(&scope.get())
            .and_then(|c| c.get(broker))
        {
            out.push((broker.to_string(), Some(v.clone()), source));
        }
    }
    out.push((
        broker.to_string(),
        Some(default.to_string()),
        SOURCE_DEFAULT,
    ));
    out
}

/// A topic's configs for DescribeConfigs: every Kafka topic config with its value and
/// source, and its synonyms (the topic's value, the broker defaults by their Kafka
/// names).
pub fn describe_topic(
    image: &MetadataImage,
    me: BrokerId,
    own: &BTreeMap<String, String>,
    replication: Option<usize>,
) -> Vec<Described> {
    TopicConfig::describe(own)
        .into_iter()
        .map(|(name, _, _)| {
            let mut synonyms = Vec::new();
            if let Some(v) = own.get(name) {
                synonyms.push((name.to_string(), Some(v.clone()), SOURCE_DYNAMIC_TOPIC));
            }
            match broker_name_of(name) {
                Some(broker) => {
                    synonyms.extend(log_default_synonyms(image, me, broker, topic_default(name)))
                }
                None if synonyms.is_empty() => synonyms.push((
                    name.to_string(),
                    Some(topic_default(name).to_string()),
                    SOURCE_DEFAULT,
                )),
                None => {}
            }
            // Sluice's own default of min.insync.replicas is min(2, replicas)
            // (`Broker::min_insync`): described as enforced, so that a tool writing
            // the described set back does not change it (an RF=1 topic set to 2 would
            // refuse every acks=all write). A topic whose partitions differ in
            // replicas is described by its smallest.
            if let (MIN_INSYNC, Some(rf)) = (name, replication) {
                for syn in synonyms.iter_mut().filter(|s| s.2 == SOURCE_DEFAULT) {
                    syn.1 = Some(rf.clamp(1, 2).to_string());
                }
            }
            let (_, value, source) = synonyms[0].clone();
            Described {
                name: name.to_string(),
                value,
                source,
                read_only: false,
                synonyms,
                documentation: topic_doc(name),
            }
        })
        .collect()
}

/// The read-only settings of this broker by Kafka's names: (name, value, Sluice
/// setting it comes from or `None` for a fixed value, documentation).
fn static_configs(
    c: &BrokerConfig,
    image: &MetadataImage,
) -> Vec<(
    &'static str,
    Option<String>,
    Option<&'static str>,
    &'static str,
)> {
    let rf = image.brokers.len().clamp(1, 3).to_string();
    let selector = c
        .rack_aware_fetch
        .then(|| "org.apache.kafka.common.replica.RackAwareReplicaSelector".to_string());
    let voters = c
        .controller_quorum
        .iter()
        .map(|(id, a)| format!("{id}@{a}"))
        .collect::<Vec<_>>()
        .join(",");
    let s = |v: &dyn ToString| Some(v.to_string());
    let named = c.given.contains(&"listeners");
    let joined = |f: &dyn Fn(&crate::base::config::Listener) -> String| {
        Some(c.listeners.iter().map(f).collect::<Vec<_>>().join(","))
    };
    vec![
        ("broker.id", s(&c.node_id), Some("node_id"), "This broker's id (--node-id)."),
        ("node.id", s(&c.node_id), Some("node_id"), "This node's id (--node-id)."),
        ("broker.rack", c.rack.clone(), Some("rack"), "The rack or zone of this broker (--rack): replica placement spreads partitions over racks, and consumers in a rack may read from its replicas."),
        ("listeners", joined(&|l| format!("{}://{}", l.name, l.bind)), Some(if named { "listeners" } else { "listen" }), "The Kafka listeners (--listeners, or --listen)."),
        ("advertised.listeners", joined(&|l| format!("{}://{}:{}", l.name, l.advertised_host, l.advertised_port)), Some(if named { "advertised_listeners" } else { "advertised" }), "The addresses clients are told to use, per listener (--advertised-listeners, or --advertised)."),
        ("listener.security.protocol.map", joined(&|l| format!("{}:{}", l.name, l.protocol.name())), Some(if named { "listener_security_protocol_map" } else { "security_protocol" }), "Each listener's security protocol (--listener-security-protocol-map, or --security-protocol)."),
        ("inter.broker.listener.name", Some(c.listeners[0].name.clone()), Some("inter_broker_listener_name"), "The listener brokers connect to each other through (--inter-broker-listener-name)."),
        ("process.roles", s(&match (c.broker_role, c.controller_role) { (true, true) => "broker,controller", (true, false) => "broker", _ => "controller" }), Some("process_roles"), "broker,controller: a metadata quorum voter or one AddRaftVoter may make one; broker: never votes (--process-roles)."),
        ("controller.quorum.voters", Some(voters), Some("controller_quorum"), "The metadata quorum's bootstrap voters (--controller-quorum); the current ones: DescribeQuorum."),
        ("log.dirs", s(&c.data_dir.display()), Some("data_dir"), "The data directory (--data-dir)."),
        ("num.partitions", s(&c.default_partitions), Some("default_partitions"), "Partitions of an auto-created topic (--default-partitions)."),
        ("default.replication.factor", Some(rf.clone()), None, "Replicas of a topic created without a replication factor: 3, or every broker when there are fewer."),
        ("offsets.topic.replication.factor", Some(rf.clone()), None, "Replicas of __consumer_offsets: 3, or every broker when there are fewer."),
        ("transaction.state.log.replication.factor", Some(rf), None, "Replicas of __transaction_state: 3, or every broker when there are fewer."),
        ("auto.create.topics.enable", s(&c.auto_create_topics), Some("auto_create_topics"), "Whether Metadata and Produce create unknown topics (--auto-create-topics)."),
        ("auto.leader.rebalance.enable", s(&c.auto_leader_rebalance_enable), Some("auto_leader_rebalance_enable"), "Whether the controller moves leadership back to preferred replicas by itself (--auto-leader-rebalance-enable)."),
        ("socket.request.max.bytes", s(&c.socket_request_max_bytes), Some("socket_request_max_bytes"), "The largest request a client may send (--socket-request-max-bytes)."),
        ("group.initial.rebalance.delay.ms", s(&c.group_initial_rebalance_delay_ms), Some("group_initial_rebalance_delay_ms"), "How long a new group waits for more members before its first generation."),
        ("group.min.session.timeout.ms", s(&c.group_min_session_timeout_ms), Some("group_min_session_timeout_ms"), "The smallest session timeout a group member may ask for."),
        ("group.max.session.timeout.ms", s(&c.group_max_session_timeout_ms), Some("group_max_session_timeout_ms"), "The largest session timeout a group member may ask for."),
        ("group.max.size", s(&c.group_max_size), Some("group_max_size"), "The most members a consumer group admits (--group-max-size); a new member of a full group gets GROUP_MAX_SIZE_REACHED."),
        ("group.consumer.session.timeout.ms", s(&c.group_consumer_session_timeout_ms), Some("group_consumer_session_timeout_ms"), "How long a KIP-848 consumer group member may go without heartbeating before it is removed (a group's consumer.session.timeout.ms overrides it)."),
        ("group.consumer.heartbeat.interval.ms", s(&c.group_consumer_heartbeat_interval_ms), Some("group_consumer_heartbeat_interval_ms"), "How often KIP-848 consumer group members heartbeat (a group's consumer.heartbeat.interval.ms overrides it)."),
        ("group.consumer.assignors", Some(c.group_consumer_assignors.iter().map(|a| a.name()).collect::<Vec<_>>().join(",")), Some("group_consumer_assignors"), "The server-side assignors of KIP-848 groups, the first the default (uniform, range)."),
        ("offsets.retention.minutes", s(&c.offsets_retention_minutes), Some("offsets_retention_minutes"), "How long an empty group's committed offsets are kept."),
        ("transaction.max.timeout.ms", s(&c.transaction_max_timeout_ms), Some("transaction_max_timeout_ms"), "The longest transaction timeout a producer may ask for."),
        ("log.retention.check.interval.ms", s(&c.log_retention_check_interval_ms), Some("log_retention_check_interval_ms"), "How often retention runs."),
        ("log.cleaner.backoff.ms", s(&c.log_cleaner_backoff_ms), Some("log_cleaner_backoff_ms"), "How long the log cleaner rests after a round that found nothing to compact."),
        ("log.retention.hours", s(&168), None, "Read-only form of log.retention.ms (its default, 7 days)."),
        ("log.roll.hours", s(&168), None, "Read-only form of log.roll.ms (its default, 7 days)."),
        ("broker.session.timeout.ms", s(&c.broker_session_timeout_ms), Some("broker_session_timeout_ms"), "A broker whose heartbeats lapse this long is fenced."),
        ("broker.heartbeat.interval.ms", s(&c.broker_heartbeat_interval_ms), Some("broker_heartbeat_interval_ms"), "How often a broker heartbeats to the controller."),
        ("replica.lag.time.max.ms", s(&c.replica_lag_time_max_ms), Some("replica_lag_time_max_ms"), "A follower behind the leader this long leaves the ISR."),
        ("max.incremental.fetch.session.cache.slots", s(&c.max_incremental_fetch_session_cache_slots), Some("max_incremental_fetch_session_cache_slots"), "Incremental fetch sessions (KIP-227) this broker caches, split over its shards (--max-incremental-fetch-session-cache-slots; 0: none)."),
        ("min.incremental.fetch.session.eviction.ms", s(&crate::base::fetch_session::EVICTION_MS), None, "A fetch session unused this long, or older than this and smaller than a new one, may be evicted."),
        ("replica.selector.class", selector, Some("replica_selector"), "The selector of the replica a consumer reads from (KIP-392): rack-aware with --replica-selector rack (the default), none (the leader) with leader."),
        ("disk.min.free.bytes", s(&c.disk_min_free.bytes), Some("disk_min_free_bytes"), "Sluice: appends are refused below this much free space (with disk.min.free.percent)."),
        ("disk.min.free.percent", s(&c.disk_min_free.percent), Some("disk_min_free_percent"), "Sluice: appends are refused below this percentage of free space (with disk.min.free.bytes)."),
    ]
}

/// DescribeConfigs of a BROKER resource on broker `me`: `cluster_default` (the empty
/// resource name) lists the cluster-wide dynamic configs set, as Kafka does; else every
/// config of this broker.
pub fn describe_broker(
    c: &BrokerConfig,
    image: &MetadataImage,
    cluster_default: bool,
) -> Vec<Described> {
    let me = c.node_id;
    if cluster_default {
        let set = image
            .broker_configs
            .get(&sluice_replication::cluster::CLUSTER_DEFAULT)
            .cloned()
            .unwrap_or_default();
        return set
            .into_iter()
            .map(|(name, v)| {
                let src = SOURCE_DYNAMIC_DEFAULT_BROKER;
                Described {
                    documentation: topic_name_of(&name)
                        .map(log_doc)
                        .or_else(|| {
                            BROKER_DYNAMIC
                                .iter()
                                .find(|(n, ..)| *n == name)
                                .map(|(.., doc)| doc.to_string())
                        })
                        .unwrap_or_else(|| WITHOUT_EFFECT.to_string()),
                    synonyms: vec![(name.clone(), Some(v.clone()), src)],
                    name,
                    value: Some(v),
                    source: src,
                    read_only: false,
                }
            })
            .collect();
    }
    let mut out: Vec<Described> = static_configs(c, image)
        .into_iter()
        .map(|(name, value, setting, doc)| {
            let given = setting.is_some_and(|k| c.given.contains(&k));
            let source = if given {
                SOURCE_STATIC_BROKER
            } else {
                SOURCE_DEFAULT
            };
            Described {
                name: name.to_string(),
                synonyms: vec![(name.to_string(), value.clone(), source)],
                value,
                source,
                read_only: true,
                documentation: doc.to_string(),
            }
        })
        .collect();
    let dynamic = LOG_DEFAULTS
        .iter()
        .map(|(broker, topic)| (*broker, topic_default(topic), log_doc(topic)))
        .chain(
            BROKER_DYNAMIC
                .iter()
                .map(|(n, d, doc)| (*n, *d, doc.to_string())),
        );
    for (broker, default, documentation) in dynamic {
        let synonyms = log_default_synonyms(image, BrokerId::new(me), broker, default);
        let (_, value, source) = synonyms[0].clone();
        out.push(Described {
            name: broker.to_string(),
            value,
            source,
            read_only: false,
            synonyms,
            documentation,
        });
    }
    // Kafka's dynamic configs kept without effect, this broker's value over the
    // cluster-wide one.
    let scopes = [
        (me, SOURCE_DYNAMIC_BROKER),
        (
            sluice_replication::cluster::CLUSTER_DEFAULT,
            SOURCE_DYNAMIC_DEFAULT_BROKER,
        ),
    ];
    for (scope, source) in scopes {
        for (name, v) in image.broker_configs.get(&scope).into_iter().flatten() {
            if out.iter().any(|d| d.name == *name) {
                continue;
            }
            out.push(Described {
                name: name.clone(),
                value: Some(v.clone()),
                source,
                read_only: false,
                synonyms: vec![(name.clone(), Some(v.clone()), source)],
                documentation: WITHOUT_EFFECT.to_string(),
            });
        }
    }
    out
}

/// The new dynamic config set of one scope (`scope`: a broker id, or
/// `CLUSTER_DEFAULT`), validated as Kafka validates it: a read-only broker config (one
/// of Sluice's settings, or read-only in Kafka) is INVALID_REQUEST, and so is a
/// per-broker config set cluster-wide; a dynamic config Sluice applies must have a value
/// its topic config accepts (INVALID_CONFIG otherwise); Kafka's other dynamic broker
/// configs ([`crate::base::kafka_broker_configs`]) are kept and described without
/// effect, as the accepted-only topic configs are; a name Kafka does not know is
/// INVALID_CONFIG.
pub fn check_dynamic(
    c: &BrokerConfig,
    scope: i32,
    set: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    use crate::base::kafka_broker_configs::{update_mode, Update};
    let image = MetadataImage::new_cluster();
    let statics = static_configs(c, &image);
    let applied =
        |n: &str| topic_name_of(n).is_some() || BROKER_DYNAMIC.iter().any(|(b, ..)| *b == n);
    let refused = |why: &str, names: Vec<&str>| {
        ApiError::with(
            ResponseError::InvalidRequest,
            format!("{why}: {}", names.join(", ")),
        )
    };
    let read_only: Vec<&str> = set
        .keys()
        .map(String::as_str)
        .filter(|n| !applied(n))
        .filter(|n| {
            statics.iter().any(|(s, ..)| s == n) || update_mode(n) == Some(Update::ReadOnly)
        })
        .collect();
    if !read_only.is_empty() {
        return Err(refused(
            "Cannot update these configs dynamically",
            read_only,
        ));
    }
    // Kafka changes these per listener (its `listener.name.<l>.` prefix); Sluice's
    // listener security is set at start (--security-protocol, --ssl-*,
    // --sasl-enabled-mechanisms). Kept without effect, they would read as in force, and
    // a kept password would be described back in clear.
    let security: Vec<&str> = set
        .keys()
        .map(String::as_str)
        .filter(|n| security_config(n))
        .collect();
    if !security.is_empty() {
        return Err(refused(
            "These security configs are set when the broker starts (--security-protocol, --ssl-*, --sasl-enabled-mechanisms), not dynamically",
            security,
        ));
    }
    if scope == sluice_replication::cluster::CLUSTER_DEFAULT {
        let per_broker: Vec<&str> = set
            .keys()
            .map(String::as_str)
            .filter(|n| !applied(n) && update_mode(n) == Some(Update::PerBroker))
            .collect();
        if !per_broker.is_empty() {
            return Err(refused(
                "Cannot update these configs at default cluster level, broker id must be specified",
                per_broker,
            ));
        }
    }
    for (name, v) in set {
        if BROKER_DYNAMIC.iter().any(|(n, ..)| n == name) {
            if !v.trim().parse::<i64>().is_ok_and(|r| r >= 0) {
                return Err(ApiError::with(
                    ResponseError::InvalidConfig,
                    format!("Invalid value {v} for configuration {name}: Value must be at least 0"),
                ));
            }
            continue;
        }
        let Some(topic) = topic_name_of(name) else {
            if update_mode(name).is_some() {
                // Kafka's, dynamic, and nothing in Sluice reads it: kept.
                continue;
            }
            return Err(ApiError::with(
                ResponseError::InvalidConfig,
                format!("Unknown broker config {name}"),
            ));
        };
        let one = BTreeMap::from([(topic.to_string(), v.clone())]);
        TopicConfig::parse(&one).map_err(|e| {
            ApiError::with(
                ResponseError::InvalidConfig,
                e.to_string().replace(topic, name),
            )
        })?;
    }
    Ok(())
}

/// A listener security config, or one holding a secret: never kept without effect.
fn security_config(name: &str) -> bool {
    name.starts_with("ssl.")
        || name.starts_with("listener.")
        || name.contains("password")
        || name.contains("secret")
        || name.ends_with("jaas.config")
        || matches!(
            name,
            "sasl.enabled.mechanisms"
                | "sasl.mechanism.inter.broker.protocol"
                | "security.inter.broker.protocol"
                | "principal.builder.class"
        )
}

/// The documentation of a dynamic broker config Sluice keeps without effect.
const WITHOUT_EFFECT: &str = "A Kafka broker config, kept and described as set; Sluice has no use for it (accepted so that tools that set it work).";

fn log_doc(topic: &str) -> String {
    format!(
        "The default of the topic config {topic} for topics that do not set it. {}",
        topic_doc(topic)
    )
}

/// One line on each topic config, for DescribeConfigs' `documentation`.
pub fn topic_doc(name: &str) -> String {
    let doc = match name {
        "cleanup.policy" => "delete (segments past retention are removed), compact (the last record of each key is kept) or both.",
        "compression.type" => "The codec the leader stores batches with (recompressing others), or producer to keep the producer's.",
        "compression.gzip.level" => "gzip level for compression.type=gzip.",
        "compression.lz4.level" => "lz4 level for compression.type=lz4 (accepted; Sluice's lz4 has one level).",
        "compression.zstd.level" => "zstd level for compression.type=zstd.",
        "delete.retention.ms" => "How long delete markers (tombstones) of a compacted topic are kept.",
        "file.delete.delay.ms" => "Delay before a deleted segment's file is removed (accepted without effect).",
        "flush.messages" => "Records between forced flushes (accepted without effect).",
        "flush.ms" => "Longest time before appended data is fsynced; 0 syncs before every acknowledgement.",
        "follower.replication.throttled.replicas" => "Replicas (partition:broker,... or *) whose followers fetch within their broker's follower.replication.throttled.rate while outside the ISR (partition moves).",
        "index.interval.bytes" => "Bytes between offset index entries (accepted without effect).",
        "leader.replication.throttled.replicas" => "Replicas throttled as leaders (accepted without effect: the follower side throttles the same traffic).",
        "local.retention.bytes" | "local.retention.ms" => "With tiered storage: how long / how much of the log stays on local disk (-2: as retention.*).",
        "max.compaction.lag.ms" => "Longest time a record may stay uncompacted.",
        "max.message.bytes" => "The largest record batch the topic accepts.",
        "message.downconversion.enable" => "Whether Fetch v0-v3 clients get batches converted to their message format.",
        "message.format.version" => "Deprecated; ignored for message format v2.",
        "message.timestamp.after.max.ms" => "How far in the future a record's timestamp may be.",
        "message.timestamp.before.max.ms" => "How far in the past a record's timestamp may be.",
        "message.timestamp.difference.max.ms" => "Deprecated bound on a record's timestamp, either way.",
        "message.timestamp.type" => "CreateTime (the producer's timestamp) or LogAppendTime (the broker's).",
        "min.cleanable.dirty.ratio" => "Share of uncompacted data that makes a log eligible for compaction.",
        "min.compaction.lag.ms" => "Shortest time a record stays uncompacted.",
        "min.insync.replicas" => "In-sync replicas an acks=all write needs (unset: 2, or 1 for a single replica).",
        "preallocate" => "Preallocate segment files (Sluice always does).",
        "remote.storage.enable" => "Copy closed segments to the broker's object store (--remote-storage) and read old offsets from it (tiered storage).",
        "remote.log.copy.disable" => "With tiered storage: upload nothing more; remote data stays readable and local retention follows retention.*.",
        "remote.log.delete.on.disable" => "Accepted without effect (Sluice refuses turning remote storage off on a topic with remote segments).",
        "retention.bytes" => "Largest size of a partition before its oldest segments are deleted.",
        "retention.ms" => "How long records are kept before their segment is deleted.",
        "segment.bytes" => "Size at which a partition rolls a new segment.",
        "segment.index.bytes" => "Size of a segment's index (accepted without effect).",
        "segment.jitter.ms" => "Random reduction of segment.ms so segments do not all roll together.",
        "segment.ms" => "Age at which a partition rolls a new segment.",
        "unclean.leader.election.enable" => "Whether a replica outside the ISR may become leader (losing records).",
        _ => "",
    };
    doc.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_log_default_names_a_known_topic_config_once() {
        for (broker, topic) in LOG_DEFAULTS {
            assert!(KNOWN.iter().any(|(n, _)| n == topic), "{topic}");
            assert_eq!(LOG_DEFAULTS.iter().filter(|(b, _)| b == broker).count(), 1);
            assert!(!topic_doc(topic).is_empty(), "{topic} has documentation");
        }
        for (name, _) in KNOWN {
            assert!(!topic_doc(name).is_empty(), "{name} has documentation");
        }
    }

    fn image_with(scope: i32, kv: &[(&str, &str)]) -> MetadataImage {
        let mut image = MetadataImage::new_cluster();
        image.broker_configs.insert(
            scope,
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        image
    }

    /// A described topic config set written back as the topic's explicit set (what
    /// legacy AlterConfigs and config-sync tools do) changes nothing that is enforced.
    #[test]
    fn described_configs_written_back_change_nothing() {
        let image = MetadataImage::new_cluster();
        let me = BrokerId::new(1);
        let explicit = |d: &[Described]| -> BTreeMap<String, String> {
            d.iter()
                .filter_map(|x| Some((x.name.clone(), x.value.clone()?)))
                .collect()
        };
        for (rf, enforced) in [(1, 1), (2, 2), (3, 2)] {
            let d = describe_topic(&image, me, &BTreeMap::new(), Some(rf));
            let min = d.iter().find(|x| x.name == MIN_INSYNC).unwrap();
            assert_eq!(
                min.value.as_deref(),
                Some(enforced.to_string().as_str()),
                "rf {rf}"
            );
            assert_eq!(min.source, SOURCE_DEFAULT);
            let back = TopicConfig::parse(&explicit(&d)).unwrap();
            assert_eq!(back.min_insync_replicas, enforced, "rf {rf}");
            assert_eq!(
                back,
                TopicConfig::parse(&BTreeMap::new())
                    .map(|mut t| {
                        t.min_insync_replicas = enforced;
                        t
                    })
                    .unwrap()
            );
        }
        // An explicit value is described as set.
        let own = BTreeMap::from([(MIN_INSYNC.to_string(), "3".to_string())]);
        let d = describe_topic(&image, me, &own, Some(1));
        let min = d.iter().find(|x| x.name == MIN_INSYNC).unwrap();
        assert_eq!(
            (min.value.as_deref(), min.source),
            (Some("3"), SOURCE_DYNAMIC_TOPIC)
        );
        // The deprecated timestamp difference stays in force when the described
        // before/after bounds (at their default) are written back.
        let own = BTreeMap::from([(
            "message.timestamp.difference.max.ms".to_string(),
            "5000".to_string(),
        )]);
        let d = describe_topic(&image, me, &own, Some(1));
        let back = TopicConfig::parse(&explicit(&d)).unwrap();
        let direct = TopicConfig::parse(&own).unwrap();
        assert_eq!(
            (back.timestamp_before_max_ms, back.timestamp_after_max_ms),
            (5000, 5000)
        );
        assert_eq!(
            (
                direct.timestamp_before_max_ms,
                direct.timestamp_after_max_ms
            ),
            (5000, 5000)
        );
    }

    #[test]
    fn dynamic_defaults_apply_to_topics_that_do_not_set_the_config() {
        let mut image = image_with(
            -1,
            &[("log.retention.ms", "1000"), ("message.max.bytes", "5000")],
        );
        image.broker_configs.insert(
            2,
            [("log.retention.ms".to_string(), "7".to_string())].into(),
        );
        let own = BTreeMap::from([("max.message.bytes".to_string(), "9".to_string())]);
        let eff = effective_topic_configs(&image, BrokerId::new(1), &own);
        assert_eq!(eff["retention.ms"], "1000");
        assert_eq!(eff["max.message.bytes"], "9", "the topic's own value wins");
        assert_eq!(
            effective_topic_configs(&image, BrokerId::new(2), &own)["retention.ms"],
            "7"
        );

        let d = describe_topic(&image, BrokerId::new(1), &own, Some(3));
        let retention = d.iter().find(|x| x.name == "retention.ms").unwrap();
        assert_eq!(
            (retention.value.as_deref(), retention.source),
            (Some("1000"), SOURCE_DYNAMIC_DEFAULT_BROKER)
        );
        assert_eq!(retention.synonyms[1].0, "log.retention.ms");
        assert_eq!(retention.synonyms[1].2, SOURCE_DEFAULT);
        let max = d.iter().find(|x| x.name == "max.message.bytes").unwrap();
        assert_eq!(max.source, SOURCE_DYNAMIC_TOPIC);
        assert_eq!(
            max.synonyms.iter().map(|s| s.2).collect::<Vec<_>>(),
            vec![
                SOURCE_DYNAMIC_TOPIC,
                SOURCE_DYNAMIC_DEFAULT_BROKER,
                SOURCE_DEFAULT
            ]
        );
    }

    #[test]
    fn dynamic_changes_are_checked_as_kafka_checks_them() {
        let c = BrokerConfig::resolve(crate::base::config::Settings::default(), 1).unwrap();
        let set = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(check_dynamic(
            &c,
            1,
            &set(&[("log.retention.ms", "5"), ("compression.type", "zstd")])
        )
        .is_ok());
        let e = check_dynamic(&c, 1, &set(&[("broker.id", "5")])).unwrap_err();
        assert_eq!(e.code(), ResponseError::InvalidRequest.code());
        let e = check_dynamic(&c, 1, &set(&[("log.retention.ms", "soon")])).unwrap_err();
        assert_eq!(e.code(), ResponseError::InvalidConfig.code());
        assert!(e.message.unwrap().contains("log.retention.ms"));
        let e = check_dynamic(&c, 1, &set(&[("no.such.config", "1")])).unwrap_err();
        assert_eq!(e.code(), ResponseError::InvalidConfig.code());
        // Kafka's other broker configs: dynamic ones kept (per-broker ones only for a
        // broker), read-only ones refused as Kafka refuses them.
        let relogin = "sasl.kerberos.min.time.before.relogin";
        assert!(check_dynamic(&c, 1, &set(&[(relogin, "58000")])).is_ok());
        assert!(check_dynamic(&c, -1, &set(&[("num.io.threads", "9")])).is_ok());
        let e = check_dynamic(&c, -1, &set(&[(relogin, "58000")])).unwrap_err();
        assert_eq!(e.code(), ResponseError::InvalidRequest.code());
        assert!(e.message.unwrap().contains("broker id must be specified"));
        // Listener security and secrets are never kept without effect.
        for security in [
            "ssl.client.auth",
            "sasl.enabled.mechanisms",
            "ssl.keystore.password",
            "listener.name.external.ssl.keystore.location",
        ] {
            let e = check_dynamic(&c, 1, &set(&[(security, "x")])).unwrap_err();
            assert_eq!(e.code(), ResponseError::InvalidRequest.code(), "{security}");
        }
        for read_only in [
            "auto.create.topics.enable",
            "advertised.listeners",
            "zookeeper.connect",
        ] {
            let e = check_dynamic(&c, 1, &set(&[(read_only, "x")])).unwrap_err();
            assert_eq!(
                e.code(),
                ResponseError::InvalidRequest.code(),
                "{read_only}"
            );
        }
        // No name of Kafka's table is unknown.
        for (name, _) in crate::base::kafka_broker_configs::KAFKA_BROKER_CONFIGS {
            if let Err(e) = check_dynamic(&c, 1, &set(&[(name, "1")])) {
                assert!(!e.message.unwrap_or_default().contains("Unknown"), "{name}");
            }
        }
        // Kept ones are described with their source.
        let image = image_with(1, &[(relogin, "58000")]);
        let d = describe_broker(&c, &image, false);
        let d = d.iter().find(|d| d.name == relogin).unwrap();
        assert_eq!(
            (d.value.as_deref(), d.source, d.read_only),
            (Some("58000"), SOURCE_DYNAMIC_BROKER, false)
        );
        // The replication throttles: a byte rate, at least 0.
        let rate = "follower.replication.throttled.rate";
        assert!(check_dynamic(&c, 1, &set(&[(rate, "1048576")])).is_ok());
        let e = check_dynamic(&c, 1, &set(&[(rate, "-1")])).unwrap_err();
        assert_eq!(e.code(), ResponseError::InvalidConfig.code());
        assert!(e.message.unwrap().contains(rate));
        let image = image_with(2, &[(rate, "1000")]);
        let described = describe_broker(&c, &image, false);
        let d = described.iter().find(|d| d.name == rate).unwrap();
        assert_eq!(
            (d.value.as_deref(), d.read_only),
            (Some("9223372036854775807"), false)
        );
        let image = image_with(1, &[(rate, "1000")]);
        let described = describe_broker(&c, &image, false);
        let d = described.iter().find(|d| d.name == rate).unwrap();
        assert_eq!(
            (d.value.as_deref(), d.source),
            (Some("1000"), SOURCE_DYNAMIC_BROKER)
        );
    }
}
