//! Every wire format spate speaks, written and parsed in one place, pure and
//! allocation-free on the hot path:
//!
//! * [`line`]: the ingest line format and the connection's line splitter;
//! * [`control`]: ingest control lines (`#SYNC`, `#PING`) and the `OK`/`ERR`
//!   replies;
//! * [`subscribe`]: the `SUB` request and every line a subscriber reads;
//! * [`group`]: the consumer-group conversation (`GROUP`, `COMMIT`, `PING`,
//!   `LEAVE`; `ASSIGNED`, `REVOKED`, `OK COMMIT`, `ERR`) on the subscribe port;
//! * [`record`]: binary event records (mesh batches and partition logs);
//! * [`hash`]: the stable key hash that places a key in a partition.
//! * [`json`]: JSON lines (the JSON listener), key from a field;
//! * [`ilp`]: the InfluxDB line protocol (the ILP listener), key = series.

pub mod control;
pub mod group;
pub mod hash;
pub mod ilp;
pub mod json;
pub mod line;
pub mod record;
pub mod subscribe;

pub use control::{Control, Reply, parse_control, parse_reply};
pub use hash::{Partitioner, key_hash, murmur2, murmur2_partition_of, partition_of};
pub use line::{KEY_SIZE_MAX, Line, LineBuffer, LineError, Next, parse_line, parse_line_with};
pub use record::{BatchIter, RecordRef, batch_record_size, encode_batch_record};
pub use subscribe::{
    EventLinePrefix, PartitionSelector, StartOffset, SubscribeError, SubscribeRequest, SubscriberLine,
    closing_positions, parse_subscribe, parse_subscriber_line, unescape_key, write_closing_end, write_closing_entry,
    write_closing_start, write_event_line, write_offset_out_of_range, write_prefixed_event_line, write_truncated,
};
