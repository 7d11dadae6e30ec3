//! spate: a thread-per-core, shared-nothing event stream engine.
//!
//! Producers send `KEY PAYLOAD\n` lines over TCP; each event is routed by a
//! stable hash of its key to one of a fixed number of partitions, and every
//! partition is owned by exactly one shard (one glommio executor on one
//! core). Shards share nothing: events cross between them in batches over
//! glommio's channel mesh, bounded by credits, so overload becomes TCP
//! backpressure instead of memory growth.
//!
//! The pieces, in data-path order:
//!
//! * [`protocol`]: the line format, the key hash, binary batch/log records
//!   and the subscribe request. Pure functions, no I/O.
//! * [`ingest`]: accepting producer connections and parsing their lines.
//! * [`shard`]: the per-core runtime: the [`shard::router::Router`] (batches
//!   and credits), mesh frames, the flusher and the appliers.
//! * [`partition`]: partition logs and the placement table.
//! * [`subscribe`]: pull-based subscriptions (replay, then live tail).
//! * [`admin`]: `/metrics`, `/stats`, `/partitions` over HTTP.
//! * [`config`]: every limit, with its memory cost.
//! * [`pub_client`]: `spate pub`, a producer that maps rejected lines back to
//!   its input files.
//!
//! ```
//! use spate::protocol::{Line, parse_line, partition_of};
//! let line = parse_line(b"user42 clicked", 1 << 20).unwrap();
//! let Line::Event { key, payload } = line else { unreachable!() };
//! assert_eq!(payload, b"clicked");
//! assert!(partition_of(key, 256) < 256);
//! ```

pub mod admin;
pub mod balance;
pub mod bench;
pub mod client;
pub mod config;
pub mod ingest;
pub mod partition;
pub mod protocol;
pub mod pub_client;
pub mod server;
pub mod shard;
pub mod subscribe;

pub use config::Config;
pub use server::{ServeError, serve};
