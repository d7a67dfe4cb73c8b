//! Per-record rules a topic imposes on what producers write, checked on the leader
//! before a client's batches are appended (Kafka's LogValidator does the same).
//!
//! A record that breaks a rule fails its partition's whole write — nothing of it is
//! appended — and is named in a KIP-467 record error (its index in its batch and why),
//! which Produce v8+ answers in `record_errors` so a client fails exactly those records
//! (and the others of their batch with "another record in the batch was invalid").
//!
//! Rules: on a compacted topic (`cleanup.policy` includes `compact`) every record
//! needs a key (INVALID_RECORD). The records of every uncompressed batch are read,
//! whatever the rules: a batch they do not fill as its header says (record count,
//! lengths, headers) is INVALID_RECORD, as in Kafka; compressed data that does not
//! decompress is CORRUPT_MESSAGE. With `message.timestamp.type=CreateTime`, a
//! record whose timestamp lies more than `message.timestamp.before.max.ms` before now
//! or `after.max.ms` after it is INVALID_TIMESTAMP (KIP-937). Compressed batches are
//! decompressed to be checked only when the topic has a rule to check.
//!
//! The topic's codec ([`stored_form`]): with `compression.type` other than `producer`,
//! a batch with another codec is stored recompressed with the topic's, as Kafka's
//! LogValidator does; its records (offsets, timestamps, headers) and its producer id,
//! epoch, sequence and flags stay as they were.

use kafka_protocol::error::ResponseError;
use sluice_protocol::{ApiError, RecordError};
use sluice_storage::codec::{self, Codec, Levels};
use sluice_storage::{batch, compact, BatchHeader};

/// What a topic's configs ask of each record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// `cleanup.policy` includes `compact`: every record needs a key.
    pub compacted: bool,
    /// `message.timestamp.type=CreateTime` (LogAppendTime overwrites timestamps, so
    /// the bounds below do not apply).
    pub create_time: bool,
    /// `message.timestamp.before.max.ms` / `after.max.ms` (KIP-937): how far a record's
    /// timestamp may lie before / after `now_ms`.
    pub before_max_ms: i64,
    pub after_max_ms: i64,
    pub now_ms: i64,
}

impl Rules {
    fn timestamps_bounded(&self) -> bool {
        self.create_time && (self.before_max_ms < i64::MAX || self.after_max_ms < i64::MAX)
    }
}

/// Checks a client's batches for `topic`-`partition` against `rules`. The record
/// errors it returns are bounded by the batches' record counts (themselves bounded by
/// `max.message.bytes`).
pub fn check<'a>(
    topic: &str,
    partition: i32,
    rules: &Rules,
    batches: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), ApiError> {
    let judged = rules.compacted || rules.timestamps_bounded();
    let mut errors = Vec::new();
    let mut bad_timestamps = Vec::new();
    for bytes in batches {
        let plain;
        let bytes = if judged && compressed_data(bytes) {
            plain = codec::recompress_batch(bytes, Codec::None, Levels::default())
                .map_err(|e| corrupt(topic, partition, &e))?;
            plain.as_slice()
        } else {
            bytes
        };
        // Every uncompressed batch's records are read, whatever the rules (Kafka's
        // LogValidator iterates them): a batch whose records do not fill it as its
        // header says would be stored for consumers that cannot read it.
        if !compact::records_fill(bytes) {
            return Err(ApiError::with(
                ResponseError::InvalidRecord,
                format!(
                    "the records of a batch for {topic}-{partition} do not parse as the {} its header counts",
                    BatchHeader::parse(bytes).map_or(0, |h| h.record_count)
                ),
            ));
        }
        if !judged {
            continue;
        }
        if rules.timestamps_bounded() {
            let low = rules.now_ms.saturating_sub(rules.before_max_ms);
            let high = rules.now_ms.saturating_add(rules.after_max_ms);
            for (index, (_, ts)) in batch::record_timestamps(bytes)
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                // A record without a timestamp (-1: a converted magic-0 message) is not
                // judged, as Kafka's `LogValidator.validateTimestamp`.
                if ts != -1 && (ts < low || ts > high) {
                    bad_timestamps.push(RecordError {
                        batch_index: index as i32,
                        message: format!(
                            "Timestamp {ts} of record {index} is out of range: it must be within [{low}, {high}] (message.timestamp.before.max.ms / after.max.ms of {topic})"
                        ),
                    });
                }
            }
        }
        if !rules.compacted {
            continue;
        }
        // Control batches have no records to judge (the rest parsed above).
        let Some((_, records)) = compact::records(bytes) else {
            continue;
        };
        for (index, r) in records.iter().enumerate() {
            if r.key.is_none() {
                errors.push(RecordError {
                    batch_index: index as i32,
                    message: format!(
                        "Compacted topic cannot accept message without key in topic partition {topic}-{partition}."
                    ),
                });
            }
        }
    }
    // Kafka reports the timestamp violations first (INVALID_TIMESTAMP).
    let (code, errors) = if !bad_timestamps.is_empty() {
        (ResponseError::InvalidTimestamp, bad_timestamps)
    } else if !errors.is_empty() {
        (ResponseError::InvalidRecord, errors)
    } else {
        return Ok(());
    };
    let message = format!(
        "{} record(s) refused, the batch with them is not written; first: record {}: {}",
        errors.len(),
        errors[0].batch_index,
        errors[0].message
    );
    Err(ApiError::with_records(code, message, errors))
}

/// A compressed data batch (control batches are never compressed).
fn compressed_data(bytes: &[u8]) -> bool {
    BatchHeader::parse(bytes).is_ok_and(|h| h.compression() != 0 && !h.is_control())
}

fn corrupt(topic: &str, partition: i32, e: &codec::CodecError) -> ApiError {
    ApiError::with(
        ResponseError::CorruptMessage,
        format!("a batch for {topic}-{partition}: {e}"),
    )
}

/// `batch` as the topic stores it: `None` to store it as sent (`compression.type` is
/// `producer`, the batch already has the topic's codec, or it is a control batch), else
/// the batch recompressed with `codec`. CPU work bounded by the batch's size (itself
/// bounded by `max.message.bytes`); data that does not decompress is CORRUPT_MESSAGE.
pub fn stored_form(
    topic: &str,
    partition: i32,
    codec: Option<Codec>,
    levels: Levels,
    batch: &[u8],
) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(codec) = codec else {
        return Ok(None);
    };
    let h = BatchHeader::parse(batch).map_err(|e| {
        ApiError::with(
            ResponseError::CorruptMessage,
            format!("a batch for {topic}-{partition}: {e}"),
        )
    })?;
    if h.is_control() || h.compression() == i16::from(codec.id()) {
        return Ok(None);
    }
    codec::recompress_batch(batch, codec, levels)
        .map(Some)
        .map_err(|e| corrupt(topic, partition, &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::batch::{build, HEADER_BYTES};

    const UNBOUNDED: Rules = Rules {
        compacted: false,
        create_time: true,
        before_max_ms: i64::MAX,
        after_max_ms: i64::MAX,
        now_ms: 1_000_000,
    };

    fn compacted() -> Rules {
        Rules {
            compacted: true,
            ..UNBOUNDED
        }
    }

    #[test]
    fn timestamps_outside_the_bounds_are_invalid_for_create_time_only() {
        // Records at 1_000 (too old), 999_000, 1_000_500 and 1_200_000 (too new).
        let b = build::batch(1_000, &[(None, b"a")]);
        let mut recs = Vec::new();
        for ts in [1_000, 999_000, 1_000_500, 1_200_000] {
            recs.push(build::batch(ts, &[(None, b"v")]));
        }
        let bounded = Rules {
            before_max_ms: 10_000,
            after_max_ms: 100_000,
            ..UNBOUNDED
        };
        let e = check("t", 0, &bounded, recs.iter().map(|r| r.as_slice())).unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidTimestamp);
        assert_eq!(e.record_errors.len(), 2);
        assert!(
            e.record_errors[0].message.contains("Timestamp 1000 "),
            "{:?}",
            e.record_errors
        );
        assert!(e.record_errors[1].message.contains("Timestamp 1200000 "));
        // A record without a timestamp (-1, a converted magic-0 message) is not judged.
        let untimed = build::batch(-1, &[(None, b"v")]);
        assert_eq!(check("t", 0, &bounded, [untimed.as_slice()]), Ok(()));
        // LogAppendTime topics overwrite timestamps: nothing to check.
        let log_append = Rules {
            create_time: false,
            ..bounded
        };
        assert_eq!(check("t", 0, &log_append, [b.as_slice()]), Ok(()));
        assert_eq!(check("t", 0, &UNBOUNDED, [b.as_slice()]), Ok(()));
    }

    #[test]
    fn keyless_records_on_a_compacted_topic_are_named() {
        let b = build::batch(
            1_000,
            &[
                (Some(b"k"), b"v"),
                (None, b"v"),
                (Some(b"k2"), b"v"),
                (None, b"v"),
            ],
        );
        let e = check("t", 3, &compacted(), [b.as_slice()]).unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidRecord);
        let indexes: Vec<i32> = e.record_errors.iter().map(|r| r.batch_index).collect();
        assert_eq!(indexes, vec![1, 3]);
        assert!(e.record_errors[0].message.contains("t-3"));
        assert!(e.message.unwrap().starts_with("2 record(s)"));
        // Not compacted: anything goes.
        assert_eq!(check("t", 3, &UNBOUNDED, [b.as_slice()]), Ok(()));
    }

    #[test]
    fn records_inside_compressed_batches_are_checked() {
        let b = build::batch(1_000, &[(Some(b"k"), b"v"), (None, b"v")]);
        for c in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let z = codec::recompress_batch(&b, c, Levels::default()).unwrap();
            let e = check("t", 0, &compacted(), [z.as_slice()]).unwrap_err();
            assert_eq!(
                (e.code, e.record_errors.len()),
                (ResponseError::InvalidRecord, 1)
            );
            assert_eq!(e.record_errors[0].batch_index, 1, "{c:?}");
        }
        let mut junk = build::batch(1_000, &[(Some(b"k"), b"v")]);
        junk[sluice_storage::batch::OFF_ATTRIBUTES + 1] |= Codec::Zstd.id();
        let crc = crc32c::crc32c(&junk[sluice_storage::batch::OFF_ATTRIBUTES..]);
        junk[17..21].copy_from_slice(&crc.to_be_bytes());
        let e = check("t", 0, &compacted(), [junk.as_slice()]).unwrap_err();
        assert_eq!(e.code, ResponseError::CorruptMessage);
        assert!(e.message.unwrap().contains("zstd"));
    }

    #[test]
    fn batches_are_stored_with_the_topics_codec() {
        let b = build::batch(1_000, &[(Some(b"k"), &[1; 500]), (None, &[2; 500])]);
        let levels = Levels::default();
        // producer: as sent.
        assert_eq!(stored_form("t", 0, None, levels, &b), Ok(None));
        // Already the topic's codec: as sent.
        assert_eq!(stored_form("t", 0, Some(Codec::None), levels, &b), Ok(None));
        let lz4 = stored_form("t", 0, Some(Codec::Lz4), levels, &b)
            .unwrap()
            .unwrap();
        assert_eq!(BatchHeader::parse(&lz4).unwrap().compression(), 3);
        assert_eq!(
            stored_form("t", 0, Some(Codec::Lz4), levels, &lz4),
            Ok(None)
        );
        let zstd = stored_form("t", 0, Some(Codec::Zstd), levels, &lz4)
            .unwrap()
            .unwrap();
        assert_eq!(BatchHeader::parse(&zstd).unwrap().compression(), 4);
        let plain = stored_form("t", 0, Some(Codec::None), levels, &zstd)
            .unwrap()
            .unwrap();
        assert_eq!(plain, b);
        let marker = sluice_storage::batch::end_txn_marker_batch(
            7,
            0,
            sluice_storage::batch::EndTxnMarker {
                commit: true,
                coordinator_epoch: 0,
            },
            1_000,
        );
        assert_eq!(
            stored_form("t", 0, Some(Codec::Zstd), levels, &marker),
            Ok(None)
        );
    }

    #[test]
    fn keyed_records_pass_and_unparseable_ones_are_invalid() {
        let good = build::batch(1_000, &[(Some(b"k"), b"v"), (Some(b""), b"v")]);
        assert_eq!(
            check("t", 0, &compacted(), [good.as_slice(), good.as_slice()]),
            Ok(())
        );
        let mut bad = good.clone();
        bad[HEADER_BYTES] = 0x7e; // the first record's length now runs past the batch
        for rules in [compacted(), UNBOUNDED] {
            let e = check("t", 0, &rules, [good.as_slice(), bad.as_slice()]).unwrap_err();
            assert_eq!(e.code, ResponseError::InvalidRecord, "{rules:?}");
        }
    }

    /// A batch whose header counts more (or fewer) records than it holds, or whose
    /// record runs past its own length into a header, is refused on any topic.
    #[test]
    fn records_that_do_not_fill_their_batch_are_invalid_on_every_topic() {
        let good = build::batch(1_000, &[(None, b"a"), (None, b"b")]);
        assert_eq!(check("t", 0, &UNBOUNDED, [good.as_slice()]), Ok(()));
        // Three records counted (count and last offset delta agree), two held.
        let mut short = good.clone();
        short[sluice_storage::batch::OFF_LAST_OFFSET_DELTA + 3] = 2;
        short[HEADER_BYTES - 1] = 3;
        let e = check("t", 0, &UNBOUNDED, [short.as_slice()]).unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidRecord);
        assert!(e.message.unwrap().contains("the 3 its header counts"));
        // One record counted, two held: bytes left over.
        let mut long = good.clone();
        long[sluice_storage::batch::OFF_LAST_OFFSET_DELTA + 3] = 0;
        long[HEADER_BYTES - 1] = 1;
        assert_eq!(
            check("t", 0, &UNBOUNDED, [long.as_slice()])
                .unwrap_err()
                .code,
            ResponseError::InvalidRecord
        );
        // A record claiming one header it does not hold.
        let one = build::batch(1_000, &[(None, b"a")]);
        let mut header = one.clone();
        *header.last_mut().unwrap() = 2; // header count varint 1
        assert_eq!(
            check("t", 0, &UNBOUNDED, [header.as_slice()])
                .unwrap_err()
                .code,
            ResponseError::InvalidRecord
        );
    }
}
