//! JoinGroup (v0–v9): routed to the group's coordinator shard, where it waits for the
//! join phase to end.

use std::rc::Rc;

use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};

use crate::base::rpc::JoinGroup;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use crate::serve::api::sb;
use sluice_coordinator::group::JoinArgs;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    client_id: &str,
    peer: Option<std::net::IpAddr>,
    req: JoinGroupRequest,
) -> JoinGroupResponse {
    let group = req.group_id.to_string();
    let args = JoinArgs {
        group_id: group.clone(),
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.map(|s| s.to_string()),
        client_id: client_id.to_string(),
        // Kafka's form: "/<ip>".
        client_host: peer.map(|ip| format!("/{ip}")).unwrap_or_default(),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: if version >= 1 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: version >= 4,
        supports_skip_assignment: version >= 9,
    };
    let call = JoinGroup {
        partition: partition_for(&group),
        args,
    };
    let mut resp = match route(broker, call).await {
        Ok(r) => r,
        Err(e) => JoinGroupResponse::default()
            .with_error_code(e.code())
            .with_generation_id(-1)
            .with_member_id(req.member_id),
    };
    fit_version(&mut resp, version);
    resp
}

/// Leaves out what an older version cannot carry.
fn fit_version(resp: &mut JoinGroupResponse, version: i16) {
    if version < 7 {
        resp.protocol_type = None;
        // Non-nullable before v7: an empty name, as Kafka sends.
        if resp.protocol_name.is_none() {
            resp.protocol_name = Some(sb(""));
        }
    }
    if version < 9 {
        resp.skip_assignment = false;
    }
    if version < 5 {
        for m in &mut resp.members {
            m.group_instance_id = None;
        }
    }
}
