//! Topic configs: Kafka's names and value syntax, validated, mapped onto the storage
//! crate's [`LogConfig`].
//!
//! A topic stores only the configs that were set explicitly (as strings, the way
//! clients send them); everything else is the broker default. [`TopicConfig::parse`]
//! is the one place that checks values, so CreateTopics, IncrementalAlterConfigs and
//! start-up all accept exactly the same things.

use std::collections::BTreeMap;

use sluice_storage::codec::{Codec, Levels};
use sluice_storage::{FlushPolicy, LogConfig, TimestampType};

/// Every topic config of Kafka 3.9, with its default as Sluice applies it (Kafka's,
/// except where a comment says otherwise). All are accepted with Kafka's validation;
/// [`TopicConfig::parse`] says which change behaviour and which Sluice refuses to set
/// to a value it cannot honour (rather than accepting it silently).
pub const KNOWN: &[(&str, &str)] = &[
    ("cleanup.policy", "delete"),
    ("compression.gzip.level", "-1"),
    ("compression.lz4.level", "9"),
    ("compression.type", "producer"),
    ("compression.zstd.level", "3"),
    ("delete.retention.ms", "86400000"),
    ("file.delete.delay.ms", "60000"),
    ("flush.messages", "9223372036854775807"),
    // 0: fsync before every acknowledgement (Kafka's default leaves it to the OS).
    ("flush.ms", "0"),
    ("follower.replication.throttled.replicas", ""),
    ("index.interval.bytes", "4096"),
    ("leader.replication.throttled.replicas", ""),
    ("local.retention.bytes", "-2"),
    ("local.retention.ms", "-2"),
    ("max.compaction.lag.ms", "9223372036854775807"),
    ("max.message.bytes", "1048588"),
    ("message.downconversion.enable", "true"),
    ("message.format.version", "3.0-IV1"),
    ("message.timestamp.after.max.ms", "9223372036854775807"),
    ("message.timestamp.before.max.ms", "9223372036854775807"),
    ("message.timestamp.difference.max.ms", "9223372036854775807"),
    ("message.timestamp.type", "CreateTime"),
    ("min.cleanable.dirty.ratio", "0.5"),
    ("min.compaction.lag.ms", "0"),
    // Unset, the effective value is min(2, replication factor): an acks=all write is on
    // at least two replicas whenever the topic has two (Kafka's default is 1).
    ("min.insync.replicas", "2"),
    ("preallocate", "false"),
    ("remote.log.copy.disable", "false"),
    ("remote.log.delete.on.disable", "false"),
    ("remote.storage.enable", "false"),
    // 1 TiB (Kafka's default, -1, is unbounded).
    ("retention.bytes", "1099511627776"),
    ("retention.ms", "604800000"),
    ("segment.bytes", "1073741824"),
    ("segment.index.bytes", "10485760"),
    ("segment.jitter.ms", "0"),
    ("segment.ms", "604800000"),
    ("unclean.leader.election.enable", "false"),
];

/// Accepted with Kafka's validation, but without effect in Sluice (docs/operations.md,
/// "Topic configs", lists why): index spacing, file deletion delay, per-message flush
/// counts, follower throttles and tiered storage off, preallocation (Sluice always
/// preallocates). Each with the rule its value must follow.
const ACCEPTED_WITHOUT_EFFECT: &[(&str, Rule)] = &[
    // lz4_flex has one level (Kafka's levels pick LZ4 HC above 2).
    ("compression.lz4.level", Rule::Range(1, 17)),
    ("file.delete.delay.ms", Rule::AtLeast(0)),
    ("flush.messages", Rule::AtLeast(1)),
    ("follower.replication.throttled.replicas", Rule::ReplicaList),
    ("index.interval.bytes", Rule::AtLeast(0)),
    ("leader.replication.throttled.replicas", Rule::ReplicaList),
    // Deprecated since 3.0 and ignored by Kafka for message format v2.
    ("message.format.version", Rule::Any),
    ("preallocate", Rule::Bool),
    ("remote.log.delete.on.disable", Rule::Bool),
    ("segment.index.bytes", Rule::AtLeast(4)),
];

/// Why a topic config is refused. The text is the message an INVALID_CONFIG response
/// carries (Kafka's wording where Kafka has one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A known config with a value that breaks its rule.
    #[error("Invalid value {value} for configuration {name}: {why}")]
    InvalidValue {
        name: String,
        value: String,
        why: String,
    },
    /// A size that does not fit its unsigned type.
    #[error("{name} {value} must be positive")]
    NotPositive { name: &'static str, value: i64 },
    #[error("Unknown topic config name: {0}")]
    UnknownName(String),
    /// Values valid one by one that the log refuses together (its own check).
    #[error("Invalid configuration: {0}")]
    Inconsistent(String),
}

fn invalid(name: &str, v: &str, why: &str) -> ConfigError {
    ConfigError::InvalidValue {
        name: name.to_string(),
        value: v.to_string(),
        why: why.to_string(),
    }
}

fn parse_bool(name: &str, v: &str) -> Result<bool, ConfigError> {
    match v.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(
            name,
            v,
            "Expected value to be either true or false",
        )),
    }
}

fn parse_at_least(name: &str, v: &str, min: i64) -> Result<i64, ConfigError> {
    let n = parse_i64(name, v)?;
    if n < min {
        return Err(invalid(name, v, &format!("Value must be at least {min}")));
    }
    Ok(n)
}

/// Kafka's rule for a config's value, where the value is all Sluice checks.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// An integer at least this.
    AtLeast(i64),
    /// An integer in this inclusive range.
    Range(i64, i64),
    /// -1 (the codec's default) or 1..=9.
    GzipLevel,
    Bool,
    /// A list of `partition:broker` pairs, or `*`.
    ReplicaList,
    Any,
}

/// Checks a value against its rule.
fn check(rule: Rule, name: &str, v: &str) -> Result<(), ConfigError> {
    match rule {
        Rule::AtLeast(min) => {
            parse_at_least(name, v, min)?;
        }
        Rule::Range(min, max) => {
            let n = parse_i64(name, v)?;
            if !(min..=max).contains(&n) {
                return Err(invalid(
                    name,
                    v,
                    &format!("Value must be in [{min},...,{max}]"),
                ));
            }
        }
        Rule::GzipLevel => {
            let n = parse_i64(name, v)?;
            if !(n == -1 || (1..=9).contains(&n)) {
                return Err(invalid(name, v, "must be -1 or in [1,...,9]"));
            }
        }
        Rule::Bool => {
            parse_bool(name, v)?;
        }
        Rule::ReplicaList => {
            let ok = v.trim() == "*"
                || v.trim().is_empty()
                || v.split(',').all(|pair| {
                    pair.trim().split_once(':').is_some_and(|(p, b)| {
                        p.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok()
                    })
                });
            if !ok {
                return Err(invalid(
                    name,
                    v,
                    "must be a list of partition:broker pairs or *",
                ));
            }
        }
        Rule::Any => {}
    }
    Ok(())
}

/// A parsed topic configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    pub log: LogConfig,
    pub min_insync_replicas: i32,
    pub cleanup_policy: String,
    /// message.timestamp.before.max.ms / after.max.ms (KIP-937; the deprecated
    /// difference.max.ms stands in for either when it is not set).
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
    /// `compression.type`: the codec the leader stores every produced batch with
    /// (recompressing one that differs), `None` for `producer` (stored as sent).
    pub compression: Option<Codec>,
    /// `compression.gzip.level`, `compression.zstd.level`.
    pub compression_levels: Levels,
}

fn parse_i64(name: &str, v: &str) -> Result<i64, ConfigError> {
    v.trim()
        .parse::<i64>()
        .map_err(|_| invalid(name, v, "not a number"))
}

impl TopicConfig {
    /// Parses explicitly-set configs over the defaults. The error is the message an
    /// INVALID_CONFIG response carries.
    pub fn parse(set: &BTreeMap<String, String>) -> Result<TopicConfig, ConfigError> {
        let mut log = LogConfig::default();
        let mut min_insync_replicas = 1;
        let mut cleanup_policy = "delete".to_string();
        let (mut before, mut after, mut difference) = (None, None, None);
        let mut compression = None;
        let mut compression_levels = Levels::default();
        let (mut local_ms, mut local_bytes) = (-2, -2);
        for (name, v) in set {
            if let Some((_, rule)) = ACCEPTED_WITHOUT_EFFECT.iter().find(|(n, _)| n == name) {
                check(*rule, name, v)?;
                continue;
            }
            match name.as_str() {
                "compression.type" => match v.trim() {
                    "producer" => compression = None,
                    c => {
                        compression = Some(Codec::from_name(c).ok_or_else(|| {
                            invalid(
                                name,
                                v,
                                "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer",
                            )
                        })?)
                    }
                },
                "compression.gzip.level" => {
                    check(Rule::GzipLevel, name, v)?;
                    compression_levels.gzip = parse_i64(name, v)? as i32;
                }
                "compression.zstd.level" => {
                    check(Rule::Range(-131072, 22), name, v)?;
                    compression_levels.zstd = parse_i64(name, v)? as i32;
                }
                // Tiered storage (crate::partition::tiered); the broker refuses it
                // without --remote-storage (crate::cluster::controller).
                "remote.storage.enable" => log.remote_storage = parse_bool(name, v)?,
                "remote.log.copy.disable" => log.remote_copy_disabled = parse_bool(name, v)?,
                "local.retention.ms" => local_ms = parse_at_least(name, v, -2)?,
                "local.retention.bytes" => local_bytes = parse_at_least(name, v, -2)?,
                "message.timestamp.before.max.ms" => before = Some(parse_at_least(name, v, 0)?),
                "message.timestamp.after.max.ms" => after = Some(parse_at_least(name, v, 0)?),
                "message.timestamp.difference.max.ms" => {
                    difference = Some(parse_at_least(name, v, 0)?)
                }
                "retention.ms" => log.retention_ms = parse_i64(name, v)?,
                "retention.bytes" => log.retention_bytes = parse_i64(name, v)?,
                "segment.bytes" => {
                    let n = parse_i64(name, v)?;
                    log.segment_bytes = u64::try_from(n).map_err(|_| ConfigError::NotPositive { name: "segment.bytes", value: n })?;
                }
                "segment.ms" => log.segment_ms = parse_i64(name, v)?,
                "max.message.bytes" => {
                    let n = parse_i64(name, v)?;
                    log.max_message_bytes =
                        usize::try_from(n).map_err(|_| ConfigError::NotPositive { name: "max.message.bytes", value: n })?;
                }
                "message.timestamp.type" => {
                    log.timestamp_type = match v.as_str() {
                        "CreateTime" => TimestampType::CreateTime,
                        "LogAppendTime" => TimestampType::LogAppendTime,
                        _ => return Err(invalid(name, v, "must be CreateTime or LogAppendTime")),
                    }
                }
                "min.insync.replicas" => {
                    let n = parse_i64(name, v)?;
                    if !(1..=i64::from(i32::MAX)).contains(&n) {
                        return Err(invalid(name, v, "must be at least 1"));
                    }
                    min_insync_replicas = n as i32;
                }
                "cleanup.policy" => {
                    let mut parts: Vec<&str> = v.split(',').map(str::trim).collect();
                    parts.sort_unstable();
                    parts.dedup();
                    if parts.is_empty() || parts.iter().any(|p| *p != "delete" && *p != "compact") {
                        return Err(invalid(name, v, "must be delete, compact or both"));
                    }
                    log.cleanup_delete = parts.contains(&"delete");
                    log.cleanup_compact = parts.contains(&"compact");
                    cleanup_policy = v.clone();
                }
                "delete.retention.ms" => log.delete_retention_ms = parse_i64(name, v)?,
                // Read by the controller's election (sluice_replication::cluster).
                "unclean.leader.election.enable" => {
                    if v != "true" && v != "false" {
                        return Err(invalid(name, v, "must be true or false"));
                    }
                }
                // Read by Fetch (`crate::serve::api::fetch`): whether v0–v3 fetchers get
                // message sets converted from the stored batches.
                "message.downconversion.enable" => {
                    if v != "true" && v != "false" {
                        return Err(invalid(name, v, "must be true or false"));
                    }
                }
                "min.compaction.lag.ms" => log.min_compaction_lag_ms = parse_i64(name, v)?,
                "max.compaction.lag.ms" => log.max_compaction_lag_ms = parse_at_least(name, v, 1)?,
                "segment.jitter.ms" => log.segment_jitter_ms = parse_at_least(name, v, 0)?,
                "min.cleanable.dirty.ratio" => {
                    let r: f64 = v.trim().parse().map_err(|_| invalid(name, v, "not a number"))?;
                    if !(0.0..=1.0).contains(&r) {
                        return Err(invalid(name, v, "must be in [0, 1]"));
                    }
                    log.min_cleanable_dirty_ratio_bp = (r * 10_000.0).round() as u16;
                }
                "flush.ms" => {
                    // 0 means "before every acknowledgement", Sluice's default; Kafka's
                    // Long.MAX_VALUE default ("never") is taken as a long interval.
                    let n = parse_i64(name, v)?;
                    log.flush = match n {
                        0 => FlushPolicy::Always,
                        n if n > 0 => FlushPolicy::IntervalMs(n as u64),
                        _ => return Err(invalid(name, v, "must be >= 0")),
                    };
                }
                _ => return Err(ConfigError::UnknownName(name.clone())),
            }
        }
        // -2: the local window is the whole retention (Kafka's default).
        log.local_retention_ms = if local_ms == -2 {
            log.retention_ms
        } else {
            local_ms
        };
        log.local_retention_bytes = if local_bytes == -2 {
            log.retention_bytes
        } else {
            local_bytes
        };
        log.validate()
            .map_err(|e| ConfigError::Inconsistent(e.to_string()))?;
        Ok(TopicConfig {
            log,
            min_insync_replicas,
            cleanup_policy,
            // As Kafka's LogConfig: the deprecated difference applies while the new
            // bound is unset or at its default (Long.MAX_VALUE), so a described set
            // written back (the default included) keeps the difference in force.
            timestamp_before_max_ms: before
                .filter(|v| *v != i64::MAX)
                .or(difference)
                .unwrap_or(i64::MAX),
            timestamp_after_max_ms: after
                .filter(|v| *v != i64::MAX)
                .or(difference)
                .unwrap_or(i64::MAX),
            compression,
            compression_levels,
        })
    }

    /// Every known config with its effective value and whether it was set explicitly.
    pub fn describe(set: &BTreeMap<String, String>) -> Vec<(&'static str, String, bool)> {
        KNOWN
            .iter()
            .map(|(name, default)| match set.get(*name) {
                Some(v) => (*name, v.clone(), true),
                None => (*name, (*default).to_string(), false),
            })
            .collect()
    }
}

/// `message.downconversion.enable` of a topic's explicitly-set configs: whether
/// clients of Fetch v0–v3 may read it (as message sets converted from its batches).
pub fn downconversion_enabled(set: &BTreeMap<String, String>) -> bool {
    set.get("message.downconversion.enable")
        .is_none_or(|v| v != "false")
}

/// True if the topic's `compression.type` is zstd: Kafka answers its Fetch before v10
/// UNSUPPORTED_COMPRESSION_TYPE (KIP-110).
pub fn stores_zstd(set: &BTreeMap<String, String>) -> bool {
    set.get("compression.type")
        .is_some_and(|v| v.trim() == "zstd")
}

/// Why a topic name breaks Kafka's rules; the text is the message an
/// INVALID_TOPIC_EXCEPTION carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicNameError {
    #[error("Topic name is empty")]
    Empty,
    #[error("Topic name cannot be \"{0}\"")]
    Dots(String),
    #[error("Topic name is longer than 249 characters: {0} characters")]
    TooLong(usize),
    #[error("Topic name \"{name}\" is illegal: character {c:?} is not in [a-zA-Z0-9._-]")]
    IllegalChar { name: String, c: char },
}

/// Kafka's topic name rules: 1..=249 chars of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), TopicNameError> {
    if name.is_empty() {
        return Err(TopicNameError::Empty);
    }
    if name == "." || name == ".." {
        return Err(TopicNameError::Dots(name.to_string()));
    }
    if name.len() > 249 {
        return Err(TopicNameError::TooLong(name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(TopicNameError::IllegalChar {
            name: name.to_string(),
            c,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_parse_and_match_the_storage_defaults() {
        let c = TopicConfig::parse(&BTreeMap::new()).unwrap();
        assert_eq!(c.log, LogConfig::default());
        let all: BTreeMap<String, String> = KNOWN
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(TopicConfig::parse(&all).unwrap().log, LogConfig::default());
    }

    #[test]
    fn values_map_onto_the_log_config() {
        let c = TopicConfig::parse(&set(&[
            ("retention.ms", "1000"),
            ("segment.bytes", "4096"),
            ("message.timestamp.type", "LogAppendTime"),
            ("flush.ms", "50"),
            ("min.insync.replicas", "2"),
            ("cleanup.policy", "compact,delete"),
            ("min.cleanable.dirty.ratio", "0.25"),
        ]))
        .unwrap();
        assert!(c.log.cleanup_compact && c.log.cleanup_delete);
        assert_eq!(c.log.min_cleanable_dirty_ratio_bp, 2500);
        assert_eq!(c.log.retention_ms, 1000);
        assert_eq!(c.log.segment_bytes, 4096);
        assert_eq!(c.log.timestamp_type, TimestampType::LogAppendTime);
        assert_eq!(c.log.flush, FlushPolicy::IntervalMs(50));
        assert_eq!(c.min_insync_replicas, 2);
    }

    #[test]
    fn bad_values_are_refused_with_a_message() {
        for (k, v) in [
            ("retention.ms", "soon"),
            ("segment.bytes", "10"),
            ("message.timestamp.type", "Now"),
            ("min.insync.replicas", "0"),
            ("cleanup.policy", "shred"),
            ("flush.ms", "-5"),
            ("min.cleanable.dirty.ratio", "2"),
            ("no.such.config", "1"),
            ("compression.type", "brotli"),
            ("compression.type", "ZSTD"),
            ("compression.zstd.level", "23"),
            ("remote.storage.enable", "yes"),
            ("local.retention.ms", "-3"),
            ("preallocate", "yes"),
            ("segment.jitter.ms", "-1"),
            ("compression.gzip.level", "10"),
            ("message.timestamp.after.max.ms", "-1"),
            ("leader.replication.throttled.replicas", "0:x"),
        ] {
            let e = TopicConfig::parse(&set(&[(k, v)])).unwrap_err();
            assert!(e.to_string().contains(k), "{k}={v}: {e}");
        }
    }

    #[test]
    fn tiered_configs_resolve_the_local_window() {
        let c = TopicConfig::parse(&set(&[
            ("remote.storage.enable", "true"),
            ("retention.ms", "86400000"),
        ]))
        .unwrap();
        assert!(c.log.remote_storage);
        assert_eq!(c.log.local_retention_ms, 86_400_000);
        let c = TopicConfig::parse(&set(&[
            ("remote.storage.enable", "true"),
            ("local.retention.bytes", "1048576"),
        ]))
        .unwrap();
        assert_eq!(c.log.local_retention_bytes, 1 << 20);
        for bad in [
            &[
                ("remote.storage.enable", "true"),
                ("cleanup.policy", "compact"),
            ][..],
            &[
                ("remote.storage.enable", "true"),
                ("retention.ms", "1000"),
                ("local.retention.ms", "5000"),
            ],
            &[
                ("remote.storage.enable", "true"),
                ("retention.ms", "1000"),
                ("local.retention.ms", "-1"),
            ],
        ] {
            let e = TopicConfig::parse(&set(bad)).unwrap_err();
            assert!(matches!(e, ConfigError::Inconsistent(_)), "{bad:?}: {e}");
        }
    }

    #[test]
    fn every_kafka_topic_config_is_accepted_and_timestamp_bounds_resolve() {
        // The standard configs the issue names, at typical values.
        let c = TopicConfig::parse(&set(&[
            ("compression.type", "producer"),
            ("file.delete.delay.ms", "1000"),
            ("max.compaction.lag.ms", "60000"),
            ("min.cleanable.dirty.ratio", "0.1"),
            ("segment.jitter.ms", "10"),
            ("index.interval.bytes", "8192"),
            ("message.format.version", "2.8"),
            ("leader.replication.throttled.replicas", "0:1,1:2"),
            ("message.timestamp.difference.max.ms", "5000"),
            ("message.timestamp.after.max.ms", "100"),
        ]))
        .unwrap();
        assert_eq!(
            (c.timestamp_before_max_ms, c.timestamp_after_max_ms),
            (5000, 100)
        );
        assert_eq!(
            (c.log.max_compaction_lag_ms, c.log.segment_jitter_ms),
            (60000, 10)
        );
        let none = TopicConfig::parse(&BTreeMap::new()).unwrap();
        assert_eq!(none.timestamp_before_max_ms, i64::MAX);
        // Every name has a default and every inert one is known.
        for (n, _) in ACCEPTED_WITHOUT_EFFECT {
            assert!(KNOWN.iter().any(|(k, _)| k == n), "{n}");
        }
    }

    #[test]
    fn compression_type_names_the_stored_codec() {
        let none = TopicConfig::parse(&BTreeMap::new()).unwrap();
        assert_eq!(none.compression, None);
        for (v, want) in [
            ("producer", None),
            ("uncompressed", Some(Codec::None)),
            ("gzip", Some(Codec::Gzip)),
            ("snappy", Some(Codec::Snappy)),
            ("lz4", Some(Codec::Lz4)),
            ("zstd", Some(Codec::Zstd)),
        ] {
            let c = TopicConfig::parse(&set(&[("compression.type", v)])).unwrap();
            assert_eq!(c.compression, want, "{v}");
        }
        let c = TopicConfig::parse(&set(&[
            ("compression.gzip.level", "9"),
            ("compression.zstd.level", "-5"),
        ]))
        .unwrap();
        assert_eq!(c.compression_levels, Levels { gzip: 9, zstd: -5 });
    }

    #[test]
    fn messages_keep_kafkas_wording() {
        let msg = |k: &str, v: &str| TopicConfig::parse(&set(&[(k, v)])).unwrap_err().to_string();
        assert_eq!(
            msg("retention.ms", "soon"),
            "Invalid value soon for configuration retention.ms: not a number"
        );
        assert_eq!(
            msg("compression.lz4.level", "18"),
            "Invalid value 18 for configuration compression.lz4.level: Value must be in [1,...,17]"
        );
        assert_eq!(
            msg("no.such.config", "1"),
            "Unknown topic config name: no.such.config"
        );
        assert_eq!(
            validate_topic_name("..").unwrap_err().to_string(),
            "Topic name cannot be \"..\""
        );
    }

    #[test]
    fn topic_names() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a b", "ü", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad}");
        }
    }
}
