//! `sluice-protocol`: the Kafka wire layer, pure — bytes in, values or a structured
//! error out; no I/O, no async, no broker state — so it is unit-tested per API version
//! and fuzzed (`fuzz/`, whose target is [`fuzz_decode`]).
//!
//! Owns the one registry of the APIs and versions the broker serves ([`REGISTRY`]:
//! ApiVersions is generated from it and [`parse`] refuses anything outside it), request
//! frame decoding over the `kafka-protocol` codecs, response frame encoding, Kafka's
//! answer to unsupported requests ([`unsupported_response`]), the API error type ([`ApiError`]: a Kafka error code
//! and a message), partition keys ([`TopicPartition`], looked up without allocating),
//! and the process allocator that keeps hostile array lengths from aborting the
//! process ([`alloc`]).

pub mod alloc;
pub mod api_versions;
mod error;
pub mod legacy;
pub mod partition;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

pub use error::{ApiError, RecordError};
pub use partition::{PartitionKey, TopicPartition, TopicPartitionRef};

/// Unit tests decode on the broker's own allocator, as production does (see [`alloc`]),
/// counting allocations per thread.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: alloc::counting::Counting = alloc::counting::Counting;

/// A Kafka string (kafka-protocol's `StrBytes`) from a Rust one.
pub fn sb(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

/// One API this broker serves, with the versions it accepts.
#[derive(Debug, Clone, Copy)]
pub struct ApiSpec {
    pub key: ApiKey,
    pub min: i16,
    pub max: i16,
}

const fn spec(key: ApiKey, min: i16, max: i16) -> ApiSpec {
    ApiSpec { key, min, max }
}

/// The one registry of supported APIs and versions. ApiVersions is generated from it
/// and [`parse`] refuses anything outside it. Ranges start where Kafka 3.9's start
/// (versions older than `kafka-protocol` has are decoded by [`legacy`]) or where the
/// codec starts, and stop before versions whose semantics Sluice lacks (Produce v13+
/// addresses topics by id only; Fetch v13 does too and is served, v14+ (tiered storage,
/// KIP-903 replica state) is not; Metadata v13 is untested with old clients).
pub const REGISTRY: &[ApiSpec] = &[
    spec(ApiKey::Produce, 0, 12),
    spec(ApiKey::Fetch, 0, 13),
    spec(ApiKey::ListOffsets, 0, 9),
    spec(ApiKey::Metadata, 0, 12),
    spec(ApiKey::ApiVersions, 0, 3),
    spec(ApiKey::CreateTopics, 2, 7),
    spec(ApiKey::DeleteTopics, 1, 6),
    spec(ApiKey::DeleteRecords, 0, 2),
    spec(ApiKey::DescribeConfigs, 1, 4),
    spec(ApiKey::CreatePartitions, 0, 3),
    // Preferred and unclean elections on request (KIP-460).
    spec(ApiKey::ElectLeaders, 0, 2),
    // Moving replicas between brokers (KIP-455; v1: KIP-860's replication factor guard).
    spec(ApiKey::AlterPartitionReassignments, 0, 1),
    spec(ApiKey::ListPartitionReassignments, 0, 0),
    spec(ApiKey::DescribeQuorum, 0, 1),
    // Voters change one at a time while the quorum runs (KIP-853).
    spec(ApiKey::AddRaftVoter, 0, 0),
    spec(ApiKey::RemoveRaftVoter, 0, 0),
    // A stopped, emptied broker leaves the cluster (a voter stays one: RemoveRaftVoter).
    spec(ApiKey::UnregisterBroker, 0, 0),
    spec(ApiKey::AlterConfigs, 0, 2),
    spec(ApiKey::IncrementalAlterConfigs, 0, 1),
    spec(ApiKey::DescribeCluster, 0, 1),
    // v4 (KIP-827) adds the volume's total and usable bytes.
    spec(ApiKey::DescribeLogDirs, 0, 4),
    // One data directory per broker: nothing ever moves (answers as Kafka's).
    spec(ApiKey::AlterReplicaLogDirs, 0, 2),
    // KIP-966 paginated topic descriptions (no eligible leader replicas in Sluice).
    spec(ApiKey::DescribeTopicPartitions, 0, 0),
    // Exactly-once. InitProducerId v6 adds KIP-939 two-phase commit: not served.
    spec(ApiKey::InitProducerId, 0, 5),
    // Transactions with client transaction version 0/1 semantics: the versions after
    // these carry KIP-890 part 2 (epoch bump per transaction), not served.
    // v4: batched, and verify-only for partition leaders (KIP-890 part 1).
    spec(ApiKey::AddPartitionsToTxn, 0, 4),
    spec(ApiKey::AddOffsetsToTxn, 0, 3),
    spec(ApiKey::EndTxn, 0, 3),
    // WriteTxnMarkers v0 is gone from Kafka 4 and from the codec.
    spec(ApiKey::WriteTxnMarkers, 1, 1),
    spec(ApiKey::TxnOffsetCommit, 0, 3),
    spec(ApiKey::DescribeTransactions, 0, 0),
    spec(ApiKey::DescribeProducers, 0, 0),
    spec(ApiKey::ListTransactions, 0, 1),
    // Replication: followers truncate with it; KIP-320 clients validate positions.
    spec(ApiKey::OffsetForLeaderEpoch, 0, 4),
    // Consumer groups (the broker's group shell). OffsetCommit v9 and OffsetFetch v9 carry the
    // KIP-848 member epoch (v10 names topics by id: not served); FindCoordinator v5+ adds
    // share groups: not served.
    spec(ApiKey::FindCoordinator, 0, 4),
    spec(ApiKey::JoinGroup, 0, 9),
    spec(ApiKey::SyncGroup, 0, 5),
    spec(ApiKey::Heartbeat, 0, 4),
    spec(ApiKey::LeaveGroup, 0, 5),
    spec(ApiKey::OffsetCommit, 0, 9),
    spec(ApiKey::OffsetFetch, 0, 9),
    spec(ApiKey::OffsetDelete, 0, 0),
    // v6 answers a consumer group GROUP_ID_NOT_FOUND: v5 and below show it Dead.
    spec(ApiKey::DescribeGroups, 0, 5),
    // v5 filters by group type and names it (KIP-848).
    spec(ApiKey::ListGroups, 0, 5),
    // The next consumer group protocol (KIP-848); v1 clients name themselves (KIP-1082).
    spec(ApiKey::ConsumerGroupHeartbeat, 0, 1),
    spec(ApiKey::ConsumerGroupDescribe, 0, 1),
    spec(ApiKey::DeleteGroups, 0, 2),
    // SASL (PLAIN, SCRAM-SHA-256/512) on SASL listeners; v0 handshakes carry the tokens
    // in bare frames, v1 in SaslAuthenticate. v2 adds KIP-368 re-authentication.
    spec(ApiKey::SaslHandshake, 0, 1),
    spec(ApiKey::SaslAuthenticate, 0, 2),
    // SCRAM credentials in the metadata quorum (KIP-554).
    spec(ApiKey::DescribeUserScramCredentials, 0, 0),
    spec(ApiKey::AlterUserScramCredentials, 0, 0),
    // Kafka ACLs in the metadata quorum, checked by `--authorizer`; v0 (no pattern
    // type) is gone from Kafka 4 and from the codec.
    spec(ApiKey::DescribeAcls, 1, 3),
    spec(ApiKey::CreateAcls, 1, 3),
    spec(ApiKey::DeleteAcls, 1, 3),
    // Byte-rate quotas per user and client id.
    spec(ApiKey::DescribeClientQuotas, 0, 1),
    spec(ApiKey::AlterClientQuotas, 0, 1),
];

pub fn lookup(api_key: i16) -> Option<&'static ApiSpec> {
    REGISTRY.iter().find(|s| s.key as i16 == api_key)
}

/// A decoded request.
#[derive(Debug)]
pub struct Request {
    pub api_key: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    pub body: RequestKind,
}

/// What [`parse`] makes of a frame.
#[derive(Debug)]
pub enum Parsed {
    Request(Box<Request>),
    /// Unknown API key or a version outside the registry: answered, not decoded.
    Unsupported {
        api_key: i16,
        version: i16,
        correlation_id: i32,
    },
}

/// A frame that cannot be answered: the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame of {0} bytes is shorter than a request header")]
    TooShort(usize),
    #[error("malformed {api:?} v{version} request: {reason}")]
    Malformed {
        api: ApiKey,
        version: i16,
        reason: String,
    },
}

/// The fuzz target's body (fuzz/fuzz_targets/decode_request.rs), shared with the
/// corpus-replay unit test so that `make test` runs exactly what the fuzzer runs: any
/// input gives a request, an "unsupported" answer or a decode error, never a panic.
pub fn fuzz_decode(data: &[u8]) {
    if let Ok(Parsed::Request(req)) = parse(Bytes::copy_from_slice(data)) {
        // Touch the decoded request so the optimiser keeps the decode.
        std::hint::black_box(&req);
    }
}

/// Decodes one request frame (the bytes after the 4-byte size). Pure.
pub fn parse(frame: Bytes) -> Result<Parsed, DecodeError> {
    if frame.len() < 8 {
        return Err(DecodeError::TooShort(frame.len()));
    }
    // The first fields of every request header version: api key, version, correlation id.
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Some(spec) = lookup(api_key).filter(|s| (s.min..=s.max).contains(&version)) else {
        return Ok(Parsed::Unsupported {
            api_key,
            version,
            correlation_id,
        });
    };
    let key = spec.key;
    let malformed = |e: anyhow::Error| DecodeError::Malformed {
        api: key,
        version,
        reason: e.to_string(),
    };
    let mut buf = frame;
    let header =
        RequestHeader::decode(&mut buf, key.request_header_version(version)).map_err(malformed)?;
    let body = if legacy::handles(key, version) {
        legacy::decode_request(key, version, &mut buf)
    } else {
        RequestKind::decode(key, &mut buf, version)
    }
    .map_err(malformed)?;
    Ok(Parsed::Request(Box::new(Request {
        api_key: key,
        version,
        header,
        body,
    })))
}

/// Encodes a response frame: size, header (the version the API's version implies), body.
pub fn encode_response(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    resp: &ResponseKind,
) -> Result<Bytes, String> {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header
        .encode(&mut buf, api_key.response_header_version(version))
        .map_err(|e| e.to_string())?;
    if legacy::handles(api_key, version) {
        legacy::encode_response(api_key, version, resp, &mut buf)
    } else {
        resp.encode(&mut buf, version)
    }
    .map_err(|e| e.to_string())?;
    let size = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// Kafka's answer to a request of an unknown API key or of a version outside the
/// registry. ApiVersions is the one API a client may send at a version the broker does
/// not know (it sends its newest and falls back): Kafka answers it as v0, with
/// UNSUPPORTED_VERSION and, since KIP-511, only the ApiVersions range, so the client
/// retries at the newest version both know. Anything else Kafka refuses while parsing
/// the request header and closes the connection without a response (a frame of the
/// correlation id and an error code is readable by no client: every response body has
/// its own layout): `None` means close.
pub fn unsupported_response(api_key: i16, correlation_id: i32) -> Option<Bytes> {
    if api_key != ApiKey::ApiVersions as i16 {
        return None;
    }
    let resp = ResponseKind::ApiVersions(api_versions::unsupported());
    encode_response(ApiKey::ApiVersions, 0, correlation_id, &resp).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsRequest;

    fn frame(key: ApiKey, version: i16, body: &impl Encodable) -> Bytes {
        let mut buf = BytesMut::new();
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(42)
            .with_client_id(Some(sb("test")));
        header
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    #[test]
    fn registry_is_within_what_the_codec_supports() {
        for s in REGISTRY {
            let v = s.key.valid_versions();
            let min = legacy::lowest_version(s.key);
            assert!(min <= s.min && s.max <= v.max, "{:?}", s.key);
        }
    }

    #[test]
    fn parses_every_registered_version() {
        for v in 0..=3 {
            let f = frame(ApiKey::ApiVersions, v, &ApiVersionsRequest::default());
            match parse(f).unwrap() {
                Parsed::Request(r) => {
                    assert_eq!(r.version, v);
                    assert_eq!(r.header.correlation_id, 42);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn every_registered_api_and_version_decodes_a_default_request() {
        for s in REGISTRY {
            for v in s.min..=s.max {
                let mut body = BytesMut::new();
                // Encode the default request of this API at this version, then parse it back.
                let default = default_request(s.key);
                legacy::encode_request(v, &default, &mut body)
                    .unwrap_or_else(|e| panic!("{:?} v{v}: {e}", s.key));
                let mut f = BytesMut::new();
                RequestHeader::default()
                    .with_request_api_key(s.key as i16)
                    .with_request_api_version(v)
                    .encode(&mut f, s.key.request_header_version(v))
                    .unwrap();
                f.extend_from_slice(&body);
                assert!(
                    matches!(parse(f.freeze()), Ok(Parsed::Request(_))),
                    "{:?} v{v}",
                    s.key
                );
            }
        }
    }

    fn default_request(key: ApiKey) -> RequestKind {
        use kafka_protocol::messages::*;
        match key {
            ApiKey::Produce => RequestKind::Produce(ProduceRequest::default()),
            ApiKey::Fetch => RequestKind::Fetch(FetchRequest::default()),
            ApiKey::ListOffsets => RequestKind::ListOffsets(ListOffsetsRequest::default()),
            ApiKey::Metadata => RequestKind::Metadata(MetadataRequest::default()),
            ApiKey::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
            ApiKey::CreateTopics => RequestKind::CreateTopics(CreateTopicsRequest::default()),
            ApiKey::DeleteTopics => RequestKind::DeleteTopics(DeleteTopicsRequest::default()),
            ApiKey::DeleteRecords => RequestKind::DeleteRecords(DeleteRecordsRequest::default()),
            ApiKey::DescribeConfigs => {
                RequestKind::DescribeConfigs(DescribeConfigsRequest::default())
            }
            ApiKey::CreatePartitions => {
                RequestKind::CreatePartitions(CreatePartitionsRequest::default())
            }
            ApiKey::ElectLeaders => RequestKind::ElectLeaders(ElectLeadersRequest::default()),
            ApiKey::AlterPartitionReassignments => RequestKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsRequest::default(),
            ),
            ApiKey::ListPartitionReassignments => {
                RequestKind::ListPartitionReassignments(ListPartitionReassignmentsRequest::default())
            }
            ApiKey::DescribeQuorum => RequestKind::DescribeQuorum(DescribeQuorumRequest::default()),
            ApiKey::UnregisterBroker => {
                RequestKind::UnregisterBroker(UnregisterBrokerRequest::default())
            }
            ApiKey::AddRaftVoter => RequestKind::AddRaftVoter(AddRaftVoterRequest::default()),
            ApiKey::RemoveRaftVoter => {
                RequestKind::RemoveRaftVoter(RemoveRaftVoterRequest::default())
            }
            ApiKey::AlterConfigs => RequestKind::AlterConfigs(AlterConfigsRequest::default()),
            ApiKey::IncrementalAlterConfigs => {
                RequestKind::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::default())
            }
            ApiKey::DescribeCluster => {
                RequestKind::DescribeCluster(DescribeClusterRequest::default())
            }
            ApiKey::DescribeLogDirs => {
                RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default())
            }
            ApiKey::FindCoordinator => {
                RequestKind::FindCoordinator(FindCoordinatorRequest::default())
            }
            ApiKey::JoinGroup => RequestKind::JoinGroup(JoinGroupRequest::default()),
            ApiKey::SyncGroup => RequestKind::SyncGroup(SyncGroupRequest::default()),
            ApiKey::Heartbeat => RequestKind::Heartbeat(HeartbeatRequest::default()),
            ApiKey::LeaveGroup => RequestKind::LeaveGroup(LeaveGroupRequest::default()),
            ApiKey::OffsetCommit => RequestKind::OffsetCommit(OffsetCommitRequest::default()),
            ApiKey::OffsetFetch => RequestKind::OffsetFetch(OffsetFetchRequest::default()),
            ApiKey::OffsetDelete => RequestKind::OffsetDelete(OffsetDeleteRequest::default()),
            ApiKey::DescribeGroups => RequestKind::DescribeGroups(DescribeGroupsRequest::default()),
            ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
            ApiKey::ConsumerGroupHeartbeat => {
                RequestKind::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest::default())
            }
            ApiKey::ConsumerGroupDescribe => {
                RequestKind::ConsumerGroupDescribe(ConsumerGroupDescribeRequest::default())
            }
            ApiKey::DeleteGroups => RequestKind::DeleteGroups(DeleteGroupsRequest::default()),
            ApiKey::SaslHandshake => RequestKind::SaslHandshake(SaslHandshakeRequest::default()),
            ApiKey::SaslAuthenticate => {
                RequestKind::SaslAuthenticate(SaslAuthenticateRequest::default())
            }
            ApiKey::DescribeUserScramCredentials => RequestKind::DescribeUserScramCredentials(
                DescribeUserScramCredentialsRequest::default(),
            ),
            ApiKey::AlterUserScramCredentials => {
                RequestKind::AlterUserScramCredentials(AlterUserScramCredentialsRequest::default())
            }
            ApiKey::DescribeAcls => RequestKind::DescribeAcls(DescribeAclsRequest::default()),
            ApiKey::CreateAcls => RequestKind::CreateAcls(CreateAclsRequest::default()),
            ApiKey::DeleteAcls => RequestKind::DeleteAcls(DeleteAclsRequest::default()),
            ApiKey::DescribeClientQuotas => {
                RequestKind::DescribeClientQuotas(DescribeClientQuotasRequest::default())
            }
            ApiKey::AlterClientQuotas => {
                RequestKind::AlterClientQuotas(AlterClientQuotasRequest::default())
            }
            ApiKey::OffsetForLeaderEpoch => {
                RequestKind::OffsetForLeaderEpoch(OffsetForLeaderEpochRequest::default())
            }
            ApiKey::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default()),
            ApiKey::AddPartitionsToTxn => {
                RequestKind::AddPartitionsToTxn(AddPartitionsToTxnRequest::default())
            }
            ApiKey::AddOffsetsToTxn => {
                RequestKind::AddOffsetsToTxn(AddOffsetsToTxnRequest::default())
            }
            ApiKey::EndTxn => RequestKind::EndTxn(EndTxnRequest::default()),
            ApiKey::WriteTxnMarkers => {
                RequestKind::WriteTxnMarkers(WriteTxnMarkersRequest::default())
            }
            ApiKey::TxnOffsetCommit => {
                RequestKind::TxnOffsetCommit(TxnOffsetCommitRequest::default())
            }
            ApiKey::DescribeTransactions => {
                RequestKind::DescribeTransactions(DescribeTransactionsRequest::default())
            }
            ApiKey::ListTransactions => {
                RequestKind::ListTransactions(ListTransactionsRequest::default())
            }
            ApiKey::DescribeProducers => {
                RequestKind::DescribeProducers(DescribeProducersRequest::default())
            }
            ApiKey::AlterReplicaLogDirs => {
                RequestKind::AlterReplicaLogDirs(AlterReplicaLogDirsRequest::default())
            }
            ApiKey::DescribeTopicPartitions => {
                RequestKind::DescribeTopicPartitions(DescribeTopicPartitionsRequest::default())
            }
            other => panic!("registry entry {other:?} has no default request here"),
        }
    }

    /// Replays the fuzz corpus through the fuzz target's body: the committed seeds
    /// (fuzz/seeds), a local `make fuzz` corpus when there is one (fuzz/corpus), and
    /// the default request of every registered API and version; each also cut at
    /// every length and with bytes flipped, so truncated frames and bad lengths are
    /// covered without the fuzzer.
    #[test]
    fn fuzz_corpus_replays_without_panics() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for dir in ["seeds/decode_request", "corpus/decode_request"] {
            if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
                for e in entries.flatten() {
                    inputs.push(std::fs::read(e.path()).expect("corpus file"));
                }
            }
        }
        let seeds = inputs.len();
        assert!(seeds >= 7, "fuzz/seeds/decode_request is missing");
        for s in REGISTRY {
            for v in s.min..=s.max {
                let mut f = BytesMut::new();
                RequestHeader::default()
                    .with_request_api_key(s.key as i16)
                    .with_request_api_version(v)
                    .with_client_id(Some(sb("c")))
                    .encode(&mut f, s.key.request_header_version(v))
                    .unwrap();
                legacy::encode_request(v, &default_request(s.key), &mut f).unwrap();
                inputs.push(f.to_vec());
            }
        }
        for input in &inputs {
            fuzz_decode(input);
            for cut in 0..input.len() {
                fuzz_decode(&input[..cut]);
            }
            for at in 0..input.len() {
                for flip in [0xffu8, 0x80, 0x01] {
                    let mut m = input.clone();
                    m[at] ^= flip;
                    fuzz_decode(&m);
                }
            }
        }
    }

    #[test]
    fn unknown_versions_and_keys_are_answered_not_decoded() {
        let f = frame(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default());
        assert!(matches!(
            parse(f).unwrap(),
            Parsed::Unsupported { version: 4, .. }
        ));
        let raw = Bytes::from_static(&[0x7f, 0x00, 0, 0, 0, 0, 0, 9, 1, 2]);
        assert!(matches!(
            parse(raw).unwrap(),
            Parsed::Unsupported {
                api_key: 0x7f00,
                correlation_id: 9,
                ..
            }
        ));
    }

    #[test]
    fn unsupported_requests_get_kafkas_answer() {
        // ApiVersions from the future: a v0 response (header v0: size, correlation id),
        // error 35, an array holding only the ApiVersions range, and no throttle time.
        let f = unsupported_response(ApiKey::ApiVersions as i16, 77).unwrap();
        let max = lookup(ApiKey::ApiVersions as i16).unwrap().max;
        let mut want = vec![0, 0, 0, 16, 0, 0, 0, 77, 0, 35, 0, 0, 0, 1, 0, 18, 0, 0];
        want.extend_from_slice(&max.to_be_bytes());
        assert_eq!(&f[..], &want[..]);
        // Any other API, known or not: no answer, the connection is closed.
        assert!(unsupported_response(ApiKey::Produce as i16, 1).is_none());
        assert!(unsupported_response(0x7f00, 1).is_none());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse(Bytes::from_static(&[0, 3])).is_err());
        // Metadata v1 with a truncated body.
        assert!(parse(Bytes::from_static(&[
            0, 3, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 5
        ]))
        .is_err());
    }
}
