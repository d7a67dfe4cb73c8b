//! FindCoordinator (v0–v4, v4 with batched keys). A group's coordinator is the leader
//! of its `__consumer_offsets` partition (`hash(group) % 50`); a transactional id's is
//! the leader of its `__transaction_state` partition (same rule).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};

use crate::partition::broker::Broker;
use crate::serve::api::sb;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

/// `listener`: the one the client connected through (the coordinator's endpoint of
/// that name is answered).
pub async fn handle(
    broker: &Broker,
    version: i16,
    listener: &str,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let ready = match req.key_type {
        KEY_TYPE_TRANSACTION => {
            broker
                .ensure_internal_topic(
                    sluice_coordinator::txn::TXN_STATE_TOPIC,
                    crate::coord::txn::TXN_STATE_PARTITIONS,
                )
                .await
        }
        _ => crate::coord::group::ensure_offsets_topic(broker).await,
    };
    let image = broker.image();
    let answer = |key: String| {
        let located = match (req.key_type, &ready) {
            (KEY_TYPE_GROUP | KEY_TYPE_TRANSACTION, Ok(())) => {
                let (topic, partition) = if req.key_type == KEY_TYPE_TRANSACTION {
                    (
                        sluice_coordinator::txn::TXN_STATE_TOPIC,
                        crate::coord::txn::partition_for(&key),
                    )
                } else {
                    (
                        crate::coord::group::OFFSETS_TOPIC,
                        crate::coord::group::partition_for(&key),
                    )
                };
                let leader = image
                    .topics
                    .get(topic)
                    .and_then(|m| m.assignment(partition))
                    .map_or(-1, |a| a.leader);
                match image.brokers.get(&crate::base::ids::BrokerId::new(leader)) {
                    Some(b) if !b.fenced => match b.endpoint(listener) {
                        Some((host, port)) => Ok((leader, host.to_string(), port)),
                        None => Err((
                            ResponseError::CoordinatorNotAvailable,
                            format!("the coordinator, broker {leader}, has no listener {listener}"),
                        )),
                    },
                    _ => Err((
                        ResponseError::CoordinatorNotAvailable,
                        "the coordinator's partition has no leader".to_string(),
                    )),
                }
            }
            (KEY_TYPE_GROUP | KEY_TYPE_TRANSACTION, Err(e)) => {
                Err((ResponseError::CoordinatorNotAvailable, e.to_string()))
            }
            _ => Err((
                ResponseError::InvalidRequest,
                format!("unknown key type {}", req.key_type),
            )),
        };
        let co = Coordinator::default().with_key(sb(key));
        match located {
            Ok((id, host, port)) => co
                .with_node_id(BrokerId(id))
                .with_host(sb(host))
                .with_port(port),
            Err((e, m)) => co
                .with_error_code(e.code())
                .with_node_id(BrokerId(-1))
                .with_host(sb(""))
                .with_port(-1)
                .with_error_message(Some(sb(m))),
        }
    };
    if version >= 4 {
        let coordinators = req
            .coordinator_keys
            .iter()
            .map(|k| answer(k.to_string()))
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let co = answer(req.key.to_string());
    let mut resp = FindCoordinatorResponse::default()
        .with_error_code(co.error_code)
        .with_node_id(co.node_id)
        .with_host(co.host)
        .with_port(co.port);
    if version >= 1 {
        resp = resp.with_error_message(co.error_message);
    }
    resp
}
