//! Subscribers: `SUB <partition|*> <offset|earliest|latest>` on the subscribe
//! port, then `<partition> <offset> <key> <payload>` lines, replay then live
//! tail, in offset order per partition.
//!
//! Subscriptions **pull**. The shard that accepted the subscriber keeps the
//! cursors and sends each owner shard at most one
//! [`FetchRequest`](crate::partition::fetch::FetchRequest) at a time
//! (carrying the cursors of the partitions that owner holds) with a byte
//! budget. The owner answers at once with what its logs have, or parks the
//! request until one of those partitions is appended to
//! ([`crate::partition::fetch`] is the owner's side). So:
//!
//! * a slow subscriber only delays its own next fetch: the log keeps the
//!   events (up to retention), ingest never waits for a subscriber;
//! * memory per subscriber is bounded by `shards * fetch_bytes_max`;
//! * cursors live with the subscription, not with the partition, so a
//!   partition that moves to another shard only changes where the next fetch
//!   goes (an owner that no longer has a partition answers "moved");
//! * a subscriber whose cursor fell behind retention gets one line
//!   `TRUNCATED <partition> <requested-offset> <next-readable-offset>` and the
//!   stream continues from the next readable offset; it never skips silently.

mod session;

pub use session::serve_subscriber;
