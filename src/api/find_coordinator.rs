//! FindCoordinator (v0–v4, v4 with batched keys): this single broker coordinates every
//! group (key type 0) and every transactional id (key type 1).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};

use crate::api::sb;
use crate::broker::Broker;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

pub fn handle(
    broker: &Broker,
    version: i16,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let c = &broker.config;
    let answer = |key: String| {
        let error = match req.key_type {
            KEY_TYPE_GROUP | KEY_TYPE_TRANSACTION => None,
            _ => Some(ResponseError::InvalidRequest),
        };
        let mut co = Coordinator::default()
            .with_key(sb(key))
            .with_node_id(BrokerId(c.node_id))
            .with_host(sb(c.advertised_host.clone()))
            .with_port(c.advertised_port);
        if let Some(e) = error {
            co = co
                .with_error_code(e.code())
                .with_node_id(BrokerId(-1))
                .with_host(sb(""))
                .with_port(-1)
                .with_error_message(Some(sb(format!("unknown key type {}", req.key_type))));
        }
        co
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
