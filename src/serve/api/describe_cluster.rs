//! DescribeCluster (key 60): the registered live brokers and the controller leader, and
//! the cluster's authorized operations when asked (see [`super::authorized_ops`]).
//!
//! v1's `endpoint_type` (KIP-919): brokers answer for type 1 (BROKER) only; a request
//! for the controllers' endpoints (2) is MISMATCHED_ENDPOINT_TYPE, an unknown type
//! UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker answers.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_cluster_request::DescribeClusterRequest;
use kafka_protocol::messages::describe_cluster_response::{
    DescribeClusterBroker, DescribeClusterResponse,
};

use super::authorized_ops::{when_asked, CLUSTER_ALL};
use super::sb;
use crate::partition::broker::Broker;

/// `listener`: the one the client connected through (brokers without it are left out).
pub fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    listener: &str,
    req: DescribeClusterRequest,
) -> DescribeClusterResponse {
    const BROKER: i8 = 1;
    const CONTROLLER: i8 = 2;
    let refused = match req.endpoint_type {
        BROKER => None,
        CONTROLLER => Some((
            ResponseError::MismatchedEndpointType,
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type CONTROLLER".to_string(),
        )),
        other => Some((
            ResponseError::UnsupportedEndpointType,
            format!("Unsupported endpoint type {other}"),
        )),
    };
    if let Some((code, message)) = refused {
        return DescribeClusterResponse::default()
            .with_error_code(code.code())
            .with_error_message(Some(sb(message)))
            .with_endpoint_type(req.endpoint_type);
    }
    let image = broker.image();
    DescribeClusterResponse::default()
        .with_endpoint_type(BROKER)
        .with_cluster_authorized_operations(when_asked(
            req.include_cluster_authorized_operations,
            CLUSTER_ALL,
        ))
        .with_cluster_id(sb(image.cluster_id.clone()))
        .with_controller_id(
            image
                .controller_for_clients(broker.config.broker_id())
                .into(),
        )
        .with_brokers(
            image
                .brokers
                .iter()
                .filter(|(_, b)| !b.fenced)
                .filter_map(|(id, b)| {
                    let (host, port) = b.endpoint(listener)?;
                    Some(
                        DescribeClusterBroker::default()
                            .with_broker_id((*id).into())
                            .with_host(sb(host.to_string()))
                            .with_port(port)
                            .with_rack(b.rack.clone().map(sb)),
                    )
                })
                .collect(),
        )
}
