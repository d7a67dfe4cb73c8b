//! Consumer-lag alerts as a pure state machine: rules and per-(group, topic)
//! observations go in with the time, notices to send (firing, repeated, resolved) come
//! out. No I/O, no clock; the broker's sink thread delivers the notices.
//!
//! A (group, topic) breaches its rule (the first rule whose group glob matches) when
//! any of the rule's conditions holds: lag in records above `lag_records`, lag in
//! seconds above `lag_seconds`, or the status at least `min_status`. A breach that has
//! lasted `for_ms` fires once; while it lasts it fires again every `repeat_ms`; when it
//! ends (or the group is gone from this coordinator) one `resolved` notice goes out.

use std::collections::BTreeMap;

use crate::lag::Status;

/// One alert rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Group ids the rule covers: `*` any run of characters, `?` one character.
    pub group_glob: String,
    pub lag_records: Option<i64>,
    pub lag_seconds: Option<f64>,
    pub min_status: Option<Status>,
    /// How long a breach must last before it fires.
    pub for_ms: i64,
    /// How often a firing alert is sent again while it lasts.
    pub repeat_ms: i64,
}

impl Rule {
    fn breached(&self, o: &Observation) -> bool {
        self.lag_records.is_some_and(|n| o.lag_records > n)
            || self.lag_seconds.is_some_and(|s| o.lag_seconds > s)
            || self.min_status.is_some_and(|s| o.status >= s)
    }
}

/// The lag of one group on one topic: total records, the largest age in seconds and
/// the worst partition status.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub group: String,
    pub topic: String,
    pub lag_records: i64,
    pub lag_seconds: f64,
    pub status: Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    Firing,
    Resolved,
}

/// One message for the sinks.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub kind: NoticeKind,
    pub group: String,
    pub topic: String,
    /// When the breach began (firing and resolved alike).
    pub starts_at_ms: i64,
    /// Resolved: when it ended.
    pub ends_at_ms: Option<i64>,
    /// The figures of the last observation.
    pub lag_records: i64,
    pub lag_seconds: f64,
    pub status: Status,
    /// `critical` if the status was ERR or worse when the alert first fired, else
    /// `warning` (it stays the same until the alert resolves).
    pub severity: &'static str,
    /// The rule's glob, for the annotations.
    pub rule: String,
}

#[derive(Debug, Clone)]
struct Breach {
    since_ms: i64,
    /// When it last fired; None while pending (not lasted `for_ms` yet).
    sent_ms: Option<i64>,
    last: Observation,
    rule: String,
    /// Fixed when it first fires, so that its repeats and its resolution carry the same
    /// labels (a sink identifies an alert by them).
    severity: &'static str,
}

/// Breaches per (group, topic).
#[derive(Debug, Default)]
pub struct Alerts {
    breaches: BTreeMap<(String, String), Breach>,
}

/// Whether `name` matches `glob` (`*` any run, `?` one character).
pub fn glob_match(glob: &str, name: &str) -> bool {
    let (g, n): (Vec<char>, Vec<char>) = (glob.chars().collect(), name.chars().collect());
    // Iterative matching with one backtrack point for the last `*`.
    let (mut gi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == n[ni]) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some(gi);
            mark = ni;
            gi += 1;
        } else if let Some(s) = star {
            gi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

fn severity(s: Status) -> &'static str {
    if s >= Status::Err {
        "critical"
    } else {
        "warning"
    }
}

impl Alerts {
    /// Evaluates every observation of one coordinator at `now_ms` (all of its groups:
    /// a (group, topic) missing from `obs` has ended) and returns the notices to send.
    pub fn evaluate(&mut self, now_ms: i64, rules: &[Rule], obs: &[Observation]) -> Vec<Notice> {
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for o in obs {
            let key = (o.group.clone(), o.topic.clone());
            seen.insert(key.clone());
            let rule = rules.iter().find(|r| glob_match(&r.group_glob, &o.group));
            match rule.filter(|r| r.breached(o)) {
                Some(r) => self.breaching(now_ms, r, o, key, &mut out),
                None => self.cleared(now_ms, &key, Some(o), &mut out),
            }
        }
        let gone: Vec<_> = self
            .breaches
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.cleared(now_ms, &key, None, &mut out);
        }
        out
    }

    fn breaching(
        &mut self,
        now_ms: i64,
        rule: &Rule,
        o: &Observation,
        key: (String, String),
        out: &mut Vec<Notice>,
    ) {
        let b = self.breaches.entry(key).or_insert_with(|| Breach {
            since_ms: now_ms,
            sent_ms: None,
            last: o.clone(),
            rule: rule.group_glob.clone(),
            severity: severity(o.status),
        });
        b.last = o.clone();
        b.rule = rule.group_glob.clone();
        let due = match b.sent_ms {
            None => now_ms - b.since_ms >= rule.for_ms,
            Some(sent) => now_ms - sent >= rule.repeat_ms,
        };
        if due {
            if b.sent_ms.is_none() {
                b.severity = severity(o.status);
            }
            b.sent_ms = Some(now_ms);
            out.push(notice(NoticeKind::Firing, b, None));
        }
    }

    fn cleared(
        &mut self,
        now_ms: i64,
        key: &(String, String),
        o: Option<&Observation>,
        out: &mut Vec<Notice>,
    ) {
        let Some(mut b) = self.breaches.remove(key) else {
            return;
        };
        // A breach that never fired ends silently.
        if b.sent_ms.is_some() {
            if let Some(o) = o {
                b.last = o.clone();
            }
            out.push(notice(NoticeKind::Resolved, &b, Some(now_ms)));
        }
    }

    /// (group, topic) pairs currently firing.
    pub fn firing(&self) -> impl Iterator<Item = &(String, String)> {
        self.breaches
            .iter()
            .filter(|(_, b)| b.sent_ms.is_some())
            .map(|(k, _)| k)
    }
}

fn notice(kind: NoticeKind, b: &Breach, ends_at_ms: Option<i64>) -> Notice {
    Notice {
        kind,
        group: b.last.group.clone(),
        topic: b.last.topic.clone(),
        starts_at_ms: b.since_ms,
        ends_at_ms,
        lag_records: b.last.lag_records,
        lag_seconds: b.last.lag_seconds,
        status: b.last.status,
        severity: b.severity,
        rule: b.rule.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(glob: &str) -> Rule {
        Rule {
            group_glob: glob.into(),
            lag_records: Some(100),
            lag_seconds: None,
            min_status: None,
            for_ms: 1_000,
            repeat_ms: 5_000,
        }
    }

    fn obs(group: &str, lag: i64) -> Observation {
        Observation {
            group: group.into(),
            topic: "t".into(),
            lag_records: lag,
            lag_seconds: 1.5,
            status: Status::Ok,
        }
    }

    fn kinds(n: &[Notice]) -> Vec<NoticeKind> {
        n.iter().map(|n| n.kind).collect()
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("pay-*", "pay-eu"));
        assert!(glob_match("*-eu", "pay-eu"));
        assert!(glob_match("p?y*u", "pay-eu"));
        assert!(glob_match("a*b*c", "aXXbYYbc"));
        assert!(!glob_match("pay-*", "pa"));
        assert!(!glob_match("pay", "pay-eu"));
        assert!(!glob_match("a*b*c", "aXXbYYbd"));
    }

    #[test]
    fn fires_after_for_repeats_and_resolves() {
        let rules = [rule("*")];
        let mut a = Alerts::default();
        assert!(a.evaluate(0, &rules, &[obs("g", 500)]).is_empty());
        assert!(a.evaluate(999, &rules, &[obs("g", 500)]).is_empty());
        let n = a.evaluate(1_000, &rules, &[obs("g", 600)]);
        assert_eq!(kinds(&n), [NoticeKind::Firing]);
        assert_eq!((n[0].starts_at_ms, n[0].lag_records), (0, 600));
        assert_eq!(n[0].severity, "warning");
        assert!(a.evaluate(5_999, &rules, &[obs("g", 600)]).is_empty());
        assert_eq!(
            kinds(&a.evaluate(6_000, &rules, &[obs("g", 600)])),
            [NoticeKind::Firing]
        );
        assert_eq!(a.firing().count(), 1);
        let n = a.evaluate(7_000, &rules, &[obs("g", 0)]);
        assert_eq!(kinds(&n), [NoticeKind::Resolved]);
        assert_eq!((n[0].ends_at_ms, n[0].lag_records), (Some(7_000), 0));
        assert!(a.evaluate(8_000, &rules, &[obs("g", 0)]).is_empty());
        assert_eq!(a.firing().count(), 0);
    }

    #[test]
    fn a_short_breach_never_fires_nor_resolves() {
        let rules = [rule("*")];
        let mut a = Alerts::default();
        assert!(a.evaluate(0, &rules, &[obs("g", 500)]).is_empty());
        assert!(a.evaluate(500, &rules, &[obs("g", 5)]).is_empty());
        // It starts over.
        assert!(a.evaluate(600, &rules, &[obs("g", 500)]).is_empty());
        assert!(a.evaluate(1_500, &rules, &[obs("g", 500)]).is_empty());
        assert_eq!(a.evaluate(1_600, &rules, &[obs("g", 500)]).len(), 1);
    }

    #[test]
    fn first_matching_rule_wins_and_status_conditions_count() {
        let strict = Rule {
            lag_records: None,
            min_status: Some(Status::Err),
            for_ms: 0,
            ..rule("critical-*")
        };
        let rules = [strict, rule("*")];
        let mut a = Alerts::default();
        // 500 records are no breach under the first rule, only ERR or worse is.
        assert!(a.evaluate(0, &rules, &[obs("critical-x", 500)]).is_empty());
        let stalled = Observation {
            status: Status::Stall,
            ..obs("critical-x", 1)
        };
        let n = a.evaluate(10, &rules, &[stalled]);
        assert_eq!(kinds(&n), [NoticeKind::Firing]);
        assert_eq!(n[0].severity, "critical");
        assert_eq!(n[0].rule, "critical-*");
    }

    #[test]
    fn a_group_gone_from_the_coordinator_resolves() {
        let rules = [Rule {
            for_ms: 0,
            ..rule("*")
        }];
        let mut a = Alerts::default();
        assert_eq!(a.evaluate(0, &rules, &[obs("g", 500)]).len(), 1);
        let n = a.evaluate(10, &rules, &[]);
        assert_eq!(kinds(&n), [NoticeKind::Resolved]);
        // No rule for the group: nothing fires.
        assert!(a
            .evaluate(20, &[rule("other")], &[obs("g", 500)])
            .is_empty());
    }
}
