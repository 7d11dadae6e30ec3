//! Wire formats, pure and allocation-free on the hot path: the ingest line
//! format ([`line`]), the stable key hash ([`hash`]), binary batch and log
//! records ([`record`]), the subscribe request ([`subscribe`]), and the
//! formats of the other listeners: JSON lines ([`json`]) and the InfluxDB
//! line protocol ([`ilp`]).

pub mod hash;
pub mod ilp;
pub mod json;
pub mod line;
pub mod record;
pub mod subscribe;

pub use hash::{key_hash, partition_of};
pub use line::{KEY_SIZE_MAX, Line, LineBuffer, LineError, Next, parse_line};
pub use record::{BatchIter, RecordRef, batch_record_size, encode_batch_record, write_event_line};
pub use subscribe::{PartitionSelector, StartOffset, SubscribeError, SubscribeRequest, parse_subscribe};
