//! Configuration: TOML text -> validated, typed [`Config`].
//!
//! Every error names the file, the line and the key, so an operator can fix a
//! broken `/etc/rozd/rozd.toml` without reading source code. Validation is
//! complete before anything binds a socket or touches hardware.
//!
//! - [`types`]: the shared leaf types (sections and values other modules
//!   take, and [`Invalid`], the one shape of a validation failure); it
//!   imports nothing of rozd but `units`.
//! - [`broker`]: the broker address and connection fields `[mqtt]` and
//!   `[fleet]` share; a leaf too.
//! - [`units`]: `_secs` and `_ms` keys read straight into `Duration`s; a
//!   leaf.
//! - `load`: the aggregate [`Config`]: finds, reads and validates, calling
//!   the sub-modules' validators (hw, safety, ooda, model, fleet).
//! - `server`: `[server]` as written and its validation into the listener's
//!   settings ([`ServerConfig`]) and credentials ([`AuthConfig`]).
//! - `summary`: `rozd check`'s human-readable summary.
//! - `locate`: the line of a key, from the `toml` crate's spans.
//!
//! Sub-modules import only `config::types`, `config::broker` and
//! `config::units`, never the
//! aggregate (the test `sub_modules_do_not_import_the_aggregate` keeps it so).

pub(crate) mod broker;
mod load;
mod locate;
mod scope;
mod server;
mod summary;
pub(crate) mod types;
pub(crate) mod units;
mod wording;

pub use load::{
    BUILTIN_CONFIG, BUILTIN_MANUAL, BUILTIN_NAME, CONFIG_ENV, Config, ConfigError, ConfigSource,
    OodaConfig, SYSTEM_CONFIG_PATH,
};
pub use types::*;

#[cfg(test)]
mod modbus_tests;
#[cfg(test)]
mod section_tests;
#[cfg(test)]
mod tests;
