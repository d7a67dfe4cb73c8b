//! The broker's own number types where mixing two of them up would compile as bare
//! integers: a partition's [`Offset`], a [`LeaderEpoch`], a [`ProducerId`] and a
//! [`BrokerId`].
//!
//! Each wraps the integer Kafka puts on the wire (`#[repr(transparent)]`, so a value
//! costs what the integer does) and has only the arithmetic that means something: an
//! offset moves forward by a record count ([`Offset::plus`], [`Offset::next`]) and two
//! offsets differ by a count ([`Offset::minus`]); an epoch is compared and bumped, never
//! summed; ids are compared and nothing else. The sentinels are Kafka's (`-1`: none or
//! unknown).
//!
//! The workspace crates below (storage, replication, coordinator) and the
//! `kafka-protocol` messages keep their own integer types: a value is wrapped where it
//! comes from one of them (`Offset::new(log.end())`) and unwrapped where it goes into
//! one (`.get()`), and the structs and signatures of this crate carry the newtypes.
//! `BrokerId` and `ProducerId` also convert into `kafka-protocol`'s own newtypes of the
//! same names (`.into()`).

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($int:ty)) => {
        $(#[$doc])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(transparent)]
        pub struct $name($int);

        impl $name {
            /// Kafka's `-1`: none, or not known.
            pub const NONE: $name = $name(-1);

            pub const fn new(v: $int) -> $name {
                $name(v)
            }

            /// The integer Kafka puts on the wire.
            pub const fn get(self) -> $int {
                self.0
            }

            /// Not the `-1` (or any negative) sentinel.
            pub const fn is_some(self) -> bool {
                self.0 >= 0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

id_type!(
    /// An offset in a partition's log: the position of a record, or (as a log end, a
    /// high watermark or a fetch position) of the next one.
    Offset(i64)
);

id_type!(
    /// A partition's leader epoch (KIP-101/320): bumped by every leadership change.
    LeaderEpoch(i32)
);

id_type!(
    /// A producer's id (KIP-98), allocated by the controller.
    ProducerId(i64)
);

id_type!(
    /// A broker's node id.
    BrokerId(i32)
);

impl Offset {
    /// The offset of the first record of a new partition's log.
    pub const ZERO: Offset = Offset(0);

    /// The offset `count` records on.
    pub fn plus(self, count: u64) -> Offset {
        let count = i64::try_from(count).expect("a record count fits an offset");
        Offset(self.0 + count)
    }

    /// The offset of the record after this one.
    pub fn next(self) -> Offset {
        self.plus(1)
    }

    /// How many records from `earlier` up to this offset (0 if `earlier` is not before).
    pub fn minus(self, earlier: Offset) -> u64 {
        u64::try_from(self.0 - earlier.0).unwrap_or(0)
    }
}

impl LeaderEpoch {
    /// The epoch after this one.
    pub fn next(self) -> LeaderEpoch {
        LeaderEpoch(self.0 + 1)
    }
}

impl From<BrokerId> for kafka_protocol::messages::BrokerId {
    fn from(id: BrokerId) -> kafka_protocol::messages::BrokerId {
        kafka_protocol::messages::BrokerId(id.get())
    }
}

impl From<kafka_protocol::messages::BrokerId> for BrokerId {
    fn from(id: kafka_protocol::messages::BrokerId) -> BrokerId {
        BrokerId(id.0)
    }
}

impl From<ProducerId> for kafka_protocol::messages::ProducerId {
    fn from(id: ProducerId) -> kafka_protocol::messages::ProducerId {
        kafka_protocol::messages::ProducerId(id.get())
    }
}

impl From<kafka_protocol::messages::ProducerId> for ProducerId {
    fn from(id: kafka_protocol::messages::ProducerId) -> ProducerId {
        ProducerId(id.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_move_by_counts() {
        let o = Offset::new(41);
        assert_eq!(o.next(), Offset::new(42));
        assert_eq!(o.plus(9), Offset::new(50));
        assert_eq!(Offset::new(50).minus(o), 9);
        assert_eq!(o.minus(Offset::new(50)), 0);
        assert!(Offset::NONE < Offset::ZERO);
        assert!(!Offset::NONE.is_some() && Offset::ZERO.is_some());
    }

    #[test]
    fn epochs_and_ids() {
        assert_eq!(LeaderEpoch::new(3).next(), LeaderEpoch::new(4));
        assert_eq!(LeaderEpoch::NONE.get(), -1);
        assert_eq!(BrokerId::new(7).to_string(), "7");
        let k: kafka_protocol::messages::BrokerId = BrokerId::new(7).into();
        assert_eq!(k.0, 7);
        assert_eq!(BrokerId::from(k), BrokerId::new(7));
        let p: kafka_protocol::messages::ProducerId = ProducerId::new(9).into();
        assert_eq!(ProducerId::from(p), ProducerId::new(9));
        assert_eq!(std::mem::size_of::<Offset>(), 8);
    }
}
