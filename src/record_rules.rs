//! Per-record rules a topic imposes on what producers write, checked on the leader
//! before a client's batches are appended (Kafka's LogValidator does the same).
//!
//! A record that breaks a rule fails its partition's whole write — nothing of it is
//! appended — and is named in a KIP-467 record error (its index in its batch and why),
//! which Produce v8+ answers in `record_errors` so a client fails exactly those records
//! (and the others of their batch with "another record in the batch was invalid").
//!
//! Rules: on a compacted topic (`cleanup.policy` includes `compact`) every record
//! needs a key (INVALID_RECORD). An uncompressed batch whose records do not parse is
//! CORRUPT_MESSAGE. Not checked: records inside compressed batches (the broker has no
//! codecs yet; they are appended as sent, and compaction keeps such batches whole).
//! Kafka's other per-record rule, timestamps outside `message.timestamp.*` bounds
//! (INVALID_TIMESTAMP), belongs here once those configs exist.

use kafka_protocol::error::ResponseError;
use sluice_protocol::{ApiError, RecordError};
use sluice_storage::{compact, BatchHeader};

/// Checks a client's batches for `topic`-`partition`; `compacted`: the topic's
/// cleanup policy includes compaction. The record errors it returns are bounded by the
/// batches' record counts (themselves bounded by `max.message.bytes`).
pub fn check<'a>(
    topic: &str,
    partition: i32,
    compacted: bool,
    batches: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), ApiError> {
    if !compacted {
        return Ok(());
    }
    let mut errors = Vec::new();
    for bytes in batches {
        let Some((_, records)) = compact::records(bytes) else {
            if plain_data(bytes) {
                return Err(ApiError::with(
                    ResponseError::CorruptMessage,
                    format!("the records of a batch for {topic}-{partition} do not parse"),
                ));
            }
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
    if errors.is_empty() {
        return Ok(());
    }
    let message = format!(
        "{} record(s) refused, the batch with them is not written; first: record {}: {}",
        errors.len(),
        errors[0].batch_index,
        errors[0].message
    );
    Err(ApiError::with_records(
        ResponseError::InvalidRecord,
        message,
        errors,
    ))
}

/// An uncompressed data batch: one whose records [`compact::records`] must parse.
fn plain_data(bytes: &[u8]) -> bool {
    BatchHeader::parse(bytes).is_ok_and(|h| h.compression() == 0 && !h.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::batch::{build, HEADER_BYTES};

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
        let e = check("t", 3, true, [b.as_slice()]).unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidRecord);
        let indexes: Vec<i32> = e.record_errors.iter().map(|r| r.batch_index).collect();
        assert_eq!(indexes, vec![1, 3]);
        assert!(e.record_errors[0].message.contains("t-3"));
        assert!(e.message.unwrap().starts_with("2 record(s)"));
        // Not compacted: anything goes.
        assert_eq!(check("t", 3, false, [b.as_slice()]), Ok(()));
    }

    #[test]
    fn keyed_records_pass_and_unparseable_ones_are_corrupt() {
        let good = build::batch(1_000, &[(Some(b"k"), b"v"), (Some(b""), b"v")]);
        assert_eq!(
            check("t", 0, true, [good.as_slice(), good.as_slice()]),
            Ok(())
        );
        let mut bad = good.clone();
        bad[HEADER_BYTES] = 0x7e; // the first record's length now runs past the batch
        let e = check("t", 0, true, [bad.as_slice()]).unwrap_err();
        assert_eq!(e.code, ResponseError::CorruptMessage);
    }
}
