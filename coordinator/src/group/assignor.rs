//! The server-side assignors of consumer groups (KIP-848): given every member's
//! subscribed topics and its previous target, each computes the group's next target
//! assignment. Pure functions of their input; deterministic (members and partitions are
//! visited in a fixed order), so a reloaded coordinator computes what the old one would.
//!
//! - `uniform` (the default, as in Kafka): balanced — with identical subscriptions each
//!   member gets ⌊P/N⌋ or ⌈P/N⌉ partitions — and sticky: a member keeps what it had
//!   unless balance needs it elsewhere, so a join or leave moves only the partitions
//!   that must move. With differing subscriptions it assigns each partition to the
//!   least-loaded member that subscribes to it, then moves partitions from members with
//!   two or more than another eligible member until none can move.
//! - `range`: per topic, the subscribed members in member-id order take contiguous
//!   ranges, the first `P mod N` one partition more (co-partitioned topics line up).
//!
//! Rack ids are accepted as input and not used yet: no assignor here prefers a replica
//! in the member's rack.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

/// Partitions per topic id.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// The assignors a broker offers (group.consumer.assignors), by their Kafka names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignor {
    Uniform,
    Range,
}

impl Assignor {
    pub fn parse(name: &str) -> Option<Assignor> {
        match name {
            "uniform" => Some(Assignor::Uniform),
            "range" => Some(Assignor::Range),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Assignor::Uniform => "uniform",
            Assignor::Range => "range",
        }
    }
}

/// One member as an assignor sees it.
#[derive(Debug, Clone)]
pub struct Subscriber<'a> {
    pub id: &'a str,
    pub topics: BTreeSet<Uuid>,
    /// Its previous target (what stickiness keeps).
    pub current: &'a Assignment,
}

/// The next target of every member (members with nothing get an empty assignment).
pub fn assign(
    assignor: Assignor,
    members: &[Subscriber<'_>],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut members: Vec<&Subscriber<'_>> = members.iter().collect();
    members.sort_by(|a, b| a.id.cmp(b.id));
    let out = match assignor {
        Assignor::Range => range(&members, partitions),
        Assignor::Uniform => {
            let homogeneous = members.windows(2).all(|w| w[0].topics == w[1].topics);
            if homogeneous {
                uniform_homogeneous(&members, partitions)
            } else {
                uniform_general(&members, partitions)
            }
        }
    };
    members
        .iter()
        .map(|m| {
            let mut a = out.get(m.id).cloned().unwrap_or_default();
            a.retain(|_, ps| !ps.is_empty());
            (m.id.to_string(), a)
        })
        .collect()
}

fn range(
    members: &[&Subscriber<'_>],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = BTreeMap::new();
    for (&topic, &count) in partitions {
        let subs: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.contains(&topic))
            .map(|m| m.id)
            .collect();
        if subs.is_empty() || count <= 0 {
            continue;
        }
        let n = subs.len() as i32;
        let (base, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, id) in subs.iter().enumerate() {
            let take = base + i32::from((i as i32) < extra);
            let ps: BTreeSet<i32> = (next..next + take).collect();
            next += take;
            out.entry((*id).to_string())
                .or_default()
                .entry(topic)
                .or_default()
                .extend(ps);
        }
    }
    out
}

/// Every partition of the topics, in (topic id, partition) order.
fn all_partitions(topics: &BTreeSet<Uuid>, partitions: &BTreeMap<Uuid, i32>) -> Vec<(Uuid, i32)> {
    topics
        .iter()
        .filter_map(|t| partitions.get(t).map(|&n| (*t, n)))
        .flat_map(|(t, n)| (0..n.max(0)).map(move |p| (t, p)))
        .collect()
}

fn flatten(a: &Assignment) -> impl Iterator<Item = (Uuid, i32)> + '_ {
    a.iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
}

fn to_assignment(ps: &[(Uuid, i32)]) -> Assignment {
    let mut a = Assignment::new();
    for (t, p) in ps {
        a.entry(*t).or_default().insert(*p);
    }
    a
}

fn uniform_homogeneous(
    members: &[&Subscriber<'_>],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let Some(first) = members.first() else {
        return BTreeMap::new();
    };
    let all = all_partitions(&first.topics, partitions);
    let valid: BTreeSet<(Uuid, i32)> = all.iter().copied().collect();
    let n = members.len();
    let (base, extra) = (all.len() / n, all.len() % n);
    // What each member still may keep: its previous partitions that exist, each
    // partition kept by one member only.
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    let mut kept: Vec<Vec<(Uuid, i32)>> = members
        .iter()
        .map(|m| {
            flatten(m.current)
                .filter(|tp| valid.contains(tp) && taken.insert(*tp))
                .collect()
        })
        .collect();
    // The `extra` larger quotas go to the members keeping the most (fewest moves).
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| kept[b].len().cmp(&kept[a].len()).then(a.cmp(&b)));
    let mut quota = vec![base; n];
    for &i in order.iter().take(extra) {
        quota[i] += 1;
    }
    for (i, k) in kept.iter_mut().enumerate() {
        for tp in k.drain(quota[i].min(k.len())..) {
            taken.remove(&tp);
        }
    }
    let mut free = all.into_iter().filter(|tp| !taken.contains(tp));
    for (i, k) in kept.iter_mut().enumerate() {
        while k.len() < quota[i] {
            match free.next() {
                Some(tp) => k.push(tp),
                None => break,
            }
        }
    }
    members
        .iter()
        .zip(kept)
        .map(|(m, k)| (m.id.to_string(), to_assignment(&k)))
        .collect()
}

fn uniform_general(
    members: &[&Subscriber<'_>],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let topics: BTreeSet<Uuid> = members
        .iter()
        .flat_map(|m| m.topics.iter().copied())
        .collect();
    let all = all_partitions(&topics, partitions);
    let valid: BTreeSet<(Uuid, i32)> = all.iter().copied().collect();
    let mut owner: BTreeMap<(Uuid, i32), usize> = BTreeMap::new();
    let mut load = vec![0usize; members.len()];
    for (i, m) in members.iter().enumerate() {
        for tp in flatten(m.current) {
            if valid.contains(&tp) && m.topics.contains(&tp.0) && !owner.contains_key(&tp) {
                owner.insert(tp, i);
                load[i] += 1;
            }
        }
    }
    // Members with the same subscription are interchangeable here: each class keeps
    // its members by (load, index), so the least-loaded eligible member of a partition
    // is the least of its topic's classes' first members — O(classes · log members) a
    // lookup, not O(members) (a pass over 10,000 partitions and 10,000 members was
    // 10^8 steps on the shard).
    let mut class_of = vec![0usize; members.len()];
    let mut classes: Vec<BTreeSet<(usize, usize)>> = Vec::new();
    let mut by_subscription: BTreeMap<&BTreeSet<Uuid>, usize> = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        let c = *by_subscription.entry(&m.topics).or_insert_with(|| {
            classes.push(BTreeSet::new());
            classes.len() - 1
        });
        class_of[i] = c;
        classes[c].insert((load[i], i));
    }
    let mut by_topic: BTreeMap<Uuid, (Vec<usize>, usize)> = BTreeMap::new();
    for (subscription, &c) in &by_subscription {
        for t in subscription.iter() {
            let e = by_topic.entry(*t).or_default();
            e.0.push(c);
            e.1 += classes[c].len();
        }
    }
    let least = |classes: &[BTreeSet<(usize, usize)>], t: &Uuid| -> Option<usize> {
        by_topic[t]
            .0
            .iter()
            .filter_map(|&c| classes[c].first())
            .min()
            .map(|&(_, i)| i)
    };
    let set_load =
        |classes: &mut [BTreeSet<(usize, usize)>], load: &mut [usize], i: usize, to: usize| {
            let c = &mut classes[class_of[i]];
            c.remove(&(load[i], i));
            load[i] = to;
            c.insert((to, i));
        };
    // Unowned partitions, those with the fewest candidates first.
    let mut unowned: Vec<(Uuid, i32)> = all
        .iter()
        .copied()
        .filter(|tp| !owner.contains_key(tp))
        .collect();
    unowned.sort_by_key(|tp| by_topic[&tp.0].1);
    for tp in unowned {
        if let Some(i) = least(&classes, &tp.0) {
            owner.insert(tp, i);
            let to = load[i] + 1;
            set_load(&mut classes, &mut load, i, to);
        }
    }
    // Move partitions from a member to an eligible one with two or more fewer, until
    // no such move exists (each move lowers the sum of squared loads: it ends).
    loop {
        let mut moved = false;
        for (tp, o) in owner.iter_mut() {
            let Some(to) = least(&classes, &tp.0) else {
                continue;
            };
            let (lo, lt) = (load[*o], load[to]);
            if lt + 1 < lo {
                set_load(&mut classes, &mut load, *o, lo - 1);
                set_load(&mut classes, &mut load, to, lt + 1);
                *o = to;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let mut out: BTreeMap<String, Assignment> = BTreeMap::new();
    for ((t, p), i) in owner {
        out.entry(members[i].id.to_string())
            .or_default()
            .entry(t)
            .or_default()
            .insert(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    fn check_exclusive(out: &BTreeMap<String, Assignment>, partitions: &BTreeMap<Uuid, i32>) {
        let mut seen = BTreeSet::new();
        for a in out.values() {
            for tp in flatten(a) {
                assert!(seen.insert(tp), "{tp:?} assigned twice");
            }
        }
        let total: i32 = partitions.values().sum();
        assert_eq!(seen.len(), total as usize, "every partition assigned");
    }

    #[test]
    fn uniform_balances_and_moves_only_what_it_must() {
        let t = topic(1);
        let partitions = BTreeMap::from([(t, 10)]);
        let empty = Assignment::new();
        fn subs<'a>(t: Uuid, ids: &[&'a str], cur: &[&'a Assignment]) -> Vec<Subscriber<'a>> {
            ids.iter()
                .zip(cur)
                .map(|(id, c)| Subscriber {
                    id,
                    topics: BTreeSet::from([t]),
                    current: c,
                })
                .collect()
        }
        let one = assign(Assignor::Uniform, &subs(t, &["a"], &[&empty]), &partitions);
        assert_eq!(count(&one["a"]), 10);
        let a_cur = one["a"].clone();
        let two = assign(
            Assignor::Uniform,
            &subs(t, &["a", "b"], &[&a_cur, &empty]),
            &partitions,
        );
        check_exclusive(&two, &partitions);
        assert_eq!((count(&two["a"]), count(&two["b"])), (5, 5));
        // a kept five of its own: only five moved.
        assert!(two["a"][&t].is_subset(&a_cur[&t]));
        let (a2, b2) = (two["a"].clone(), two["b"].clone());
        let three = assign(
            Assignor::Uniform,
            &subs(t, &["a", "b", "c"], &[&a2, &b2, &empty]),
            &partitions,
        );
        check_exclusive(&three, &partitions);
        let mut counts: Vec<usize> = three.values().map(count).collect();
        counts.sort();
        assert_eq!(counts, vec![3, 3, 4]);
        assert!(three["a"][&t].is_subset(&a2[&t]));
        assert!(three["b"][&t].is_subset(&b2[&t]));
    }

    #[test]
    fn uniform_with_differing_subscriptions_gives_each_partition_to_a_subscriber() {
        let (x, y) = (topic(1), topic(2));
        let partitions = BTreeMap::from([(x, 6), (y, 2)]);
        let empty = Assignment::new();
        let members = vec![
            Subscriber {
                id: "a",
                topics: BTreeSet::from([x]),
                current: &empty,
            },
            Subscriber {
                id: "b",
                topics: BTreeSet::from([x, y]),
                current: &empty,
            },
        ];
        let out = assign(Assignor::Uniform, &members, &partitions);
        check_exclusive(&out, &partitions);
        assert!(!out["a"].contains_key(&y), "a does not subscribe to y");
        assert_eq!((count(&out["a"]), count(&out["b"])), (4, 4));
    }

    #[test]
    fn uniform_with_differing_subscriptions_at_scale_leaves_no_move_that_balances_more() {
        let (x, y) = (topic(1), topic(2));
        let partitions = BTreeMap::from([(x, 6000), (y, 4000)]);
        let empty = Assignment::new();
        let ids: Vec<String> = (0..2000).map(|i| format!("m{i:04}")).collect();
        let members: Vec<Subscriber<'_>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| Subscriber {
                id,
                topics: if i % 3 == 0 {
                    BTreeSet::from([x, y])
                } else {
                    BTreeSet::from([x])
                },
                current: &empty,
            })
            .collect();
        let out = assign(Assignor::Uniform, &members, &partitions);
        check_exclusive(&out, &partitions);
        let load: BTreeMap<&str, usize> = out.iter().map(|(m, a)| (m.as_str(), count(a))).collect();
        // The end state of the moves: no partition's owner has two or more than the
        // least-loaded member that could take it.
        for (t, least) in [
            (x, members.iter().map(|m| load[m.id]).min().unwrap()),
            (
                y,
                members
                    .iter()
                    .filter(|m| m.topics.contains(&y))
                    .map(|m| load[m.id])
                    .min()
                    .unwrap(),
            ),
        ] {
            for (m, a) in &out {
                if a.contains_key(&t) {
                    assert!(
                        load[m.as_str()] <= least + 1,
                        "{m} holds {} vs {least}",
                        load[m.as_str()]
                    );
                }
            }
        }
        // The 667 members that read y take its 4,000 (6 each at most); the others
        // share x: nobody is left far behind.
        let (lo, hi) = (load.values().min().unwrap(), load.values().max().unwrap());
        assert!(*lo >= 4 && *hi <= 7, "loads {lo}..{hi}");
    }

    #[test]
    fn range_gives_contiguous_ranges_per_topic() {
        let (x, y) = (topic(1), topic(2));
        let partitions = BTreeMap::from([(x, 5), (y, 3)]);
        let empty = Assignment::new();
        let members = vec![
            Subscriber {
                id: "b",
                topics: BTreeSet::from([x, y]),
                current: &empty,
            },
            Subscriber {
                id: "a",
                topics: BTreeSet::from([x, y]),
                current: &empty,
            },
        ];
        let out = assign(Assignor::Range, &members, &partitions);
        check_exclusive(&out, &partitions);
        assert_eq!(out["a"][&x], BTreeSet::from([0, 1, 2]));
        assert_eq!(out["b"][&x], BTreeSet::from([3, 4]));
        assert_eq!(out["a"][&y], BTreeSet::from([0, 1]));
        assert_eq!(out["b"][&y], BTreeSet::from([2]));
    }
}
