//! Injected I/O faults: tests (and the broker under a test-only flag) arm rules that
//! make chosen file operations fail with a chosen errno, per path substring.
//!
//! Why a layer of our own: this machine's kernel has no device-mapper (no dm-error or
//! dm-flakey to fail a block device) and glommio's io_uring bypasses an LD_PRELOAD
//! shim, so the only place to fail a `write` or an `fdatasync` is where the crate
//! issues it. Every I/O on partition files (`.log`, `.index`, `.timeindex`,
//! `.txnindex`, `.snapshot`, `partition.meta`, their `.tmp` and `.cleaned` files, the
//! partition directory) and on the metadata [`crate::journal`] calls [`check`] first,
//! next to the crash simulation's hooks ([`crate::simdisk`]); an injected error then
//! takes exactly the path a real one would (an [`crate::file::AppendFile`] becomes
//! failed, a read fails its caller and fails the log).
//!
//! | op | checked before |
//! |----|----------------|
//! | `open` | every open of a partition file (`AppendFile::open`, read handles, recovery), `Journal::open` and the journal's rewrite temp file |
//! | `read` | every read of a partition file (segment reads, recovery scans, index, snapshot and `partition.meta` reads, the tail page an `AppendFile` re-reads at open and truncation), the journal's read at open |
//! | `write` | every write of an `AppendFile` and its fallocate (so `write_atomic` too), the journal's appends, rewrites and cut of a torn tail |
//! | `sync` | every fdatasync/fsync and the cuts they make durable: `AppendFile` syncs (and the writes of a write-through segment log, which sync as they write), truncations and seals, recovery's cut of a torn segment, directory syncs, the journal's syncs |
//!
//! Process-global on purpose, unlike [`crate::simdisk`]: a broker runs one executor
//! thread per shard and a test arms a fault for all of them at once. Unarmed (the
//! default, production) a check costs one relaxed atomic load; the rules sit behind a
//! lock read only while something is armed.
//!
//! Rules as text ([`parse_rules`]), one a line:
//!
//! ```text
//! # op     errno        path substring
//! write    enospc       /data/orders-0/
//! sync     eio          orders-0
//! read     5            00000000000000000000.log
//! ```

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// Linux errno values the rule text names.
const EIO: i32 = 5;
const ENOSPC: i32 = 28;

/// The kind of file operation a rule fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Open,
    Read,
    Write,
    Sync,
}

/// Fail every `op` on a path whose display string contains `path_contains` with
/// `errno`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    pub op: FaultOp,
    pub errno: i32,
    pub path_contains: String,
}

/// Whether any rule is armed: the fast path reads only this.
static ARMED: AtomicBool = AtomicBool::new(false);
static RULES: RwLock<Vec<FaultRule>> = RwLock::new(Vec::new());

/// Replaces every armed rule with `rules`; an empty list disarms.
pub fn set_rules(rules: Vec<FaultRule>) {
    let mut guard = RULES.write().unwrap_or_else(|e| e.into_inner());
    let armed = !rules.is_empty();
    *guard = rules;
    // Set under the lock, so a concurrent `set_rules` cannot leave the flag stale.
    ARMED.store(armed, Ordering::Relaxed);
}

/// Adds one rule to those armed (atomically: tests running in parallel threads each
/// arm their own rules without losing another's).
pub fn arm(rule: FaultRule) {
    let mut guard = RULES.write().unwrap_or_else(|e| e.into_inner());
    guard.push(rule);
    ARMED.store(true, Ordering::Relaxed);
}

/// Removes the armed rules whose substring is `path_contains` (atomically, like
/// [`arm`]); disarms when none is left.
pub fn disarm(path_contains: &str) {
    let mut guard = RULES.write().unwrap_or_else(|e| e.into_inner());
    guard.retain(|r| r.path_contains != path_contains);
    ARMED.store(!guard.is_empty(), Ordering::Relaxed);
}

/// The rules armed now.
pub fn rules() -> Vec<FaultRule> {
    RULES.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Fails with the armed errno if a rule covers `op` on `path`.
pub fn check(path: &Path, op: FaultOp) -> std::io::Result<()> {
    if !ARMED.load(Ordering::Relaxed) {
        return Ok(());
    }
    check_armed(path, op)
}

#[cold]
fn check_armed(path: &Path, op: FaultOp) -> std::io::Result<()> {
    let rules = RULES.read().unwrap_or_else(|e| e.into_inner());
    let shown = path.display().to_string();
    match rules
        .iter()
        .find(|r| r.op == op && shown.contains(&r.path_contains))
    {
        Some(r) => Err(std::io::Error::from_raw_os_error(r.errno)),
        None => Ok(()),
    }
}

/// [`check`] as a storage error naming the path.
pub(crate) fn check_io(path: &Path, op: FaultOp) -> Result<(), crate::Error> {
    check(path, op).map_err(|e| crate::Error::io(path, e))
}

/// Parses rules, one per line: `<open|read|write|sync> <eio|enospc|errno number> <path
/// substring>` (the substring is the rest of the line, trimmed; it may hold spaces).
/// `#` starts a comment line; blank lines are skipped.
pub fn parse_rules(text: &str) -> Result<Vec<FaultRule>, String> {
    let mut rules = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("fault rule line {}: {why}: {line:?}", i + 1);
        let (op_word, rest) = split_word(line);
        let (errno_word, path) = split_word(rest);
        let op = match op_word.to_ascii_lowercase().as_str() {
            "open" => FaultOp::Open,
            "read" => FaultOp::Read,
            "write" => FaultOp::Write,
            "sync" => FaultOp::Sync,
            _ => return Err(bad("the operation must be open, read, write or sync")),
        };
        let errno = match errno_word.to_ascii_lowercase().as_str() {
            "eio" => EIO,
            "enospc" => ENOSPC,
            "" => return Err(bad("missing errno (eio, enospc or a number)")),
            n => match n.parse::<i32>() {
                Ok(v) if v > 0 => v,
                _ => return Err(bad("the errno must be eio, enospc or a positive number")),
            },
        };
        if path.is_empty() {
            return Err(bad("missing path substring"));
        }
        rules.push(FaultRule {
            op,
            errno,
            path_contains: path.to_string(),
        });
    }
    Ok(rules)
}

/// The first whitespace-separated word of `s` and the trimmed rest.
fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    match s.find(char::is_whitespace) {
        Some(at) => (&s[..at], s[at..].trim()),
        None => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rules_accepts_names_numbers_comments_and_blank_lines() {
        let text = "# faults for one test\n\
                    \n\
                    write enospc /data/t-0/\n  \
                    SYNC  EIO   t-1 with space \n\
                    read 13 .index\n\
                    open eio journal\n";
        let rules = parse_rules(text).unwrap();
        assert_eq!(
            rules,
            vec![
                FaultRule {
                    op: FaultOp::Write,
                    errno: 28,
                    path_contains: "/data/t-0/".into()
                },
                FaultRule {
                    op: FaultOp::Sync,
                    errno: 5,
                    path_contains: "t-1 with space".into()
                },
                FaultRule {
                    op: FaultOp::Read,
                    errno: 13,
                    path_contains: ".index".into()
                },
                FaultRule {
                    op: FaultOp::Open,
                    errno: 5,
                    path_contains: "journal".into()
                },
            ]
        );
        assert_eq!(parse_rules("").unwrap(), vec![]);
        assert_eq!(parse_rules("# only\n\n   \n").unwrap(), vec![]);
    }

    #[test]
    fn parse_rules_rejects_bad_lines_naming_them() {
        for (text, line) in [
            ("write eio /a\nfsync eio /b\n", 2),
            ("write\n", 1),
            ("write eio\n", 1),
            ("\n\nwrite enoent /x\n", 3),
            ("read 0 /x\n", 1),
            ("read -5 /x\n", 1),
            ("read 99999999999 /x\n", 1),
        ] {
            let err = parse_rules(text).unwrap_err();
            assert!(
                err.contains(&format!("line {line}:")),
                "{text:?} gave {err:?}"
            );
        }
    }

    #[test]
    fn check_matches_op_and_path_substring() {
        // Unique substrings: other tests in this process arm rules of their own.
        let marker = "fault-unit-check-6f1d";
        let path = std::path::PathBuf::from(format!("/tmp/{marker}/x.log"));
        let other = std::path::PathBuf::from("/tmp/fault-unit-other/x.log");
        let mine = FaultRule {
            op: FaultOp::Write,
            errno: 28,
            path_contains: marker.into(),
        };
        arm(mine.clone());
        assert!(rules().contains(&mine));
        let err = check(&path, FaultOp::Write).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28));
        assert!(check(&path, FaultOp::Sync).is_ok(), "another op");
        assert!(check(&other, FaultOp::Write).is_ok(), "another path");
        disarm(marker);
        assert!(check(&path, FaultOp::Write).is_ok(), "disarmed");
        assert!(!rules().contains(&mine));
    }
}
