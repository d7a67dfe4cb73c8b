//! ListGroups (v0–v5; v4 filters by state, v5 by group type — classic or consumer
//! (KIP-848) — both case-insensitively).

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
    let wanted: Vec<String> = req
        .states_filter
        .iter()
        .map(|s| s.trim().to_lowercase())
        .collect();
    let types: Vec<String> = req
        .types_filter
        .iter()
        .map(|s| s.trim().to_lowercase())
        .collect();
    let groups = groups
        .into_iter()
        .filter(|g| wanted.is_empty() || wanted.contains(&g.state.to_lowercase()))
        .filter(|g| types.is_empty() || types.iter().any(|t| t == g.group_type))
        .map(|g| {
            let listed = ListedGroup::default()
                .with_group_id(sb(g.group_id).into())
                .with_protocol_type(sb(g.protocol_type));
            let listed = if version >= 4 {
                listed.with_group_state(sb(g.state))
            } else {
                listed
            };
            if version >= 5 {
                listed.with_group_type(sb(g.group_type))
            } else {
                listed
            }
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}
