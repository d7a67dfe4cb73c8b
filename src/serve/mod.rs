//! Layer 6, serving Kafka clients: the shard's server that owns the subsystems and
//! answers every cross-shard call (`dispatch`), one handler per Kafka API with the
//! API-version registry (`api`), and the listener with its connections and response
//! ordering (`server`), with SASL authentication before a connection's first request
//! on SASL listeners (`sasl`), the principal every request is authorized as (`authz`), and client quotas (`quota`). A Produce request enters at `server`, is decoded and routed in
//! `api`, and reaches its partition's home shard through `dispatch`.

pub mod api;
pub mod authz;
pub mod dispatch;
pub mod quota;
pub mod sasl;
pub mod server;
