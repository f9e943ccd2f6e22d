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
    link_text_order()?;
    Ok(())
}

/// The order file in `link/` (written by `scripts/text_order.py`) lists the
/// functions the daemon runs while it starts, idles and stops. Linked first
/// and together, they fill a few contiguous pages of `.text` instead of
/// touching (and, through the kernel's fault-around, mapping) pages all over
/// it: the idle daemon's resident memory is mostly its own code pages
/// (BENCHMARKS.md, "Start-up code together"). A name the build no longer has
/// is skipped.
///
/// Only where rustc links with its own lld, which reads such a file:
/// x86_64-unknown-linux-gnu. `ROZD_TEXT_ORDER=off` leaves it out (a build with
/// another linker); `ROZD_LINK_MAP=<file>` writes the linker's map, which
/// `scripts/text_order.py` reads.
fn link_text_order() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=ROZD_TEXT_ORDER");
    println!("cargo:rerun-if-env-changed=ROZD_LINK_MAP");
    if let Ok(map) = std::env::var("ROZD_LINK_MAP") {
        println!("cargo:rustc-link-arg-bin=rozd=-Wl,-Map={map}");
        // The order file takes symbols as the object files name them.
        println!("cargo:rustc-link-arg-bin=rozd=-Wl,--no-demangle");
    }
    let target = std::env::var("TARGET")?;
    let off = matches!(std::env::var("ROZD_TEXT_ORDER").as_deref(), Ok("off"));
    if off || target != "x86_64-unknown-linux-gnu" {
        return Ok(());
    }
    let order = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?)
        .join("link")
        .join(format!("{target}.order"));
    println!("cargo:rerun-if-changed={}", order.display());
    if order.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=rozd=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=rozd=-Wl,--no-warn-symbol-ordering");
    }
    Ok(())
}
