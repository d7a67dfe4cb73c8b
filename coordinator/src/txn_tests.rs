//! Unit tests of the transaction coordinator ([`crate::txn`]), its record formats
//! ([`crate::txn_records`]) and the group side of transactions (TxnOffsetCommit in
//! [`crate::group`]): every transition and error code, driven by hand-picked times.

use kafka_protocol::error::ResponseError as E;

use crate::txn::*;
use crate::txn_records::*;

// ------------------------------------------------------------------ records

#[test]
fn key_is_kafkas_layout() {
    assert_eq!(encode_key("tx"), vec![0, 0, 0, 2, b't', b'x']);
    assert_eq!(decode_key(&encode_key("tx")).unwrap(), "tx");
    assert!(
        decode_key(&[0, 1, 0, 0]).is_err(),
        "key version 1 is unknown"
    );
}

/// Bytes laid out by hand after Kafka's TransactionLogValue schema, version 0.
#[test]
fn value_v0_decodes_from_hand_laid_bytes() {
    let mut b = vec![0, 0]; // version
    b.extend_from_slice(&1000i64.to_be_bytes()); // producer id
    b.extend_from_slice(&3i16.to_be_bytes()); // producer epoch
    b.extend_from_slice(&60_000i32.to_be_bytes()); // timeout
    b.push(1); // Ongoing
    b.extend_from_slice(&2i32.to_be_bytes()); // two topics
    b.extend_from_slice(&[0, 1, b'a']);
    b.extend_from_slice(&2i32.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&2i32.to_be_bytes());
    b.extend_from_slice(&[0, 1, b'b']);
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&7i32.to_be_bytes());
    b.extend_from_slice(&5i64.to_be_bytes()); // last update
    b.extend_from_slice(&4i64.to_be_bytes()); // start
    let v = TxnValue::decode(&b).unwrap();
    let want = TxnValue {
        producer_id: 1000,
        previous_producer_id: -1,
        next_producer_id: -1,
        producer_epoch: 3,
        timeout_ms: 60_000,
        state: TxnState::Ongoing,
        partitions: Some(vec![("a".into(), vec![0, 2]), ("b".into(), vec![7])]),
        last_update_ms: 5,
        start_ms: 4,
        client_transaction_version: 0,
    };
    assert_eq!(v, want);
    assert_eq!(want.encode(0), b, "encoding gives the same bytes");
}

/// Version 1 (flexible): compact strings and arrays, tagged fields at the end, unknown
/// tags skipped.
#[test]
fn value_v1_decodes_from_hand_laid_bytes() {
    let mut b = vec![0, 1];
    b.extend_from_slice(&9i64.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&1000i32.to_be_bytes());
    b.push(2); // PrepareCommit
    b.push(2); // compact array: 1 topic
    b.extend_from_slice(&[2, b't']); // compact string "t"
    b.push(3); // two partition ids
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&3i32.to_be_bytes());
    b.push(0); // no tagged fields in the topic entry
    b.extend_from_slice(&11i64.to_be_bytes());
    b.extend_from_slice(&10i64.to_be_bytes());
    b.push(3); // three tagged fields
    b.extend_from_slice(&[0, 8]);
    b.extend_from_slice(&8i64.to_be_bytes()); // previous producer id
    b.extend_from_slice(&[2, 2]);
    b.extend_from_slice(&2i16.to_be_bytes()); // client transaction version
    b.extend_from_slice(&[5, 1, 0xff]); // a future tag: skipped
    let v = TxnValue::decode(&b).unwrap();
    assert_eq!(
        v,
        TxnValue {
            producer_id: 9,
            previous_producer_id: 8,
            next_producer_id: -1,
            producer_epoch: 0,
            timeout_ms: 1000,
            state: TxnState::PrepareCommit,
            partitions: Some(vec![("t".into(), vec![1, 3])]),
            last_update_ms: 11,
            start_ms: 10,
            client_transaction_version: 2,
        }
    );
    // Our encoding is Kafka's: the same bytes without the unknown tag.
    let mut want = b.clone();
    want.truncate(want.len() - 3);
    let n = want.len();
    want[n - 15] = 2; // tagged field count
    assert_eq!(v.encode(1), want);
}

#[test]
fn empty_state_writes_a_null_partition_array() {
    let v = TxnValue {
        producer_id: 1,
        previous_producer_id: -1,
        next_producer_id: -1,
        producer_epoch: 0,
        timeout_ms: 1,
        state: TxnState::Empty,
        partitions: None,
        last_update_ms: 0,
        start_ms: -1,
        client_transaction_version: 0,
    };
    let b0 = v.encode(0);
    assert_eq!(&b0[2 + 8 + 2 + 4 + 1..2 + 8 + 2 + 4 + 1 + 4], &[0xff; 4]);
    let b1 = v.encode(1);
    assert_eq!(b1[2 + 8 + 2 + 4 + 1], 0, "compact null array");
    assert_eq!(*b1.last().unwrap(), 0, "no tagged fields at defaults");
    assert_eq!(TxnValue::decode(&b0).unwrap(), v);
    assert_eq!(TxnValue::decode(&b1).unwrap(), v);
}

#[test]
fn values_round_trip_in_every_state_and_version() {
    for state in TxnState::ALL {
        for version in 0..=1 {
            let v = TxnValue {
                producer_id: 77,
                previous_producer_id: if version == 1 { 76 } else { -1 },
                next_producer_id: if version == 1 { 78 } else { -1 },
                producer_epoch: 5,
                timeout_ms: 30_000,
                state,
                partitions: Some(vec![
                    ("topic".into(), vec![0, 1, 2]),
                    ("other".into(), vec![]),
                ]),
                last_update_ms: 123,
                start_ms: 100,
                client_transaction_version: version,
            };
            assert_eq!(
                TxnValue::decode(&v.encode(version)).unwrap(),
                v,
                "{state:?} v{version}"
            );
        }
        assert_eq!(TxnState::from_id(state.id()), Some(state));
        assert_eq!(TxnState::from_name(state.name()), Some(state));
    }
    assert_eq!(TxnState::PrepareEpochFence.id(), 7);
    assert_eq!(TxnState::CompleteAbort.id(), 5);
}

#[test]
fn malformed_values_are_errors() {
    assert!(TxnValue::decode(&[0, 2]).is_err(), "unknown version");
    assert!(TxnValue::decode(&[0, 0, 1]).is_err(), "truncated");
    let mut b = vec![0, 0];
    b.extend_from_slice(&[0; 8 + 2 + 4]);
    b.push(9); // unknown status
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&[0; 16]);
    assert!(TxnValue::decode(&b).is_err());
    let mut b = vec![0, 0];
    b.extend_from_slice(&[0; 8 + 2 + 4]);
    b.push(1);
    b.extend_from_slice(&i32::MAX.to_be_bytes()); // a count the bytes cannot hold
    b.extend_from_slice(&[0; 16]);
    assert!(TxnValue::decode(&b).is_err());
}

#[test]
fn placement_is_kafkas() {
    use crate::{java_hash, partition_for};
    assert_eq!(java_hash("hello"), 99_162_322);
    assert_eq!(partition_for("hello", 50), 99_162_322 % 50);
    assert_eq!(java_hash("polygenelubricants"), i32::MIN);
    assert_eq!(partition_for("polygenelubricants", 50), 0);
    // Negative hashes use the absolute value (Java: "txn-abc".hashCode() == -885233025).
    assert_eq!(java_hash("txn-abc"), -885_233_025);
    assert_eq!(partition_for("txn-abc", 50), 885_233_025 % 50);
}

// ------------------------------------------------------------- the coordinator

struct Ids(i64);

impl ProducerIds for Ids {
    fn next_producer_id(&mut self) -> Result<i64, E> {
        self.0 += 1;
        Ok(self.0)
    }
}

/// No ids left in the block.
struct NoIds;

impl ProducerIds for NoIds {
    fn next_producer_id(&mut self) -> Result<i64, E> {
        Err(E::CoordinatorLoadInProgress)
    }
}

const TIMEOUT: i32 = 60_000;

/// A coordinator owning the single `__transaction_state` partition, with a log of what
/// was made durable.
struct H {
    c: TxnCoordinator,
    ids: Ids,
    now: i64,
    /// The last token number handed out.
    token: u64,
    log: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Appends not yet reported (when `auto_append` is off).
    held: Vec<TxnAppend>,
    auto_append: bool,
    markers: Vec<MarkerWrite>,
    replies: Vec<TxnReply>,
}

fn config() -> TxnConfig {
    TxnConfig {
        state_partitions: 1,
        ..TxnConfig::default()
    }
}

impl H {
    fn new() -> H {
        H::with(config())
    }

    fn with(config: TxnConfig) -> H {
        let mut h = H {
            c: TxnCoordinator::new(config),
            ids: Ids(999),
            now: 1_000,
            token: 0,
            log: Vec::new(),
            held: Vec::new(),
            auto_append: true,
            markers: Vec::new(),
            replies: Vec::new(),
        };
        let mut fx = TxnEffects::default();
        h.c.begin_load(0, 1, &mut fx);
        h.c.loaded(0, h.now, &mut fx);
        h.run(fx);
        h
    }

    /// Executes effects: appends succeed (when `auto_append`), markers wait in
    /// `self.markers`, replies in `self.replies`.
    fn run(&mut self, fx: TxnEffects) {
        self.markers.extend(fx.markers);
        self.replies.extend(fx.replies);
        for a in fx.appends {
            if self.auto_append {
                self.log.push((a.key.clone(), a.value.clone()));
                let mut fx = TxnEffects::default();
                self.c.append_done(a.id, Ok(()), self.now, &mut fx);
                self.run(fx);
            } else {
                self.held.push(a);
            }
        }
    }

    /// Removes the first reply `pick` accepts and returns its answer.
    fn take<R>(&mut self, pick: impl Fn(&TxnReply) -> Option<R>) -> Option<R> {
        let i = self.replies.iter().position(|r| pick(r).is_some())?;
        pick(&self.replies.remove(i))
    }

    fn init_reply(&mut self, t: InitToken) -> Option<Result<ProducerIdAndEpoch, E>> {
        self.take(|r| match r {
            TxnReply::InitProducerId(x, a) if *x == t => Some(*a),
            _ => None,
        })
    }

    fn add_reply(&mut self, t: AddPartitionsToken) -> Option<Result<(), E>> {
        self.take(|r| match r {
            TxnReply::AddPartitions(x, a) if *x == t => Some(*a),
            _ => None,
        })
    }

    fn offsets_reply(&mut self, t: AddOffsetsToken) -> Option<Result<(), E>> {
        self.take(|r| match r {
            TxnReply::AddOffsets(x, a) if *x == t => Some(*a),
            _ => None,
        })
    }

    fn end_reply(&mut self, t: EndToken) -> Option<Result<ProducerIdAndEpoch, E>> {
        self.take(|r| match r {
            TxnReply::EndTxn(x, a) if *x == t => Some(*a),
            _ => None,
        })
    }

    fn next_token(&mut self) -> u64 {
        self.token += 1;
        self.token
    }

    fn init_with(
        &mut self,
        id: &str,
        timeout: i32,
        expected: (i64, i16),
    ) -> Option<Result<ProducerIdAndEpoch, E>> {
        let t = InitToken(self.next_token());
        let mut fx = TxnEffects::default();
        let a = InitArgs {
            transactional_id: Some(id.into()),
            transaction_timeout_ms: timeout,
            producer_id: expected.0,
            producer_epoch: expected.1,
        };
        self.c
            .init_producer_id(t, self.now, a, &mut self.ids, &mut fx);
        self.run(fx);
        self.init_reply(t)
    }

    fn init(&mut self, id: &str) -> Result<ProducerIdAndEpoch, E> {
        match self.init_with(id, TIMEOUT, (-1, -1)) {
            Some(r) => r,
            None => panic!("init not answered"),
        }
    }

    fn add(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        tps: &[(&str, i32)],
    ) -> Option<Result<(), E>> {
        let t = AddPartitionsToken(self.next_token());
        let mut fx = TxnEffects::default();
        let a = AddArgs {
            transactional_id: id.into(),
            producer_id: p.producer_id,
            producer_epoch: p.epoch,
            partitions: tps.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
        };
        self.c.add_partitions(t, self.now, a, &mut fx);
        self.run(fx);
        self.add_reply(t)
    }

    fn add_ok(&mut self, id: &str, p: ProducerIdAndEpoch, tps: &[(&str, i32)]) {
        assert_eq!(self.add(id, p, tps), Some(Ok(())));
    }

    fn end(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        commit: bool,
    ) -> Option<Result<ProducerIdAndEpoch, E>> {
        let t = EndToken(self.next_token());
        let mut fx = TxnEffects::default();
        let a = EndArgs {
            transactional_id: id.into(),
            producer_id: p.producer_id,
            producer_epoch: p.epoch,
            commit,
        };
        self.c.end_txn(t, self.now, a, &mut fx);
        self.run(fx);
        self.end_reply(t)
    }

    fn end_err(&mut self, id: &str, p: ProducerIdAndEpoch, commit: bool) -> E {
        match self.end(id, p, commit) {
            Some(Err(e)) => e,
            other => panic!("EndTxn answered {other:?}"),
        }
    }

    /// Reports every waiting marker as `result`.
    fn markers_done(&mut self, result: MarkerResult) -> Vec<MarkerWrite> {
        let ms = std::mem::take(&mut self.markers);
        for m in &ms {
            for tp in &m.partitions {
                let mut fx = TxnEffects::default();
                self.c.marker_done(m.round, tp, result, self.now, &mut fx);
                self.run(fx);
            }
        }
        ms
    }

    fn tick(&mut self) {
        let mut fx = TxnEffects::default();
        self.c.tick(self.now, &mut fx);
        self.run(fx);
    }

    fn state(&self, id: &str) -> TxnState {
        self.c.describe(id).expect("described").state
    }

    fn last_value(&self) -> TxnValue {
        let (_, v) = self.log.last().expect("a record");
        TxnValue::decode(v.as_ref().expect("not a tombstone")).unwrap()
    }

    /// A new coordinator loaded from this one's durable records only.
    fn reload(&self, coordinator_epoch: i32) -> H {
        let mut h = H {
            c: TxnCoordinator::new(self.c.config.clone()),
            ids: Ids(self.ids.0 + 1000),
            now: self.now,
            token: 1000,
            log: self.log.clone(),
            held: Vec::new(),
            auto_append: true,
            markers: Vec::new(),
            replies: Vec::new(),
        };
        let mut fx = TxnEffects::default();
        h.c.begin_load(0, coordinator_epoch, &mut fx);
        for (k, v) in &self.log {
            h.c.load_record(k, v.as_deref()).unwrap();
        }
        h.c.loaded(0, h.now, &mut fx);
        h.run(fx);
        h
    }
}

fn pe(producer_id: i64, epoch: i16) -> ProducerIdAndEpoch {
    ProducerIdAndEpoch { producer_id, epoch }
}

#[test]
fn init_of_a_new_id_gives_a_new_producer_at_epoch_0_once_durable() {
    let mut h = H::new();
    h.auto_append = false;
    assert_eq!(
        h.init_with("t", TIMEOUT, (-1, -1)),
        None,
        "no answer before the record is durable"
    );
    assert_eq!(
        h.c.describe("t"),
        Err(E::TransactionalIdNotFound),
        "nothing durable yet"
    );
    assert_eq!(
        h.init_with("t", TIMEOUT, (-1, -1)),
        Some(Err(E::ConcurrentTransactions))
    );
    let a = h.held.pop().unwrap();
    assert_eq!((a.partition, a.key.clone()), (0, encode_key("t")));
    let v = TxnValue::decode(a.value.as_ref().unwrap()).unwrap();
    assert_eq!(
        (v.producer_id, v.producer_epoch, v.state),
        (1000, 0, TxnState::Empty)
    );
    assert_eq!(
        (v.partitions, v.start_ms, v.timeout_ms),
        (None, -1, TIMEOUT)
    );
    let mut fx = TxnEffects::default();
    h.c.append_done(a.id, Ok(()), h.now, &mut fx);
    h.run(fx);
    assert_eq!(h.init_reply(InitToken(1)), Some(Ok(pe(1000, 0))));
    let d = h.c.describe("t").unwrap();
    assert_eq!(
        (d.state, d.producer_id, d.producer_epoch),
        (TxnState::Empty, 1000, 0)
    );
}

#[test]
fn init_again_bumps_the_epoch_of_the_same_producer_id() {
    let mut h = H::new();
    assert_eq!(h.init("t"), Ok(pe(1000, 0)));
    assert_eq!(h.init("t"), Ok(pe(1000, 1)));
    assert_eq!(h.init("t"), Ok(pe(1000, 2)));
    assert_eq!(h.last_value().producer_epoch, 2);
}

#[test]
fn init_validates_its_arguments_as_kafka() {
    let mut h = H::new();
    let r = |x| Some(Err(x));
    assert_eq!(
        h.init_with("t", 0, (-1, -1)),
        r(E::InvalidTransactionTimeout)
    );
    assert_eq!(
        h.init_with("t", 900_001, (-1, -1)),
        r(E::InvalidTransactionTimeout)
    );
    assert_eq!(h.init_with("t", 900_000, (-1, -1)), Some(Ok(pe(1000, 0))));
    assert_eq!(h.init_with("", TIMEOUT, (-1, -1)), r(E::InvalidRequest));
    assert_eq!(h.init_with("t", TIMEOUT, (5, -1)), r(E::InvalidRequest));
    assert_eq!(h.init_with("t", TIMEOUT, (-1, 5)), r(E::InvalidRequest));
    // No transactional id: an idempotent producer, nothing written.
    let before = h.log.len();
    let mut fx = TxnEffects::default();
    let a = InitArgs {
        transactional_id: None,
        transaction_timeout_ms: 0,
        producer_id: -1,
        producer_epoch: -1,
    };
    h.c.init_producer_id(InitToken(77), h.now, a.clone(), &mut h.ids, &mut fx);
    assert_eq!(
        fx.replies,
        vec![TxnReply::InitProducerId(InitToken(77), Ok(pe(1001, 0)))]
    );
    assert!(fx.appends.is_empty());
    assert_eq!(h.log.len(), before);
    let mut fx = TxnEffects::default();
    h.c.init_producer_id(InitToken(78), h.now, a, &mut NoIds, &mut fx);
    assert_eq!(
        fx.replies,
        vec![TxnReply::InitProducerId(
            InitToken(78),
            Err(E::CoordinatorLoadInProgress)
        )]
    );
}

#[test]
fn ids_of_partitions_not_owned_or_loading_are_refused() {
    let mut c = TxnCoordinator::new(TxnConfig {
        state_partitions: 2,
        ..TxnConfig::default()
    });
    let p = c.partition_of("t");
    let mut fx = TxnEffects::default();
    let a = InitArgs {
        transactional_id: Some("t".into()),
        transaction_timeout_ms: TIMEOUT,
        producer_id: -1,
        producer_epoch: -1,
    };
    c.init_producer_id(InitToken(1), 0, a.clone(), &mut Ids(0), &mut fx);
    c.begin_load(p, 3, &mut fx);
    c.init_producer_id(InitToken(2), 0, a.clone(), &mut Ids(0), &mut fx);
    assert_eq!(c.describe("t"), Err(E::CoordinatorLoadInProgress));
    assert_eq!(
        c.list(0, &ListFilter::default()),
        Err(E::CoordinatorLoadInProgress)
    );
    assert_eq!(
        c.verify_partitions("t", 1, 0, &[]),
        Err(E::CoordinatorLoadInProgress)
    );
    c.loaded(p, 0, &mut fx);
    c.init_producer_id(InitToken(3), 0, a, &mut Ids(0), &mut fx);
    assert_eq!(
        fx.replies,
        vec![
            TxnReply::InitProducerId(InitToken(1), Err(E::NotCoordinator)),
            TxnReply::InitProducerId(InitToken(2), Err(E::CoordinatorLoadInProgress)),
        ]
    );
    assert_eq!(fx.appends.len(), 1, "served once loaded");
    assert_eq!(fx.appends[0].partition, p);
}

/// An append queued before its partition was unloaded and loaded again (the broker
/// lost and regained the partition) must not be written after the reload replayed
/// the log: the coordinator no longer knows it, so the shell drops it.
#[test]
fn an_append_queued_before_a_reload_is_no_longer_writable() {
    let mut c = TxnCoordinator::new(config());
    let mut fx = TxnEffects::default();
    c.begin_load(0, 1, &mut fx);
    c.loaded(0, 0, &mut fx);
    let a = InitArgs {
        transactional_id: Some("t".into()),
        transaction_timeout_ms: TIMEOUT,
        producer_id: -1,
        producer_epoch: -1,
    };
    c.init_producer_id(InitToken(1), 0, a, &mut Ids(0), &mut fx);
    let queued = fx.appends.pop().expect("the init's record");
    assert_eq!(c.append_epoch(queued.id), Some(1));
    // Unloaded, then loaded again in a newer epoch.
    let mut fx = TxnEffects::default();
    c.unload(0, &mut fx);
    c.begin_load(0, 2, &mut fx);
    c.loaded(0, 0, &mut fx);
    assert_eq!(c.append_epoch(queued.id), None);
    assert_eq!(
        fx.replies,
        vec![TxnReply::InitProducerId(
            InitToken(1),
            Err(E::NotCoordinator)
        )]
    );
}

#[test]
fn commit_writes_prepare_then_markers_then_complete() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    h.now += 10;
    h.add_ok("t", p, &[("a", 0), ("b", 1)]);
    let v = h.last_value();
    assert_eq!(v.state, TxnState::Ongoing);
    assert_eq!(v.start_ms, 1_010);
    assert_eq!(
        v.partitions,
        Some(vec![("a".into(), vec![0]), ("b".into(), vec![1])])
    );
    h.now += 10;
    assert_eq!(h.end("t", p, true), Some(Ok(p)));
    assert_eq!(h.last_value().state, TxnState::PrepareCommit);
    assert_eq!(h.markers.len(), 1);
    let m = h.markers[0].clone();
    assert_eq!(
        (
            m.producer_id,
            m.producer_epoch,
            m.coordinator_epoch,
            m.commit
        ),
        (1000, 0, 1, true)
    );
    assert_eq!(
        m.partitions,
        vec![("a".to_string(), 0), ("b".to_string(), 1)]
    );
    // One partition written: still preparing, Describe shows what is left.
    let mut fx = TxnEffects::default();
    h.c.marker_done(
        m.round,
        &("a".into(), 0),
        MarkerResult::Written,
        h.now,
        &mut fx,
    );
    assert!(fx.appends.is_empty());
    let d = h.c.describe("t").unwrap();
    assert_eq!(
        (d.state, d.topics),
        (TxnState::PrepareCommit, vec![("b".into(), vec![1])])
    );
    h.c.marker_done(
        m.round,
        &("b".into(), 1),
        MarkerResult::Written,
        h.now,
        &mut fx,
    );
    h.markers.clear();
    h.run(fx);
    let v = h.last_value();
    assert_eq!(
        (v.state, v.partitions.clone()),
        (TxnState::CompleteCommit, Some(vec![]))
    );
    assert_eq!((v.producer_epoch, v.start_ms), (0, 1_010));
    // The next transaction starts from CompleteCommit.
    h.now += 10;
    h.add_ok("t", p, &[("c", 0)]);
    assert_eq!(h.last_value().start_ms, 1_030);
    assert_eq!(h.end("t", p, false), Some(Ok(p)));
    assert!(!h.markers[0].commit);
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.state("t"), TxnState::CompleteAbort);
}

#[test]
fn add_partitions_errors_are_kafkas() {
    let mut h = H::new();
    let err = |x| Some(Err(x));
    assert_eq!(
        h.add("nobody", pe(1, 0), &[("a", 0)]),
        err(E::InvalidProducerIdMapping)
    );
    assert_eq!(h.add("", pe(1, 0), &[("a", 0)]), err(E::InvalidRequest));
    let p = h.init("t").unwrap();
    assert_eq!(
        h.add("t", pe(5, 0), &[("a", 0)]),
        err(E::InvalidProducerIdMapping)
    );
    assert_eq!(
        h.add("t", pe(p.producer_id, 1), &[("a", 0)]),
        err(E::ProducerFenced)
    );
    h.add_ok("t", p, &[("a", 0)]);
    // Already in the transaction: answered at once, nothing written.
    let n = h.log.len();
    h.add_ok("t", p, &[("a", 0)]);
    assert_eq!(h.log.len(), n);
    // While a transition is pending.
    h.auto_append = false;
    assert_eq!(h.add("t", p, &[("b", 0)]), None);
    assert_eq!(h.add("t", p, &[("c", 0)]), err(E::ConcurrentTransactions));
    let a = h.held.pop().unwrap();
    let mut fx = TxnEffects::default();
    h.c.append_done(a.id, Ok(()), h.now, &mut fx);
    h.auto_append = true;
    h.run(fx);
    // While the markers are written.
    assert_eq!(h.end("t", p, true), Some(Ok(p)));
    assert_eq!(h.add("t", p, &[("a", 0)]), err(E::ConcurrentTransactions));
    h.markers_done(MarkerResult::Written);
    h.add_ok("t", p, &[("a", 0)]);
}

#[test]
fn add_offsets_adds_the_groups_offsets_partition() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    let t = AddOffsetsToken(h.next_token());
    let mut fx = TxnEffects::default();
    let a = AddOffsetsArgs {
        transactional_id: "t".into(),
        producer_id: p.producer_id,
        producer_epoch: p.epoch,
        group_id: "hello".into(),
    };
    h.c.add_offsets(t, h.now, a, &mut fx);
    h.run(fx);
    assert_eq!(h.offsets_reply(t), Some(Ok(())));
    let d = h.c.describe("t").unwrap();
    assert_eq!(
        d.topics,
        vec![(
            OFFSETS_TOPIC.to_string(),
            vec![crate::partition_for("hello", 50)]
        )]
    );
}

/// librdkafka begins the next transaction right after a commit's answer, sends
/// AddPartitionsToTxn (refused while the commit's markers are written) and, on an abort,
/// EndTxn without waiting for that answer: the abort of that empty transaction succeeds
/// once the commit completed. Without a refused AddPartitionsToTxn in between, an abort
/// after a commit is still Kafka's INVALID_TXN_STATE.
#[test]
fn an_abort_of_a_transaction_whose_partitions_were_all_refused_succeeds() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]);
    assert_eq!(h.end("t", p, true), Some(Ok(p)));
    assert_eq!(
        h.add("t", p, &[("a", 0)]),
        Some(Err(E::ConcurrentTransactions))
    );
    assert_eq!(h.end_err("t", p, false), E::ConcurrentTransactions);
    h.markers_done(MarkerResult::Written);
    let records = h.log.len();
    assert_eq!(h.end("t", p, false), Some(Ok(p)));
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
    assert_eq!(
        (h.log.len(), h.markers.len()),
        (records, 0),
        "nothing written"
    );
    // Once: a second abort has no refused request behind it.
    assert_eq!(h.end_err("t", p, false), E::InvalidTxnState);
    // The next transaction runs as ever.
    h.add_ok("t", p, &[("a", 0)]);
    assert_eq!(h.end("t", p, false), Some(Ok(p)));
    h.markers_done(MarkerResult::Written);
    // A refused add while the transaction is open (a duplicate) does not count.
    h.add_ok("t", p, &[("a", 0)]);
    assert_eq!(h.end("t", p, true), Some(Ok(p)));
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.end("t", p, true), Some(Ok(p)), "a retried commit");
    assert_eq!(h.end_err("t", p, false), E::InvalidTxnState);
    // Control: commit, markers done, abort with no refused add in between.
    h.add_ok("t", p, &[("a", 0)]);
    assert_eq!(h.end("t", p, true), Some(Ok(p)));
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.end_err("t", p, false), E::InvalidTxnState);
}

#[test]
fn end_txn_errors_and_retries_are_kafkas() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    assert_eq!(h.end_err("nobody", p, true), E::InvalidProducerIdMapping);
    assert_eq!(
        h.end_err("t", p, true),
        E::InvalidTxnState,
        "no transaction in Empty"
    );
    assert_eq!(h.end_err("t", pe(9, 0), true), E::InvalidProducerIdMapping);
    assert_eq!(
        h.end_err("t", pe(p.producer_id, 3), true),
        E::ProducerFenced
    );
    h.add_ok("t", p, &[("a", 0)]);
    assert_eq!(h.end("t", p, true), Some(Ok(p)));
    // Markers in flight: any EndTxn waits (Kafka's pending state).
    assert_eq!(h.end_err("t", p, true), E::ConcurrentTransactions);
    assert_eq!(h.end_err("t", p, false), E::ConcurrentTransactions);
    h.markers_done(MarkerResult::Written);
    // Completed: a retried commit succeeds, an abort is refused.
    assert_eq!(h.end("t", p, true), Some(Ok(p)));
    assert_eq!(h.end_err("t", p, false), E::InvalidTxnState);
    h.add_ok("t", p, &[("a", 0)]);
    assert_eq!(h.end("t", p, false), Some(Ok(p)));
    assert_eq!(h.end_err("t", p, true), E::ConcurrentTransactions);
    assert_eq!(h.end_err("t", p, false), E::ConcurrentTransactions);
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.end("t", p, false), Some(Ok(p)));
    assert_eq!(h.end_err("t", p, true), E::InvalidTxnState);
}

#[test]
fn init_during_an_ongoing_transaction_fences_it_first() {
    let mut h = H::new();
    let old = h.init("t").unwrap();
    h.add_ok("t", old, &[("a", 0)]);
    assert_eq!(h.init("t"), Err(E::ConcurrentTransactions));
    let v = h.last_value();
    assert_eq!((v.state, v.producer_epoch), (TxnState::PrepareAbort, 1));
    let m = h.markers[0].clone();
    assert_eq!(
        (m.commit, m.producer_epoch),
        (false, 1),
        "abort at the bumped epoch"
    );
    // Until the abort completes the new producer waits; the old one is fenced.
    assert_eq!(h.init("t"), Err(E::ConcurrentTransactions));
    assert_eq!(h.end_err("t", old, true), E::ProducerFenced);
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.state("t"), TxnState::CompleteAbort);
    assert_eq!(h.init("t"), Ok(pe(1000, 2)));
    assert_eq!(h.add("t", old, &[("a", 0)]), Some(Err(E::ProducerFenced)));
}

#[test]
fn timed_out_transactions_are_aborted_with_a_bumped_epoch() {
    let mut h = H::with(TxnConfig {
        abort_check_interval_ms: 1_000,
        ..config()
    });
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]);
    let start = h.now;
    h.now = start + i64::from(TIMEOUT);
    h.tick();
    assert_eq!(h.state("t"), TxnState::Ongoing, "not past the timeout yet");
    h.now += 1_000;
    h.tick();
    let v = h.last_value();
    assert_eq!((v.state, v.producer_epoch), (TxnState::PrepareAbort, 1));
    assert!(!h.markers[0].commit);
    assert_eq!(h.markers[0].producer_epoch, 1);
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.state("t"), TxnState::CompleteAbort);
    assert_eq!(h.end_err("t", p, true), E::ProducerFenced);
    // A KIP-360 client retrying with its fenced epoch is fenced too (the last epoch
    // was forgotten by the fence).
    let r = h.init_with("t", TIMEOUT, (p.producer_id, p.epoch));
    assert_eq!(r, Some(Err(E::ProducerFenced)));
    assert_eq!(h.init("t"), Ok(pe(1000, 2)));
}

#[test]
fn timeout_checks_run_at_the_abort_interval() {
    let mut h = H::new(); // Kafka's 10 s interval
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]); // started at 1 000, times out after 61 000
    h.now = 55_000;
    h.tick(); // checks now, and next at 65 000
    h.now = 61_001;
    h.tick();
    assert_eq!(
        h.state("t"),
        TxnState::Ongoing,
        "timed out, but no check is due"
    );
    h.now = 65_000;
    h.tick();
    assert_eq!(h.state("t"), TxnState::PrepareAbort);
}

#[test]
fn an_exhausted_epoch_rotates_to_a_new_producer_id() {
    let mut h = H::new();
    // A transactional id at the last epoch Kafka hands out.
    let v = TxnValue {
        producer_id: 50,
        previous_producer_id: -1,
        next_producer_id: -1,
        producer_epoch: i16::MAX - 1,
        timeout_ms: TIMEOUT,
        state: TxnState::CompleteCommit,
        partitions: Some(vec![]),
        last_update_ms: 0,
        start_ms: 0,
        client_transaction_version: 0,
    };
    h.log.push((encode_key("t"), Some(v.encode(0))));
    let mut h = h.reload(2);
    assert!(epoch_exhausted(i16::MAX - 1));
    // A KIP-360 client at the exhausted epoch: new id, and a retry gets the same answer.
    let r = h.init_with("t", TIMEOUT, (50, i16::MAX - 1));
    let new = match r {
        Some(Ok(p)) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!(new.epoch, 0);
    assert_ne!(new.producer_id, 50);
    let r = h.init_with("t", TIMEOUT, (50, i16::MAX - 1));
    assert_eq!(r, Some(Ok(new)), "a retry of the rotation");
    assert_eq!(h.init("t"), Ok(pe(new.producer_id, 1)));
}

#[test]
fn kip_360_expected_epochs() {
    let mut h = H::new();
    let p0 = h.init("t").unwrap();
    // The producer recovers with its current epoch: bumped.
    let r = h.init_with("t", TIMEOUT, (p0.producer_id, p0.epoch));
    assert_eq!(r, Some(Ok(pe(1000, 1))));
    // It retries that call (lost answer): the same epoch again.
    let r = h.init_with("t", TIMEOUT, (p0.producer_id, p0.epoch));
    assert_eq!(r, Some(Ok(pe(1000, 1))));
    // A stale epoch, or another producer id: fenced.
    let r = h.init_with("t", TIMEOUT, (p0.producer_id, 7));
    assert_eq!(r, Some(Err(E::ProducerFenced)));
    let r = h.init_with("t", TIMEOUT, (4242, 1));
    assert_eq!(r, Some(Err(E::ProducerFenced)));
}

#[test]
fn a_failed_append_rolls_the_transition_back() {
    let mut h = H::new();
    h.auto_append = false;
    let fail = |h: &mut H, e: E| {
        let a = h.held.pop().expect("an append");
        let mut fx = TxnEffects::default();
        h.c.append_done(a.id, Err(e), h.now, &mut fx);
        h.run(fx);
    };
    // The first record of a new id: the id is forgotten.
    assert_eq!(h.init_with("t", TIMEOUT, (-1, -1)), None);
    fail(&mut h, E::NotEnoughReplicas);
    assert_eq!(
        h.init_reply(InitToken(1)),
        Some(Err(E::CoordinatorNotAvailable))
    );
    assert_eq!(h.c.describe("t"), Err(E::TransactionalIdNotFound));
    h.auto_append = true;
    let p = h.init("t").unwrap();
    h.auto_append = false;
    assert_eq!(h.add("t", p, &[("a", 0)]), None);
    fail(&mut h, E::NotLeaderOrFollower);
    let t = AddPartitionsToken(h.token);
    assert_eq!(h.add_reply(t), Some(Err(E::NotCoordinator)));
    assert_eq!(h.state("t"), TxnState::Empty);
    h.auto_append = true;
    h.add_ok("t", p, &[("a", 0)]);
    h.auto_append = false;
    assert_eq!(h.end("t", p, true), None);
    fail(&mut h, E::MessageTooLarge);
    let t = EndToken(h.token);
    assert_eq!(h.end_reply(t), Some(Err(E::UnknownServerError)));
    assert_eq!(h.state("t"), TxnState::Ongoing);
    assert!(
        h.markers.is_empty(),
        "no markers for a commit that is not durable"
    );
    // The fence of an InitProducerId: nothing bumped, the next try bumps once.
    assert_eq!(h.init_with("t", TIMEOUT, (-1, -1)), None);
    fail(&mut h, E::RequestTimedOut);
    let t = InitToken(h.token);
    assert_eq!(h.init_reply(t), Some(Err(E::CoordinatorNotAvailable)));
    assert_eq!(h.c.describe("t").unwrap().producer_epoch, 0);
    h.auto_append = true;
    assert_eq!(h.init("t"), Err(E::ConcurrentTransactions));
    assert_eq!(h.c.describe("t").unwrap().producer_epoch, 1);
}

#[test]
fn append_errors_map_as_kafka() {
    assert_eq!(
        append_error(E::UnknownTopicOrPartition),
        E::CoordinatorNotAvailable
    );
    assert_eq!(
        append_error(E::NotEnoughReplicasAfterAppend),
        E::CoordinatorNotAvailable
    );
    assert_eq!(append_error(E::RequestTimedOut), E::CoordinatorNotAvailable);
    assert_eq!(append_error(E::KafkaStorageError), E::NotCoordinator);
    assert_eq!(append_error(E::RecordListTooLarge), E::UnknownServerError);
    assert_eq!(
        append_error(E::CoordinatorLoadInProgress),
        E::CoordinatorLoadInProgress
    );
}

#[test]
fn failed_markers_are_retried_at_the_next_tick_and_gone_partitions_skipped() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0), ("b", 0), ("gone", 0)]);
    h.end("t", p, true);
    let m = h.markers.pop().unwrap();
    let mut fx = TxnEffects::default();
    h.c.marker_done(
        m.round,
        &("a".into(), 0),
        MarkerResult::Written,
        h.now,
        &mut fx,
    );
    h.c.marker_done(
        m.round,
        &("a".into(), 0),
        MarkerResult::Written,
        h.now,
        &mut fx,
    ); // a duplicate report
    h.c.marker_done(
        m.round,
        &("gone".into(), 0),
        MarkerResult::Gone,
        h.now,
        &mut fx,
    );
    h.c.marker_done(
        m.round,
        &("b".into(), 0),
        MarkerResult::Failed(E::NotLeaderOrFollower),
        h.now,
        &mut fx,
    );
    assert!(fx.appends.is_empty() && fx.markers.is_empty());
    h.tick();
    assert_eq!(h.markers.len(), 1);
    assert_eq!(h.markers[0].round, m.round);
    assert_eq!(h.markers[0].partitions, vec![("b".to_string(), 0)]);
    h.tick();
    assert_eq!(h.markers.len(), 1, "in flight: not re-sent");
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
}

#[test]
fn a_fenced_marker_stops_the_round() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]);
    h.end("t", p, true);
    h.markers_done(MarkerResult::Failed(E::TransactionCoordinatorFenced));
    h.tick();
    assert!(h.markers.is_empty());
    assert_eq!(
        h.state("t"),
        TxnState::PrepareCommit,
        "left for the next coordinator"
    );
    // Reloaded, the coordinator sends the markers again.
    let mut h = h.reload(2);
    assert_eq!(h.markers.len(), 1);
    assert_eq!(h.markers[0].coordinator_epoch, 2);
    h.markers_done(MarkerResult::Written);
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
}

#[test]
fn a_failed_completion_is_appended_again_at_the_next_tick() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]);
    h.end("t", p, true);
    h.auto_append = false;
    h.markers_done(MarkerResult::Written);
    let a = h.held.pop().unwrap();
    let mut fx = TxnEffects::default();
    h.c.append_done(a.id, Err(E::NotEnoughReplicas), h.now, &mut fx);
    assert!(fx.replies.is_empty());
    assert_eq!(h.state("t"), TxnState::PrepareCommit);
    h.auto_append = true;
    h.tick();
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
    assert!(h.markers.is_empty(), "markers are not written again");
}

#[test]
fn reload_completes_prepared_transactions_and_keeps_ongoing_ones() {
    let mut h = H::new();
    let p = h.init("a").unwrap();
    h.add_ok("a", p, &[("x", 0), ("y", 0)]);
    h.end("a", p, true);
    h.markers.clear(); // the coordinator dies before any marker is written
    let q = h.init("b").unwrap();
    h.add_ok("b", q, &[("z", 3)]);
    let mut r = h.reload(2);
    assert_eq!(r.markers.len(), 1);
    let m = r.markers[0].clone();
    assert_eq!(
        (m.transactional_id.as_str(), m.commit, m.coordinator_epoch),
        ("a", true, 2)
    );
    assert_eq!(m.partitions.len(), 2);
    assert_eq!(r.state("b"), TxnState::Ongoing);
    assert_eq!(
        r.c.describe("b").unwrap().topics,
        vec![("z".into(), vec![3])]
    );
    r.markers_done(MarkerResult::Written);
    assert_eq!(r.state("a"), TxnState::CompleteCommit);
    r.add_ok("b", q, &[("z", 3)]);
    assert_eq!(r.end("b", q, true), Some(Ok(q)));
}

#[test]
fn unload_answers_waiting_requests_and_ignores_late_reports() {
    let mut h = H::new();
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]);
    h.auto_append = false;
    assert_eq!(h.end("t", p, true), None);
    let a = h.held.pop().unwrap();
    let mut fx = TxnEffects::default();
    h.c.unload(0, &mut fx);
    assert_eq!(
        fx.replies,
        vec![TxnReply::EndTxn(EndToken(h.token), Err(E::NotCoordinator))]
    );
    let mut fx = TxnEffects::default();
    h.c.append_done(a.id, Ok(()), h.now, &mut fx);
    h.c.marker_done(1, &("a".into(), 0), MarkerResult::Written, h.now, &mut fx);
    assert!(fx.replies.is_empty() && fx.appends.is_empty() && fx.markers.is_empty());
    assert_eq!(h.c.describe("t"), Err(E::NotCoordinator));
    assert_eq!(h.c.partition_loading(0), None);
}

#[test]
fn idle_transactional_ids_expire_with_a_tombstone() {
    let mut h = H::with(TxnConfig {
        id_expiration_ms: 10_000,
        expiry_check_interval_ms: 1_000,
        ..config()
    });
    let p = h.init("idle").unwrap();
    let q = h.init("busy").unwrap();
    h.add_ok("busy", q, &[("a", 0)]);
    h.tick();
    h.now += 10_000;
    h.tick();
    let (k, v) = h.log.last().unwrap().clone();
    assert_eq!((decode_key(&k).unwrap().as_str(), v), ("idle", None));
    assert_eq!(h.c.describe("idle"), Err(E::TransactionalIdNotFound));
    assert_eq!(
        h.state("busy"),
        TxnState::Ongoing,
        "an open transaction never expires"
    );
    // A reload drops it too; a new InitProducerId starts from scratch.
    let mut r = h.reload(2);
    assert_eq!(r.c.describe("idle"), Err(E::TransactionalIdNotFound));
    let p2 = r.init("idle").unwrap();
    assert_ne!(p2.producer_id, p.producer_id);
    assert_eq!(p2.epoch, 0);
}

#[test]
fn verify_only_add_partitions_answers_membership() {
    let mut h = H::new();
    assert_eq!(
        h.c.verify_partitions("t", 1, 0, &[("a".into(), 0)]),
        Err(E::InvalidProducerIdMapping)
    );
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]);
    let r =
        h.c.verify_partitions(
            "t",
            p.producer_id,
            p.epoch,
            &[("a".into(), 0), ("a".into(), 1)],
        )
        .unwrap();
    assert_eq!(
        r,
        vec![
            (("a".to_string(), 0), Ok(())),
            (("a".to_string(), 1), Err(E::TransactionAbortable))
        ]
    );
    assert_eq!(
        h.c.verify_partitions("t", 5, 0, &[]),
        Err(E::InvalidProducerIdMapping)
    );
    assert_eq!(
        h.c.verify_partitions("t", p.producer_id, 9, &[]),
        Err(E::ProducerFenced)
    );
    assert_eq!(h.c.verify_partitions("", 1, 0, &[]), Err(E::InvalidRequest));
    h.end("t", p, true);
    assert_eq!(
        h.c.verify_partitions("t", p.producer_id, p.epoch, &[("a".into(), 0)]),
        Err(E::ConcurrentTransactions)
    );
    h.markers_done(MarkerResult::Written);
    let r =
        h.c.verify_partitions("t", p.producer_id, p.epoch, &[("a".into(), 0)]);
    assert_eq!(
        r.unwrap()[0].1,
        Err(E::TransactionAbortable),
        "the transaction ended"
    );
}

#[test]
fn describe_and_list_show_what_kafka_shows() {
    let mut h = H::new();
    assert_eq!(h.c.describe(""), Err(E::InvalidRequest));
    let a = h.init("a").unwrap();
    let b = h.init("b").unwrap();
    h.now += 100;
    h.add_ok("b", b, &[("t", 1), ("t", 0), ("s", 2)]);
    let d = h.c.describe("b").unwrap();
    assert_eq!(
        d,
        TxnDescription {
            transactional_id: "b".into(),
            state: TxnState::Ongoing,
            producer_id: b.producer_id,
            producer_epoch: 0,
            timeout_ms: TIMEOUT,
            start_ms: h.now,
            topics: vec![("s".into(), vec![2]), ("t".into(), vec![0, 1])],
        }
    );
    let all = h.c.list(h.now, &ListFilter::default()).unwrap();
    assert_eq!(
        all.transactions,
        vec![
            ("a".to_string(), a.producer_id, TxnState::Empty),
            ("b".to_string(), b.producer_id, TxnState::Ongoing)
        ]
    );
    let f = ListFilter {
        states: vec!["Ongoing".into(), "Nonsense".into()],
        ..ListFilter::default()
    };
    let r = h.c.list(h.now, &f).unwrap();
    assert_eq!(r.transactions.len(), 1);
    assert_eq!(r.unknown_state_filters, vec!["Nonsense".to_string()]);
    let f = ListFilter {
        producer_ids: vec![a.producer_id],
        ..ListFilter::default()
    };
    assert_eq!(h.c.list(h.now, &f).unwrap().transactions[0].0, "a");
    // Running longer than 50 ms: b started 0 ms ago; a never started (counts as long).
    let f = ListFilter {
        min_duration_ms: 50,
        ..ListFilter::default()
    };
    assert_eq!(h.c.list(h.now, &f).unwrap().transactions[0].0, "a");
    assert_eq!(h.c.list(h.now, &f).unwrap().transactions.len(), 1);
}

#[test]
fn records_written_are_the_state_reloaded() {
    // Every record the coordinator writes reloads into the same Describe view.
    let mut h = H::with(TxnConfig {
        value_version: 1,
        ..config()
    });
    let p = h.init("t").unwrap();
    h.add_ok("t", p, &[("a", 0)]);
    let before = h.c.describe("t").unwrap();
    let r = h.reload(2);
    assert_eq!(r.c.describe("t").unwrap(), before);
    assert_eq!(
        h.log[0].1.as_ref().unwrap()[..2],
        [0, 1],
        "version 1 values"
    );
}

// --------------------------------------------------------- the group side

mod group_side {
    use bytes::Bytes;
    use kafka_protocol::error::ResponseError as E;

    use crate::group::*;
    use crate::records::{GroupValue, Key, MemberValue};

    const PID: i64 = 42;

    fn c(d: i64) -> Committed {
        Committed {
            offset: d,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp_ms: 0,
        }
    }

    fn tp(p: i32) -> (String, i32) {
        ("t".to_string(), p)
    }

    /// Group "g", Stable at generation 3 with member "m1" (static "i1").
    fn stable() -> Coordinator {
        let mut co = Coordinator::new(CoordinatorConfig::default());
        let v = GroupValue {
            protocol_type: "consumer".into(),
            generation: 3,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            state_timestamp_ms: 0,
            members: vec![MemberValue {
                member_id: "m1".into(),
                instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "h".into(),
                rebalance_timeout_ms: 10_000,
                session_timeout_ms: 10_000,
                subscription: Bytes::new(),
                assignment: Bytes::new(),
            }],
        };
        let key = Key::Group { group: "g".into() }.encode();
        co.load_record(0, &key, Some(&v.encode())).unwrap();
        assert_eq!(co.group("g").unwrap().state, GroupState::Stable);
        co
    }

    fn args(
        gen: i32,
        member: &str,
        instance: Option<&str>,
        offsets: &[(i32, i64)],
    ) -> TxnCommitArgs {
        TxnCommitArgs {
            group_id: "g".into(),
            producer_id: PID,
            producer_epoch: 2,
            generation: gen,
            member_id: member.into(),
            instance_id: instance.map(String::from),
            offsets: offsets.iter().map(|(p, o)| (tp(*p), c(*o))).collect(),
        }
    }

    fn fetch(co: &Coordinator, p: i32, stable: bool) -> Result<Option<i64>, E> {
        let r = co.fetch_offsets_stable("g", Some(&[tp(p)]), stable);
        r[0].1.clone().map(|c| c.map(|c| c.offset))
    }

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn txn_offsets_wait_for_the_commit_marker() {
        let mut co = stable();
        let plan = co.plan_txn_commit(0, args(3, "m1", Some("i1"), &[(0, 10), (1, 11)]));
        assert_eq!((plan.producer_id, plan.producer_epoch), (PID, 2));
        assert_eq!(plan.records.len(), 2);
        assert!(plan.results.iter().all(|(_, r)| r.is_ok()));
        // Pending from the start: a stable fetch refuses, a plain fetch shows nothing.
        assert_eq!(fetch(&co, 0, true), Err(E::UnstableOffsetCommit));
        assert_eq!(fetch(&co, 0, false), Ok(None));
        assert_eq!(fetch(&co, 2, true), Ok(None), "other partitions are stable");
        co.apply_txn_commit(plan);
        assert_eq!(fetch(&co, 1, true), Err(E::UnstableOffsetCommit));
        co.complete_txn(PID, true, all);
        assert_eq!(fetch(&co, 0, true), Ok(Some(10)));
        assert_eq!(fetch(&co, 1, true), Ok(Some(11)));
        assert!(co.group("g").unwrap().txn_producers().is_empty());
    }

    #[test]
    fn an_abort_marker_drops_the_txn_offsets() {
        let mut co = stable();
        let plan = co.plan_txn_commit(0, args(3, "m1", None, &[(0, 10)]));
        co.apply_txn_commit(plan);
        co.complete_txn(PID + 1, true, all);
        assert_eq!(
            fetch(&co, 0, true),
            Err(E::UnstableOffsetCommit),
            "another producer's marker"
        );
        co.complete_txn(PID, true, |g| g != "g");
        assert_eq!(
            fetch(&co, 0, true),
            Err(E::UnstableOffsetCommit),
            "another partition's marker"
        );
        co.complete_txn(PID, false, all);
        assert_eq!(fetch(&co, 0, true), Ok(None));
    }

    #[test]
    fn kip_447_fencing_by_generation_member_and_instance() {
        let mut co = stable();
        let err = |co: &mut Coordinator, a| {
            let plan = co.plan_txn_commit(0, a);
            assert_eq!(plan.records.is_empty(), plan.results[0].1.is_err());
            plan.results[0].1
        };
        assert_eq!(
            err(&mut co, args(2, "m1", None, &[(0, 1)])),
            Err(E::IllegalGeneration)
        );
        assert_eq!(
            err(&mut co, args(3, "m9", None, &[(0, 1)])),
            Err(E::UnknownMemberId)
        );
        assert_eq!(
            err(&mut co, args(3, "m9", Some("i1"), &[(0, 1)])),
            Err(E::FencedInstanceId)
        );
        assert_eq!(
            err(&mut co, args(3, "m1", Some("i9"), &[(0, 1)])),
            Err(E::UnknownMemberId)
        );
        assert_eq!(
            err(&mut co, args(-1, "m1", None, &[(0, 1)])),
            Err(E::IllegalGeneration)
        );
        assert_eq!(
            fetch(&co, 0, true),
            Ok(None),
            "refused commits leave nothing pending"
        );
        // Clients before KIP-447 send no member information: accepted.
        assert_eq!(err(&mut co, args(-1, "", None, &[(0, 1)])), Ok(()));
        // A group nobody knows is created for the commit, as Kafka.
        let mut fresh = Coordinator::new(CoordinatorConfig::default());
        assert_eq!(err(&mut fresh, args(-1, "", None, &[(0, 1)])), Ok(()));
        assert_eq!(fresh.group("g").unwrap().state, GroupState::Empty);
        let mut fresh = Coordinator::new(CoordinatorConfig::default());
        assert_eq!(
            err(&mut fresh, args(1, "m1", None, &[(0, 1)])),
            Err(E::UnknownMemberId)
        );
        assert!(
            fresh.group("g").is_none(),
            "a refused commit creates no group"
        );
    }

    #[test]
    fn a_later_plain_commit_wins_over_an_earlier_txn_commit() {
        let mut co = stable();
        let plan = co.plan_txn_commit(0, args(3, "m1", None, &[(0, 10)]));
        co.apply_txn_commit(plan);
        let plain = co.plan_commit(
            0,
            CommitArgs {
                group_id: "g".into(),
                generation: 3,
                member_id: "m1".into(),
                instance_id: None,
                offsets: vec![(tp(0), c(20))],
            },
        );
        co.apply_commit(0, plain);
        co.complete_txn(PID, true, all);
        assert_eq!(
            fetch(&co, 0, true),
            Ok(Some(20)),
            "written after the txn record"
        );
    }

    #[test]
    fn a_failed_txn_commit_append_leaves_nothing_pending() {
        let mut co = Coordinator::new(CoordinatorConfig::default());
        let plan = co.plan_txn_commit(0, args(-1, "", None, &[(0, 10)]));
        assert_eq!(fetch(&co, 0, true), Err(E::UnstableOffsetCommit));
        co.fail_txn_commit(&plan);
        assert_eq!(fetch(&co, 0, true), Ok(None));
        assert!(co.group("g").is_none(), "the group it created is dropped");
    }

    #[test]
    fn a_failed_retry_keeps_the_durable_commit_of_the_transaction_pending() {
        let mut co = Coordinator::new(CoordinatorConfig::default());
        let first = co.plan_txn_commit(0, args(-1, "", None, &[(0, 10)]));
        co.apply_txn_commit(first);
        let retry = co.plan_txn_commit(0, args(-1, "", None, &[(0, 10)]));
        co.fail_txn_commit(&retry);
        assert_eq!(fetch(&co, 0, true), Err(E::UnstableOffsetCommit));
        co.complete_txn(PID, true, all);
        assert_eq!(
            fetch(&co, 0, true),
            Ok(Some(10)),
            "the durable record commits"
        );
    }

    #[test]
    fn offsets_durable_after_their_transaction_ended_are_dropped() {
        let mut co = Coordinator::new(CoordinatorConfig::default());
        let plan = co.plan_txn_commit(0, args(-1, "", None, &[(0, 10)]));
        co.complete_txn(PID, true, all);
        co.apply_txn_commit(plan);
        assert_eq!(fetch(&co, 0, true), Ok(None));
        assert!(co.group("g").unwrap().txn_producers().is_empty());
    }

    #[test]
    fn loading_replays_transactional_batches_and_markers() {
        let key = |p| {
            Key::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: p,
            }
            .encode()
        };
        let val = |o: i64| {
            crate::records::OffsetValue {
                offset: o,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp_ms: 0,
            }
            .encode()
        };
        let mut co = Coordinator::new(CoordinatorConfig::default());
        co.load_record(0, &key(0), Some(&val(1))).unwrap();
        co.load_txn_record(0, 7, &key(0), Some(&val(5))).unwrap();
        co.load_txn_record(0, 8, &key(1), Some(&val(6))).unwrap();
        co.load_txn_record(0, 9, &key(2), Some(&val(7))).unwrap();
        assert_eq!(fetch(&co, 0, true), Err(E::UnstableOffsetCommit));
        assert_eq!(fetch(&co, 0, false), Ok(Some(1)));
        co.load_marker(7, true, all);
        co.load_marker(8, false, all);
        assert_eq!(fetch(&co, 0, true), Ok(Some(5)));
        assert_eq!(fetch(&co, 1, true), Ok(None), "aborted");
        // Producer 9's transaction has no marker yet: still pending after the load.
        assert_eq!(fetch(&co, 2, true), Err(E::UnstableOffsetCommit));
        co.complete_txn(9, true, all);
        assert_eq!(fetch(&co, 2, true), Ok(Some(7)));
    }

    #[test]
    fn deleting_offsets_drops_their_pending_txn_commits() {
        let mut co = Coordinator::new(CoordinatorConfig::default());
        let plan = co.plan_txn_commit(0, args(-1, "", None, &[(0, 10)]));
        co.apply_txn_commit(plan);
        let mut fx = Effects::default();
        assert_eq!(co.delete_offsets("g", &[tp(0)], &mut fx), Ok(vec![Ok(())]));
        assert_eq!(fetch(&co, 0, true), Ok(None));
        co.complete_txn(PID, true, all);
        assert_eq!(fetch(&co, 0, true), Ok(None));
    }

    #[test]
    fn a_group_with_pending_txn_offsets_does_not_expire() {
        let mut co = Coordinator::new(CoordinatorConfig::default());
        let plan = co.plan_txn_commit(0, args(-1, "", None, &[(0, 10)]));
        co.apply_txn_commit(plan);
        let mut fx = Effects::default();
        co.tick(30 * 24 * 3_600_000, &mut fx);
        assert!(co.group("g").is_some());
    }
}
