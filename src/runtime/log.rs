//! The server's log: one line per thing that happened, on stderr.
//!
//! A call site says how much it matters and what happened; this module
//! decides how the line looks:
//!
//! ```text
//! spate: shard 3: stream orders: warning: aggregate checkpoint of partition 7: fsync ...: No space left on device
//! └───┘  └──────┘ └────────────┘ └───────┘ └── what happened (the call site's words)
//! binary  scope (either or both may be absent)   level (absent for info)
//! ```
//!
//! ```ignore
//! use crate::runtime::log;
//! log::info!("stopped cleanly after {elapsed:.1}s");
//! log::warn!(shard = shard.id, "retention could not delete {}: {error}", path.display());
//! log::error!(shard = shard.id, stream = &spec.name, "closing partition {partition_id}: {error}");
//! ```
//!
//! The levels, and when each is the right one:
//!
//! * **error**: something failed that spate does not fix by itself: a shard
//!   ended, the admin port cannot serve, a watchdog could not start. An
//!   operator has to act.
//! * **warning**: something failed and spate copes (retries, backs off,
//!   skips, replays): a full disk, descriptors running out, a corrupt
//!   checkpoint. Worth reading; nothing is lost.
//! * **info**: a state an operator wants to see change: the start-up
//!   banner, a torn tail cut by recovery, "works again", "stopped cleanly".
//!
//! There are no timestamps: under systemd the journal adds them, and tests
//! read the lines as they are. A line is written with one `eprintln!` call
//! under the standard library's stderr lock, so lines of different threads
//! never interleave. Nothing here allocates: the message is a
//! [`std::fmt::Arguments`] formatted straight into stderr, and the level and
//! the scope are `Copy` values. Nothing logs per event either; a condition
//! that can repeat fast (every accept, every retry, every commit round) is
//! an [`Episode`]: logged when it starts, counted while it lasts, and logged
//! again, with the count, when it ends.

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, Instant};

/// How much a line matters (see the module doc for which to use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl fmt::Display for Level {
    /// The level's tag in a line: info lines carry none, so that the lines
    /// an operator reads most often stay short.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::Info => Ok(()),
            Level::Warn => f.write_str("warning: "),
            Level::Error => f.write_str("error: "),
        }
    }
}

/// Where a line comes from: the whole process, or one shard, and
/// optionally one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scope<'a> {
    shard: Option<u16>,
    stream: Option<&'a str>,
}

impl<'a> Scope<'a> {
    /// The process as a whole (start-up, shutdown, the admin thread).
    pub const fn process() -> Scope<'static> {
        Scope { shard: None, stream: None }
    }

    /// One shard (by its mesh peer id).
    pub const fn shard(id: u16) -> Scope<'static> {
        Scope { shard: Some(id), stream: None }
    }

    /// The same scope, narrowed to one stream.
    pub const fn stream<'b>(self, name: &'b str) -> Scope<'b> {
        Scope { shard: self.shard, stream: Some(name) }
    }
}

impl fmt::Display for Scope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(shard) = self.shard {
            write!(f, "shard {shard}: ")?;
        }
        if let Some(stream) = self.stream {
            write!(f, "stream {stream}: ")?;
        }
        Ok(())
    }
}

/// One whole line, without its newline.
struct Line<'a> {
    level: Level,
    scope: Scope<'a>,
    message: fmt::Arguments<'a>,
}

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spate: {}{}{}", self.scope, self.level, self.message)
    }
}

/// Writes one line to stderr. Call sites use [`info!`], [`warn!`] and
/// [`error!`], which build the scope and the arguments.
pub fn write(level: Level, scope: Scope<'_>, message: fmt::Arguments<'_>) {
    eprintln!("{}", Line { level, scope, message });
}

/// The line [`write`] would print (for tests).
#[cfg(test)]
fn render(level: Level, scope: Scope<'_>, message: fmt::Arguments<'_>) -> String {
    Line { level, scope, message }.to_string()
}

/// A condition that can repeat fast (accepts failing for lack of file
/// descriptors, a full disk failing every retry), logged once when it
/// starts and once when it ends instead of on every occurrence: the end
/// line says how many there were and how many were not logged.
///
/// Interior mutability, so a shard's structs (shared by `&` among its
/// tasks) can hold one; it is `Send` but not `Sync`, like the rest of a
/// shard's state.
#[derive(Debug)]
pub struct Episode {
    /// What one occurrence is, plural, for the end line ("failed accepts").
    what: &'static str,
    /// Occurrences in the current episode; 0 when none is running.
    occurrences: Cell<u64>,
    started: Cell<Option<Instant>>,
    last: Cell<Option<Instant>>,
}

/// What an episode added up to, said on the line that ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeSummary {
    what: &'static str,
    pub occurrences: u64,
    /// From the first occurrence to the last.
    pub lasted: Duration,
}

impl EpisodeSummary {
    /// The occurrences that were counted but not logged (all but the first).
    pub fn suppressed(&self) -> u64 {
        self.occurrences.saturating_sub(1)
    }
}

impl fmt::Display for EpisodeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} over {:.1} s, {} not logged",
            self.what,
            self.occurrences,
            self.lasted.as_secs_f64(),
            self.suppressed()
        )
    }
}

impl Episode {
    /// A quiet episode; `what` names one occurrence, plural.
    pub const fn new(what: &'static str) -> Episode {
        Episode { what, occurrences: Cell::new(0), started: Cell::new(None), last: Cell::new(None) }
    }

    /// Counts one occurrence at `now` and logs `message` if it starts an
    /// episode. Returns whether it did.
    pub fn occur(&self, now: Instant, level: Level, scope: Scope<'_>, message: fmt::Arguments<'_>) -> bool {
        let starts = self.count(now);
        if starts {
            write(level, scope, message);
        }
        starts
    }

    /// Ends the episode, if one is running, with `message` followed by what
    /// it added up to. Returns whether one was running (and so logged).
    pub fn end(&self, now: Instant, level: Level, scope: Scope<'_>, message: fmt::Arguments<'_>) -> bool {
        match self.close(now) {
            Some(summary) => {
                write(level, scope, format_args!("{message} ({summary})"));
                true
            }
            None => false,
        }
    }

    /// Whether an episode is running.
    pub fn is_active(&self) -> bool {
        self.occurrences.get() > 0
    }

    /// Occurrences in the running episode (0 when none runs).
    pub fn occurrences(&self) -> u64 {
        self.occurrences.get()
    }

    /// How long ago the last occurrence of the running episode was.
    pub fn quiet_for(&self, now: Instant) -> Option<Duration> {
        self.last.get().map(|last| now.saturating_duration_since(last))
    }

    /// Counts one occurrence; true when it starts an episode.
    fn count(&self, now: Instant) -> bool {
        let occurrences = self.occurrences.get();
        if occurrences == 0 {
            self.started.set(Some(now));
        }
        self.occurrences.set(occurrences.saturating_add(1));
        self.last.set(Some(now));
        occurrences == 0
    }

    /// Ends the running episode, returning what it added up to.
    fn close(&self, now: Instant) -> Option<EpisodeSummary> {
        let occurrences = self.occurrences.replace(0);
        let started = self.started.take();
        let last = self.last.take().unwrap_or(now);
        let started = started.filter(|_| occurrences > 0)?;
        Some(EpisodeSummary { what: self.what, occurrences, lasted: last.saturating_duration_since(started) })
    }
}

/// Logs at `$level` (a [`Level`] variant's name), with an optional
/// `shard = ID,` and `stream = NAME,` before the format string.
macro_rules! log_at {
    ($level:ident, shard = $shard:expr, stream = $stream:expr, $($message:tt)+) => {
        $crate::runtime::log::write(
            $crate::runtime::log::Level::$level,
            $crate::runtime::log::Scope::shard($shard).stream($stream),
            format_args!($($message)+),
        )
    };
    ($level:ident, shard = $shard:expr, $($message:tt)+) => {
        $crate::runtime::log::write(
            $crate::runtime::log::Level::$level,
            $crate::runtime::log::Scope::shard($shard),
            format_args!($($message)+),
        )
    };
    ($level:ident, stream = $stream:expr, $($message:tt)+) => {
        $crate::runtime::log::write(
            $crate::runtime::log::Level::$level,
            $crate::runtime::log::Scope::process().stream($stream),
            format_args!($($message)+),
        )
    };
    ($level:ident, $($message:tt)+) => {
        $crate::runtime::log::write(
            $crate::runtime::log::Level::$level,
            $crate::runtime::log::Scope::process(),
            format_args!($($message)+),
        )
    };
}

/// Logs a state change an operator wants to see.
macro_rules! log_info {
    ($($arguments:tt)+) => { $crate::runtime::log::log_at!(Info, $($arguments)+) };
}

/// Logs a failure spate copes with by itself.
macro_rules! log_warn {
    ($($arguments:tt)+) => { $crate::runtime::log::log_at!(Warn, $($arguments)+) };
}

/// Logs a failure an operator has to act on.
macro_rules! log_error {
    ($($arguments:tt)+) => { $crate::runtime::log::log_at!(Error, $($arguments)+) };
}

// Defined under other names and renamed on export: a `macro_rules! warn`
// used by its own name is ambiguous with the built-in `#[warn]` attribute.
pub(crate) use {log_at, log_error as error, log_info as info, log_warn as warn};

#[cfg(test)]
mod tests {
    use super::*;

    /// A line is `spate: `, then the shard and the stream when given, then
    /// the level's tag (none for info), then the message: the format the
    /// README quotes and the tests grep (`spate: shard S: recovered ...`).
    #[test]
    fn lines_have_one_format() {
        let path = "/data/streams/default/0/00000000000000000000.log";
        assert_eq!(
            render(Level::Info, Scope::shard(2), format_args!("recovered {path}: kept 10 bytes")),
            format!("spate: shard 2: recovered {path}: kept 10 bytes")
        );
        assert_eq!(render(Level::Info, Scope::process(), format_args!("stopped cleanly")), "spate: stopped cleanly");
        assert_eq!(
            render(Level::Warn, Scope::shard(0).stream("orders"), format_args!("checkpoint of partition {}", 7)),
            "spate: shard 0: stream orders: warning: checkpoint of partition 7"
        );
        assert_eq!(
            render(Level::Error, Scope::process().stream("clicks"), format_args!("x")),
            "spate: stream clicks: error: x"
        );
    }

    /// The macros build the scope their `shard =` / `stream =` prefixes
    /// name and accept every `format_args!` form (captured identifiers
    /// included); they compile to a call of [`write`].
    #[test]
    fn macros_accept_every_scope() {
        let (shard, stream, error) = (3u16, "orders", "disk full");
        info!("plain {error}");
        warn!(shard = shard, "shard {}", error);
        error!(shard = shard, stream = stream, "both {error}");
        info!(stream = stream, "stream only");
    }

    /// An episode logs its first occurrence only, counts the others, and
    /// its end reports how many there were, over how long, and how many
    /// were not logged; then it is quiet, and the next occurrence starts a
    /// new one.
    #[test]
    fn an_episode_logs_its_start_and_its_end_with_the_count() {
        let episode = Episode::new("failed accepts");
        let start = Instant::now();
        assert!(!episode.is_active());
        assert_eq!(episode.close(start), None, "no episode, no end line");
        assert!(episode.count(start), "the first occurrence starts it");
        for step in 1..=4u64 {
            assert!(!episode.count(start + Duration::from_millis(500 * step)), "later ones are quiet");
        }
        assert!(episode.is_active());
        assert_eq!(episode.occurrences(), 5);
        assert_eq!(episode.quiet_for(start + Duration::from_millis(2500)), Some(Duration::from_millis(500)));
        let summary = episode.close(start + Duration::from_secs(9)).expect("it was running");
        assert_eq!(summary.occurrences, 5);
        assert_eq!(summary.suppressed(), 4);
        assert_eq!(summary.lasted, Duration::from_secs(2), "first to last occurrence, not to the end");
        assert_eq!(summary.to_string(), "failed accepts: 5 over 2.0 s, 4 not logged");
        assert!(!episode.is_active());
        assert_eq!(episode.quiet_for(start), None);
        assert_eq!(episode.close(start), None, "an end is said once");
        assert!(episode.count(start + Duration::from_secs(10)), "a new episode starts");
    }

    /// `occur` and `end` say whether they logged, so a caller can pair an
    /// unconditional line with an episode that may not be running.
    #[test]
    fn occur_and_end_say_whether_they_logged() {
        let episode = Episode::new("failed writes");
        let now = Instant::now();
        let scope = Scope::shard(1);
        assert!(!episode.end(now, Level::Info, scope, format_args!("writes work again")));
        assert!(episode.occur(now, Level::Warn, scope, format_args!("write failed")));
        assert!(!episode.occur(now, Level::Warn, scope, format_args!("write failed")));
        assert!(episode.end(now, Level::Info, scope, format_args!("writes work again")));
        assert!(!episode.end(now, Level::Info, scope, format_args!("writes work again")));
    }
}
