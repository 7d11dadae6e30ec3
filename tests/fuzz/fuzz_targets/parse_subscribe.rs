//! Fuzzes `parse_subscribe`: no panic, and a request that passes its check
//! names a partition inside the partition count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate::protocol::{PartitionSelector, parse_subscribe};

const PARTITION_COUNT: u32 = 256;

fuzz_target!(|line: &[u8]| {
    if let Ok(request) = parse_subscribe(line) {
        if request.check(PARTITION_COUNT).is_ok()
            && let PartitionSelector::One(partition) = request.partitions
        {
            assert!(partition < PARTITION_COUNT);
        }
    }
});
