//! Produce (key 0): batches validated and appended on each partition's home shard.
//!
//! The records of each partition are a zero-copy `Bytes` slice of the request frame;
//! they travel to the owner shard as that slice, where only the partition's leader
//! accepts them. acks=0 gets no response; acks=1 is answered once the leader's flush
//! policy is met; acks=-1 also waits until the high watermark covers the batch with at
//! least min.insync.replicas in the ISR (`crate::partition::replica`), bounded by the request's
//! timeout. Transactional batches are judged by the partition's producer state (a
//! producer with an open transaction writes only transactional batches), and one that
//! would open a transaction here is first verified with its coordinator (KIP-890 part
//! 1, `crate::coord::txn::verify_produce`). A partition's data
//! that breaks a per-record rule (`crate::base::record_rules`: keyless records on a compacted
//! topic) fails as a whole with KIP-467 `record_errors` (v8+). Produce v0–v2 may carry
//! message sets (message formats v0/v1), up-converted here to one v2 batch
//! (`sluice_storage::message_set`; gzip, snappy and lz4 wrappers are opened and their
//! records stored in a batch of the same codec). zstd is refused with
//! UNSUPPORTED_COMPRESSION_TYPE in message sets and, as Kafka, in Produce before v7. The
//! topic's `compression.type` is applied on the leader (`crate::base::record_rules`).

use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};

use super::metadata::auto_create;
use super::sb;
use crate::base::error::{self, ApiError};
use crate::base::rpc::{Appended, Produce, ProduceItem};
use crate::base::topic_config::validate_topic_name;
use crate::base::util::Turn;
use crate::partition::broker::Broker;
use sluice_storage::codec::Codec;
use sluice_storage::message_set::{self, MessageSetError};
use sluice_storage::{batch, BatchHeader};

fn partition_response(
    version: i16,
    index: i32,
    r: &Result<Appended, ApiError>,
) -> PartitionProduceResponse {
    let base = PartitionProduceResponse::default().with_index(index);
    match r {
        Ok(a) => base
            .with_base_offset(a.base_offset.get())
            .with_log_append_time_ms(a.log_append_time_ms)
            .with_log_start_offset(a.log_start_offset.get()),
        Err(e) => {
            let failed = base
                .with_error_code(e.code())
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            // KIP-467: the message and the records that failed the batch, v8+.
            if version < 8 {
                return failed;
            }
            failed
                .with_error_message(e.message.clone().map(sb))
                .with_record_errors(
                    e.record_errors
                        .iter()
                        .map(|r| {
                            BatchIndexAndErrorMessage::default()
                                .with_batch_index(r.batch_index)
                                .with_batch_index_error_message(Some(sb(r.message.clone())))
                        })
                        .collect(),
                )
        }
    }
}

/// Returns `None` for acks=0 (no response is sent). `turn`: the request's place among
/// its connection's produce requests; its appends are issued only after those of the
/// requests before it (see [`crate::base::util::Sequencer`]), and the next request's only
/// after its own (released on every path, early errors included, by dropping it).
pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: ProduceRequest,
    turn: Option<Turn>,
) -> Answer {
    let acks = req.acks;
    let transactional_id = req
        .transactional_id
        .as_ref()
        .filter(|t| !t.0.is_empty())
        .map(|t| std::sync::Arc::<str>::from(t.0.as_str()));
    let timeout = std::time::Duration::from_millis(req.timeout_ms.clamp(0, 300_000) as u64);
    if !matches!(acks, -1..=1) {
        let resp = reject_all(
            version,
            &req,
            ApiError::new(ResponseError::InvalidRequiredAcks),
        );
        return Answer::Respond(resp);
    }
    let names: Vec<String> = req
        .topic_data
        .iter()
        .map(|t| t.name.0.to_string())
        .filter(|n| validate_topic_name(n).is_ok())
        .collect();
    auto_create(broker, &names).await;
    let image = broker.image();
    // Resolve every partition: an immediate error, or a job for its home shard.
    // Per topic: each partition's index and its error if it never reached a shard.
    type Shape = Vec<(String, Vec<(i32, Option<ApiError>)>)>;
    let mut shape: Shape = Vec::new();
    let mut jobs = Vec::new();
    for topic in req.topic_data {
        let name = topic.name.0.to_string();
        let shared: std::sync::Arc<str> = std::sync::Arc::from(name.as_str());
        let meta = image.topics.get(&name);
        let mut parts = Vec::new();
        for p in topic.partition_data {
            let err = if let Err(m) = validate_topic_name(&name) {
                Some(ApiError::with(
                    ResponseError::InvalidTopicException,
                    m.to_string(),
                ))
            } else if super::metadata::is_internal(&name) {
                // Only the broker's coordinators write there (Kafka's
                // `ReplicaManager.appendToLocalLog`): a client's records would be
                // replayed as group offsets or transaction state.
                Some(ApiError::with(
                    ResponseError::InvalidTopicException,
                    format!("Cannot append to internal topic {name}"),
                ))
            } else {
                match meta {
                    Some(m) if (0..m.partitions).contains(&p.index) => match p.records {
                        Some(records) => match up_convert(version, records) {
                            Err(e) => Some(e),
                            Ok(records) => {
                                jobs.push((
                                    broker.owner(m, p.index),
                                    ProduceItem {
                                        topic: shared.clone(),
                                        partition: p.index,
                                        records,
                                        transactional_id: transactional_id.clone(),
                                    },
                                ));
                                None
                            }
                        },
                        None => Some(ApiError::with(
                            ResponseError::CorruptMessage,
                            "null records",
                        )),
                    },
                    _ => Some(ApiError::new(ResponseError::UnknownTopicOrPartition)),
                }
            };
            parts.push((p.index, err));
        }
        shape.push((name, parts));
    }
    // Kafka handles a connection's requests one at a time: the appends of the requests
    // before this one have their places in their partitions' order first (this one may
    // have overtaken them while they auto-created a topic or waited for a full mesh
    // channel). Only the issuing is ordered: the replies are awaited concurrently.
    if let Some(t) = &turn {
        t.wait().await;
    }
    let results = broker
        .fan_out_then(
            jobs,
            |items| Produce {
                acks,
                timeout,
                items,
            },
            |e| Err(error::from_mesh(e)),
            move || drop(turn),
        )
        .await;
    if acks == 0 {
        // No answer is expected, but a producer must learn of a failure (a moved
        // leader above all): Kafka closes the connection, and the client refreshes its
        // metadata and reconnects.
        let failed = shape
            .iter()
            .any(|(_, parts)| parts.iter().any(|(_, e)| e.is_some()))
            || results.iter().any(Result::is_err);
        return if failed {
            Answer::Close
        } else {
            Answer::Silent
        };
    }
    // KIP-890: a transactional batch for a partition not in its transaction. Clients
    // before Produce v11 do not know TRANSACTION_ABORTABLE.
    let results: Vec<Result<Appended, ApiError>> = results
        .into_iter()
        .map(|r| match r {
            Err(e) if e.code == ResponseError::TransactionAbortable && version < 11 => {
                Err(ApiError {
                    code: ResponseError::InvalidTxnState,
                    ..e
                })
            }
            r => r,
        })
        .collect();
    let mut results = results.into_iter();
    let responses = shape
        .into_iter()
        .map(|(name, parts)| {
            let partition_responses = parts
                .into_iter()
                .map(|(index, err)| match err {
                    Some(e) => partition_response(version, index, &Err(e)),
                    None => partition_response(
                        version,
                        index,
                        &results.next().expect("one result per job"),
                    ),
                })
                .collect();
            TopicProduceResponse::default()
                .with_name(kafka_protocol::messages::TopicName(sb(name)))
                .with_partition_responses(partition_responses)
        })
        .collect();
    Answer::Respond(ProduceResponse::default().with_responses(responses))
}

/// What a Produce request gets.
pub enum Answer {
    Respond(ProduceResponse),
    /// acks=0 and every partition appended: nothing.
    Silent,
    /// acks=0 and some partition failed: the connection is closed.
    Close,
}

/// Produce v0–v2 may carry a message set (magic 0 or 1) instead of a v2 batch: it is
/// appended as one v2 batch of the same records. Kafka checks nothing more for these
/// versions, so v2 batches pass as they are. From v3 on only one v2 batch is valid:
/// Kafka refuses a message set, or more than one batch, there with INVALID_RECORD.
fn up_convert(version: i16, records: Bytes) -> Result<Bytes, ApiError> {
    let message_set = message_set::looks_like_message_set(&records);
    if version > 2 && message_set {
        return Err(ApiError::with(
            ResponseError::InvalidRecord,
            "message formats v0 and v1 are accepted only by Produce v0-v2",
        ));
    }
    if !message_set {
        if version > 2 {
            one_batch(version, &records)?;
        }
        if version < 7 && has_zstd(&records) {
            return Err(ApiError::with(
                ResponseError::UnsupportedCompressionType,
                format!("Produce requests with version {version} are not allowed to use ZStandard compression (v7 and later are)"),
            ));
        }
        return Ok(records);
    }
    message_set::up_convert(&records)
        .map(Bytes::from)
        .map_err(|e| {
            let code = match e {
                MessageSetError::Compressed(_) => ResponseError::UnsupportedCompressionType,
                _ => ResponseError::CorruptMessage,
            };
            ApiError::with(code, e.to_string())
        })
}

/// Produce v3+ carries exactly one batch per partition (Kafka's
/// `ProduceRequest.validateRecords`): none, or a second one, is INVALID_RECORD, so a
/// partition's write is one batch, appended whole or not at all. (A second batch that
/// is cut short is left to the batch checks: CORRUPT_MESSAGE.)
fn one_batch(version: i16, records: &[u8]) -> Result<(), ApiError> {
    let Some(first) = batch::peek_total_bytes(records) else {
        if records.is_empty() {
            return Err(ApiError::with(
                ResponseError::InvalidRecord,
                format!("Produce requests with version {version} must have at least one record batch per partition"),
            ));
        }
        return Ok(());
    };
    let second = records.get(first..).and_then(batch::peek_total_bytes);
    if second.is_some_and(|n| n <= records.len() - first) {
        return Err(ApiError::with(
            ResponseError::InvalidRecord,
            format!("Produce requests with version {version} are only allowed to contain exactly one record batch per partition"),
        ));
    }
    Ok(())
}

/// True if a batch of `records` (concatenated v2 batches) is zstd-compressed.
fn has_zstd(records: &[u8]) -> bool {
    let mut rest = records;
    while let Some(total) = batch::peek_total_bytes(rest) {
        if BatchHeader::parse(rest).is_ok_and(|h| h.compression() == i16::from(Codec::Zstd.id())) {
            return true;
        }
        rest = rest.get(total..).unwrap_or_default();
    }
    false
}

fn reject_all(version: i16, req: &ProduceRequest, e: ApiError) -> ProduceResponse {
    let responses = req
        .topic_data
        .iter()
        .map(|t| {
            TopicProduceResponse::default()
                .with_name(t.name.clone())
                .with_partition_responses(
                    t.partition_data
                        .iter()
                        .map(|p| partition_response(version, p.index, &Err(e.clone())))
                        .collect(),
                )
        })
        .collect();
    ProduceResponse::default().with_responses(responses)
}
