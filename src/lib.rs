//! spate: a thread-per-core, shared-nothing event stream engine.
//!
//! Producers send `KEY PAYLOAD\n` lines (or JSON lines, or the InfluxDB line
//! protocol) over TCP to a named stream; each event is routed by a stable
//! hash of its key to one of the stream's partitions, and every
//! partition is owned by exactly one shard (one glommio executor on one
//! core). Shards share nothing: events cross between them in batches over
//! glommio's channel mesh, bounded by credits, so overload becomes TCP
//! backpressure instead of memory growth.
//!
//! The path of an event, and the module that owns each step:
//!
//! 1. [`protocol`]: the bytes on every wire (ingest lines, control lines and
//!    replies, `SUB` and subscriber lines, binary records, the key hash).
//! 2. `ingest` (private): a connection task reads big chunks, splits lines
//!    and hands each event to the shard's ingress (`shard::ingress`), the
//!    one entry point of every ingest format, which batches it for its
//!    partition's owner shard and spends credits.
//! 3. `shard` (private): the per-core runtime that owns its services and
//!    dispatches mesh frames: batches to apply, credit grants, fetches, load
//!    reports, migrations.
//! 4. [`partition`]: the owner side, pure: the log, the placement table,
//!    applying a batch, the migration state machine, serving fetches.
//! 5. `subscribe` (private): a subscriber's session pulls from every owner,
//!    where its fetch stands and is answered as events arrive
//!    ([`partition::fetch`]); a consumer-group member's session pulls one
//!    reply at a time for the partitions its group's coordinator ([`group`],
//!    `shard::groups`) assigns it.
//! 6. [`balance`]: load reports and the stealing rule, and the simulator
//!    that drives the rule and the migration state machine.
//! 7. `net` (private): what every face does around its protocol: process-wide
//!    connection limits, accept through file-descriptor exhaustion, idle and
//!    line timeouts, keepalive, the shutdown deadline.
//! 8. `serve` and `admin` (private): start-up, shutdown, the HTTP admin port
//!    (and the stream catalog's `/streams`).
//! 9. [`storage`] and [`stream`]: the bytes on disk (frames, segments,
//!    indexes, recovery, the data directory) and the named streams a
//!    partition belongs to. A shard's committer (`shard::commit`) writes and
//!    syncs each partition's new frames before it returns the credits.
//! 10. [`aggregate`]: keyed aggregates (counts, sums, windows) that a
//!     partition runs on its events as they are applied; `shard::aggregates`
//!     routes their closed windows to an output stream, checkpoints them
//!     next to the log and recovers them by replay.
//!
//! ```
//! use spate::protocol::{Line, parse_line, partition_of};
//! let line = parse_line(b"user42 clicked", 1 << 20).unwrap();
//! let Line::Event { key, payload } = line else { unreachable!() };
//! assert_eq!(payload, b"clicked");
//! assert!(partition_of(key, 256) < 256);
//! ```

mod admin;
pub mod aggregate;
pub mod balance;
pub mod bench;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod group;
mod ingest;
pub mod kafka;
mod net;
pub mod partition;
pub mod protocol;
pub mod replication;
pub mod routing;
pub mod runtime;
mod serve;
mod shard;
pub mod storage;
pub mod stream;
pub mod subscribe;
pub mod transport;

pub use config::Config;
pub use serve::{ServeError, serve};
