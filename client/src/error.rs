//! The client's error type and the names of Kafka error codes.

use std::io;
use std::time::Duration;

use kafka_protocol::messages::ApiKey;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting, or the socket, failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// No address of `addr` accepted a connection.
    #[error("cannot reach broker at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    /// A request did not encode or a response did not decode.
    #[error("{0}")]
    Codec(String),
    /// A response frame's size prefix is outside `4..=FRAME_BYTES_MAX`.
    #[error("bad response frame length {0}")]
    FrameLength(i32),
    /// The response answers another request.
    #[error("correlation id {got}, expected {expected}")]
    Correlation { got: i32, expected: i32 },
    /// The per-call timeout passed without a response.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The broker does not list the API.
    #[error("broker does not support {0:?}")]
    Unsupported(ApiKey),
    /// The broker's and our version ranges do not overlap.
    #[error("no common version for {key:?}: ours {}-{}, broker {}-{}", ours.0, ours.1, broker.0, broker.1)]
    NoCommonVersion {
        key: ApiKey,
        ours: (i16, i16),
        broker: (i16, i16),
    },
    /// SASL authentication was refused or could not be completed.
    #[error("SASL authentication failed: {0}")]
    Authentication(String),
    /// The broker answered with an error code.
    #[error("{what}: {}", error_name(*code))]
    Kafka { what: String, code: i16 },
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io(e) => e,
            e => io::Error::other(e.to_string()),
        }
    }
}

impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

/// The name of a Kafka error code (`NotEnoughReplicas`), or `error N` for unknown codes.
pub fn error_name(code: i16) -> String {
    use kafka_protocol::error::ResponseError;
    match ResponseError::try_from_code(code) {
        Some(ResponseError::Unknown(_)) | None => format!("error {code}"),
        Some(e) => format!("{e:?}"),
    }
}

/// `Err(Kafka { what, code })` (shown as `what: ErrorName`) unless `code` is 0.
pub fn code_err(what: &str, code: i16) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    Err(Error::Kafka {
        what: what.to_string(),
        code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_have_names() {
        assert_eq!(error_name(19), "NotEnoughReplicas");
        assert_eq!(error_name(-12345), "error -12345");
        assert!(code_err("x", 0).is_ok());
        assert_eq!(
            code_err("Produce", 19).unwrap_err().to_string(),
            "Produce: NotEnoughReplicas"
        );
    }
}
