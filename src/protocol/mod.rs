//! Wire formats, pure and allocation-free on the hot path: the ingest line
//! format ([`line`]), the stable key hash ([`hash`]), binary batch and log
//! records ([`record`]) and the subscribe request ([`subscribe`]).

pub mod hash;
pub mod line;
pub mod record;
pub mod subscribe;

pub use hash::{key_hash, partition_of};
pub use line::{KEY_SIZE_MAX, Line, LineBuffer, LineError, Next, parse_line};
pub use record::{BatchIter, RecordRef, batch_record_size, encode_batch_record, write_event_line};
pub use subscribe::{PartitionSelector, StartOffset, SubscribeError, SubscribeRequest, parse_subscribe};
