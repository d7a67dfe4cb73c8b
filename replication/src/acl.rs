//! Kafka ACLs: the bindings the metadata quorum stores ([`crate::cluster::ClusterState::acls`]),
//! the filters CreateAcls/DescribeAcls/DeleteAcls carry, and the decision an authorizer
//! makes from them ([`AclIndex::authorize`]), with Kafka's codes and rules:
//!
//! - A binding names a resource (type, name, LITERAL or PREFIXED pattern), a principal
//!   (`User:alice`, `User:*` for everyone), a host (an address or `*`), an operation
//!   and ALLOW or DENY. A LITERAL name `*` matches every resource of its type.
//! - A request for operation `op` on a resource by a principal from a host is decided
//!   by the bindings that match all three: any DENY of `op` (or of ALL) refuses it; else
//!   any ALLOW of `op`, ALL, or an operation that implies `op` (DESCRIBE is implied by
//!   READ, WRITE, DELETE and ALTER; DESCRIBE_CONFIGS by ALTER_CONFIGS) permits it; else it
//!   is refused — unless no binding at all names the resource (of any principal), when
//!   `allow.everyone.if.no.acl.found` decides. Super users are allowed before any of it.
//!
//! Everything here is pure; the broker holds one [`AclIndex`] per metadata image.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

/// Kafka's `ResourceType` codes.
pub mod resource {
    pub const ANY: i8 = 1;
    pub const TOPIC: i8 = 2;
    pub const GROUP: i8 = 3;
    pub const CLUSTER: i8 = 4;
    pub const TRANSACTIONAL_ID: i8 = 5;
    pub const DELEGATION_TOKEN: i8 = 6;
    pub const USER: i8 = 7;
}

/// Kafka's `PatternType` codes.
pub mod pattern {
    pub const ANY: i8 = 1;
    pub const MATCH: i8 = 2;
    pub const LITERAL: i8 = 3;
    pub const PREFIXED: i8 = 4;
}

/// Kafka's `AclOperation` codes.
pub mod op {
    pub const ANY: i8 = 1;
    pub const ALL: i8 = 2;
    pub const READ: i8 = 3;
    pub const WRITE: i8 = 4;
    pub const CREATE: i8 = 5;
    pub const DELETE: i8 = 6;
    pub const ALTER: i8 = 7;
    pub const DESCRIBE: i8 = 8;
    pub const CLUSTER_ACTION: i8 = 9;
    pub const DESCRIBE_CONFIGS: i8 = 10;
    pub const ALTER_CONFIGS: i8 = 11;
    pub const IDEMPOTENT_WRITE: i8 = 12;
    pub const CREATE_TOKENS: i8 = 13;
    pub const DESCRIBE_TOKENS: i8 = 14;
}

/// Kafka's `AclPermissionType` codes.
pub mod permission {
    pub const ANY: i8 = 1;
    pub const DENY: i8 = 2;
    pub const ALLOW: i8 = 3;
}

/// The one cluster resource's name.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// A LITERAL resource name, principal or host that matches every one.
pub const WILDCARD: &str = "*";
/// The principal of everyone (`User:*`).
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// One ACL binding, as stored.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Acl {
    pub resource_type: i8,
    pub resource_name: String,
    pub pattern_type: i8,
    pub principal: String,
    pub host: String,
    pub operation: i8,
    pub permission: i8,
}

/// A DescribeAcls/DeleteAcls filter: `None` fields and the ANY codes match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: i8,
    pub resource_name: Option<String>,
    pub pattern_type: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission: i8,
}

/// Why a binding or filter is refused (Kafka answers INVALID_REQUEST with the text).
pub type Invalid = String;

/// The operations that apply to a resource type (Kafka's `AclEntry.supportedOperations`).
pub fn operations_of(resource_type: i8) -> &'static [i8] {
    use op::*;
    match resource_type {
        resource::TOPIC => &[
            READ,
            WRITE,
            CREATE,
            DESCRIBE,
            DELETE,
            ALTER,
            DESCRIBE_CONFIGS,
            ALTER_CONFIGS,
        ],
        resource::GROUP => &[READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS],
        resource::CLUSTER => &[
            CREATE,
            CLUSTER_ACTION,
            DESCRIBE_CONFIGS,
            ALTER_CONFIGS,
            IDEMPOTENT_WRITE,
            ALTER,
            DESCRIBE,
        ],
        resource::TRANSACTIONAL_ID => &[DESCRIBE, WRITE],
        resource::DELEGATION_TOKEN => &[DESCRIBE],
        resource::USER => &[CREATE_TOKENS, DESCRIBE_TOKENS],
        _ => &[],
    }
}

/// Splits `Type:name` (the principal's type must be non-empty; the name may hold `:`).
pub fn parse_principal(p: &str) -> Option<(&str, &str)> {
    let (kind, name) = p.split_once(':')?;
    (!kind.is_empty()).then_some((kind, name))
}

impl Acl {
    /// Kafka's checks of a binding before it is created.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(resource::TOPIC..=resource::USER).contains(&self.resource_type) {
            return Err(format!("invalid resource type {}", self.resource_type));
        }
        if !matches!(self.pattern_type, pattern::LITERAL | pattern::PREFIXED) {
            return Err(format!(
                "invalid pattern type {}: only LITERAL and PREFIXED bindings can be created",
                self.pattern_type
            ));
        }
        if !(op::ALL..=op::DESCRIBE_TOKENS).contains(&self.operation) {
            return Err(format!("invalid operation {}", self.operation));
        }
        if !matches!(self.permission, permission::ALLOW | permission::DENY) {
            return Err(format!("invalid permission type {}", self.permission));
        }
        if self.resource_name.is_empty() {
            return Err("the resource name is empty".into());
        }
        if self.resource_type == resource::CLUSTER && self.resource_name != CLUSTER_NAME {
            return Err(format!(
                "the only valid name for the CLUSTER resource is {CLUSTER_NAME}"
            ));
        }
        if self.pattern_type == pattern::PREFIXED && self.resource_name == WILDCARD {
            return Err("a PREFIXED binding cannot name the wildcard '*'".into());
        }
        if parse_principal(&self.principal).is_none() {
            return Err(format!(
                "could not parse principal {:?}: expected Type:name, e.g. User:alice",
                self.principal
            ));
        }
        if self.host.is_empty() {
            return Err("the host is empty ('*' is every host)".into());
        }
        if self.operation != op::ALL && !operations_of(self.resource_type).contains(&self.operation)
        {
            return Err(format!(
                "operation {} does not apply to resource type {}",
                self.operation, self.resource_type
            ));
        }
        Ok(())
    }
}

impl AclFilter {
    /// The filter that matches every binding.
    pub fn any() -> AclFilter {
        AclFilter {
            resource_type: resource::ANY,
            resource_name: None,
            pattern_type: pattern::ANY,
            principal: None,
            host: None,
            operation: op::ANY,
            permission: permission::ANY,
        }
    }

    /// Kafka's checks of a filter (codes it does not know, MATCH without a name).
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(resource::ANY..=resource::USER).contains(&self.resource_type) {
            return Err(format!("invalid resource type {}", self.resource_type));
        }
        if !(pattern::ANY..=pattern::PREFIXED).contains(&self.pattern_type) {
            return Err(format!("invalid pattern type {}", self.pattern_type));
        }
        if !(op::ANY..=op::DESCRIBE_TOKENS).contains(&self.operation) {
            return Err(format!("invalid operation {}", self.operation));
        }
        if !(permission::ANY..=permission::ALLOW).contains(&self.permission) {
            return Err(format!("invalid permission type {}", self.permission));
        }
        Ok(())
    }

    /// True if `acl` is one this filter selects. A MATCH pattern selects the bindings
    /// that would apply to the named resource: its literal name, the wildcard, and
    /// every prefix of it.
    pub fn matches(&self, acl: &Acl) -> bool {
        let kind = self.resource_type == resource::ANY || self.resource_type == acl.resource_type;
        let name = match (&self.resource_name, self.pattern_type) {
            (None, pattern::MATCH) | (None, pattern::ANY) => true,
            (None, p) => p == acl.pattern_type,
            (Some(n), pattern::ANY) => *n == acl.resource_name,
            (Some(n), pattern::MATCH) => match acl.pattern_type {
                pattern::LITERAL => acl.resource_name == *n || acl.resource_name == WILDCARD,
                pattern::PREFIXED => n.starts_with(&acl.resource_name),
                _ => false,
            },
            (Some(n), p) => p == acl.pattern_type && *n == acl.resource_name,
        };
        let principal = self.principal.as_ref().is_none_or(|p| *p == acl.principal);
        let host = self.host.as_ref().is_none_or(|h| *h == acl.host);
        let operation = self.operation == op::ANY || self.operation == acl.operation;
        let permission = self.permission == permission::ANY || self.permission == acl.permission;
        kind && name && principal && host && operation && permission
    }
}

/// Bindings by resource type, then resource name.
type ByName = BTreeMap<i8, BTreeMap<String, Vec<Acl>>>;

/// The bindings of one image, indexed by resource type and name for the authorizer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AclIndex {
    literal: ByName,
    prefixed: ByName,
    len: usize,
}

/// The authorizer's settings (Kafka's `super.users` and `allow.everyone.if.no.acl.found`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuthorizerConfig {
    pub super_users: Vec<String>,
    pub allow_if_no_acl: bool,
}

/// Who asks: the principal (`User:alice`) and the address it connects from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester<'a> {
    pub principal: &'a str,
    pub host: &'a str,
}

impl AclIndex {
    pub fn new<'a>(acls: impl IntoIterator<Item = &'a Acl>) -> AclIndex {
        let mut index = AclIndex::default();
        for a in acls {
            let map = if a.pattern_type == pattern::PREFIXED {
                &mut index.prefixed
            } else {
                &mut index.literal
            };
            map.entry(a.resource_type)
                .or_default()
                .entry(a.resource_name.clone())
                .or_default()
                .push(a.clone());
            index.len += 1;
        }
        index
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every binding (literal ones first).
    pub fn bindings(&self) -> impl Iterator<Item = &Acl> {
        [&self.literal, &self.prefixed]
            .into_iter()
            .flat_map(|m| m.values().flat_map(|names| names.values().flatten()))
    }

    /// Every binding that applies to the resource `(resource_type, name)`, of any
    /// principal: its literal name, the literal wildcard, and each prefix of it.
    fn applying<'s>(&'s self, resource_type: i8, name: &'s str) -> impl Iterator<Item = &'s Acl> {
        let literal = self.literal.get(&resource_type);
        let prefixed = self.prefixed.get(&resource_type);
        let wildcard = (name != WILDCARD).then_some(WILDCARD);
        let names = std::iter::once(name).chain(wildcard);
        let literal = names.filter_map(move |n| literal?.get(n)).flatten();
        let prefixes = name
            .char_indices()
            .map(move |(i, c)| &name[..i + c.len_utf8()])
            .filter_map(move |p| prefixed?.get(p))
            .flatten();
        literal.chain(prefixes)
    }

    /// Kafka's decision for `who` performing `operation` on `(resource_type, name)`.
    pub fn authorize(
        &self,
        config: &AuthorizerConfig,
        who: &Requester<'_>,
        operation: i8,
        resource_type: i8,
        name: &str,
    ) -> bool {
        if config.super_users.iter().any(|s| s == who.principal) {
            return true;
        }
        let mut any = false;
        let mut allowed = false;
        for a in self.applying(resource_type, name) {
            any = true;
            let principal = a.principal == who.principal || a.principal == WILDCARD_PRINCIPAL;
            let host = a.host == WILDCARD || a.host == who.host;
            if !principal || !host {
                continue;
            }
            match a.permission {
                permission::DENY if a.operation == operation || a.operation == op::ALL => {
                    return false
                }
                permission::ALLOW if implies(a.operation, operation) => allowed = true,
                _ => {}
            }
        }
        allowed || (!any && config.allow_if_no_acl)
    }

    /// True if `who` may perform `operation` on some resource of `resource_type`
    /// (Kafka's `authorizeByResourceType`, e.g. WRITE on any topic for an idempotent
    /// producer): allowed on an arbitrary name (super users, the no-ACL fallback, a
    /// wildcard ALLOW), else an ALLOW of the operation or of ALL, literal or prefixed,
    /// that no DENY dominates (a literal DENY of the same name, or a prefixed DENY of a
    /// prefix of it; a literal wildcard DENY refuses everything).
    pub fn authorize_any(
        &self,
        config: &AuthorizerConfig,
        who: &Requester<'_>,
        operation: i8,
        resource_type: i8,
    ) -> bool {
        if self.authorize(config, who, operation, resource_type, "hardcode") {
            return true;
        }
        let mine = |a: &&Acl| {
            (a.principal == who.principal || a.principal == WILDCARD_PRINCIPAL)
                && (a.host == WILDCARD || a.host == who.host)
                && (a.operation == operation || a.operation == op::ALL)
        };
        let of_type = |map: &'_ ByName| -> Vec<Acl> {
            map.get(&resource_type)
                .into_iter()
                .flat_map(|names| names.values().flatten())
                .filter(mine)
                .cloned()
                .collect()
        };
        let acls: Vec<Acl> = of_type(&self.literal)
            .into_iter()
            .chain(of_type(&self.prefixed))
            .collect();
        let denies = |pt: i8, name: &str| {
            acls.iter().any(|d| {
                d.permission == permission::DENY && d.pattern_type == pt && d.resource_name == name
            })
        };
        if denies(pattern::LITERAL, WILDCARD) {
            return false;
        }
        let allows = acls.iter().filter(|a| a.permission == permission::ALLOW);
        for a in allows {
            if a.pattern_type == pattern::LITERAL && a.resource_name == WILDCARD {
                return true;
            }
        }
        acls.iter()
            .filter(|a| a.permission == permission::ALLOW)
            .any(|a| {
                let literal_denied = a.pattern_type == pattern::LITERAL
                    && denies(pattern::LITERAL, &a.resource_name);
                let prefix_denied = a
                    .resource_name
                    .char_indices()
                    .map(|(i, c)| &a.resource_name[..i + c.len_utf8()])
                    .any(|p| denies(pattern::PREFIXED, p));
                !literal_denied && !prefix_denied
            })
    }
}

/// True if an ALLOW of `granted` permits `asked` (ALL permits everything; DESCRIBE
/// follows from READ, WRITE, DELETE and ALTER; DESCRIBE_CONFIGS from ALTER_CONFIGS).
pub fn implies(granted: i8, asked: i8) -> bool {
    granted == asked
        || granted == op::ALL
        || (asked == op::DESCRIBE
            && matches!(granted, op::READ | op::WRITE | op::DELETE | op::ALTER))
        || (asked == op::DESCRIBE_CONFIGS && granted == op::ALTER_CONFIGS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(rt: i8, name: &str, pt: i8, principal: &str, operation: i8, perm: i8) -> Acl {
        Acl {
            resource_type: rt,
            resource_name: name.into(),
            pattern_type: pt,
            principal: principal.into(),
            host: "*".into(),
            operation,
            permission: perm,
        }
    }

    const ALICE: Requester<'static> = Requester {
        principal: "User:alice",
        host: "127.0.0.1",
    };

    fn strict() -> AuthorizerConfig {
        AuthorizerConfig {
            super_users: vec!["User:admin".into()],
            allow_if_no_acl: false,
        }
    }

    #[test]
    fn literal_prefixed_and_wildcard_bindings_apply_to_their_resources() {
        use resource::TOPIC;
        let acls = [
            acl(
                TOPIC,
                "a",
                pattern::LITERAL,
                "User:alice",
                op::READ,
                permission::ALLOW,
            ),
            acl(
                TOPIC,
                "logs-",
                pattern::PREFIXED,
                "User:alice",
                op::WRITE,
                permission::ALLOW,
            ),
            acl(
                TOPIC,
                "*",
                pattern::LITERAL,
                "User:*",
                op::DESCRIBE,
                permission::ALLOW,
            ),
        ];
        let ix = AclIndex::new(&acls);
        let c = strict();
        assert!(ix.authorize(&c, &ALICE, op::READ, TOPIC, "a"));
        assert!(!ix.authorize(&c, &ALICE, op::WRITE, TOPIC, "a"));
        assert!(!ix.authorize(&c, &ALICE, op::READ, TOPIC, "b"));
        assert!(
            ix.authorize(&c, &ALICE, op::DESCRIBE, TOPIC, "b"),
            "wildcard"
        );
        assert!(ix.authorize(&c, &ALICE, op::WRITE, TOPIC, "logs-app"));
        assert!(!ix.authorize(&c, &ALICE, op::WRITE, TOPIC, "logs"));
        assert!(
            ix.authorize(&c, &ALICE, op::DESCRIBE, TOPIC, "logs-app"),
            "WRITE implies DESCRIBE"
        );
        assert!(
            !ix.authorize(&c, &ALICE, op::READ, resource::GROUP, "a"),
            "another type"
        );
        let bob = Requester {
            principal: "User:bob",
            host: "127.0.0.1",
        };
        assert!(!ix.authorize(&c, &bob, op::READ, TOPIC, "a"));
        let admin = Requester {
            principal: "User:admin",
            host: "10.0.0.1",
        };
        assert!(
            ix.authorize(&c, &admin, op::DELETE, TOPIC, "anything"),
            "super user"
        );
    }

    #[test]
    fn deny_beats_allow_and_only_its_own_operation() {
        use resource::TOPIC;
        let acls = [
            acl(
                TOPIC,
                "*",
                pattern::LITERAL,
                "User:*",
                op::ALL,
                permission::ALLOW,
            ),
            acl(
                TOPIC,
                "secret",
                pattern::PREFIXED,
                "User:alice",
                op::READ,
                permission::DENY,
            ),
        ];
        let ix = AclIndex::new(&acls);
        let c = strict();
        assert!(!ix.authorize(&c, &ALICE, op::READ, TOPIC, "secret-1"));
        assert!(
            ix.authorize(&c, &ALICE, op::DESCRIBE, TOPIC, "secret-1"),
            "DENY READ leaves DESCRIBE"
        );
        assert!(ix.authorize(&c, &ALICE, op::READ, TOPIC, "public"));
    }

    #[test]
    fn hosts_are_matched_and_no_binding_falls_back_to_the_setting() {
        use resource::GROUP;
        let mut only_local = acl(
            GROUP,
            "g",
            pattern::LITERAL,
            "User:alice",
            op::READ,
            permission::ALLOW,
        );
        only_local.host = "127.0.0.1".into();
        let ix = AclIndex::new([&only_local]);
        let open = AuthorizerConfig {
            super_users: vec![],
            allow_if_no_acl: true,
        };
        assert!(ix.authorize(&strict(), &ALICE, op::READ, GROUP, "g"));
        let far = Requester {
            principal: "User:alice",
            host: "10.1.1.1",
        };
        assert!(
            !ix.authorize(&open, &far, op::READ, GROUP, "g"),
            "a binding exists: no fallback"
        );
        assert!(
            ix.authorize(&open, &far, op::READ, GROUP, "other"),
            "no binding: allowed"
        );
        assert!(!ix.authorize(&strict(), &far, op::READ, GROUP, "other"));
    }

    #[test]
    fn allow_on_any_resource_of_a_type() {
        use resource::TOPIC;
        let ix = AclIndex::new(&[acl(
            TOPIC,
            "t-",
            pattern::PREFIXED,
            "User:alice",
            op::WRITE,
            permission::ALLOW,
        )]);
        assert!(ix.authorize_any(&strict(), &ALICE, op::WRITE, TOPIC));
        assert!(!ix.authorize_any(&strict(), &ALICE, op::READ, TOPIC));
        let denied = AclIndex::new(&[
            acl(
                TOPIC,
                "t-",
                pattern::PREFIXED,
                "User:alice",
                op::WRITE,
                permission::ALLOW,
            ),
            acl(
                TOPIC,
                "t",
                pattern::PREFIXED,
                "User:alice",
                op::WRITE,
                permission::DENY,
            ),
        ]);
        assert!(!denied.authorize_any(&strict(), &ALICE, op::WRITE, TOPIC));
    }

    #[test]
    fn filters_select_as_kafka_does() {
        use resource::TOPIC;
        let lit = acl(
            TOPIC,
            "orders",
            pattern::LITERAL,
            "User:alice",
            op::READ,
            permission::ALLOW,
        );
        let pre = acl(
            TOPIC,
            "ord",
            pattern::PREFIXED,
            "User:bob",
            op::WRITE,
            permission::DENY,
        );
        let wild = acl(
            TOPIC,
            "*",
            pattern::LITERAL,
            "User:*",
            op::DESCRIBE,
            permission::ALLOW,
        );
        let f = |name: Option<&str>, pt: i8| AclFilter {
            resource_name: name.map(str::to_string),
            pattern_type: pt,
            ..AclFilter::any()
        };
        let matched = |f: &AclFilter| [&lit, &pre, &wild].iter().filter(|a| f.matches(a)).count();
        assert_eq!(matched(&AclFilter::any()), 3);
        assert_eq!(matched(&f(Some("orders"), pattern::MATCH)), 3);
        assert_eq!(matched(&f(Some("orders"), pattern::ANY)), 1);
        assert_eq!(matched(&f(Some("ord"), pattern::PREFIXED)), 1);
        assert_eq!(matched(&f(None, pattern::PREFIXED)), 1);
        let mut by_principal = AclFilter::any();
        by_principal.principal = Some("User:bob".into());
        assert_eq!(matched(&by_principal), 1);
        let mut by_type = AclFilter::any();
        by_type.resource_type = resource::GROUP;
        assert_eq!(matched(&by_type), 0);
    }

    #[test]
    fn bindings_are_validated() {
        use resource::*;
        let ok = acl(
            TOPIC,
            "a",
            pattern::LITERAL,
            "User:alice",
            op::READ,
            permission::ALLOW,
        );
        assert!(ok.validate().is_ok());
        let bad = |f: &dyn Fn(&mut Acl)| {
            let mut a = ok.clone();
            f(&mut a);
            a.validate().unwrap_err()
        };
        assert!(bad(&|a| a.pattern_type = pattern::MATCH).contains("pattern"));
        assert!(bad(&|a| a.principal = "alice".into()).contains("principal"));
        assert!(bad(&|a| a.resource_type = CLUSTER).contains("kafka-cluster"));
        assert!(bad(&|a| a.operation = op::CLUSTER_ACTION).contains("does not apply"));
        assert!(bad(&|a| a.permission = permission::ANY).contains("permission"));
        assert!(bad(&|a| a.host = String::new()).contains("host"));
    }
}
