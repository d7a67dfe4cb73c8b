//! Kafka's compression codecs: the bytes a compressed batch (or a legacy wrapper
//! message) holds, made and undone, and whole v2 batches re-encoded with another codec.
//! Pure: bytes in, bytes or a [`CodecError`] out; CPU only, so a caller on a reactor
//! bounds what it hands in (a produced batch is bounded by `max.message.bytes`).
//!
//! | id | codec | crate | framing |
//! |---:|-------|-------|---------|
//! | 0 | none | — | — |
//! | 1 | gzip | flate2 (pure Rust) | gzip members (several are read as one stream) |
//! | 2 | snappy | snap (pure Rust) | written in xerial's framing (what Kafka's Java clients write and every client reads); raw snappy is read too (librdkafka writes it) |
//! | 3 | lz4 | lz4_flex (pure Rust) | LZ4 frames, 64 KiB independent blocks |
//! | 4 | zstd | zstd (libzstd, C) | one zstd frame |
//!
//! Pure-Rust crates where they are as good (no C to build, memory-safe decoding of data
//! from the network); zstd through libzstd, whose pure-Rust ports compress slowly.
//!
//! Every decoder stops at [`DECOMPRESSED_BYTES_MAX`]: a small "bomb" cannot make the
//! broker allocate more.
//!
//! ## Kafka's LZ4 quirk
//!
//! Kafka before message format v1 computed the LZ4 frame's header checksum over the
//! magic number as well as the descriptor (KAFKA-3160). Data in a magic-0 message set
//! ([`Lz4Framing::LegacyMagic0`]) has its checksum recomputed before decoding, as
//! Kafka and librdkafka accept it; everywhere else the checksum must be right.

use std::io::Read;

/// The most bytes one compressed batch or wrapper may inflate to.
pub const DECOMPRESSED_BYTES_MAX: usize = 64 << 20;

/// A Kafka compression codec (attribute bits 0..2 of a batch or message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Codec {
    /// The codec with Kafka id `id`, `None` for an id Kafka does not define.
    pub fn from_id(id: u8) -> Option<Codec> {
        Some(match id {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            _ => return None,
        })
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// The name Kafka's `compression.type` gives the codec (`uncompressed` for none).
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "uncompressed",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// The codec a `compression.type` value names; `producer` (keep the producer's
    /// codec) and unknown names are `None`.
    pub fn from_name(name: &str) -> Option<Codec> {
        Some(match name {
            "uncompressed" => Codec::None,
            "gzip" => Codec::Gzip,
            "snappy" => Codec::Snappy,
            "lz4" => Codec::Lz4,
            "zstd" => Codec::Zstd,
            _ => return None,
        })
    }
}

/// Compression levels (Kafka's `compression.gzip.level`, `compression.zstd.level`;
/// lz4_flex has one level, so `compression.lz4.level` has no effect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levels {
    /// 1..=9, or -1 for zlib's default (6).
    pub gzip: i32,
    /// libzstd's levels (negative: faster).
    pub zstd: i32,
}

impl Default for Levels {
    fn default() -> Self {
        Levels { gzip: -1, zstd: 3 }
    }
}

/// How LZ4 data is framed: see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lz4Framing {
    Standard,
    LegacyMagic0,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("unknown compression codec {0}")]
    Unknown(u8),
    #[error("{codec} data does not decompress: {why}")]
    Corrupt { codec: &'static str, why: String },
    #[error("{codec} data decompresses to more than {DECOMPRESSED_BYTES_MAX} bytes")]
    TooLarge { codec: &'static str },
    #[error("v2 batch does not parse")]
    BadBatch,
}

fn corrupt(codec: Codec, why: impl ToString) -> CodecError {
    CodecError::Corrupt {
        codec: codec.name(),
        why: why.to_string(),
    }
}

/// Reads `reader` to its end, at most [`DECOMPRESSED_BYTES_MAX`] bytes.
fn read_bounded(codec: Codec, reader: impl Read) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    reader
        .take(DECOMPRESSED_BYTES_MAX as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(codec, e))?;
    if out.len() > DECOMPRESSED_BYTES_MAX {
        return Err(CodecError::TooLarge {
            codec: codec.name(),
        });
    }
    Ok(out)
}

/// Undoes `codec` on `data` (at most [`DECOMPRESSED_BYTES_MAX`] bytes out).
pub fn decompress(codec: Codec, data: &[u8], lz4: Lz4Framing) -> Result<Vec<u8>, CodecError> {
    match codec {
        Codec::None => Ok(data.to_vec()),
        Codec::Gzip => read_bounded(codec, flate2::read::MultiGzDecoder::new(data)),
        Codec::Snappy => snappy_decompress(data),
        Codec::Lz4 => {
            let fixed = lz4_checked_header(data, lz4)?;
            read_bounded(codec, lz4_flex::frame::FrameDecoder::new(&fixed[..]))
        }
        Codec::Zstd => {
            let decoder =
                zstd::stream::read::Decoder::with_buffer(data).map_err(|e| corrupt(codec, e))?;
            read_bounded(codec, decoder)
        }
    }
}

/// Compresses `data` with `codec` (never fails: every codec here compresses any input).
pub fn compress(codec: Codec, data: &[u8], levels: Levels) -> Vec<u8> {
    use std::io::Write;
    match codec {
        Codec::None => data.to_vec(),
        Codec::Gzip => {
            let level = match levels.gzip {
                l @ 1..=9 => flate2::Compression::new(l as u32),
                _ => flate2::Compression::default(),
            };
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 2), level);
            e.write_all(data).expect("writing to a Vec");
            e.finish().expect("writing to a Vec")
        }
        Codec::Snappy => snappy_compress(data),
        Codec::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut e = lz4_flex::frame::FrameEncoder::with_frame_info(
                info,
                Vec::with_capacity(data.len() / 2),
            );
            e.write_all(data).expect("writing to a Vec");
            e.finish().expect("writing to a Vec")
        }
        Codec::Zstd => zstd::bulk::compress(data, levels.zstd).expect("zstd compresses any input"),
    }
}

/// xerial's snappy stream header: magic, version 1, compatible version 1.
const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
const XERIAL_BLOCK_BYTES: usize = 32 << 10;

fn snappy_compress(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(XERIAL_HEADER.len() + data.len() / 2 + 64);
    out.extend_from_slice(XERIAL_HEADER);
    let mut encoder = snap::raw::Encoder::new();
    for block in data.chunks(XERIAL_BLOCK_BYTES) {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        out.resize(at + 4 + snap::raw::max_compress_len(block.len()), 0);
        let n = encoder
            .compress(block, &mut out[at + 4..])
            .expect("the buffer holds max_compress_len");
        out.truncate(at + 4 + n);
        out[at..at + 4].copy_from_slice(&(n as u32).to_be_bytes());
    }
    out
}

/// One raw snappy block appended to `out`, refused if it would take `out` past
/// [`DECOMPRESSED_BYTES_MAX`].
fn snappy_block(block: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
    let n = snap::raw::decompress_len(block).map_err(|e| corrupt(Codec::Snappy, e))?;
    if out.len() + n > DECOMPRESSED_BYTES_MAX {
        return Err(CodecError::TooLarge { codec: "snappy" });
    }
    let at = out.len();
    out.resize(at + n, 0);
    let written = snap::raw::Decoder::new()
        .decompress(block, &mut out[at..])
        .map_err(|e| corrupt(Codec::Snappy, e))?;
    out.truncate(at + written);
    Ok(())
}

fn snappy_decompress(data: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    let Some(mut rest) = data.strip_prefix(&XERIAL_HEADER[..8]) else {
        snappy_block(data, &mut out)?;
        return Ok(out);
    };
    // Version and compatible version: xerial checks nothing more either.
    rest = rest
        .get(8..)
        .ok_or_else(|| corrupt(Codec::Snappy, "xerial header is truncated"))?;
    while !rest.is_empty() {
        let len = rest
            .get(..4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| corrupt(Codec::Snappy, "xerial block length is truncated"))?;
        let block = rest
            .get(4..4 + len)
            .ok_or_else(|| corrupt(Codec::Snappy, "xerial block is truncated"))?;
        snappy_block(block, &mut out)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

const LZ4_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];
const LZ4_FLG_CONTENT_SIZE: u8 = 1 << 3;
const LZ4_FLG_DICT_ID: u8 = 1;

/// `data` with a complete LZ4 frame header (lz4_flex would panic on a truncated
/// content-size field) and, for [`Lz4Framing::LegacyMagic0`], the header checksum as
/// the standard computes it.
fn lz4_checked_header(
    data: &[u8],
    framing: Lz4Framing,
) -> Result<std::borrow::Cow<'_, [u8]>, CodecError> {
    let bad = |why| corrupt(Codec::Lz4, why);
    if data.get(..4) != Some(&LZ4_MAGIC[..]) {
        return Err(bad("not an LZ4 frame"));
    }
    let flg = *data
        .get(4)
        .ok_or_else(|| bad("LZ4 frame header is truncated"))?;
    let mut descriptor_end = 6;
    if flg & LZ4_FLG_CONTENT_SIZE != 0 {
        descriptor_end += 8;
    }
    if flg & LZ4_FLG_DICT_ID != 0 {
        descriptor_end += 4;
    }
    if data.len() <= descriptor_end {
        return Err(bad("LZ4 frame header is truncated"));
    }
    if framing == Lz4Framing::Standard {
        return Ok(std::borrow::Cow::Borrowed(data));
    }
    let mut fixed = data.to_vec();
    fixed[descriptor_end] = lz4_header_checksum(&data[4..descriptor_end]);
    Ok(std::borrow::Cow::Owned(fixed))
}

/// The LZ4 frame header checksum of a descriptor (FLG up to the checksum byte).
fn lz4_header_checksum(descriptor: &[u8]) -> u8 {
    (twox_hash::XxHash32::oneshot(0, descriptor) >> 8) as u8
}

/// `batch` (one v2 batch) with its records re-encoded with `codec`: attributes, length
/// and CRC-32C rewritten, everything else — offsets, timestamps, producer id, epoch,
/// sequence, transactional and control flags, the records with their headers — as it
/// was. Kafka's broker-side recompression keeps exactly these.
pub fn recompress_batch(batch: &[u8], codec: Codec, levels: Levels) -> Result<Vec<u8>, CodecError> {
    use crate::batch::{
        BatchHeader, ATTR_COMPRESSION_MASK, HEADER_BYTES, LOG_OVERHEAD, OFF_ATTRIBUTES,
    };
    let h = BatchHeader::parse(batch).map_err(|_| CodecError::BadBatch)?;
    if batch.len() != h.total_bytes() {
        return Err(CodecError::BadBatch);
    }
    let from =
        Codec::from_id(h.compression() as u8).ok_or(CodecError::Unknown(h.compression() as u8))?;
    let records = &batch[HEADER_BYTES..];
    let plain;
    let plain_records = if from == Codec::None {
        records
    } else {
        plain = decompress(from, records, Lz4Framing::Standard)?;
        &plain[..]
    };
    let body = if codec == Codec::None {
        std::borrow::Cow::Borrowed(plain_records)
    } else {
        std::borrow::Cow::Owned(compress(codec, plain_records, levels))
    };
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&batch[..HEADER_BYTES]);
    out.extend_from_slice(&body);
    let length = (out.len() - LOG_OVERHEAD) as i32;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    let attributes = (h.attributes & !ATTR_COMPRESSION_MASK) | codec.id() as i16;
    out[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&out[OFF_ATTRIBUTES..]);
    out[OFF_ATTRIBUTES - 4..OFF_ATTRIBUTES].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{self, build, BatchHeader};

    const ALL: [Codec; 5] = [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ];

    fn sample() -> Vec<u8> {
        (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn every_codec_round_trips() {
        let data = sample();
        for codec in ALL {
            let c = compress(codec, &data, Levels::default());
            if codec != Codec::None {
                assert!(c.len() < data.len() / 2, "{codec:?} compresses");
            }
            assert_eq!(
                decompress(codec, &c, Lz4Framing::Standard).unwrap(),
                data,
                "{codec:?}"
            );
        }
    }

    #[test]
    fn snappy_is_xerial_framed_and_raw_is_read() {
        let data = sample();
        let c = compress(Codec::Snappy, &data, Levels::default());
        assert_eq!(&c[..16], XERIAL_HEADER);
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(
            decompress(Codec::Snappy, &raw, Lz4Framing::Standard).unwrap(),
            data
        );
    }

    #[test]
    fn legacy_lz4_checksum_is_accepted_only_for_magic_0() {
        let data = b"hello hello hello hello".repeat(10);
        let mut c = compress(Codec::Lz4, &data, Levels::default());
        // Kafka 0.8/0.9's checksum: over magic and descriptor (FLG, BD).
        c[6] = lz4_header_checksum(&c[..6]);
        assert!(decompress(Codec::Lz4, &c, Lz4Framing::Standard).is_err());
        assert_eq!(
            decompress(Codec::Lz4, &c, Lz4Framing::LegacyMagic0).unwrap(),
            data
        );
        // A truncated header with the content-size flag is an error, not a panic.
        let truncated = [0x04, 0x22, 0x4d, 0x18, 0x68, 0x40, 1, 2];
        assert!(decompress(Codec::Lz4, &truncated, Lz4Framing::Standard).is_err());
    }

    #[test]
    fn bombs_stop_at_the_limit() {
        let big = vec![0u8; DECOMPRESSED_BYTES_MAX + 1];
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let c = compress(codec, &big, Levels::default());
            assert!(
                matches!(
                    decompress(codec, &c, Lz4Framing::Standard),
                    Err(CodecError::TooLarge { .. })
                ),
                "{codec:?}"
            );
        }
        // A raw snappy block that claims 4 GiB is refused before anything is allocated.
        let claim = [0xff, 0xff, 0xff, 0xff, 0x0f, 0];
        assert!(decompress(Codec::Snappy, &claim, Lz4Framing::Standard).is_err());
    }

    #[test]
    fn garbage_is_corrupt_for_every_codec() {
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            assert!(
                matches!(
                    decompress(codec, b"definitely not compressed", Lz4Framing::Standard),
                    Err(CodecError::Corrupt { .. })
                ),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn recompression_keeps_everything_but_the_codec() {
        let plain = build::batch(
            1_700_000_000_000,
            &[
                (Some(b"k1"), b"v1"),
                (None, b"v2"),
                (Some(b"k3"), &[7; 3000]),
            ],
        );
        let mut txn = plain.clone();
        // Producer id 42, epoch 3, sequence 9, transactional.
        txn[batch::OFF_PRODUCER_ID..batch::OFF_PRODUCER_ID + 8]
            .copy_from_slice(&42i64.to_be_bytes());
        txn[batch::OFF_PRODUCER_EPOCH..batch::OFF_PRODUCER_EPOCH + 2]
            .copy_from_slice(&3i16.to_be_bytes());
        txn[batch::OFF_BASE_SEQUENCE..batch::OFF_BASE_SEQUENCE + 4]
            .copy_from_slice(&9i32.to_be_bytes());
        txn[batch::OFF_ATTRIBUTES..batch::OFF_ATTRIBUTES + 2]
            .copy_from_slice(&batch::ATTR_TRANSACTIONAL.to_be_bytes());
        let crc = crc32c::crc32c(&txn[batch::OFF_ATTRIBUTES..]);
        txn[17..21].copy_from_slice(&crc.to_be_bytes());
        let before = BatchHeader::parse(&txn).unwrap();
        let mut current = txn.clone();
        for codec in [
            Codec::Zstd,
            Codec::Lz4,
            Codec::Snappy,
            Codec::Gzip,
            Codec::None,
        ] {
            current = recompress_batch(&current, codec, Levels::default()).unwrap();
            let h = batch::validate(&current, true).unwrap();
            assert_eq!(h.compression(), codec.id() as i16);
            assert_eq!(h.total_bytes(), current.len());
            assert!(h.is_transactional());
            let same = |x: BatchHeader| {
                (
                    x.base_offset,
                    x.last_offset_delta,
                    x.base_timestamp,
                    x.max_timestamp,
                    x.producer_id,
                    x.producer_epoch,
                    x.base_sequence,
                    x.record_count,
                )
            };
            assert_eq!(same(h), same(before), "{codec:?}");
        }
        assert_eq!(current, txn, "back to uncompressed gives the same bytes");
    }

    #[test]
    fn recompression_refuses_what_does_not_decode() {
        let mut b = build::batch(1, &[(None, b"v")]);
        b[batch::OFF_ATTRIBUTES + 1] |= Codec::Gzip.id();
        let crc = crc32c::crc32c(&b[batch::OFF_ATTRIBUTES..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            recompress_batch(&b, Codec::Zstd, Levels::default()),
            Err(CodecError::Corrupt { .. })
        ));
        assert_eq!(
            recompress_batch(&b[..30], Codec::Zstd, Levels::default()),
            Err(CodecError::BadBatch)
        );
    }
}
