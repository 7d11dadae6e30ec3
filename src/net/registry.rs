//! Each shard's open connections, for what no single connection task can
//! do for itself: notice that it has waited too long, give memory back while
//! it sleeps, be shed when the process runs out of file descriptors or when
//! a newcomer took its subscriber slot over, and be cut at the shutdown
//! deadline.
//!
//! A connection task registers at accept and gets a [`Connection`] handle;
//! it tells the handle what it is doing (greeted or not, waiting on its
//! socket or busy, holding an incomplete line) with plain `Cell` writes, no
//! syscalls. The shard's sweeper ([`Connections::run_sweeper`]) looks at
//! every entry when the soonest deadline it knows of comes (at most
//! [`CONNECTION_SWEEP_INTERVAL_MS`] late, and at least every
//! [`Connections::sweep_interval_max`]) and asks a connection to
//! close (with a [`CloseReason`]) or to trim its buffers; the task races its
//! work against [`Connection::close_requested`] and its socket reads against
//! [`Connection::trim_requested`]. The decisions ([`Connections::sweep`],
//! [`Connections::shed_oldest`]) take the clock as an argument, so they are
//! unit-tested without sockets.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::config::{Config, IDLE_TRIM_MS};
use crate::net::admission::SubscriberSlot;
use crate::runtime::notify::{Notify, WaitList, first};
use crate::shard::lifecycle::Lifecycle;

/// The shortest time between two sweeps of a shard's connections, in ms: a
/// timeout, a buffer trim or the shutdown deadline fires up to this late.
pub const CONNECTION_SWEEP_INTERVAL_MS: u64 = 100;

/// The longest time between two sweeps while connections are open, in ms.
/// A deadline that starts between sweeps (a line left incomplete while the
/// connection waits on its socket) is written in a `Cell` that wakes no one,
/// so it is noticed at the next sweep: up to this late, or a quarter of the
/// shortest timeout if that is less. A shard whose connections all idle
/// wakes once a second for them, not ten times (tests/park_path).
pub const CONNECTION_SWEEP_INTERVAL_MAX_MS: u64 = 1000;

/// Which port a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    Ingest,
    Subscribe,
}

/// Why the server closes a connection that did nothing wrong in protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// No complete line within --idle-timeout-ms (ingest).
    IdleTimeout,
    /// No `SUB` or `GROUP` line within --subscribe-request-timeout-ms.
    RequestTimeout,
    /// A line stayed incomplete for --line-timeout-ms while spate waited.
    LineTimeout,
    /// The process ran out of file descriptors and this connection was the
    /// oldest idle or pre-`SUB` one.
    Shed,
    /// The subscriber limit was reached and a newcomer took over the slot of
    /// this connection, the oldest that had not sent its request line.
    ShedAtLimit,
    /// The shutdown deadline passed.
    ShutdownDeadline,
}

struct Entry {
    face: Face,
    accepted_at: Instant,
    /// A subscribe connection's process-wide slot, which a newcomer may take
    /// over until the request line comes. Taken out when the subscriber
    /// moves to another shard ([`Connection::take_subscriber_slot`]).
    subscriber_slot: RefCell<Option<SubscriberSlot>>,
    /// It sent its first complete line (ingest) or its `SUB`/`GROUP` line.
    greeted: Cell<bool>,
    /// The line number that is incomplete and since when spate has waited
    /// for the rest of it.
    partial: Cell<Option<(u64, Instant)>>,
    /// Since when the task waits for bytes from its socket; `None` while it
    /// parses, writes, or is stalled on credits (time that is spate's, not
    /// the peer's).
    reading_since: Cell<Option<Instant>>,
    /// It holds buffers above their idle size.
    holds_spare_memory: Cell<bool>,
    trim_requested: Cell<bool>,
    close: Cell<Option<CloseReason>>,
    waiters: WaitList,
}

impl Entry {
    fn request_close(&self, reason: CloseReason) {
        if self.close.get().is_none() {
            self.close.set(Some(reason));
            self.waiters.wake_all();
        }
    }
}

/// What one sweep asked for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    pub idle_timeouts: usize,
    pub request_timeouts: usize,
    pub sheds_at_limit: usize,
    pub line_timeouts: usize,
    pub deadline_cuts: usize,
    pub trims: usize,
    /// The soonest instant a connection still open may need the sweeper:
    /// a timeout or a trim that is due then, as things stand.
    pub next_due: Option<Instant>,
}

/// When each deadline of one connection comes, as it stands
/// ([`Connections::dues`]).
struct Dues {
    /// Not greeted yet: when its time to send its first line (ingest) or
    /// its request line (subscribe) is up, and the reason it then closes.
    greeting: Option<(Instant, CloseReason)>,
    /// Waiting on its socket with an incomplete line: the line's timeout.
    line: Option<Instant>,
    /// Waiting on its socket with spare buffer memory: when to trim it.
    trim: Option<Instant>,
}

impl Dues {
    fn soonest(&self) -> Option<Instant> {
        self.greeting.map(|(at, _)| at).into_iter().chain(self.line).chain(self.trim).min()
    }
}

/// Why a connection that has not sent its first line (ingest) or its
/// request line (subscribe) must close at `now`, if it must: its subscriber
/// slot was taken over, or its time to send it is up.
fn before_request_close(entry: &Entry, dues: &Dues, now: Instant) -> Option<CloseReason> {
    let (at, reason) = dues.greeting?;
    if entry.subscriber_slot.borrow().as_ref().is_some_and(SubscriberSlot::is_taken_over) {
        return Some(CloseReason::ShedAtLimit);
    }
    (now >= at).then_some(reason)
}

/// One shard's open connections.
pub struct Connections {
    entries: RefCell<Vec<Option<Rc<Entry>>>>,
    free: RefCell<Vec<usize>>,
    idle_timeout: Duration,
    /// How long a subscribe connection may take to send its request line.
    request_timeout: Duration,
    line_timeout: Duration,
    /// Wakes the sweeper, which waits here while no connection is open.
    registered: Notify,
}

impl Connections {
    pub fn new(config: &Config) -> Rc<Connections> {
        Rc::new(Connections {
            entries: RefCell::default(),
            free: RefCell::default(),
            idle_timeout: Duration::from_millis(config.idle_timeout_ms),
            request_timeout: Duration::from_millis(config.subscribe_request_timeout_ms),
            line_timeout: Duration::from_millis(config.line_timeout_ms),
            registered: Notify::default(),
        })
    }

    /// Registers a connection just accepted on `face`.
    pub fn register(self: &Rc<Self>, face: Face) -> Connection {
        self.register_entry(face, None)
    }

    /// Registers a subscribe connection just admitted into `slot`.
    pub fn register_subscriber(self: &Rc<Self>, slot: SubscriberSlot) -> Connection {
        self.register_entry(Face::Subscribe, Some(slot))
    }

    fn register_entry(self: &Rc<Self>, face: Face, subscriber_slot: Option<SubscriberSlot>) -> Connection {
        let entry = Rc::new(Entry {
            face,
            accepted_at: Instant::now(),
            subscriber_slot: RefCell::new(subscriber_slot),
            greeted: Cell::new(false),
            partial: Cell::new(None),
            reading_since: Cell::new(None),
            holds_spare_memory: Cell::new(false),
            trim_requested: Cell::new(false),
            close: Cell::new(None),
            waiters: WaitList::default(),
        });
        let mut entries = self.entries.borrow_mut();
        let index = self.free.borrow_mut().pop().unwrap_or_else(|| {
            entries.push(None);
            entries.len() - 1
        });
        entries[index] = Some(entry.clone());
        self.registered.notify();
        Connection { connections: self.clone(), index, entry }
    }

    /// Connections registered now.
    pub fn count(&self) -> usize {
        self.entries.borrow().len() - self.free.borrow().len()
    }

    /// Looks at every connection at `now`: asks those past a timeout (or
    /// all, past the shutdown `deadline`) to close, and idle ones holding
    /// spare memory to trim it.
    pub fn sweep(&self, now: Instant, deadline: Option<Instant>) -> Sweep {
        let mut sweep = Sweep { next_due: deadline.filter(|&deadline| now < deadline), ..Sweep::default() };
        let past_deadline = deadline.is_some_and(|deadline| now >= deadline);
        for entry in self.entries.borrow().iter().flatten() {
            if entry.close.get().is_some() {
                continue;
            }
            let dues = self.dues(entry);
            if let Some(due) = dues.soonest() {
                sweep.next_due = Some(sweep.next_due.map_or(due, |soonest| soonest.min(due)));
            }
            let reached = |due: Option<Instant>| due.is_some_and(|due| now >= due);
            if past_deadline {
                entry.request_close(CloseReason::ShutdownDeadline);
                sweep.deadline_cuts += 1;
            } else if let Some(reason) = before_request_close(entry, &dues, now) {
                entry.request_close(reason);
                match reason {
                    CloseReason::ShedAtLimit => sweep.sheds_at_limit += 1,
                    CloseReason::RequestTimeout => sweep.request_timeouts += 1,
                    _ => sweep.idle_timeouts += 1,
                }
            } else if reached(dues.line) {
                entry.request_close(CloseReason::LineTimeout);
                sweep.line_timeouts += 1;
            } else if reached(dues.trim) {
                entry.trim_requested.set(true);
                entry.waiters.wake_all();
                sweep.trims += 1;
            }
        }
        sweep
    }

    /// What comes due for `entry`, and when, as it stands: the sweep acts
    /// on those reached and sleeps until the soonest of the others.
    fn dues(&self, entry: &Entry) -> Dues {
        let greeting = (!entry.greeted.get()).then(|| match entry.face {
            Face::Ingest => (entry.accepted_at + self.idle_timeout, CloseReason::IdleTimeout),
            Face::Subscribe => (entry.accepted_at + self.request_timeout, CloseReason::RequestTimeout),
        });
        // The line timeout runs, and idle buffers wait for their trim, only
        // while spate waits on the socket.
        let reading_since = entry.reading_since.get();
        let line = entry.partial.get().filter(|_| reading_since.is_some()).map(|(_, since)| since + self.line_timeout);
        let trim = reading_since
            .filter(|_| entry.holds_spare_memory.get() && !entry.trim_requested.get())
            .map(|since| since + Duration::from_millis(IDLE_TRIM_MS));
        Dues { greeting, line, trim }
    }

    /// The longest the sweeper sleeps while connections are open:
    /// [`CONNECTION_SWEEP_INTERVAL_MAX_MS`], or a quarter of the shortest
    /// timeout, whichever is less (never under the minimum interval).
    pub fn sweep_interval_max(&self) -> Duration {
        let shortest = self.idle_timeout.min(self.request_timeout).min(self.line_timeout);
        (shortest / 4).clamp(
            Duration::from_millis(CONNECTION_SWEEP_INTERVAL_MS),
            Duration::from_millis(CONNECTION_SWEEP_INTERVAL_MAX_MS),
        )
    }

    /// Asks this shard's subscribe connections whose slot a newcomer took
    /// over to close now, rather than at the next sweep; returns how many.
    pub fn close_taken_over(&self) -> usize {
        let entries = self.entries.borrow();
        let mut closed = 0;
        for entry in entries.iter().flatten().filter(|entry| entry.close.get().is_none() && !entry.greeted.get()) {
            if entry.subscriber_slot.borrow().as_ref().is_some_and(SubscriberSlot::is_taken_over) {
                entry.request_close(CloseReason::ShedAtLimit);
                closed += 1;
            }
        }
        closed
    }

    /// Asks the oldest connection that has sent nothing yet (no line, no
    /// `SUB`) to close, or else the ingest connection idle the longest;
    /// returns its face, or `None` if no connection qualifies.
    pub fn shed_oldest(&self) -> Option<Face> {
        let entries = self.entries.borrow();
        let open = || entries.iter().flatten().filter(|entry| entry.close.get().is_none());
        let silent = open().filter(|entry| !entry.greeted.get()).min_by_key(|entry| entry.accepted_at);
        let idle = || {
            open()
                .filter(|entry| entry.face == Face::Ingest && entry.partial.get().is_none())
                .filter_map(|entry| entry.reading_since.get().map(|since| (since, entry)))
                .min_by_key(|(since, _)| *since)
                .map(|(_, entry)| entry)
        };
        let entry = silent.or_else(idle)?;
        entry.request_close(CloseReason::Shed);
        Some(entry.face)
    }

    /// The sweeper: runs [`Connections::sweep`] while any connection is
    /// open, until the executor exits, each time at the soonest deadline the
    /// last sweep saw, kept between [`CONNECTION_SWEEP_INTERVAL_MS`] and
    /// [`Connections::sweep_interval_max`] from now, and at once when
    /// shutdown is asked for (its deadline is then one of those it sees).
    /// With none open there is nothing to time out or trim, so it waits for
    /// the next registration.
    pub async fn run_sweeper(&self, lifecycle: &Lifecycle) {
        let interval_min = Duration::from_millis(CONNECTION_SWEEP_INTERVAL_MS);
        let interval_max = self.sweep_interval_max();
        let mut next = Instant::now() + interval_min;
        loop {
            if self.count() == 0 {
                self.registered.notified().await;
                next = Instant::now() + interval_min;
                continue;
            }
            let sleep = glommio::timer::sleep(next.saturating_duration_since(Instant::now()));
            if lifecycle.shutdown_deadline().is_none() {
                first(sleep, lifecycle.shutdown_requested()).await;
            } else {
                sleep.await;
            }
            let now = Instant::now();
            let sweep = self.sweep(now, lifecycle.shutdown_deadline());
            next = sweep.next_due.map_or(now + interval_max, |due| due.clamp(now + interval_min, now + interval_max));
        }
    }
}

/// A connection task's handle on its registry entry; dropping it
/// unregisters the connection.
pub struct Connection {
    connections: Rc<Connections>,
    index: usize,
    entry: Rc<Entry>,
}

impl Connection {
    /// It sent its first complete line or its `SUB` line: no idle timeout.
    pub fn greet(&self) {
        self.entry.greeted.set(true);
    }

    /// A subscribe connection sent its request line: it becomes a subscriber
    /// that is never shed at the limit nor timed out. Returns `false` (and
    /// asks the connection to close) if a newcomer took its slot over first.
    pub fn greet_subscriber(&self) -> bool {
        if self.entry.subscriber_slot.borrow().as_ref().is_some_and(|slot| !slot.activate()) {
            self.entry.request_close(CloseReason::ShedAtLimit);
            return false;
        }
        self.entry.greeted.set(true);
        true
    }

    /// Gives up the subscriber's process-wide slot, which goes with it to
    /// the shard it moves to (so its place is never free in between).
    pub fn take_subscriber_slot(&self) -> Option<SubscriberSlot> {
        self.entry.subscriber_slot.borrow_mut().take()
    }

    /// Why the server asked this connection to close, if it did.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.entry.close.get()
    }

    /// The line numbered `line_number` is incomplete (`None`: no line is).
    /// The line timeout runs from the first call for a line number.
    pub fn set_partial_line(&self, line_number: Option<u64>, now: Instant) {
        let partial = match (line_number, self.entry.partial.get()) {
            (None, _) => None,
            (Some(number), Some((current, since))) if number == current => Some((current, since)),
            (Some(number), _) => Some((number, now)),
        };
        self.entry.partial.set(partial);
    }

    /// The task starts (`Some(now)`) or stops (`None`) waiting on its socket.
    pub fn set_reading(&self, since: Option<Instant>) {
        self.entry.reading_since.set(since);
    }

    /// Whether it holds buffers above their idle size (worth a trim).
    pub fn set_holds_spare_memory(&self, holds: bool) {
        self.entry.holds_spare_memory.set(holds);
    }

    /// Resolves with the reason once the server wants this connection closed.
    pub async fn close_requested(&self) -> CloseReason {
        self.entry.waiters.wait_until(|| self.entry.close.get().is_some()).await;
        self.entry.close.get().unwrap_or(CloseReason::Shed)
    }

    /// Resolves once the sweeper asks the idle connection to trim.
    pub async fn trim_requested(&self) {
        self.entry.waiters.wait_until(|| self.entry.trim_requested.get()).await
    }

    /// Takes a trim request (so the next one needs a new idle period).
    pub fn take_trim_request(&self) -> bool {
        self.entry.trim_requested.replace(false)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.connections.entries.borrow_mut()[self.index] = None;
        self.connections.free.borrow_mut().push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connections(idle_ms: u64, line_ms: u64) -> Rc<Connections> {
        Rc::new(Connections {
            entries: RefCell::default(),
            free: RefCell::default(),
            idle_timeout: Duration::from_millis(idle_ms),
            request_timeout: Duration::from_millis(idle_ms / 2),
            line_timeout: Duration::from_millis(line_ms),
            registered: Notify::default(),
        })
    }

    fn reason(connection: &Connection) -> Option<CloseReason> {
        connection.entry.close.get()
    }

    /// A connection that sends nothing is closed after the idle timeout
    /// (ingest) or the shorter request timeout (subscribe); one that greeted
    /// is not, however long it idles.
    #[test]
    fn idle_timeout_spares_greeted_connections() {
        let registry = connections(1000, 5000);
        let silent = registry.register(Face::Ingest);
        let silent_subscriber = registry.register(Face::Subscribe);
        let greeted = registry.register(Face::Ingest);
        greeted.greet();
        let start = silent.entry.accepted_at;
        let request_due = silent_subscriber.entry.accepted_at + Duration::from_millis(500);
        let sweep = registry.sweep(start + Duration::from_millis(499), None);
        assert_eq!(sweep, Sweep { next_due: Some(request_due), ..Sweep::default() });
        let sweep = registry.sweep(start + Duration::from_millis(999), None);
        assert_eq!((sweep.request_timeouts, sweep.idle_timeouts), (1, 0));
        assert_eq!(reason(&silent_subscriber), Some(CloseReason::RequestTimeout));
        let sweep = registry.sweep(start + Duration::from_secs(3600), None);
        assert_eq!((sweep.request_timeouts, sweep.idle_timeouts), (0, 1));
        assert_eq!(reason(&silent), Some(CloseReason::IdleTimeout));
        assert_eq!(reason(&greeted), None);
    }

    /// A subscribe connection whose slot a newcomer took over is asked to
    /// close (at once by `close_taken_over`, else by the next sweep); one
    /// that sent its request first is a subscriber and stays.
    #[test]
    fn connections_whose_slot_was_taken_over_are_shed() {
        use crate::net::admission::{Admit, SubscriberSlots};
        let registry = connections(60_000, 60_000);
        let slots = std::sync::Arc::new(SubscriberSlots::new(3));
        let admit = || match slots.try_admit() {
            Admit::Free(slot) | Admit::TakenOver(slot) => registry.register_subscriber(slot),
            Admit::Full => panic!("refused"),
        };
        let subscriber = admit();
        assert!(subscriber.greet_subscriber(), "its slot was not taken over");
        let (oldest, younger) = (admit(), admit());
        assert_eq!(registry.close_taken_over(), 0, "every slot held by its connection");
        let newcomer = admit();
        assert_eq!(registry.close_taken_over(), 1);
        assert_eq!(reason(&oldest), Some(CloseReason::ShedAtLimit));
        assert!(!oldest.greet_subscriber(), "too late for its request");
        assert_eq!(reason(&younger), None);
        assert_eq!(reason(&newcomer), None);
        drop(oldest);
        let _last = admit();
        assert_eq!(registry.sweep(Instant::now(), None).sheds_at_limit, 1);
        assert_eq!(reason(&younger), Some(CloseReason::ShedAtLimit));
        assert_eq!(reason(&subscriber), None, "a subscriber is never shed");
    }

    /// The line timeout runs while spate waits on the socket for the same
    /// incomplete line; a new line restarts it, and time spent busy (stalled
    /// on credits) does not trigger it.
    #[test]
    fn line_timeout_counts_only_waiting_for_the_same_line() {
        let registry = connections(1000, 2000);
        let slow = registry.register(Face::Ingest);
        slow.greet();
        let start = Instant::now();
        slow.set_partial_line(Some(5), start);
        slow.set_partial_line(Some(5), start + Duration::from_millis(1500));
        assert_eq!(registry.sweep(start + Duration::from_millis(2500), None).line_timeouts, 0, "busy, not reading");
        slow.set_reading(Some(start + Duration::from_millis(1800)));
        slow.set_partial_line(Some(6), start + Duration::from_millis(1900));
        assert_eq!(registry.sweep(start + Duration::from_millis(3000), None).line_timeouts, 0, "a new line");
        assert_eq!(registry.sweep(start + Duration::from_millis(3900), None).line_timeouts, 1);
        assert_eq!(reason(&slow), Some(CloseReason::LineTimeout));
    }

    /// A sweep says when it may next be needed: the soonest greeting
    /// deadline, incomplete line's timeout, buffer trim or shutdown
    /// deadline among the connections still open; nothing for connections
    /// that only idle. The sweeper waits between the floor and its ceiling.
    #[test]
    fn a_sweep_names_the_soonest_deadline() {
        let registry = connections(4000, 2000);
        let idle = registry.register(Face::Ingest);
        idle.greet();
        let now = Instant::now();
        idle.set_reading(Some(now));
        assert_eq!(registry.sweep(now, None).next_due, None, "an idle connection needs no sweep");
        let shutdown = now + Duration::from_secs(30);
        assert_eq!(registry.sweep(now, Some(shutdown)).next_due, Some(shutdown));
        idle.set_holds_spare_memory(true);
        let trim = now + Duration::from_millis(IDLE_TRIM_MS);
        assert_eq!(registry.sweep(now, None).next_due, Some(trim));
        idle.set_partial_line(Some(2), now - Duration::from_millis(1500));
        let line = now + Duration::from_millis(500);
        assert_eq!(registry.sweep(now, None).next_due, Some(line.min(trim)));
        let silent = registry.register(Face::Subscribe);
        let greeting = silent.entry.accepted_at + Duration::from_millis(2000);
        assert_eq!(registry.sweep(now, None).next_due, Some(greeting.min(line).min(trim)));
        assert_eq!(registry.sweep_interval_max(), Duration::from_millis(500), "a quarter of the 2 s timeouts");
        assert_eq!(
            connections(60_000, 60_000).sweep_interval_max(),
            Duration::from_millis(CONNECTION_SWEEP_INTERVAL_MAX_MS)
        );
        assert_eq!(connections(100, 100).sweep_interval_max(), Duration::from_millis(CONNECTION_SWEEP_INTERVAL_MS));
    }

    /// Shedding picks the oldest silent connection first, then the ingest
    /// connection idle longest, never a busy one, and each only once.
    #[test]
    fn shedding_takes_silent_then_idle_connections() {
        let registry = connections(60_000, 60_000);
        let busy = registry.register(Face::Ingest);
        busy.greet();
        let idle = registry.register(Face::Ingest);
        idle.greet();
        idle.set_reading(Some(Instant::now()));
        let silent_old = registry.register(Face::Subscribe);
        let silent_new = registry.register(Face::Ingest);
        assert_eq!(registry.shed_oldest(), Some(Face::Subscribe));
        assert_eq!(reason(&silent_old), Some(CloseReason::Shed));
        assert_eq!(registry.shed_oldest(), Some(Face::Ingest));
        assert_eq!(reason(&silent_new), Some(CloseReason::Shed));
        assert_eq!(registry.shed_oldest(), Some(Face::Ingest));
        assert_eq!(reason(&idle), Some(CloseReason::Shed));
        assert_eq!(registry.shed_oldest(), None, "a busy connection is not shed");
        assert_eq!(reason(&busy), None);
    }

    /// Past the shutdown deadline every connection is asked to close;
    /// dropped handles leave the registry.
    #[test]
    fn deadline_cuts_everyone_and_handles_unregister() {
        let registry = connections(60_000, 60_000);
        let handles: Vec<Connection> = (0..3).map(|_| registry.register(Face::Ingest)).collect();
        let now = Instant::now();
        assert_eq!(registry.sweep(now, Some(now + Duration::from_secs(1))).deadline_cuts, 0);
        assert_eq!(registry.sweep(now + Duration::from_secs(1), Some(now)).deadline_cuts, 3);
        assert!(handles.iter().all(|handle| reason(handle) == Some(CloseReason::ShutdownDeadline)));
        assert_eq!(registry.count(), 3);
        drop(handles);
        assert_eq!(registry.count(), 0);
    }

    /// An idle connection holding spare memory is asked to trim once per
    /// idle period.
    #[test]
    fn idle_connections_are_asked_to_trim() {
        let registry = connections(60_000, 60_000);
        let connection = registry.register(Face::Ingest);
        connection.greet();
        let now = Instant::now();
        connection.set_reading(Some(now));
        connection.set_holds_spare_memory(true);
        assert_eq!(registry.sweep(now + Duration::from_millis(IDLE_TRIM_MS - 1), None).trims, 0);
        assert_eq!(registry.sweep(now + Duration::from_millis(IDLE_TRIM_MS), None).trims, 1);
        assert_eq!(registry.sweep(now + Duration::from_millis(IDLE_TRIM_MS * 2), None).trims, 0, "still pending");
        assert!(connection.take_trim_request());
        assert!(!connection.take_trim_request());
    }
}
