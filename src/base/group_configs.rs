//! Consumer group configs by Kafka's names: the GROUP resource (type 32) of
//! DescribeConfigs and IncrementalAlterConfigs (Kafka 3.8+, KIP-848 and KIP-932). They
//! are kept per group through the metadata quorum ([`Command::AlterGroupConfigs`]) and
//! described with their source (GROUP_CONFIG when set, else DEFAULT_CONFIG). The
//! `consumer.*` ones govern the group if it is a KIP-848 consumer group (its members'
//! session timeout and heartbeat interval, over the broker's
//! `--group-consumer-session-timeout-ms` and `--group-consumer-heartbeat-interval-ms`);
//! the `share.*` ones are kept and described without effect (share groups are not
//! served), as Kafka's own are for a classic group.
//!
//! [`Command::AlterGroupConfigs`]: sluice_replication::cluster::Command::AlterGroupConfigs

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;

use crate::base::broker_configs::{Described, SOURCE_DEFAULT};
use crate::base::error::ApiError;

/// Kafka's GROUP_CONFIG source.
pub const SOURCE_GROUP: i8 = 8;

/// (name, default, smallest, largest, documentation): Kafka's group configs and the
/// bounds its broker defaults put on them (`group.consumer.min.session.timeout.ms`
/// and the like).
pub const GROUP_CONFIGS: &[(&str, i64, i64, i64, &str)] = &[
    (
        "consumer.heartbeat.interval.ms",
        5_000,
        5_000,
        15_000,
        "How often members of a consumer group (KIP-848) heartbeat.",
    ),
    (
        "consumer.session.timeout.ms",
        45_000,
        45_000,
        60_000,
        "How long a consumer group member (KIP-848) may go without heartbeating before it is removed.",
    ),
    (
        "share.heartbeat.interval.ms",
        5_000,
        5_000,
        15_000,
        "How often members of a share group (KIP-932) heartbeat.",
    ),
    (
        "share.record.lock.duration.ms",
        30_000,
        15_000,
        60_000,
        "How long a share group member holds a record it was given.",
    ),
    (
        "share.session.timeout.ms",
        45_000,
        45_000,
        60_000,
        "How long a share group member may go without heartbeating before it is removed.",
    ),
];

/// Every group config of a group whose explicit set is `own`.
pub fn describe(own: Option<&BTreeMap<String, String>>) -> Vec<Described> {
    GROUP_CONFIGS
        .iter()
        .map(|(name, default, _, _, doc)| {
            let set = own.and_then(|o| o.get(*name));
            let (value, source) = match set {
                Some(v) => (v.clone(), SOURCE_GROUP),
                None => (default.to_string(), SOURCE_DEFAULT),
            };
            let mut synonyms = vec![(name.to_string(), Some(value.clone()), source)];
            if set.is_some() {
                synonyms.push((name.to_string(), Some(default.to_string()), SOURCE_DEFAULT));
            }
            Described {
                name: name.to_string(),
                value: Some(value),
                source,
                read_only: false,
                synonyms,
                documentation: doc.to_string(),
            }
        })
        .collect()
}

/// Checks a group's new explicit set as Kafka's GroupConfig does: known names, values
/// within their bounds, and each heartbeat interval below its session timeout
/// (INVALID_CONFIG otherwise).
pub fn check(set: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let invalid = |m: String| ApiError::with(ResponseError::InvalidConfig, m);
    let mut effective: BTreeMap<&str, i64> =
        GROUP_CONFIGS.iter().map(|(n, d, ..)| (*n, *d)).collect();
    for (name, value) in set {
        let Some((n, _, min, max, _)) = GROUP_CONFIGS.iter().find(|(n, ..)| n == name) else {
            return Err(invalid(format!("Unknown group config name: {name}")));
        };
        let v: i64 = value.trim().parse().map_err(|_| {
            invalid(format!(
                "Invalid value {value} for configuration {name}: Not a number of type INT"
            ))
        })?;
        if !(*min..=*max).contains(&v) {
            return Err(invalid(format!(
                "Invalid value {v} for configuration {name}: must be between {min} and {max}"
            )));
        }
        effective.insert(n, v);
    }
    for kind in ["consumer", "share"] {
        let hb = effective[format!("{kind}.heartbeat.interval.ms").as_str()];
        let session = effective[format!("{kind}.session.timeout.ms").as_str()];
        if hb >= session {
            return Err(invalid(format!(
                "{kind}.heartbeat.interval.ms must be less than {kind}.session.timeout.ms"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn group_configs_are_described_and_checked_as_kafkas() {
        let d = describe(None);
        assert_eq!(d.len(), GROUP_CONFIGS.len());
        assert!(d.iter().all(|x| x.source == SOURCE_DEFAULT));
        let own = set(&[("consumer.session.timeout.ms", "50000")]);
        let d = describe(Some(&own));
        let s = d
            .iter()
            .find(|x| x.name == "consumer.session.timeout.ms")
            .unwrap();
        assert_eq!(
            (s.value.as_deref(), s.source),
            (Some("50000"), SOURCE_GROUP)
        );
        assert!(check(&own).is_ok());
        for bad in [
            set(&[("consumer.session.timeout.ms", "1000")]),
            set(&[("consumer.session.timeout.ms", "soon")]),
            set(&[("no.such.config", "1")]),
            set(&[
                ("share.heartbeat.interval.ms", "15000"),
                ("share.session.timeout.ms", "45000"),
            ])
            .into_iter()
            .chain([("share.session.timeout.ms".to_string(), "15000".to_string())])
            .collect(),
        ] {
            let e = check(&bad).unwrap_err();
            assert_eq!(e.code(), ResponseError::InvalidConfig.code(), "{bad:?}");
        }
    }
}
