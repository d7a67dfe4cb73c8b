//! SASL authentication on a SASL listener (`--security-protocol SASL_PLAINTEXT` or
//! `SASL_SSL`): the exchange a connection must finish before any other request.
//!
//! As Kafka's SaslServerAuthenticator: a client may ask ApiVersions, then names a
//! mechanism with SaslHandshake. After a v1 handshake the mechanism's tokens travel in
//! SaslAuthenticate requests; after a v0 handshake they are bare size-prefixed frames
//! (no request header), as clients before KIP-152 send them. Any other request before
//! authentication closes the connection, and so does a failed authentication — after
//! Kafka's `connection.failed.authentication.delay.ms` (100 ms), with
//! SASL_AUTHENTICATION_FAILED where a response can carry it.
//!
//! Credentials are the metadata quorum's SCRAM credentials in the shard's image
//! (`MetadataImage::scram`): SCRAM-SHA-256/512 check the client's proof against
//! StoredKey, PLAIN derives StoredKey from the password with the stored salt. Failed
//! authentications are counted per client address on each shard: an address past its
//! budget ([`FAILURE_BURST`], refilled at [`FAILURE_REFILL_PER_SECOND`]) has its
//! attempts checked one at a time, [`FAILURE_REFILL_PER_SECOND`] a second (each waits
//! for its turn, however many connections it opens), until the budget refills. That
//! bounds password guessing per address without locking anyone out: a client with the
//! right password behind the same address (a NAT, a misconfigured neighbour retrying)
//! still gets in, after its turn. Refusals are logged on the `sluice::audit` target.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, RequestKind, ResponseKind, SaslAuthenticateResponse, SaslHandshakeResponse,
};
use sluice_client::sasl::{parse_plain, ClientFirst, Mechanism, SaslError, ServerAwaitingFinal};
use sluice_protocol::{api_versions, encode_response, sb, Parsed};

use crate::base::metadata::MetadataImage;
use crate::partition::broker::Broker;

/// Largest frame read before authentication (Kafka's SaslServerAuthenticator limit):
/// an unauthenticated client cannot make the broker hold a large buffer.
const FRAME_MAX: usize = 512 << 10;
/// How long the whole exchange may take.
pub const EXCHANGE_TIME_MAX: Duration = Duration::from_secs(30);
/// Kafka's `connection.failed.authentication.delay.ms` default: a failure is answered
/// this late, which slows a guesser's round trips.
const FAILURE_DELAY: Duration = Duration::from_millis(100);
/// Failed authentications an address may have in a row on one shard before its
/// attempts are paced …
pub const FAILURE_BURST: f64 = 30.0;
/// … and how fast that budget comes back.
pub const FAILURE_REFILL_PER_SECOND: f64 = 1.0;

/// Why a connection was not authenticated (it is closed).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(String),
    #[error("authentication failed for user {:?} with {mechanism}: {reason}", user.as_deref().map(|u| u.chars().take(64).collect::<String>()))]
    Credentials {
        /// The user the client claimed (logged cut to 64 characters).
        user: Option<String>,
        mechanism: &'static str,
        reason: String,
    },
    #[error("too many failed logins from this address: no turn within 10 s")]
    Paced,
}

thread_local! {
    /// This shard's failure budgets, by client address, and the size at which it next
    /// forgets the full ones (doubling, so that pruning costs O(1) per failure however
    /// many addresses an attacker rotates through).
    static FAILURES: RefCell<(HashMap<IpAddr, Budget>, usize)> =
        RefCell::new((HashMap::new(), PRUNE_AT));
}

/// The failure map's size that first triggers pruning.
const PRUNE_AT: usize = 4096;
/// How far ahead an attempt may be given a turn; past it the attempt is refused at
/// once (a queue an address built up is bounded, and no attempt outlives the
/// exchange's time limit waiting).
const TURNS_AHEAD_MAX: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
struct Budget {
    left: f64,
    at: Instant,
    /// While the budget is spent: when the next attempt may be checked.
    next_turn: Instant,
}

impl Budget {
    fn now(self, now: Instant) -> Budget {
        let refill = now.duration_since(self.at).as_secs_f64() * FAILURE_REFILL_PER_SECOND;
        Budget {
            left: (self.left + refill).min(FAILURE_BURST),
            at: now,
            next_turn: self.next_turn,
        }
    }
}

/// How long an attempt of `addr` waits before it is checked: nothing within the
/// address's budget; past it, each attempt takes the next turn, turns
/// 1 / [`FAILURE_REFILL_PER_SECOND`] apart; `None`: no turn within
/// [`TURNS_AHEAD_MAX`], refuse now.
fn turn(addr: Option<IpAddr>) -> Option<Duration> {
    let Some(addr) = addr else {
        return Some(Duration::ZERO);
    };
    let now = Instant::now();
    FAILURES.with(|f| {
        let mut f = f.borrow_mut();
        let Some(b) = f.0.get_mut(&addr) else {
            return Some(Duration::ZERO);
        };
        *b = b.now(now);
        if b.left >= 1.0 {
            // Refilled: turns start over from now.
            b.next_turn = now;
            return Some(Duration::ZERO);
        }
        let at = b.next_turn.max(now);
        if at - now > TURNS_AHEAD_MAX {
            return None;
        }
        b.next_turn = at + Duration::from_secs_f64(1.0 / FAILURE_REFILL_PER_SECOND);
        Some(at - now)
    })
}

/// Counts a failed authentication of `addr`.
fn failed(addr: Option<IpAddr>) {
    let Some(addr) = addr else { return };
    let now = Instant::now();
    FAILURES.with(|f| {
        let (f, prune_at) = &mut *f.borrow_mut();
        // Addresses whose budget is full again carry no information: forget them
        // before the map grows large.
        if f.len() >= *prune_at {
            f.retain(|_, b| b.now(now).left < FAILURE_BURST);
            *prune_at = (f.len() * 2).max(PRUNE_AT);
        }
        let b = f.entry(addr).or_insert(Budget {
            left: FAILURE_BURST,
            at: now,
            next_turn: now,
        });
        *b = b.now(now);
        b.left = (b.left - 1.0).max(0.0);
    });
}

/// What one token did to the exchange.
enum Step {
    /// Send this token and wait for the client's next.
    Continue(Vec<u8>),
    /// Authenticated as this user; send the last token.
    Done(String, Vec<u8>),
}

/// Where a token is in the chosen mechanism's exchange.
enum Exchange {
    Start,
    ScramFinal(ServerAwaitingFinal),
}

/// Takes the client's `token` in the exchange of `mechanism`.
fn step(
    image: &MetadataImage,
    mechanism: Mechanism,
    exchange: &mut Exchange,
    token: &[u8],
) -> Result<Step, Refused> {
    let refused = |user: Option<String>, e: SaslError| Refused::Credentials {
        user,
        mechanism: mechanism.name(),
        reason: e.0,
    };
    match (mechanism, std::mem::replace(exchange, Exchange::Start)) {
        (Mechanism::Plain, _) => Err(refused(
            None,
            SaslError("PLAIN is checked by `plain`".into()),
        )),
        (m, Exchange::Start) => {
            let first = ClientFirst::parse(m, token).map_err(|e| refused(None, e))?;
            let Some(cred) = image.scram_credential(&first.user, m) else {
                let user = first.user.clone();
                return Err(refused(
                    Some(user),
                    SaslError("no credential of this mechanism".into()),
                ));
            };
            let (reply, next) = first.respond(&cred);
            *exchange = Exchange::ScramFinal(next);
            Ok(Step::Continue(reply))
        }
        (_, Exchange::ScramFinal(state)) => {
            let user = state.user().to_string();
            let reply = state
                .finish(token)
                .map_err(|e| refused(Some(user.clone()), e))?;
            Ok(Step::Done(user, reply))
        }
    }
}

/// The message a client gets for a failed authentication: Kafka's, naming no cause
/// (whether the user exists is not the client's to learn).
fn failure_message(mechanism: Mechanism) -> String {
    format!(
        "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
        mechanism.name()
    )
}

/// Runs the SASL exchange on a new connection of a SASL listener; returns the
/// authenticated user, or why the connection must close (logged on the audit target).
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    broker: &Broker,
    stream: &mut S,
    peer: Option<IpAddr>,
) -> Result<String, Refused> {
    let timed = futures_lite::future::or(exchange(broker, stream, peer), async {
        glommio::timer::sleep(EXCHANGE_TIME_MAX).await;
        Err(Refused::Protocol(format!(
            "no SASL authentication within {} s",
            EXCHANGE_TIME_MAX.as_secs()
        )))
    });
    let result = timed.await;
    match &result {
        Ok(user) => tracing::debug!(target: "sluice::audit", ?peer, user, "authenticated"),
        Err(Refused::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(target: "sluice::audit", ?peer, "connection closed before authenticating")
        }
        Err(e) => {
            tracing::info!(target: "sluice::audit", ?peer, error = %e, "SASL authentication refused: connection closed")
        }
    }
    result
}

async fn read_frame<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Bytes, Refused> {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).await?;
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > FRAME_MAX {
        return Err(Refused::Protocol(format!(
            "frame of {size} bytes before authentication (at most {FRAME_MAX})"
        )));
    }
    let mut frame = BytesMut::zeroed(size as usize);
    stream.read_exact(&mut frame).await?;
    Ok(frame.freeze())
}

async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, frame: &[u8]) -> Result<(), Refused> {
    stream.write_all(frame).await?;
    stream.flush().await?;
    Ok(())
}

async fn respond<S: AsyncWrite + Unpin>(
    stream: &mut S,
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: ResponseKind,
) -> Result<(), Refused> {
    let frame = encode_response(key, version, correlation_id, &response)
        .map_err(|e| Refused::Protocol(format!("cannot encode {key:?} response: {e}")))?;
    write_frame(stream, &frame).await
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    broker: &Broker,
    stream: &mut S,
    peer: Option<IpAddr>,
) -> Result<String, Refused> {
    let offered = broker
        .config
        .sasl
        .as_ref()
        .map(|s| s.mechanisms.clone())
        .unwrap_or_default();
    // The mechanism chosen, and whether its tokens come bare (a v0 handshake).
    let mut chosen: Option<(Mechanism, bool)> = None;
    let mut state = Exchange::Start;
    loop {
        let frame = read_frame(stream).await?;
        if let Some((mechanism, true)) = chosen {
            // A v0 exchange: the frame is the token, and so is the answer (a failure
            // can only close the connection).
            match judged(broker, mechanism, &mut state, &frame, peer).await? {
                Step::Continue(token) => write_frame(stream, &sized(&token)).await?,
                Step::Done(user, token) => {
                    write_frame(stream, &sized(&token)).await?;
                    return Ok(user);
                }
            }
            continue;
        }
        let request = match sluice_protocol::parse(frame) {
            Ok(Parsed::Request(r)) => *r,
            Ok(Parsed::Unsupported {
                api_key,
                version,
                correlation_id,
            }) => {
                // An ApiVersions too new gets Kafka's v0 answer; anything else closes.
                match sluice_protocol::unsupported_response(api_key, correlation_id) {
                    Some(frame) => {
                        write_frame(stream, &frame).await?;
                        continue;
                    }
                    None => {
                        return Err(Refused::Protocol(format!(
                            "unsupported API {api_key} v{version} before authentication"
                        )))
                    }
                }
            }
            Err(e) => return Err(Refused::Protocol(format!("undecodable request: {e}"))),
        };
        let (key, version, id) = (
            request.api_key,
            request.version,
            request.header.correlation_id,
        );
        match request.body {
            RequestKind::ApiVersions(_) => {
                let r = ResponseKind::ApiVersions(api_versions::handle(version));
                respond(stream, key, version, id, r).await?;
            }
            RequestKind::SaslHandshake(r) if chosen.is_none() => {
                let asked = Mechanism::parse(r.mechanism.as_str()).filter(|m| offered.contains(m));
                let mut answer = SaslHandshakeResponse::default();
                answer.mechanisms = offered.iter().map(|m| sb(m.name())).collect();
                if asked.is_none() {
                    answer.error_code = ResponseError::UnsupportedSaslMechanism.code();
                }
                respond(
                    stream,
                    key,
                    version,
                    id,
                    ResponseKind::SaslHandshake(answer),
                )
                .await?;
                let Some(m) = asked else {
                    return Err(Refused::Protocol(format!(
                        "SASL mechanism {:?} is not enabled",
                        r.mechanism.as_str()
                    )));
                };
                chosen = Some((m, version == 0));
            }
            RequestKind::SaslAuthenticate(r) if chosen.is_some() => {
                let (mechanism, _) = chosen.expect("checked by the guard");
                let mut answer = SaslAuthenticateResponse::default();
                match judged(broker, mechanism, &mut state, &r.auth_bytes, peer).await {
                    Ok(Step::Continue(token)) => {
                        answer.auth_bytes = token.into();
                        let r = ResponseKind::SaslAuthenticate(answer);
                        respond(stream, key, version, id, r).await?;
                    }
                    Ok(Step::Done(user, token)) => {
                        answer.auth_bytes = token.into();
                        let r = ResponseKind::SaslAuthenticate(answer);
                        respond(stream, key, version, id, r).await?;
                        return Ok(user);
                    }
                    Err(e) => {
                        answer.error_code = ResponseError::SaslAuthenticationFailed.code();
                        answer.error_message = Some(sb(failure_message(mechanism)));
                        let r = ResponseKind::SaslAuthenticate(answer);
                        // The client may have closed already; the refusal is the cause.
                        let _ = respond(stream, key, version, id, r).await;
                        return Err(e);
                    }
                }
            }
            _ => {
                return Err(Refused::Protocol(format!(
                    "{key:?} request before SASL authentication completed"
                )))
            }
        }
    }
}

/// The PLAIN token's check: the password against the user's stored SCRAM credential
/// (SCRAM-SHA-256's if it has one, else SCRAM-SHA-512's: made from the same
/// password). Deriving it is PBKDF2 with thousands of iterations, so it runs on the
/// blocking pool, not on the shard.
async fn plain(image: &MetadataImage, token: &[u8]) -> Result<Step, Refused> {
    let refused = |user: Option<String>, reason: &str| Refused::Credentials {
        user,
        mechanism: Mechanism::Plain.name(),
        reason: reason.to_string(),
    };
    let (user, password) = parse_plain(token).map_err(|e| refused(None, &e.0))?;
    let Some((m, cred)) = [Mechanism::ScramSha256, Mechanism::ScramSha512]
        .into_iter()
        .find_map(|m| Some((m, image.scram_credential(&user, m)?)))
    else {
        return Err(refused(Some(user), "no such user"));
    };
    let ok = glommio::executor()
        .spawn_blocking(move || cred.verify_password(m, &password))
        .await;
    if ok {
        Ok(Step::Done(user, Vec::new()))
    } else {
        Err(refused(Some(user), "invalid password"))
    }
}

/// Takes a token at the address's turn (the tokens that decide: PLAIN's, SCRAM's
/// final one; SCRAM's first costs nothing to answer); a failure is counted and
/// answered after [`FAILURE_DELAY`].
async fn judged(
    broker: &Broker,
    mechanism: Mechanism,
    state: &mut Exchange,
    token: &[u8],
    peer: Option<IpAddr>,
) -> Result<Step, Refused> {
    let decides = mechanism == Mechanism::Plain || matches!(state, Exchange::ScramFinal(_));
    let result = match decides.then(|| turn(peer)) {
        Some(None) => Err(Refused::Paced),
        Some(Some(wait)) => {
            if !wait.is_zero() {
                glommio::timer::sleep(wait).await;
            }
            if mechanism == Mechanism::Plain {
                plain(&broker.image(), token).await
            } else {
                step(&broker.image(), mechanism, state, token)
            }
        }
        None => step(&broker.image(), mechanism, state, token),
    };
    if result.is_err() {
        failed(peer);
        glommio::timer::sleep(FAILURE_DELAY).await;
    }
    result
}

/// `token` with its 4-byte size in front (a v0 exchange's frame).
fn sized(token: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + token.len());
    out.extend_from_slice(&(token.len() as u32).to_be_bytes());
    out.extend_from_slice(token);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_past_its_failure_budget_takes_turns_until_it_refills() {
        let addr: IpAddr = "127.0.0.9".parse().unwrap();
        let other: IpAddr = "127.0.0.10".parse().unwrap();
        let now = Some(Duration::ZERO);
        for _ in 0..FAILURE_BURST as usize {
            assert_eq!(turn(Some(addr)), now);
            failed(Some(addr));
        }
        // Spent: attempts are spaced a turn apart, however many arrive at once …
        let step = Duration::from_secs_f64(1.0 / FAILURE_REFILL_PER_SECOND);
        let waits: Vec<Duration> = (0..3).map(|_| turn(Some(addr)).unwrap()).collect();
        assert!(waits[0] <= step, "{waits:?}");
        assert!(
            waits[1] > waits[0] + step / 2 && waits[2] > waits[1] + step / 2,
            "{waits:?}"
        );
        // … up to TURNS_AHEAD_MAX ahead; past it an attempt is refused at once.
        let queued = (0..100).take_while(|_| turn(Some(addr)).is_some()).count();
        assert!(queued < 100, "the queue of turns is bounded");
        assert_eq!(turn(Some(addr)), None);
        assert_eq!(turn(Some(other)), now, "budgets are per address");
        assert_eq!(turn(None), now, "no address, no budget");
        // Refilled after a while (moved back in time instead of waiting): turns start
        // over from now, whatever was queued.
        FAILURES.with(|f| {
            let mut f = f.borrow_mut();
            let b = f.0.get_mut(&addr).unwrap();
            b.at -= step.mul_f64(1.5);
        });
        assert_eq!(turn(Some(addr)), now);
        failed(Some(addr));
        assert!(turn(Some(addr)).unwrap() <= step);
    }

    #[test]
    fn scram_and_plain_check_the_quorum_credentials() {
        let mut image = MetadataImage::new_cluster();
        let c = sluice_client::sasl::ScramCredential::generate(Mechanism::ScramSha256, "pw", 4096);
        image
            .scram
            .entry("alice".into())
            .or_default()
            .insert(1, crate::base::metadata::stored_credential(c));
        let checked = sluice_shard::run_unpinned("sasl-test", 1 << 20, {
            let image = image.clone();
            move || async move {
                let mut out = Vec::new();
                for (user, pw) in [("alice", "pw"), ("alice", "wrong"), ("bob", "pw")] {
                    let msg = sluice_client::sasl::plain_message(user, pw);
                    out.push(match plain(&image, &msg).await {
                        Ok(Step::Done(u, _)) => Ok(u),
                        Ok(Step::Continue(_)) => Err("continued".to_string()),
                        Err(e) => Err(e.to_string()),
                    });
                }
                out
            }
        });
        assert_eq!(checked[0], Ok("alice".to_string()));
        assert!(checked[1]
            .as_ref()
            .unwrap_err()
            .contains("invalid password"));
        assert!(checked[2].as_ref().unwrap_err().contains("no such user"));

        let scram = |m: Mechanism, user: &str, pw: &str| -> Result<String, String> {
            let mut state = Exchange::Start;
            let (client, first) = sluice_client::sasl::ScramClient::start(m, user, pw);
            let Step::Continue(server_first) =
                step(&image, m, &mut state, &first).map_err(|e| e.to_string())?
            else {
                return Err("done after one token".into());
            };
            let (last, check) = client.respond(&server_first).map_err(|e| e.0)?;
            match step(&image, m, &mut state, &last).map_err(|e| e.to_string())? {
                Step::Done(u, server_final) => {
                    check.verify(&server_final).map_err(|e| e.0)?;
                    Ok(u)
                }
                Step::Continue(_) => Err("not done after two tokens".into()),
            }
        };
        assert_eq!(
            scram(Mechanism::ScramSha256, "alice", "pw"),
            Ok("alice".into())
        );
        assert!(scram(Mechanism::ScramSha256, "alice", "wrong").is_err());
        // Credentials are per mechanism: alice has no SCRAM-SHA-512 one.
        assert!(scram(Mechanism::ScramSha512, "alice", "pw").is_err());
        assert!(scram(Mechanism::ScramSha256, "bob", "pw").is_err());
    }
}
