//! The transaction APIs (KIP-98): AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn
//! (26), WriteTxnMarkers (27, broker to broker), TxnOffsetCommit (28),
//! DescribeTransactions (65) and ListTransactions (66). The transactional ones are
//! routed to the shard coordinating the transactional id (`crate::coord::txn`); markers go to
//! each partition's home shard; TxnOffsetCommit to the group's coordinator.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::*;
use sluice_coordinator::group::{Committed, TxnCommitArgs};
use sluice_coordinator::txn::{AddArgs, AddOffsetsArgs, EndArgs, ListFilter};
use sluice_protocol::TopicPartition;
use sluice_shard::ShardId;

use super::sb;
use crate::base::error::ApiError;
use crate::base::ids::ProducerId;
use crate::base::rpc::{self, MarkerItem, WriteMarkers};
use crate::coord::txn::{partition_for, route};
use crate::partition::broker::Broker;

/// Clients before these versions do not know PRODUCER_FENCED: Kafka answers them
/// INVALID_PRODUCER_EPOCH instead.
fn fenced_for(version: i16, first_with_fenced: i16, code: ResponseError) -> i16 {
    if code == ResponseError::ProducerFenced && version < first_with_fenced {
        ResponseError::InvalidProducerEpoch.code()
    } else {
        code.code()
    }
}

/// One transaction of an AddPartitionsToTxn request: id, producer id, epoch,
/// verify-only, topics with their partitions.
type TxnPartitions = (String, i64, i16, bool, Vec<(String, Vec<i32>)>);
/// Per marker (producer id), per topic, per partition: an immediate error or a job.
type MarkerShape = Vec<(i64, Vec<(TopicName, Vec<(i32, Option<i16>)>)>)>;

fn error_code(r: &Result<(), ApiError>) -> Option<ResponseError> {
    r.as_ref().err().map(|e| e.code)
}

pub async fn add_partitions(
    broker: &Rc<Broker>,
    version: i16,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    // v0-v3: one transaction in the top-level fields; v4+: a batch (from brokers, for
    // verification, or from clients).
    let txns: Vec<TxnPartitions> = if version <= 3 {
        vec![(
            req.v3_and_below_transactional_id.0.to_string(),
            req.v3_and_below_producer_id.0,
            req.v3_and_below_producer_epoch,
            false,
            req.v3_and_below_topics
                .iter()
                .map(|t| (t.name.0.to_string(), t.partitions.clone()))
                .collect(),
        )]
    } else {
        req.transactions
            .iter()
            .map(|t| {
                (
                    t.transactional_id.0.to_string(),
                    t.producer_id.0,
                    t.producer_epoch,
                    t.verify_only,
                    t.topics
                        .iter()
                        .map(|t| (t.name.0.to_string(), t.partitions.clone()))
                        .collect(),
                )
            })
            .collect()
    };
    let mut results = Vec::with_capacity(txns.len());
    for (txn_id, producer_id, epoch, verify_only, topics) in txns {
        let partitions: Vec<(String, i32)> = topics
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
            .collect();
        let per_partition: Vec<(TopicPartition, i16)> = if verify_only {
            // KIP-890 verification from a partition leader: membership only.
            let asked: Vec<TopicPartition> =
                partitions.into_iter().map(TopicPartition::from).collect();
            let call = rpc::TxnVerify {
                partition: partition_for(&txn_id),
                transactional_id: txn_id.clone(),
                producer_id: ProducerId::new(producer_id),
                producer_epoch: epoch,
                partitions: asked.clone(),
            };
            match route(broker, call).await {
                Ok(v) => v
                    .into_iter()
                    .map(|p| (p.partition, p.code.err().map_or(0, |c| c.code())))
                    .collect(),
                Err(e) => asked.into_iter().map(|tp| (tp, e.code())).collect(),
            }
        } else {
            let call = rpc::TxnAdd {
                partition: partition_for(&txn_id),
                args: AddArgs {
                    transactional_id: txn_id.clone(),
                    producer_id,
                    producer_epoch: epoch,
                    partitions: partitions.clone(),
                },
            };
            let r = route(broker, call).await;
            let code = error_code(&r).map_or(0, |c| fenced_for(version, 2, c));
            partitions.into_iter().map(|tp| (tp.into(), code)).collect()
        };
        let mut topic_results: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
        for (tp, code) in per_partition {
            let pr = AddPartitionsToTxnPartitionResult::default()
                .with_partition_index(tp.partition())
                .with_partition_error_code(code);
            match topic_results.last_mut() {
                Some(tr) if tr.name.0.as_str() == tp.topic() => tr.results_by_partition.push(pr),
                _ => topic_results.push(
                    AddPartitionsToTxnTopicResult::default()
                        .with_name(TopicName(sb(tp.topic())))
                        .with_results_by_partition(vec![pr]),
                ),
            }
        }
        results.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(TransactionalId(sb(txn_id)))
                .with_topic_results(topic_results),
        );
    }
    if version <= 3 {
        let topics = results.pop().map(|r| r.topic_results).unwrap_or_default();
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(topics);
    }
    AddPartitionsToTxnResponse::default().with_results_by_transaction(results)
}

pub async fn add_offsets(
    broker: &Rc<Broker>,
    version: i16,
    req: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let txn_id = req.transactional_id.0.to_string();
    let call = rpc::TxnAddOffsets {
        partition: partition_for(&txn_id),
        args: AddOffsetsArgs {
            transactional_id: txn_id,
            producer_id: req.producer_id.0,
            producer_epoch: req.producer_epoch,
            group_id: req.group_id.0.to_string(),
        },
    };
    let r = route(broker, call).await;
    AddOffsetsToTxnResponse::default()
        .with_error_code(error_code(&r).map_or(0, |c| fenced_for(version, 2, c)))
}

pub async fn end(broker: &Rc<Broker>, version: i16, req: EndTxnRequest) -> EndTxnResponse {
    let txn_id = req.transactional_id.0.to_string();
    let call = rpc::TxnEnd {
        partition: partition_for(&txn_id),
        args: EndArgs {
            transactional_id: txn_id,
            producer_id: req.producer_id.0,
            producer_epoch: req.producer_epoch,
            commit: req.committed,
        },
    };
    match route(broker, call).await {
        Ok(pe) => EndTxnResponse::default()
            .with_producer_id(pe.producer_id.into())
            .with_producer_epoch(pe.epoch),
        Err(e) => EndTxnResponse::default()
            .with_error_code(fenced_for(version, 2, e.code))
            .with_producer_id((-1).into())
            .with_producer_epoch(-1),
    }
}

/// WriteTxnMarkers: each marker on each partition, on the partition's home shard.
pub async fn write_markers(
    broker: &Rc<Broker>,
    _version: i16,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let image = broker.image();
    let mut jobs: Vec<(ShardId, MarkerItem)> = Vec::new();
    let mut shape: MarkerShape = Vec::new();
    for m in &req.markers {
        let mut topics = Vec::new();
        for t in &m.topics {
            let name = t.name.0.to_string();
            let meta = image.topics.get(&name);
            let mut parts = Vec::new();
            for &p in &t.partition_indexes {
                match meta {
                    Some(meta) if (0..meta.partitions).contains(&p) => {
                        jobs.push((
                            broker.owner(meta, p),
                            MarkerItem {
                                topic: name.clone(),
                                partition: p,
                                producer_id: m.producer_id.into(),
                                producer_epoch: m.producer_epoch,
                                commit: m.transaction_result,
                                coordinator_epoch: m.coordinator_epoch,
                            },
                        ));
                        parts.push((p, None));
                    }
                    _ => parts.push((p, Some(ResponseError::UnknownTopicOrPartition.code()))),
                }
            }
            topics.push((t.name.clone(), parts));
        }
        shape.push((m.producer_id.0, topics));
    }
    let results = broker
        .fan_out(
            jobs,
            |items| WriteMarkers { items },
            |e| Err(crate::base::error::from_mesh(e)),
        )
        .await;
    let mut results = results.into_iter();
    let markers = shape
        .into_iter()
        .map(|(pid, topics)| {
            let topics = topics
                .into_iter()
                .map(|(name, parts)| {
                    let partitions = parts
                        .into_iter()
                        .map(|(p, err)| {
                            let code = err.unwrap_or_else(|| {
                                match results.next().expect("one result per job") {
                                    Ok(()) => 0,
                                    Err(e) => e.code(),
                                }
                            });
                            WritableTxnMarkerPartitionResult::default()
                                .with_partition_index(p)
                                .with_error_code(code)
                        })
                        .collect();
                    WritableTxnMarkerTopicResult::default()
                        .with_name(name)
                        .with_partitions(partitions)
                })
                .collect();
            WritableTxnMarkerResult::default()
                .with_producer_id(pid.into())
                .with_topics(topics)
        })
        .collect();
    WriteTxnMarkersResponse::default().with_markers(markers)
}

pub async fn txn_offset_commit(
    broker: &Rc<Broker>,
    version: i16,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group = req.group_id.0.to_string();
    let now = crate::base::util::now_ms();
    let offsets: Vec<((String, i32), Committed)> = req
        .topics
        .iter()
        .flat_map(|t| {
            let name = t.name.0.to_string();
            t.partitions.iter().map(move |p| {
                (
                    (name.clone(), p.partition_index),
                    Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p
                            .committed_metadata
                            .as_ref()
                            .map(|m| m.to_string())
                            .unwrap_or_default(),
                        commit_timestamp_ms: now,
                    },
                )
            })
        })
        .collect();
    let call = rpc::TxnCommitOffsets {
        partition: crate::coord::group::partition_for(&group),
        args: TxnCommitArgs {
            group_id: group,
            producer_id: req.producer_id.0,
            producer_epoch: req.producer_epoch,
            generation: req.generation_id,
            member_id: req.member_id.to_string(),
            instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
            offsets: offsets.clone(),
        },
    };
    let results: Vec<(TopicPartition, i16)> = match crate::coord::group::route(broker, call).await {
        Ok(rs) => rs
            .into_iter()
            .map(|p| {
                (
                    p.partition,
                    p.code.err().map_or(0, |c| fenced_for(version, 3, c)),
                )
            })
            .collect(),
        Err(e) => offsets
            .into_iter()
            .map(|(tp, _)| (tp.into(), e.code()))
            .collect(),
    };
    let mut topics: Vec<TxnOffsetCommitResponseTopic> = Vec::new();
    for (tp, code) in results {
        let pr = TxnOffsetCommitResponsePartition::default()
            .with_partition_index(tp.partition())
            .with_error_code(code);
        match topics.last_mut() {
            Some(tr) if tr.name.0.as_str() == tp.topic() => tr.partitions.push(pr),
            _ => topics.push(
                TxnOffsetCommitResponseTopic::default()
                    .with_name(TopicName(sb(tp.topic())))
                    .with_partitions(vec![pr]),
            ),
        }
    }
    TxnOffsetCommitResponse::default().with_topics(topics)
}

pub async fn describe(
    broker: &Rc<Broker>,
    _version: i16,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut states = Vec::with_capacity(req.transactional_ids.len());
    for id in &req.transactional_ids {
        let txn_id = id.0.to_string();
        let call = rpc::TxnDescribe {
            partition: partition_for(&txn_id),
            transactional_id: txn_id,
        };
        let st = TransactionState::default().with_transactional_id(id.clone());
        states.push(match route(broker, call).await {
            Ok(d) => st
                .with_transaction_state(sb(d.state.name()))
                .with_transaction_timeout_ms(d.timeout_ms)
                .with_transaction_start_time_ms(d.start_ms)
                .with_producer_id(d.producer_id.into())
                .with_producer_epoch(d.producer_epoch)
                .with_topics(
                    d.topics
                        .into_iter()
                        .map(|(t, ps)| {
                            TopicData::default()
                                .with_topic(TopicName(sb(t)))
                                .with_partitions(ps)
                        })
                        .collect(),
                ),
            Err(e) => st
                .with_error_code(e.code())
                .with_transaction_state(sb(""))
                .with_producer_id((-1).into())
                .with_producer_epoch(-1)
                .with_transaction_start_time_ms(-1),
        });
    }
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// ListTransactions: every `__transaction_state` partition this broker leads, asked on
/// its home shard.
pub async fn list(
    broker: &Rc<Broker>,
    _version: i16,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let filter = ListFilter {
        states: req.state_filters.iter().map(|s| s.to_string()).collect(),
        producer_ids: req.producer_id_filters.iter().map(|p| p.0).collect(),
        min_duration_ms: req.duration_filter,
    };
    let image = broker.image();
    let mut owners: std::collections::BTreeMap<ShardId, i32> = Default::default();
    if let Some(meta) = image.topics.get(sluice_coordinator::txn::TXN_STATE_TOPIC) {
        for p in 0..meta.partitions {
            if meta.assignment(p).map(|a| a.leader) == Some(broker.config.node_id) {
                owners.entry(broker.owner(meta, p)).or_insert(p);
            }
        }
    }
    let mut resp = ListTransactionsResponse::default();
    let mut unknown = std::collections::BTreeSet::new();
    for (shard, partition) in owners {
        let call = rpc::TxnList {
            partition,
            filter: filter.clone(),
        };
        match broker.call(shard, call).await {
            Ok(Ok(listed)) => {
                unknown.extend(listed.unknown_state_filters);
                resp.transaction_states
                    .extend(listed.transactions.into_iter().map(|(id, pid, state)| {
                    kafka_protocol::messages::list_transactions_response::TransactionState::default(
                    )
                    .with_transactional_id(TransactionalId(sb(id)))
                    .with_producer_id(pid.into())
                    .with_transaction_state(sb(state.name()))
                }));
            }
            Ok(Err(e)) => resp.error_code = e.code(),
            Err(e) => resp.error_code = crate::base::error::from_mesh(&e).code(),
        }
    }
    resp.unknown_state_filters = unknown.into_iter().map(sb).collect();
    resp
}
