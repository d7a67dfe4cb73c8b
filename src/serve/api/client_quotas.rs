//! DescribeClientQuotas (key 48) and AlterClientQuotas (49): byte-rate quotas per user
//! and client id, kept in the metadata quorum (`sluice_replication::quota`) and enforced
//! per shard (`crate::serve::quota`). Entities are `user`, `client-id` or both, a null
//! name being the default; the keys enforced are `producer_byte_rate` and
//! `consumer_byte_rate` (Kafka's others are refused with INVALID_REQUEST and the reason,
//! as is an `ip` entity). Describing needs DESCRIBE_CONFIGS on the cluster, altering
//! ALTER_CONFIGS (checked by `crate::serve::api::gate`).

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_client_quotas_response::{
    EntityData as AlteredEntity, EntryData as AlteredEntry,
};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use sluice_replication::cluster::Command;
use sluice_replication::quota::{self, EntityName, QuotaChange, QuotaEntity, CLIENT_ID, USER};

use super::sb;
use crate::base::error::ApiError;
use crate::base::rpc::Propose;
use crate::partition::broker::Broker;

fn invalid(why: impl Into<String>) -> ApiError {
    ApiError::with(ResponseError::InvalidRequest, why.into())
}

fn name_of(n: &Option<StrBytes>) -> EntityName {
    match n {
        Some(s) => EntityName::Named(s.to_string()),
        None => EntityName::Default,
    }
}

/// An entity from its components (each type at most once; `user` and `client-id`).
fn entity<'a>(
    components: impl IntoIterator<Item = (&'a StrBytes, &'a Option<StrBytes>)>,
) -> Result<QuotaEntity, ApiError> {
    let mut e = QuotaEntity {
        user: None,
        client_id: None,
    };
    for (kind, name) in components {
        let slot = match &**kind {
            USER => &mut e.user,
            CLIENT_ID => &mut e.client_id,
            "ip" => {
                return Err(invalid(
                    "ip quotas (connection_creation_rate) are not supported by Sluice",
                ))
            }
            other => return Err(invalid(format!("unknown entity type {other}"))),
        };
        if slot.is_some() {
            return Err(invalid(format!("entity type {kind} named twice")));
        }
        *slot = Some(name_of(name));
    }
    Ok(e)
}

fn components(e: &QuotaEntity) -> Vec<(&'static str, Option<String>)> {
    let name = |n: &EntityName| match n {
        EntityName::Default => None,
        EntityName::Named(s) => Some(s.clone()),
    };
    let mut out = Vec::new();
    if let Some(u) = &e.user {
        out.push((USER, name(u)));
    }
    if let Some(c) = &e.client_id {
        out.push((CLIENT_ID, name(c)));
    }
    out
}

pub fn describe(
    broker: &Broker,
    _version: i16,
    req: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let failed = |e: ApiError| {
        DescribeClientQuotasResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message.map(sb))
            .with_entries(None)
    };
    let mut seen = Vec::new();
    for c in &req.components {
        if ![USER, CLIENT_ID].contains(&&*c.entity_type) {
            return failed(invalid(format!("unknown entity type {}", &*c.entity_type)));
        }
        if seen.contains(&c.entity_type) {
            return failed(invalid(format!(
                "entity type {} named twice",
                &*c.entity_type
            )));
        }
        if !(0..=2).contains(&c.match_type) {
            return failed(invalid(format!("unknown match type {}", c.match_type)));
        }
        seen.push(c.entity_type.clone());
    }
    let image = broker.image();
    let matches = |e: &QuotaEntity| {
        let has = |kind: &str| match kind {
            USER => e.user.as_ref(),
            _ => e.client_id.as_ref(),
        };
        let all = req
            .components
            .iter()
            .all(|c| match (has(&c.entity_type), c.match_type) {
                (None, _) => false,
                // Exact: the name (a null match is the default).
                (Some(n), 0) => *n == name_of(&c._match),
                (Some(n), 1) => *n == EntityName::Default,
                (Some(n), _) => *n != EntityName::Default,
            });
        let count = usize::from(e.user.is_some()) + usize::from(e.client_id.is_some());
        all && (!req.strict || count == req.components.len())
    };
    let entries = image
        .quotas
        .iter()
        .filter(|q| matches(&q.entity))
        .map(|q| {
            EntryData::default()
                .with_entity(
                    components(&q.entity)
                        .into_iter()
                        .map(|(t, n)| {
                            EntityData::default()
                                .with_entity_type(sb(t))
                                .with_entity_name(n.map(sb))
                        })
                        .collect(),
                )
                .with_values(
                    q.values
                        .iter()
                        .filter_map(|(k, v)| {
                            Some(
                                ValueData::default()
                                    .with_key(sb(k.clone()))
                                    .with_value(v.parse().ok()?),
                            )
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

pub async fn alter(
    broker: &Rc<Broker>,
    _version: i16,
    req: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let checked: Vec<Result<Vec<QuotaChange>, ApiError>> = req
        .entries
        .iter()
        .map(|entry| {
            let e = entity(
                entry
                    .entity
                    .iter()
                    .map(|c| (&c.entity_type, &c.entity_name)),
            )?;
            let changes: Vec<QuotaChange> = entry
                .ops
                .iter()
                .map(|op| QuotaChange {
                    entity: e.clone(),
                    key: op.key.to_string(),
                    value: (!op.remove).then(|| op.value.to_string()),
                })
                .collect();
            let keys: Vec<&str> = changes.iter().map(|c| c.key.as_str()).collect();
            if let Some(k) = keys
                .iter()
                .enumerate()
                .find(|(i, k)| keys[..*i].contains(k))
            {
                return Err(invalid(format!("quota {} changed twice", k.1)));
            }
            for c in &changes {
                quota::validate(c).map_err(invalid)?;
                // Kafka: byte rates are whole numbers (checked here, not when the
                // quorum applies the change, so a log replays as it was accepted).
                let byte_rate = c.key != quota::REQUEST_PERCENTAGE;
                if let Some(v) = c.value.as_deref().filter(|_| byte_rate) {
                    let x: f64 = v.parse().unwrap_or(f64::NAN);
                    if (x - x.round()).abs() > 1e-6 {
                        return Err(invalid(format!(
                            "{} must be a whole number of bytes per second, not {v}",
                            c.key
                        )));
                    }
                }
            }
            Ok(changes)
        })
        .collect();
    let changes: Vec<QuotaChange> = checked.iter().flatten().flatten().cloned().collect();
    let committed = if changes.is_empty() || req.validate_only {
        Ok(())
    } else {
        match broker
            .control(Propose(Command::AlterClientQuotas { changes }))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) | Err(e) => Err(e),
        }
    };
    let entries = req
        .entries
        .into_iter()
        .zip(checked)
        .map(|(entry, r)| {
            let out = AlteredEntry::default().with_entity(
                entry
                    .entity
                    .into_iter()
                    .map(|c| {
                        AlteredEntity::default()
                            .with_entity_type(c.entity_type)
                            .with_entity_name(c.entity_name)
                    })
                    .collect(),
            );
            match r.and_then(|_| committed.clone()) {
                Ok(_) => out,
                Err(e) => out
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            }
        })
        .collect();
    AlterClientQuotasResponse::default().with_entries(entries)
}
