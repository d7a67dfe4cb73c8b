//! ConsumerGroupHeartbeat (v0–v1, KIP-848): routed to the group's coordinator shard,
//! which answers at once with the member's epoch and, when it changed, its assignment.
//! v0 clients may join without a member id: one is made here (v1 clients name
//! themselves, KIP-1082).

use std::rc::Rc;

use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};

use crate::base::rpc::ConsumerHeartbeat;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use crate::serve::api::sb;
use sluice_coordinator::group::consumer::HeartbeatArgs;
use sluice_coordinator::group::Assignment as Partitions;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    client_id: &str,
    peer: Option<std::net::IpAddr>,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let group = req.group_id.to_string();
    let mut member_id = req.member_id.to_string();
    if version == 0 && member_id.is_empty() && matches!(req.member_epoch, 0 | -2) {
        member_id = uuid::Uuid::new_v4().simple().to_string();
    }
    let owned = req.topic_partitions.map(|tps| {
        let mut a = Partitions::new();
        for tp in tps {
            a.entry(tp.topic_id).or_default().extend(tp.partitions);
        }
        a
    });
    let args = HeartbeatArgs {
        group_id: group.clone(),
        member_id,
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.map(|s| s.to_string()),
        rack_id: req.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .map(|ns| ns.into_iter().map(|n| n.to_string()).collect()),
        subscribed_topic_regex: req.subscribed_topic_regex.map(|s| s.to_string()),
        server_assignor: req.server_assignor.map(|s| s.to_string()),
        owned,
        client_id: client_id.to_string(),
        // Kafka's form: "/<ip>".
        client_host: peer.map(|ip| format!("/{ip}")).unwrap_or_default(),
        // The group's configs are looked up on its coordinator's shard.
        session_timeout_ms: None,
        heartbeat_interval_ms: None,
    };
    let call = ConsumerHeartbeat {
        partition: partition_for(&group),
        args,
    };
    match route(broker, call).await {
        Ok(Ok(r)) => ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(sb(r.member_id)))
            .with_member_epoch(r.member_epoch)
            .with_heartbeat_interval_ms(r.heartbeat_interval_ms)
            .with_assignment(r.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(id, ps)| {
                            TopicPartitions::default()
                                .with_topic_id(id)
                                .with_partitions(ps.into_iter().collect())
                        })
                        .collect(),
                )
            })),
        Ok(Err(refused)) => ConsumerGroupHeartbeatResponse::default()
            .with_error_code(refused.code.code())
            .with_error_message(Some(sb(refused.message))),
        Err(e) => ConsumerGroupHeartbeatResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message.map(sb)),
    }
}
