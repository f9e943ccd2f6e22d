//! Compiles `proto/` with protox (pure Rust, no `protoc`) and generates the
//! tonic server and client code plus the descriptor set used by reflection.

use std::path::PathBuf;

use prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/roz/v1/agent.proto",
    "proto/roz/v1/safety.proto",
    "proto/roz/v1/tasks.proto",
    "proto/roz/v1/hosts.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("roz_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
