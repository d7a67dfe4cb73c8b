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

/// Accepted with Kafka's validation, but without effect in Sluice (docs/architecture.md
/// lists why): index spacing, file deletion delay, per-message flush counts, follower
/// throttles and tiered storage off, preallocation (Sluice always preallocates).
const ACCEPTED_WITHOUT_EFFECT: &[&str] = &[
    // lz4_flex has one level (Kafka's levels pick LZ4 HC above 2).
    "compression.lz4.level",
    "file.delete.delay.ms",
    "flush.messages",
    "follower.replication.throttled.replicas",
    "index.interval.bytes",
    "leader.replication.throttled.replicas",
    "local.retention.bytes",
    "local.retention.ms",
    "message.format.version",
    "preallocate",
    "remote.log.copy.disable",
    "remote.log.delete.on.disable",
    "segment.index.bytes",
];

fn invalid(name: &str, v: &str, why: &str) -> String {
    format!("Invalid value {v} for configuration {name}: {why}")
}

fn parse_bool(name: &str, v: &str) -> Result<bool, String> {
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

fn parse_at_least(name: &str, v: &str, min: i64) -> Result<i64, String> {
    let n = parse_i64(name, v)?;
    if n < min {
        return Err(invalid(name, v, &format!("Value must be at least {min}")));
    }
    Ok(n)
}

/// Validates a config Sluice accepts without acting on it.
fn check_inert(name: &str, v: &str) -> Result<(), String> {
    match name {
        "compression.gzip.level" => {
            let n = parse_i64(name, v)?;
            if !(n == -1 || (1..=9).contains(&n)) {
                return Err(invalid(name, v, "must be -1 or in [1,...,9]"));
            }
        }
        "compression.lz4.level" => {
            let n = parse_i64(name, v)?;
            if !(1..=17).contains(&n) {
                return Err(invalid(name, v, "Value must be in [1,...,17]"));
            }
        }
        "compression.zstd.level" => {
            let n = parse_i64(name, v)?;
            if !(-131072..=22).contains(&n) {
                return Err(invalid(name, v, "Value must be in [-131072,...,22]"));
            }
        }
        "file.delete.delay.ms" | "max.compaction.lag.ms" | "segment.jitter.ms" => {
            parse_at_least(
                name,
                v,
                if name == "max.compaction.lag.ms" {
                    1
                } else {
                    0
                },
            )?;
        }
        "flush.messages" => {
            parse_at_least(name, v, 1)?;
        }
        "index.interval.bytes" => {
            parse_at_least(name, v, 0)?;
        }
        "segment.index.bytes" => {
            parse_at_least(name, v, 4)?;
        }
        "local.retention.bytes" | "local.retention.ms" => {
            parse_at_least(name, v, -2)?;
        }
        "preallocate" | "remote.log.copy.disable" | "remote.log.delete.on.disable" => {
            parse_bool(name, v)?;
        }
        // A list of `partition:broker` pairs, or `*`.
        "follower.replication.throttled.replicas" | "leader.replication.throttled.replicas" => {
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
        // Deprecated since 3.0 and ignored by Kafka for message format v2.
        "message.format.version" => {}
        _ => unreachable!("{name} is validated here"),
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

fn parse_i64(name: &str, v: &str) -> Result<i64, String> {
    v.trim()
        .parse::<i64>()
        .map_err(|_| format!("Invalid value {v} for configuration {name}: not a number"))
}

impl TopicConfig {
    /// Parses explicitly-set configs over the defaults. The error is the message an
    /// INVALID_CONFIG response carries.
    pub fn parse(set: &BTreeMap<String, String>) -> Result<TopicConfig, String> {
        let mut log = LogConfig::default();
        let mut min_insync_replicas = 1;
        let mut cleanup_policy = "delete".to_string();
        let (mut before, mut after, mut difference) = (None, None, None);
        let mut compression = None;
        let mut compression_levels = Levels::default();
        for (name, v) in set {
            match name.as_str() {
                n if ACCEPTED_WITHOUT_EFFECT.contains(&n) => check_inert(n, v)?,
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
                    check_inert(name, v)?;
                    compression_levels.gzip = parse_i64(name, v)? as i32;
                }
                "compression.zstd.level" => {
                    check_inert(name, v)?;
                    compression_levels.zstd = parse_i64(name, v)? as i32;
                }
                "remote.storage.enable" => {
                    if parse_bool(name, v)? {
                        return Err(invalid(name, v, "Sluice has no tiered storage"));
                    }
                }
                "message.timestamp.before.max.ms" => before = Some(parse_at_least(name, v, 0)?),
                "message.timestamp.after.max.ms" => after = Some(parse_at_least(name, v, 0)?),
                "message.timestamp.difference.max.ms" => {
                    difference = Some(parse_at_least(name, v, 0)?)
                }
                "retention.ms" => log.retention_ms = parse_i64(name, v)?,
                "retention.bytes" => log.retention_bytes = parse_i64(name, v)?,
                "segment.bytes" => {
                    let n = parse_i64(name, v)?;
                    log.segment_bytes = u64::try_from(n).map_err(|_| format!("segment.bytes {n} must be positive"))?;
                }
                "segment.ms" => log.segment_ms = parse_i64(name, v)?,
                "max.message.bytes" => {
                    let n = parse_i64(name, v)?;
                    log.max_message_bytes =
                        usize::try_from(n).map_err(|_| format!("max.message.bytes {n} must be positive"))?;
                }
                "message.timestamp.type" => {
                    log.timestamp_type = match v.as_str() {
                        "CreateTime" => TimestampType::CreateTime,
                        "LogAppendTime" => TimestampType::LogAppendTime,
                        _ => {
                            return Err(format!(
                                "Invalid value {v} for configuration message.timestamp.type: must be CreateTime or LogAppendTime"
                            ))
                        }
                    }
                }
                "min.insync.replicas" => {
                    let n = parse_i64(name, v)?;
                    if !(1..=i64::from(i32::MAX)).contains(&n) {
                        return Err(format!("Invalid value {v} for configuration min.insync.replicas: must be at least 1"));
                    }
                    min_insync_replicas = n as i32;
                }
                "cleanup.policy" => {
                    let mut parts: Vec<&str> = v.split(',').map(str::trim).collect();
                    parts.sort_unstable();
                    parts.dedup();
                    if parts.is_empty() || parts.iter().any(|p| *p != "delete" && *p != "compact") {
                        return Err(format!(
                            "Invalid value {v} for configuration cleanup.policy: must be delete, compact or both"
                        ));
                    }
                    log.cleanup_delete = parts.contains(&"delete");
                    log.cleanup_compact = parts.contains(&"compact");
                    cleanup_policy = v.clone();
                }
                "delete.retention.ms" => log.delete_retention_ms = parse_i64(name, v)?,
                // Read by the controller's election (sluice_replication::cluster).
                "unclean.leader.election.enable" => {
                    if v != "true" && v != "false" {
                        return Err(format!(
                            "Invalid value {v} for configuration unclean.leader.election.enable: must be true or false"
                        ));
                    }
                }
                // Read by Fetch (`crate::api::fetch`): whether v0–v3 fetchers get
                // message sets converted from the stored batches.
                "message.downconversion.enable" => {
                    if v != "true" && v != "false" {
                        return Err(format!(
                            "Invalid value {v} for configuration message.downconversion.enable: must be true or false"
                        ));
                    }
                }
                "min.compaction.lag.ms" => log.min_compaction_lag_ms = parse_i64(name, v)?,
                "max.compaction.lag.ms" => {
                    check_inert(name, v)?;
                    log.max_compaction_lag_ms = parse_i64(name, v)?;
                }
                "segment.jitter.ms" => {
                    check_inert(name, v)?;
                    log.segment_jitter_ms = parse_i64(name, v)?;
                }
                "min.cleanable.dirty.ratio" => {
                    let r: f64 = v.trim().parse().map_err(|_| {
                        format!("Invalid value {v} for configuration min.cleanable.dirty.ratio: not a number")
                    })?;
                    if !(0.0..=1.0).contains(&r) {
                        return Err(format!(
                            "Invalid value {v} for configuration min.cleanable.dirty.ratio: must be in [0, 1]"
                        ));
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
                        _ => return Err(format!("Invalid value {v} for configuration flush.ms: must be >= 0")),
                    };
                }
                _ => return Err(format!("Unknown topic config name: {name}")),
            }
        }
        log.validate()
            .map_err(|e| format!("Invalid configuration: {e}"))?;
        Ok(TopicConfig {
            log,
            min_insync_replicas,
            cleanup_policy,
            timestamp_before_max_ms: before.or(difference).unwrap_or(i64::MAX),
            timestamp_after_max_ms: after.or(difference).unwrap_or(i64::MAX),
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

/// Kafka's topic name rules: 1..=249 chars of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("Topic name is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("Topic name cannot be \"{name}\""));
    }
    if name.len() > 249 {
        return Err(format!(
            "Topic name is longer than 249 characters: {} characters",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "Topic name \"{name}\" is illegal: character {c:?} is not in [a-zA-Z0-9._-]"
        ));
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
            ("remote.storage.enable", "true"),
            ("preallocate", "yes"),
            ("segment.jitter.ms", "-1"),
            ("compression.gzip.level", "10"),
            ("message.timestamp.after.max.ms", "-1"),
            ("leader.replication.throttled.replicas", "0:x"),
        ] {
            let e = TopicConfig::parse(&set(&[(k, v)])).unwrap_err();
            assert!(!e.is_empty(), "{k}={v}");
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
        for n in ACCEPTED_WITHOUT_EFFECT {
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
    fn topic_names() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a b", "ü", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad}");
        }
    }
}
