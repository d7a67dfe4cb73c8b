//! The transaction coordinator as a sans-I/O state machine: requests and the time go in;
//! records for `__transaction_state`, transaction markers to write and deferred replies
//! come out. No sockets, no disk, no clock: the broker's transaction shell does the I/O.
//!
//! It follows Apache Kafka's `TransactionCoordinator`, `TransactionMetadata` and
//! `TransactionStateManager` with client transaction version 0/1 semantics (no epoch
//! bump per transaction, KIP-890 part 2 is not implemented; part 1's verification is):
//!
//! ```text
//!   from                        event                                         to
//!   (new id), Empty, Complete*  InitProducerId: epoch + 1, or a new producer  Empty
//!                               id at epoch 0 once the epoch is exhausted
//!   Empty, Ongoing, Complete*   AddPartitionsToTxn, AddOffsetsToTxn           Ongoing
//!   Ongoing                     EndTxn(commit)                                PrepareCommit
//!   Ongoing                     EndTxn(abort)                                 PrepareAbort
//!   Ongoing                     timeout, or InitProducerId (fencing: epoch+1) PrepareAbort
//!   PrepareCommit               every marker written                          CompleteCommit
//!   PrepareAbort                every marker written                          CompleteAbort
//!   Empty, Complete*            idle past transactional.id.expiration.ms      (tombstone)
//! ```
//!
//! Complete* stands for CompleteCommit and CompleteAbort. PrepareEpochFence and Dead,
//! Kafka's transient states, are never held: a fence is written as PrepareAbort at the
//! bumped epoch (as Kafka writes it), and an expired id is a tombstone.
//!
//! # Durability
//!
//! Every transition is first *prepared*: its record goes out in [`TxnEffects::appends`]
//! and the transactional id is blocked (other requests get CONCURRENT_TRANSACTIONS, as
//! Kafka's `pendingState`). Only when the shell reports the append durable
//! ([`TxnCoordinator::append_done`]) does the in-memory state change and the answer go
//! out. A failed append rolls the transition back and answers with Kafka's mapping of the
//! append error ([`append_error`]). A coordinator that crashes or moves therefore
//! reloads everything it answered; the log may be ahead of what it answered (an append
//! that timed out can still become durable), never behind.
//!
//! # How the shell drives it
//!
//! 1. Gaining leadership of `__transaction_state` partition `p` at leader epoch `e`:
//!    [`TxnCoordinator::begin_load`]`(p, e)`, every record of the partition from its log
//!    start in order to [`TxnCoordinator::load_record`], then
//!    [`TxnCoordinator::loaded`]`(p)`, which re-sends the markers of transactions left in
//!    PrepareCommit/PrepareAbort. Requests for ids of `p` answer
//!    COORDINATOR_LOAD_IN_PROGRESS meanwhile. Losing leadership:
//!    [`TxnCoordinator::unload`]`(p)` (waiting requests get NOT_COORDINATOR).
//! 2. A request: call the operation with a fresh token of its kind ([`InitToken`],
//!    [`AddPartitionsToken`], [`AddOffsetsToken`], [`EndToken`]); its answer arrives as
//!    the [`TxnReply`] variant carrying that token in [`TxnEffects::replies`], now or
//!    from a later call.
//! 3. After every call, run its effects:
//!    - each [`TxnAppend`], in order per partition, is appended to
//!      `__transaction_state-{partition}` (acks=all, uncompressed, only while still the
//!      leader at the loaded epoch); then report [`TxnCoordinator::append_done`] with the
//!      append's result, exactly once per append;
//!    - each [`MarkerWrite`] is written as control batches on its partitions
//!      (WriteTxnMarkers to their leaders); report [`TxnCoordinator::marker_done`] once
//!      per partition per emission, with the partition's outcome (a lost or timed-out
//!      request is a failure, and is retried at the next tick);
//!    - the replies are delivered.
//! 4. Every ~100 ms: [`TxnCoordinator::tick`] (marker and completion retries, timeouts,
//!    expiry).
//!
//! A marker write the shell reports failed is written again; the data partitions accept
//! the same marker twice harmlessly. Without KIP-890 part 2 (an epoch bump per
//! transaction) a marker request reported failed must not land *after* the next
//! transaction of the same producer has begun on that partition, as in Kafka: the shell
//! reports a failure only once the request can no longer be applied (its connection is
//! closed), or after a coordinator epoch change fences it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kafka_protocol::error::ResponseError;

use crate::partition_for;
use crate::txn_records::{decode_key, encode_key, TxnRecordError, TxnState, TxnValue};

/// Identifies a waiting InitProducerId request in the shell. Each call kind has its own
/// token type, and each [`TxnReply`] variant pairs a token type with that call's answer
/// type, so the coordinator cannot answer one call with another's reply (the compiler
/// checks it) and the shell keeps one typed map of waiters per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InitToken(pub u64);

/// Identifies a waiting AddPartitionsToTxn request in the shell (see [`InitToken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddPartitionsToken(pub u64);

/// Identifies a waiting AddOffsetsToTxn request in the shell (see [`InitToken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddOffsetsToken(pub u64);

/// Identifies a waiting EndTxn request in the shell (see [`InitToken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndToken(pub u64);

/// Identifies one record append the shell must report on.
pub type AppendId = u64;
/// Identifies one round of markers of one transaction.
pub type RoundId = u64;
/// (topic, partition)
pub type TopicPartition = (String, i32);

pub const NO_PRODUCER_ID: i64 = -1;
pub const NO_PRODUCER_EPOCH: i16 = -1;
/// The internal topic of group offsets: AddOffsetsToTxn adds a partition of it.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// The internal topic of transaction state.
pub const TXN_STATE_TOPIC: &str = "__transaction_state";

/// Kafka's broker settings for transactions, with Kafka's defaults.
#[derive(Debug, Clone)]
pub struct TxnConfig {
    /// transaction.state.log.num.partitions
    pub state_partitions: i32,
    /// offsets.topic.num.partitions (AddOffsetsToTxn names the group's partition)
    pub offsets_partitions: i32,
    /// transaction.max.timeout.ms
    pub max_timeout_ms: i32,
    /// transactional.id.expiration.ms
    pub id_expiration_ms: i64,
    /// transaction.abort.timed.out.transaction.cleanup.interval.ms
    pub abort_check_interval_ms: i64,
    /// transaction.remove.expired.transaction.cleanup.interval.ms
    pub expiry_check_interval_ms: i64,
    /// Version of the values written: 0 (Kafka with transaction.version 0, readable by
    /// every Kafka) or 1 (flexible, Kafka 3.8+).
    pub value_version: i16,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            state_partitions: 50,
            offsets_partitions: 50,
            max_timeout_ms: 900_000,
            id_expiration_ms: 7 * 24 * 60 * 60 * 1000,
            abort_check_interval_ms: 10_000,
            expiry_check_interval_ms: 3_600_000,
            value_version: 0,
        }
    }
}

/// Where new producer ids come from (the shell's controller-allocated block). An
/// exhausted block is COORDINATOR_LOAD_IN_PROGRESS, as Kafka's `RPCProducerIdManager`
/// answers while it fetches the next one; clients retry it.
pub trait ProducerIds {
    fn next_producer_id(&mut self) -> Result<i64, ResponseError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdAndEpoch {
    pub producer_id: i64,
    pub epoch: i16,
}

/// Kafka does not hand out the last two epochs of a producer id, so that it can always
/// fence one more time (`TransactionMetadata.isEpochExhausted`).
pub fn epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// A deferred answer to the waiting request its token names. The API handler maps PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for
/// clients too old to know it (InitProducerId < v4, AddPartitionsToTxn,
/// AddOffsetsToTxn and EndTxn < v2), as Kafka's `KafkaApis` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnReply {
    InitProducerId(InitToken, Result<ProducerIdAndEpoch, ResponseError>),
    AddPartitions(AddPartitionsToken, Result<(), ResponseError>),
    AddOffsets(AddOffsetsToken, Result<(), ResponseError>),
    EndTxn(EndToken, Result<ProducerIdAndEpoch, ResponseError>),
}

/// One record to append to `__transaction_state-{partition}`; report it with
/// [`TxnCoordinator::append_done`]. `value: None` is a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnAppend {
    pub id: AppendId,
    pub partition: i32,
    pub transactional_id: String,
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

/// Transaction markers to write: a COMMIT or ABORT control batch for `producer_id` on
/// each partition. Report each partition with [`TxnCoordinator::marker_done`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerWrite {
    pub round: RoundId,
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Leader epoch of the `__transaction_state` partition: data partitions refuse
    /// markers from an older coordinator (TRANSACTION_COORDINATOR_FENCED).
    pub coordinator_epoch: i32,
    pub commit: bool,
    pub partitions: Vec<TopicPartition>,
}

/// The outcome of writing one marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerResult {
    Written,
    /// The partition no longer exists (its topic was deleted, or it has no leader in
    /// the metadata): Kafka skips it.
    Gone,
    /// The WriteTxnMarkers error for the partition, or REQUEST_TIMED_OUT when the
    /// request or its answer was lost.
    Failed(ResponseError),
}

/// What a call produced besides a direct answer.
#[derive(Debug, Default)]
pub struct TxnEffects {
    pub appends: Vec<TxnAppend>,
    pub markers: Vec<MarkerWrite>,
    pub replies: Vec<TxnReply>,
}

/// InitProducerId, decoupled from the wire version.
#[derive(Debug, Clone)]
pub struct InitArgs {
    /// `None`: an idempotent producer without transactions.
    pub transactional_id: Option<String>,
    pub transaction_timeout_ms: i32,
    /// KIP-360: the producer's current id and epoch, or -1/-1.
    pub producer_id: i64,
    pub producer_epoch: i16,
}

/// AddPartitionsToTxn (v0–v3, or a v4+ transaction without verify_only).
#[derive(Debug, Clone)]
pub struct AddArgs {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub partitions: Vec<TopicPartition>,
}

#[derive(Debug, Clone)]
pub struct AddOffsetsArgs {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub group_id: String,
}

#[derive(Debug, Clone)]
pub struct EndArgs {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
}

/// A transactional id as DescribeTransactions shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnDescription {
    pub transactional_id: String,
    pub state: TxnState,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    /// -1 when no transaction has started.
    pub start_ms: i64,
    /// Topics in name order, with their partitions (those still waiting for a marker
    /// while the transaction completes).
    pub topics: Vec<(String, Vec<i32>)>,
}

/// ListTransactions filters; empty lists do not filter.
#[derive(Debug, Clone)]
pub struct ListFilter {
    pub states: Vec<String>,
    pub producer_ids: Vec<i64>,
    /// v1 (KIP-994): only transactions running longer than this; -1 for all.
    pub min_duration_ms: i64,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            states: Vec::new(),
            producer_ids: Vec::new(),
            min_duration_ms: -1,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedTxns {
    /// (transactional id, producer id, state), by transactional id.
    pub transactions: Vec<(String, i64, TxnState)>,
    pub unknown_state_filters: Vec<String>,
}

/// Kafka's mapping of a failed `__transaction_state` append to the coordinator error the
/// client gets (`TransactionStateManager.appendTransactionToLog`).
pub fn append_error(e: ResponseError) -> ResponseError {
    use ResponseError::*;
    match e {
        // Timed out: COORDINATOR_NOT_AVAILABLE, so that the client retries.
        UnknownTopicOrPartition
        | NotEnoughReplicas
        | NotEnoughReplicasAfterAppend
        | RequestTimedOut => CoordinatorNotAvailable,
        NotLeaderOrFollower | KafkaStorageError => NotCoordinator,
        MessageTooLarge | RecordListTooLarge => UnknownServerError,
        other => other,
    }
}

/// The persisted state of a transactional id: what one record holds, plus the last
/// epoch (KIP-360), which Kafka keeps in memory only.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    producer_id: i64,
    previous_producer_id: i64,
    next_producer_id: i64,
    epoch: i16,
    last_epoch: i16,
    timeout_ms: i32,
    state: TxnState,
    partitions: BTreeSet<TopicPartition>,
    start_ms: i64,
    last_update_ms: i64,
    client_txn_version: i16,
}

impl Snapshot {
    fn to_value(&self) -> TxnValue {
        assert!(
            self.state != TxnState::Empty || self.partitions.is_empty(),
            "an Empty transaction has no partitions"
        );
        let partitions = (self.state != TxnState::Empty).then(|| {
            let mut topics: Vec<(String, Vec<i32>)> = Vec::new();
            for (t, p) in &self.partitions {
                match topics.last_mut() {
                    Some((last, ids)) if last == t => ids.push(*p),
                    _ => topics.push((t.clone(), vec![*p])),
                }
            }
            topics
        });
        TxnValue {
            producer_id: self.producer_id,
            previous_producer_id: self.previous_producer_id,
            next_producer_id: self.next_producer_id,
            producer_epoch: self.epoch,
            timeout_ms: self.timeout_ms,
            state: self.state,
            partitions,
            last_update_ms: self.last_update_ms,
            start_ms: self.start_ms,
            client_transaction_version: self.client_txn_version,
        }
    }

    fn from_value(v: TxnValue) -> Snapshot {
        let partitions = match v.state {
            TxnState::Empty => BTreeSet::new(),
            _ => v
                .partitions
                .unwrap_or_default()
                .into_iter()
                .flat_map(|(t, ids)| ids.into_iter().map(move |p| (t.clone(), p)))
                .collect(),
        };
        Snapshot {
            producer_id: v.producer_id,
            previous_producer_id: v.previous_producer_id,
            next_producer_id: v.next_producer_id,
            epoch: v.producer_epoch,
            // Not in the record: a retried InitProducerId that spans a coordinator move
            // is fenced, as in Kafka.
            last_epoch: NO_PRODUCER_EPOCH,
            timeout_ms: v.timeout_ms,
            state: v.state,
            partitions,
            start_ms: v.start_ms,
            last_update_ms: v.last_update_ms,
            client_txn_version: v.client_transaction_version,
        }
    }

    fn commit_or_abort(&self) -> bool {
        match self.state {
            TxnState::PrepareCommit => true,
            TxnState::PrepareAbort => false,
            s => panic!("no marker to write in state {s:?}"),
        }
    }
}

/// Kafka's `validPreviousStates`.
fn valid_previous(to: TxnState, from: TxnState) -> bool {
    use TxnState::*;
    match to {
        Empty => matches!(from, Empty | CompleteCommit | CompleteAbort),
        Ongoing => matches!(from, Ongoing | Empty | CompleteCommit | CompleteAbort),
        PrepareCommit | PrepareAbort => from == Ongoing,
        CompleteCommit => from == PrepareCommit,
        CompleteAbort => from == PrepareAbort,
        Dead => matches!(from, Empty | CompleteCommit | CompleteAbort),
        PrepareEpochFence => false,
    }
}

/// The checks of Kafka's `prepareTransitionTo` and `completeTransitionTo`: a broken one
/// is a coordinator bug, and stops the process.
fn check_transition(id: &str, from: &Snapshot, to: &Snapshot) {
    use TxnState::*;
    let fail = |why: &str| panic!("transactional id {id}: {why}: {from:?} -> {to:?}");
    if !valid_previous(to.state, from.state) {
        fail("illegal state transition");
    }
    if to.producer_id < 0 || to.epoch < 0 {
        fail("illegal producer id or epoch");
    }
    let same_producer = to.producer_id == from.producer_id;
    match to.state {
        Empty => {
            let bump = (same_producer && i32::from(to.epoch) == i32::from(from.epoch) + 1)
                || (!same_producer && to.epoch == 0);
            if !(bump || (same_producer && to.epoch == from.epoch)) {
                fail("InitProducerId must keep, bump or reset the epoch");
            }
            if !to.partitions.is_empty() || to.start_ms != -1 {
                fail("Empty holds no transaction");
            }
        }
        Ongoing => {
            if !same_producer || to.epoch != from.epoch || to.timeout_ms != from.timeout_ms {
                fail("AddPartitions changes only the partitions");
            }
            if !from.partitions.is_subset(&to.partitions) {
                fail("AddPartitions never drops a partition");
            }
        }
        PrepareCommit | PrepareAbort => {
            // The epoch is bumped when the coordinator aborts (timeout, fencing).
            let epoch_ok = to.epoch == from.epoch
                || (to.state == PrepareAbort && i32::from(to.epoch) == i32::from(from.epoch) + 1);
            if !same_producer
                || !epoch_ok
                || to.partitions != from.partitions
                || to.timeout_ms != from.timeout_ms
                || to.start_ms != from.start_ms
            {
                fail("EndTxn changes only the state");
            }
        }
        CompleteCommit | CompleteAbort => {
            if !same_producer
                || to.epoch != from.epoch
                || to.timeout_ms != from.timeout_ms
                || to.start_ms == -1
                || !to.partitions.is_empty()
            {
                fail("completion changes only the state");
            }
        }
        Dead | PrepareEpochFence => fail("never a target"),
    }
    if to.last_update_ms < from.last_update_ms && from.last_update_ms >= 0 {
        // Clocks may step back; Kafka does not check this either. Keep the newer time.
        tracing::debug!(
            transactional_id = id,
            "transaction update time went backwards"
        );
    }
}

/// One round of markers of a transaction in PrepareCommit / PrepareAbort. The partitions
/// still to mark are the transaction's partitions (removed as they are written, as
/// Kafka's `removePartition`).
#[derive(Debug)]
struct MarkerRound {
    id: RoundId,
    /// Emitted and not reported yet.
    in_flight: BTreeSet<TopicPartition>,
    /// Failed, to emit again at the next tick.
    retry: BTreeSet<TopicPartition>,
    /// A data partition fenced the marker (a newer coordinator or producer epoch):
    /// Kafka stops sending; the transaction waits for the next load.
    abandoned: bool,
    /// The completion record failed to append: appended again at the next tick.
    complete_failed: bool,
}

#[derive(Debug)]
struct TxnMeta {
    id: String,
    cur: Snapshot,
    /// The transition awaiting durability.
    pending: Option<AppendId>,
    /// Created by an InitProducerId whose first record is not durable yet: invisible
    /// to Describe/List, removed if the append fails.
    provisional: bool,
    markers: Option<MarkerRound>,
    /// An AddPartitionsToTxn with this producer's id and epoch was refused with
    /// CONCURRENT_TRANSACTIONS while the last EndTxn completed: the client already has
    /// that EndTxn's answer and began the next transaction, none of whose partitions is
    /// registered (see [`TxnCoordinator::end_txn`]). Not persisted.
    next_refused: bool,
}

#[derive(Debug)]
struct StatePartition {
    coordinator_epoch: i32,
    loading: bool,
    txns: BTreeMap<String, TxnMeta>,
}

/// Who asked for a PrepareCommit/PrepareAbort, and so who is answered once durable.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// EndTxn: answered with the producer id and epoch.
    Client(EndToken),
    /// InitProducerId found an ongoing transaction: answered CONCURRENT_TRANSACTIONS
    /// once the abort is durable, so the client retries after it completes.
    InitFence(InitToken),
    /// The transaction timed out: nobody waits.
    Timeout,
}

/// The waiting request of an AddPartitionsToTxn or AddOffsetsToTxn (one transition
/// serves both); its reply variant follows its token.
#[derive(Debug, Clone, Copy)]
enum AddToken {
    Partitions(AddPartitionsToken),
    Offsets(AddOffsetsToken),
}

impl AddToken {
    fn reply(self, r: Result<(), ResponseError>) -> TxnReply {
        match self {
            AddToken::Partitions(t) => TxnReply::AddPartitions(t, r),
            AddToken::Offsets(t) => TxnReply::AddOffsets(t, r),
        }
    }
}

#[derive(Debug)]
enum Then {
    Init(InitToken),
    Add(AddToken),
    Prepare(Origin),
    Complete,
    Expire,
}

#[derive(Debug)]
struct InFlight {
    partition: i32,
    txn_id: String,
    /// The state the transition started from: nothing may change it meanwhile.
    base: Snapshot,
    /// `None`: the tombstone of an expired id.
    target: Option<Snapshot>,
    then: Then,
}

/// Appends and marker rounds in flight, with the id counter.
#[derive(Debug, Default)]
struct Outbox {
    appends: HashMap<AppendId, InFlight>,
    rounds: HashMap<RoundId, (i32, String)>,
    next_id: u64,
}

impl Outbox {
    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn append(
        &mut self,
        partition: i32,
        value_version: i16,
        meta: &mut TxnMeta,
        target: Option<Snapshot>,
        then: Then,
        fx: &mut TxnEffects,
    ) {
        assert!(
            meta.pending.is_none(),
            "transactional id {}: a second transition while one is pending",
            meta.id
        );
        if let Some(t) = &target {
            check_transition(&meta.id, &meta.cur, t);
        }
        let id = self.next();
        meta.pending = Some(id);
        fx.appends.push(TxnAppend {
            id,
            partition,
            transactional_id: meta.id.clone(),
            key: encode_key(&meta.id),
            value: target.as_ref().map(|t| t.to_value().encode(value_version)),
        });
        self.appends.insert(
            id,
            InFlight {
                partition,
                txn_id: meta.id.clone(),
                base: meta.cur.clone(),
                target,
                then,
            },
        );
    }

    /// Starts the marker round of a transaction that is durably in PrepareCommit or
    /// PrepareAbort (just now, or found so when loading).
    fn start_markers(
        &mut self,
        partition: i32,
        coordinator_epoch: i32,
        value_version: i16,
        now_ms: i64,
        meta: &mut TxnMeta,
        fx: &mut TxnEffects,
    ) {
        assert!(
            meta.markers.is_none(),
            "transactional id {}: a second marker round",
            meta.id
        );
        let round = self.next();
        self.rounds.insert(round, (partition, meta.id.clone()));
        meta.markers = Some(MarkerRound {
            id: round,
            in_flight: meta.cur.partitions.clone(),
            retry: BTreeSet::new(),
            abandoned: false,
            complete_failed: false,
        });
        if meta.cur.partitions.is_empty() {
            return self.complete(partition, value_version, now_ms, meta, fx);
        }
        fx.markers.push(marker_write(
            round,
            coordinator_epoch,
            meta,
            meta.cur.partitions.iter().cloned().collect(),
        ));
    }

    /// Every marker is written: append CompleteCommit / CompleteAbort.
    fn complete(
        &mut self,
        partition: i32,
        value_version: i16,
        now_ms: i64,
        meta: &mut TxnMeta,
        fx: &mut TxnEffects,
    ) {
        let mut target = meta.cur.clone();
        target.state = if meta.cur.commit_or_abort() {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        target.last_update_ms = now_ms;
        self.append(
            partition,
            value_version,
            meta,
            Some(target),
            Then::Complete,
            fx,
        );
    }
}

fn marker_write(
    round: RoundId,
    coordinator_epoch: i32,
    meta: &TxnMeta,
    partitions: Vec<TopicPartition>,
) -> MarkerWrite {
    MarkerWrite {
        round,
        transactional_id: meta.id.clone(),
        producer_id: meta.cur.producer_id,
        producer_epoch: meta.cur.epoch,
        coordinator_epoch,
        commit: meta.cur.commit_or_abort(),
        partitions,
    }
}

/// Per partition of a verify-only AddPartitionsToTxn: Ok, or TRANSACTION_ABORTABLE.
pub type Verified = Vec<(TopicPartition, Result<(), ResponseError>)>;

/// How InitProducerId proceeds once validated.
enum InitStep {
    /// Append this Empty state and answer with its id and epoch.
    Reset(Snapshot),
    /// Abort the ongoing transaction first (bumped epoch), answer
    /// CONCURRENT_TRANSACTIONS.
    Fence(Snapshot),
}

/// The transactional ids of the `__transaction_state` partitions one shard leads.
#[derive(Debug, Default)]
pub struct TxnCoordinator {
    pub config: TxnConfig,
    partitions: BTreeMap<i32, StatePartition>,
    out: Outbox,
    next_abort_check_ms: i64,
    next_expiry_check_ms: i64,
}

impl TxnCoordinator {
    pub fn new(config: TxnConfig) -> TxnCoordinator {
        assert!(
            (crate::txn_records::VALUE_VERSION_MIN..=crate::txn_records::VALUE_VERSION_MAX)
                .contains(&config.value_version),
            "unsupported __transaction_state value version"
        );
        TxnCoordinator {
            config,
            ..TxnCoordinator::default()
        }
    }

    /// The `__transaction_state` partition of a transactional id.
    pub fn partition_of(&self, transactional_id: &str) -> i32 {
        partition_for(transactional_id, self.config.state_partitions)
    }

    /// `Some(true)` while a partition loads, `Some(false)` once it serves, `None` if
    /// this coordinator does not own it.
    pub fn partition_loading(&self, partition: i32) -> Option<bool> {
        self.partitions.get(&partition).map(|p| p.loading)
    }

    // ------------------------------------------------------------ InitProducerId

    /// InitProducerId. The answer comes in `fx.replies` under `token`, now or once its
    /// record is durable.
    pub fn init_producer_id(
        &mut self,
        token: InitToken,
        now_ms: i64,
        a: InitArgs,
        ids: &mut dyn ProducerIds,
        fx: &mut TxnEffects,
    ) {
        let reply = |fx: &mut TxnEffects, r| fx.replies.push(TxnReply::InitProducerId(token, r));
        // KafkaApis: both or neither of the KIP-360 producer id and epoch.
        let expected = match (a.producer_id, a.producer_epoch) {
            (NO_PRODUCER_ID, NO_PRODUCER_EPOCH) => None,
            (NO_PRODUCER_ID, _) | (_, NO_PRODUCER_EPOCH) => {
                return reply(fx, Err(ResponseError::InvalidRequest))
            }
            (producer_id, epoch) => Some(ProducerIdAndEpoch { producer_id, epoch }),
        };
        let Some(txn_id) = a.transactional_id else {
            // An idempotent producer: a new id, epoch 0, nothing stored.
            let r = ids
                .next_producer_id()
                .map(|producer_id| ProducerIdAndEpoch {
                    producer_id,
                    epoch: 0,
                });
            return reply(fx, r);
        };
        if txn_id.is_empty() {
            return reply(fx, Err(ResponseError::InvalidRequest));
        }
        let timeout_ms = a.transaction_timeout_ms;
        if timeout_ms <= 0 || timeout_ms > self.config.max_timeout_ms {
            return reply(fx, Err(ResponseError::InvalidTransactionTimeout));
        }
        let version = self.config.value_version;
        let (partition, part) =
            match serving(&mut self.partitions, self.config.state_partitions, &txn_id) {
                Ok(x) => x,
                Err(e) => return reply(fx, Err(e)),
            };
        if !part.txns.contains_key(&txn_id) {
            let producer_id = match ids.next_producer_id() {
                Ok(p) => p,
                Err(e) => return reply(fx, Err(e)),
            };
            part.txns.insert(
                txn_id.clone(),
                provisional(&txn_id, producer_id, timeout_ms, now_ms),
            );
        }
        let meta = part.txns.get_mut(&txn_id).expect("inserted above");
        match prepare_init(meta, timeout_ms, expected, ids, now_ms) {
            Err(e) => {
                if meta.provisional && meta.pending.is_none() {
                    part.txns.remove(&txn_id);
                }
                reply(fx, Err(e))
            }
            Ok(InitStep::Reset(target)) => self.out.append(
                partition,
                version,
                meta,
                Some(target),
                Then::Init(token),
                fx,
            ),
            Ok(InitStep::Fence(target)) => {
                tracing::info!(transactional_id = %txn_id, "InitProducerId fences the ongoing transaction");
                let then = Then::Prepare(Origin::InitFence(token));
                self.out
                    .append(partition, version, meta, Some(target), then, fx)
            }
        }
    }

    // ------------------------------------------------------- AddPartitionsToTxn

    /// AddPartitionsToTxn (v0–v3, and v4+ transactions that are not verify-only).
    pub fn add_partitions(
        &mut self,
        token: AddPartitionsToken,
        now_ms: i64,
        a: AddArgs,
        fx: &mut TxnEffects,
    ) {
        self.add(
            AddToken::Partitions(token),
            now_ms,
            (&a.transactional_id, a.producer_id, a.producer_epoch),
            a.partitions,
            fx,
        )
    }

    /// AddOffsetsToTxn: adds the group's `__consumer_offsets` partition.
    pub fn add_offsets(
        &mut self,
        token: AddOffsetsToken,
        now_ms: i64,
        a: AddOffsetsArgs,
        fx: &mut TxnEffects,
    ) {
        let p = partition_for(&a.group_id, self.config.offsets_partitions);
        self.add(
            AddToken::Offsets(token),
            now_ms,
            (&a.transactional_id, a.producer_id, a.producer_epoch),
            vec![(OFFSETS_TOPIC.to_string(), p)],
            fx,
        )
    }

    fn add(
        &mut self,
        token: AddToken,
        now_ms: i64,
        (txn_id, producer_id, epoch): (&str, i64, i16),
        partitions: Vec<TopicPartition>,
        fx: &mut TxnEffects,
    ) {
        let reply = |fx: &mut TxnEffects, r| fx.replies.push(token.reply(r));
        if txn_id.is_empty() {
            return reply(fx, Err(ResponseError::InvalidRequest));
        }
        let version = self.config.value_version;
        let (partition, part) =
            match serving(&mut self.partitions, self.config.state_partitions, txn_id) {
                Ok(x) => x,
                Err(e) => return reply(fx, Err(e)),
            };
        let Some(meta) = part.txns.get_mut(txn_id).filter(|m| !m.provisional) else {
            return reply(fx, Err(ResponseError::InvalidProducerIdMapping));
        };
        let cur = &meta.cur;
        let added: BTreeSet<TopicPartition> = partitions.into_iter().collect();
        let err = if cur.producer_id != producer_id {
            Some(ResponseError::InvalidProducerIdMapping)
        } else if cur.epoch != epoch {
            Some(ResponseError::ProducerFenced)
        } else if meta.pending.is_some()
            || matches!(cur.state, TxnState::PrepareCommit | TxnState::PrepareAbort)
        {
            Some(ResponseError::ConcurrentTransactions)
        } else {
            None
        };
        if let Some(e) = err {
            // Refused because the last transaction's markers are being written: the
            // client has that EndTxn's answer and began the next one.
            meta.next_refused |=
                matches!(cur.state, TxnState::PrepareCommit | TxnState::PrepareAbort);
            return reply(fx, Err(e));
        }
        meta.next_refused = false;
        if cur.state == TxnState::Ongoing && added.is_subset(&cur.partitions) {
            // Nothing new: answered at once, as Kafka.
            return reply(fx, Ok(()));
        }
        let mut target = cur.clone();
        if matches!(
            cur.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        ) {
            target.start_ms = now_ms;
        }
        target.state = TxnState::Ongoing;
        target.partitions.extend(added);
        target.last_update_ms = now_ms;
        let then = Then::Add(token);
        self.out
            .append(partition, version, meta, Some(target), then, fx);
    }

    /// AddPartitionsToTxn v4+ with verify_only (KIP-890 part 1): is each partition in
    /// the producer's ongoing transaction? Per partition: Ok, or TRANSACTION_ABORTABLE
    /// when it is not. Pending transitions are not waited for (Kafka: the durable set is
    /// what counts). Reads only.
    pub fn verify_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[TopicPartition],
    ) -> Result<Verified, ResponseError> {
        if transactional_id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let p = partition_for(transactional_id, self.config.state_partitions);
        let part = match self.partitions.get(&p) {
            None => return Err(ResponseError::NotCoordinator),
            Some(s) if s.loading => return Err(ResponseError::CoordinatorLoadInProgress),
            Some(s) => s,
        };
        let Some(meta) = part.txns.get(transactional_id).filter(|m| !m.provisional) else {
            return Err(ResponseError::InvalidProducerIdMapping);
        };
        let cur = &meta.cur;
        if cur.producer_id != producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if cur.epoch != epoch {
            return Err(ResponseError::ProducerFenced);
        }
        if matches!(cur.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
            return Err(ResponseError::ConcurrentTransactions);
        }
        Ok(partitions
            .iter()
            .map(|tp| {
                let r = if cur.partitions.contains(tp) {
                    Ok(())
                } else {
                    Err(ResponseError::TransactionAbortable)
                };
                (tp.clone(), r)
            })
            .collect())
    }

    // ------------------------------------------------------------------- EndTxn

    /// EndTxn. The answer comes once PrepareCommit/PrepareAbort is durable (the markers
    /// follow), or at once.
    pub fn end_txn(&mut self, token: EndToken, now_ms: i64, a: EndArgs, fx: &mut TxnEffects) {
        let reply = |fx: &mut TxnEffects, r| fx.replies.push(TxnReply::EndTxn(token, r));
        if a.transactional_id.is_empty() {
            return reply(fx, Err(ResponseError::InvalidRequest));
        }
        let version = self.config.value_version;
        let (partition, part) = match serving(
            &mut self.partitions,
            self.config.state_partitions,
            &a.transactional_id,
        ) {
            Ok(x) => x,
            Err(e) => return reply(fx, Err(e)),
        };
        let Some(meta) = part
            .txns
            .get_mut(&a.transactional_id)
            .filter(|m| !m.provisional)
        else {
            return reply(fx, Err(ResponseError::InvalidProducerIdMapping));
        };
        let cur = &meta.cur;
        let done = ProducerIdAndEpoch {
            producer_id: cur.producer_id,
            epoch: cur.epoch,
        };
        use TxnState::*;
        let r = if cur.producer_id != a.producer_id {
            Err(ResponseError::InvalidProducerIdMapping)
        } else if cur.epoch != a.producer_epoch {
            Err(ResponseError::ProducerFenced)
        } else if meta.pending.is_some() {
            Err(ResponseError::ConcurrentTransactions)
        } else {
            match (cur.state, a.commit) {
                (Ongoing, _) => Ok(()),
                // A retry of an EndTxn that completed: success, as Kafka.
                (CompleteCommit, true) | (CompleteAbort, false) => {
                    meta.next_refused = false;
                    return reply(fx, Ok(done));
                }
                // While the markers are written (Kafka has a pending state then): the
                // client waits and retries.
                (PrepareCommit | PrepareAbort, _) => Err(ResponseError::ConcurrentTransactions),
                // The abort of a transaction begun right after a commit whose partitions
                // were all refused (librdkafka sends EndTxn without waiting for its
                // AddPartitionsToTxn answer and purges the unsent records): nothing of
                // it is registered, and KIP-890's produce check kept its records out, so
                // there is nothing to abort. Kafka answers INVALID_TXN_STATE to EndTxn
                // v0-v4 here (a fatal error for the producer, librdkafka issue 4849);
                // without the refused request it is still refused, so a commit that
                // timed out and is followed by an abort still learns it committed.
                (CompleteCommit, false) if meta.next_refused => {
                    meta.next_refused = false;
                    return reply(fx, Ok(done));
                }
                (Empty | CompleteCommit | CompleteAbort, _) => Err(ResponseError::InvalidTxnState),
                (Dead | PrepareEpochFence, _) => unreachable!("never held in memory"),
            }
        };
        // The flag speaks for the next EndTxn only (kept while it is told to retry).
        if r != Err(ResponseError::ConcurrentTransactions) {
            meta.next_refused = false;
        }
        if let Err(e) = r {
            return reply(fx, Err(e));
        }
        let mut target = meta.cur.clone();
        target.state = if a.commit {
            PrepareCommit
        } else {
            PrepareAbort
        };
        target.last_update_ms = now_ms;
        let then = Then::Prepare(Origin::Client(token));
        self.out
            .append(partition, version, meta, Some(target), then, fx);
    }

    // ------------------------------------------------------------ durability

    /// The coordinator epoch (the partition's leader epoch when it was loaded) under
    /// which append `id` of [`TxnEffects::appends`] may still be written; `None` once its
    /// partition was unloaded (and perhaps loaded again) since. The shell checks this
    /// right before it writes a queued append, as Kafka's `appendTransactionToLog`
    /// checks the coordinator epoch: a write queued before an unload must not land
    /// after the reload replayed the log, or the log and the state disagree.
    pub fn append_epoch(&self, id: AppendId) -> Option<i32> {
        let f = self.out.appends.get(&id)?;
        self.partitions
            .get(&f.partition)
            .map(|p| p.coordinator_epoch)
    }

    /// The shell reports an append of [`TxnEffects::appends`]: `Ok` once durable, or the
    /// append's error. A success applies the transition and answers; a failure rolls it
    /// back and answers with [`append_error`] of it. Appends of a partition that was
    /// unloaded meanwhile are ignored (their requests were answered NOT_COORDINATOR).
    pub fn append_done(
        &mut self,
        id: AppendId,
        result: Result<(), ResponseError>,
        now_ms: i64,
        fx: &mut TxnEffects,
    ) {
        let Some(f) = self.out.appends.remove(&id) else {
            return;
        };
        let version = self.config.value_version;
        let part = self
            .partitions
            .get_mut(&f.partition)
            .expect("unload drops the appends of its partition");
        let coordinator_epoch = part.coordinator_epoch;
        let meta = part
            .txns
            .get_mut(&f.txn_id)
            .expect("an id with a pending append is kept");
        assert_eq!(
            meta.pending,
            Some(id),
            "{}: pending append mismatch",
            f.txn_id
        );
        assert!(
            meta.cur == f.base,
            "{}: state changed under a pending append",
            f.txn_id
        );
        meta.pending = None;
        match result {
            Ok(()) => self.applied(f, coordinator_epoch, version, now_ms, fx),
            Err(e) => Self::failed(part, f, append_error(e), fx),
        }
    }

    fn applied(
        &mut self,
        f: InFlight,
        coordinator_epoch: i32,
        version: i16,
        now_ms: i64,
        fx: &mut TxnEffects,
    ) {
        let part = self.partitions.get_mut(&f.partition).expect("checked");
        let Some(target) = f.target else {
            // The tombstone is durable: the id is forgotten.
            part.txns.remove(&f.txn_id);
            return;
        };
        let meta = part.txns.get_mut(&f.txn_id).expect("checked");
        meta.cur = target;
        meta.provisional = false;
        let done = ProducerIdAndEpoch {
            producer_id: meta.cur.producer_id,
            epoch: meta.cur.epoch,
        };
        match f.then {
            Then::Init(token) => fx.replies.push(TxnReply::InitProducerId(token, Ok(done))),
            Then::Add(token) => fx.replies.push(token.reply(Ok(()))),
            Then::Prepare(origin) => {
                match origin {
                    Origin::Client(token) => fx.replies.push(TxnReply::EndTxn(token, Ok(done))),
                    Origin::InitFence(token) => fx.replies.push(TxnReply::InitProducerId(
                        token,
                        Err(ResponseError::ConcurrentTransactions),
                    )),
                    Origin::Timeout => {}
                }
                self.out
                    .start_markers(f.partition, coordinator_epoch, version, now_ms, meta, fx);
            }
            Then::Complete => {
                if let Some(m) = meta.markers.take() {
                    self.out.rounds.remove(&m.id);
                }
            }
            Then::Expire => unreachable!("a tombstone has no target"),
        }
    }

    fn failed(part: &mut StatePartition, f: InFlight, code: ResponseError, fx: &mut TxnEffects) {
        tracing::info!(transactional_id = %f.txn_id, error = ?code, "__transaction_state append failed; transition rolled back");
        let meta = part.txns.get_mut(&f.txn_id).expect("checked");
        let provisional = meta.provisional;
        match f.then {
            Then::Init(token) | Then::Prepare(Origin::InitFence(token)) => {
                fx.replies.push(TxnReply::InitProducerId(token, Err(code)))
            }
            Then::Add(token) => fx.replies.push(token.reply(Err(code))),
            Then::Prepare(Origin::Client(token)) => {
                fx.replies.push(TxnReply::EndTxn(token, Err(code)))
            }
            // The next abort check tries again.
            Then::Prepare(Origin::Timeout) => {}
            // Kafka retries the completion; so does the next tick.
            Then::Complete => {
                meta.markers
                    .as_mut()
                    .expect("a completing transaction has its marker round")
                    .complete_failed = true
            }
            // The next expiry check tries again.
            Then::Expire => {}
        }
        if provisional {
            part.txns.remove(&f.txn_id);
        }
    }

    // ---------------------------------------------------------------- markers

    /// The shell reports one partition of a [`MarkerWrite`]. Kafka's handling of
    /// WriteTxnMarkers errors: retriable ones are retried at the next tick; a fenced
    /// producer or coordinator epoch stops the round; an unknown partition is skipped.
    pub fn marker_done(
        &mut self,
        round: RoundId,
        tp: &TopicPartition,
        result: MarkerResult,
        now_ms: i64,
        fx: &mut TxnEffects,
    ) {
        let Some((partition, txn_id)) = self.out.rounds.get(&round).cloned() else {
            return; // a round of an unloaded partition, or one already complete
        };
        let version = self.config.value_version;
        let part = self
            .partitions
            .get_mut(&partition)
            .expect("rounds go with their partition");
        let meta = part.txns.get_mut(&txn_id).expect("a marking id is kept");
        let m = meta.markers.as_mut().expect("the round is the id's");
        assert_eq!(m.id, round);
        if !m.in_flight.remove(tp) {
            return; // a duplicate report
        }
        use ResponseError::*;
        match result {
            MarkerResult::Written | MarkerResult::Gone => {
                meta.cur.partitions.remove(tp);
            }
            // The producer would have failed to write there: nothing to mark (Kafka).
            MarkerResult::Failed(UnsupportedForMessageFormat | UnsupportedVersion) => {
                meta.cur.partitions.remove(tp);
            }
            MarkerResult::Failed(InvalidProducerEpoch | TransactionCoordinatorFenced) => {
                tracing::info!(transactional_id = %txn_id, ?tp, "marker fenced; this coordinator stops sending them");
                m.abandoned = true;
            }
            MarkerResult::Failed(e) => {
                if !matches!(
                    e,
                    UnknownTopicOrPartition
                        | NotLeaderOrFollower
                        | NotEnoughReplicas
                        | NotEnoughReplicasAfterAppend
                        | RequestTimedOut
                        | KafkaStorageError
                ) {
                    // Kafka treats these as fatal; a marker must still be written, so
                    // keep trying rather than stop the broker.
                    tracing::warn!(transactional_id = %txn_id, ?tp, error = ?e, "unexpected marker error; retrying");
                }
                m.retry.insert(tp.clone());
            }
        }
        let all_written = !m.abandoned && meta.cur.partitions.is_empty() && m.in_flight.is_empty();
        if all_written && meta.pending.is_none() {
            self.out.complete(partition, version, now_ms, meta, fx);
        }
    }

    // ---------------------------------------------------------------- timers

    /// Re-sends failed markers and completions, aborts timed-out transactions (every
    /// abort check interval, bumping the epoch as Kafka's fencing does) and expires idle
    /// transactional ids (every expiry check interval).
    pub fn tick(&mut self, now_ms: i64, fx: &mut TxnEffects) {
        self.retry_markers(now_ms, fx);
        if now_ms >= self.next_abort_check_ms {
            self.next_abort_check_ms = now_ms + self.config.abort_check_interval_ms;
            self.abort_timed_out(now_ms, fx);
        }
        if now_ms >= self.next_expiry_check_ms {
            self.next_expiry_check_ms = now_ms + self.config.expiry_check_interval_ms;
            self.expire_ids(now_ms, fx);
        }
    }

    fn retry_markers(&mut self, now_ms: i64, fx: &mut TxnEffects) {
        let version = self.config.value_version;
        for (&p, part) in self.partitions.iter_mut().filter(|(_, s)| !s.loading) {
            for meta in part.txns.values_mut() {
                let Some(m) = meta.markers.as_mut() else {
                    continue;
                };
                if m.abandoned || meta.pending.is_some() {
                    continue;
                }
                if m.complete_failed {
                    m.complete_failed = false;
                    self.out.complete(p, version, now_ms, meta, fx);
                    continue;
                }
                if m.retry.is_empty() {
                    continue;
                }
                let again: Vec<TopicPartition> = std::mem::take(&mut m.retry).into_iter().collect();
                m.in_flight.extend(again.iter().cloned());
                let round = m.id;
                fx.markers
                    .push(marker_write(round, part.coordinator_epoch, meta, again));
            }
        }
    }

    fn abort_timed_out(&mut self, now_ms: i64, fx: &mut TxnEffects) {
        let version = self.config.value_version;
        for (&p, part) in self.partitions.iter_mut().filter(|(_, s)| !s.loading) {
            for meta in part.txns.values_mut() {
                let c = &meta.cur;
                let timed_out = meta.pending.is_none()
                    && c.state == TxnState::Ongoing
                    && c.start_ms + i64::from(c.timeout_ms) < now_ms;
                if !timed_out {
                    continue;
                }
                tracing::info!(transactional_id = %meta.id, producer_id = c.producer_id, "transaction timed out; aborting");
                let target = fence_target(c, now_ms);
                let then = Then::Prepare(Origin::Timeout);
                self.out.append(p, version, meta, Some(target), then, fx);
            }
        }
    }

    fn expire_ids(&mut self, now_ms: i64, fx: &mut TxnEffects) {
        let version = self.config.value_version;
        let expiry = self.config.id_expiration_ms;
        for (&p, part) in self.partitions.iter_mut().filter(|(_, s)| !s.loading) {
            for meta in part.txns.values_mut() {
                let c = &meta.cur;
                let idle = meta.pending.is_none()
                    && !meta.provisional
                    && matches!(
                        c.state,
                        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                    )
                    && c.last_update_ms <= now_ms - expiry;
                if idle {
                    tracing::info!(transactional_id = %meta.id, "transactional id expired");
                    self.out.append(p, version, meta, None, Then::Expire, fx);
                }
            }
        }
    }

    // ---------------------------------------------------------------- loading

    /// This broker now leads `__transaction_state` partition `partition` at leader epoch
    /// `coordinator_epoch`: start loading it (anything held for it before is dropped).
    pub fn begin_load(&mut self, partition: i32, coordinator_epoch: i32, fx: &mut TxnEffects) {
        self.unload(partition, fx);
        self.partitions.insert(
            partition,
            StatePartition {
                coordinator_epoch,
                loading: true,
                txns: BTreeMap::new(),
            },
        );
    }

    /// Replays one `__transaction_state` record (in log order) of a loading partition.
    /// Errors name a record to skip (Kafka logs and skips unknown keys).
    pub fn load_record(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), TxnRecordError> {
        let txn_id = decode_key(key)?;
        let p = self.partition_of(&txn_id);
        let part = match self.partitions.get_mut(&p) {
            Some(s) if s.loading => s,
            _ => return Err(TxnRecordError("record of a partition that is not loading")),
        };
        let Some(v) = value else {
            part.txns.remove(&txn_id);
            return Ok(());
        };
        let mut snap = Snapshot::from_value(TxnValue::decode(v)?);
        match snap.state {
            // Kafka writes neither; should one appear, Dead is as good as gone and an
            // epoch fence that never reached PrepareAbort leaves the transaction open
            // (the timeout aborts it).
            TxnState::Dead => {
                part.txns.remove(&txn_id);
                return Ok(());
            }
            TxnState::PrepareEpochFence => snap.state = TxnState::Ongoing,
            _ => {}
        }
        part.txns.insert(
            txn_id.clone(),
            TxnMeta {
                id: txn_id,
                cur: snap,
                pending: None,
                provisional: false,
                markers: None,
                next_refused: false,
            },
        );
        Ok(())
    }

    /// The partition is loaded: it serves requests from now on, and the transactions
    /// left in PrepareCommit/PrepareAbort get their markers written (again).
    pub fn loaded(&mut self, partition: i32, now_ms: i64, fx: &mut TxnEffects) {
        let version = self.config.value_version;
        let Some(part) = self.partitions.get_mut(&partition) else {
            return;
        };
        part.loading = false;
        let coordinator_epoch = part.coordinator_epoch;
        tracing::info!(
            partition,
            transactional_ids = part.txns.len(),
            "loaded {TXN_STATE_TOPIC} partition"
        );
        for meta in part.txns.values_mut() {
            if matches!(
                meta.cur.state,
                TxnState::PrepareCommit | TxnState::PrepareAbort
            ) {
                self.out
                    .start_markers(partition, coordinator_epoch, version, now_ms, meta, fx);
            }
        }
    }

    /// This broker no longer leads the partition: forget its ids. Requests waiting on
    /// its appends are answered NOT_COORDINATOR; late reports of its appends and markers
    /// are ignored.
    pub fn unload(&mut self, partition: i32, fx: &mut TxnEffects) {
        if self.partitions.remove(&partition).is_none() {
            return;
        }
        self.out.rounds.retain(|_, (p, _)| *p != partition);
        let mut gone: Vec<AppendId> = self
            .out
            .appends
            .iter()
            .filter(|(_, f)| f.partition == partition)
            .map(|(id, _)| *id)
            .collect();
        gone.sort_unstable();
        for id in gone {
            let f = self.out.appends.remove(&id).expect("listed");
            let nc = ResponseError::NotCoordinator;
            let r = match f.then {
                Then::Init(t) | Then::Prepare(Origin::InitFence(t)) => {
                    Some(TxnReply::InitProducerId(t, Err(nc)))
                }
                Then::Add(t) => Some(t.reply(Err(nc))),
                Then::Prepare(Origin::Client(t)) => Some(TxnReply::EndTxn(t, Err(nc))),
                Then::Prepare(Origin::Timeout) | Then::Complete | Then::Expire => None,
            };
            fx.replies.extend(r);
        }
    }

    // ---------------------------------------------------------------- admin

    /// DescribeTransactions for one id.
    pub fn describe(&self, transactional_id: &str) -> Result<TxnDescription, ResponseError> {
        if transactional_id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let p = self.partition_of(transactional_id);
        match self.partitions.get(&p) {
            None => Err(ResponseError::NotCoordinator),
            Some(s) if s.loading => Err(ResponseError::CoordinatorLoadInProgress),
            Some(s) => s
                .txns
                .get(transactional_id)
                .filter(|m| !m.provisional)
                .map(describe_meta)
                .ok_or(ResponseError::TransactionalIdNotFound),
        }
    }

    /// ListTransactions over this coordinator's partitions (the shell merges shards).
    /// COORDINATOR_LOAD_IN_PROGRESS while any of them loads, as Kafka.
    pub fn list(&self, now_ms: i64, f: &ListFilter) -> Result<ListedTxns, ResponseError> {
        if self.partitions.values().any(|p| p.loading) {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        let mut out = ListedTxns::default();
        let mut states = Vec::new();
        for name in &f.states {
            match TxnState::from_name(name) {
                Some(s) => states.push(s),
                None => out.unknown_state_filters.push(name.clone()),
            }
        }
        for part in self.partitions.values() {
            for meta in part.txns.values().filter(|m| !m.provisional) {
                let c = &meta.cur;
                // Kafka: an unknown state name filters everything out; an id without a
                // transaction (start -1) counts as long-running.
                let keep = (f.producer_ids.is_empty() || f.producer_ids.contains(&c.producer_id))
                    && (f.states.is_empty() || states.contains(&c.state))
                    && !(f.min_duration_ms >= 0 && now_ms - c.start_ms <= f.min_duration_ms);
                if keep {
                    out.transactions
                        .push((meta.id.clone(), c.producer_id, c.state));
                }
            }
        }
        out.transactions.sort();
        Ok(out)
    }
}

/// The partition serving `transactional_id`, or the error Kafka's `getTransactionState`
/// gives.
fn serving<'a>(
    partitions: &'a mut BTreeMap<i32, StatePartition>,
    state_partitions: i32,
    transactional_id: &str,
) -> Result<(i32, &'a mut StatePartition), ResponseError> {
    let p = partition_for(transactional_id, state_partitions);
    match partitions.get_mut(&p) {
        None => Err(ResponseError::NotCoordinator),
        Some(s) if s.loading => Err(ResponseError::CoordinatorLoadInProgress),
        Some(s) => Ok((p, s)),
    }
}

fn describe_meta(m: &TxnMeta) -> TxnDescription {
    let mut topics: Vec<(String, Vec<i32>)> = Vec::new();
    for (t, p) in &m.cur.partitions {
        match topics.last_mut() {
            Some((last, ids)) if last == t => ids.push(*p),
            _ => topics.push((t.clone(), vec![*p])),
        }
    }
    TxnDescription {
        transactional_id: m.id.clone(),
        state: m.cur.state,
        producer_id: m.cur.producer_id,
        producer_epoch: m.cur.epoch,
        timeout_ms: m.cur.timeout_ms,
        start_ms: m.cur.start_ms,
        topics,
    }
}

/// A new transactional id's metadata before its first record is durable (Kafka puts it
/// in its cache at once; here it is invisible until durable).
fn provisional(id: &str, producer_id: i64, timeout_ms: i32, now_ms: i64) -> TxnMeta {
    TxnMeta {
        id: id.to_string(),
        cur: Snapshot {
            producer_id,
            previous_producer_id: NO_PRODUCER_ID,
            next_producer_id: NO_PRODUCER_ID,
            epoch: NO_PRODUCER_EPOCH,
            last_epoch: NO_PRODUCER_EPOCH,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: now_ms,
            client_txn_version: 0,
        },
        pending: None,
        provisional: true,
        markers: None,
        next_refused: false,
    }
}

/// PrepareAbort with the epoch bumped, fencing the current producer (Kafka's
/// `prepareFenceProducerEpoch` followed by the abort). The last epoch is forgotten, so a
/// KIP-360 retry with the fenced epoch is fenced too.
fn fence_target(c: &Snapshot, now_ms: i64) -> Snapshot {
    assert!(
        c.epoch < i16::MAX,
        "producer {} at epoch {}: cannot fence past the last epoch",
        c.producer_id,
        c.epoch
    );
    let mut t = c.clone();
    t.epoch = c.epoch + 1;
    t.last_epoch = NO_PRODUCER_EPOCH;
    t.state = TxnState::PrepareAbort;
    t.last_update_ms = now_ms;
    t
}

/// Kafka's `prepareInitProducerIdTransit`.
fn prepare_init(
    meta: &TxnMeta,
    timeout_ms: i32,
    expected: Option<ProducerIdAndEpoch>,
    ids: &mut dyn ProducerIds,
    now_ms: i64,
) -> Result<InitStep, ResponseError> {
    let c = &meta.cur;
    if meta.pending.is_some() {
        return Err(ResponseError::ConcurrentTransactions);
    }
    // KIP-360: fence the caller unless the id was just created, it names the current
    // producer id, or it names the previous one with an exhausted epoch (a retry of the
    // InitProducerId that rotated the id).
    if let Some(e) = expected {
        let valid = c.epoch == NO_PRODUCER_EPOCH
            || e.producer_id == c.producer_id
            || (e.producer_id == c.previous_producer_id && epoch_exhausted(e.epoch));
        if !valid {
            return Err(ResponseError::ProducerFenced);
        }
    }
    use TxnState::*;
    match c.state {
        PrepareAbort | PrepareCommit => Err(ResponseError::ConcurrentTransactions),
        Ongoing => Ok(InitStep::Fence(fence_target(c, now_ms))),
        Empty | CompleteCommit | CompleteAbort => {
            let mut t = c.clone();
            t.previous_producer_id = c.producer_id;
            t.timeout_ms = timeout_ms;
            t.state = Empty;
            t.partitions.clear();
            t.start_ms = -1;
            t.last_update_ms = now_ms;
            if epoch_exhausted(c.epoch) && expected.is_none_or(|e| e.epoch == c.epoch) {
                // Out of epochs: a new producer id at epoch 0.
                t.producer_id = ids.next_producer_id()?;
                t.epoch = 0;
                t.last_epoch = if expected.is_some() {
                    c.epoch
                } else {
                    NO_PRODUCER_EPOCH
                };
                return Ok(InitStep::Reset(t));
            }
            let (epoch, last) = match expected {
                // A new producer instance: bump and forget the last epoch.
                None => (c.epoch + 1, NO_PRODUCER_EPOCH),
                // The producer recovers from an error and nobody else initialized.
                Some(e) if c.epoch == NO_PRODUCER_EPOCH || e.epoch == c.epoch => {
                    (c.epoch + 1, c.epoch)
                }
                // A retry of an InitProducerId that succeeded: the same epoch again.
                Some(e) if e.epoch == c.last_epoch => (c.epoch, c.last_epoch),
                Some(_) => return Err(ResponseError::ProducerFenced),
            };
            t.epoch = epoch;
            t.last_epoch = last;
            Ok(InitStep::Reset(t))
        }
        Dead | PrepareEpochFence => unreachable!("never held in memory"),
    }
}
