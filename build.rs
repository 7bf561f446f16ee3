//! Generates the gRPC code from `proto/`.
//!
//! The protobuf compiler is `protox`, written in Rust: a fresh machine needs no
//! `protoc` binary and downloads nothing outside the package registries. The
//! encoded descriptor set is written next to the generated code so the server
//! can offer reflection (`grpcurl` without the proto files).

fn main() {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=migrations");
    generate();
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
