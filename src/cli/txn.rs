//! `sluice txn list|describe`: the transactions admin CLI (what Kafka's
//! `kafka-transactions.sh list|describe` shows), against any Kafka-protocol broker:
//! ListTransactions on every broker (each lists the ids it coordinates), then
//! DescribeTransactions on each id's coordinator (FindCoordinator key type 1). The
//! question it answers: which transactions are open, since when, on which partitions —
//! a hanging transaction holds read_committed consumers at its first offset.

use kafka_protocol::messages::{
    DescribeTransactionsRequest, FindCoordinatorRequest, ListTransactionsRequest, MetadataRequest,
    TransactionalId,
};
use sluice_client::blocking::Conn;
use sluice_client::{code_err, sbs};

/// Why a txn command failed; the text is the message printed.
#[derive(Debug, thiserror::Error)]
pub enum TxnCliError {
    /// A broker could not be reached, or answered with an error code.
    #[error(transparent)]
    Client(#[from] sluice_client::Error),
    #[error("DescribeTransactions answered nothing")]
    NothingDescribed,
}

pub type Res<T> = Result<T, TxnCliError>;

const CLIENT_ID: &str = "sluice-cli";

fn now_ms() -> i64 {
    sluice::base::util::now_ms()
}

/// One described transactional id.
struct Described {
    id: String,
    producer_id: i64,
    epoch: i16,
    state: String,
    timeout_ms: i32,
    start_ms: i64,
    partitions: Vec<String>,
}

fn describe_one(bootstrap: &str, id: &str) -> Res<Described> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let r = c.call(
        3,
        &FindCoordinatorRequest::default()
            .with_key(sbs(id))
            .with_key_type(1),
    )?;
    code_err("FindCoordinator", r.error_code)?;
    let mut co = Conn::open(&format!("{}:{}", r.host, r.port), CLIENT_ID)?;
    let req = DescribeTransactionsRequest::default()
        .with_transactional_ids(vec![TransactionalId(sbs(id))]);
    let resp = co.call(0, &req)?;
    let s = resp
        .transaction_states
        .into_iter()
        .next()
        .ok_or(TxnCliError::NothingDescribed)?;
    code_err("DescribeTransactions", s.error_code)?;
    Ok(Described {
        id: id.to_string(),
        producer_id: s.producer_id.0,
        epoch: s.producer_epoch,
        state: s.transaction_state.to_string(),
        timeout_ms: s.transaction_timeout_ms,
        start_ms: s.transaction_start_time_ms,
        partitions: s
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| format!("{}-{p}", t.topic.0))
            })
            .collect(),
    })
}

fn age(start_ms: i64) -> String {
    if start_ms < 0 {
        "-".to_string()
    } else {
        format!("{}", (now_ms() - start_ms).max(0))
    }
}

/// Every transactional id of the cluster, with its state and open partitions.
pub fn list(bootstrap: &str) -> Res<()> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let meta = c.call(1, &MetadataRequest::default().with_topics(Some(vec![])))?;
    let mut ids = Vec::new();
    for b in &meta.brokers {
        let mut bc = Conn::open(&format!("{}:{}", b.host, b.port), CLIENT_ID)?;
        let r = bc.call(0, &ListTransactionsRequest::default())?;
        code_err("ListTransactions", r.error_code)?;
        ids.extend(
            r.transaction_states
                .into_iter()
                .map(|t| t.transactional_id.0.to_string()),
        );
    }
    ids.sort();
    ids.dedup();
    println!(
        "{:<32} {:>12} {:<16} {:>10} {:>10} PARTITIONS",
        "TRANSACTIONAL-ID", "PRODUCER-ID", "STATE", "TIMEOUT-MS", "AGE-MS"
    );
    for id in ids {
        let d = describe_one(bootstrap, &id)?;
        println!(
            "{:<32} {:>12} {:<16} {:>10} {:>10} {}",
            d.id,
            d.producer_id,
            d.state,
            d.timeout_ms,
            age(d.start_ms),
            d.partitions.join(",")
        );
    }
    Ok(())
}

/// One transactional id in detail.
pub fn describe(bootstrap: &str, id: &str) -> Res<()> {
    let d = describe_one(bootstrap, id)?;
    println!("transactional id: {}", d.id);
    println!("producer id:      {} (epoch {})", d.producer_id, d.epoch);
    println!("state:            {}", d.state);
    println!("timeout ms:       {}", d.timeout_ms);
    println!("age ms:           {}", age(d.start_ms));
    println!("partitions:       {}", d.partitions.join(","));
    Ok(())
}
