//! DescribeCluster (key 60): the registered live brokers and the controller leader, and
//! the cluster's authorized operations when asked (see [`super::authorized_ops`]).

use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_request::DescribeClusterRequest;
use kafka_protocol::messages::describe_cluster_response::{
    DescribeClusterBroker, DescribeClusterResponse,
};
use kafka_protocol::messages::BrokerId;

use super::authorized_ops::{when_asked, CLUSTER_ALL};
use super::sb;
use crate::broker::Broker;

pub fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DescribeClusterRequest,
) -> DescribeClusterResponse {
    let image = broker.image();
    DescribeClusterResponse::default()
        .with_cluster_authorized_operations(when_asked(
            req.include_cluster_authorized_operations,
            CLUSTER_ALL,
        ))
        .with_cluster_id(sb(image.cluster_id.clone()))
        .with_controller_id(BrokerId(image.controller_id))
        .with_brokers(
            image
                .brokers
                .iter()
                .filter(|(_, b)| !b.fenced)
                .map(|(id, b)| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(*id))
                        .with_host(sb(b.host.clone()))
                        .with_port(b.port)
                        .with_rack(b.rack.clone().map(sb))
                })
                .collect(),
        )
}
