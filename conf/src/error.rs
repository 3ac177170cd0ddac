//! Configuration errors.

use std::path::PathBuf;

/// What can go wrong while loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML for [`crate::Config`].
    #[error("invalid config file: {source}")]
    Toml {
        /// The parse error, naming the key and line.
        #[source]
        source: toml::de::Error,
    },
    /// A `SLUICE_*` environment variable names no key or holds a bad value.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// Why it was refused.
        reason: String,
    },
    /// A value parsed but is out of range.
    #[error("config key {key}: {reason}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// Why it was refused.
        reason: String,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
