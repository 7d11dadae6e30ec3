//! What every network face does with a connection before and around its
//! protocol: admit it against process-wide limits, accept through file
//! descriptor exhaustion, keep it alive, time it out, and close it.
//!
//! * [`admission`]: the process-wide connection count and subscriber slots
//!   (atomics shared by every shard: not the data path), so a connection is
//!   refused only when the whole process is full, wherever the kernel's
//!   `SO_REUSEPORT` placed it, and a subscribe connection that has not sent
//!   its request line gives its slot up to a newcomer at the limit;
//! * [`accept`]: an accept loop that survives `EMFILE`/`ENFILE`: it backs
//!   off, sheds the oldest idle or pre-`SUB` connection, counts the failures
//!   and logs once per episode;
//! * [`registry`]: each shard's open connections and their sweeper, which
//!   closes connections that sent nothing in time (`--idle-timeout-ms`,
//!   `--subscribe-request-timeout-ms`), whose subscriber slot was taken
//!   over, or that hold a line incomplete too long (`--line-timeout-ms`), gives idle
//!   connections' grown buffers back, and cuts every connection at the
//!   shutdown deadline;
//! * [`socket`]: TCP keepalive on accepted sockets and the last words to a
//!   connection being closed, bounded in time.

pub mod accept;
pub mod admission;
pub mod registry;
pub mod socket;

use std::rc::Rc;
use std::sync::Arc;

pub use admission::Admission;
pub use registry::{CloseReason, Connection, Connections, Face};

/// One shard's view of the network services the faces share.
pub struct ShardNet {
    pub admission: Arc<Admission>,
    pub connections: Rc<Connections>,
    pub refusals: Rc<socket::Refusals>,
}
