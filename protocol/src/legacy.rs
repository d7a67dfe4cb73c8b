//! Codecs of the old API versions that Kafka 3.9 serves but `kafka-protocol` no longer
//! carries (Kafka 4 removed them, KIP-896): Produce v0–v2, Fetch v0–v3, ListOffsets v0,
//! OffsetCommit v0–v1, OffsetFetch v0, DescribeLogDirs v0, AlterReplicaLogDirs v0 and
//! OffsetForLeaderEpoch v0–v1. Requests decode into the crate's request
//! types and responses encode from its response types, so handlers see one type per API
//! and branch on the version only for semantics. Pure, like the rest of the crate.
//!
//! All of these versions are non-flexible (no tagged fields, i16-length strings,
//! i32-length arrays and bytes). Layouts, as the version differs from the oldest one
//! the codec has:
//!
//! | API | request | response |
//! |-----|---------|----------|
//! | Produce v0–v2 | v3 without `transactional_id` | v0: v2 without `log_append_time_ms` and `throttle_time_ms`; v1: v2 without `log_append_time_ms`; v2 = v3 |
//! | Fetch v0–v3 | v4 without `isolation_level`; v0–v2 also without `max_bytes` | v1–v3: v4 without `last_stable_offset` and `aborted_transactions`; v0 also without `throttle_time_ms` |
//! | ListOffsets v0 | v1 plus `max_num_offsets` per partition | per partition `old_style_offsets` (an array) instead of `timestamp` and `offset` |
//! | OffsetCommit v0–v1 | v2 without `retention_time_ms`; v0 also without generation and member; v1 with `commit_timestamp` per partition | = v2 |
//! | OffsetFetch v0 | = v1 | = v1 |
//! | DescribeLogDirs v0 | = v1 | = v1 |
//! | AlterReplicaLogDirs v0 | = v1 | = v1 |
//! | OffsetForLeaderEpoch v0–v1 | v2 without `current_leader_epoch` | v2 without `throttle_time_ms`; v0 also without `leader_epoch` |
//!
//! ListOffsets v0's own fields have no place in the crate's types: a decoded v0
//! partition carries its `max_num_offsets` in a tagged field no Kafka schema uses
//! ([`max_num_offsets`]), and the handler puts the `old_style_offsets` of its answer in
//! the same way ([`with_old_style_offsets`]); both exist only between this module and
//! the handler (tagged fields are never written at non-flexible versions, and the tag
//! is set only on v0 requests and answers). What the decoded request cannot carry:
//! OffsetCommit v1's `commit_timestamp` (Kafka 3.9 uses it only for the expiry of the
//! commit).

use anyhow::{bail, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::FetchResponse;
use kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse,
};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::OffsetForLeaderEpochResponse;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::ProduceResponse;
use kafka_protocol::messages::{ApiKey, BrokerId, RequestKind, ResponseKind, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// The oldest version served of each API this module extends (Kafka 3.9's oldest).
const LOWEST: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 0),
    (ApiKey::Fetch, 0),
    (ApiKey::ListOffsets, 0),
    (ApiKey::OffsetCommit, 0),
    (ApiKey::OffsetFetch, 0),
    (ApiKey::DescribeLogDirs, 0),
    (ApiKey::AlterReplicaLogDirs, 0),
    (ApiKey::OffsetForLeaderEpoch, 0),
];

/// The oldest version of `key` that can be decoded: this module's, else the codec's.
pub fn lowest_version(key: ApiKey) -> i16 {
    LOWEST
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .unwrap_or(key.valid_versions().min)
}

/// True if `version` of `key` is below the codec and this module handles it.
pub fn handles(key: ApiKey, version: i16) -> bool {
    version < key.valid_versions().min && version >= lowest_version(key)
}

/// The tag under which a ListOffsets v0 partition (request or response) carries the
/// v0-only field in the crate's types: far above any tag a Kafka schema assigns.
const V0_TAG: i32 = 0x7e57_0000;

/// The `max_num_offsets` of a partition of a decoded ListOffsets v0 request; `None` for
/// a request of another version.
pub fn max_num_offsets(p: &ListOffsetsPartition) -> Option<i32> {
    let v = p.unknown_tagged_fields.get(&V0_TAG)?;
    Some(i32::from_be_bytes(v.as_ref().try_into().ok()?))
}

/// `p` asking for up to `n` offsets at v0 (for clients and tests; [`encode_request`]
/// writes 1 for a partition without it).
pub fn with_max_num_offsets(p: ListOffsetsPartition, n: i32) -> ListOffsetsPartition {
    p.with_unknown_tagged_field(V0_TAG, Bytes::copy_from_slice(&n.to_be_bytes()))
}

/// A v0 answer's `old_style_offsets` (newest first) on a partition response; at v0 they
/// replace the partition's `offset` (which [`encode_response`] writes as the one offset
/// of a partition without them). Never set this on an answer of another version.
pub fn with_old_style_offsets(
    p: ListOffsetsPartitionResponse,
    offsets: &[i64],
) -> ListOffsetsPartitionResponse {
    let mut b = BytesMut::with_capacity(offsets.len() * 8);
    for o in offsets {
        b.put_i64(*o);
    }
    p.with_unknown_tagged_field(V0_TAG, b.freeze())
}

/// The offsets [`with_old_style_offsets`] put on `p`, if any.
pub fn old_style_offsets(p: &ListOffsetsPartitionResponse) -> Option<Vec<i64>> {
    let v = p.unknown_tagged_fields.get(&V0_TAG)?;
    Some(
        v.chunks_exact(8)
            .map(|c| i64::from_be_bytes(c.try_into().unwrap()))
            .collect(),
    )
}

/// Decodes the body of a request of a version [`handles`] accepts.
pub fn decode_request(key: ApiKey, version: i16, buf: &mut Bytes) -> Result<RequestKind> {
    Ok(match key {
        ApiKey::Produce => RequestKind::Produce(produce_request(buf)?),
        ApiKey::Fetch => RequestKind::Fetch(fetch_request(version, buf)?),
        ApiKey::ListOffsets => RequestKind::ListOffsets(list_offsets_request(buf)?),
        ApiKey::OffsetCommit => RequestKind::OffsetCommit(offset_commit_request(version, buf)?),
        ApiKey::OffsetFetch => RequestKind::OffsetFetch(Decodable::decode(buf, 1)?),
        ApiKey::DescribeLogDirs => RequestKind::DescribeLogDirs(Decodable::decode(buf, 1)?),
        ApiKey::AlterReplicaLogDirs => RequestKind::AlterReplicaLogDirs(Decodable::decode(buf, 1)?),
        ApiKey::OffsetForLeaderEpoch => {
            RequestKind::OffsetForLeaderEpoch(offset_for_leader_epoch_request(buf)?)
        }
        other => bail!("{other:?} v{version} has no legacy codec"),
    })
}

/// Encodes a request body at any decodable version (this module's or the codec's):
/// for clients and tests.
pub fn encode_request(version: i16, req: &RequestKind, out: &mut BytesMut) -> Result<()> {
    match req {
        RequestKind::Produce(r) if version < 3 => {
            out.put_i16(r.acks);
            out.put_i32(r.timeout_ms);
            put_array(out, &r.topic_data, |out, t| {
                put_str(out, Some(t.name.0.as_str()));
                put_array(out, &t.partition_data, |out, p| {
                    out.put_i32(p.index);
                    put_bytes(out, p.records.as_deref());
                });
            });
        }
        RequestKind::Fetch(r) if version < 4 => {
            out.put_i32(r.replica_id.0);
            out.put_i32(r.max_wait_ms);
            out.put_i32(r.min_bytes);
            if version == 3 {
                out.put_i32(r.max_bytes);
            }
            put_array(out, &r.topics, |out, t| {
                put_str(out, Some(t.topic.0.as_str()));
                put_array(out, &t.partitions, |out, p| {
                    out.put_i32(p.partition);
                    out.put_i64(p.fetch_offset);
                    out.put_i32(p.partition_max_bytes);
                });
            });
        }
        RequestKind::ListOffsets(r) if version < 1 => {
            out.put_i32(r.replica_id.0);
            put_array(out, &r.topics, |out, t| {
                put_str(out, Some(t.name.0.as_str()));
                put_array(out, &t.partitions, |out, p| {
                    out.put_i32(p.partition_index);
                    out.put_i64(p.timestamp);
                    out.put_i32(max_num_offsets(p).unwrap_or(1));
                });
            });
        }
        RequestKind::OffsetCommit(r) if version < 2 => {
            put_str(out, Some(r.group_id.0.as_str()));
            if version == 1 {
                out.put_i32(r.generation_id_or_member_epoch);
                put_str(out, Some(r.member_id.as_str()));
            }
            put_array(out, &r.topics, |out, t| {
                put_str(out, Some(t.name.0.as_str()));
                put_array(out, &t.partitions, |out, p| {
                    out.put_i32(p.partition_index);
                    out.put_i64(p.committed_offset);
                    if version == 1 {
                        out.put_i64(-1); // commit_timestamp: the broker's clock
                    }
                    put_str(out, p.committed_metadata.as_deref());
                });
            });
        }
        RequestKind::OffsetFetch(r) if version < 1 => r.encode(out, 1)?,
        RequestKind::DescribeLogDirs(r) if version < 1 => r.encode(out, 1)?,
        RequestKind::AlterReplicaLogDirs(r) if version < 1 => r.encode(out, 1)?,
        RequestKind::OffsetForLeaderEpoch(r) if version < 2 => {
            put_array(out, &r.topics, |out, t| {
                put_str(out, Some(t.topic.0.as_str()));
                put_array(out, &t.partitions, |out, p| {
                    out.put_i32(p.partition);
                    out.put_i32(p.leader_epoch);
                });
            });
        }
        other => other.encode(out, version)?,
    }
    Ok(())
}

/// Encodes the body of a response of a version [`handles`] accepts.
pub fn encode_response(
    key: ApiKey,
    version: i16,
    resp: &ResponseKind,
    out: &mut BytesMut,
) -> Result<()> {
    match resp {
        ResponseKind::Produce(r) if version < 2 => produce_response(version, r, out),
        // Produce v2 is v3; OffsetCommit v0–v1 are v2; OffsetFetch, DescribeLogDirs and
        // AlterReplicaLogDirs v0 are v1.
        ResponseKind::Produce(r) => r.encode(out, 3)?,
        ResponseKind::Fetch(r) => fetch_response(version, r, out),
        ResponseKind::ListOffsets(r) => list_offsets_response(r, out),
        ResponseKind::OffsetCommit(r) => r.encode(out, 2)?,
        ResponseKind::OffsetFetch(r) => r.encode(out, 1)?,
        ResponseKind::DescribeLogDirs(r) => r.encode(out, 1)?,
        ResponseKind::AlterReplicaLogDirs(r) => r.encode(out, 1)?,
        ResponseKind::OffsetForLeaderEpoch(r) => offset_for_leader_epoch_response(version, r, out),
        _ => bail!("{key:?} v{version} has no legacy codec"),
    }
    Ok(())
}

// ---- requests ----

fn need(buf: &Bytes, n: usize, what: &str) -> Result<()> {
    if buf.remaining() < n {
        bail!("truncated {what}");
    }
    Ok(())
}

fn i16_(buf: &mut Bytes) -> Result<i16> {
    need(buf, 2, "int16")?;
    Ok(buf.get_i16())
}

fn i32_(buf: &mut Bytes) -> Result<i32> {
    need(buf, 4, "int32")?;
    Ok(buf.get_i32())
}

fn i64_(buf: &mut Bytes) -> Result<i64> {
    need(buf, 8, "int64")?;
    Ok(buf.get_i64())
}

fn nullable_str(buf: &mut Bytes) -> Result<Option<StrBytes>> {
    let len = i16_(buf)?;
    if len < 0 {
        return Ok(None);
    }
    need(buf, len as usize, "string")?;
    Ok(Some(StrBytes::from_utf8(buf.split_to(len as usize))?))
}

fn str_(buf: &mut Bytes) -> Result<StrBytes> {
    match nullable_str(buf)? {
        Some(s) => Ok(s),
        None => bail!("null where a string is required"),
    }
}

fn nullable_bytes(buf: &mut Bytes) -> Result<Option<Bytes>> {
    let len = i32_(buf)?;
    if len < 0 {
        return Ok(None);
    }
    need(buf, len as usize, "bytes")?;
    Ok(Some(buf.split_to(len as usize)))
}

/// An array of `item`s; a null array is empty. The capacity reserved is bounded by the
/// bytes left, whatever the length field claims.
fn array<T>(buf: &mut Bytes, mut item: impl FnMut(&mut Bytes) -> Result<T>) -> Result<Vec<T>> {
    let n = i32_(buf)?;
    if n < 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity((n as usize).min(buf.remaining()));
    for _ in 0..n {
        out.push(item(buf)?);
    }
    Ok(out)
}

fn produce_request(buf: &mut Bytes) -> Result<ProduceRequest> {
    let acks = i16_(buf)?;
    let timeout_ms = i32_(buf)?;
    let topic_data = array(buf, |buf| {
        let name = TopicName(str_(buf)?);
        let partition_data = array(buf, |buf| {
            Ok(PartitionProduceData::default()
                .with_index(i32_(buf)?)
                .with_records(nullable_bytes(buf)?))
        })?;
        Ok(TopicProduceData::default()
            .with_name(name)
            .with_partition_data(partition_data))
    })?;
    Ok(ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(timeout_ms)
        .with_topic_data(topic_data))
}

fn fetch_request(version: i16, buf: &mut Bytes) -> Result<FetchRequest> {
    let replica_id = BrokerId(i32_(buf)?);
    let max_wait_ms = i32_(buf)?;
    let min_bytes = i32_(buf)?;
    // Before v3 only the partitions' limits bound a response.
    let max_bytes = if version >= 3 { i32_(buf)? } else { i32::MAX };
    let topics = array(buf, |buf| {
        let topic = TopicName(str_(buf)?);
        let partitions = array(buf, |buf| {
            Ok(FetchPartition::default()
                .with_partition(i32_(buf)?)
                .with_fetch_offset(i64_(buf)?)
                .with_partition_max_bytes(i32_(buf)?))
        })?;
        Ok(FetchTopic::default()
            .with_topic(topic)
            .with_partitions(partitions))
    })?;
    Ok(FetchRequest::default()
        .with_replica_id(replica_id)
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(min_bytes)
        .with_max_bytes(max_bytes)
        .with_isolation_level(0)
        .with_topics(topics))
}

fn list_offsets_request(buf: &mut Bytes) -> Result<ListOffsetsRequest> {
    let replica_id = BrokerId(i32_(buf)?);
    let topics = array(buf, |buf| {
        let name = TopicName(str_(buf)?);
        let partitions = array(buf, |buf| {
            let p = ListOffsetsPartition::default()
                .with_partition_index(i32_(buf)?)
                .with_timestamp(i64_(buf)?);
            Ok(with_max_num_offsets(p, i32_(buf)?))
        })?;
        Ok(ListOffsetsTopic::default()
            .with_name(name)
            .with_partitions(partitions))
    })?;
    Ok(ListOffsetsRequest::default()
        .with_replica_id(replica_id)
        .with_topics(topics))
}

fn offset_commit_request(version: i16, buf: &mut Bytes) -> Result<OffsetCommitRequest> {
    let group_id = str_(buf)?;
    let (generation, member) = if version >= 1 {
        (i32_(buf)?, str_(buf)?)
    } else {
        (-1, StrBytes::default())
    };
    let topics = array(buf, |buf| {
        let name = TopicName(str_(buf)?);
        let partitions = array(buf, |buf| {
            let index = i32_(buf)?;
            let offset = i64_(buf)?;
            if version >= 1 {
                let _commit_timestamp = i64_(buf)?;
            }
            Ok(OffsetCommitRequestPartition::default()
                .with_partition_index(index)
                .with_committed_offset(offset)
                .with_committed_metadata(nullable_str(buf)?))
        })?;
        Ok(OffsetCommitRequestTopic::default()
            .with_name(name)
            .with_partitions(partitions))
    })?;
    Ok(OffsetCommitRequest::default()
        .with_group_id(group_id.into())
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(member)
        .with_topics(topics))
}

fn offset_for_leader_epoch_request(buf: &mut Bytes) -> Result<OffsetForLeaderEpochRequest> {
    let topics = array(buf, |buf| {
        let topic = TopicName(str_(buf)?);
        let partitions = array(buf, |buf| {
            Ok(OffsetForLeaderPartition::default()
                .with_partition(i32_(buf)?)
                .with_leader_epoch(i32_(buf)?))
        })?;
        Ok(OffsetForLeaderTopic::default()
            .with_topic(topic)
            .with_partitions(partitions))
    })?;
    // No current leader epoch (-1: not checked) and no replica id, as the defaults.
    Ok(OffsetForLeaderEpochRequest::default().with_topics(topics))
}

// ---- responses ----

fn put_str(out: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => {
            out.put_i16(s.len() as i16);
            out.put_slice(s.as_bytes());
        }
        None => out.put_i16(-1),
    }
}

fn put_bytes(out: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            out.put_i32(b.len() as i32);
            out.put_slice(b);
        }
        None => out.put_i32(-1),
    }
}

fn put_array<T>(out: &mut BytesMut, items: &[T], mut item: impl FnMut(&mut BytesMut, &T)) {
    out.put_i32(items.len() as i32);
    for i in items {
        item(out, i);
    }
}

fn produce_response(version: i16, r: &ProduceResponse, out: &mut BytesMut) {
    put_array(out, &r.responses, |out, t| {
        put_str(out, Some(t.name.0.as_str()));
        put_array(out, &t.partition_responses, |out, p| {
            out.put_i32(p.index);
            out.put_i16(p.error_code);
            out.put_i64(p.base_offset);
        });
    });
    if version >= 1 {
        out.put_i32(r.throttle_time_ms);
    }
}

fn fetch_response(version: i16, r: &FetchResponse, out: &mut BytesMut) {
    if version >= 1 {
        out.put_i32(r.throttle_time_ms);
    }
    put_array(out, &r.responses, |out, t| {
        put_str(out, Some(t.topic.0.as_str()));
        put_array(out, &t.partitions, |out, p| {
            out.put_i32(p.partition_index);
            out.put_i16(p.error_code);
            out.put_i64(p.high_watermark);
            // The record set of these versions is not nullable: none is empty.
            put_bytes(out, Some(p.records.as_deref().unwrap_or_default()));
        });
    });
}

fn list_offsets_response(r: &ListOffsetsResponse, out: &mut BytesMut) {
    put_array(out, &r.topics, |out, t| {
        put_str(out, Some(t.name.0.as_str()));
        put_array(out, &t.partitions, |out, p| {
            out.put_i32(p.partition_index);
            out.put_i16(p.error_code);
            // The offsets found, newest first: those the handler listed, else the one
            // offset (none on an error or when nothing was found).
            let offsets = old_style_offsets(p).unwrap_or_else(|| {
                if p.error_code == 0 && p.offset >= 0 {
                    vec![p.offset]
                } else {
                    Vec::new()
                }
            });
            put_array(out, &offsets, |out, o| out.put_i64(*o));
        });
    });
}

fn offset_for_leader_epoch_response(
    version: i16,
    r: &OffsetForLeaderEpochResponse,
    out: &mut BytesMut,
) {
    put_array(out, &r.topics, |out, t| {
        put_str(out, Some(t.topic.0.as_str()));
        put_array(out, &t.partitions, |out, p| {
            out.put_i16(p.error_code);
            out.put_i32(p.partition);
            if version >= 1 {
                out.put_i32(p.leader_epoch);
            }
            out.put_i64(p.end_offset);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };

    fn s(v: &'static str) -> StrBytes {
        StrBytes::from_static_str(v)
    }

    fn round_trip(key: ApiKey, version: i16, req: RequestKind) -> RequestKind {
        let mut out = BytesMut::new();
        encode_request(version, &req, &mut out).unwrap();
        let mut buf = out.freeze();
        let got = decode_request(key, version, &mut buf).unwrap();
        assert!(buf.is_empty(), "{key:?} v{version}: bytes left over");
        got
    }

    #[test]
    fn the_codec_starts_where_this_module_stops() {
        for (key, lowest) in LOWEST {
            let min = key.valid_versions().min;
            assert!(*lowest < min, "{key:?}");
            assert!(handles(*key, min - 1) && !handles(*key, min) && !handles(*key, lowest - 1));
        }
    }

    #[test]
    fn produce_v0_request_has_kafkas_layout_and_round_trips() {
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(1_500)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(s("t")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(2)
                    .with_records(Some(Bytes::from_static(b"abc")))])]);
        let mut out = BytesMut::new();
        encode_request(0, &RequestKind::Produce(req.clone()), &mut out).unwrap();
        assert_eq!(
            &out[..],
            &[
                0xff, 0xff, 0, 0, 0x05, 0xdc, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 2, 0, 0,
                0, 3, b'a', b'b', b'c'
            ][..]
        );
        for v in 0..=2 {
            match round_trip(ApiKey::Produce, v, RequestKind::Produce(req.clone())) {
                RequestKind::Produce(got) => assert_eq!(got, req),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn fetch_requests_round_trip_and_v3_carries_max_bytes() {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(100)
            .with_min_bytes(1)
            .with_max_bytes(i32::MAX)
            .with_isolation_level(0)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(s("t")))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(42)
                    .with_partition_max_bytes(1 << 20)])]);
        for v in 0..=2 {
            match round_trip(ApiKey::Fetch, v, RequestKind::Fetch(req.clone())) {
                RequestKind::Fetch(got) => assert_eq!(got, req),
                other => panic!("{other:?}"),
            }
        }
        let v3 = req.clone().with_max_bytes(1000);
        match round_trip(ApiKey::Fetch, 3, RequestKind::Fetch(v3.clone())) {
            RequestKind::Fetch(got) => assert_eq!(got, v3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn group_requests_round_trip() {
        let commit = OffsetCommitRequest::default()
            .with_group_id(s("g").into())
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(1)
                    .with_committed_offset(7)
                    .with_committed_metadata(Some(s("m")))])]);
        match round_trip(
            ApiKey::OffsetCommit,
            0,
            RequestKind::OffsetCommit(commit.clone()),
        ) {
            RequestKind::OffsetCommit(got) => {
                assert_eq!(got, commit.clone().with_generation_id_or_member_epoch(-1))
            }
            other => panic!("{other:?}"),
        }
        let v1 = commit
            .with_generation_id_or_member_epoch(3)
            .with_member_id(s("member-1"));
        match round_trip(
            ApiKey::OffsetCommit,
            1,
            RequestKind::OffsetCommit(v1.clone()),
        ) {
            RequestKind::OffsetCommit(got) => assert_eq!(got, v1),
            other => panic!("{other:?}"),
        }
        let list = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(-2)])]);
        // A partition without `max_num_offsets` goes out asking for 1.
        let want = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![with_max_num_offsets(
                    ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(-2),
                    1,
                )])]);
        match round_trip(
            ApiKey::ListOffsets,
            0,
            RequestKind::ListOffsets(list.clone()),
        ) {
            RequestKind::ListOffsets(got) => assert_eq!(got, want),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn list_offsets_v0_request_carries_max_num_offsets() {
        let part = |index, ts, max| {
            with_max_num_offsets(
                ListOffsetsPartition::default()
                    .with_partition_index(index)
                    .with_timestamp(ts),
                max,
            )
        };
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![
                    part(0, -1, 7),
                    part(3, 1_700_000_000_000, -5),
                ])]);
        let mut out = BytesMut::new();
        encode_request(0, &RequestKind::ListOffsets(req.clone()), &mut out).unwrap();
        // replica_id, [topic [partition, timestamp, max_num_offsets]]
        let mut want = vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2];
        want.extend_from_slice(&0i32.to_be_bytes());
        want.extend_from_slice(&(-1i64).to_be_bytes());
        want.extend_from_slice(&7i32.to_be_bytes());
        want.extend_from_slice(&3i32.to_be_bytes());
        want.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        want.extend_from_slice(&(-5i32).to_be_bytes());
        assert_eq!(&out[..], &want[..]);
        let mut buf = out.freeze();
        let got = match decode_request(ApiKey::ListOffsets, 0, &mut buf).unwrap() {
            RequestKind::ListOffsets(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(buf.is_empty());
        assert_eq!(got, req);
        let maxes: Vec<_> = got.topics[0]
            .partitions
            .iter()
            .map(max_num_offsets)
            .collect();
        assert_eq!(maxes, [Some(7), Some(-5)]);
        // Cut anywhere, the request is an error, not a shorter request.
        for cut in 0..want.len() {
            let mut b = Bytes::copy_from_slice(&want[..cut]);
            assert!(
                decode_request(ApiKey::ListOffsets, 0, &mut b).is_err(),
                "cut {cut}"
            );
        }
        // A v1 request (the crate's codec) has no max_num_offsets, and the v0 field
        // never reaches the wire of a non-flexible version.
        let mut v1 = BytesMut::new();
        req.encode(&mut v1, 1).unwrap();
        let back = ListOffsetsRequest::decode(&mut v1.freeze(), 1).unwrap();
        assert!(back.topics[0]
            .partitions
            .iter()
            .all(|p| max_num_offsets(p).is_none()));
    }

    #[test]
    fn list_offsets_v0_response_lists_old_style_offsets() {
        let resp = |p: ListOffsetsPartitionResponse| {
            let r = ListOffsetsResponse::default().with_topics(vec![
                ListOffsetsTopicResponse::default()
                    .with_name(TopicName(s("t")))
                    .with_partitions(vec![p]),
            ]);
            let mut out = BytesMut::new();
            encode_response(
                ApiKey::ListOffsets,
                0,
                &ResponseKind::ListOffsets(r),
                &mut out,
            )
            .unwrap();
            out.to_vec()
        };
        let head = vec![0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 2];
        let listed = with_old_style_offsets(
            ListOffsetsPartitionResponse::default().with_partition_index(2),
            &[30, 20, 0],
        );
        assert_eq!(old_style_offsets(&listed), Some(vec![30, 20, 0]));
        let mut want = [head.clone(), vec![0, 0, 0, 0, 0, 3]].concat();
        for o in [30i64, 20, 0] {
            want.extend_from_slice(&o.to_be_bytes());
        }
        assert_eq!(resp(listed), want);
        // An empty list (max_num_offsets 0, or nothing old enough) is an empty array,
        // whatever the offset field holds.
        let none = with_old_style_offsets(
            ListOffsetsPartitionResponse::default()
                .with_partition_index(2)
                .with_offset(9),
            &[],
        );
        assert_eq!(resp(none), [head.clone(), vec![0, 0, 0, 0, 0, 0]].concat());
        // An error with no list: the code and an empty array.
        let err = ListOffsetsPartitionResponse::default()
            .with_partition_index(2)
            .with_error_code(-1)
            .with_offset(-1);
        assert_eq!(resp(err), [head, vec![0xff, 0xff, 0, 0, 0, 0]].concat());
    }

    #[test]
    fn responses_have_kafkas_layouts() {
        let produce = ProduceResponse::default()
            .with_throttle_time_ms(9)
            .with_responses(vec![TopicProduceResponse::default()
                .with_name(TopicName(s("t")))
                .with_partition_responses(vec![PartitionProduceResponse::default()
                    .with_index(1)
                    .with_base_offset(5)
                    .with_log_append_time_ms(77)])]);
        let enc = |key, v, r: ResponseKind| {
            let mut out = BytesMut::new();
            encode_response(key, v, &r, &mut out).unwrap();
            out.to_vec()
        };
        let v0 = enc(ApiKey::Produce, 0, ResponseKind::Produce(produce.clone()));
        let mut want = vec![0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 1, 0, 0];
        want.extend_from_slice(&5i64.to_be_bytes());
        assert_eq!(v0, want);
        let v1 = enc(ApiKey::Produce, 1, ResponseKind::Produce(produce.clone()));
        assert_eq!(v1, [want.clone(), 9i32.to_be_bytes().to_vec()].concat());
        // v2: the log-append time after the base offset, then the throttle time.
        let v2 = enc(ApiKey::Produce, 2, ResponseKind::Produce(produce));
        assert_eq!(
            v2,
            [
                want,
                77i64.to_be_bytes().to_vec(),
                9i32.to_be_bytes().to_vec()
            ]
            .concat()
        );

        let fetch = FetchResponse::default()
            .with_throttle_time_ms(3)
            .with_responses(vec![FetchableTopicResponse::default()
                .with_topic(TopicName(s("t")))
                .with_partitions(vec![PartitionData::default()
                    .with_partition_index(0)
                    .with_high_watermark(10)
                    .with_records(Some(Bytes::from_static(b"xy")))])]);
        let mut part = vec![0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        part.extend_from_slice(&10i64.to_be_bytes());
        part.extend_from_slice(&[0, 0, 0, 2, b'x', b'y']);
        assert_eq!(
            enc(ApiKey::Fetch, 0, ResponseKind::Fetch(fetch.clone())),
            part
        );
        for v in 1..=3 {
            assert_eq!(
                enc(ApiKey::Fetch, v, ResponseKind::Fetch(fetch.clone())),
                [3i32.to_be_bytes().to_vec(), part.clone()].concat()
            );
        }

        let list = |error_code, offset| {
            ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![ListOffsetsPartitionResponse::default()
                    .with_partition_index(0)
                    .with_error_code(error_code)
                    .with_offset(offset)])])
        };
        let head = vec![0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(
            enc(
                ApiKey::ListOffsets,
                0,
                ResponseKind::ListOffsets(list(0, 12))
            ),
            [
                head.clone(),
                vec![0, 0, 0, 0, 0, 1],
                12i64.to_be_bytes().to_vec()
            ]
            .concat()
        );
        assert_eq!(
            enc(
                ApiKey::ListOffsets,
                0,
                ResponseKind::ListOffsets(list(3, -1))
            ),
            [head, vec![0, 3, 0, 0, 0, 0]].concat()
        );
    }

    #[test]
    fn truncated_requests_are_errors() {
        let req = RequestKind::Produce(ProduceRequest::default().with_topic_data(
            vec![TopicProduceData::default()
                .with_name(TopicName(s("t")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_records(Some(Bytes::from_static(b"abc")))])],
        ));
        let mut out = BytesMut::new();
        encode_request(1, &req, &mut out).unwrap();
        for cut in 0..out.len() {
            let mut b = Bytes::copy_from_slice(&out[..cut]);
            assert!(
                decode_request(ApiKey::Produce, 1, &mut b).is_err(),
                "cut {cut}"
            );
        }
    }
}
