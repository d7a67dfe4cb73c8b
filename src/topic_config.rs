//! Topic configs: Kafka's names and value syntax, validated, mapped onto the storage
//! crate's [`LogConfig`].
//!
//! A topic stores only the configs that were set explicitly (as strings, the way
//! clients send them); everything else is the broker default. [`TopicConfig::parse`]
//! is the one place that checks values, so CreateTopics, IncrementalAlterConfigs and
//! start-up all accept exactly the same things.

use std::collections::BTreeMap;

use sluice_storage::{FlushPolicy, LogConfig, TimestampType};

/// Every topic config Sluice knows, with its default as Kafka prints it.
pub const KNOWN: &[(&str, &str)] = &[
    ("cleanup.policy", "delete"),
    ("delete.retention.ms", "86400000"),
    ("flush.ms", "0"),
    ("max.message.bytes", "1048588"),
    ("message.downconversion.enable", "true"),
    ("message.timestamp.type", "CreateTime"),
    ("min.cleanable.dirty.ratio", "0.5"),
    ("min.compaction.lag.ms", "0"),
    // Unset, the effective value is min(2, replication factor): an acks=all write is on
    // at least two replicas whenever the topic has two (Kafka's default is 1).
    ("min.insync.replicas", "2"),
    ("retention.bytes", "1099511627776"),
    ("retention.ms", "604800000"),
    ("segment.bytes", "1073741824"),
    ("segment.ms", "604800000"),
    ("unclean.leader.election.enable", "false"),
];

/// A parsed topic configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    pub log: LogConfig,
    pub min_insync_replicas: i32,
    pub cleanup_policy: String,
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
        for (name, v) in set {
            match name.as_str() {
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
        ] {
            let e = TopicConfig::parse(&set(&[(k, v)])).unwrap_err();
            assert!(!e.is_empty(), "{k}={v}");
        }
    }

    #[test]
    fn topic_names() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a b", "ü", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad}");
        }
    }
}
