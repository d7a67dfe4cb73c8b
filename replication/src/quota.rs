//! Client quotas (Kafka's KIP-13/KIP-55 model, DescribeClientQuotas/AlterClientQuotas):
//! byte rates per user and client id, kept in the metadata quorum
//! ([`crate::cluster::ClusterState::quotas`]), and the pure parts of enforcing them: which
//! quota applies to a (user, client id) ([`resolve`]) and a rate over a sliding window
//! ([`RateWindow`]) with the throttle time that brings a client back under its quota.
//!
//! An entity names a user, a client id or both, each by name or as the default
//! (`<default>`); the quota of a request is the first entity in Kafka's order that has the
//! key: user and client id, user and default client, user, default user and client id,
//! default user and default client, default user, client id, default client. Clients
//! matching one entity share its quota (every client id of `user=alice` shares alice's),
//! except that a default is each user's or client's own.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

/// The quota keys Sluice enforces: bytes per second produced, fetched, and the share of
/// one thread's time spent on the client's requests (percent; 100 = one whole thread).
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
/// Kafka's other keys, refused with a reason (not enforced here).
pub const NOT_ENFORCED: &[&str] = &["controller_mutation_rate", "connection_creation_rate"];
/// The keys enforced.
pub const ENFORCED: &[&str] = &[PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE];

/// Kafka's entity types.
pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";

/// One component of an entity: absent, the default, or a name.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntityName {
    Default,
    Named(String),
}

/// A quota entity: a user, a client id, or both.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaEntity {
    pub user: Option<EntityName>,
    pub client_id: Option<EntityName>,
}

/// The quotas set on one entity (key → value; values as Kafka's doubles, printed).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ClientQuota {
    pub entity: QuotaEntity,
    pub values: BTreeMap<String, String>,
}

/// One change of `Command::AlterClientQuotas`: set a key, or remove it (`None`).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct QuotaChange {
    pub entity: QuotaEntity,
    pub key: String,
    pub value: Option<String>,
}

/// Why a change is refused (Kafka: INVALID_REQUEST with the text).
pub fn validate(change: &QuotaChange) -> Result<(), String> {
    if change.entity.user.is_none() && change.entity.client_id.is_none() {
        return Err("an entity names a user, a client id or both".into());
    }
    for name in [&change.entity.user, &change.entity.client_id]
        .into_iter()
        .flatten()
    {
        if *name == EntityName::Named(String::new()) {
            return Err("an empty entity name (the default is a null name)".into());
        }
    }
    if change.value.is_none() {
        // Removing a key is never refused (Kafka checks what is set, not what goes).
        return Ok(());
    }
    if NOT_ENFORCED.contains(&change.key.as_str()) {
        return Err(format!(
            "{} is not enforced by Sluice: only {} are",
            change.key,
            ENFORCED.join(", ")
        ));
    }
    if !ENFORCED.contains(&change.key.as_str()) {
        return Err(format!("unknown quota key {}", change.key));
    }
    if let Some(v) = &change.value {
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => {}
            _ => return Err(format!("{} must be a positive number, not {v}", change.key)),
        }
    }
    Ok(())
}

/// Applies changes to the sorted list of quotas (an entity with no key left goes).
pub fn apply(quotas: &mut Vec<ClientQuota>, changes: &[QuotaChange]) {
    for c in changes {
        let at = quotas.binary_search_by(|q| q.entity.cmp(&c.entity));
        match (&c.value, at) {
            (Some(v), Ok(i)) => {
                quotas[i].values.insert(c.key.clone(), v.clone());
            }
            (Some(v), Err(i)) => quotas.insert(
                i,
                ClientQuota {
                    entity: c.entity.clone(),
                    values: [(c.key.clone(), v.clone())].into(),
                },
            ),
            (None, Ok(i)) => {
                quotas[i].values.remove(&c.key);
                if quotas[i].values.is_empty() {
                    quotas.remove(i);
                }
            }
            (None, Err(_)) => {}
        }
    }
}

/// The quota `key` for a client: its value and the key its usage is tracked under
/// (user, client id: empty where the entity does not name that component), or `None`
/// when no entity sets it.
pub fn resolve(
    quotas: &[ClientQuota],
    key: &str,
    user: &str,
    client_id: &str,
) -> Option<(f64, (String, String))> {
    use EntityName::{Default, Named};
    let named = |s: &str| Some(Named(s.to_string()));
    let order = [
        (named(user), named(client_id)),
        (named(user), Some(Default)),
        (named(user), None),
        (Some(Default), named(client_id)),
        (Some(Default), Some(Default)),
        (Some(Default), None),
        (None, named(client_id)),
        (None, Some(Default)),
    ];
    for (u, c) in order {
        let entity = QuotaEntity {
            user: u,
            client_id: c,
        };
        let Ok(i) = quotas.binary_search_by(|q| q.entity.cmp(&entity)) else {
            continue;
        };
        let Some(value) = quotas[i]
            .values
            .get(key)
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let tracked = (
            if entity.user.is_some() {
                user.to_string()
            } else {
                String::new()
            },
            if entity.client_id.is_some() {
                client_id.to_string()
            } else {
                String::new()
            },
        );
        return Some((value, tracked));
    }
    None
}

/// Kafka's quota window: 11 samples of 1 s (`quota.window.num`, `quota.window.size.seconds`).
pub const SAMPLES: usize = 11;
pub const SAMPLE_MS: u64 = 1000;

/// Bytes per sample over the last [`SAMPLES`] seconds.
#[derive(Debug, Clone, Default)]
pub struct RateWindow {
    /// (sample start in ms, bytes), oldest first.
    samples: std::collections::VecDeque<(u64, f64)>,
    first_ms: Option<u64>,
}

impl RateWindow {
    fn expire(&mut self, now_ms: u64) {
        let horizon = now_ms.saturating_sub(SAMPLES as u64 * SAMPLE_MS);
        while self
            .samples
            .front()
            .is_some_and(|(start, _)| *start + SAMPLE_MS <= horizon)
        {
            self.samples.pop_front();
        }
    }

    /// Adds `bytes` at `now_ms`.
    pub fn record(&mut self, bytes: f64, now_ms: u64) {
        self.expire(now_ms);
        self.first_ms.get_or_insert(now_ms);
        let start = now_ms - now_ms % SAMPLE_MS;
        match self.samples.back_mut() {
            Some((s, b)) if *s == start => *b += bytes,
            _ => self.samples.push_back((start, bytes)),
        }
    }

    /// Takes back bytes recorded at `now_ms` (a throttled fetch that sends nothing).
    pub fn unrecord(&mut self, bytes: f64, now_ms: u64) {
        let start = now_ms - now_ms % SAMPLE_MS;
        if let Some((s, b)) = self.samples.back_mut() {
            if *s == start {
                *b = (*b - bytes).max(0.0);
            }
        }
    }

    /// The window's length as Kafka measures a rate: the full samples before the
    /// current one plus the elapsed part of it, at least `SAMPLES - 1` samples once
    /// the window has been running that long (a new client is not judged on its first
    /// millisecond).
    fn window_ms(&self, now_ms: u64) -> f64 {
        let oldest = self.samples.front().map_or(now_ms, |(s, _)| *s);
        let elapsed = (now_ms - oldest).max(1);
        let floor = (SAMPLES as u64 - 1) * SAMPLE_MS;
        elapsed.max(floor) as f64
    }

    /// Bytes per second over the window.
    pub fn rate(&mut self, now_ms: u64) -> f64 {
        self.expire(now_ms);
        let total: f64 = self.samples.iter().map(|(_, b)| b).sum();
        total * 1000.0 / self.window_ms(now_ms)
    }

    /// How long the client must pause so the window's rate falls back to `quota`
    /// (Kafka's `(rate - quota) / quota * window`), 0 when within it.
    pub fn throttle_ms(&mut self, quota: f64, now_ms: u64) -> u64 {
        let rate = self.rate(now_ms);
        if rate <= quota {
            return 0;
        }
        let window = self.window_ms(now_ms);
        (((rate - quota) / quota) * window).round() as u64
    }

    /// True once nothing is left in the window (the tracker may be dropped).
    pub fn idle(&mut self, now_ms: u64) -> bool {
        self.expire(now_ms);
        self.samples.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EntityName::*;

    fn q(user: Option<EntityName>, client_id: Option<EntityName>, v: &str) -> QuotaChange {
        QuotaChange {
            entity: QuotaEntity { user, client_id },
            key: PRODUCER_BYTE_RATE.into(),
            value: Some(v.into()),
        }
    }

    #[test]
    fn the_most_specific_entity_wins_in_kafkas_order() {
        let mut quotas = Vec::new();
        apply(
            &mut quotas,
            &[
                q(None, Some(Default), "1"),
                q(Some(Default), None, "2"),
                q(Some(Named("alice".into())), None, "3"),
                q(Some(Named("alice".into())), Some(Named("app".into())), "4"),
                q(None, Some(Named("tool".into())), "5"),
            ],
        );
        let r =
            |quotas: &[ClientQuota], u: &str, c: &str| resolve(quotas, PRODUCER_BYTE_RATE, u, c);
        assert_eq!(
            r(&quotas, "alice", "app"),
            Some((4.0, ("alice".into(), "app".into())))
        );
        assert_eq!(
            r(&quotas, "alice", "other"),
            Some((3.0, ("alice".into(), String::new())))
        );
        assert_eq!(
            r(&quotas, "bob", "tool"),
            Some((2.0, ("bob".into(), String::new()))),
            "default user before client id"
        );
        assert_eq!(resolve(&quotas, CONSUMER_BYTE_RATE, "alice", "app"), None);
        apply(
            &mut quotas,
            &[QuotaChange {
                entity: QuotaEntity {
                    user: Some(Default),
                    client_id: None,
                },
                key: PRODUCER_BYTE_RATE.into(),
                value: None,
            }],
        );
        assert_eq!(
            r(&quotas, "bob", "tool"),
            Some((5.0, (String::new(), "tool".into())))
        );
        assert_eq!(
            r(&quotas, "bob", "x"),
            Some((1.0, (String::new(), "x".into())))
        );
        assert_eq!(quotas.len(), 4, "an entity without keys goes");
    }

    #[test]
    fn changes_are_validated() {
        assert!(validate(&q(None, None, "1")).is_err());
        assert!(validate(&q(Some(Named(String::new())), None, "1")).is_err());
        assert!(validate(&q(Some(Default), None, "0")).is_err());
        assert!(validate(&q(Some(Default), None, "nan")).is_err());
        assert!(validate(&q(Some(Default), None, "1048576")).is_ok());
        let mut other = q(Some(Default), None, "50");
        other.key = "controller_mutation_rate".into();
        assert!(validate(&other).unwrap_err().contains("not enforced"));
        other.key = REQUEST_PERCENTAGE.into();
        assert!(validate(&other).is_ok());
    }

    #[test]
    fn the_throttle_brings_the_rate_back_to_the_quota() {
        let mut w = RateWindow::default();
        // 2 MB in the first second against 1 MB/s over a 10 s floor: within.
        w.record(2e6, 0);
        assert_eq!(w.throttle_ms(1e6, 500), 0);
        // 20 MB within the window: rate 2 MB/s, pause 10 s.
        w.record(18e6, 900);
        assert_eq!(w.throttle_ms(1e6, 900), 10_000);
        // The pause lowers the rate (each request is judged again as it comes).
        assert!(w.rate(900 + 10_000) < 2e6);
        // Samples older than the window are forgotten.
        assert!(w.idle(30_000));
        w.record(10.0, 30_000);
        w.unrecord(10.0, 30_000);
        assert_eq!(w.rate(30_000), 0.0);
    }
}
