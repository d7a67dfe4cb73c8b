//! Kafka's record formats of the `__consumer_offsets` topic, so that tools reading the
//! topic understand it. `kafka-protocol` 0.18 does not ship these schemas (they are
//! Kafka's internal `OffsetCommitKey`/`OffsetCommitValue`/`GroupMetadataKey`/
//! `GroupMetadataValue`), so they are encoded here, byte for byte as Kafka writes them.
//!
//! Layout (big-endian, non-flexible: STRING = i16 length + UTF-8, NULLABLE_STRING with
//! length -1 for null, BYTES = i32 length + bytes, ARRAY = i32 count + items):
//!
//! | record | bytes |
//! |---|---|
//! | offset key (version 1) | i16 1, STRING group, STRING topic, i32 partition |
//! | offset value (version 3) | i16 3, i64 offset, i32 leader epoch, STRING metadata, i64 commit timestamp |
//! | group key (version 2) | i16 2, STRING group |
//! | group value (version 3) | i16 3, STRING protocol type, i32 generation, NULLABLE_STRING protocol, NULLABLE_STRING leader, i64 state timestamp, ARRAY of member |
//! | member (value version 3) | STRING member id, NULLABLE_STRING instance id, STRING client id, STRING client host, i32 rebalance timeout, i32 session timeout, BYTES subscription, BYTES assignment |
//!
//! A null value is a tombstone (the offset or group is deleted). Decoding accepts the
//! older value versions Kafka wrote (offset value 0-3, group value 0-3).

use bytes::{Buf, BufMut, Bytes};

pub const OFFSET_KEY_VERSION: i16 = 1;
pub const OFFSET_VALUE_VERSION: i16 = 3;
pub const GROUP_KEY_VERSION: i16 = 2;
pub const GROUP_VALUE_VERSION: i16 = 3;

/// A record key of `__consumer_offsets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group {
        group: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    /// -1 when unknown.
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberValue {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub state_timestamp_ms: i64,
    pub members: Vec<MemberValue>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed __consumer_offsets record: {0}")]
pub struct RecordError(pub &'static str);

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Kafka limits these strings to i16 lengths; callers bound group ids, topics and
    // metadata well below that (metadata by offset.metadata.max.bytes).
    let len = s.len().min(i16::MAX as usize);
    out.put_i16(len as i16);
    out.extend_from_slice(&s.as_bytes()[..len]);
}

fn put_nullable_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => out.put_i16(-1),
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.put_i32(b.len() as i32);
    out.extend_from_slice(b);
}

impl Key {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            Key::Offset {
                group,
                topic,
                partition,
            } => {
                out.put_i16(OFFSET_KEY_VERSION);
                put_str(&mut out, group);
                put_str(&mut out, topic);
                out.put_i32(*partition);
            }
            Key::Group { group } => {
                out.put_i16(GROUP_KEY_VERSION);
                put_str(&mut out, group);
            }
        }
        out
    }

    pub fn decode(mut b: &[u8]) -> Result<Key, RecordError> {
        let version = get_i16(&mut b)?;
        match version {
            0 | 1 => Ok(Key::Offset {
                group: get_str(&mut b)?,
                topic: get_str(&mut b)?,
                partition: get_i32(&mut b)?,
            }),
            2 => Ok(Key::Group {
                group: get_str(&mut b)?,
            }),
            _ => Err(RecordError("unknown key version")),
        }
    }
}

impl OffsetValue {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.metadata.len());
        out.put_i16(OFFSET_VALUE_VERSION);
        out.put_i64(self.offset);
        out.put_i32(self.leader_epoch);
        put_str(&mut out, &self.metadata);
        out.put_i64(self.commit_timestamp_ms);
        out
    }

    pub fn decode(mut b: &[u8]) -> Result<OffsetValue, RecordError> {
        let version = get_i16(&mut b)?;
        let offset = get_i64(&mut b)?;
        let leader_epoch = if version >= 3 { get_i32(&mut b)? } else { -1 };
        let metadata = get_str(&mut b)?;
        let commit_timestamp_ms = get_i64(&mut b)?;
        if !(0..=3).contains(&version) {
            return Err(RecordError("unknown offset value version"));
        }
        Ok(OffsetValue {
            offset,
            leader_epoch,
            metadata,
            commit_timestamp_ms,
        })
    }
}

impl GroupValue {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.put_i16(GROUP_VALUE_VERSION);
        put_str(&mut out, &self.protocol_type);
        out.put_i32(self.generation);
        put_nullable_str(&mut out, self.protocol.as_deref());
        put_nullable_str(&mut out, self.leader.as_deref());
        out.put_i64(self.state_timestamp_ms);
        out.put_i32(self.members.len() as i32);
        for m in &self.members {
            put_str(&mut out, &m.member_id);
            put_nullable_str(&mut out, m.instance_id.as_deref());
            put_str(&mut out, &m.client_id);
            put_str(&mut out, &m.client_host);
            out.put_i32(m.rebalance_timeout_ms);
            out.put_i32(m.session_timeout_ms);
            put_bytes(&mut out, &m.subscription);
            put_bytes(&mut out, &m.assignment);
        }
        out
    }

    pub fn decode(mut b: &[u8]) -> Result<GroupValue, RecordError> {
        let version = get_i16(&mut b)?;
        if !(0..=3).contains(&version) {
            return Err(RecordError("unknown group value version"));
        }
        let protocol_type = get_str(&mut b)?;
        let generation = get_i32(&mut b)?;
        let protocol = get_nullable_str(&mut b)?;
        let leader = get_nullable_str(&mut b)?;
        let state_timestamp_ms = if version >= 2 { get_i64(&mut b)? } else { -1 };
        let n = get_i32(&mut b)?;
        let mut members = Vec::with_capacity((n.max(0) as usize).min(b.len() / 16));
        for _ in 0..n.max(0) {
            let member_id = get_str(&mut b)?;
            let instance_id = if version >= 3 {
                get_nullable_str(&mut b)?
            } else {
                None
            };
            let client_id = get_str(&mut b)?;
            let client_host = get_str(&mut b)?;
            let rebalance_timeout_ms = if version >= 1 { get_i32(&mut b)? } else { -1 };
            let session_timeout_ms = get_i32(&mut b)?;
            let subscription = get_bytes(&mut b)?;
            let assignment = get_bytes(&mut b)?;
            members.push(MemberValue {
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout_ms,
                session_timeout_ms,
                subscription,
                assignment,
            });
        }
        Ok(GroupValue {
            protocol_type,
            generation,
            protocol,
            leader,
            state_timestamp_ms,
            members,
        })
    }
}

fn need(b: &[u8], n: usize) -> Result<(), RecordError> {
    if b.len() < n {
        Err(RecordError("truncated"))
    } else {
        Ok(())
    }
}

fn get_i16(b: &mut &[u8]) -> Result<i16, RecordError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

fn get_i32(b: &mut &[u8]) -> Result<i32, RecordError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

fn get_i64(b: &mut &[u8]) -> Result<i64, RecordError> {
    need(b, 8)?;
    Ok(b.get_i64())
}

fn get_nullable_str(b: &mut &[u8]) -> Result<Option<String>, RecordError> {
    let len = get_i16(b)?;
    if len < 0 {
        return Ok(None);
    }
    let len = len as usize;
    need(b, len)?;
    let s = std::str::from_utf8(&b[..len]).map_err(|_| RecordError("string is not UTF-8"))?;
    let s = s.to_string();
    b.advance(len);
    Ok(Some(s))
}

fn get_str(b: &mut &[u8]) -> Result<String, RecordError> {
    get_nullable_str(b)?.ok_or(RecordError("null string"))
}

fn get_bytes(b: &mut &[u8]) -> Result<Bytes, RecordError> {
    let len = get_i32(b)?;
    if len < 0 {
        return Ok(Bytes::new());
    }
    let len = len as usize;
    need(b, len)?;
    let out = Bytes::copy_from_slice(&b[..len]);
    b.advance(len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_records_round_trip_in_kafkas_layout() {
        let k = Key::Offset {
            group: "g".into(),
            topic: "t".into(),
            partition: 7,
        };
        let kb = k.encode();
        assert_eq!(kb, vec![0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 7]);
        assert_eq!(Key::decode(&kb).unwrap(), k);
        let v = OffsetValue {
            offset: 42,
            leader_epoch: 3,
            metadata: "m".into(),
            commit_timestamp_ms: 1000,
        };
        let vb = v.encode();
        assert_eq!(&vb[..2], &[0, 3]);
        assert_eq!(vb.len(), 2 + 8 + 4 + 3 + 8);
        assert_eq!(OffsetValue::decode(&vb).unwrap(), v);
    }

    #[test]
    fn group_records_round_trip() {
        let k = Key::Group { group: "g".into() };
        assert_eq!(k.encode(), vec![0, 2, 0, 1, b'g']);
        assert_eq!(Key::decode(&k.encode()).unwrap(), k);
        let v = GroupValue {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            state_timestamp_ms: 9,
            members: vec![MemberValue {
                member_id: "m1".into(),
                instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 10,
                session_timeout_ms: 6000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        assert_eq!(GroupValue::decode(&v.encode()).unwrap(), v);
    }

    #[test]
    fn older_offset_value_versions_decode() {
        // Version 1: offset, metadata, commit timestamp, expire timestamp.
        let mut b = vec![0, 1];
        b.extend_from_slice(&5i64.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&7i64.to_be_bytes());
        b.extend_from_slice(&8i64.to_be_bytes());
        let v = OffsetValue::decode(&b).unwrap();
        assert_eq!(
            (v.offset, v.leader_epoch, v.commit_timestamp_ms),
            (5, -1, 7)
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(Key::decode(&[0]).is_err());
        assert!(Key::decode(&[0, 9, 0, 0]).is_err());
        assert!(OffsetValue::decode(&[0, 3, 1]).is_err());
        assert!(GroupValue::decode(&[0, 3, 0, 5, b'a']).is_err());
    }
}
