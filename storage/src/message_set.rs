//! Kafka's message sets (message formats v0 and v1, "magic" 0 and 1): the record format
//! before v2 batches, still spoken by old clients (Produce v0–v2, Fetch v0–v3). The log
//! stores only v2 batches, so a message set is up-converted to one v2 batch before it
//! is appended ([`up_convert`]) and v2 batches are down-converted for an old fetcher
//! ([`down_convert`]), by Kafka's rules. Pure: bytes in, bytes or a [`MessageSetError`]
//! out.
//!
//! ## Byte layout of one message (big-endian)
//!
//! | bytes | field |
//! |------:|-------|
//! | 8 | offset (in a produce request anything: the broker assigns offsets) |
//! | 4 | message size: the bytes after this field |
//! | 4 | CRC-32 (IEEE 802.3, not the CRC-32C of v2 batches) of the bytes after it |
//! | 1 | magic: 0 or 1 |
//! | 1 | attributes: bits 0..2 compression codec, bit 3 (v1) timestamp type (1 = LogAppendTime) |
//! | 8 | timestamp, v1 only (v0 messages have none) |
//! | 4 + n | key, length -1 for null |
//! | 4 + n | value, length -1 for null |
//!
//! The magic byte sits at offset 16, as in a v2 batch ([`magic_of`] tells them apart).
//! A compressed message set is one wrapper message whose value holds the compressed
//! inner messages (magic 1: inner offsets relative, a LogAppendTime wrapper's timestamp
//! stands for all of them). gzip, snappy and lz4 wrappers are opened ([`crate::codec`];
//! magic-0 LZ4 with Kafka's old frame checksum) and the v2 batch is compressed with the
//! wrapper's codec again, as Kafka keeps the producer's codec; zstd, which Kafka allows
//! only in v2 batches, is refused ([`MessageSetError::Compressed`]). v2 batches are
//! down-converted to uncompressed messages (Kafka would compress them again; the records
//! are the same); zstd batches are refused there too. Decompressed data is bounded by
//! [`DECOMPRESSED_BYTES_MAX`].
//!
//! ## Conversion rules (Kafka's)
//!
//! - Up: the messages become the records of one uncompressed v2 batch, in order, with
//!   their keys, values and timestamps; v0 messages have no timestamp and keep none
//!   (-1, as Kafka's up-conversion; a LogAppendTime topic stamps the batch on append).
//!   No producer id, epoch or sequence; offsets are assigned on append as for any batch.
//! - Down: control batches are skipped (old consumers know no transaction markers and
//!   read uncommitted: aborted records are kept), records before the fetch offset are
//!   dropped, headers are dropped; each record keeps its offset; magic 1 keeps the
//!   timestamp and its type (a LogAppendTime batch gives every record its max
//!   timestamp). At least one message is returned even if larger than the byte limit.

use bytes::BufMut;

use crate::batch::{self, get_varint, put_varint, BatchHeader};
use crate::codec::{self, Codec, Lz4Framing};

/// Bytes before a message's CRC: offset and size.
const MESSAGE_OVERHEAD: usize = 12;
/// The smallest v0 message after its size field: CRC, magic, attributes, key and value
/// lengths.
const MIN_V0_BYTES: usize = 4 + 1 + 1 + 4 + 4;
/// Attribute bit 3 of a v1 message: the timestamp is LogAppendTime.
const ATTR_V1_LOG_APPEND_TIME: u8 = 1 << 3;
const ATTR_CODEC_MASK: u8 = 0x07;

const _: () = assert!(
    MESSAGE_OVERHEAD + 4 == 16,
    "magic sits at byte 16 in every format"
);

pub use crate::codec::DECOMPRESSED_BYTES_MAX;

/// Why a message set was refused (Kafka: CORRUPT_MESSAGE, or
/// UNSUPPORTED_COMPRESSION_TYPE for [`MessageSetError::Compressed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageSetError {
    #[error("message set is empty")]
    Empty,
    #[error("message at byte {at} is truncated")]
    Truncated { at: usize },
    #[error("message at byte {at} has magic {magic}; a message set holds magic 0 or 1")]
    BadMagic { at: usize, magic: i8 },
    #[error(
        "message at byte {at}: CRC-32 mismatch (stored {stored:#010x}, computed {computed:#010x})"
    )]
    CrcMismatch {
        at: usize,
        stored: u32,
        computed: u32,
    },
    #[error("message at byte {at} has a size its fields do not fill")]
    BadSize { at: usize },
    /// zstd (Kafka allows it only in v2 batches) or a codec Kafka does not define.
    #[error("compression codec {0} is not allowed in message formats v0 and v1")]
    Compressed(u8),
    #[error("v2 batch at byte {at} does not parse")]
    BadBatch { at: usize },
    #[error("{0}")]
    Inflate(String),
}

/// Undoes codec `codec` of a wrapper message of `magic` (or a v2 batch read for an old
/// fetcher, `magic` 1): gzip, snappy and lz4 (with Kafka's magic-0 LZ4 framing); zstd,
/// which Kafka allows only in v2 batches, and unknown codecs are refused.
fn decompress(codec: u8, data: &[u8], magic: i8) -> Result<Vec<u8>, MessageSetError> {
    let framing = if magic == 0 {
        Lz4Framing::LegacyMagic0
    } else {
        Lz4Framing::Standard
    };
    match Codec::from_id(codec) {
        Some(c @ (Codec::Gzip | Codec::Snappy | Codec::Lz4)) => {
            codec::decompress(c, data, framing).map_err(|e| MessageSetError::Inflate(e.to_string()))
        }
        _ => Err(MessageSetError::Compressed(codec)),
    }
}

/// The record format of the data at `records[0]`: the magic byte at offset 16 (0 or 1:
/// a message set, 2: a v2 batch), `None` if the data is too short to say.
pub fn magic_of(records: &[u8]) -> Option<i8> {
    records.get(MESSAGE_OVERHEAD + 4).map(|&m| m as i8)
}

/// True if `records` starts like a message set: a size field that can hold a message
/// and magic 0 or 1 (Kafka reads anything shorter as a corrupt record, not as a format).
pub fn looks_like_message_set(records: &[u8]) -> bool {
    let size = records
        .get(8..12)
        .map(|b| i32::from_be_bytes(b.try_into().expect("4 bytes")));
    size.is_some_and(|n| n >= MIN_V0_BYTES as i32) && matches!(magic_of(records), Some(0 | 1))
}

/// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) as message formats v0 and v1 use.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = CRC32_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

const CRC32_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// One message of a message set, or one record to write as a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub offset: i64,
    pub magic: i8,
    /// `None` for magic 0 (no timestamp).
    pub timestamp: Option<i64>,
    pub log_append_time: bool,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if buf.len() < n {
        return None;
    }
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    Some(head)
}

fn take_i32(buf: &mut &[u8]) -> Option<i32> {
    take(buf, 4).map(|b| i32::from_be_bytes(b.try_into().expect("4 bytes")))
}

fn take_bytes<'a>(buf: &mut &'a [u8]) -> Option<Option<&'a [u8]>> {
    let len = take_i32(buf)?;
    if len < 0 {
        return Some(None);
    }
    take(buf, len as usize).map(Some)
}

/// Parses and checks every message of an uncompressed message set: complete, magic 0
/// or 1, CRC-32 right, fields filling the size exactly. A compressed wrapper is
/// refused.
pub fn parse(set: &[u8]) -> Result<Vec<Message<'_>>, MessageSetError> {
    let raw = parse_raw(set)?;
    if let Some((_, codec)) = raw.iter().find(|(_, codec)| *codec != 0) {
        return Err(MessageSetError::Compressed(*codec));
    }
    Ok(raw.into_iter().map(|(m, _)| m).collect())
}

/// Like [`parse`], but compressed wrappers are returned with their codec.
fn parse_raw(set: &[u8]) -> Result<Vec<(Message<'_>, u8)>, MessageSetError> {
    if set.is_empty() {
        return Err(MessageSetError::Empty);
    }
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < set.len() {
        let at = pos;
        let mut rest = &set[pos..];
        let truncated = MessageSetError::Truncated { at };
        let head = take(&mut rest, MESSAGE_OVERHEAD).ok_or(truncated.clone())?;
        let offset = i64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
        let size = i32::from_be_bytes(head[8..].try_into().expect("4 bytes"));
        if size < MIN_V0_BYTES as i32 {
            return Err(MessageSetError::BadSize { at });
        }
        let mut body = take(&mut rest, size as usize).ok_or(truncated)?;
        pos += MESSAGE_OVERHEAD + size as usize;
        let stored = u32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
        let computed = crc32(&body[4..]);
        if stored != computed {
            return Err(MessageSetError::CrcMismatch {
                at,
                stored,
                computed,
            });
        }
        body = &body[4..];
        let magic = body[0] as i8;
        let attributes = body[1];
        body = &body[2..];
        if !(0..=1).contains(&magic) {
            return Err(MessageSetError::BadMagic { at, magic });
        }
        let bad_size = MessageSetError::BadSize { at };
        let timestamp = if magic == 1 {
            let ts = take(&mut body, 8).ok_or(bad_size.clone())?;
            Some(i64::from_be_bytes(ts.try_into().expect("8 bytes")))
        } else {
            None
        };
        let key = take_bytes(&mut body).ok_or(bad_size.clone())?;
        let value = take_bytes(&mut body).ok_or(bad_size.clone())?;
        if !body.is_empty() {
            return Err(bad_size);
        }
        let message = Message {
            offset,
            magic,
            timestamp,
            log_append_time: magic == 1 && attributes & ATTR_V1_LOG_APPEND_TIME != 0,
            key,
            value,
        };
        out.push((message, attributes & ATTR_CODEC_MASK));
    }
    Ok(out)
}

/// The messages of `raw` with gzip wrappers opened: their inner messages, which take
/// a LogAppendTime wrapper's timestamp. `inflated` holds the decompressed sets (one
/// per wrapper, in order) that the returned messages borrow.
fn flatten<'a>(
    raw: &[(Message<'a>, u8)],
    inflated: &'a [Vec<u8>],
) -> Result<Vec<Message<'a>>, MessageSetError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut sets = inflated.iter();
    for (m, codec) in raw {
        if *codec == 0 {
            out.push(m.clone());
            continue;
        }
        let inner = parse(sets.next().expect("one inflated set per wrapper"))?;
        out.extend(inner.into_iter().map(|i| Message {
            timestamp: if m.log_append_time {
                m.timestamp
            } else {
                i.timestamp
            },
            ..i
        }));
    }
    Ok(out)
}

/// Appends `m` as a message of `m.magic` (0 or 1) with its offset.
pub fn write_message(out: &mut Vec<u8>, m: &Message<'_>) {
    let start = out.len();
    out.put_i64(m.offset);
    out.put_i32(0); // size, filled below
    out.put_u32(0); // CRC, filled below
    out.put_i8(m.magic);
    let attributes = if m.magic == 1 && m.log_append_time {
        ATTR_V1_LOG_APPEND_TIME
    } else {
        0
    };
    out.put_u8(attributes);
    if m.magic == 1 {
        out.put_i64(m.timestamp.unwrap_or(-1));
    }
    for field in [m.key, m.value] {
        match field {
            Some(b) => {
                out.put_i32(b.len() as i32);
                out.extend_from_slice(b);
            }
            None => out.put_i32(-1),
        }
    }
    let size = (out.len() - start - MESSAGE_OVERHEAD) as i32;
    out[start + 8..start + 12].copy_from_slice(&size.to_be_bytes());
    let crc = crc32(&out[start + 16..]);
    out[start + 12..start + 16].copy_from_slice(&crc.to_be_bytes());
}

/// One uncompressed v2 batch holding the messages of `set` as its records (base offset
/// and leader epoch 0: the append assigns them). See the module doc for the rules.
pub fn up_convert(set: &[u8]) -> Result<Vec<u8>, MessageSetError> {
    let raw = parse_raw(set)?;
    let inflated = raw
        .iter()
        .filter(|(_, codec)| *codec != 0)
        .map(|(m, codec)| decompress(*codec, m.value.unwrap_or_default(), m.magic))
        .collect::<Result<Vec<_>, _>>()?;
    let messages = flatten(&raw, &inflated)?;
    if messages.is_empty() {
        return Err(MessageSetError::Empty);
    }
    let base_timestamp = messages[0].timestamp.unwrap_or(-1);
    let max_timestamp = messages
        .iter()
        .map(|m| m.timestamp.unwrap_or(-1))
        .max()
        .unwrap_or(-1);
    let mut body = Vec::with_capacity(set.len());
    let mut rec = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        rec.clear();
        rec.push(0u8); // record attributes
        put_varint(&mut rec, m.timestamp.unwrap_or(-1) - base_timestamp);
        put_varint(&mut rec, i as i64);
        for field in [m.key, m.value] {
            match field {
                Some(b) => {
                    put_varint(&mut rec, b.len() as i64);
                    rec.extend_from_slice(b);
                }
                None => put_varint(&mut rec, -1),
            }
        }
        put_varint(&mut rec, 0); // no headers
        put_varint(&mut body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }
    let n = messages.len() as i32;
    let mut out = Vec::with_capacity(batch::HEADER_BYTES + body.len());
    out.put_i64(0);
    out.put_i32((batch::HEADER_BYTES - batch::LOG_OVERHEAD + body.len()) as i32);
    out.put_i32(0); // leader epoch
    out.put_i8(2);
    out.put_u32(0); // CRC-32C, filled below
    out.put_i16(0); // uncompressed, CreateTime
    out.put_i32(n - 1);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(-1); // producer id
    out.put_i16(-1); // producer epoch
    out.put_i32(-1); // base sequence
    out.put_i32(n);
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out[batch::OFF_ATTRIBUTES..]);
    out[batch::OFF_ATTRIBUTES - 4..batch::OFF_ATTRIBUTES].copy_from_slice(&crc.to_be_bytes());
    assert!(
        batch::validate(&out, true).is_ok(),
        "an up-converted batch validates"
    );
    // Kafka keeps the producer's codec: the batch is compressed as its wrapper was.
    match raw.iter().map(|(_, c)| *c).find(|c| *c != 0) {
        None => Ok(out),
        Some(c) => {
            let c = Codec::from_id(c).expect("decompressed above, so a known codec");
            codec::recompress_batch(&out, c, codec::Levels::default())
                .map_err(|e| MessageSetError::Inflate(e.to_string()))
        }
    }
}

/// The v2 batches in `batches` (complete ones; a trailing partial batch is ignored, as
/// a fetch may cut one) as messages of `magic` (0 or 1) from `fetch_offset` on, at most
/// `max_bytes` of them but always the first message. See the module doc for the rules.
pub fn down_convert(
    batches: &[u8],
    magic: i8,
    fetch_offset: i64,
    max_bytes: usize,
) -> Result<Vec<u8>, MessageSetError> {
    assert!((0..=1).contains(&magic), "down-conversion to magic {magic}");
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(total) = batch::peek_total_bytes(&batches[pos..]) {
        if pos + total > batches.len() {
            break;
        }
        let b = &batches[pos..pos + total];
        let at = pos;
        pos += total;
        let h = BatchHeader::parse(b).map_err(|_| MessageSetError::BadBatch { at })?;
        if h.is_control() {
            continue;
        }
        let inflated;
        let mut recs = &b[batch::HEADER_BYTES..];
        if h.compression() != 0 {
            inflated = decompress(h.compression() as u8, recs, 1)?;
            recs = &inflated;
        }
        let log_append = h.attributes & batch::ATTR_TIMESTAMP_LOG_APPEND != 0;
        for _ in 0..h.record_count {
            let r = read_record(&mut recs).ok_or(MessageSetError::BadBatch { at })?;
            let offset = h.base_offset + r.offset_delta;
            if offset < fetch_offset {
                continue;
            }
            let m = Message {
                offset,
                magic,
                timestamp: Some(if log_append {
                    h.max_timestamp
                } else {
                    h.base_timestamp + r.timestamp_delta
                }),
                log_append_time: log_append,
                key: r.key,
                value: r.value,
            };
            let before = out.len();
            write_message(&mut out, &m);
            if out.len() > max_bytes && before > 0 {
                out.truncate(before);
                return Ok(out);
            }
        }
    }
    Ok(out)
}

struct Record<'a> {
    timestamp_delta: i64,
    offset_delta: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

fn read_record<'a>(buf: &mut &'a [u8]) -> Option<Record<'a>> {
    let len = usize::try_from(get_varint(buf)?).ok()?;
    let mut rec = take(buf, len)?;
    take(&mut rec, 1)?; // record attributes
    let timestamp_delta = get_varint(&mut rec)?;
    let offset_delta = get_varint(&mut rec)?;
    let field = |rec: &mut &'a [u8]| -> Option<Option<&'a [u8]>> {
        let n = get_varint(rec)?;
        if n < 0 {
            return Some(None);
        }
        take(rec, usize::try_from(n).ok()?).map(Some)
    };
    let key = field(&mut rec)?;
    let value = field(&mut rec)?;
    // Headers follow; old formats have none, so they are dropped.
    Some(Record {
        timestamp_delta,
        offset_delta,
        key,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(
        magic: i8,
        ts: Option<i64>,
        key: Option<&'static [u8]>,
        value: &'static [u8],
    ) -> Message<'static> {
        Message {
            offset: 0,
            magic,
            timestamp: ts,
            log_append_time: false,
            key,
            value: Some(value),
        }
    }

    fn set(messages: &[Message<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            write_message(&mut out, m);
        }
        out
    }

    #[test]
    fn crc32_is_ieee_not_castagnoli() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_ne!(crc32(b"123456789"), crc32c::crc32c(b"123456789"));
    }

    #[test]
    fn a_v0_message_has_kafkas_layout() {
        let s = set(&[msg(0, None, Some(b"k".as_slice()), b"val")]);
        // offset 0, size 4+1+1+4+1+4+3 = 18, CRC, magic 0, attributes 0, key, value.
        let body = &s[16..];
        assert_eq!(&s[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 18]);
        assert_eq!(
            body,
            &[0, 0, 0, 0, 0, 1, b'k', 0, 0, 0, 3, b'v', b'a', b'l']
        );
        assert_eq!(&s[12..16], &crc32(body).to_be_bytes());
        assert_eq!(magic_of(&s), Some(0));
    }

    #[test]
    fn message_sets_are_told_from_batches_and_garbage() {
        let v1 = set(&[msg(1, Some(1), None, b"x")]);
        assert!(looks_like_message_set(&v1));
        assert!(!looks_like_message_set(&batch::build::simple(1, 1, 3)));
        assert!(!looks_like_message_set(&[0u8; 30]));
        assert!(!looks_like_message_set(&v1[..16]));
    }

    #[test]
    fn a_v1_message_carries_its_timestamp() {
        let s = set(&[msg(1, Some(0x0102), None, b"v")]);
        assert_eq!(s.len(), 12 + 4 + 2 + 8 + 4 + 5);
        assert_eq!(&s[18..26], &0x0102i64.to_be_bytes());
        assert_eq!(&s[26..30], &(-1i32).to_be_bytes(), "null key");
    }

    #[test]
    fn up_conversion_keeps_records_and_round_trips_down() {
        for magic in [0i8, 1] {
            let ts = |t| (magic == 1).then_some(t);
            let messages = [
                msg(magic, ts(1_000), Some(b"a".as_slice()), b"one"),
                Message {
                    value: None,
                    ..msg(magic, ts(1_005), None, b"")
                },
                msg(magic, ts(990), Some(b"".as_slice()), b"three"),
            ];
            let b = up_convert(&set(&messages)).unwrap();
            let h = batch::validate(&b, true).unwrap();
            assert_eq!(
                (h.record_count, h.producer_id, h.base_sequence),
                (3, -1, -1)
            );
            let want_ts: Vec<(i64, i64)> = if magic == 1 {
                assert_eq!((h.base_timestamp, h.max_timestamp), (1_000, 1_005));
                vec![(0, 1_000), (1, 1_005), (2, 990)]
            } else {
                assert_eq!((h.base_timestamp, h.max_timestamp), (-1, -1));
                vec![(0, -1), (1, -1), (2, -1)]
            };
            assert_eq!(batch::record_timestamps(&b).unwrap(), want_ts);
            // Stored at offset 40, read back by an old fetcher of the same format.
            let mut stored = b.clone();
            batch::assign(&mut stored, 40, 3, None);
            let back = down_convert(&stored, magic, 0, usize::MAX).unwrap();
            let got = parse(&back).unwrap();
            let want: Vec<Message<'_>> = messages
                .iter()
                .enumerate()
                .map(|(i, m)| Message {
                    offset: 40 + i as i64,
                    timestamp: if magic == 1 { m.timestamp } else { None },
                    ..m.clone()
                })
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn down_conversion_follows_kafkas_rules() {
        let mut a =
            batch::build::batch(5_000, &[(Some(&b"k0"[..]), &b"v0"[..]), (None, &b"v1"[..])]);
        batch::assign(&mut a, 10, 0, None);
        let mut marker = batch::end_txn_marker_batch(
            7,
            0,
            batch::EndTxnMarker {
                commit: false,
                coordinator_epoch: 0,
            },
            6_000,
        );
        batch::assign(&mut marker, 12, 0, None);
        let mut c = batch::build::batch(7_000, &[(None, &b"v3"[..]), (None, &b"v4"[..])]);
        batch::assign(&mut c, 13, 0, Some(9_999));
        let all = [a.clone(), marker, c].concat();
        // Magic 1: control batch skipped, LogAppendTime batches stamp every record.
        let v1 = parse(&down_convert(&all, 1, 0, usize::MAX).unwrap())
            .unwrap()
            .into_iter()
            .map(|m| {
                (
                    m.offset,
                    m.timestamp,
                    m.log_append_time,
                    m.value.unwrap().to_vec(),
                )
            })
            .collect::<Vec<_>>();
        assert_eq!(
            v1,
            vec![
                (10, Some(5_000), false, b"v0".to_vec()),
                (11, Some(5_001), false, b"v1".to_vec()),
                (13, Some(9_999), true, b"v3".to_vec()),
                (14, Some(9_999), true, b"v4".to_vec()),
            ]
        );
        // Records before the fetch offset are dropped; magic 0 has no timestamps.
        let v0_bytes = down_convert(&all, 0, 11, usize::MAX).unwrap();
        let v0 = parse(&v0_bytes).unwrap();
        let offsets: Vec<i64> = v0.iter().map(|m| m.offset).collect();
        assert_eq!(offsets, vec![11, 13, 14]);
        assert!(v0.iter().all(|m| m.magic == 0 && m.timestamp.is_none()));
        // The byte limit stops before a message that does not fit, but the first
        // message is always returned; a trailing partial batch is ignored.
        let one = down_convert(&all, 0, 0, 1).unwrap();
        assert_eq!(parse(&one).unwrap().len(), 1);
        let first_two = down_convert(&all, 0, 0, 2 * (12 + 18) + 1).unwrap();
        assert_eq!(parse(&first_two).unwrap().len(), 2);
        let cut = down_convert(&all[..all.len() - 3], 1, 0, usize::MAX).unwrap();
        assert_eq!(parse(&cut).unwrap().len(), 2);
    }

    #[test]
    fn bad_message_sets_are_refused() {
        let good = set(&[msg(1, Some(1), None, b"x"), msg(1, Some(2), None, b"y")]);
        assert_eq!(up_convert(&[]), Err(MessageSetError::Empty));
        assert!(matches!(
            up_convert(&good[..good.len() - 1]),
            Err(MessageSetError::Truncated { .. })
        ));
        let mut bad_crc = good.clone();
        *bad_crc.last_mut().unwrap() ^= 1;
        assert!(matches!(
            up_convert(&bad_crc),
            Err(MessageSetError::CrcMismatch { .. })
        ));
        let mut compressed = set(&[msg(1, Some(1), None, b"x")]);
        compressed[17] = 4; // zstd: v2 batches only
        let crc = crc32(&compressed[16..]);
        compressed[12..16].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(up_convert(&compressed), Err(MessageSetError::Compressed(4)));
        compressed[17] = 5; // no such codec
        let crc = crc32(&compressed[16..]);
        compressed[12..16].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(up_convert(&compressed), Err(MessageSetError::Compressed(5)));
        let mut magic2 = set(&[msg(1, Some(1), None, b"x")]);
        magic2[16] = 2;
        let crc = crc32(&magic2[16..]);
        magic2[12..16].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            up_convert(&magic2),
            Err(MessageSetError::BadMagic { magic: 2, .. })
        ));
        let zstd_batch = codec::recompress_batch(
            &batch::build::simple(1, 1, 3),
            Codec::Zstd,
            codec::Levels::default(),
        )
        .unwrap();
        assert_eq!(
            down_convert(&zstd_batch, 1, 0, usize::MAX),
            Err(MessageSetError::Compressed(4))
        );
        let mut bad_gzip = set(&[msg(1, Some(1), None, b"not gzip")]);
        bad_gzip[17] = 1;
        let crc = crc32(&bad_gzip[16..]);
        bad_gzip[12..16].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            up_convert(&bad_gzip),
            Err(MessageSetError::Inflate(_))
        ));
    }

    #[test]
    fn compressed_wrappers_are_opened_on_up_conversion() {
        // Magic 1 wrapper: inner offsets relative; a LogAppendTime wrapper's timestamp
        // stands for its messages, a CreateTime one leaves theirs.
        let cases = [Codec::Gzip, Codec::Snappy, Codec::Lz4]
            .into_iter()
            .flat_map(|c| [(c, false, [10, 20]), (c, true, [99, 99])]);
        for (c, wrapper_log_append, want_ts) in cases {
            let inner = set(&[
                Message {
                    offset: 0,
                    ..msg(1, Some(10), Some(b"a".as_slice()), b"one")
                },
                Message {
                    offset: 1,
                    ..msg(1, Some(20), None, b"two")
                },
            ]);
            let compressed = codec::compress(c, &inner, codec::Levels::default());
            let mut wrapper = set(&[Message {
                offset: 1,
                log_append_time: wrapper_log_append,
                value: Some(&compressed),
                ..msg(1, Some(99), None, b"")
            }]);
            wrapper[17] |= c.id();
            let crc = crc32(&wrapper[16..]);
            wrapper[12..16].copy_from_slice(&crc.to_be_bytes());
            let plain = set(&[msg(1, Some(30), None, b"plain")]);
            let b = up_convert(&[wrapper, plain].concat()).unwrap();
            let h = batch::validate(&b, true).unwrap();
            assert_eq!((h.record_count, h.compression()), (3, c.id() as i16));
            let plain_batch =
                codec::recompress_batch(&b, Codec::None, codec::Levels::default()).unwrap();
            let ts: Vec<i64> = batch::record_timestamps(&plain_batch)
                .unwrap()
                .into_iter()
                .map(|(_, t)| t)
                .collect();
            assert_eq!(ts, vec![want_ts[0], want_ts[1], 30]);
            let back = down_convert(&b, 1, 0, usize::MAX).unwrap();
            let msgs = parse(&back).unwrap();
            let values: Vec<&[u8]> = msgs.iter().map(|m| m.value.unwrap()).collect();
            assert_eq!(values, vec![&b"one"[..], b"two", b"plain"]);
        }
    }

    #[test]
    fn a_magic_0_lz4_wrapper_with_kafkas_old_checksum_is_read() {
        let inner = set(&[msg(0, None, None, b"zero")]);
        let mut compressed = codec::compress(Codec::Lz4, &inner, codec::Levels::default());
        // Kafka before 0.10 checksummed the magic number with the descriptor.
        let hc = (twox_hash::XxHash32::oneshot(0, &compressed[..6]) >> 8) as u8;
        compressed[6] = hc;
        for (magic, ok) in [(0, true), (1, false)] {
            let mut wrapper = set(&[Message {
                value: Some(&compressed),
                ..msg(magic, (magic == 1).then_some(5), None, b"")
            }]);
            wrapper[17] |= Codec::Lz4.id();
            let crc = crc32(&wrapper[16..]);
            wrapper[12..16].copy_from_slice(&crc.to_be_bytes());
            assert_eq!(up_convert(&wrapper).is_ok(), ok, "magic {magic}");
        }
    }

    #[test]
    fn compressed_batches_are_down_converted_but_zstd_is_refused() {
        let plain = batch::build::batch(500, &[(Some(&b"k"[..]), &b"v0"[..]), (None, &b"v1"[..])]);
        for c in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let mut b = codec::recompress_batch(&plain, c, codec::Levels::default()).unwrap();
            batch::assign(&mut b, 7, 0, None);
            let converted = down_convert(&b, 1, 8, usize::MAX);
            if c == Codec::Zstd {
                assert_eq!(converted, Err(MessageSetError::Compressed(4)));
                continue;
            }
            let got = parse(&converted.unwrap())
                .unwrap()
                .into_iter()
                .map(|m| (m.offset, m.timestamp, m.value.unwrap().to_vec()))
                .collect::<Vec<_>>();
            assert_eq!(got, vec![(8, Some(501), b"v1".to_vec())], "{c:?}");
        }
    }
}
