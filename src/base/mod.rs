//! Layer 1, the base: what every layer above uses and nothing here serves on its own.
//! Helpers and clocks (`util`), the broker's number types (`ids`: offsets, leader
//! epochs, producer and broker ids), the broker's errors and their Kafka codes (`error`), the
//! one config struct (`config`), topic configs by Kafka's names (`topic_config`) and
//! broker configs with the dynamic ones (`broker_configs`) and Kafka's broker config
//! names (`kafka_broker_configs`), consumer group configs (`group_configs`), the rules a
//! produced record
//! must pass (`record_rules`), the metadata image every shard reads (`metadata`), the
//! machine (`host`: resource limits, systemd notification, port wait), the fetch session
//! cache (`fetch_session`, KIP-227, sans I/O) and the typed cross-shard calls with their
//! messages (`rpc`).
//!
//! Modules here import only each other (never in a circle) and the workspace crates.

pub mod broker_configs;
pub mod config;
pub mod directory;
pub mod error;
pub mod fetch_session;
pub mod group_configs;
pub mod host;
pub mod ids;
pub mod kafka_broker_configs;
pub mod metadata;
pub mod record_rules;
pub mod rpc;
pub mod topic_config;
pub mod util;
