//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): the SASL/SCRAM
//! users a SASL listener checks, kept in the metadata quorum
//! ([`Command::AlterScramCredentials`]). Clients send a salted password, never the
//! password; the quorum keeps only what RFC 5802's server needs (salt, iterations,
//! StoredKey, ServerKey). Also SaslHandshake and SaslAuthenticate outside the SASL
//! exchange (`crate::serve::sasl`): after authentication or on a listener without
//! SASL, Kafka answers them ILLEGAL_SASL_STATE.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    SaslAuthenticateResponse, SaslHandshakeResponse,
};
use sluice_client::sasl::{Mechanism, ITERATIONS_MAX, ITERATIONS_MIN};
use sluice_replication::cluster::{Command, ScramChange, ScramCredential};

use crate::base::error::ApiError;
use crate::base::rpc::Propose;
use crate::partition::broker::Broker;
use crate::serve::api::sb;

pub fn describe(
    broker: &Broker,
    _version: i16,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let image = broker.image();
    let infos = |creds: &BTreeMap<i8, ScramCredential>| {
        creds
            .iter()
            .map(|(m, c)| {
                CredentialInfo::default()
                    .with_mechanism(*m)
                    .with_iterations(c.iterations)
            })
            .collect()
    };
    let named: Vec<String> = req
        .users
        .unwrap_or_default()
        .into_iter()
        .map(|u| u.name.to_string())
        .collect();
    // No names (null or empty): every user with credentials.
    if named.is_empty() {
        let results = image
            .scram
            .iter()
            .map(|(user, creds)| {
                DescribeUserScramCredentialsResult::default()
                    .with_user(sb(user.as_str()))
                    .with_credential_infos(infos(creds))
            })
            .collect();
        return DescribeUserScramCredentialsResponse::default().with_results(results);
    }
    let twice = crate::serve::api::repeated(named.iter());
    let mut results = Vec::new();
    let mut answered = std::collections::HashSet::new();
    for user in &named {
        if !answered.insert(user) {
            continue;
        }
        let r = DescribeUserScramCredentialsResult::default().with_user(sb(user.as_str()));
        let r = if twice.contains(user) {
            r.with_error_code(ResponseError::DuplicateResource.code())
                .with_error_message(Some(sb(
                    "Cannot describe SCRAM credentials for the same user twice in a single request",
                )))
        } else {
            match image.scram.get(user) {
                Some(creds) => r.with_credential_infos(infos(creds)),
                None => r
                    .with_error_code(ResponseError::ResourceNotFound.code())
                    .with_error_message(Some(sb(
                        "Attempt to describe a user credential that does not exist",
                    ))),
            }
        };
        results.push(r);
    }
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

fn unacceptable(m: &str) -> ApiError {
    ApiError::with(ResponseError::UnacceptableCredential, m)
}

/// One deletion or upsertion judged on its own (Kafka's checks, in its order).
fn change(
    image: &crate::base::metadata::MetadataImage,
    user: &str,
    mechanism: i8,
    upsert: Option<(i32, &[u8], &[u8])>,
) -> Result<ScramChange, ApiError> {
    if user.is_empty() {
        return Err(unacceptable("Username must not be empty"));
    }
    let m = Mechanism::from_scram_type(mechanism)
        .filter(|m| m.is_scram())
        .ok_or_else(|| {
            ApiError::with(
                ResponseError::UnsupportedSaslMechanism,
                format!("Unknown SCRAM mechanism {mechanism}"),
            )
        })?;
    let credential = match upsert {
        None => {
            let has = image
                .scram
                .get(user)
                .is_some_and(|c| c.contains_key(&mechanism));
            if !has {
                return Err(ApiError::with(
                    ResponseError::ResourceNotFound,
                    "Attempt to delete a user credential that does not exist",
                ));
            }
            None
        }
        Some((iterations, salt, salted_password)) => {
            if iterations < ITERATIONS_MIN {
                return Err(unacceptable(&format!(
                    "Too few iterations: at least {ITERATIONS_MIN}"
                )));
            }
            if iterations > ITERATIONS_MAX {
                return Err(unacceptable(&format!(
                    "Too many iterations: at most {ITERATIONS_MAX}"
                )));
            }
            if salt.is_empty() || salted_password.is_empty() {
                return Err(unacceptable("Salt and salted password must not be empty"));
            }
            let c = sluice_client::sasl::ScramCredential::from_salted_password(
                m,
                salt,
                iterations,
                salted_password,
            );
            Some(crate::base::metadata::stored_credential(c))
        }
    };
    Ok(ScramChange {
        user: user.to_string(),
        mechanism,
        credential,
        only_if_absent: false,
    })
}

pub async fn alter(
    broker: &Rc<Broker>,
    _version: i16,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let image = broker.image();
    let entries: Vec<(String, Result<ScramChange, ApiError>, i8)> = req
        .deletions
        .iter()
        .map(|d| {
            let user = d.name.to_string();
            let c = change(&image, &user, d.mechanism, None);
            (user, c, d.mechanism)
        })
        .chain(req.upsertions.iter().map(|u| {
            let user = u.name.to_string();
            let upsert = Some((u.iterations, &u.salt[..], &u.salted_password[..]));
            let c = change(&image, &user, u.mechanism, upsert);
            (user, c, u.mechanism)
        }))
        .collect();
    // A user and mechanism named twice fails every entry of that user (Kafka's
    // DUPLICATE_RESOURCE).
    let twice: std::collections::HashSet<String> =
        crate::serve::api::repeated(entries.iter().map(|(u, _, m)| (u.clone(), *m)))
            .into_iter()
            .map(|(u, _)| u)
            .collect();
    // Per user, in order of first appearance: its first error, else its changes.
    let mut users: Vec<(String, Result<Vec<ScramChange>, ApiError>)> = Vec::new();
    for (user, c, _) in entries {
        let c = if twice.contains(&user) {
            Err(ApiError::with(
                ResponseError::DuplicateResource,
                "A user credential cannot be altered twice in the same request",
            ))
        } else {
            c
        };
        let slot = match users.iter().position(|(u, _)| *u == user) {
            Some(i) => &mut users[i].1,
            None => {
                users.push((user, Ok(Vec::new())));
                &mut users.last_mut().expect("just pushed").1
            }
        };
        match (slot.as_mut(), c) {
            (Ok(list), Ok(c)) => list.push(c),
            (Ok(_), Err(e)) => *slot = Err(e),
            (Err(_), _) => {}
        }
    }
    let changes: Vec<ScramChange> = users
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .flatten()
        .cloned()
        .collect();
    let committed = if changes.is_empty() {
        Ok(())
    } else {
        match broker
            .control(Propose(Command::AlterScramCredentials { changes }))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) | Err(e) => Err(e),
        }
    };
    let results = users
        .into_iter()
        .map(|(user, r)| {
            let r = r.and_then(|_| committed.clone());
            let res = AlterUserScramCredentialsResult::default().with_user(sb(user));
            match r {
                Ok(()) => res,
                Err(e) => res
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            }
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

/// SaslHandshake outside the SASL exchange (`sasl`: on a SASL listener).
pub fn handshake_out_of_place(broker: &Broker, sasl: bool) -> SaslHandshakeResponse {
    let offered = broker
        .config
        .sasl
        .as_ref()
        .filter(|_| sasl)
        .map(|s| s.mechanisms.iter().map(|m| sb(m.name())).collect())
        .unwrap_or_default();
    SaslHandshakeResponse::default()
        .with_error_code(ResponseError::IllegalSaslState.code())
        .with_mechanisms(offered)
}

/// SaslAuthenticate outside the SASL exchange.
pub fn authenticate_out_of_place(sasl: bool) -> SaslAuthenticateResponse {
    let why = if sasl {
        "SaslAuthenticate request received after successful authentication"
    } else {
        "SaslAuthenticate request received on a listener without SASL"
    };
    SaslAuthenticateResponse::default()
        .with_error_code(ResponseError::IllegalSaslState.code())
        .with_error_message(Some(sb(why)))
}
