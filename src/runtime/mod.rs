//! Single-threaded async building blocks that every layer may use and that
//! know nothing of spate: wake-ups and waits for tasks on one shard
//! ([`notify`]), software prefetch hints ([`prefetch`]), and the server's
//! log lines with their rate limit per episode ([`log`]), where each
//! executor's start-up is ([`stage`]), the process's allocator
//! ([`memory`]), file I/O submitted without waiting for the executor's
//! next pass ([`submit`]), the priority of the control threads
//! ([`priority`]), and long loops that let a waiting request in ([`slice`]).

pub mod log;
pub mod memory;
pub mod notify;
pub mod prefetch;
pub mod priority;
pub mod slice;
pub mod stage;
pub mod submit;
