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
        .filter(|(_, _, state)| wanted.is_empty() || wanted.contains(&state.name().to_lowercase()))
        .map(|(id, protocol_type, state)| {
            let g = ListedGroup::default()
                .with_group_id(sb(id).into())
                .with_protocol_type(sb(protocol_type));
            if version >= 4 {
                g.with_group_state(sb(state.name()))
            } else {
                g
            }
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}
