//! DescribeGroups (v0–v5): each group asked of its coordinator shard. An unknown group
//! is described as Dead without an error, as Kafka does before v6.

use std::rc::Rc;

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse};

use crate::base::rpc::DescribeGroup;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;
use crate::serve::api::authorized_ops::{when_asked, GROUP_ALL};
use crate::serve::api::sb;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let mut groups = Vec::with_capacity(req.groups.len());
    for g in req.groups {
        let id = g.to_string();
        let call = DescribeGroup {
            partition: partition_for(&id),
            group: id.clone(),
        };
        let described = match route(broker, call).await {
            Ok(s) => DescribedGroup::default()
                .with_group_id(g)
                .with_group_state(sb(s.state.name()))
                .with_protocol_type(sb(s.protocol_type))
                .with_protocol_data(sb(s.protocol))
                .with_members(
                    s.members
                        .into_iter()
                        .map(|(member, instance, client, host, meta, asg)| {
                            DescribedGroupMember::default()
                                .with_member_id(sb(member))
                                .with_group_instance_id(if version >= 4 {
                                    instance.map(sb)
                                } else {
                                    None
                                })
                                .with_client_id(sb(client))
                                .with_client_host(sb(host))
                                .with_member_metadata(meta)
                                .with_member_assignment(asg)
                        })
                        .collect(),
                ),
            Err(e) => DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(e.code()),
        };
        // KIP-430 (v3+): asked for, a described group gets every group operation; an
        // error entry keeps "not provided", as in Kafka.
        let described = if version >= 3 && described.error_code == 0 {
            described.with_authorized_operations(when_asked(
                req.include_authorized_operations,
                GROUP_ALL,
            ))
        } else {
            described
        };
        groups.push(described);
    }
    DescribeGroupsResponse::default().with_groups(groups)
}
