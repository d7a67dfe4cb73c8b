//! Kafka v2 record batches: header layout, validation and offset assignment.
//!
//! Pure code: bytes in, values or a [`BatchError`] out. No I/O, no clock.
//!
//! ## Byte layout of a v2 batch header (big-endian, 61 bytes)
//!
//! | offset | size | field                  | covered by CRC |
//! |-------:|-----:|------------------------|----------------|
//! | 0      | 8    | base offset            | no             |
//! | 8      | 4    | batch length (bytes after this field) | no |
//! | 12     | 4    | partition leader epoch | no             |
//! | 16     | 1    | magic (= 2)            | no             |
//! | 17     | 4    | CRC-32C of bytes 21..  | —              |
//! | 21     | 2    | attributes             | yes            |
//! | 23     | 4    | last offset delta      | yes            |
//! | 27     | 8    | base timestamp         | yes            |
//! | 35     | 8    | max timestamp          | yes            |
//! | 43     | 8    | producer id            | yes            |
//! | 51     | 2    | producer epoch         | yes            |
//! | 53     | 4    | base sequence          | yes            |
//! | 57     | 4    | record count           | yes            |
//! | 61     | …    | records                | yes            |
//!
//! The base offset and the leader epoch sit outside the CRC, which is what lets the
//! broker assign offsets without recomputing it. Switching a batch to LogAppendTime
//! rewrites the attributes and max timestamp, which are covered, so that path
//! recomputes the CRC.
//!
//! ## End-transaction markers (Kafka's control batches)
//!
//! A transaction ends with a control batch (attributes: transactional | control)
//! holding one record, written by the broker for the transaction coordinator. The batch
//! carries the producer id and epoch, base sequence -1 (markers have no sequence), and
//! its one record (timestamp and offset delta 0, no headers) has
//!
//! | part  | bytes | field |
//! |-------|------:|-------|
//! | key   | 2 | control record version i16 (0) |
//! |       | 2 | control type i16: ABORT = 0, COMMIT = 1 |
//! | value | 2 | end-transaction marker version i16 (0) |
//! |       | 4 | coordinator epoch i32 |
//!
//! [`end_txn_marker_batch`] builds one, [`parse_end_txn_marker`] reads one back.

use bytes::{Buf, BufMut};

/// Size of the fixed v2 batch header.
pub const HEADER_BYTES: usize = 61;
/// Bytes before the batch length field ends: base offset + length.
pub const LOG_OVERHEAD: usize = 12;

const OFF_BASE_OFFSET: usize = 0;
const OFF_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
pub const OFF_ATTRIBUTES: usize = 21;
pub const OFF_LAST_OFFSET_DELTA: usize = 23;
pub const OFF_BASE_TIMESTAMP: usize = 27;
pub const OFF_MAX_TIMESTAMP: usize = 35;
pub const OFF_PRODUCER_ID: usize = 43;
pub const OFF_PRODUCER_EPOCH: usize = 51;
pub const OFF_BASE_SEQUENCE: usize = 53;
pub const OFF_RECORD_COUNT: usize = 57;

// Pin the layout: the table above and the constants must agree.
const _: () = assert!(OFF_RECORD_COUNT + 4 == HEADER_BYTES);
const _: () = assert!(OFF_LENGTH + 4 == LOG_OVERHEAD);
const _: () = assert!(OFF_CRC + 4 == OFF_ATTRIBUTES);

/// Attribute bit: timestamps are LogAppendTime (set by the broker).
pub const ATTR_TIMESTAMP_LOG_APPEND: i16 = 1 << 3;
/// Attribute bit: the batch belongs to a transaction.
pub const ATTR_TRANSACTIONAL: i16 = 1 << 4;
/// Attribute bit: a control batch (transaction marker).
pub const ATTR_CONTROL: i16 = 1 << 5;
/// Attribute bits 0..2: compression codec.
pub const ATTR_COMPRESSION_MASK: i16 = 0x07;

/// Why a batch was refused. Nothing is written when any of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch is {actual} bytes, shorter than the {HEADER_BYTES}-byte v2 header")]
    TooShort { actual: usize },
    #[error("batch length field says {declared} bytes follow it, but {actual} do")]
    LengthMismatch { declared: i64, actual: usize },
    #[error("batch magic is {0}; only magic 2 (Kafka v2 record batches) is stored")]
    BadMagic(i8),
    #[error("batch CRC-32C mismatch: header has {stored:#010x}, contents give {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("record count {count} is inconsistent with last offset delta {last_offset_delta}")]
    BadRecordCount { count: i32, last_offset_delta: i32 },
    #[error("batch of {size} bytes is larger than the limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    /// Only the broker writes control batches (transaction markers); Kafka refuses them
    /// from clients (INVALID_RECORD).
    #[error("clients may not write control batches")]
    ControlBatchFromClient,
}

/// The parsed header of one v2 batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Bytes after the length field; the whole batch is `LOG_OVERHEAD + batch_length`.
    pub batch_length: i32,
    pub leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Parses the fixed header without checking anything but its size.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < HEADER_BYTES {
            return Err(BatchError::TooShort { actual: buf.len() });
        }
        let mut b = &buf[..HEADER_BYTES];
        Ok(BatchHeader {
            base_offset: b.get_i64(),
            batch_length: b.get_i32(),
            leader_epoch: b.get_i32(),
            magic: b.get_i8(),
            crc: b.get_u32(),
            attributes: b.get_i16(),
            last_offset_delta: b.get_i32(),
            base_timestamp: b.get_i64(),
            max_timestamp: b.get_i64(),
            producer_id: b.get_i64(),
            producer_epoch: b.get_i16(),
            base_sequence: b.get_i32(),
            record_count: b.get_i32(),
        })
    }

    /// Total bytes of the batch including base offset and length fields.
    pub fn total_bytes(&self) -> usize {
        LOG_OVERHEAD + self.batch_length.max(0) as usize
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    pub fn compression(&self) -> i16 {
        self.attributes & ATTR_COMPRESSION_MASK
    }
}

/// Kafka's control record type of a transaction's end (the control key's `type`).
pub const CONTROL_TYPE_ABORT: i16 = 0;
pub const CONTROL_TYPE_COMMIT: i16 = 1;

/// The contents of an end-transaction marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    /// COMMIT (true) or ABORT (false).
    pub commit: bool,
    /// The epoch of the transaction coordinator that wrote it (fences zombie coordinators).
    pub coordinator_epoch: i32,
}

/// Bytes of the control key (version, type) and of the marker value (version, epoch).
const CONTROL_KEY_BYTES: usize = 4;
const MARKER_VALUE_BYTES: usize = 6;

/// A control batch holding one end-transaction marker for `producer_id` at
/// `producer_epoch`, with base offset 0 and leader epoch 0 (the append assigns both)
/// and `timestamp` as its record's timestamp.
pub fn end_txn_marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    marker: EndTxnMarker,
    timestamp: i64,
) -> Vec<u8> {
    let mut rec = Vec::with_capacity(24);
    rec.push(0u8); // record attributes
    put_varint(&mut rec, 0); // timestamp delta
    put_varint(&mut rec, 0); // offset delta
    put_varint(&mut rec, CONTROL_KEY_BYTES as i64);
    rec.put_i16(0); // control key version
    rec.put_i16(if marker.commit {
        CONTROL_TYPE_COMMIT
    } else {
        CONTROL_TYPE_ABORT
    });
    put_varint(&mut rec, MARKER_VALUE_BYTES as i64);
    rec.put_i16(0); // marker value version
    rec.put_i32(marker.coordinator_epoch);
    put_varint(&mut rec, 0); // headers
    let mut body = Vec::with_capacity(rec.len() + 2);
    put_varint(&mut body, rec.len() as i64);
    body.extend_from_slice(&rec);
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.put_i64(0);
    out.put_i32((HEADER_BYTES - LOG_OVERHEAD + body.len()) as i32);
    out.put_i32(0);
    out.put_i8(2);
    out.put_u32(0); // CRC, filled below
    out.put_i16(ATTR_TRANSACTIONAL | ATTR_CONTROL);
    out.put_i32(0); // last offset delta: one record
    out.put_i64(timestamp);
    out.put_i64(timestamp);
    out.put_i64(producer_id);
    out.put_i16(producer_epoch);
    out.put_i32(-1); // markers carry no sequence
    out.put_i32(1);
    out.extend_from_slice(&body);
    let crc = computed_crc(&out);
    (&mut out[OFF_CRC..OFF_ATTRIBUTES]).put_u32(crc);
    out
}

/// The end-transaction marker in a control batch: `None` if the batch is not a control
/// batch, is empty (compaction emptied it), is compressed, or its first record is some
/// other control record or does not parse. Like Kafka, a newer marker value version is
/// read as version 0; a negative version is garbage.
pub fn parse_end_txn_marker(batch: &[u8]) -> Option<EndTxnMarker> {
    let h = BatchHeader::parse(batch).ok()?;
    if !h.is_control() || h.record_count < 1 || h.compression() != 0 {
        return None;
    }
    let mut buf = batch.get(HEADER_BYTES..)?;
    let len = usize::try_from(get_varint(&mut buf)?).ok()?;
    let mut rec = buf.get(..len)?;
    rec = rec.get(1..)?; // record attributes
    get_varint(&mut rec)?; // timestamp delta
    get_varint(&mut rec)?; // offset delta
    let klen = usize::try_from(get_varint(&mut rec)?).ok()?;
    let mut key = rec.get(..klen)?;
    rec = &rec[klen..];
    if key.len() < CONTROL_KEY_BYTES || key.get_i16() < 0 {
        return None;
    }
    let commit = match key.get_i16() {
        CONTROL_TYPE_ABORT => false,
        CONTROL_TYPE_COMMIT => true,
        _ => return None,
    };
    let vlen = usize::try_from(get_varint(&mut rec)?).ok()?;
    let mut value = rec.get(..vlen)?;
    if value.len() < MARKER_VALUE_BYTES || value.get_i16() < 0 {
        return None;
    }
    Some(EndTxnMarker {
        commit,
        coordinator_epoch: value.get_i32(),
    })
}

/// `batch` with every record removed: the header only, its producer id, epoch,
/// sequence, offsets and timestamps kept, record count 0, no compression, CRC
/// recomputed. What compaction leaves of a batch it must keep for the producer state
/// (Kafka's "retain empty").
pub fn emptied(batch: &[u8]) -> Vec<u8> {
    assert!(batch.len() >= HEADER_BYTES, "emptied on a partial batch");
    let mut out = batch[..HEADER_BYTES].to_vec();
    (&mut out[OFF_LENGTH..OFF_LEADER_EPOCH]).put_i32((HEADER_BYTES - LOG_OVERHEAD) as i32);
    let attrs = i16::from_be_bytes([out[OFF_ATTRIBUTES], out[OFF_ATTRIBUTES + 1]]);
    (&mut out[OFF_ATTRIBUTES..OFF_LAST_OFFSET_DELTA]).put_i16(attrs & !ATTR_COMPRESSION_MASK);
    (&mut out[OFF_RECORD_COUNT..HEADER_BYTES]).put_i32(0);
    let crc = computed_crc(&out);
    (&mut out[OFF_CRC..OFF_ATTRIBUTES]).put_u32(crc);
    out
}

/// Reads the total size of the batch starting at `buf[0]` from its length field, if the
/// length field is there. Used to walk a buffer of concatenated batches.
pub fn peek_total_bytes(buf: &[u8]) -> Option<usize> {
    if buf.len() < LOG_OVERHEAD {
        return None;
    }
    let len = i32::from_be_bytes(buf[OFF_LENGTH..LOG_OVERHEAD].try_into().ok()?);
    if len < (HEADER_BYTES - LOG_OVERHEAD) as i32 {
        return None;
    }
    Some(LOG_OVERHEAD + len as usize)
}

fn computed_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[OFF_ATTRIBUTES..])
}

/// Validates one complete batch that must fill `batch` exactly: magic 2, length field
/// matching the buffer, CRC-32C, and a record count consistent with the last offset
/// delta. `strict_count` demands `count == last_offset_delta + 1` (what producers send);
/// without it, fewer records than the delta span are allowed (compacted batches).
pub fn validate(batch: &[u8], strict_count: bool) -> Result<BatchHeader, BatchError> {
    let h = BatchHeader::parse(batch)?;
    let declared = i64::from(h.batch_length);
    if declared + LOG_OVERHEAD as i64 != batch.len() as i64 {
        return Err(BatchError::LengthMismatch {
            declared,
            actual: batch.len() - LOG_OVERHEAD,
        });
    }
    if h.magic != 2 {
        return Err(BatchError::BadMagic(h.magic));
    }
    let computed = computed_crc(batch);
    if computed != h.crc {
        return Err(BatchError::CrcMismatch {
            stored: h.crc,
            computed,
        });
    }
    let count_ok = if strict_count {
        h.record_count > 0 && i64::from(h.last_offset_delta) == i64::from(h.record_count) - 1
    } else {
        // A compacted batch may hold fewer records than its offset span, and may even
        // be empty (Kafka keeps empty batches to preserve producer state).
        h.record_count >= 0
            && h.last_offset_delta >= 0
            && i64::from(h.record_count) <= i64::from(h.last_offset_delta) + 1
    };
    // An uncompressed record takes at least 7 bytes (length, attributes, timestamp
    // delta, offset delta, key length, value length, header count): a count the bytes
    // cannot hold is a lie, whatever the offset delta says.
    let plausible = h.compression() != 0
        || i64::from(h.record_count) * 7 <= (batch.len() - HEADER_BYTES) as i64;
    if !count_ok || !plausible {
        return Err(BatchError::BadRecordCount {
            count: h.record_count,
            last_offset_delta: h.last_offset_delta,
        });
    }
    Ok(h)
}

/// Splits a buffer of concatenated batches, validating each (strict record counts, as
/// a producer sends them). Returns the header and byte range of each.
pub fn split_batches(buf: &[u8]) -> Result<Vec<(BatchHeader, std::ops::Range<usize>)>, BatchError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let rest = &buf[pos..];
        let total = match peek_total_bytes(rest) {
            Some(t) => t,
            None if rest.len() < HEADER_BYTES => {
                return Err(BatchError::TooShort { actual: rest.len() })
            }
            None => {
                let h = BatchHeader::parse(rest)?;
                return Err(BatchError::LengthMismatch {
                    declared: i64::from(h.batch_length),
                    actual: rest.len() - LOG_OVERHEAD,
                });
            }
        };
        if total > rest.len() {
            return Err(BatchError::LengthMismatch {
                declared: (total - LOG_OVERHEAD) as i64,
                actual: rest.len() - LOG_OVERHEAD,
            });
        }
        let h = validate(&rest[..total], true)?;
        out.push((h, pos..pos + total));
        pos += total;
    }
    Ok(out)
}

/// Walks a buffer of whole batches that were validated when they were stored (a
/// read's result): each batch's header and bytes, without checking them again (so
/// compacted and emptied batches pass). Stops at the first incomplete batch.
pub fn stored_batches(buf: &[u8]) -> impl Iterator<Item = (BatchHeader, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let total = peek_total_bytes(rest)?;
        if total > rest.len() {
            return None;
        }
        let (b, tail) = rest.split_at(total);
        rest = tail;
        Some((BatchHeader::parse(b).ok()?, b))
    })
}

/// Rewrites the fields the broker owns: base offset and leader epoch (outside the
/// CRC), and, for LogAppendTime topics, the timestamp type and max timestamp (inside
/// it, so the CRC is recomputed).
pub fn assign(batch: &mut [u8], base_offset: i64, leader_epoch: i32, log_append_time: Option<i64>) {
    assert!(
        batch.len() >= HEADER_BYTES,
        "assign on a partial batch header"
    );
    assign_fields(batch, base_offset, leader_epoch, log_append_time);
    if log_append_time.is_some() {
        let crc = computed_crc(batch);
        (&mut batch[OFF_CRC..OFF_ATTRIBUTES]).put_u32(crc);
    }
}

/// [`assign`] without copying the batch: returns the header, rewritten, and the rest
/// of `batch` as a slice of the caller's buffer (`bytes::Bytes`, shared, not copied).
/// Written one after the other they are the batch [`assign`] makes. For LogAppendTime
/// the CRC is recomputed over the rewritten header's covered part and the rest.
pub fn assign_header(
    batch: &bytes::Bytes,
    base_offset: i64,
    leader_epoch: i32,
    log_append_time: Option<i64>,
) -> (bytes::Bytes, bytes::Bytes) {
    assert!(
        batch.len() >= HEADER_BYTES,
        "assign on a partial batch header"
    );
    let mut head = [0u8; HEADER_BYTES];
    head.copy_from_slice(&batch[..HEADER_BYTES]);
    let body = batch.slice(HEADER_BYTES..);
    assign_fields(&mut head, base_offset, leader_epoch, log_append_time);
    if log_append_time.is_some() {
        // The CRC `assign` computes over the whole batch, from the two pieces.
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head[OFF_ATTRIBUTES..]), &body);
        (&mut head[OFF_CRC..OFF_ATTRIBUTES]).put_u32(crc);
    }
    (bytes::Bytes::copy_from_slice(&head), body)
}

/// The header fields of [`assign`], CRC aside.
fn assign_fields(
    head: &mut [u8],
    base_offset: i64,
    leader_epoch: i32,
    log_append_time: Option<i64>,
) {
    (&mut head[OFF_BASE_OFFSET..OFF_LENGTH]).put_i64(base_offset);
    (&mut head[OFF_LEADER_EPOCH..OFF_MAGIC]).put_i32(leader_epoch);
    if let Some(ts) = log_append_time {
        let attrs = i16::from_be_bytes([head[OFF_ATTRIBUTES], head[OFF_ATTRIBUTES + 1]]);
        (&mut head[OFF_ATTRIBUTES..OFF_LAST_OFFSET_DELTA])
            .put_i16(attrs | ATTR_TIMESTAMP_LOG_APPEND);
        (&mut head[OFF_MAX_TIMESTAMP..OFF_PRODUCER_ID]).put_i64(ts);
    }
}

/// Reads a zig-zag varint (Kafka record fields), advancing `buf`.
pub fn get_varint(buf: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    let mut shift = 0;
    loop {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
    Some(((value >> 1) as i64) ^ -((value & 1) as i64))
}

/// Appends a zig-zag varint.
pub fn put_varint(out: &mut impl BufMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// For an uncompressed batch, the (offset, timestamp) of each record, for timestamp
/// lookups. Returns `None` for compressed batches or records that do not parse.
pub fn record_timestamps(batch: &[u8]) -> Option<Vec<(i64, i64)>> {
    let h = BatchHeader::parse(batch).ok()?;
    if h.compression() != 0 {
        return None;
    }
    let log_append = h.attributes & ATTR_TIMESTAMP_LOG_APPEND != 0;
    let mut buf = &batch[HEADER_BYTES..];
    let mut out = Vec::with_capacity((h.record_count.max(0) as usize).min(buf.len() / 7));
    for _ in 0..h.record_count {
        let len = get_varint(&mut buf)?;
        let len = usize::try_from(len).ok()?;
        if len > buf.len() {
            return None;
        }
        let mut rec = &buf[..len];
        buf = &buf[len..];
        let _attributes = rec.first()?;
        rec = &rec[1..];
        let ts_delta = get_varint(&mut rec)?;
        let off_delta = get_varint(&mut rec)?;
        let ts = if log_append {
            h.max_timestamp
        } else {
            h.base_timestamp + ts_delta
        };
        out.push((h.base_offset + off_delta, ts));
    }
    Some(out)
}

/// Builders for tests and benchmarks: a valid uncompressed v2 batch.
pub mod build {
    use bytes::BufMut;

    /// A record for the builders: key and value, either of which may be null.
    pub type NullableRecord<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

    use super::put_varint;

    /// A batch of records `(key, value)` with `timestamp` as base timestamp; each record
    /// gets timestamp delta = its index. Base offset 0, leader epoch 0.
    pub fn batch(timestamp: i64, records: &[(Option<&[u8]>, &[u8])]) -> Vec<u8> {
        let recs: Vec<NullableRecord<'_>> = records.iter().map(|(k, v)| (*k, Some(*v))).collect();
        batch_nullable(timestamp, &recs)
    }

    /// Like [`batch`], but a `None` value is a null value (a tombstone).
    pub fn batch_nullable(timestamp: i64, records: &[NullableRecord<'_>]) -> Vec<u8> {
        let mut body = Vec::new();
        for (i, (key, value)) in records.iter().enumerate() {
            let mut rec = Vec::new();
            rec.push(0u8); // attributes
            put_varint(&mut rec, i as i64); // timestamp delta
            put_varint(&mut rec, i as i64); // offset delta
            match key {
                Some(k) => {
                    put_varint(&mut rec, k.len() as i64);
                    rec.extend_from_slice(k);
                }
                None => put_varint(&mut rec, -1),
            }
            match value {
                Some(v) => {
                    put_varint(&mut rec, v.len() as i64);
                    rec.extend_from_slice(v);
                }
                None => put_varint(&mut rec, -1),
            }
            put_varint(&mut rec, 0); // headers
            put_varint(&mut body, rec.len() as i64);
            body.extend_from_slice(&rec);
        }
        let n = records.len() as i32;
        let mut out = Vec::with_capacity(super::HEADER_BYTES + body.len());
        out.put_i64(0);
        out.put_i32((super::HEADER_BYTES - super::LOG_OVERHEAD + body.len()) as i32);
        out.put_i32(0);
        out.put_i8(2);
        out.put_u32(0); // CRC, filled below
        out.put_i16(0);
        out.put_i32(n - 1);
        out.put_i64(timestamp);
        out.put_i64(timestamp + i64::from(n.max(1) - 1));
        out.put_i64(-1);
        out.put_i16(-1);
        out.put_i32(-1);
        out.put_i32(n);
        out.extend_from_slice(&body);
        let crc = crc32c::crc32c(&out[super::OFF_ATTRIBUTES..]);
        out[super::OFF_CRC..super::OFF_ATTRIBUTES].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// A batch of `count` records of `value_bytes` bytes each, without keys.
    pub fn simple(timestamp: i64, count: usize, value_bytes: usize) -> Vec<u8> {
        let value = vec![b'x'; value_bytes];
        let recs: Vec<(Option<&[u8]>, &[u8])> = (0..count).map(|_| (None, &value[..])).collect();
        batch(timestamp, &recs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_batch_round_trips() {
        let b = build::simple(1_000, 3, 10);
        let h = validate(&b, true).unwrap();
        assert_eq!(h.record_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(h.max_timestamp, 1_002);
        assert_eq!(h.total_bytes(), b.len());
    }

    #[test]
    fn assign_keeps_crc_valid_and_sets_fields() {
        let mut b = build::simple(1_000, 2, 10);
        assign(&mut b, 42, 7, None);
        let h = validate(&b, true).unwrap();
        assert_eq!((h.base_offset, h.leader_epoch), (42, 7));
        assign(&mut b, 43, 7, Some(99_999));
        let h = validate(&b, true).unwrap();
        assert_eq!(h.max_timestamp, 99_999);
        assert_ne!(h.attributes & ATTR_TIMESTAMP_LOG_APPEND, 0);
        let ts = record_timestamps(&b).unwrap();
        assert_eq!(ts, vec![(43, 99_999), (44, 99_999)]);
    }

    #[test]
    fn assign_header_makes_the_same_batch_as_assign_without_copying_the_rest() {
        for append_time in [None, Some(99_999)] {
            let sent = bytes::Bytes::from(build::simple(1_000, 3, 10));
            let (head, body) = assign_header(&sent, 42, 7, append_time);
            assert_eq!(head.len(), HEADER_BYTES);
            // The rest is the sender's own bytes, not a copy of them.
            assert_eq!(body.as_ptr(), sent[HEADER_BYTES..].as_ptr());
            let mut whole = sent.to_vec();
            assign(&mut whole, 42, 7, append_time);
            assert_eq!([&head[..], &body[..]].concat(), whole);
            validate(&whole, true).unwrap();
        }
    }

    #[test]
    fn rejects_each_kind_of_bad_batch() {
        let good = build::simple(1, 2, 5);
        assert!(matches!(
            validate(&good[..30], true),
            Err(BatchError::TooShort { .. })
        ));
        let mut bad_magic = good.clone();
        bad_magic[OFF_MAGIC] = 1;
        assert_eq!(validate(&bad_magic, true), Err(BatchError::BadMagic(1)));
        let mut bad_crc = good.clone();
        *bad_crc.last_mut().unwrap() ^= 0xff;
        assert!(matches!(
            validate(&bad_crc, true),
            Err(BatchError::CrcMismatch { .. })
        ));
        let mut lie = good.clone();
        lie.push(0);
        assert!(matches!(
            validate(&lie, true),
            Err(BatchError::LengthMismatch { .. })
        ));
        let mut count = good.clone();
        count[OFF_RECORD_COUNT..HEADER_BYTES].copy_from_slice(&5i32.to_be_bytes());
        let crc = computed_crc(&count);
        count[OFF_CRC..OFF_ATTRIBUTES].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            validate(&count, true),
            Err(BatchError::BadRecordCount { .. })
        ));
    }

    #[test]
    fn end_txn_markers_round_trip_in_kafkas_layout() {
        for (commit, epoch) in [(true, 7), (false, 0), (true, i32::MAX)] {
            let m = EndTxnMarker {
                commit,
                coordinator_epoch: epoch,
            };
            let b = end_txn_marker_batch(42, 3, m, 1_234);
            let h = validate(&b, true).unwrap();
            assert!(h.is_control() && h.is_transactional());
            assert_eq!((h.producer_id, h.producer_epoch), (42, 3));
            assert_eq!(
                (h.base_sequence, h.record_count, h.max_timestamp),
                (-1, 1, 1_234)
            );
            assert_eq!(parse_end_txn_marker(&b), Some(m));
        }
        // Kafka's bytes for the record: length 16, attributes 0, deltas 0, key length 4,
        // key (version 0, type COMMIT), value length 6, value (version 0, epoch 5), no
        // headers (varints are zig-zag).
        let b = end_txn_marker_batch(
            1,
            0,
            EndTxnMarker {
                commit: true,
                coordinator_epoch: 5,
            },
            0,
        );
        assert_eq!(
            &b[HEADER_BYTES..],
            &[32, 0, 0, 0, 8, 0, 0, 0, 1, 12, 0, 0, 0, 0, 0, 5, 0][..]
        );
        // A data batch, or a control batch of another type, is no marker.
        assert_eq!(parse_end_txn_marker(&build::simple(1, 1, 3)), None);
        let mut other = b.clone();
        other[HEADER_BYTES + 8] = 2; // LEADER_CHANGE
        assert_eq!(parse_end_txn_marker(&other), None);
    }

    #[test]
    fn emptied_batches_keep_their_header_and_validate() {
        let mut b = build::simple(1_000, 4, 10);
        assign(&mut b, 40, 2, None);
        let e = emptied(&b);
        assert_eq!(e.len(), HEADER_BYTES);
        let h = validate(&e, false).unwrap();
        let orig = BatchHeader::parse(&b).unwrap();
        assert_eq!(h.record_count, 0);
        assert_eq!(
            (
                h.base_offset,
                h.last_offset(),
                h.max_timestamp,
                h.base_sequence
            ),
            (
                orig.base_offset,
                orig.last_offset(),
                orig.max_timestamp,
                orig.base_sequence
            )
        );
        assert!(
            validate(&e, true).is_err(),
            "producers never send empty batches"
        );
    }

    #[test]
    fn split_finds_each_batch_and_rejects_trailing_garbage() {
        let mut buf = build::simple(1, 1, 3);
        let first = buf.len();
        buf.extend(build::simple(2, 4, 3));
        let parts = split_batches(&buf).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1].1, first..buf.len());
        buf.extend_from_slice(&[1, 2, 3]);
        assert!(split_batches(&buf).is_err());
    }
}
