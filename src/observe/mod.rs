//! Layer 2, what an operator reads: the metrics registry and its HTTP endpoint
//! (`metrics`), the consumer-lag board with its `/v1/groups` routes and alert sinks
//! (`lag`), and the process's log levels (`loggers`, Kafka's BROKER_LOGGER resource).
//! The layers above publish into these; nothing here reaches back into them.

pub mod lag;
pub mod loggers;
pub mod metrics;
