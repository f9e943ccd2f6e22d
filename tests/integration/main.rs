//! rozd's black-box test suites, one module per area, in one test binary
//! (one link of tonic, axum, rusqlite and reqwest instead of one per suite).
//! Each suite runs real parts: the daemon on a loopback port, real clients,
//! socat pty pairs, a real mosquitto. `cargo test --test integration <area>::`
//! runs one area.

mod common;
mod hw_support;

mod api_surface;
mod approvals;
mod bounds;
mod cameras;
mod chat;
mod cli;
mod config_doc;
mod crash;
mod dashboard;
mod defects;
mod disk_full;
mod docs;
mod estop;
mod external_clients;
mod feedback;
mod fleet;
mod fleet_env;
mod fleet_scale;
mod foxglove;
mod guides;
mod hardware_e2e;
mod host_tools;
mod hosts_wire;
mod manual;
mod mcp;
mod metrics;
mod modbus;
mod mqtt;
mod ooda;
mod persistence;
mod providers;
mod reachability;
mod record;
mod safety_wire;
mod scopes;
mod serial;
mod session;
mod sim_world;
mod stop_requests;
mod systemd_unit;
mod tasks;
mod tls;
mod wire;
