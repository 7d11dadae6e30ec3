//! Where each executor's start-up is, so a start that never finishes says
//! where it stopped.
//!
//! A shard names each step of its start ([`set`]) on its way to serving;
//! when `--start-timeout-ms` passes first, the error lists every executor
//! that did not reach [`STARTED`] with its last step and how long ago it
//! began ([`describe_unfinished`]). A rare start-up hang seen in CI left
//! a shard asleep with nothing in flight; this turns the next one into the
//! await it sat in. Start-up only: a few dozen lock takes per shard.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// The last step: the shard serves.
pub const STARTED: &str = "started";

struct Stage {
    shard: Option<u16>,
    step: String,
    since: Instant,
}

static STAGES: Mutex<BTreeMap<usize, Stage>> = Mutex::new(BTreeMap::new());

/// Records that this executor (shard `shard`, once known) is at `step`.
pub fn set(shard: Option<u16>, step: impl Into<String>) {
    let executor = glommio::executor().id();
    let stage = Stage { shard, step: step.into(), since: Instant::now() };
    if let Ok(mut stages) = STAGES.lock() {
        stages.insert(executor, stage);
    }
}

/// One line per executor that has not reached [`STARTED`]: its shard, its
/// last step and for how long it has been there.
pub fn describe_unfinished() -> String {
    let Ok(stages) = STAGES.lock() else { return String::new() };
    let lines: Vec<String> = stages
        .iter()
        .filter(|(_, stage)| stage.step != STARTED)
        .map(|(executor, stage)| {
            let who = stage.shard.map_or_else(|| format!("executor {executor}"), |shard| format!("shard {shard}"));
            format!("{who}: {} (for {} ms)", stage.step, stage.since.elapsed().as_millis())
        })
        .collect();
    lines.join("; ")
}
