//! ConsumerGroupDescribe (v0–v1, KIP-848): each group asked of its coordinator shard;
//! a classic or unknown group gets GROUP_ID_NOT_FOUND, as in Kafka.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse};
use uuid::Uuid;

use crate::base::rpc::DescribeConsumerGroup;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use crate::serve::api::authorized_ops::{when_asked, GROUP_ALL};
use crate::serve::api::sb;
use sluice_coordinator::group::Assignment as Partitions;

fn assignment(a: Partitions, names: &BTreeMap<Uuid, String>) -> Assignment {
    Assignment::default().with_topic_partitions(
        a.into_iter()
            .map(|(id, ps)| {
                TopicPartitions::default()
                    .with_topic_id(id)
                    .with_topic_name(sb(names.get(&id).cloned().unwrap_or_default()).into())
                    .with_partitions(ps.into_iter().collect())
            })
            .collect(),
    )
}

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut groups = Vec::with_capacity(req.group_ids.len());
    for g in req.group_ids {
        let id = g.to_string();
        let call = DescribeConsumerGroup {
            partition: partition_for(&id),
            group: id.clone(),
        };
        let described = match route(broker, call).await {
            Ok(Ok(v)) => {
                let names = v.topic_names;
                DescribedGroup::default()
                    .with_group_id(g)
                    .with_group_state(sb(v.state))
                    .with_group_epoch(v.epoch)
                    .with_assignment_epoch(v.assignment_epoch)
                    .with_assignor_name(sb(v.assignor))
                    .with_authorized_operations(when_asked(
                        req.include_authorized_operations,
                        GROUP_ALL,
                    ))
                    .with_members(
                        v.members
                            .into_iter()
                            .map(|(m, target)| {
                                Member::default()
                                    .with_member_id(sb(m.id))
                                    .with_instance_id(m.meta.instance_id.map(sb))
                                    .with_rack_id(m.meta.rack_id.map(sb))
                                    .with_member_epoch(m.current.epoch)
                                    .with_client_id(sb(m.meta.client_id))
                                    .with_client_host(sb(m.meta.client_host))
                                    .with_subscribed_topic_names(
                                        m.meta
                                            .subscribed_names
                                            .into_iter()
                                            .map(|n| sb(n).into())
                                            .collect(),
                                    )
                                    .with_subscribed_topic_regex(m.meta.subscribed_regex.map(sb))
                                    .with_assignment(assignment(m.current.assigned, &names))
                                    .with_target_assignment(assignment(target, &names))
                                    .with_member_type(1)
                            })
                            .collect(),
                    )
            }
            Ok(Err(refused)) => DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(refused.code.code())
                .with_error_message(Some(sb(refused.message))),
            Err(e) => DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(e.code()),
        };
        groups.push(described);
    }
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
