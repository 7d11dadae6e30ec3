//! Every limit and default of a server, each with its unit and what it
//! costs in memory, in three layers:
//!
//! - [`limits`]: the constants. It imports nothing from the crate, so every
//!   module may use it; its top doc says which limits live there and which
//!   with their owners.
//! - [`flags`]: `spate serve`'s flags ([`Config`], clap), the values they
//!   resolve to, and the checks that tie them together.
//! - [`memory`]: the peak-memory formula ([`Config::memory_bound`]) and its
//!   `--help` text, made from one table, and the file-descriptor budget.
//!
//! Everything is re-exported here (`crate::config::Config`,
//! `crate::config::STORAGE_RETRY_MS`). [`Config::validate`] lives here
//! because it runs the checks of both `flags` and `memory`.

pub mod flags;
pub mod limits;
pub mod memory;

pub use flags::{Config, ConfigError, Cpus, FsyncPolicy, HugePages, Listen, Rebalance, Storage, WalBypass};
pub use limits::*;
pub use memory::{FdBudget, MemoryBound, memory_formula_text};

impl Config {
    /// Checks that the limits fit together and that the memory bound they
    /// give fits in a `usize`; see each [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_flags()?;
        self.validate_memory_bound()
    }
}
