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
/// lld reads such a file, so the linker (a gcc) is pointed at the lld rustc
/// ships (`gcc-ld/ld.lld`): what rustc does itself on x86_64-unknown-linux-gnu,
/// and what the Pi's build (aarch64-unknown-linux-gnu), linked by GNU ld
/// before, now does too. Other targets link as before. `ROZD_TEXT_ORDER=off` leaves the order out (a build
/// with another linker); `ROZD_LINK_MAP=<file>` writes the linker's map, which
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
    if off || !["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"].contains(&target.as_str())
    {
        return Ok(());
    }
    let order = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?)
        .join("link")
        .join(format!("{target}.order"));
    println!("cargo:rerun-if-changed={}", order.display());
    if !order.is_file() {
        return Ok(());
    }
    let Some(gcc_ld) = rustc_gcc_ld()? else {
        println!(
            "cargo:warning=no gcc-ld/ld.lld in rustc's sysroot: {target} is linked without the start-up order"
        );
        return Ok(());
    };
    println!("cargo:rustc-link-arg-bin=rozd=-B{}", gcc_ld.display());
    println!("cargo:rustc-link-arg-bin=rozd=-fuse-ld=lld");
    println!(
        "cargo:rustc-link-arg-bin=rozd=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    println!("cargo:rustc-link-arg-bin=rozd=-Wl,--no-warn-symbol-ordering");
    Ok(())
}

/// The directory of the `ld.lld` that rustc ships for gcc to call
/// (`<sysroot>/lib/rustlib/<host>/bin/gcc-ld`), if this toolchain has it.
fn rustc_gcc_ld() -> Result<Option<PathBuf>, Box<dyn std::error::Error>> {
    let rustc = std::env::var("RUSTC")?;
    let host = std::env::var("HOST")?;
    let output = std::process::Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()?;
    if !output.status.success() {
        return Ok(None);
    }
    let sysroot = PathBuf::from(String::from_utf8(output.stdout)?.trim());
    let gcc_ld = sysroot.join("lib/rustlib").join(host).join("bin/gcc-ld");
    Ok(gcc_ld.join("ld.lld").is_file().then_some(gcc_ld))
}
