//! AlterConfigs (key 33, v0–v2), the legacy form: each resource's config list replaces
//! its whole explicit set, so a config left out goes back to its default (unlike
//! IncrementalAlterConfigs, which changes only the configs it names).
//!
//! Checked here first, as a Kafka broker checks before forwarding to its controller:
//! a resource named twice, a config named twice or a null value is INVALID_REQUEST; an
//! unknown resource type is INVALID_REQUEST. Topics then go to the controller, which
//! validates the new set exactly as for IncrementalAlterConfigs (unknown topic,
//! INVALID_CONFIG) and honours `validate_only`.
//!
//! Brokers: the resource names this broker (or is empty: the cluster-wide defaults);
//! its list replaces that scope's dynamic broker configs (see
//! [`crate::base::broker_configs`]), checked by the controller: a read-only config is
//! INVALID_REQUEST, as Kafka refuses it, an unknown one or a bad value INVALID_CONFIG.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_configs_request::{AlterConfigsRequest, AlterConfigsResource};
use kafka_protocol::messages::alter_configs_response::{
    AlterConfigsResourceResponse, AlterConfigsResponse,
};

use super::describe_configs::{RESOURCE_BROKER, RESOURCE_TOPIC};
use super::sb;
use crate::base::error::ApiError;
use crate::base::rpc::{AlterConfigs, BrokerConfigChange, ConfigChange, TopicConfigChange};
use crate::partition::broker::Broker;

/// What the broker makes of one resource before the controller sees it.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// A topic's new explicit config set, for the controller.
    Topic(String, BTreeMap<String, String>),
    /// The new dynamic broker config set of a scope (-1: cluster-wide), for the
    /// controller.
    Broker(i32, BTreeMap<String, String>),
    /// Answered here.
    Done(Result<(), ApiError>),
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::with(ResponseError::InvalidRequest, message)
}

/// Plans every resource of the request, in order (pure).
fn plan(resources: &[AlterConfigsResource], node_id: i32) -> Vec<Plan> {
    let duplicated = super::repeated(
        resources
            .iter()
            .map(|r| (r.resource_type, r.resource_name.as_str())),
    );
    resources
        .iter()
        .map(|r| {
            if duplicated.contains(&(r.resource_type, r.resource_name.as_str())) {
                return Plan::Done(Err(invalid("A resource may appear only once per request.")));
            }
            match plan_one(r, node_id) {
                Ok(p) => p,
                Err(e) => Plan::Done(Err(e)),
            }
        })
        .collect()
}

fn plan_one(r: &AlterConfigsResource, node_id: i32) -> Result<Plan, ApiError> {
    let mut set = BTreeMap::new();
    let mut nulls = Vec::new();
    for c in &r.configs {
        let name = c.name.to_string();
        if set.contains_key(&name) || nulls.contains(&name) {
            return Err(invalid(format!("Config {name} is named more than once")));
        }
        match &c.value {
            Some(v) => {
                set.insert(name, v.to_string());
            }
            None => nulls.push(name),
        }
    }
    if !nulls.is_empty() {
        return Err(invalid(format!(
            "A null value is not allowed (configs: {})",
            nulls.join(", ")
        )));
    }
    match r.resource_type {
        RESOURCE_TOPIC => Ok(Plan::Topic(r.resource_name.to_string(), set)),
        RESOURCE_BROKER => {
            let name = r.resource_name.as_str();
            if name.is_empty() {
                return Ok(Plan::Broker(-1, set));
            }
            let id: i32 = name
                .parse()
                .map_err(|_| invalid(format!("Broker id must be an integer, got {name}")))?;
            if id != node_id {
                return Err(invalid(format!(
                    "This is broker {node_id}, not broker {name}"
                )));
            }
            Ok(Plan::Broker(id, set))
        }
        other => Err(invalid(format!("Unknown resource type {other}"))),
    }
}

/// What the controller answered for config changes (AlterConfigs and
/// IncrementalAlterConfigs alike): the topics' results, then the broker scopes', each
/// in the order given. A call that fails answers every change with its error.
pub(super) async fn through_controller(
    broker: &Broker,
    items: Vec<TopicConfigChange>,
    brokers: Vec<BrokerConfigChange>,
    validate_only: bool,
) -> (
    std::vec::IntoIter<Result<(), ApiError>>,
    std::vec::IntoIter<Result<(), ApiError>>,
) {
    let topics_n = items.len();
    let n = topics_n + brokers.len();
    let mut results = if n == 0 {
        Vec::new()
    } else {
        let call = AlterConfigs {
            items,
            brokers,
            validate_only,
        };
        match broker.control(call).await {
            Ok(r) => r,
            Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
        }
    };
    // The controller answers the topics first, then the broker scopes.
    let scopes = results.split_off(topics_n.min(results.len()));
    (results.into_iter(), scopes.into_iter())
}

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let plans = plan(&req.resources, broker.config.node_id);
    let items: Vec<TopicConfigChange> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Topic(name, set) => Some(TopicConfigChange {
                topic: name.clone(),
                change: ConfigChange::Replace(set.clone()),
            }),
            _ => None,
        })
        .collect();
    let brokers: Vec<BrokerConfigChange> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Broker(scope, set) => Some(BrokerConfigChange {
                scope: *scope,
                change: ConfigChange::Replace(set.clone()),
            }),
            _ => None,
        })
        .collect();
    let (mut results, mut broker_results) =
        through_controller(broker, items, brokers, req.validate_only).await;
    let responses = req
        .resources
        .iter()
        .zip(plans)
        .map(|(r, p)| {
            let result = match p {
                Plan::Topic(..) => results.next().expect("one result per topic resource"),
                Plan::Broker(..) => broker_results.next().expect("one per broker scope"),
                Plan::Done(r) => r,
            };
            let base = AlterConfigsResourceResponse::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            match result {
                Ok(()) => base,
                Err(e) => base
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            }
        })
        .collect();
    AlterConfigsResponse::default().with_responses(responses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::alter_configs_request::AlterableConfig;

    fn resource(kind: i8, name: &str, configs: &[(&str, Option<&str>)]) -> AlterConfigsResource {
        AlterConfigsResource::default()
            .with_resource_type(kind)
            .with_resource_name(sb(name))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        AlterableConfig::default()
                            .with_name(sb(*k))
                            .with_value(v.map(sb))
                    })
                    .collect(),
            )
    }

    fn code(p: &Plan) -> Option<ResponseError> {
        match p {
            Plan::Done(Err(e)) => Some(e.code),
            _ => None,
        }
    }

    #[test]
    fn a_topic_resource_becomes_its_whole_new_set() {
        let plans = plan(
            &[resource(
                RESOURCE_TOPIC,
                "t",
                &[
                    ("retention.ms", Some("1000")),
                    ("cleanup.policy", Some("compact")),
                ],
            )],
            1,
        );
        let want: BTreeMap<String, String> =
            [("cleanup.policy", "compact"), ("retention.ms", "1000")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(plans, vec![Plan::Topic("t".into(), want)]);
        // An empty list clears every explicit config.
        let plans = plan(&[resource(RESOURCE_TOPIC, "t", &[])], 1);
        assert_eq!(plans, vec![Plan::Topic("t".into(), BTreeMap::new())]);
    }

    #[test]
    fn malformed_resources_are_invalid_requests() {
        let plans = plan(
            &[
                resource(RESOURCE_TOPIC, "a", &[("retention.ms", None)]),
                resource(
                    RESOURCE_TOPIC,
                    "b",
                    &[("retention.ms", Some("1")), ("retention.ms", Some("2"))],
                ),
                resource(RESOURCE_TOPIC, "c", &[]),
                resource(RESOURCE_TOPIC, "c", &[]),
                resource(8, "logger", &[]),
                resource(RESOURCE_TOPIC, "d", &[]),
            ],
            1,
        );
        let invalid = Some(ResponseError::InvalidRequest);
        assert_eq!(code(&plans[0]), invalid, "null value");
        assert_eq!(code(&plans[1]), invalid, "config named twice");
        assert_eq!(code(&plans[2]), invalid, "resource named twice");
        assert_eq!(code(&plans[3]), invalid, "resource named twice");
        assert_eq!(code(&plans[4]), invalid, "unknown resource type");
        assert!(matches!(plans[5], Plan::Topic(..)));
    }

    #[test]
    fn broker_resources_name_this_broker_or_the_cluster_default() {
        let invalid = Some(ResponseError::InvalidRequest);
        let p = plan(
            &[resource(
                RESOURCE_BROKER,
                "1",
                &[("log.retention.ms", Some("5"))],
            )],
            1,
        );
        let want = BTreeMap::from([("log.retention.ms".to_string(), "5".to_string())]);
        assert_eq!(p, vec![Plan::Broker(1, want)]);
        let p = plan(&[resource(RESOURCE_BROKER, "2", &[])], 1);
        assert_eq!(code(&p[0]), invalid, "another broker's id");
        let p = plan(&[resource(RESOURCE_BROKER, "one", &[])], 1);
        assert_eq!(code(&p[0]), invalid, "not an id");
        let p = plan(
            &[
                resource(RESOURCE_BROKER, "1", &[]),
                resource(RESOURCE_BROKER, "", &[]),
            ],
            1,
        );
        assert_eq!(
            p,
            vec![
                Plan::Broker(1, BTreeMap::new()),
                Plan::Broker(-1, BTreeMap::new())
            ]
        );
    }
}
