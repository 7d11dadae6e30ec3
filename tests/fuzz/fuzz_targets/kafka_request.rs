//! Fuzzes the Kafka request decoder (`spate::kafka::decode_request`): the
//! header, the body with the `kafka-protocol` decoder of every API and
//! version spate serves, and a Produce's record batches and records. No
//! input may panic, abort or allocate beyond its size (a Metadata request
//! whose array claimed 2^31 entries once made the decoder reserve 154 GB).
#![no_main]

use libfuzzer_sys::fuzz_target;

/// The record size limit of a default server (1 MiB lines).
const RECORD_SIZE_MAX: usize = 1 << 20;

fuzz_target!(|request: &[u8]| {
    let _ = spate::kafka::decode_request(bytes::Bytes::copy_from_slice(request), RECORD_SIZE_MAX);
});
