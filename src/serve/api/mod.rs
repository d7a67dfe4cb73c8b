//! The Kafka API layer: frame decoding, the registry of supported versions, dispatch to
//! one module per API, and response encoding. All codecs are the `kafka-protocol`
//! crate's.
//!
//! Frames are decoded and encoded by the pure `sluice-protocol` crate (which also holds
//! the one registry of supported API versions and answers ApiVersions from it).
//! Handlers are async and may finish in any order; the connection (`crate::serve::server`)
//! writes responses in request order. Adding an API: a registry entry in
//! `sluice-protocol`, a module here and its arm in [`handle`] (a unit test fails while
//! the two disagree).
//!
//! Unsupported requests get Kafka's answer (`sluice_protocol::unsupported_response`):
//! an ApiVersions request of a version newer than this broker's gets a v0
//! ApiVersionsResponse with UNSUPPORTED_VERSION and the ApiVersions range (clients retry
//! at a version both know); any other unknown API key or unsupported version closes the
//! connection without a response, as Kafka's request-header check does.

pub mod acls;
pub mod alter_configs;
pub mod alter_replica_log_dirs;
pub mod authorized_ops;
pub mod client_quotas;
pub mod consumer_group_describe;
pub mod consumer_group_heartbeat;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_groups;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_cluster;
pub mod describe_configs;
pub mod describe_groups;
pub mod describe_log_dirs;
pub mod describe_producers;
pub mod describe_quorum;
pub mod describe_topic_partitions;
pub mod elect_leaders;
pub mod fetch;
pub mod find_coordinator;
pub mod gate;
pub mod heartbeat;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod list_offsets;
pub mod metadata;
pub mod offset_commit;
pub mod offset_delete;
pub mod offset_fetch;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod reassignments;
pub mod scram;
pub mod sync_group;
pub mod transactions;
pub mod voters;

use std::collections::HashSet;
use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::{RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use sluice_protocol::api_versions;

use crate::partition::broker::Broker;

/// What the connection does after a request.
pub enum Outcome {
    /// Write this frame (size prefix included).
    Respond(Bytes),
    /// Nothing to send (Produce with acks=0).
    Silent,
    /// Close the connection (a response could not be encoded).
    Close,
}

/// Handles one parsed request from `caller` (its principal and address), once the
/// authorizer let it through ([`gate`]). `turn`: a produce request's place in its
/// connection's order of appends ([`produce::handle`]); `produce_throttle_ms`: the
/// pause its bytes earned against a producer_byte_rate quota when it was read.
pub async fn handle(
    broker: &Rc<Broker>,
    parsed: Parsed,
    caller: &Rc<crate::serve::authz::Caller>,
    turn: Option<crate::base::util::Turn>,
    produce_throttle_ms: u64,
) -> Outcome {
    let req = match parsed {
        Parsed::Unsupported {
            api_key,
            version,
            correlation_id,
        } => return unsupported(api_key, version, correlation_id),
        Parsed::Request(r) => *r,
    };
    let Request {
        api_key,
        version,
        header,
        body,
    } = req;
    let client = header
        .client_id
        .as_ref()
        .map(StrBytes::as_str)
        .unwrap_or("");
    tracing::trace!(
        ?api_key,
        version,
        correlation_id = header.correlation_id,
        client,
        "request"
    );
    let mut close_after = false;
    let (body, patch) = match gate::check(broker, caller, version, body) {
        gate::Gate::Pass(body, patch) => (*body, patch),
        gate::Gate::PassThenClose(body) => {
            close_after = true;
            (*body, None)
        }
        gate::Gate::Refuse(response) => {
            return respond(broker, api_key, version, header.correlation_id, *response)
        }
    };
    let peer = caller.peer;
    // A consumer's fetch answer counts against its consumer_byte_rate quota: over it,
    // the fetch is answered at once without records and without touching its fetch
    // session (a new session is not opened: id 0); under it, it asks for at most a
    // window's worth.
    let consumer_fetch = matches!(&body, RequestKind::Fetch(r) if r.replica_id.0 < 0 && r.replica_state.replica_id.0 < 0);
    let mut body = body;
    if let (true, RequestKind::Fetch(r)) = (consumer_fetch, &mut body) {
        use crate::serve::quota;
        let pause = quota::pending(broker, caller, client, quota::CONSUMER_BYTE_RATE);
        if pause > 0 {
            caller.mute_for(pause);
            let session_id = if r.session_epoch > 0 { r.session_id } else { 0 };
            let resp = kafka_protocol::messages::FetchResponse::default()
                .with_throttle_time_ms(pause.min(i32::MAX as u64) as i32)
                .with_session_id(session_id);
            return respond(
                broker,
                api_key,
                version,
                header.correlation_id,
                ResponseKind::Fetch(resp),
            );
        }
        if let Some(most) =
            quota::window_allowance(broker, caller, client, quota::CONSUMER_BYTE_RATE)
        {
            r.max_bytes = r.max_bytes.min(most.clamp(1.0, i32::MAX as f64) as i32);
        }
    }
    let mut response = match body {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions::handle(version)),
        RequestKind::Metadata(r) => {
            ResponseKind::Metadata(metadata::handle(broker, version, &caller.listener, r).await)
        }
        RequestKind::Produce(r) => match produce::handle(broker, version, r, turn).await {
            produce::Answer::Respond(resp) => ResponseKind::Produce(resp),
            produce::Answer::Silent if close_after => return Outcome::Close,
            produce::Answer::Silent => return Outcome::Silent,
            produce::Answer::Close => return Outcome::Close,
        },
        RequestKind::Fetch(r) => ResponseKind::Fetch(fetch::handle(broker, version, r).await),
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(list_offsets::handle(broker, version, r).await)
        }
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(create_topics::handle(broker, version, r).await)
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(delete_topics::handle(broker, version, r).await)
        }
        RequestKind::CreatePartitions(r) => {
            ResponseKind::CreatePartitions(create_partitions::handle(broker, version, r).await)
        }
        RequestKind::ElectLeaders(r) => {
            ResponseKind::ElectLeaders(elect_leaders::handle(broker, version, r).await)
        }
        RequestKind::AlterPartitionReassignments(r) => ResponseKind::AlterPartitionReassignments(
            reassignments::alter(broker, version, r).await,
        ),
        RequestKind::ListPartitionReassignments(r) => {
            ResponseKind::ListPartitionReassignments(reassignments::list(broker, version, r).await)
        }
        RequestKind::DescribeQuorum(r) => {
            ResponseKind::DescribeQuorum(describe_quorum::handle(broker, version, r).await)
        }
        RequestKind::AddRaftVoter(r) => {
            ResponseKind::AddRaftVoter(voters::add(broker, version, r).await)
        }
        RequestKind::RemoveRaftVoter(r) => {
            ResponseKind::RemoveRaftVoter(voters::remove(broker, version, r).await)
        }
        RequestKind::UnregisterBroker(r) => {
            ResponseKind::UnregisterBroker(reassignments::unregister(broker, version, r).await)
        }
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(describe_configs::handle(broker, version, r))
        }
        RequestKind::DescribeLogDirs(r) => {
            ResponseKind::DescribeLogDirs(describe_log_dirs::handle(broker, version, r).await)
        }
        RequestKind::AlterConfigs(r) => {
            ResponseKind::AlterConfigs(alter_configs::handle(broker, version, r).await)
        }
        RequestKind::IncrementalAlterConfigs(r) => ResponseKind::IncrementalAlterConfigs(
            incremental_alter_configs::handle(broker, version, r).await,
        ),
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(delete_records::handle(broker, version, r).await)
        }
        RequestKind::OffsetForLeaderEpoch(r) => ResponseKind::OffsetForLeaderEpoch(
            offset_for_leader_epoch::handle(broker, version, r).await,
        ),
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(init_producer_id::handle(broker, version, r).await)
        }
        RequestKind::AddPartitionsToTxn(r) => {
            ResponseKind::AddPartitionsToTxn(transactions::add_partitions(broker, version, r).await)
        }
        RequestKind::AddOffsetsToTxn(r) => {
            ResponseKind::AddOffsetsToTxn(transactions::add_offsets(broker, version, r).await)
        }
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(transactions::end(broker, version, r).await),
        RequestKind::WriteTxnMarkers(r) => {
            ResponseKind::WriteTxnMarkers(transactions::write_markers(broker, version, r).await)
        }
        RequestKind::TxnOffsetCommit(r) => {
            ResponseKind::TxnOffsetCommit(transactions::txn_offset_commit(broker, version, r).await)
        }
        RequestKind::DescribeTransactions(r) => {
            ResponseKind::DescribeTransactions(transactions::describe(broker, version, r).await)
        }
        RequestKind::ListTransactions(r) => {
            ResponseKind::ListTransactions(transactions::list(broker, version, r).await)
        }
        RequestKind::DescribeProducers(r) => {
            ResponseKind::DescribeProducers(describe_producers::handle(broker, version, r).await)
        }
        RequestKind::DescribeTopicPartitions(r) => ResponseKind::DescribeTopicPartitions(
            describe_topic_partitions::handle(broker, version, r).await,
        ),
        RequestKind::AlterReplicaLogDirs(r) => ResponseKind::AlterReplicaLogDirs(
            alter_replica_log_dirs::handle(broker, version, r).await,
        ),
        RequestKind::DescribeCluster(r) => ResponseKind::DescribeCluster(describe_cluster::handle(
            broker,
            version,
            &caller.listener,
            r,
        )),
        RequestKind::FindCoordinator(r) => ResponseKind::FindCoordinator(
            find_coordinator::handle(broker, version, &caller.listener, r).await,
        ),
        RequestKind::JoinGroup(r) => {
            ResponseKind::JoinGroup(join_group::handle(broker, version, client, peer, r).await)
        }
        RequestKind::ConsumerGroupHeartbeat(r) => ResponseKind::ConsumerGroupHeartbeat(
            consumer_group_heartbeat::handle(broker, version, client, peer, r).await,
        ),
        RequestKind::ConsumerGroupDescribe(r) => ResponseKind::ConsumerGroupDescribe(
            consumer_group_describe::handle(broker, version, r).await,
        ),
        RequestKind::SyncGroup(r) => {
            ResponseKind::SyncGroup(sync_group::handle(broker, version, r).await)
        }
        RequestKind::Heartbeat(r) => {
            ResponseKind::Heartbeat(heartbeat::handle(broker, version, r).await)
        }
        RequestKind::LeaveGroup(r) => {
            ResponseKind::LeaveGroup(leave_group::handle(broker, version, r).await)
        }
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(offset_commit::handle(broker, version, r).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(offset_fetch::handle(broker, version, r).await)
        }
        RequestKind::OffsetDelete(r) => {
            ResponseKind::OffsetDelete(offset_delete::handle(broker, version, r).await)
        }
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(describe_groups::handle(broker, version, r).await)
        }
        RequestKind::ListGroups(r) => {
            ResponseKind::ListGroups(list_groups::handle(broker, version, r).await)
        }
        RequestKind::DeleteGroups(r) => {
            ResponseKind::DeleteGroups(delete_groups::handle(broker, version, r).await)
        }
        RequestKind::SaslHandshake(_) => {
            ResponseKind::SaslHandshake(scram::handshake_out_of_place(broker, caller.sasl))
        }
        RequestKind::SaslAuthenticate(_) => {
            ResponseKind::SaslAuthenticate(scram::authenticate_out_of_place(caller.sasl))
        }
        RequestKind::DescribeUserScramCredentials(r) => {
            ResponseKind::DescribeUserScramCredentials(scram::describe(broker, version, r))
        }
        RequestKind::AlterUserScramCredentials(r) => {
            ResponseKind::AlterUserScramCredentials(scram::alter(broker, version, r).await)
        }
        RequestKind::DescribeClientQuotas(r) => {
            ResponseKind::DescribeClientQuotas(client_quotas::describe(broker, version, r))
        }
        RequestKind::AlterClientQuotas(r) => {
            ResponseKind::AlterClientQuotas(client_quotas::alter(broker, version, r).await)
        }
        RequestKind::CreateAcls(r) => {
            ResponseKind::CreateAcls(acls::create(broker, version, r).await)
        }
        RequestKind::DescribeAcls(r) => {
            ResponseKind::DescribeAcls(acls::describe(broker, version, r))
        }
        RequestKind::DeleteAcls(r) => {
            ResponseKind::DeleteAcls(acls::delete(broker, version, r).await)
        }
        other => {
            // The registry and this match disagree: a bug, caught by a unit test.
            tracing::error!(?api_key, "no handler for a registered API: {other:?}");
            return Outcome::Close;
        }
    };
    if let Some(patch) = patch {
        patch(broker, &mut response);
    }
    throttle(
        broker,
        caller,
        client,
        &mut response,
        produce_throttle_ms,
        consumer_fetch,
    );
    respond(broker, api_key, version, header.correlation_id, response)
}

/// Counts the request against the client's quotas (`crate::serve::quota`): a pause
/// earned is the response's `throttle_time_ms` and mutes the connection; a throttled
/// fetch answers without records. A produce request was counted when it was read
/// (`produce_throttle_ms`, its connection muted then).
fn throttle(
    broker: &Broker,
    caller: &crate::serve::authz::Caller,
    client_id: &str,
    response: &mut ResponseKind,
    produce_throttle_ms: u64,
    consumer_fetch: bool,
) {
    use crate::serve::quota;
    // Every request counts for request_percentage (with the time of the requests
    // before it that finished after their count); the longer pause stands.
    let busy = quota::record_time(broker, caller, client_id, caller.take_busy());
    let pause = match response {
        ResponseKind::Produce(r) => {
            r.throttle_time_ms = r.throttle_time_ms.max(produce_throttle_ms as i32);
            0
        }
        ResponseKind::Fetch(r) if consumer_fetch => {
            let bytes = r
                .responses
                .iter()
                .flat_map(|t| &t.partitions)
                .map(|p| p.records.as_ref().map_or(0, |b| b.len()))
                .sum();
            let ms = quota::record(broker, caller, client_id, quota::CONSUMER_BYTE_RATE, bytes);
            r.throttle_time_ms = r.throttle_time_ms.max(ms.min(i32::MAX as u64) as i32);
            ms
        }
        _ => 0,
    };
    let pause = pause.max(busy);
    if busy > 0 {
        set_throttle(response, busy.min(i32::MAX as u64) as i32);
    }
    caller.mute_for(pause);
}

/// Raises a response's `throttle_time_ms` to `ms` where the response has one.
fn set_throttle(response: &mut ResponseKind, ms: i32) {
    macro_rules! raise {
        ($($kind:ident),*) => {
            match response {
                $(ResponseKind::$kind(r) => r.throttle_time_ms = r.throttle_time_ms.max(ms),)*
                _ => {}
            }
        };
    }
    raise!(
        Produce,
        Fetch,
        ListOffsets,
        Metadata,
        OffsetCommit,
        OffsetFetch,
        FindCoordinator,
        JoinGroup,
        Heartbeat,
        ConsumerGroupHeartbeat,
        ConsumerGroupDescribe,
        LeaveGroup,
        SyncGroup,
        DescribeGroups,
        ListGroups,
        ApiVersions,
        CreateTopics,
        DeleteTopics,
        DeleteRecords,
        InitProducerId,
        OffsetForLeaderEpoch,
        AddPartitionsToTxn,
        AddOffsetsToTxn,
        EndTxn,
        TxnOffsetCommit,
        DescribeConfigs,
        AlterConfigs,
        IncrementalAlterConfigs,
        CreatePartitions,
        DeleteGroups,
        DescribeCluster,
        DescribeProducers,
        DescribeTransactions,
        ListTransactions,
        DescribeAcls,
        CreateAcls,
        DeleteAcls,
        DescribeClientQuotas,
        AlterClientQuotas,
        OffsetDelete,
        DescribeLogDirs
    );
}

fn respond(
    broker: &Broker,
    api_key: kafka_protocol::messages::ApiKey,
    version: i16,
    correlation_id: i32,
    response: ResponseKind,
) -> Outcome {
    observe(broker, api_key as i16, &response);
    match encode_response(api_key, version, correlation_id, &response) {
        Ok(b) => Outcome::Respond(b),
        Err(e) => {
            tracing::error!(?api_key, version, error = %e, "cannot encode response; closing connection");
            Outcome::Close
        }
    }
}

pub use crate::base::util::sb;

/// The keys that appear more than once among `keys`.
pub fn repeated<K: Eq + std::hash::Hash>(keys: impl IntoIterator<Item = K>) -> HashSet<K> {
    let (mut seen, mut twice) = (HashSet::new(), HashSet::new());
    for k in keys {
        if seen.contains(&k) {
            twice.insert(k);
        } else {
            seen.insert(k);
        }
    }
    twice
}

/// Splits a request's entries into those whose `key` appears once, in order, and the
/// keys that appear more than once (in the order they first appear). Kafka's
/// controller acts on none of a repeated key's entries and answers it once,
/// INVALID_REQUEST (CreateTopics, DeleteTopics, CreatePartitions).
pub fn once_each<T, K: Eq + std::hash::Hash + Clone>(
    items: Vec<T>,
    key: impl Fn(&T) -> K,
) -> (Vec<T>, Vec<K>) {
    let twice = repeated(items.iter().map(&key));
    let mut named = Vec::new();
    let mut once = Vec::with_capacity(items.len());
    for item in items {
        let k = key(&item);
        if !twice.contains(&k) {
            once.push(item);
        } else if !named.contains(&k) {
            // The first entry of a repeated key names it; later ones are dropped.
            named.push(k);
        }
    }
    (once, named)
}
pub use sluice_protocol::{
    encode_response, fuzz_decode, lookup, parse, ApiSpec, DecodeError, Parsed, Request, REGISTRY,
};

/// Counts a response's error codes (per partition where it has them) and the records
/// a Fetch returns, for the metrics endpoint. A walk over the response's fields and the
/// batch headers: no record is decoded.
fn observe(broker: &Broker, api_key: i16, response: &ResponseKind) {
    let m = broker.shard_metrics();
    match response {
        ResponseKind::Produce(r) => {
            for p in r.responses.iter().flat_map(|t| &t.partition_responses) {
                m.error(api_key, p.error_code);
            }
        }
        ResponseKind::Fetch(r) => {
            m.error(api_key, r.error_code);
            let mut records = 0u64;
            for p in r.responses.iter().flat_map(|t| &t.partitions) {
                m.error(api_key, p.error_code);
                if let Some(b) = &p.records {
                    records += sluice_storage::batch::stored_batches(b)
                        .filter(|(h, _)| !h.is_control())
                        .map(|(h, _)| h.record_count.max(0) as u64)
                        .sum::<u64>();
                }
            }
            crate::observe::metrics::ShardMetrics::add(&m.records_out, records);
        }
        ResponseKind::OffsetCommit(r) => {
            for p in r.topics.iter().flat_map(|t| &t.partitions) {
                m.error(api_key, p.error_code);
            }
        }
        ResponseKind::ListOffsets(r) => {
            for p in r.topics.iter().flat_map(|t| &t.partitions) {
                m.error(api_key, p.error_code);
            }
        }
        ResponseKind::JoinGroup(r) => m.error(api_key, r.error_code),
        ResponseKind::SyncGroup(r) => m.error(api_key, r.error_code),
        ResponseKind::Heartbeat(r) => m.error(api_key, r.error_code),
        ResponseKind::ConsumerGroupHeartbeat(r) => m.error(api_key, r.error_code),
        ResponseKind::LeaveGroup(r) => m.error(api_key, r.error_code),
        ResponseKind::InitProducerId(r) => m.error(api_key, r.error_code),
        ResponseKind::EndTxn(r) => m.error(api_key, r.error_code),
        _ => {}
    }
}

fn unsupported(api_key: i16, version: i16, correlation_id: i32) -> Outcome {
    tracing::debug!(
        api_key,
        version,
        "unsupported API key or version (ApiVersions is answered, anything else closes the connection)"
    );
    match sluice_protocol::unsupported_response(api_key, correlation_id) {
        Some(frame) => Outcome::Respond(frame),
        None => Outcome::Close,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_is_named_once_and_none_of_its_entries_kept() {
        let (once, repeated) = once_each(vec!["a", "b", "a", "c", "a", "c"], |s| *s);
        assert_eq!(once, vec!["b"]);
        assert_eq!(repeated, vec!["a", "c"]);
        let (once, repeated) = once_each(vec!["x", "y"], |s| *s);
        assert_eq!((once, repeated), (vec!["x", "y"], vec![]));
    }

    /// Every registered API has a handler arm: a default request of each reaches one
    /// (an unhandled one closes the connection).
    #[test]
    fn every_registered_api_has_a_handler() {
        let src = include_str!("mod.rs");
        for s in REGISTRY {
            let arm = format!("RequestKind::{:?}(", s.key);
            assert!(
                src.contains(&arm),
                "{:?} is registered but has no handler arm",
                s.key
            );
        }
    }
}
