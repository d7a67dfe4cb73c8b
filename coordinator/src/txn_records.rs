//! Kafka's record formats of the `__transaction_state` topic (its internal
//! `TransactionLogKey`/`TransactionLogValue` schemas), byte for byte as Kafka writes
//! them, so that tools reading the topic understand it. `kafka-protocol` 0.18 does not
//! ship these two schemas, so they are encoded here.
//!
//! Every key and value starts with its schema version as a big-endian i16.
//!
//! | record | bytes |
//! |---|---|
//! | key (version 0) | i16 0, STRING transactional id |
//! | value (version 0) | i16 0, i64 producer id, i16 producer epoch, i32 transaction timeout ms, i8 status, NULLABLE ARRAY of partitions, i64 last update ms, i64 start ms |
//! | partitions (value version 0) | STRING topic, ARRAY of i32 partition |
//! | value (version 1, flexible) | i16 1, i64 producer id, i16 producer epoch, i32 transaction timeout ms, i8 status, COMPACT NULLABLE ARRAY of partitions, i64 last update ms, i64 start ms, TAGGED FIELDS |
//! | partitions (value version 1) | COMPACT STRING topic, COMPACT ARRAY of i32 partition, TAGGED FIELDS (none known) |
//! | value tagged fields (version 1) | tag 0: i64 previous producer id (default -1); tag 1: i64 next producer id (default -1); tag 2: i16 client transaction version (default 0) |
//!
//! Non-flexible encodings: STRING = i16 length + UTF-8, ARRAY = i32 count + items
//! (count -1 is null). Flexible (version 1): COMPACT STRING = unsigned varint
//! (length + 1) + UTF-8, COMPACT ARRAY = unsigned varint (count + 1) + items (0 is
//! null), TAGGED FIELDS = unsigned varint count, then per field unsigned varint tag,
//! unsigned varint size and the field's bytes, in tag order; a field equal to its
//! default is not written (as Kafka's generated code does). Unknown tags are skipped
//! when decoding.
//!
//! Status numbering is Kafka's (`TransactionState.fromId`): Empty 0, Ongoing 1,
//! PrepareCommit 2, PrepareAbort 3, CompleteCommit 4, CompleteAbort 5, Dead 6,
//! PrepareEpochFence 7. Kafka writes a null partition array for Empty and an array
//! (possibly empty) otherwise. A null value is a tombstone: the transactional id
//! expired and is forgotten.

use bytes::{Buf, BufMut};

pub const KEY_VERSION: i16 = 0;
/// Value versions this crate reads and writes. Kafka writes 0 until its
/// `transaction.version` feature is at least 1, then 1.
pub const VALUE_VERSION_MIN: i16 = 0;
pub const VALUE_VERSION_MAX: i16 = 1;

/// Kafka's `TransactionState`, with its numbering on the wire and its names in
/// DescribeTransactions / ListTransactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    pub const ALL: [TxnState; 8] = [
        TxnState::Empty,
        TxnState::Ongoing,
        TxnState::PrepareCommit,
        TxnState::PrepareAbort,
        TxnState::CompleteCommit,
        TxnState::CompleteAbort,
        TxnState::Dead,
        TxnState::PrepareEpochFence,
    ];

    pub fn id(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<TxnState> {
        TxnState::ALL.into_iter().find(|s| s.id() == id)
    }

    /// Kafka's names (DescribeTransactions, ListTransactions and their state filters).
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub fn from_name(name: &str) -> Option<TxnState> {
        TxnState::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// One `__transaction_state` value: the state of a transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnValue {
    pub producer_id: i64,
    /// Version 1 only (tag 0); -1 when absent.
    pub previous_producer_id: i64,
    /// Version 1 only (tag 1); -1 when absent.
    pub next_producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// `None` is the null array Kafka writes for Empty. Topics in the order written;
    /// each with its partition ids.
    pub partitions: Option<Vec<(String, Vec<i32>)>>,
    pub last_update_ms: i64,
    /// -1 when no transaction has started.
    pub start_ms: i64,
    /// Version 1 only (tag 2); 0 when absent.
    pub client_transaction_version: i16,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed __transaction_state record: {0}")]
pub struct TxnRecordError(pub &'static str);

/// The key of a transactional id's records.
pub fn encode_key(transactional_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + transactional_id.len());
    out.put_i16(KEY_VERSION);
    put_str(&mut out, transactional_id);
    out
}

/// The transactional id of a key.
pub fn decode_key(mut b: &[u8]) -> Result<String, TxnRecordError> {
    match get_i16(&mut b)? {
        KEY_VERSION => get_str(&mut b),
        _ => Err(TxnRecordError("unknown key version")),
    }
}

impl TxnValue {
    /// Encodes with `version` (0 or 1). Version 0 has no place for the tagged fields:
    /// they are dropped, as Kafka drops them.
    pub fn encode(&self, version: i16) -> Vec<u8> {
        assert!(
            (VALUE_VERSION_MIN..=VALUE_VERSION_MAX).contains(&version),
            "__transaction_state value version {version} is not supported"
        );
        let flexible = version >= 1;
        let mut out = Vec::with_capacity(64);
        out.put_i16(version);
        out.put_i64(self.producer_id);
        out.put_i16(self.producer_epoch);
        out.put_i32(self.timeout_ms);
        out.put_i8(self.state.id());
        match &self.partitions {
            None if flexible => put_uvarint(&mut out, 0),
            None => out.put_i32(-1),
            Some(topics) => {
                put_count(&mut out, topics.len(), flexible);
                for (topic, ids) in topics {
                    if flexible {
                        put_compact_str(&mut out, topic);
                    } else {
                        put_str(&mut out, topic);
                    }
                    put_count(&mut out, ids.len(), flexible);
                    for id in ids {
                        out.put_i32(*id);
                    }
                    if flexible {
                        put_uvarint(&mut out, 0); // no tagged fields in a partition entry
                    }
                }
            }
        }
        out.put_i64(self.last_update_ms);
        out.put_i64(self.start_ms);
        if flexible {
            let tags = [
                self.previous_producer_id != -1,
                self.next_producer_id != -1,
                self.client_transaction_version != 0,
            ];
            put_uvarint(&mut out, tags.iter().filter(|t| **t).count() as u32);
            if tags[0] {
                put_uvarint(&mut out, 0);
                put_uvarint(&mut out, 8);
                out.put_i64(self.previous_producer_id);
            }
            if tags[1] {
                put_uvarint(&mut out, 1);
                put_uvarint(&mut out, 8);
                out.put_i64(self.next_producer_id);
            }
            if tags[2] {
                put_uvarint(&mut out, 2);
                put_uvarint(&mut out, 2);
                out.put_i16(self.client_transaction_version);
            }
        }
        out
    }

    pub fn decode(mut b: &[u8]) -> Result<TxnValue, TxnRecordError> {
        let version = get_i16(&mut b)?;
        if !(VALUE_VERSION_MIN..=VALUE_VERSION_MAX).contains(&version) {
            return Err(TxnRecordError("unknown value version"));
        }
        let flexible = version >= 1;
        let producer_id = get_i64(&mut b)?;
        let producer_epoch = get_i16(&mut b)?;
        let timeout_ms = get_i32(&mut b)?;
        let state = TxnState::from_id(get_i8(&mut b)?).ok_or(TxnRecordError("unknown status"))?;
        let partitions = match get_count(&mut b, flexible)? {
            None => None,
            Some(n) => {
                // Each topic takes at least 2 bytes: refuse counts the bytes cannot hold.
                if n > b.len() / 2 {
                    return Err(TxnRecordError("partition count beyond the record"));
                }
                let mut topics = Vec::with_capacity(n);
                for _ in 0..n {
                    let topic = if flexible {
                        get_compact_str(&mut b)?
                    } else {
                        get_str(&mut b)?
                    };
                    let m = get_count(&mut b, flexible)?
                        .ok_or(TxnRecordError("null partition id array"))?;
                    if m > b.len() / 4 {
                        return Err(TxnRecordError("partition id count beyond the record"));
                    }
                    let mut ids = Vec::with_capacity(m);
                    for _ in 0..m {
                        ids.push(get_i32(&mut b)?);
                    }
                    if flexible {
                        skip_tagged_fields(&mut b)?;
                    }
                    topics.push((topic, ids));
                }
                Some(topics)
            }
        };
        let last_update_ms = get_i64(&mut b)?;
        let start_ms = get_i64(&mut b)?;
        let mut v = TxnValue {
            producer_id,
            previous_producer_id: -1,
            next_producer_id: -1,
            producer_epoch,
            timeout_ms,
            state,
            partitions,
            last_update_ms,
            start_ms,
            client_transaction_version: 0,
        };
        if flexible {
            let n = get_uvarint(&mut b)?;
            for _ in 0..n {
                let tag = get_uvarint(&mut b)?;
                let size = get_uvarint(&mut b)? as usize;
                need(b, size)?;
                let mut field = &b[..size];
                match (tag, size) {
                    (0, 8) => v.previous_producer_id = field.get_i64(),
                    (1, 8) => v.next_producer_id = field.get_i64(),
                    (2, 2) => v.client_transaction_version = field.get_i16(),
                    (0..=2, _) => return Err(TxnRecordError("tagged field of the wrong size")),
                    _ => {} // a tag from a newer Kafka: skipped
                }
                b.advance(size);
            }
        }
        Ok(v)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Transactional ids and topic names are far below i16::MAX bytes (the request
    // decoders bound them); clamp rather than write a wrong length.
    let len = s.len().min(i16::MAX as usize);
    out.put_i16(len as i16);
    out.extend_from_slice(&s.as_bytes()[..len]);
}

fn put_compact_str(out: &mut Vec<u8>, s: &str) {
    let len = s.len().min(i16::MAX as usize);
    put_uvarint(out, len as u32 + 1);
    out.extend_from_slice(&s.as_bytes()[..len]);
}

fn put_count(out: &mut Vec<u8>, n: usize, flexible: bool) {
    if flexible {
        put_uvarint(out, n as u32 + 1);
    } else {
        out.put_i32(n as i32);
    }
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn need(b: &[u8], n: usize) -> Result<(), TxnRecordError> {
    if b.len() < n {
        Err(TxnRecordError("truncated"))
    } else {
        Ok(())
    }
}

fn get_i8(b: &mut &[u8]) -> Result<i8, TxnRecordError> {
    need(b, 1)?;
    Ok(b.get_i8())
}

fn get_i16(b: &mut &[u8]) -> Result<i16, TxnRecordError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

fn get_i32(b: &mut &[u8]) -> Result<i32, TxnRecordError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

fn get_i64(b: &mut &[u8]) -> Result<i64, TxnRecordError> {
    need(b, 8)?;
    Ok(b.get_i64())
}

fn get_uvarint(b: &mut &[u8]) -> Result<u32, TxnRecordError> {
    let mut v: u32 = 0;
    for i in 0..5 {
        need(b, 1)?;
        let byte = b.get_u8();
        v |= u32::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(TxnRecordError("varint longer than 5 bytes"))
}

fn utf8(b: &mut &[u8], len: usize) -> Result<String, TxnRecordError> {
    need(b, len)?;
    let s = std::str::from_utf8(&b[..len])
        .map_err(|_| TxnRecordError("string is not UTF-8"))?
        .to_string();
    b.advance(len);
    Ok(s)
}

fn get_str(b: &mut &[u8]) -> Result<String, TxnRecordError> {
    let len = get_i16(b)?;
    if len < 0 {
        return Err(TxnRecordError("null string"));
    }
    utf8(b, len as usize)
}

fn get_compact_str(b: &mut &[u8]) -> Result<String, TxnRecordError> {
    let len = get_uvarint(b)?;
    if len == 0 {
        return Err(TxnRecordError("null string"));
    }
    utf8(b, len as usize - 1)
}

/// An array count; `None` for a null array.
fn get_count(b: &mut &[u8], flexible: bool) -> Result<Option<usize>, TxnRecordError> {
    if flexible {
        let n = get_uvarint(b)?;
        Ok(n.checked_sub(1).map(|n| n as usize))
    } else {
        let n = get_i32(b)?;
        Ok((n >= 0).then_some(n as usize))
    }
}

fn skip_tagged_fields(b: &mut &[u8]) -> Result<(), TxnRecordError> {
    let n = get_uvarint(b)?;
    for _ in 0..n {
        let _tag = get_uvarint(b)?;
        let size = get_uvarint(b)? as usize;
        need(b, size)?;
        b.advance(size);
    }
    Ok(())
}
