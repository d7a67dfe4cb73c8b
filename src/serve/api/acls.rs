//! CreateAcls (key 30), DescribeAcls (29) and DeleteAcls (31): Kafka ACL bindings
//! kept in the metadata quorum (`sluice_replication::acl`), the authorizer's input
//! (`crate::serve::authz`). Creating needs ALTER on the cluster, describing DESCRIBE,
//! deleting ALTER (checked before the handler, `crate::serve::api::gate`).
//!
//! As Kafka: an invalid binding or filter fails alone with INVALID_REQUEST and its
//! reason; the rest of the request goes through. A deletion proposes exactly the
//! bindings its filters matched in this broker's image, and answers with them.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_acls_request::CreateAclsRequest;
use kafka_protocol::messages::create_acls_response::{AclCreationResult, CreateAclsResponse};
use kafka_protocol::messages::delete_acls_request::DeleteAclsRequest;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl, DeleteAclsResponse,
};
use kafka_protocol::messages::describe_acls_request::DescribeAclsRequest;
use kafka_protocol::messages::describe_acls_response::{
    AclDescription, DescribeAclsResource, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use sluice_replication::acl::{Acl, AclFilter};
use sluice_replication::cluster::Command;

use super::sb;
use crate::base::error::ApiError;
use crate::base::rpc::Propose;
use crate::partition::broker::Broker;

fn text(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

/// The filter of a DescribeAcls request or of one DeleteAcls filter (the two carry
/// the same fields, in different types).
macro_rules! filter_of {
    ($f:expr) => {
        AclFilter {
            resource_type: $f.resource_type_filter,
            resource_name: text(&$f.resource_name_filter),
            pattern_type: $f.pattern_type_filter,
            principal: text(&$f.principal_filter),
            host: text(&$f.host_filter),
            operation: $f.operation,
            permission: $f.permission_type,
        }
    };
}

/// Proposes a command and waits for it to commit.
async fn propose(broker: &Broker, command: Command) -> Result<(), ApiError> {
    match broker.control(Propose(command)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) | Err(e) => Err(e),
    }
}

fn invalid(why: String) -> ApiError {
    ApiError::with(ResponseError::InvalidRequest, why)
}

pub async fn create(
    broker: &Rc<Broker>,
    _version: i16,
    req: CreateAclsRequest,
) -> CreateAclsResponse {
    let checked: Vec<Result<Acl, ApiError>> = req
        .creations
        .iter()
        .map(|c| {
            let acl = Acl {
                resource_type: c.resource_type,
                resource_name: c.resource_name.to_string(),
                pattern_type: c.resource_pattern_type,
                principal: c.principal.to_string(),
                host: c.host.to_string(),
                operation: c.operation,
                permission: c.permission_type,
            };
            acl.validate().map(|()| acl).map_err(invalid)
        })
        .collect();
    let valid: Vec<Acl> = checked
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .cloned()
        .collect();
    let committed = if valid.is_empty() {
        Ok(())
    } else {
        propose(broker, Command::CreateAcls { acls: valid }).await
    };
    let results = checked
        .into_iter()
        .map(|r| match r.and(committed.clone()) {
            Ok(()) => AclCreationResult::default(),
            Err(e) => AclCreationResult::default()
                .with_error_code(e.code())
                .with_error_message(e.message.map(sb)),
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

pub fn describe(broker: &Broker, _version: i16, req: DescribeAclsRequest) -> DescribeAclsResponse {
    let filter = filter_of!(req);
    if let Err(why) = filter.validate() {
        return DescribeAclsResponse::default()
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_error_message(Some(sb(why)));
    }
    let image = broker.image();
    // Grouped by resource, in the index's order (type, then name).
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for a in image.acls.bindings().filter(|a| filter.matches(a)) {
        let description = AclDescription::default()
            .with_principal(sb(a.principal.clone()))
            .with_host(sb(a.host.clone()))
            .with_operation(a.operation)
            .with_permission_type(a.permission);
        let same = resources.last_mut().filter(|r| {
            r.resource_type == a.resource_type
                && r.pattern_type == a.pattern_type
                && *r.resource_name == *a.resource_name
        });
        match same {
            Some(r) => r.acls.push(description),
            None => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(a.resource_type)
                    .with_resource_name(sb(a.resource_name.clone()))
                    .with_pattern_type(a.pattern_type)
                    .with_acls(vec![description]),
            ),
        }
    }
    DescribeAclsResponse::default().with_resources(resources)
}

pub async fn delete(
    broker: &Rc<Broker>,
    _version: i16,
    req: DeleteAclsRequest,
) -> DeleteAclsResponse {
    let image = broker.image();
    let matched: Vec<Result<Vec<Acl>, ApiError>> = req
        .filters
        .iter()
        .map(|f| {
            let filter = filter_of!(f);
            filter.validate().map_err(invalid)?;
            Ok(image
                .acls
                .bindings()
                .filter(|a| filter.matches(a))
                .cloned()
                .collect())
        })
        .collect();
    let mut gone: Vec<Acl> = matched.iter().flatten().flatten().cloned().collect();
    gone.sort();
    gone.dedup();
    let committed = if gone.is_empty() {
        Ok(())
    } else {
        propose(broker, Command::DeleteAcls { acls: gone }).await
    };
    let filter_results = matched
        .into_iter()
        .map(
            |m| match m.and_then(|acls| committed.clone().map(|()| acls)) {
                Ok(acls) => DeleteAclsFilterResult::default().with_matching_acls(
                    acls.into_iter()
                        .map(|a| {
                            DeleteAclsMatchingAcl::default()
                                .with_resource_type(a.resource_type)
                                .with_resource_name(sb(a.resource_name))
                                .with_pattern_type(a.pattern_type)
                                .with_principal(sb(a.principal))
                                .with_host(sb(a.host))
                                .with_operation(a.operation)
                                .with_permission_type(a.permission)
                        })
                        .collect(),
                ),
                Err(e) => DeleteAclsFilterResult::default()
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            },
        )
        .collect();
    DeleteAclsResponse::default().with_filter_results(filter_results)
}
