//! DescribeCluster (key 60): this broker is the whole cluster and its controller.

use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_request::DescribeClusterRequest;
use kafka_protocol::messages::describe_cluster_response::{
    DescribeClusterBroker, DescribeClusterResponse,
};
use kafka_protocol::messages::BrokerId;

use super::sb;
use crate::broker::Broker;

pub fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    _req: DescribeClusterRequest,
) -> DescribeClusterResponse {
    let c = &broker.config;
    DescribeClusterResponse::default()
        .with_cluster_id(sb(broker.image().cluster_id.clone()))
        .with_controller_id(BrokerId(c.node_id))
        .with_brokers(vec![DescribeClusterBroker::default()
            .with_broker_id(BrokerId(c.node_id))
            .with_host(sb(c.advertised_host.clone()))
            .with_port(c.advertised_port)])
}
