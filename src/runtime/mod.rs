//! Single-threaded async building blocks that every layer may use and that
//! know nothing of spate: wake-ups and waits for tasks on one shard
//! ([`notify`]).

pub mod notify;
