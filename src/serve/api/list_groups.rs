//! ListGroups (v0–v4; v4 filters by state, case-insensitively).

use std::rc::Rc;

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{ListGroupsRequest, ListGroupsResponse};

use crate::coord::group::list_all;
use crate::partition::broker::Broker;
use crate::serve::api::sb;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: ListGroupsRequest,
) -> ListGroupsResponse {
    let groups = match list_all(broker).await {
        Ok(g) => g,
        Err(e) => return ListGroupsResponse::default().with_error_code(e.code()),
    };
    let wanted: Vec<String> = req.states_filter.iter().map(|s| s.to_lowercase()).collect();
    let groups = groups
        .into_iter()
        .filter(|g| wanted.is_empty() || wanted.contains(&g.state.name().to_lowercase()))
        .map(|g| {
            let listed = ListedGroup::default()
                .with_group_id(sb(g.group_id).into())
                .with_protocol_type(sb(g.protocol_type));
            if version >= 4 {
                listed.with_group_state(sb(g.state.name()))
            } else {
                listed
            }
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}
