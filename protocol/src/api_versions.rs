//! ApiVersions (key 18): generated from [`crate::REGISTRY`].
//!
//! No tagged fields are ever sent (no SupportedFeatures, FinalizedFeatures or
//! ZkMigrationReady): librdkafka before 2.2 (Debian's kcat 1.7.1 has 2.0.2) mis-skips
//! them in v3 responses and then fails the connection. `kafka-protocol` writes tagged
//! fields only when they differ from their defaults, so leaving them default is enough.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};

use crate::REGISTRY;

fn api_keys() -> Vec<ApiVersion> {
    REGISTRY
        .iter()
        .map(|s| {
            ApiVersion::default()
                .with_api_key(s.key as i16)
                .with_min_version(s.min)
                .with_max_version(s.max)
        })
        .collect()
}

pub fn handle(_version: i16) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(api_keys())
}

/// The answer to an ApiVersions request of a version this broker does not know,
/// encoded as v0 so that any client can read it: UNSUPPORTED_VERSION and, as Kafka
/// since KIP-511, the ApiVersions range alone (the client retries at the newest
/// version both know, then learns the rest).
pub fn unsupported() -> ApiVersionsResponse {
    let own = REGISTRY
        .iter()
        .find(|s| s.key == kafka_protocol::messages::ApiKey::ApiVersions)
        .expect("ApiVersions is registered");
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(vec![ApiVersion::default()
            .with_api_key(own.key as i16)
            .with_min_version(own.min)
            .with_max_version(own.max)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiKey, ResponseKind};

    #[test]
    fn v3_response_carries_no_tagged_fields() {
        let resp = ResponseKind::ApiVersions(handle(3));
        let frame = crate::encode_response(ApiKey::ApiVersions, 3, 7, &resp).unwrap();
        // size, correlation id (header v0), error code, compact array of keys..., then
        // throttle time and the tagged-field count, which must be 0.
        assert_eq!(*frame.last().unwrap(), 0, "empty tagged field section");
        let n_keys = REGISTRY.len();
        // 4 size + 4 corr + 2 error + 1 varint len + 7 per key (2+2+2+1 tag count) + 4 throttle + 1 tags
        assert_eq!(frame.len(), 4 + 4 + 2 + 1 + 7 * n_keys + 4 + 1);
    }
}
