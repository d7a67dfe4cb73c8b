//! InitProducerId (key 22): a producer id and epoch for an idempotent or transactional
//! producer.
//!
//! Without a transactional id (an idempotent producer) Kafka always hands out a fresh
//! producer id with epoch 0, also when the request names the producer's current id and
//! epoch (KIP-360: the producer bumps its epoch after an unknown-producer or sequence
//! error, and a fresh id is a valid bump). Ids come from this broker's block, which the
//! metadata quorum allocates (`Controller::next_producer_id`): unique across brokers
//! and restarts. With a transactional id the id's transaction coordinator answers
//! (`crate::coord::txn`): the same producer id with the next epoch, fencing older instances.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};

use crate::base::rpc::{AllocateProducerId, TxnInit};
use crate::partition::broker::Broker;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let txn_id = req.transactional_id.as_ref().map(|t| t.0.to_string());
    // As Kafka (KafkaApis, TransactionCoordinator.handleInitProducerId): a producer id
    // without its epoch (or the reverse), and an empty transactional id, are invalid.
    let (id, epoch) = (req.producer_id.0, req.producer_epoch);
    let invalid = if (id == -1) != (epoch == -1) {
        Some(format!(
            "producer id {id} with epoch {epoch}: both or neither"
        ))
    } else if txn_id.as_deref() == Some("") {
        Some("empty transactional id".to_string())
    } else {
        None
    };
    if let Some(why) = invalid {
        tracing::debug!(why, "InitProducerId refused");
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_producer_id((-1).into())
            .with_producer_epoch(-1);
    }
    let result = match txn_id {
        // A transactional producer: its coordinator (crate::coord::txn) keeps the id's epoch.
        Some(id) => {
            let call = TxnInit {
                partition: crate::coord::txn::partition_for(&id),
                args: crate::coord::txn::init_args(
                    Some(id),
                    req.transaction_timeout_ms,
                    req.producer_id.0,
                    req.producer_epoch,
                ),
            };
            crate::coord::txn::route(broker, call)
                .await
                .map(|pe| (pe.producer_id, pe.epoch))
        }
        None => broker
            .control(AllocateProducerId)
            .await
            .and_then(|r| r)
            .map(|id| (id.get(), 0)),
    };
    match result {
        Ok((id, epoch)) => InitProducerIdResponse::default()
            .with_producer_id(id.into())
            .with_producer_epoch(epoch),
        Err(e) => {
            tracing::debug!(error = %e, "InitProducerId refused");
            // Clients before v4 do not know PRODUCER_FENCED.
            let code = if e.code == ResponseError::ProducerFenced && version < 4 {
                ResponseError::InvalidProducerEpoch.code()
            } else {
                e.code()
            };
            InitProducerIdResponse::default()
                .with_error_code(code)
                .with_producer_epoch(-1)
        }
    }
}
