//! `cargo bench --bench rozd [-- --quick]`: the performance harness (issue
//! 7). Each measurement runs beside a floor measured in the same run; see
//! `harness/mod.rs` and BENCHMARKS.md.
#![forbid(unsafe_code)]

mod harness;

fn main() -> std::process::ExitCode {
    harness::main()
}
