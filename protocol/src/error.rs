//! The API error: a Kafka error code and, where the response has room, a message.

use kafka_protocol::error::ResponseError;

/// A per-partition or per-resource failure: a Kafka error code and, where the response
/// has room for one, a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ResponseError,
    pub message: Option<String>,
}

impl ApiError {
    pub fn new(code: ResponseError) -> ApiError {
        ApiError {
            code,
            message: None,
        }
    }

    pub fn with(code: ResponseError, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: Some(message.into()),
        }
    }

    pub fn code(&self) -> i16 {
        self.code.code()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.message {
            Some(m) => write!(f, "{:?}: {m}", self.code),
            None => write!(f, "{:?}", self.code),
        }
    }
}
