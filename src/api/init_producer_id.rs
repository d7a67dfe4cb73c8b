//! InitProducerId (key 22): a producer id and epoch for an idempotent or transactional
//! producer.
//!
//! Without a transactional id (an idempotent producer) Kafka always hands out a fresh
//! producer id with epoch 0, also when the request names the producer's current id and
//! epoch (KIP-360: the producer bumps its epoch after an unknown-producer or sequence
//! error, and a fresh id is a valid bump). Ids come from this broker's block, which the
//! metadata quorum allocates (`Controller::next_producer_id`): unique across brokers
//! and restarts.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};

use crate::broker::Broker;
use crate::error::ApiError;
use crate::rpc::AllocateProducerId;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let transactional = req
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty());
    let result = if transactional {
        Err(ApiError::with(
            ResponseError::TransactionalIdAuthorizationFailed,
            "transactions are not supported by this broker yet",
        ))
    } else {
        broker.control(AllocateProducerId).await.and_then(|r| r)
    };
    match result {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(id.into())
            .with_producer_epoch(0),
        Err(e) => {
            tracing::debug!(error = %e, "InitProducerId refused");
            InitProducerIdResponse::default()
                .with_error_code(e.code())
                .with_producer_epoch(-1)
        }
    }
}
