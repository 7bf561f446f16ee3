//! Generates the gRPC code from `proto/`.
//!
//! The protobuf compiler is `protox`, written in Rust: a fresh machine needs no
//! `protoc` binary and downloads nothing outside the package registries. The
//! encoded descriptor set is written next to the generated code so the server
//! can offer reflection (`grpcurl` without the proto files).

fn main() {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=tests/fixtures/agentgateway");
    generate();
    describe_envoy_authorization();
    generate_agentgateway_client();
}

fn generate() {
    use protox::prost::Message;

    let protos = [
        "proto/capgate/v1/common.proto",
        "proto/capgate/v1/decisions.proto",
        "proto/capgate/v1/policies.proto",
        // agentgateway's ExtMCP callout, written to be wire-compatible with its published one.
        "proto/agentgateway/ext_mcp.proto",
    ];
    let descriptors = match protox::compile(protos, ["proto"]) {
        Ok(descriptors) => descriptors,
        Err(error) => panic!("proto/ does not compile: {error:?}"),
    };
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(
        out_dir.join("capgate_descriptor.bin"),
        descriptors.encode_to_vec(),
    )
    .expect("write the descriptor set");
    // Maps as BTreeMap: a remembered response is re-sent byte for byte, and
    // ordered maps make encoding the same response give the same bytes.
    // The codec answers a request that is not valid protobuf INVALID_ARGUMENT (src/wire/codec.rs).
    tonic_prost_build::configure()
        .btree_map(".")
        .codec_path("crate::wire::codec::Codec")
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)
        .expect("generate gRPC code");
}

/// The descriptor set of Envoy's `envoy.service.auth.v3.Authorization`, for reflection only: the
/// door's code is `envoy-types`', compiled from the same files (proto/third_party/README.md).
fn describe_envoy_authorization() {
    use protox::prost::Message;

    let descriptors = match protox::compile(
        ["envoy/service/auth/v3/external_auth.proto"],
        ["proto/third_party"],
    ) {
        Ok(descriptors) => descriptors,
        Err(error) => panic!("proto/third_party does not compile: {error:?}"),
    };
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(
        out_dir.join("envoy_authorization_descriptor.bin"),
        descriptors.encode_to_vec(),
    )
    .expect("write the Envoy descriptor set");
}

/// A client generated from agentgateway's own `ext_mcp.proto` (a test fixture, copied verbatim),
/// into a folder of its own: `tests/ext_mcp_wire.rs` speaks to capgate's door with it, so that a
/// difference between agentgateway's definition and capgate's fails a test.
fn generate_agentgateway_client() {
    // Only tests use it: a build from a context without tests/ (the container image's) skips it.
    if !std::path::Path::new("tests/fixtures/agentgateway/ext_mcp.proto").exists() {
        return;
    }
    let descriptors = match protox::compile(["ext_mcp.proto"], ["tests/fixtures/agentgateway"]) {
        Ok(descriptors) => descriptors,
        Err(error) => panic!("tests/fixtures/agentgateway does not compile: {error:?}"),
    };
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("agentgateway_published");
    std::fs::create_dir_all(&out_dir).expect("a folder for agentgateway's client");
    tonic_prost_build::configure()
        .out_dir(out_dir)
        .build_client(true)
        .build_server(false)
        .compile_fds(descriptors)
        .expect("generate agentgateway's client");
}
