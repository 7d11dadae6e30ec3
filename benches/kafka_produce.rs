//! The Kafka face's per-record cost on the Produce path, in ns/event.
//!
//! * `check_entry`: [`EntryCheck::check`] of one partition entry as the
//!   bench's Kafka target sends it (one v2 batch of 450 records, 8-byte
//!   keys, 64-byte values, no headers, encoded by the `kafka-protocol`
//!   crate): the CRC, the decode of every record, its checks and its
//!   staging (the owner's batch encoding).
//! * `group_staged`: [`RecordOrder::group`] of an owner batch made of such
//!   staged records for 16 partitions, as `apply_batch` orders a large
//!   batch before applying it.
//! * `memcpy`: a copy of the entry's bytes, the baseline the others are
//!   given as a multiple of (STYLE.md: ratios against a baseline measured
//!   in the same process).
//!
//! Each line is the fastest of 15 runs. Run: `nice cargo bench --bench kafka_produce`.

mod common;

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use common::fastest_ns_per_event;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions};
use spate::bench::kafka::record;
use spate::kafka::batch::EntryCheck;
use spate::partition::apply::RecordOrder;

const RECORDS_PER_ENTRY: usize = 450;
const ENTRIES_PER_RUN: usize = 2_000;

/// One batch as the bench's Kafka target sends it for a partition.
fn entry() -> Bytes {
    let records: Vec<Record> = (0..RECORDS_PER_ENTRY)
        .map(|index| {
            let key = Bytes::from(format!("user{:04}", index * 7 % 10_000));
            record(index as i64, 1_700_000_000_000, key, Bytes::from(vec![b'a' + (index % 26) as u8; 64]))
        })
        .collect();
    let mut encoded = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut encoded, records.iter(), &options).expect("the batch encodes");
    encoded.freeze()
}

fn main() {
    let entry = entry();
    let mut copy = Vec::with_capacity(entry.len());
    let memcpy = fastest_ns_per_event(|| {
        for _ in 0..ENTRIES_PER_RUN {
            copy.clear();
            copy.extend_from_slice(black_box(&entry));
            black_box(&copy);
        }
        ENTRIES_PER_RUN * RECORDS_PER_ENTRY
    });
    let mut check = EntryCheck::default();
    let check_entry = fastest_ns_per_event(|| {
        for index in 0..ENTRIES_PER_RUN {
            check.check(black_box(&entry), (index % 16) as u32, 1 << 20).expect("the entry is valid");
            black_box(check.staged(0));
        }
        ENTRIES_PER_RUN * RECORDS_PER_ENTRY
    });
    // An owner batch of about 256 KiB: staged records of 16 partitions.
    let mut owner_batch = Vec::new();
    for partition in 0..16 {
        check.check(&entry, partition, 1 << 20).expect("the entry is valid");
        let run = check.staged(0).expect("staged");
        owner_batch.extend_from_slice(&run.encoded[run.start..*run.ends.last().expect("records") as usize]);
    }
    let mut order = RecordOrder::default();
    let group_staged = fastest_ns_per_event(|| {
        let mut events = 0;
        for _ in 0..ENTRIES_PER_RUN / 16 {
            events += order.group(black_box(&owner_batch)).len();
        }
        events
    });
    println!("memcpy of the entry ({} bytes): {memcpy:.1} ns/event", entry.len());
    println!(
        "check_entry ({RECORDS_PER_ENTRY} records): {check_entry:.1} ns/event ({:.1}x memcpy)",
        check_entry / memcpy
    );
    println!(
        "group_staged ({} bytes, 16 partitions): {group_staged:.1} ns/event ({:.1}x memcpy)",
        owner_batch.len(),
        group_staged / memcpy
    );
}
