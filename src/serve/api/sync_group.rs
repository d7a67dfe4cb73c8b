//! SyncGroup (v0–v5): routed to the group's coordinator shard; followers wait there for
//! the leader's assignment.

use std::rc::Rc;

use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};

use crate::base::rpc::SyncGroup;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use sluice_coordinator::group::SyncArgs;

pub async fn handle(broker: &Rc<Broker>, version: i16, req: SyncGroupRequest) -> SyncGroupResponse {
    let group = req.group_id.to_string();
    let args = SyncArgs {
        group_id: group.clone(),
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.map(|s| s.to_string()),
        protocol_type: req.protocol_type.map(|s| s.to_string()),
        protocol_name: req.protocol_name.map(|s| s.to_string()),
        assignments: req
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    let call = SyncGroup {
        partition: partition_for(&group),
        args,
    };
    let mut resp = match route(broker, call).await {
        Ok(r) => r,
        Err(e) => SyncGroupResponse::default().with_error_code(e.code()),
    };
    if version < 5 {
        resp.protocol_type = None;
        resp.protocol_name = None;
    }
    resp
}
