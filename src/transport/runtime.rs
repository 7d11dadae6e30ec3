//! The transport on the cluster thread: the listener, one outbound link
//! per peer (dial, handshake, write queued messages as credits allow, read
//! credits, redial with backoff), the inbound connections (handshake, read
//! messages, hand them to their consumers, grant credits back), the ping,
//! and the counters `GET /cluster` shows. See the module doc of
//! [`crate::transport`] for the design.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

use crate::cluster::identity::NodeId;
use crate::cluster::membership::{MemberState, MemberView};
use crate::config::{
    TRANSPORT_FLUSH_BYTES, TRANSPORT_PEERS_MAX, TRANSPORT_QUEUE_BYTES_MAX, TRANSPORT_READ_CHUNK_BYTES,
    TRANSPORT_WINDOW_BYTES,
};
use crate::runtime::log;
use crate::runtime::notify::Notify;
use crate::transport::Channel;
use crate::transport::codec::{self, DecodeError, FRAME_BYTES_MAX, Frame, PROTOCOL_VERSION};
use crate::transport::credits::{ReceiveCredits, SendCredits, backoff_delay, grant_threshold_bytes};
use crate::transport::queue::{LinkState, Outgoing, PeerQueue, SendError};

/// How long a dial may take, in ms.
const CONNECT_TIMEOUT_MS: u64 = 1000;
/// How long either side of a handshake waits for the other's frame, in ms.
const HANDSHAKE_TIMEOUT_MS: u64 = 2000;
/// Connections in their handshake at once; more are closed at once (a
/// port scan or a flood cannot hold more than these).
const HANDSHAKES_MAX: usize = 8;
/// How often each connected peer is pinged, in ms.
pub const PING_INTERVAL_MS: u64 = 1000;
/// The filler message of `--transport-test-flood`, in bytes.
const FLOOD_MESSAGE_BYTES: usize = 64 * 1024;

/// What the transport starts from.
pub struct TransportSetup {
    pub node_id: NodeId,
    /// The bound TCP listener on the cluster address.
    pub listener: std::net::TcpListener,
    pub test_flood: bool,
    pub test_receive_us_per_kib: u64,
    /// The handle the cluster thread gives out ([`TransportHandle::new`]).
    pub handle: TransportHandle,
}

/// The queues of every peer, shared with the threads that send.
#[derive(Default)]
struct SharedPeers {
    queues: Mutex<HashMap<NodeId, Arc<PeerQueue>>>,
}

/// How any thread sends to a peer (`Send + Clone`): see the module doc for
/// what it costs.
#[derive(Clone, Default)]
pub struct TransportHandle {
    peers: Arc<SharedPeers>,
}

impl TransportHandle {
    /// A handle to a transport not started yet (its setup takes it).
    pub fn new() -> TransportHandle {
        TransportHandle { peers: Arc::default() }
    }

    fn queue(&self, peer: NodeId) -> Result<Arc<PeerQueue>, SendError> {
        let queues = self.peers.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        queues.get(&peer).cloned().ok_or(SendError::UnknownPeer { peer })
    }

    /// Queues a message for `peer`, waiting while its queue is full (the
    /// peer's backpressure); fails at once when it is unreachable.
    pub async fn send(&self, peer: NodeId, channel: Channel, payload: Bytes) -> Result<(), SendError> {
        self.queue(peer)?.push(Outgoing { channel: channel as u8, payload }).await
    }

    /// Queues a message for `peer` if there is room now.
    pub fn try_send(&self, peer: NodeId, channel: Channel, payload: Bytes) -> Result<(), SendError> {
        self.queue(peer)?.try_push(Outgoing { channel: channel as u8, payload })
    }
}

/// Bytes consumers released on one inbound connection, to grant back; woken
/// when they pass the grant threshold. Shared with consumers on any thread.
struct ReleasedCredits {
    bytes: AtomicUsize,
    threshold_bytes: usize,
    waker: Mutex<Option<Waker>>,
}

impl ReleasedCredits {
    fn release(&self, bytes: usize) {
        let before = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if before < self.threshold_bytes && before + bytes >= self.threshold_bytes {
            let waker = self.waker.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    /// Waits until released bytes reach the threshold, and takes them all.
    async fn take(&self) -> usize {
        poll_fn(|cx| {
            *self.waker.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
            if self.bytes.load(Ordering::Acquire) >= self.threshold_bytes {
                return Poll::Ready(self.bytes.swap(0, Ordering::AcqRel));
            }
            Poll::Pending
        })
        .await
    }
}

/// A message that arrived, with its credit: dropping it grants its bytes
/// back to the sender (from any thread), so a consumer that holds messages
/// holds back its senders.
pub struct Inbound {
    pub from: NodeId,
    pub channel: u8,
    pub payload: Bytes,
    credit: Arc<ReleasedCredits>,
    frame_bytes: usize,
}

impl Drop for Inbound {
    fn drop(&mut self) {
        self.credit.release(self.frame_bytes);
    }
}

/// One peer's counters, as `GET /cluster` shows them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PeerCounters {
    pub bytes_sent: u64,
    pub frames_sent: u64,
    /// Socket writes: `frames_sent / writes` is the batching.
    pub writes: u64,
    pub bytes_received: u64,
    pub frames_received: u64,
    /// Connections made after the first (the link dropped and came back).
    pub reconnects: u64,
    pub connect_failures: u64,
    /// Times the writer had messages but no credit for the next one.
    pub credit_stalls: u64,
    /// Sends that waited for room in the queue.
    pub sender_waits: u64,
    pub messages_dropped: u64,
    pub queued_bytes: usize,
    pub credit_available_bytes: usize,
    pub pings_sent: u64,
    pub pongs_received: u64,
    /// The latest ping's round trip, in µs.
    pub rtt_us: Option<u64>,
    /// Filler messages sent and received (`--transport-test-flood`).
    pub bulk_sent: u64,
    pub bulk_received: u64,
    pub connected: bool,
}

/// One peer as `GET /cluster` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerView {
    pub node_id: String,
    pub address: String,
    pub state: LinkState,
    pub last_error: Option<String>,
    #[serde(flatten)]
    pub counters: PeerCounters,
}

/// The transport's side of one peer.
struct Link {
    peer: NodeId,
    address: Cell<SocketAddr>,
    queue: Arc<PeerQueue>,
    counters: RefCell<PeerCounters>,
    last_error: RefCell<Option<String>>,
    removed: Cell<bool>,
    removed_notify: Notify,
    connections: Cell<u64>,
}

/// The transport, owned by the cluster thread.
pub struct Transport {
    node_id: NodeId,
    started: Instant,
    peers: Arc<SharedPeers>,
    links: RefCell<HashMap<NodeId, Rc<Link>>>,
    /// Inbound connections by peer: a newer one supersedes the older.
    inbound: RefCell<HashMap<NodeId, Rc<Notify>>>,
    /// Counters of peers heard from that have no link (yet).
    handshakes: Cell<usize>,
    bulk: RefCell<VecDeque<Inbound>>,
    bulk_ready: Notify,
    /// Raft batches and forwarded proposals for the replication task, held
    /// with their credits (so the window bounds them).
    replication: RefCell<VecDeque<Inbound>>,
    replication_ready: Notify,
    test_flood: bool,
    test_receive_us_per_kib: u64,
    ping_sequence: Cell<u64>,
}

impl Transport {
    /// Starts the listener, the pinger and (test knob) the slow consumer.
    pub fn start(setup: TransportSetup) -> Rc<Transport> {
        let transport = Rc::new(Transport {
            node_id: setup.node_id,
            started: Instant::now(),
            peers: setup.handle.peers.clone(),
            links: RefCell::default(),
            inbound: RefCell::default(),
            handshakes: Cell::new(0),
            bulk: RefCell::default(),
            bulk_ready: Notify::default(),
            replication: RefCell::default(),
            replication_ready: Notify::default(),
            test_flood: setup.test_flood,
            test_receive_us_per_kib: setup.test_receive_us_per_kib,
            ping_sequence: Cell::new(0),
        });
        // SAFETY: the descriptor comes from a std listener we own and give up here.
        let listener = unsafe {
            <TcpListener as std::os::fd::FromRawFd>::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(setup.listener))
        };
        glommio::spawn_local(accept(transport.clone(), listener)).detach();
        glommio::spawn_local(ping(transport.clone())).detach();
        glommio::spawn_local(consume_bulk(transport.clone())).detach();
        transport
    }

    pub fn handle(&self) -> TransportHandle {
        TransportHandle { peers: self.peers.clone() }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Keeps one link per member that is not this node and has not left:
    /// new members get a link, a member's new address is dialed next time,
    /// members gone or left lose theirs (their senders fail).
    pub fn sync_members(self: &Rc<Self>, members: &[MemberView]) {
        let wanted: HashMap<NodeId, SocketAddr> = members
            .iter()
            .filter(|member| !member.is_self && member.state != MemberState::Left)
            .map(|member| (member.id.node_id, member.id.addresses.cluster))
            .collect();
        let gone: Vec<NodeId> = self.links.borrow().keys().filter(|peer| !wanted.contains_key(peer)).copied().collect();
        for peer in gone {
            self.remove_link(peer);
        }
        for (peer, address) in wanted {
            if let Some(link) = self.links.borrow().get(&peer) {
                link.address.set(address);
                continue;
            }
            if self.links.borrow().len() >= TRANSPORT_PEERS_MAX {
                log::warn!("transport: not linking node {peer}: {TRANSPORT_PEERS_MAX} peers are linked already");
                continue;
            }
            self.add_link(peer, address);
        }
    }

    fn add_link(self: &Rc<Self>, peer: NodeId, address: SocketAddr) {
        let link = Rc::new(Link {
            peer,
            address: Cell::new(address),
            queue: Arc::new(PeerQueue::new(peer, TRANSPORT_QUEUE_BYTES_MAX)),
            counters: RefCell::default(),
            last_error: RefCell::new(None),
            removed: Cell::new(false),
            removed_notify: Notify::default(),
            connections: Cell::new(0),
        });
        self.peers.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(peer, link.queue.clone());
        self.links.borrow_mut().insert(peer, link.clone());
        glommio::spawn_local(run_link(self.clone(), link.clone())).detach();
        if self.test_flood {
            glommio::spawn_local(flood(link)).detach();
        }
    }

    fn remove_link(&self, peer: NodeId) {
        let Some(link) = self.links.borrow_mut().remove(&peer) else { return };
        self.peers.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&peer);
        link.removed.set(true);
        link.queue.set_link(LinkState::Removed, 0);
        link.removed_notify.notify();
    }

    /// Every linked peer, by node id.
    pub fn peers(&self) -> Vec<PeerView> {
        let mut views: Vec<PeerView> = self
            .links
            .borrow()
            .values()
            .map(|link| {
                let queue = link.queue.counters();
                let mut counters = link.counters.borrow().clone();
                counters.sender_waits = queue.sender_waits;
                counters.messages_dropped = queue.messages_dropped;
                counters.queued_bytes = queue.queued_bytes;
                PeerView {
                    node_id: link.peer.to_string(),
                    address: link.address.get().to_string(),
                    state: link.queue.link(),
                    last_error: link.last_error.borrow().clone(),
                    counters,
                }
            })
            .collect();
        views.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        views
    }

    /// The next Raft batch or forwarded proposal that arrived.
    pub async fn next_replication(&self) -> Inbound {
        loop {
            if let Some(inbound) = self.replication.borrow_mut().pop_front() {
                return inbound;
            }
            self.replication_ready.notified().await;
        }
    }

    /// A Raft batch or forwarded proposal that already arrived, if any.
    pub fn try_next_replication(&self) -> Option<Inbound> {
        self.replication.borrow_mut().pop_front()
    }

    fn link(&self, peer: NodeId) -> Option<Rc<Link>> {
        self.links.borrow().get(&peer).cloned()
    }
}

/// Dials `link`'s peer until it is removed: connect, handshake, run the
/// connection until it drops, then back off and dial again.
async fn run_link(transport: Rc<Transport>, link: Rc<Link>) {
    let mut failures = 0u32;
    let errors = log::Episode::new("transport link errors");
    while !link.removed.get() {
        match dial(&transport, &link).await {
            Ok((stream, window_bytes)) => {
                failures = 0;
                let connections = link.connections.get() + 1;
                link.connections.set(connections);
                link.counters.borrow_mut().reconnects = connections - 1;
                link.counters.borrow_mut().connected = true;
                link.queue.set_link(LinkState::Connected, 0);
                let ended = run_outbound(&link, stream, window_bytes).await;
                link.counters.borrow_mut().connected = false;
                if link.removed.get() {
                    return;
                }
                link.queue.set_link(LinkState::Connecting, 0);
                note_error(&link, &errors, format!("connection to {} dropped: {ended}", link.address.get()));
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                link.counters.borrow_mut().connect_failures += 1;
                link.queue.set_link(LinkState::Unreachable, failures);
                note_error(&link, &errors, format!("cannot reach {}: {error}", link.address.get()));
            }
        }
        let delay = backoff_delay(failures, 0.5 + rand::random::<f64>() / 2.0);
        futures_lite::future::or(glommio::timer::sleep(delay), link.removed_notify.notified()).await;
    }
}

fn note_error(link: &Link, errors: &log::Episode, error: String) {
    let message = format!("transport: node {}: {error}", link.peer);
    errors.occur(Instant::now(), log::Level::Warn, log::Scope::process(), format_args!("{message}"));
    *link.last_error.borrow_mut() = Some(error);
}

/// Why a connection ended or a handshake failed, for the log and
/// `last_error`.
type LinkError = String;

async fn with_timeout<T>(
    ms: u64,
    what: &str,
    future: impl Future<Output = Result<T, LinkError>>,
) -> Result<T, LinkError> {
    let timeout = async {
        glommio::timer::sleep(Duration::from_millis(ms)).await;
        Err(format!("{what} timed out after {ms} ms"))
    };
    futures_lite::future::or(future, timeout).await
}

/// Connects to the peer and shakes hands: the peer must be the node the
/// membership says lives there, speaking this protocol version.
async fn dial(transport: &Transport, link: &Link) -> Result<(TcpStream, usize), LinkError> {
    let address = link.address.get();
    let stream = TcpStream::connect_timeout(address, Duration::from_millis(CONNECT_TIMEOUT_MS))
        .await
        .map_err(|error| error.to_string())?;
    let _ = stream.set_nodelay(true);
    let mut stream = stream;
    let mut hello = Vec::new();
    codec::encode(&mut hello, &Frame::Hello { version: PROTOCOL_VERSION, from: transport.node_id, to: link.peer });
    stream.write_all(&hello).await.map_err(|error| error.to_string())?;
    let mut reader = FrameReader::default();
    let frame = with_timeout(HANDSHAKE_TIMEOUT_MS, "the handshake", reader.next(&mut stream)).await?;
    match codec::decode(reader.frame(frame)).map_err(|error| error.to_string())? {
        Some((Frame::Welcome { version, node, window_bytes }, _)) => {
            if version != PROTOCOL_VERSION {
                return Err(format!("the peer speaks transport protocol {version}, this node {PROTOCOL_VERSION}"));
            }
            if node != link.peer {
                return Err(format!("the node at {address} is {node}, not {}", link.peer));
            }
            let window_bytes = window_bytes as usize;
            if window_bytes < 2 * FRAME_BYTES_MAX {
                return Err(format!("the peer grants a window of {window_bytes} bytes, under two frames"));
            }
            Ok((stream, window_bytes))
        }
        Some((Frame::Refuse { reason }, _)) => Err(format!("refused: {}", String::from_utf8_lossy(reason))),
        other => Err(format!("expected a welcome, got {other:?}")),
    }
}

/// Runs a connected outbound connection until it drops or the link is
/// removed: writes queued messages as credits allow, reads credits.
async fn run_outbound(link: &Rc<Link>, stream: TcpStream, window_bytes: usize) -> LinkError {
    let credits = RefCell::new(SendCredits::new(window_bytes));
    let credit_arrived = Notify::default();
    let (mut read_half, mut write_half) = futures_lite::io::split(stream);
    let write = async {
        let mut out = Vec::with_capacity(TRANSPORT_FLUSH_BYTES);
        loop {
            out.clear();
            let (moved, generation, blocked) =
                link.queue.drain_into(&mut out, TRANSPORT_FLUSH_BYTES, |bytes| credits.borrow_mut().try_spend(bytes));
            if moved > 0 {
                if let Err(error) = write_half.write_all(&out).await {
                    return format!("write: {error}");
                }
                let mut counters = link.counters.borrow_mut();
                counters.bytes_sent += out.len() as u64;
                counters.frames_sent += moved as u64;
                counters.writes += 1;
                counters.credit_available_bytes = credits.borrow().available_bytes();
                continue;
            }
            if blocked {
                link.counters.borrow_mut().credit_stalls += 1;
                credit_arrived.notified().await;
            } else {
                futures_lite::future::or(link.queue.changed_since(generation), credit_arrived.notified()).await;
            }
        }
    };
    let read = async {
        let mut reader = FrameReader::default();
        loop {
            let range = match reader.next(&mut read_half).await {
                Ok(range) => range,
                Err(error) => return error,
            };
            match codec::decode(reader.frame(range)) {
                Ok(Some((Frame::Credit { bytes }, _))) => {
                    if let Err(error) = credits.borrow_mut().grant(bytes as usize) {
                        return error.to_string();
                    }
                    link.counters.borrow_mut().credit_available_bytes = credits.borrow().available_bytes();
                    credit_arrived.notify();
                }
                other => return format!("expected a credit, got {other:?}"),
            }
        }
    };
    let removed = async {
        link.removed_notify.notified().await;
        "the peer left the cluster".to_string()
    };
    futures_lite::future::or(write, futures_lite::future::or(read, removed)).await
}

/// Reads whole frames into one bounded buffer: at most a frame plus a read
/// chunk ([`FRAME_BYTES_MAX`] + [`TRANSPORT_READ_CHUNK_BYTES`]).
#[derive(Default)]
struct FrameReader {
    buffer: Vec<u8>,
    start: usize,
    end: usize,
}

impl FrameReader {
    /// Reads until a whole frame is buffered; returns where it is. The
    /// frame stays valid until the next call.
    async fn next(&mut self, stream: &mut (impl AsyncRead + Unpin)) -> Result<std::ops::Range<usize>, LinkError> {
        loop {
            match codec::decode(&self.buffer[self.start..self.end]) {
                Ok(Some((_, used))) => {
                    let range = self.start..self.start + used;
                    self.start += used;
                    return Ok(range);
                }
                Ok(None) => {}
                Err(error) => return Err(decode_error(error)),
            }
            self.make_room();
            let read = stream.read(&mut self.buffer[self.end..]).await.map_err(|error| format!("read: {error}"))?;
            if read == 0 {
                return Err("the peer closed the connection".to_string());
            }
            self.end += read;
        }
    }

    /// Moves the unread bytes to the front and makes room for a chunk.
    fn make_room(&mut self) {
        if self.end - self.start < self.start || self.buffer.len() - self.end < TRANSPORT_READ_CHUNK_BYTES {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let wanted = (self.end + TRANSPORT_READ_CHUNK_BYTES).min(FRAME_BYTES_MAX + TRANSPORT_READ_CHUNK_BYTES);
        if self.buffer.len() < wanted {
            self.buffer.resize(wanted, 0);
        }
    }

    fn frame(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self.buffer[range]
    }
}

fn decode_error(error: DecodeError) -> LinkError {
    format!("undecodable frame: {error}")
}

/// Accepts inbound connections; each shakes hands in its own task.
async fn accept(transport: Rc<Transport>, listener: TcpListener) {
    let errors = log::Episode::new("transport accept errors");
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if transport.handshakes.get() >= HANDSHAKES_MAX {
                    continue; // Dropped: closed at once.
                }
                transport.handshakes.set(transport.handshakes.get() + 1);
                glommio::spawn_local(serve_inbound(transport.clone(), stream)).detach();
            }
            Err(error) => {
                errors.occur(Instant::now(), log::Level::Warn, log::Scope::process(), format_args!("{error}"));
                glommio::timer::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Shakes hands with a dialer, then reads its messages until it drops.
async fn serve_inbound(transport: Rc<Transport>, mut stream: TcpStream) {
    let mut reader = FrameReader::default();
    let accepted =
        with_timeout(HANDSHAKE_TIMEOUT_MS, "the handshake", accept_hello(&transport, &mut stream, &mut reader)).await;
    transport.handshakes.set(transport.handshakes.get() - 1);
    let peer = match accepted {
        Ok(peer) => peer,
        Err(reason) => {
            let peer = stream.peer_addr().map(|address| address.to_string()).unwrap_or_default();
            log::warn!("transport: refused a connection from {peer}: {reason}");
            let mut refusal = Vec::new();
            codec::encode(&mut refusal, &Frame::Refuse { reason: reason.as_bytes() });
            let _ = stream.write_all(&refusal).await;
            return;
        }
    };
    let superseded = Rc::new(Notify::default());
    if let Some(older) = transport.inbound.borrow_mut().insert(peer, superseded.clone()) {
        older.notify();
    }
    let ended = run_inbound(&transport, peer, stream, reader, &superseded).await;
    let mut inbound = transport.inbound.borrow_mut();
    if inbound.get(&peer).is_some_and(|current| Rc::ptr_eq(current, &superseded)) {
        inbound.remove(&peer);
    }
    log::info!("transport: inbound connection from node {peer} ended: {ended}");
}

/// Reads the dialer's Hello and answers Welcome; an error is the refusal's
/// reason.
async fn accept_hello(
    transport: &Transport,
    stream: &mut TcpStream,
    reader: &mut FrameReader,
) -> Result<NodeId, LinkError> {
    let range = reader.next(stream).await?;
    let (version, from, to) = match codec::decode(reader.frame(range)).map_err(decode_error)? {
        Some((Frame::Hello { version, from, to }, _)) => (version, from, to),
        other => return Err(format!("expected a hello, got {other:?}")),
    };
    if version != PROTOCOL_VERSION {
        return Err(format!("transport protocol version {version} is not this node's {PROTOCOL_VERSION}"));
    }
    if to != transport.node_id {
        return Err(format!("this is node {}, not {to}", transport.node_id));
    }
    if from == transport.node_id {
        return Err("a node cannot link to itself".to_string());
    }
    let full = {
        let inbound = transport.inbound.borrow();
        inbound.len() >= TRANSPORT_PEERS_MAX && !inbound.contains_key(&from)
    };
    if full {
        return Err(format!("this node accepts {TRANSPORT_PEERS_MAX} peers"));
    }
    let _ = stream.set_nodelay(true);
    let mut welcome = Vec::new();
    let window_bytes = TRANSPORT_WINDOW_BYTES as u32;
    codec::encode(&mut welcome, &Frame::Welcome { version: PROTOCOL_VERSION, node: transport.node_id, window_bytes });
    stream.write_all(&welcome).await.map_err(|error| error.to_string())?;
    Ok(from)
}

/// Reads messages from `peer` and grants their credits back as they are
/// released, until the connection drops or a newer one supersedes it.
async fn run_inbound(
    transport: &Rc<Transport>,
    peer: NodeId,
    stream: TcpStream,
    mut reader: FrameReader,
    superseded: &Notify,
) -> LinkError {
    let credits = RefCell::new(ReceiveCredits::new(TRANSPORT_WINDOW_BYTES));
    let released = Arc::new(ReleasedCredits {
        bytes: AtomicUsize::new(0),
        threshold_bytes: grant_threshold_bytes(TRANSPORT_WINDOW_BYTES),
        waker: Mutex::new(None),
    });
    let (mut read_half, mut write_half) = futures_lite::io::split(stream);
    let read = async {
        loop {
            let range = match reader.next(&mut read_half).await {
                Ok(range) => range,
                Err(error) => return error,
            };
            let frame_bytes = range.len();
            let (channel, payload) = match codec::decode(reader.frame(range)) {
                Ok(Some((Frame::Data { channel, payload }, _))) => (channel, Bytes::copy_from_slice(payload)),
                other => return format!("expected data, got {other:?}"),
            };
            if let Err(error) = credits.borrow_mut().receive(frame_bytes) {
                return error.to_string();
            }
            let inbound = Inbound { from: peer, channel, payload, credit: released.clone(), frame_bytes };
            deliver(transport, inbound, frame_bytes);
        }
    };
    let grant = async {
        let mut out = Vec::new();
        loop {
            let bytes = released.take().await;
            let grant = credits.borrow_mut().release(bytes);
            out.clear();
            codec::encode(&mut out, &Frame::Credit { bytes: grant });
            if let Err(error) = write_half.write_all(&out).await {
                return format!("write: {error}");
            }
        }
    };
    let superseded = async {
        superseded.notified().await;
        "a newer connection from the same node replaced it".to_string()
    };
    futures_lite::future::or(read, futures_lite::future::or(grant, superseded)).await
}

/// Hands a message to its channel's consumer (dropping it grants its
/// credit back).
fn deliver(transport: &Rc<Transport>, inbound: Inbound, frame_bytes: usize) {
    let link = transport.link(inbound.from);
    if let Some(link) = &link {
        let mut counters = link.counters.borrow_mut();
        counters.bytes_received += frame_bytes as u64;
        counters.frames_received += 1;
    }
    match Channel::from_u8(inbound.channel) {
        Some(Channel::Ping) => {
            if let Some(link) = link {
                let pong = Outgoing { channel: Channel::Pong as u8, payload: inbound.payload.clone() };
                let _ = link.queue.try_push(pong);
            }
        }
        Some(Channel::Pong) => {
            let sent_ns =
                inbound.payload.get(8..16).map(|bytes| u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])));
            if let (Some(link), Some(sent_ns)) = (link, sent_ns) {
                let mut counters = link.counters.borrow_mut();
                counters.pongs_received += 1;
                counters.rtt_us = Some(transport.now_ns().saturating_sub(sent_ns) / 1000);
            }
        }
        Some(Channel::Bulk) => {
            if let Some(link) = link {
                link.counters.borrow_mut().bulk_received += 1;
            }
            if transport.test_receive_us_per_kib > 0 {
                transport.bulk.borrow_mut().push_back(inbound);
                transport.bulk_ready.notify();
            }
        }
        Some(
            Channel::Raft
            | Channel::Propose
            | Channel::ProposeAck
            | Channel::ProposeRefused
            | Channel::ProposeAfterRefusal
            | Channel::ProposeRetry
            | Channel::GapRead
            | Channel::GapRecords
            | Channel::MirrorRead
            | Channel::MirrorRecords,
        ) => {
            transport.replication.borrow_mut().push_back(inbound);
            transport.replication_ready.notify();
        }
        None => {}
    }
}

/// Pings every connected peer each [`PING_INTERVAL_MS`]; the pong's
/// arrival gives the round trip (`rtt_us`).
async fn ping(transport: Rc<Transport>) {
    loop {
        glommio::timer::sleep(Duration::from_millis(PING_INTERVAL_MS)).await;
        let links: Vec<Rc<Link>> = transport.links.borrow().values().cloned().collect();
        for link in links.iter().filter(|link| link.queue.link() == LinkState::Connected) {
            let sequence = transport.ping_sequence.get() + 1;
            transport.ping_sequence.set(sequence);
            let mut payload = Vec::with_capacity(16);
            payload.extend_from_slice(&sequence.to_le_bytes());
            payload.extend_from_slice(&transport.now_ns().to_le_bytes());
            let ping = Outgoing { channel: Channel::Ping as u8, payload: Bytes::from(payload) };
            if link.queue.try_push(ping).is_ok() {
                link.counters.borrow_mut().pings_sent += 1;
            }
        }
    }
}

/// Test knob: keeps `link`'s queue full of filler messages.
async fn flood(link: Rc<Link>) {
    let filler = Bytes::from(vec![b'x'; FLOOD_MESSAGE_BYTES]);
    while !link.removed.get() {
        let message = Outgoing { channel: Channel::Bulk as u8, payload: filler.clone() };
        match link.queue.push(message).await {
            Ok(()) => link.counters.borrow_mut().bulk_sent += 1,
            Err(_) => glommio::timer::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Test knob: a slow consumer of filler messages, holding each (and its
/// credit) for `--transport-test-receive-us-per-kib`.
async fn consume_bulk(transport: Rc<Transport>) {
    loop {
        let next = transport.bulk.borrow_mut().pop_front();
        let Some(inbound) = next else {
            transport.bulk_ready.notified().await;
            continue;
        };
        let delay_us = transport.test_receive_us_per_kib.saturating_mul(inbound.payload.len() as u64 / 1024);
        glommio::timer::sleep(Duration::from_micros(delay_us)).await;
        drop(inbound);
    }
}

#[allow(dead_code)]
fn assert_send<T: Send + Sync>() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard can hold and use the handle from its own thread.
    #[test]
    fn the_handle_is_send_and_inbound_messages_may_cross_threads() {
        assert_send::<TransportHandle>();
        fn assert_send_only<T: Send>() {}
        assert_send_only::<Inbound>();
    }
}
