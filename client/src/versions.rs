//! ApiVersions negotiation: what a broker supports, and the highest version both sides
//! speak.

use std::collections::BTreeMap;

use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

use crate::error::{code_err, Error, Result};

/// What a broker said it supports: (min, max) per API key.
#[derive(Debug, Clone, Default)]
pub struct Versions(pub BTreeMap<i16, (i16, i16)>);

impl Versions {
    /// The ranges of an ApiVersions response, or its error.
    pub fn from_response(r: &ApiVersionsResponse) -> Result<Versions> {
        code_err("ApiVersions", r.error_code)?;
        Ok(Versions(
            r.api_keys
                .iter()
                .map(|k| (k.api_key, (k.min_version, k.max_version)))
                .collect(),
        ))
    }

    /// The highest version of `key` in both the broker's range and `ours` (inclusive),
    /// or `None` when they do not overlap.
    pub fn pick(&self, key: ApiKey, ours: (i16, i16)) -> Option<i16> {
        self.require(key, ours).ok()
    }

    /// As [`Versions::pick`], saying why there is no common version.
    pub fn require(&self, key: ApiKey, ours: (i16, i16)) -> Result<i16> {
        let broker = *self.0.get(&(key as i16)).ok_or(Error::Unsupported(key))?;
        let v = broker.1.min(ours.1);
        if v < broker.0.max(ours.0) {
            return Err(Error::NoCommonVersion { key, ours, broker });
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_takes_the_highest_common_version() {
        let v = Versions(
            [
                (ApiKey::Metadata as i16, (0, 12)),
                (ApiKey::DescribeCluster as i16, (0, 0)),
            ]
            .into_iter()
            .collect(),
        );
        assert_eq!(v.pick(ApiKey::Metadata, (1, 9)), Some(9));
        assert_eq!(v.pick(ApiKey::DescribeCluster, (0, 1)), Some(0));
        assert_eq!(v.pick(ApiKey::DescribeCluster, (1, 1)), None);
        assert_eq!(v.pick(ApiKey::Produce, (3, 9)), None);
        assert_eq!(
            v.require(ApiKey::Produce, (3, 9)).unwrap_err().to_string(),
            "broker does not support Produce"
        );
        assert_eq!(
            v.require(ApiKey::DescribeCluster, (1, 1))
                .unwrap_err()
                .to_string(),
            "no common version for DescribeCluster: ours 1-1, broker 0-0"
        );
    }
}
