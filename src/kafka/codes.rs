//! The Kafka error codes spate answers with (Kafka's `Errors.java`).

pub const NONE: i16 = 0;
pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const CORRUPT_MESSAGE: i16 = 2;
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub const MESSAGE_TOO_LARGE: i16 = 10;
pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
pub const INVALID_REQUIRED_ACKS: i16 = 21;
pub const UNSUPPORTED_VERSION: i16 = 35;
pub const TOPIC_ALREADY_EXISTS: i16 = 36;
pub const INVALID_PARTITIONS: i16 = 37;
pub const INVALID_REPLICATION_FACTOR: i16 = 38;
pub const INVALID_REQUEST: i16 = 42;
pub const POLICY_VIOLATION: i16 = 44;
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
pub const INVALID_PRODUCER_EPOCH: i16 = 47;
pub const KAFKA_STORAGE_ERROR: i16 = 56;
pub const UNSUPPORTED_COMPRESSION_TYPE: i16 = 76;
pub const UNKNOWN_SERVER_ERROR: i16 = -1;
