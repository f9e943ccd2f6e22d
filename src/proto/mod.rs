//! The roz.v1 protocol: the types, servers and clients generated from
//! `proto/` (by `build.rs`), shared by the daemon's API ([`crate::api`]
//! re-exports it as `api::proto`) and the command-line clients
//! ([`crate::cli`]), and how a `google.protobuf.Struct` reads as JSON
//! ([`json`]).

tonic::include_proto!("roz.v1");

pub(crate) mod json;

/// Encoded `FileDescriptorSet` of `proto/`, served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/roz_descriptor.bin"));

/// `user-agent` of the `rozd` command line's REST requests:
/// `rozd-cli/<version>` (the daemon records their stops as from `cli`).
pub const CLI_USER_AGENT_PREFIX: &str = "rozd-cli/";
