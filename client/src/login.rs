//! A connection's SASL login as Kafka clients do it (SaslHandshake v1 naming the
//! mechanism, then the mechanism's tokens in SaslAuthenticate v1 requests), shared by
//! both transports: each sends the requests built here and hands the answers back.

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};

use crate::error::{Error, Result};
use crate::sasl::{Credentials, Login};

/// The versions a login speaks (every broker with SaslAuthenticate serves them).
pub const HANDSHAKE_VERSION: i16 = 1;
pub const AUTHENTICATE_VERSION: i16 = 1;

pub fn handshake(c: &Credentials) -> SaslHandshakeRequest {
    SaslHandshakeRequest::default().with_mechanism(crate::sbs(c.mechanism.name()))
}

pub fn check_handshake(c: &Credentials, r: &SaslHandshakeResponse) -> Result<()> {
    if r.error_code == 0 {
        return Ok(());
    }
    let offered: Vec<&str> = r.mechanisms.iter().map(|m| m.as_str()).collect();
    Err(Error::Authentication(format!(
        "the broker does not offer {} (offered: {}): {}",
        c.mechanism.name(),
        offered.join(", "),
        crate::error_name(r.error_code)
    )))
}

/// The next SaslAuthenticate request, from the answer to the one before (`None`
/// first); `None` once authenticated.
pub fn next(
    login: &mut Login,
    c: &Credentials,
    answer: Option<&SaslAuthenticateResponse>,
) -> Result<Option<SaslAuthenticateRequest>> {
    if let Some(r) = answer.filter(|r| r.error_code != 0) {
        let why = r.error_message.as_ref().map_or("", |m| m.as_str());
        return Err(Error::Authentication(format!(
            "as {} with {}: {}: {why}",
            c.user,
            c.mechanism.name(),
            crate::error_name(r.error_code)
        )));
    }
    let token = login
        .step(answer.map(|r| &r.auth_bytes[..]))
        .map_err(|e| Error::Authentication(format!("as {}: {e}", c.user)))?;
    Ok(token.map(|t| SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(t))))
}
