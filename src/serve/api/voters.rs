//! AddRaftVoter (key 80) and RemoveRaftVoter (key 81), KIP-853: the metadata quorum's
//! voters change while it runs, one at a time. The controller leader's node answers
//! (another answers NOT_LEADER_OR_FOLLOWER naming the leader, as for DescribeQuorum):
//! AddRaftVoter promotes a node that joined as a learner, has the controller role and
//! holds the committed log (it waits up to the request's timeout for it to catch up:
//! REQUEST_TIMED_OUT after), DUPLICATE_VOTER for a voter; RemoveRaftVoter takes a
//! voter out (VOTER_NOT_FOUND for another node; the only voter is refused). A cluster
//! id other than this cluster's is INCONSISTENT_CLUSTER_ID (null or empty: not
//! checked). The request's directory id
//! and listeners are not checked: a node joins with its controller address already
//! (see `crate::cluster::quorum_io`, "Nodes that join").

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    AddRaftVoterRequest, AddRaftVoterResponse, RemoveRaftVoterRequest, RemoveRaftVoterResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::sb;
use crate::base::error::ApiError;
use crate::base::rpc::ChangeVoters;
use crate::partition::broker::Broker;

/// The request's cluster id, if given, must be this cluster's.
fn check_cluster(broker: &Broker, id: &Option<StrBytes>) -> Result<(), ApiError> {
    let ours = broker.image().cluster_id.clone();
    match id {
        Some(id) if !id.is_empty() && id.as_str() != ours.as_str() => Err(ApiError::with(
            ResponseError::InconsistentClusterId,
            format!("this is cluster {ours}, not {}", id.as_str()),
        )),
        _ => Ok(()),
    }
}

async fn change(
    broker: &Rc<Broker>,
    cluster: &Option<StrBytes>,
    c: ChangeVoters,
) -> (i16, Option<StrBytes>) {
    let result = match check_cluster(broker, cluster) {
        Ok(()) => broker.control(c).await.and_then(|r| r),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => (0, None),
        Err(e) => (e.code(), e.message.map(sb)),
    }
}

pub async fn add(
    broker: &Rc<Broker>,
    _version: i16,
    req: AddRaftVoterRequest,
) -> AddRaftVoterResponse {
    let c = ChangeVoters {
        node: req.voter_id,
        add: true,
        timeout_ms: req.timeout_ms,
    };
    let (code, message) = change(broker, &req.cluster_id, c).await;
    AddRaftVoterResponse::default()
        .with_error_code(code)
        .with_error_message(message)
}

pub async fn remove(
    broker: &Rc<Broker>,
    _version: i16,
    req: RemoveRaftVoterRequest,
) -> RemoveRaftVoterResponse {
    let c = ChangeVoters {
        node: req.voter_id,
        add: false,
        timeout_ms: 30_000,
    };
    let (code, message) = change(broker, &req.cluster_id, c).await;
    RemoveRaftVoterResponse::default()
        .with_error_code(code)
        .with_error_message(message)
}
