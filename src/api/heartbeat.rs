//! Heartbeat: routed to the group's coordinator shard.

use std::rc::Rc;

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use crate::broker::Broker;
use crate::group::{route, GroupReq, GroupResp};

pub async fn handle(broker: &Rc<Broker>, version: i16, req: HeartbeatRequest) -> HeartbeatResponse {
    let group = req.group_id.to_string();
    let r = route(
        broker,
        &group,
        GroupReq::Heartbeat {
            group: group.clone(),
            generation: req.generation_id,
            member: req.member_id.to_string(),
            instance: if version >= 3 {
                req.group_instance_id.map(|s| s.to_string())
            } else {
                None
            },
        },
    )
    .await;
    let code = match r {
        Ok(GroupResp::Code(Ok(()))) => 0,
        Ok(GroupResp::Code(Err(e))) => e.code(),
        Ok(other) => panic!("Heartbeat answered with {other:?}"),
        Err(e) => e.code(),
    };
    HeartbeatResponse::default().with_error_code(code)
}
