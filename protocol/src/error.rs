//! The API error: a Kafka error code and, where the response has room, a message.

use kafka_protocol::error::ResponseError;

/// A per-partition or per-resource failure: a Kafka error code and, where the response
/// has room for one, a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ResponseError,
    pub message: Option<String>,
    /// Produce only (KIP-467): the records that made the partition's batch fail; empty
    /// for every other error. Answered in Produce v8+ `record_errors`.
    pub record_errors: Vec<RecordError>,
}

/// One record that made its batch fail (KIP-467).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// The record's index within its batch.
    pub batch_index: i32,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ResponseError) -> ApiError {
        ApiError {
            code,
            message: None,
            record_errors: Vec::new(),
        }
    }

    pub fn with(code: ResponseError, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: Some(message.into()),
            record_errors: Vec::new(),
        }
    }

    /// A batch refused for the records named in `record_errors`.
    pub fn with_records(
        code: ResponseError,
        message: impl Into<String>,
        record_errors: Vec<RecordError>,
    ) -> ApiError {
        ApiError {
            code,
            message: Some(message.into()),
            record_errors,
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
