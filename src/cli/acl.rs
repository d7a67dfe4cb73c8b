//! `sluice acl add|remove|list`: Kafka ACL bindings (what `kafka-acls.sh` and `rpk
//! security acl` do), against any Kafka-protocol broker: CreateAcls, DeleteAcls and
//! DescribeAcls v3 with Kafka's codes (`sluice_replication::acl`).

use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest};
use sluice_client::blocking::Conn;
use sluice_client::{error_name, sbs};
use sluice_replication::acl::{op, pattern, permission, resource, CLUSTER_NAME};

const CLIENT_ID: &str = "sluice-cli";

/// Why an acl command failed; the text is the message printed.
#[derive(Debug, thiserror::Error)]
pub enum AclCliError {
    #[error(transparent)]
    Client(#[from] sluice_client::Error),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Refused(String),
}

pub type Res<T> = Result<T, AclCliError>;

/// A refused request's error: its code's name, with the broker's message if it gave one.
fn refused(code: i16, message: Option<&kafka_protocol::protocol::StrBytes>) -> AclCliError {
    AclCliError::Refused(match message.filter(|m| !m.is_empty()) {
        Some(m) => format!("{}: {m}", error_name(code)),
        None => error_name(code),
    })
}

/// The resources and principals a command names, as its flags give them.
#[derive(Debug, Default, Clone)]
pub struct Selection {
    pub topics: Vec<String>,
    pub groups: Vec<String>,
    pub transactional_ids: Vec<String>,
    pub cluster: bool,
    /// `literal`, `prefixed` (add, remove) or also `any`, `match` (remove, list).
    pub pattern: Option<String>,
    pub allow_principals: Vec<String>,
    pub deny_principals: Vec<String>,
    pub operations: Vec<String>,
    /// Hosts (add: default `*`).
    pub hosts: Vec<String>,
}

/// The resources named: (type, name).
fn resources(s: &Selection) -> Vec<(i8, String)> {
    let mut out: Vec<(i8, String)> = Vec::new();
    out.extend(s.topics.iter().map(|t| (resource::TOPIC, t.clone())));
    out.extend(s.groups.iter().map(|g| (resource::GROUP, g.clone())));
    out.extend(
        s.transactional_ids
            .iter()
            .map(|t| (resource::TRANSACTIONAL_ID, t.clone())),
    );
    if s.cluster {
        out.push((resource::CLUSTER, CLUSTER_NAME.to_string()));
    }
    out
}

fn pattern_code(name: Option<&str>, default: i8) -> Res<i8> {
    Ok(match name.map(str::to_ascii_lowercase).as_deref() {
        None => default,
        Some("literal") => pattern::LITERAL,
        Some("prefixed") => pattern::PREFIXED,
        Some("any") => pattern::ANY,
        Some("match") => pattern::MATCH,
        Some(other) => {
            return Err(AclCliError::Usage(format!(
                "--resource-pattern-type {other}: literal, prefixed, any or match"
            )))
        }
    })
}

/// Kafka's operation names (any case, `-` or `_` between words: `Read`,
/// `DescribeConfigs`, `describe_configs`, `IDEMPOTENT_WRITE`).
pub fn operation_code(name: &str) -> Option<i8> {
    let n: String = name
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .collect::<String>()
        .to_ascii_lowercase();
    Some(match n.as_str() {
        "all" => op::ALL,
        "read" => op::READ,
        "write" => op::WRITE,
        "create" => op::CREATE,
        "delete" => op::DELETE,
        "alter" => op::ALTER,
        "describe" => op::DESCRIBE,
        "clusteraction" => op::CLUSTER_ACTION,
        "describeconfigs" => op::DESCRIBE_CONFIGS,
        "alterconfigs" => op::ALTER_CONFIGS,
        "idempotentwrite" => op::IDEMPOTENT_WRITE,
        _ => return None,
    })
}

fn operations(names: &[String]) -> Res<Vec<i8>> {
    names
        .iter()
        .map(|n| {
            operation_code(n).ok_or_else(|| {
                AclCliError::Usage(format!("--operation {n}: one of All, Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite"))
            })
        })
        .collect()
}

fn check_principal(p: &str) -> Res<()> {
    if sluice_replication::acl::parse_principal(p).is_none() {
        return Err(AclCliError::Usage(format!(
            "principal {p}: expected Type:name, e.g. User:alice (User:* is everyone)"
        )));
    }
    Ok(())
}

/// Creates one binding per resource, principal, host and operation.
pub fn add(bootstrap: &str, s: &Selection) -> Res<()> {
    let res = resources(s);
    if res.is_empty() {
        return Err(AclCliError::Usage(
            "name a resource: --topic, --group, --transactional-id or --cluster".into(),
        ));
    }
    let principals: Vec<(i8, &String)> = s
        .allow_principals
        .iter()
        .map(|p| (permission::ALLOW, p))
        .chain(s.deny_principals.iter().map(|p| (permission::DENY, p)))
        .collect();
    if principals.is_empty() {
        return Err(AclCliError::Usage(
            "name a principal: --allow-principal or --deny-principal".into(),
        ));
    }
    for (_, p) in &principals {
        check_principal(p)?;
    }
    let ops = operations(&s.operations)?;
    if ops.is_empty() {
        return Err(AclCliError::Usage("name an --operation".into()));
    }
    let hosts = if s.hosts.is_empty() {
        vec!["*".to_string()]
    } else {
        s.hosts.clone()
    };
    let pt = pattern_code(s.pattern.as_deref(), pattern::LITERAL)?;
    let mut creations = Vec::new();
    for (rt, name) in &res {
        for (perm, p) in &principals {
            for h in &hosts {
                for o in &ops {
                    creations.push(
                        AclCreation::default()
                            .with_resource_type(*rt)
                            .with_resource_name(sbs(name))
                            .with_resource_pattern_type(pt)
                            .with_principal(sbs(p))
                            .with_host(sbs(h))
                            .with_operation(*o)
                            .with_permission_type(*perm),
                    );
                }
            }
        }
    }
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let n = creations.len();
    let r = c.call(3, &CreateAclsRequest::default().with_creations(creations))?;
    if let Some(x) = r.results.iter().find(|x| x.error_code != 0) {
        return Err(refused(x.error_code, x.error_message.as_ref()));
    }
    println!("{n} binding(s) added");
    Ok(())
}

/// The filters of a remove or list: one per resource (none named: every resource)
/// and principal (none named: any).
fn filters(s: &Selection, default_pattern: i8) -> Res<Vec<DeleteAclsFilter>> {
    let pt = pattern_code(s.pattern.as_deref(), default_pattern)?;
    let mut res: Vec<(i8, Option<String>)> = resources(s)
        .into_iter()
        .map(|(t, n)| (t, Some(n)))
        .collect();
    if res.is_empty() {
        res.push((resource::ANY, None));
    }
    let mut principals: Vec<(i8, Option<String>)> = s
        .allow_principals
        .iter()
        .map(|p| (permission::ALLOW, Some(p.clone())))
        .chain(
            s.deny_principals
                .iter()
                .map(|p| (permission::DENY, Some(p.clone()))),
        )
        .collect();
    for (_, p) in &principals {
        check_principal(p.as_deref().unwrap_or_default())?;
    }
    if principals.is_empty() {
        principals.push((permission::ANY, None));
    }
    let mut ops = operations(&s.operations)?;
    if ops.is_empty() {
        ops.push(op::ANY);
    }
    let hosts: Vec<Option<String>> = if s.hosts.is_empty() {
        vec![None]
    } else {
        s.hosts.iter().cloned().map(Some).collect()
    };
    let mut out = Vec::new();
    for (rt, name) in &res {
        for (perm, p) in &principals {
            for h in &hosts {
                for o in &ops {
                    out.push(
                        DeleteAclsFilter::default()
                            .with_resource_type_filter(*rt)
                            .with_resource_name_filter(name.as_deref().map(sbs))
                            .with_pattern_type_filter(if name.is_none() {
                                pattern::ANY
                            } else {
                                pt
                            })
                            .with_principal_filter(p.as_deref().map(sbs))
                            .with_host_filter(h.as_deref().map(sbs))
                            .with_operation(*o)
                            .with_permission_type(*perm),
                    );
                }
            }
        }
    }
    Ok(out)
}

/// Deletes the bindings the selection matches (its pattern type: literal unless given).
pub fn remove(bootstrap: &str, s: &Selection) -> Res<()> {
    let filters = filters(s, pattern::LITERAL)?;
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let r = c.call(3, &DeleteAclsRequest::default().with_filters(filters))?;
    let mut n = 0;
    for f in r.filter_results {
        if f.error_code != 0 {
            return Err(refused(f.error_code, f.error_message.as_ref()));
        }
        for a in f.matching_acls {
            n += 1;
            println!(
                "removed {}",
                line(
                    a.resource_type,
                    &a.resource_name,
                    a.pattern_type,
                    &a.principal,
                    &a.host,
                    a.operation,
                    a.permission_type
                )
            );
        }
    }
    println!("{n} binding(s) removed");
    Ok(())
}

/// Lists the bindings the selection matches (pattern type: any unless given; `match`
/// lists every binding that applies to the named resource).
pub fn list(bootstrap: &str, s: &Selection) -> Res<()> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let mut seen = std::collections::BTreeSet::new();
    for f in filters(s, pattern::ANY)? {
        let req = DescribeAclsRequest::default()
            .with_resource_type_filter(f.resource_type_filter)
            .with_resource_name_filter(f.resource_name_filter)
            .with_pattern_type_filter(f.pattern_type_filter)
            .with_principal_filter(f.principal_filter)
            .with_host_filter(f.host_filter)
            .with_operation(f.operation)
            .with_permission_type(f.permission_type);
        let r = c.call(3, &req)?;
        if r.error_code != 0 {
            return Err(refused(r.error_code, r.error_message.as_ref()));
        }
        for res in r.resources {
            for a in res.acls {
                seen.insert(line(
                    res.resource_type,
                    &res.resource_name,
                    res.pattern_type,
                    &a.principal,
                    &a.host,
                    a.operation,
                    a.permission_type,
                ));
            }
        }
    }
    println!("RESOURCE  PATTERN  PRINCIPAL  HOST  OPERATION  PERMISSION");
    for l in seen {
        println!("{l}");
    }
    Ok(())
}

fn line(
    rt: i8,
    name: &str,
    pt: i8,
    principal: &str,
    host: &str,
    operation: i8,
    perm: i8,
) -> String {
    let kind = match rt {
        resource::TOPIC => "topic",
        resource::GROUP => "group",
        resource::CLUSTER => "cluster",
        resource::TRANSACTIONAL_ID => "transactional-id",
        resource::DELEGATION_TOKEN => "delegation-token",
        resource::USER => "user",
        _ => "unknown",
    };
    let pattern = match pt {
        pattern::PREFIXED => "PREFIXED",
        _ => "LITERAL",
    };
    let permission = if perm == permission::DENY {
        "DENY"
    } else {
        "ALLOW"
    };
    let operation = sluice::serve::authz::operation_name(operation);
    format!("{kind}:{name}  {pattern}  {principal}  {host}  {operation}  {permission}")
}
