//! LeaveGroup (v0–v5; v3+ carries a batch of members, by member id or instance id).

use std::rc::Rc;

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};

use crate::base::rpc::LeaveGroup;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use sluice_coordinator::group::Leaving;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: LeaveGroupRequest,
) -> LeaveGroupResponse {
    let group = req.group_id.to_string();
    let members: Vec<Leaving> = if version >= 3 {
        req.members
            .iter()
            .map(|m| Leaving {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.as_ref().map(|s| s.to_string()),
            })
            .collect()
    } else {
        vec![Leaving {
            member_id: req.member_id.to_string(),
            instance_id: None,
        }]
    };
    let call = LeaveGroup {
        partition: partition_for(&group),
        group: group.clone(),
        members: members.clone(),
    };
    let (group_code, codes) = match route(broker, call).await {
        Ok(left) => (left.error.err().map_or(0, |e| e.code()), left.members),
        Err(e) => (e.code(), Vec::new()),
    };
    let code_of =
        |c: &Result<(), kafka_protocol::error::ResponseError>| c.err().map_or(0, |e| e.code());
    if version < 3 {
        // One member: its error is the response's.
        let code = if group_code != 0 {
            group_code
        } else {
            codes.first().map_or(0, code_of)
        };
        return LeaveGroupResponse::default().with_error_code(code);
    }
    let members = if group_code != 0 {
        Vec::new()
    } else {
        members
            .into_iter()
            .zip(codes.iter())
            .map(|(l, c)| {
                MemberResponse::default()
                    .with_member_id(crate::serve::api::sb(l.member_id))
                    .with_group_instance_id(l.instance_id.map(crate::serve::api::sb))
                    .with_error_code(code_of(c))
            })
            .collect()
    };
    LeaveGroupResponse::default()
        .with_error_code(group_code)
        .with_members(members)
}
