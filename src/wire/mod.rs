//! The wire: capgate's gRPC messages (generated from `proto/capgate/v1/`, and agentgateway's
//! ExtMCP callout from `proto/agentgateway/`) and the conversions
//! between them and the core's types. The command line's client, the decision service and
//! telemetry all speak through this room; it knows nothing of any of them.

pub mod codec;
pub mod convert;
pub mod ext_mcp;
pub mod plain;
pub mod proto;
