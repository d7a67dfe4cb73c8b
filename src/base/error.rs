//! The one place where the broker's errors become Kafka error codes (the error type,
//! [`ApiError`], is `sluice-protocol`'s).

use kafka_protocol::error::ResponseError;
use sluice_storage::BatchError;

pub use sluice_protocol::ApiError;

/// Maps a storage error to the Kafka error a client should see.
pub fn from_storage(e: &sluice_storage::Error) -> ApiError {
    use sluice_storage::Error as E;
    let code = match e {
        E::Batch(BatchError::TooLarge { .. }) => ResponseError::MessageTooLarge,
        // Control batches (transaction markers) come only from coordinators.
        E::Batch(BatchError::ControlBatchFromClient) => ResponseError::InvalidRecord,
        // A record count the batch's offsets or bytes cannot hold: Kafka's
        // LogValidator refuses it as INVALID_RECORD (not retriable).
        E::Batch(BatchError::BadRecordCount { .. }) => ResponseError::InvalidRecord,
        // Kafka answers CORRUPT_MESSAGE for a bad CRC and for framing it cannot parse
        // (short batch, length mismatch, wrong magic).
        E::Batch(_) => ResponseError::CorruptMessage,
        E::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        // The log failed or is unreadable: the client may retry elsewhere later.
        E::Io { .. } | E::Failed(_) | E::Corrupt { .. } => ResponseError::KafkaStorageError,
        // A log closed under us (topic being deleted): as if it no longer existed.
        E::Closed => ResponseError::UnknownTopicOrPartition,
        E::Config(_) => ResponseError::InvalidConfig,
        // Leadership moved while the append waited: the client refreshes its metadata.
        E::NotLeader { .. } => ResponseError::NotLeaderOrFollower,
        // Kafka's codes for an idempotent producer's refused batch.
        E::Sequence(sluice_storage::producer::SequenceError::StaleEpoch { .. }) => {
            ResponseError::InvalidProducerEpoch
        }
        E::Sequence(sluice_storage::producer::SequenceError::OutOfOrder { .. }) => {
            ResponseError::OutOfOrderSequenceNumber
        }
    };
    ApiError::with(code, e.to_string())
}

/// Maps a write refused by the transaction rules.
pub fn from_txn(e: &sluice_storage::TxnError) -> ApiError {
    use sluice_storage::TxnError as T;
    let code = match e {
        T::NotTransactional { .. } => ResponseError::InvalidTxnState,
        T::CoordinatorFenced { .. } => ResponseError::TransactionCoordinatorFenced,
    };
    ApiError::with(code, e.to_string())
}

/// Maps a cross-shard failure (the other shard is shutting down).
pub fn from_mesh(e: &sluice_shard::MeshError) -> ApiError {
    // Retriable: the client will retry, and find the broker back or gone.
    ApiError::with(ResponseError::KafkaStorageError, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_errors_map_to_kafka_codes() {
        let crc = sluice_storage::Error::Batch(BatchError::CrcMismatch {
            stored: 1,
            computed: 2,
        });
        assert_eq!(from_storage(&crc).code(), 2);
        let big = sluice_storage::Error::Batch(BatchError::TooLarge { size: 10, max: 5 });
        assert_eq!(from_storage(&big).code(), 10);
        let count = sluice_storage::Error::Batch(BatchError::BadRecordCount {
            count: 3,
            last_offset_delta: 1,
        });
        assert_eq!(from_storage(&count).code(), 87);
        let oor = sluice_storage::Error::OffsetOutOfRange {
            offset: 9,
            log_start: 0,
            log_end: 3,
        };
        assert_eq!(from_storage(&oor).code(), 1);
        assert_eq!(
            from_storage(&sluice_storage::Error::Failed("x".into())).code(),
            56
        );
    }
}
