//! Authorized operations (KIP-430): the bit sets Metadata, DescribeCluster and
//! DescribeGroups return when a client asks which operations it may perform.
//!
//! Kafka sets bit `code` for each allowed `AclOperation` (READ = 3, WRITE = 4, CREATE =
//! 5, DELETE = 6, ALTER = 7, DESCRIBE = 8, CLUSTER_ACTION = 9, DESCRIBE_CONFIGS = 10,
//! ALTER_CONFIGS = 11, IDEMPOTENT_WRITE = 12). Without an authorizer every operation
//! that applies to the resource type is allowed; Sluice has no authorizer yet, so these
//! are the full sets. Once ACLs exist, the principal's allowed subset goes here.
//! A client that did not ask gets [`NOT_PROVIDED`] (the schema default).

/// Kafka's `AclOperation` codes used below.
mod op {
    pub const READ: u8 = 3;
    pub const WRITE: u8 = 4;
    pub const CREATE: u8 = 5;
    pub const DELETE: u8 = 6;
    pub const ALTER: u8 = 7;
    pub const DESCRIBE: u8 = 8;
    pub const CLUSTER_ACTION: u8 = 9;
    pub const DESCRIBE_CONFIGS: u8 = 10;
    pub const ALTER_CONFIGS: u8 = 11;
    pub const IDEMPOTENT_WRITE: u8 = 12;
}

/// "Not provided": what a response carries when the client did not ask.
pub const NOT_PROVIDED: i32 = i32::MIN;

/// The bit field of a set of operation codes.
const fn bits(ops: &[u8]) -> i32 {
    let mut out = 0i32;
    let mut i = 0;
    while i < ops.len() {
        out |= 1 << ops[i];
        i += 1;
    }
    out
}

/// Every operation that applies to a topic.
pub const TOPIC_ALL: i32 = bits(&[
    op::READ,
    op::WRITE,
    op::CREATE,
    op::DELETE,
    op::ALTER,
    op::DESCRIBE,
    op::DESCRIBE_CONFIGS,
    op::ALTER_CONFIGS,
]);

/// Every operation that applies to a consumer group.
pub const GROUP_ALL: i32 = bits(&[op::READ, op::DESCRIBE, op::DELETE]);

/// Every operation that applies to the cluster.
pub const CLUSTER_ALL: i32 = bits(&[
    op::CREATE,
    op::ALTER,
    op::DESCRIBE,
    op::CLUSTER_ACTION,
    op::DESCRIBE_CONFIGS,
    op::ALTER_CONFIGS,
    op::IDEMPOTENT_WRITE,
]);

/// The field's value: the full set if the client asked, else "not provided".
pub fn when_asked(asked: bool, all: i32) -> i32 {
    if asked {
        all
    } else {
        NOT_PROVIDED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values Kafka 3.9 returns without an authorizer (as its admin client decodes
    /// them back into operation sets).
    #[test]
    fn full_sets_match_kafka() {
        assert_eq!(TOPIC_ALL, 3576);
        assert_eq!(GROUP_ALL, 328);
        assert_eq!(CLUSTER_ALL, 8096);
        assert_eq!(when_asked(false, TOPIC_ALL), -2147483648);
        assert_eq!(when_asked(true, GROUP_ALL), GROUP_ALL);
    }
}
