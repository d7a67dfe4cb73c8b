//! Partition keys: [`TopicPartition`], a topic name and a partition index, cheap to
//! clone (the name is an `Arc<str>`) and usable as the key of a `HashMap` or `BTreeMap`
//! that is looked up from a borrowed `(&str, i32)` without allocating.
//!
//! The borrowed lookup: both [`TopicPartition`] and [`TopicPartitionRef`] implement
//! [`PartitionKey`], and `TopicPartition: Borrow<dyn PartitionKey>`, so a map keyed by
//! `TopicPartition` answers `map.get(TopicPartitionRef::new(topic, p).key())`. For the
//! `Borrow` contract, hashing, equality and ordering of both go through the one
//! borrowed form ([`PartitionKey::tp`]): ordered by topic, then partition.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A partition of a topic, owned. Cloning copies a pointer, not the name.
#[derive(Clone)]
pub struct TopicPartition {
    topic: Arc<str>,
    partition: i32,
}

/// A partition of a topic, borrowed: the lookup form of [`TopicPartition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartitionRef<'a> {
    pub topic: &'a str,
    pub partition: i32,
}

/// What a map keyed by [`TopicPartition`] can be looked up with (see the module doc).
pub trait PartitionKey {
    fn tp(&self) -> TopicPartitionRef<'_>;
}

impl TopicPartition {
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The shared name, for another key of the same topic without copying it.
    pub fn topic_arc(&self) -> &Arc<str> {
        &self.topic
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    pub fn as_ref(&self) -> TopicPartitionRef<'_> {
        TopicPartitionRef {
            topic: &self.topic,
            partition: self.partition,
        }
    }
}

impl<'a> TopicPartitionRef<'a> {
    pub fn new(topic: &'a str, partition: i32) -> TopicPartitionRef<'a> {
        TopicPartitionRef { topic, partition }
    }

    /// The form a `TopicPartition`-keyed map's `get`/`contains_key`/`remove` take.
    pub fn key(&self) -> &(dyn PartitionKey + 'a) {
        self
    }

    pub fn to_owned(self) -> TopicPartition {
        TopicPartition::new(self.topic, self.partition)
    }
}

impl PartitionKey for TopicPartition {
    fn tp(&self) -> TopicPartitionRef<'_> {
        self.as_ref()
    }
}

impl PartitionKey for TopicPartitionRef<'_> {
    fn tp(&self) -> TopicPartitionRef<'_> {
        *self
    }
}

impl<'a> Borrow<dyn PartitionKey + 'a> for TopicPartition {
    fn borrow(&self) -> &(dyn PartitionKey + 'a) {
        self
    }
}

impl PartialEq for dyn PartitionKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.tp() == other.tp()
    }
}

impl Eq for dyn PartitionKey + '_ {}

impl Hash for dyn PartitionKey + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.tp().hash(state)
    }
}

impl PartialOrd for dyn PartitionKey + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn PartitionKey + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.tp().cmp(&other.tp())
    }
}

// The owned key compares and hashes exactly as its borrowed form (the `Borrow` contract).
impl PartialEq for TopicPartition {
    fn eq(&self, other: &Self) -> bool {
        self.as_ref() == other.as_ref()
    }
}

impl Eq for TopicPartition {}

impl Hash for TopicPartition {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state)
    }
}

impl PartialOrd for TopicPartition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TopicPartition {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_ref().cmp(&other.as_ref())
    }
}

impl fmt::Debug for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}-{}", &*self.topic, self.partition)
    }
}

/// Kafka's form: `topic-3`.
impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

impl fmt::Display for TopicPartitionRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

impl From<(&str, i32)> for TopicPartition {
    fn from((topic, partition): (&str, i32)) -> TopicPartition {
        TopicPartition::new(topic, partition)
    }
}

impl From<(String, i32)> for TopicPartition {
    fn from((topic, partition): (String, i32)) -> TopicPartition {
        TopicPartition::new(topic, partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::collections::{BTreeMap, HashMap};

    fn hash_of<T: Hash + ?Sized>(t: &T) -> u64 {
        let mut h = DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    }

    #[test]
    fn borrowed_and_owned_keys_hash_and_compare_alike() {
        for (t, p) in [("a", 0), ("orders", 3), ("", -1), ("x-1", 12)] {
            let owned = TopicPartition::new(t, p);
            let r = TopicPartitionRef::new(t, p);
            assert_eq!(hash_of(&owned), hash_of(r.key()));
            assert_eq!(
                hash_of(&owned),
                hash_of(Borrow::<dyn PartitionKey>::borrow(&owned))
            );
            assert!(Borrow::<dyn PartitionKey>::borrow(&owned) == r.key());
            assert_eq!(r.to_owned(), owned);
        }
    }

    #[test]
    fn lookup_by_borrowed_key_equals_lookup_by_owned_key() {
        let mut h = HashMap::new();
        let mut b = BTreeMap::new();
        for t in ["a", "b", "orders"] {
            for p in 0..5 {
                h.insert(TopicPartition::new(t, p), format!("{t}/{p}"));
                b.insert(TopicPartition::new(t, p), format!("{t}/{p}"));
            }
        }
        for t in ["a", "b", "orders", "missing"] {
            for p in -1..6 {
                let owned = TopicPartition::new(t, p);
                let r = TopicPartitionRef::new(t, p);
                assert_eq!(h.get(r.key()), h.get(&owned), "{owned}");
                assert_eq!(b.get(r.key()), b.get(&owned), "{owned}");
                assert_eq!(h.contains_key(r.key()), h.contains_key(&owned));
            }
        }
        assert_eq!(
            h.remove(TopicPartitionRef::new("b", 2).key()).as_deref(),
            Some("b/2")
        );
        assert!(!h.contains_key(&TopicPartition::new("b", 2)));
        assert_eq!(
            b.remove(TopicPartitionRef::new("b", 2).key()).as_deref(),
            Some("b/2")
        );
    }

    #[test]
    fn borrowed_lookups_allocate_nothing() {
        let mut h = HashMap::new();
        let mut b = BTreeMap::new();
        for p in 0..64 {
            h.insert(TopicPartition::new("orders", p), p);
            b.insert(TopicPartition::new("orders", p), p);
        }
        let topic = String::from("orders");
        let before = crate::alloc::counting::allocations();
        let mut found = 0;
        for p in 0..128 {
            let k = TopicPartitionRef::new(&topic, p);
            found += h.get(k.key()).map_or(0, |_| 1);
            found += b.get(k.key()).map_or(0, |_| 1);
            found += h.contains_key(k.key()) as i32;
        }
        let after = crate::alloc::counting::allocations();
        assert_eq!(found, 3 * 64);
        assert_eq!(after - before, 0, "allocations in 384 borrowed lookups");
        // The tuple keys these replace: one String per lookup.
        let t: HashMap<(String, i32), i32> = (0..64).map(|p| ((topic.clone(), p), p)).collect();
        let before = crate::alloc::counting::allocations();
        for p in 0..128 {
            std::hint::black_box(t.get(&(topic.to_string(), p)));
        }
        assert_eq!(crate::alloc::counting::allocations() - before, 128);
    }

    #[test]
    fn ordered_by_topic_then_partition() {
        let mut keys = vec![
            TopicPartition::new("b", 0),
            TopicPartition::new("a", 10),
            TopicPartition::new("a", 2),
            TopicPartition::new("ab", -1),
            TopicPartition::new("a", -3),
        ];
        keys.sort();
        let got: Vec<(&str, i32)> = keys.iter().map(|k| (k.topic(), k.partition())).collect();
        assert_eq!(got, [("a", -3), ("a", 2), ("a", 10), ("ab", -1), ("b", 0)]);
        let mut tuples = got.clone();
        tuples.sort();
        assert_eq!(got, tuples, "the order of (topic, partition) tuples");
        let b: BTreeMap<TopicPartition, ()> = keys.into_iter().map(|k| (k, ())).collect();
        let order: Vec<String> = b.keys().map(|k| k.to_string()).collect();
        assert_eq!(order, ["a--3", "a-2", "a-10", "ab--1", "b-0"]);
    }

    #[test]
    fn displays_as_kafka_does_and_clones_share_the_name() {
        let k = TopicPartition::new("orders", 3);
        assert_eq!(k.to_string(), "orders-3");
        assert_eq!(format!("{k:?}"), "\"orders\"-3");
        let c = k.clone();
        assert!(Arc::ptr_eq(k.topic_arc(), c.topic_arc()));
    }
}
