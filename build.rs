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

/// The order file in `link/` (written by `scripts/text_order.py`) names the
/// functions the daemon runs while it starts, idles and stops. Linked first
/// and together, they fill a few contiguous pages of code instead of
/// touching (and, through the kernel's fault-around, mapping) pages all over
/// it: the idle daemon's resident memory is mostly its own code pages
/// (BENCHMARKS.md, "Start-up code together"). It lists section-name patterns
/// for a linker script, with `*` where names change with unrelated code, so
/// that it survives most changes; a function it does not name is linked in
/// the usual place.
///
/// The script is read by the lld rustc ships (`gcc-ld/ld.lld`), which the
/// linker (a gcc) is pointed at: what rustc does itself on
/// x86_64-unknown-linux-gnu, and what the Pi's build
/// (aarch64-unknown-linux-gnu), linked by GNU ld before, now does too. Other
/// targets, and unoptimised builds (tests), link as before.
/// `ROZD_TEXT_ORDER=off` leaves the order out (a build with another linker);
/// `ROZD_LINK_MAP=<file>` writes the linker's map, which
/// `scripts/text_order.py` reads.
fn link_text_order() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=ROZD_TEXT_ORDER");
    println!("cargo:rerun-if-env-changed=ROZD_LINK_MAP");
    if let Ok(map) = std::env::var("ROZD_LINK_MAP") {
        println!("cargo:rustc-link-arg-bin=rozd=-Wl,-Map={map}");
        // text_order.py matches the names the object files have.
        println!("cargo:rustc-link-arg-bin=rozd=-Wl,--no-demangle");
    }
    let target = std::env::var("TARGET")?;
    let off = matches!(std::env::var("ROZD_TEXT_ORDER").as_deref(), Ok("off"))
        || std::env::var("PROFILE")? == "debug";
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
    let script = PathBuf::from(std::env::var("OUT_DIR")?).join("start-up.ld");
    std::fs::write(&script, start_up_script(&std::fs::read_to_string(&order)?))?;
    println!("cargo:rustc-link-arg-bin=rozd=-Wl,-T,{}", script.display());
    Ok(())
}

/// A linker script that puts the input sections the order names, in its
/// order, at the start of `.text`. The rest of `.text` follows them (lld adds
/// the other `.text.*` input sections to the output section of that name),
/// and `INSERT` keeps lld's default layout for everything else. One `.text`
/// output section, because tools (valgrind) take code outside it for
/// another object's.
///
/// Each line of the order is a section-name pattern (`*` for the parts of a
/// name that change from build to build); a line that is not one (blank,
/// or with a character that would end the pattern early) is skipped.
fn start_up_script(order: &str) -> String {
    let mut script = String::from("SECTIONS\n{\n  .text :\n  {\n");
    for pattern in order.lines().map(str::trim) {
        let usable = pattern.starts_with(".text.")
            && !pattern.contains(|c: char| c.is_whitespace() || "()\"\\;{}".contains(c));
        if usable {
            script.push_str("    *(");
            script.push_str(pattern);
            script.push_str(")\n");
        }
    }
    script.push_str("  }\n}\nINSERT BEFORE .init;\n");
    script
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
