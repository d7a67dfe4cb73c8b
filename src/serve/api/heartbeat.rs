//! Heartbeat: routed to the group's coordinator shard.

use std::rc::Rc;

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use crate::base::rpc::Heartbeat;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;

pub async fn handle(broker: &Rc<Broker>, version: i16, req: HeartbeatRequest) -> HeartbeatResponse {
    let group = req.group_id.to_string();
    let r = route(
        broker,
        Heartbeat {
            partition: partition_for(&group),
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
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e.code(),
        Err(e) => e.code(),
    };
    HeartbeatResponse::default().with_error_code(code)
}
