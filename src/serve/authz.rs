//! Who a connection speaks for, and what it may do (Kafka's ACL authorizer,
//! `--authorizer`).
//!
//! A connection's [`Caller`] is fixed when it starts: the principal `User:<name>` of
//! its SASL login, else `User:<subject>` of its TLS client certificate (the subject as
//! an RFC 2253 string, `CN=alice,OU=eng,O=acme`, Kafka's default mapping), else
//! `User:ANONYMOUS`; and the address it connects from. Handlers ask [`Caller::may`]
//! before they act on a resource; the decision is the metadata image's ACL index's
//! (`sluice_replication::acl`), under the broker's [`AuthorizerConfig`]. Without
//! `--authorizer` everything is allowed and nothing is looked up.
//!
//! Refusals are logged on the `sluice::audit` target at INFO (principal, address,
//! operation, resource), except where a refusal only hides a resource from a listing
//! (Metadata of all topics, ListGroups): Kafka logs those at DEBUG too.

use std::net::IpAddr;
use std::rc::Rc;

use sluice_replication::acl::{self, Requester};

use crate::partition::broker::Broker;

pub use sluice_replication::acl::{op, resource};

/// The principal of a connection without a login or client certificate.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// The client a request comes from.
#[derive(Debug, Clone)]
pub struct Caller {
    /// `User:<name>`.
    pub principal: Rc<str>,
    /// The client's address (DescribeGroups' client host; ACL host matching).
    pub peer: Option<IpAddr>,
    /// The listener the client connected through (its name chooses the endpoints
    /// Metadata answers with); empty for the broker's own calls.
    pub listener: Rc<str>,
    /// Whether that listener is SASL (the client logged in).
    pub sasl: bool,
    host: Rc<str>,
    /// Until when the connection reads no request (a quota's throttle).
    muted_until: std::cell::Cell<Option<std::time::Instant>>,
    /// The shard's time polling this connection's request handlers, not yet counted
    /// against a request_percentage quota.
    busy: std::cell::Cell<std::time::Duration>,
}

impl Caller {
    pub fn new(principal: impl Into<Rc<str>>, peer: Option<IpAddr>) -> Caller {
        Caller {
            principal: principal.into(),
            peer,
            listener: Rc::from(""),
            sasl: false,
            host: peer.map(java_host).unwrap_or_default().into(),
            muted_until: std::cell::Cell::new(None),
            busy: std::cell::Cell::new(std::time::Duration::ZERO),
        }
    }

    /// A SASL login's principal.
    pub fn user(name: &str, peer: Option<IpAddr>) -> Caller {
        Caller::new(format!("User:{name}"), peer)
    }

    pub fn anonymous(peer: Option<IpAddr>) -> Caller {
        Caller::new(ANONYMOUS, peer)
    }

    /// The caller connected through listener `name` (`sasl`: one that is SASL).
    pub fn on_listener(self, name: Rc<str>, sasl: bool) -> Caller {
        Caller {
            listener: name,
            sasl,
            ..self
        }
    }

    /// Mutes the connection for `ms` (a quota's throttle; the longer of two stands).
    pub fn mute_for(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
        if self.muted_until.get().is_none_or(|u| u < until) {
            self.muted_until.set(Some(until));
        }
    }

    /// Adds time the shard spent on this connection's requests.
    pub fn add_busy(&self, d: std::time::Duration) {
        self.busy.set(self.busy.get() + d);
    }

    /// The time spent since the last call.
    pub fn take_busy(&self) -> std::time::Duration {
        self.busy.replace(std::time::Duration::ZERO)
    }

    /// Until when the connection is muted, if it is.
    pub fn muted_until(&self) -> Option<std::time::Instant> {
        self.muted_until
            .get()
            .filter(|u| *u > std::time::Instant::now())
    }

    fn decide(&self, broker: &Broker, operation: i8, resource_type: i8, name: &str) -> bool {
        let Some(config) = &broker.config.authorizer else {
            return true;
        };
        broker
            .image()
            .acls
            .authorize(config, &self.requester(), operation, resource_type, name)
    }

    fn requester(&self) -> Requester<'_> {
        Requester {
            principal: &self.principal,
            host: &self.host,
        }
    }

    /// May this caller perform `operation` on the resource? A refusal is an audit line.
    pub fn may(&self, broker: &Broker, operation: i8, resource_type: i8, name: &str) -> bool {
        let allowed = self.decide(broker, operation, resource_type, name);
        if !allowed {
            tracing::info!(
                target: "sluice::audit",
                principal = &*self.principal,
                host = &*self.host,
                operation = operation_name(operation),
                resource = resource_name(resource_type),
                name,
                "denied"
            );
        }
        allowed
    }

    /// [`Self::may`] for a listing that merely leaves the resource out (logged at
    /// DEBUG).
    pub fn may_see(&self, broker: &Broker, operation: i8, resource_type: i8, name: &str) -> bool {
        let allowed = self.decide(broker, operation, resource_type, name);
        if !allowed {
            tracing::debug!(target: "sluice::audit", principal = &*self.principal, operation = operation_name(operation), resource = resource_name(resource_type), name, "hidden");
        }
        allowed
    }

    /// [`Self::may`] on the cluster resource.
    pub fn may_cluster(&self, broker: &Broker, operation: i8) -> bool {
        self.may(broker, operation, resource::CLUSTER, acl::CLUSTER_NAME)
    }

    /// [`Self::may_cluster`] where a refusal is not itself an answer (another check
    /// follows, as Kafka's `logIfDenied = false`): logged at DEBUG.
    pub fn may_cluster_quietly(&self, broker: &Broker, operation: i8) -> bool {
        self.may_see(broker, operation, resource::CLUSTER, acl::CLUSTER_NAME)
    }

    /// May this caller perform `operation` on some resource of the type (Kafka's
    /// `authorizeByResourceType`, e.g. WRITE on any topic for an idempotent producer)?
    pub fn may_any(&self, broker: &Broker, operation: i8, resource_type: i8) -> bool {
        let Some(config) = &broker.config.authorizer else {
            return true;
        };
        let allowed =
            broker
                .image()
                .acls
                .authorize_any(config, &self.requester(), operation, resource_type);
        if !allowed {
            tracing::info!(target: "sluice::audit", principal = &*self.principal, host = &*self.host, operation = operation_name(operation), resource = resource_name(resource_type), "denied on every resource of the type");
        }
        allowed
    }

    /// The KIP-430 bit set of the operations in `ops` this caller may perform on the
    /// resource (every one without an authorizer).
    pub fn allowed_ops(&self, broker: &Broker, ops: &[i8], resource_type: i8, name: &str) -> i32 {
        ops.iter()
            .filter(|o| self.decide(broker, **o, resource_type, name))
            .fold(0, |bits, o| bits | 1 << o)
    }
}

/// A client address as ACL hosts name it (Java's `InetAddress.getHostAddress()`): an
/// IPv4-mapped IPv6 address as IPv4, IPv6 as eight groups of hex without compression
/// (`0:0:0:0:0:0:0:1`).
pub fn java_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => a
                .segments()
                .iter()
                .map(|s| format!("{s:x}"))
                .collect::<Vec<_>>()
                .join(":"),
        },
    }
}

/// Kafka's name of an operation code.
pub fn operation_name(code: i8) -> &'static str {
    match code {
        op::ANY => "ANY",
        op::ALL => "ALL",
        op::READ => "READ",
        op::WRITE => "WRITE",
        op::CREATE => "CREATE",
        op::DELETE => "DELETE",
        op::ALTER => "ALTER",
        op::DESCRIBE => "DESCRIBE",
        op::CLUSTER_ACTION => "CLUSTER_ACTION",
        op::DESCRIBE_CONFIGS => "DESCRIBE_CONFIGS",
        op::ALTER_CONFIGS => "ALTER_CONFIGS",
        op::IDEMPOTENT_WRITE => "IDEMPOTENT_WRITE",
        op::CREATE_TOKENS => "CREATE_TOKENS",
        op::DESCRIBE_TOKENS => "DESCRIBE_TOKENS",
        _ => "UNKNOWN",
    }
}

/// Kafka's name of a resource type code.
pub fn resource_name(code: i8) -> &'static str {
    match code {
        resource::ANY => "ANY",
        resource::TOPIC => "TOPIC",
        resource::GROUP => "GROUP",
        resource::CLUSTER => "CLUSTER",
        resource::TRANSACTIONAL_ID => "TRANSACTIONAL_ID",
        resource::DELEGATION_TOKEN => "DELEGATION_TOKEN",
        resource::USER => "USER",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_spelled_as_java_spells_them() {
        assert_eq!(java_host("10.0.0.5".parse().unwrap()), "10.0.0.5");
        assert_eq!(java_host("::ffff:10.0.0.5".parse().unwrap()), "10.0.0.5");
        assert_eq!(java_host("::1".parse().unwrap()), "0:0:0:0:0:0:0:1");
        assert_eq!(
            java_host("fe80::1:abcd".parse().unwrap()),
            "fe80:0:0:0:0:0:1:abcd"
        );
    }
}
