//! `fault::set_rules` replaces every armed rule (an empty list disarms): process-wide,
//! so it has this test binary to itself (the fault tier in `fault.rs` runs its tests
//! in parallel and arms rules per test with `fault::arm`).

use std::path::Path;

use sluice_storage::fault::{self, FaultOp, FaultRule};

#[test]
fn set_rules_replaces_all_and_an_empty_list_disarms() {
    let rules = fault::parse_rules("write eio /a/\nsync enospc /b/\n").unwrap();
    fault::set_rules(rules.clone());
    assert_eq!(fault::rules(), rules);
    let err = fault::check(Path::new("/a/x.log"), FaultOp::Write).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(5));
    let err = fault::check(Path::new("/b/x.log"), FaultOp::Sync).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(28));
    assert!(fault::check(Path::new("/b/x.log"), FaultOp::Write).is_ok());

    let only = FaultRule {
        op: FaultOp::Read,
        errno: 13,
        path_contains: "/c/".into(),
    };
    fault::set_rules(vec![only.clone()]);
    assert_eq!(fault::rules(), vec![only]);
    assert!(
        fault::check(Path::new("/a/x.log"), FaultOp::Write).is_ok(),
        "replaced"
    );
    assert!(fault::check(Path::new("/c/x.log"), FaultOp::Read).is_err());

    fault::set_rules(Vec::new());
    assert!(fault::rules().is_empty());
    assert!(
        fault::check(Path::new("/c/x.log"), FaultOp::Read).is_ok(),
        "disarmed"
    );
}
