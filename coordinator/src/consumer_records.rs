//! Kafka's consumer-group records of `__consumer_offsets` (KIP-848), so that a
//! coordinator that takes a group over rebuilds it exactly, and Kafka's tools read them.
//! `kafka-protocol` does not ship these schemas (Kafka's internal
//! `ConsumerGroup*Key`/`Value`), so they are encoded here as Kafka writes them.
//!
//! Keys are not flexible: i16 record type, then STRING fields (i16 length). Values are
//! flexible, version 0: i16 version, then the fields (COMPACT_STRING = unsigned varint
//! length + 1; COMPACT_NULLABLE_STRING with 0 for null; COMPACT_ARRAY = unsigned varint
//! count + 1; UUID = 16 bytes), every struct closed by its tagged fields (none written,
//! any skipped when read).
//!
//! | type | key | value (version 0) |
//! |---|---|---|
//! | 3 | group | i32 epoch |
//! | 4 | group | [topic id, topic name, i32 partitions, [partition metadata] (written empty)]: the subscribed topics the group epoch accounts for |
//! | 5 | group, member | NULLABLE instance id, NULLABLE rack id, client id, client host, [topic name], NULLABLE regex, i32 rebalance timeout, NULLABLE assignor (a tagged classic-member field is skipped) |
//! | 6 | group | i32 assignment epoch |
//! | 7 | group, member | [topic id, [partition]] |
//! | 8 | group, member | i32 member epoch, i32 previous epoch, i8 state (0 stable, 1 unrevoked, 2 unreleased), [topic id, [partition]] assigned, [topic id, [partition]] pending revocation |
//!
//! A null value is a tombstone.

use std::collections::BTreeMap;

use bytes::BufMut;
use uuid::Uuid;

use crate::group::consumer::{ConsumerMember, MemberState};
use crate::group::{Assignment, Record};
use crate::records::RecordError;

/// Whether a `__consumer_offsets` key is one of these records' (types 3–8).
pub fn is_consumer_key(key: &[u8]) -> bool {
    matches!(key, [a, b, ..] if (3..=8).contains(&i16::from_be_bytes([*a, *b])))
}

/// A consumer-group record key (the group is carried beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerKey {
    Group,
    PartitionMetadata,
    Member(String),
    TargetMetadata,
    TargetMember(String),
    CurrentAssignment(String),
}

impl ConsumerKey {
    fn record_type(&self) -> i16 {
        match self {
            ConsumerKey::Group => 3,
            ConsumerKey::PartitionMetadata => 4,
            ConsumerKey::Member(_) => 5,
            ConsumerKey::TargetMetadata => 6,
            ConsumerKey::TargetMember(_) => 7,
            ConsumerKey::CurrentAssignment(_) => 8,
        }
    }

    pub fn encode(&self, group: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + group.len());
        out.put_i16(self.record_type());
        put_str(&mut out, group);
        if let ConsumerKey::Member(m)
        | ConsumerKey::TargetMember(m)
        | ConsumerKey::CurrentAssignment(m) = self
        {
            put_str(&mut out, m);
        }
        out
    }

    /// Decodes a key of record type 3–8 (after its type was read): the group and the key.
    pub fn decode(record_type: i16, mut b: &[u8]) -> Result<(String, ConsumerKey), RecordError> {
        let group = get_str(&mut b)?;
        let key = match record_type {
            3 => ConsumerKey::Group,
            4 => ConsumerKey::PartitionMetadata,
            5 => ConsumerKey::Member(get_str(&mut b)?),
            6 => ConsumerKey::TargetMetadata,
            7 => ConsumerKey::TargetMember(get_str(&mut b)?),
            8 => ConsumerKey::CurrentAssignment(get_str(&mut b)?),
            _ => return Err(RecordError("unknown consumer group record type")),
        };
        Ok((group, key))
    }
}

/// A decoded consumer-group record value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerValue {
    Group {
        epoch: i32,
    },
    /// Subscribed topic id → (name, partitions).
    PartitionMetadata(BTreeMap<Uuid, (String, i32)>),
    Member(MemberMetadata),
    TargetMetadata {
        assignment_epoch: i32,
    },
    TargetMember(Assignment),
    CurrentAssignment(CurrentAssignment),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberMetadata {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_names: Vec<String>,
    pub subscribed_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentAssignment {
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    pub assigned: Assignment,
    pub revoking: Assignment,
}

fn record(group: &str, key: ConsumerKey, value: Vec<u8>) -> Record {
    Record {
        group: group.to_string(),
        key: key.encode(group),
        value: Some(value),
    }
}

pub fn tombstone(group: &str, key: ConsumerKey) -> Record {
    Record {
        group: group.to_string(),
        key: key.encode(group),
        value: None,
    }
}

fn value_start() -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.put_i16(0);
    out
}

pub fn group_metadata(group: &str, epoch: i32) -> Record {
    let mut v = value_start();
    v.put_i32(epoch);
    v.push(0);
    record(group, ConsumerKey::Group, v)
}

pub fn partition_metadata(group: &str, topics: &BTreeMap<Uuid, (String, i32)>) -> Record {
    let mut v = value_start();
    put_uvarint(&mut v, topics.len() as u64 + 1);
    for (id, (name, partitions)) in topics {
        v.extend_from_slice(id.as_bytes());
        put_compact(&mut v, name);
        v.put_i32(*partitions);
        v.push(1); // no partition metadata
        v.push(0);
    }
    v.push(0);
    record(group, ConsumerKey::PartitionMetadata, v)
}

pub fn target_metadata(group: &str, assignment_epoch: i32) -> Record {
    let mut v = value_start();
    v.put_i32(assignment_epoch);
    v.push(0);
    record(group, ConsumerKey::TargetMetadata, v)
}

pub fn member_metadata(group: &str, m: &ConsumerMember) -> Record {
    let mut v = value_start();
    put_compact_nullable(&mut v, m.meta.instance_id.as_deref());
    put_compact_nullable(&mut v, m.meta.rack_id.as_deref());
    put_compact(&mut v, &m.meta.client_id);
    put_compact(&mut v, &m.meta.client_host);
    put_uvarint(&mut v, m.meta.subscribed_names.len() as u64 + 1);
    for n in &m.meta.subscribed_names {
        put_compact(&mut v, n);
    }
    put_compact_nullable(&mut v, m.meta.subscribed_regex.as_deref());
    v.put_i32(m.meta.rebalance_timeout_ms);
    put_compact_nullable(&mut v, m.meta.server_assignor.as_deref());
    v.push(0);
    record(group, ConsumerKey::Member(m.id.clone()), v)
}

pub fn target_member(group: &str, member: &str, a: &Assignment) -> Record {
    let mut v = value_start();
    put_assignment(&mut v, a);
    v.push(0);
    record(group, ConsumerKey::TargetMember(member.to_string()), v)
}

pub fn current_assignment(group: &str, m: &ConsumerMember) -> Record {
    let mut v = value_start();
    v.put_i32(m.current.epoch);
    v.put_i32(m.current.previous_epoch);
    v.put_i8(m.current.state.code());
    put_assignment(&mut v, &m.current.assigned);
    put_assignment(&mut v, &m.current.revoking);
    v.push(0);
    record(group, ConsumerKey::CurrentAssignment(m.id.clone()), v)
}

impl ConsumerValue {
    pub fn decode(key: &ConsumerKey, mut b: &[u8]) -> Result<ConsumerValue, RecordError> {
        let b = &mut b;
        let _version = get_i16(b)?;
        Ok(match key {
            ConsumerKey::Group => ConsumerValue::Group { epoch: get_i32(b)? },
            ConsumerKey::PartitionMetadata => {
                let n = get_count(b)?;
                let mut topics = BTreeMap::new();
                for _ in 0..n {
                    need(b, 16)?;
                    let id = Uuid::from_slice(&b[..16]).map_err(|_| RecordError("bad topic id"))?;
                    *b = &b[16..];
                    let name = get_compact(b)?;
                    let partitions = get_i32(b)?;
                    // Partition racks (unused): partition, [rack], tags.
                    for _ in 0..get_count(b)? {
                        get_i32(b)?;
                        for _ in 0..get_count(b)? {
                            get_compact(b)?;
                        }
                        skip_tags(b)?;
                    }
                    skip_tags(b)?;
                    topics.insert(id, (name, partitions));
                }
                ConsumerValue::PartitionMetadata(topics)
            }
            ConsumerKey::TargetMetadata => ConsumerValue::TargetMetadata {
                assignment_epoch: get_i32(b)?,
            },
            ConsumerKey::Member(_) => {
                let instance_id = get_compact_nullable(b)?;
                let rack_id = get_compact_nullable(b)?;
                let client_id = get_compact(b)?;
                let client_host = get_compact(b)?;
                let n = get_count(b)?;
                let mut subscribed_names = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    subscribed_names.push(get_compact(b)?);
                }
                let subscribed_regex = get_compact_nullable(b)?;
                let rebalance_timeout_ms = get_i32(b)?;
                ConsumerValue::Member(MemberMetadata {
                    instance_id,
                    rack_id,
                    client_id,
                    client_host,
                    subscribed_names,
                    subscribed_regex,
                    server_assignor: get_compact_nullable(b)?,
                    rebalance_timeout_ms,
                })
            }
            ConsumerKey::TargetMember(_) => ConsumerValue::TargetMember(get_assignment(b)?),
            ConsumerKey::CurrentAssignment(_) => {
                let epoch = get_i32(b)?;
                let previous_epoch = get_i32(b)?;
                need(b, 1)?;
                let state = MemberState::from_code(b[0] as i8);
                *b = &b[1..];
                ConsumerValue::CurrentAssignment(CurrentAssignment {
                    epoch,
                    previous_epoch,
                    state,
                    assigned: get_assignment(b)?,
                    revoking: get_assignment(b)?,
                })
            }
        })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let len = s.len().min(i16::MAX as usize);
    out.put_i16(len as i16);
    out.extend_from_slice(&s.as_bytes()[..len]);
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_compact(out: &mut Vec<u8>, s: &str) {
    put_uvarint(out, s.len() as u64 + 1);
    out.extend_from_slice(s.as_bytes());
}

fn put_compact_nullable(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_compact(out, s),
        None => out.push(0),
    }
}

fn put_assignment(out: &mut Vec<u8>, a: &Assignment) {
    let topics: Vec<_> = a.iter().filter(|(_, ps)| !ps.is_empty()).collect();
    put_uvarint(out, topics.len() as u64 + 1);
    for (t, ps) in topics {
        out.extend_from_slice(t.as_bytes());
        put_uvarint(out, ps.len() as u64 + 1);
        for p in ps {
            out.put_i32(*p);
        }
        out.push(0);
    }
}

fn need(b: &[u8], n: usize) -> Result<(), RecordError> {
    if b.len() < n {
        Err(RecordError("truncated consumer group record"))
    } else {
        Ok(())
    }
}

fn get_i16(b: &mut &[u8]) -> Result<i16, RecordError> {
    need(b, 2)?;
    let v = i16::from_be_bytes([b[0], b[1]]);
    *b = &b[2..];
    Ok(v)
}

fn get_i32(b: &mut &[u8]) -> Result<i32, RecordError> {
    need(b, 4)?;
    let v = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    *b = &b[4..];
    Ok(v)
}

fn get_str(b: &mut &[u8]) -> Result<String, RecordError> {
    let n = get_i16(b)?;
    let n = usize::try_from(n).map_err(|_| RecordError("negative string length"))?;
    need(b, n)?;
    let s = std::str::from_utf8(&b[..n])
        .map_err(|_| RecordError("string is not UTF-8"))?
        .to_string();
    *b = &b[n..];
    Ok(s)
}

fn get_uvarint(b: &mut &[u8]) -> Result<u64, RecordError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        need(b, 1)?;
        let byte = b[0];
        *b = &b[1..];
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(RecordError("varint too long"))
}

/// A compact array's count, bounded by the bytes left (each item takes one at least).
fn get_count(b: &mut &[u8]) -> Result<usize, RecordError> {
    let n = get_uvarint(b)?;
    let n = usize::try_from(n.saturating_sub(1)).map_err(|_| RecordError("array too long"))?;
    if n > b.len() {
        return Err(RecordError("array count beyond the record"));
    }
    Ok(n)
}

fn get_compact_nullable(b: &mut &[u8]) -> Result<Option<String>, RecordError> {
    let n = get_uvarint(b)?;
    if n == 0 {
        return Ok(None);
    }
    let n = usize::try_from(n - 1).map_err(|_| RecordError("string too long"))?;
    need(b, n)?;
    let s = std::str::from_utf8(&b[..n])
        .map_err(|_| RecordError("string is not UTF-8"))?
        .to_string();
    *b = &b[n..];
    Ok(Some(s))
}

fn get_compact(b: &mut &[u8]) -> Result<String, RecordError> {
    get_compact_nullable(b)?.ok_or(RecordError("null string"))
}

fn skip_tags(b: &mut &[u8]) -> Result<(), RecordError> {
    let n = get_uvarint(b)?;
    for _ in 0..n {
        let _tag = get_uvarint(b)?;
        let len = usize::try_from(get_uvarint(b)?).map_err(|_| RecordError("tag too long"))?;
        need(b, len)?;
        *b = &b[len..];
    }
    Ok(())
}

fn get_assignment(b: &mut &[u8]) -> Result<Assignment, RecordError> {
    let topics = get_count(b)?;
    let mut a = Assignment::new();
    for _ in 0..topics {
        need(b, 16)?;
        let id = Uuid::from_slice(&b[..16]).map_err(|_| RecordError("bad topic id"))?;
        *b = &b[16..];
        let n = get_count(b)?;
        let ps = a.entry(id).or_default();
        for _ in 0..n {
            ps.insert(get_i32(b)?);
        }
        skip_tags(b)?;
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let t = Uuid::from_bytes([7; 16]);
        let mut m = crate::group::consumer::tests_support::member("m-1");
        m.meta.instance_id = Some("i".into());
        m.meta.subscribed_names = vec!["a".into(), "b".into()];
        m.meta.subscribed_regex = Some("x.*".into());
        m.current.epoch = 4;
        m.current.previous_epoch = 3;
        m.current.state = MemberState::UnrevokedPartitions;
        m.current.assigned = Assignment::from([(t, [0, 2].into())]);
        m.current.revoking = Assignment::from([(t, [1].into())]);
        let r = member_metadata("g", &m);
        let (g, k) = ConsumerKey::decode(5, &r.key[2..]).unwrap();
        assert_eq!((g.as_str(), &k), ("g", &ConsumerKey::Member("m-1".into())));
        let ConsumerValue::Member(v) =
            ConsumerValue::decode(&k, r.value.as_ref().unwrap()).unwrap()
        else {
            panic!()
        };
        assert_eq!(v.subscribed_names, m.meta.subscribed_names);
        assert_eq!(v.subscribed_regex, m.meta.subscribed_regex);
        assert_eq!(v.instance_id.as_deref(), Some("i"));
        let r = current_assignment("g", &m);
        let (_, k) = ConsumerKey::decode(8, &r.key[2..]).unwrap();
        let ConsumerValue::CurrentAssignment(c) =
            ConsumerValue::decode(&k, r.value.as_ref().unwrap()).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (c.epoch, c.previous_epoch, c.state, &c.assigned, &c.revoking),
            (
                4,
                3,
                MemberState::UnrevokedPartitions,
                &m.current.assigned,
                &m.current.revoking
            )
        );
        assert!(ConsumerValue::decode(&k, &r.value.unwrap()[..9]).is_err());
    }
}
