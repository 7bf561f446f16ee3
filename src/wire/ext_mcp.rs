//! The generated types and services of `proto/agentgateway/ext_mcp.proto`: agentgateway's ExtMCP
//! callout, which capgate serves as a door (src/service/grpc/ext_mcp.rs).

#![allow(clippy::all, clippy::pedantic, missing_docs)]

tonic::include_proto!("agentgateway.dev.ext_mcp");
