//! DeleteGroups (v0–v2): only empty groups; their offsets and metadata are tombstoned.

use std::rc::Rc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use crate::base::rpc::DeleteGroup;
use crate::coord::group::{partition_for, route};
use crate::partition::broker::Broker;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(req.groups_names.len());
    for g in req.groups_names {
        let id = g.to_string();
        let call = DeleteGroup {
            partition: partition_for(&id),
            group: id.clone(),
        };
        let code = match route(broker, call).await {
            Ok(c) => c.err().map_or(0, |e| e.code()),
            Err(e) => e.code(),
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(code),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}
