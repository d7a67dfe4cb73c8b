//! Idempotent-producer state of one partition, pure: which producer ids wrote here,
//! with which epoch, and the sequence ranges and offsets of their last
//! [`BATCHES_KEPT`] batches. It decides, before a batch is appended, whether it is new
//! (append it), a retry of a batch already in the log (answer with that batch's
//! offsets, append nothing) or out of order / from a stale epoch (refuse), following
//! Apache Kafka's `ProducerStateManager` rules:
//!
//! | case | verdict |
//! |---|---|
//! | no producer id (-1) | append, nothing recorded |
//! | epoch below the producer's current epoch | [`SequenceError::StaleEpoch`] (INVALID_PRODUCER_EPOCH) |
//! | same epoch, same first and last sequence as one of the last 5 batches | [`Verdict::Duplicate`] with its offsets |
//! | same epoch, first sequence = last sequence + 1 (wrapping at `i32::MAX` to 0) | append |
//! | same epoch, anything else (an entry without batches expects 0) | [`SequenceError::OutOfOrder`] (OUT_OF_ORDER_SEQUENCE_NUMBER) |
//! | higher epoch, first sequence 0 | append (the producer bumped its epoch) |
//! | higher epoch, first sequence ≠ 0 | [`SequenceError::OutOfOrder`] |
//! | unknown producer id (never seen, or its state expired or truncated away) | append, any sequence (Kafka accepts it: the state may have gone with the log) |
//!
//! Replicas copying a leader's log call [`ProducerStateTable::record`] without checking
//! (the leader checked), so every replica holds the same state and dedupe survives a
//! leader change. [`crate::PartitionLog::append_checked`] uses it; the broker's Produce
//! path and InitProducerId are the exactly-once issue's, as are snapshots at segment
//! roll (today the table is rebuilt by scanning the log on first use).

use std::collections::{HashMap, VecDeque};

use crate::batch::BatchHeader;

/// Sequence ranges kept per producer (Kafka's, and the client's max in-flight
/// requests with idempotence).
pub const BATCHES_KEPT: usize = 5;

/// A batch's place in its producer's sequence and in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// One producer's state on this partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerEntry {
    pub epoch: i16,
    /// The last batches, oldest first, at most [`BATCHES_KEPT`].
    pub batches: VecDeque<BatchMeta>,
    /// The largest timestamp written by this producer (for expiry).
    pub last_timestamp: i64,
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Append,
    /// A retry of a batch already in the log: answer with these offsets.
    Duplicate(BatchMeta),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error("producer {producer_id}: epoch {epoch} is older than the current epoch {current}")]
    StaleEpoch {
        producer_id: i64,
        epoch: i16,
        current: i16,
    },
    #[error(
        "producer {producer_id}: sequence {first_seq} does not follow {last_seq} (epoch {epoch})"
    )]
    OutOfOrder {
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        /// -1: a new epoch must start at 0.
        last_seq: i32,
    },
}

/// The sequence number after `seq` (sequences wrap from `i32::MAX` to 0).
fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

/// The last sequence of a batch of `record_count` records starting at `first_seq`.
pub fn last_seq(first_seq: i32, last_offset_delta: i32) -> i32 {
    let last = i64::from(first_seq) + i64::from(last_offset_delta);
    if last > i64::from(i32::MAX) {
        (last - i64::from(i32::MAX) - 1) as i32
    } else {
        last as i32
    }
}

/// Producer state of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStateTable {
    producers: HashMap<i64, ProducerEntry>,
}

impl ProducerStateTable {
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Judges a batch a leader is about to append (see the module's table).
    pub fn check(&self, h: &BatchHeader) -> Result<Verdict, SequenceError> {
        if h.producer_id < 0 {
            return Ok(Verdict::Append);
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            return Ok(Verdict::Append);
        };
        let first_seq = h.base_sequence;
        if h.producer_epoch < entry.epoch {
            return Err(SequenceError::StaleEpoch {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
                current: entry.epoch,
            });
        }
        if h.producer_epoch > entry.epoch {
            return if first_seq == 0 {
                Ok(Verdict::Append)
            } else {
                Err(SequenceError::OutOfOrder {
                    producer_id: h.producer_id,
                    epoch: h.producer_epoch,
                    first_seq,
                    last_seq: -1,
                })
            };
        }
        let last_of_batch = last_seq(first_seq, h.last_offset_delta);
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_of_batch)
        {
            return Ok(Verdict::Duplicate(*dup));
        }
        // An entry with an epoch but no batch yet (transaction markers will make
        // those) starts its sequence at 0, as Kafka's NO_SEQUENCE + 1.
        let last = entry.batches.back().map_or(-1, |b| b.last_seq);
        if first_seq == next_seq(last) {
            Ok(Verdict::Append)
        } else {
            Err(SequenceError::OutOfOrder {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
                first_seq,
                last_seq: last,
            })
        }
    }

    /// Records a batch appended at `first_offset` (by this leader after [`Self::check`],
    /// or copied from the leader's log by a follower, or replayed by recovery).
    pub fn record(&mut self, h: &BatchHeader, first_offset: i64) {
        if h.producer_id < 0 {
            return;
        }
        let entry = self.producers.entry(h.producer_id).or_default();
        if h.producer_epoch != entry.epoch {
            // A new epoch starts a new sequence: the old ranges mean nothing in it.
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        entry.batches.push_back(BatchMeta {
            first_seq: h.base_sequence,
            last_seq: last_seq(h.base_sequence, h.last_offset_delta),
            first_offset,
            last_offset: first_offset + i64::from(h.last_offset_delta),
        });
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
        entry.last_timestamp = entry.last_timestamp.max(h.max_timestamp);
    }

    /// Forgets producers idle since before `now_ms - expiration_ms`
    /// (`producer.id.expiration.ms`); returns how many.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers
            .retain(|_, e| e.last_timestamp >= now_ms.saturating_sub(expiration_ms));
        before - self.producers.len()
    }

    /// Drops everything recorded at or after `offset` (a truncated log): producers whose
    /// batches all lie beyond it are forgotten (then any sequence is accepted).
    pub fn truncate_from(&mut self, offset: i64) {
        for e in self.producers.values_mut() {
            e.batches.retain(|b| b.last_offset < offset);
        }
        self.producers.retain(|_, e| !e.batches.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, records: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            batch_length: 0,
            leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: records - 1,
            base_timestamp: 1,
            max_timestamp: 1,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: records,
        }
    }

    /// Checks and records like a leader; returns the verdict.
    fn append(
        t: &mut ProducerStateTable,
        h: &BatchHeader,
        offset: i64,
    ) -> Result<Verdict, SequenceError> {
        let v = t.check(h)?;
        if v == Verdict::Append {
            t.record(h, offset);
        }
        Ok(v)
    }

    #[test]
    fn in_order_batches_append_and_retries_answer_with_the_original_offsets() {
        let mut t = ProducerStateTable::default();
        assert_eq!(
            append(&mut t, &header(7, 0, 0, 3), 100),
            Ok(Verdict::Append)
        );
        assert_eq!(
            append(&mut t, &header(7, 0, 3, 2), 103),
            Ok(Verdict::Append)
        );
        let dup = append(&mut t, &header(7, 0, 0, 3), 999).unwrap();
        assert_eq!(
            dup,
            Verdict::Duplicate(BatchMeta {
                first_seq: 0,
                last_seq: 2,
                first_offset: 100,
                last_offset: 102
            })
        );
        assert!(matches!(
            append(&mut t, &header(7, 0, 3, 2), 999),
            Ok(Verdict::Duplicate(BatchMeta {
                first_offset: 103,
                ..
            }))
        ));
    }

    #[test]
    fn gaps_and_overlaps_are_out_of_order() {
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(7, 0, 0, 3), 0).unwrap();
        // A gap (3 expected).
        assert!(matches!(
            t.check(&header(7, 0, 5, 1)),
            Err(SequenceError::OutOfOrder {
                last_seq: 2,
                first_seq: 5,
                ..
            })
        ));
        // Overlapping but not an exact retry.
        assert!(matches!(
            t.check(&header(7, 0, 1, 3)),
            Err(SequenceError::OutOfOrder { .. })
        ));
    }

    #[test]
    fn only_the_last_five_batches_are_recognised_as_retries() {
        let mut t = ProducerStateTable::default();
        for i in 0..6 {
            append(&mut t, &header(7, 0, i, 1), i64::from(i)).unwrap();
        }
        // Batch seq 0 fell out of the window: a retry of it is out of order now.
        assert!(matches!(
            t.check(&header(7, 0, 0, 1)),
            Err(SequenceError::OutOfOrder { .. })
        ));
        assert!(matches!(
            t.check(&header(7, 0, 1, 1)),
            Ok(Verdict::Duplicate(_))
        ));
        assert_eq!(t.get(7).unwrap().batches.len(), BATCHES_KEPT);
    }

    #[test]
    fn epochs_fence_older_producers_and_a_new_epoch_starts_at_zero() {
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(7, 1, 0, 1), 0).unwrap();
        assert!(matches!(
            t.check(&header(7, 0, 1, 1)),
            Err(SequenceError::StaleEpoch {
                epoch: 0,
                current: 1,
                ..
            })
        ));
        assert!(matches!(
            t.check(&header(7, 2, 5, 1)),
            Err(SequenceError::OutOfOrder { last_seq: -1, .. })
        ));
        assert_eq!(append(&mut t, &header(7, 2, 0, 1), 1), Ok(Verdict::Append));
        assert_eq!(t.get(7).unwrap().epoch, 2);
        assert_eq!(t.get(7).unwrap().batches.len(), 1);
    }

    #[test]
    fn unknown_producers_and_plain_batches_append_with_any_sequence() {
        let t = ProducerStateTable::default();
        assert_eq!(t.check(&header(9, 0, 42, 1)), Ok(Verdict::Append));
        assert_eq!(t.check(&header(-1, -1, -1, 1)), Ok(Verdict::Append));
        let mut t = t;
        t.record(&header(-1, -1, -1, 1), 0);
        assert!(t.is_empty());
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        assert_eq!(last_seq(i32::MAX, 0), i32::MAX);
        assert_eq!(last_seq(i32::MAX, 1), 0);
        assert_eq!(last_seq(i32::MAX - 1, 3), 1);
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(7, 0, i32::MAX - 1, 2), 0).unwrap();
        assert_eq!(append(&mut t, &header(7, 0, 0, 1), 2), Ok(Verdict::Append));
    }

    #[test]
    fn followers_replaying_the_leaders_log_reach_the_same_state() {
        let mut leader = ProducerStateTable::default();
        let mut follower = ProducerStateTable::default();
        let batches = [
            header(1, 0, 0, 2),
            header(2, 0, 0, 1),
            header(1, 0, 2, 3),
            header(1, 1, 0, 1),
        ];
        let mut offset = 0;
        for h in &batches {
            assert_eq!(append(&mut leader, h, offset), Ok(Verdict::Append));
            follower.record(h, offset);
            offset += i64::from(h.record_count);
        }
        assert_eq!(leader, follower);
    }

    #[test]
    fn truncation_and_expiry_forget_state() {
        let mut t = ProducerStateTable::default();
        append(&mut t, &header(1, 0, 0, 1), 0).unwrap();
        append(&mut t, &header(1, 0, 1, 1), 1).unwrap();
        append(&mut t, &header(2, 0, 0, 1), 2).unwrap();
        t.truncate_from(1);
        assert_eq!(t.get(1).unwrap().batches.len(), 1);
        assert!(t.get(2).is_none());
        // Producer 1's batch 1 is gone: its retry must append again.
        assert_eq!(t.check(&header(1, 0, 1, 1)), Ok(Verdict::Append));
        assert_eq!(t.expire(10_000, 1_000), 1);
        assert!(t.is_empty());
    }
}
