//! Who is in the cluster and how loaded each member is: foca's SWIM
//! membership wrapped as a sans-IO state machine, [`Membership`].
//!
//! It owns no socket and no clock. Its caller hands it what happened,
//! each with the current time on the caller's clock (a [`Duration`] since
//! any fixed start): a datagram arrived ([`Membership::handle_datagram`]),
//! time passed ([`Membership::fire_due_timers`], due by
//! [`Membership::next_timer_at`]), the node's load changed
//! ([`Membership::publish_load`]), the node joins or leaves. It answers
//! with datagrams to send ([`Membership::take_datagram`]) and notifications
//! to log ([`Membership::take_notification`]). The cluster thread
//! (`cluster::driver`) runs it over a glommio UDP socket and the real
//! clock; the simulator (`cluster::sim`) runs the same code over an
//! in-memory network and a simulated clock, from a seed.
//!
//! Failure detection (foca's SWIM with suspicion): every
//! [`PROBE_PERIOD_MS`] each member pings the next member of its shuffled
//! list, then asks [`INDIRECT_PROBES`] others to ping it when no answer
//! came within [`PROBE_RTT_MS`]; a member with no answer either way is
//! suspect, and down [`SUSPECT_TO_DOWN_MS`] later unless it refutes the
//! suspicion. Each member is probed by each other one at least once every
//! `2 * (N - 1)` periods, so a killed member of an `N`-node cluster is down
//! everywhere within about `(2 * (N - 1) + 1) * PROBE_PERIOD_MS +
//! SUSPECT_TO_DOWN_MS` plus a few gossip rounds ([`GOSSIP_INTERVAL_MS`]):
//! under 9 s for three nodes. A member that leaves (SIGTERM) says so
//! itself and is seen as left within a gossip round.
//!
//! Bounds: foca keeps one entry per member it heard of, down ones for
//! [`DOWN_MEMBER_KEPT_MS`]; past [`MEMBERS_MAX`] known members, datagrams
//! are dropped (counted) until down ones expire. Datagrams are at most
//! [`DATAGRAM_BYTES_MAX`]; at most [`OUTBOX_DATAGRAMS_MAX`] wait to be sent
//! (more are dropped and counted: SWIM tolerates loss). Timers are a few
//! per member (at most [`TIMERS_MAX`]).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use foca::{AccumulatingRuntime, Foca, Identity, OwnedNotification, PostcardCodec, State, Timer};

use crate::cluster::MEMBERS_MAX;
use crate::cluster::identity::{MemberId, NodeId};
use crate::cluster::load::{LoadBroadcast, LoadEntry, LoadHandler, LoadSummary, LoadTable};
use crate::cluster::rng::SeededRng;
use crate::cluster::scheduled::Scheduled;

/// How often each member probes another one, in ms.
pub const PROBE_PERIOD_MS: u64 = 1000;
/// How long a probe waits for a direct answer before asking others, in ms
/// (a LAN's round trip is well under it, a busy box's scheduling too).
pub const PROBE_RTT_MS: u64 = 500;
/// Members asked to probe one that did not answer.
pub const INDIRECT_PROBES: usize = 3;
/// How long a suspect member has to refute the suspicion, in ms.
pub const SUSPECT_TO_DOWN_MS: u64 = 3000;
/// How often a member with news sends them to a few others, in ms.
pub const GOSSIP_INTERVAL_MS: u64 = 200;
/// Members each gossip round goes to.
pub const GOSSIP_FANOUT: usize = 3;
/// How often a member asks one other for its member list (to learn of
/// members it missed), and announces itself to members it holds down (to
/// heal after a restart or a cut link), in ms.
pub const ANNOUNCE_INTERVAL_MS: u64 = 30_000;
/// Times each update or load broadcast is piggybacked on messages: enough
/// to reach every member of a cluster of dozens with high probability.
pub const UPDATE_TRANSMISSIONS: u8 = 8;
/// How long a down member stays listed (and its address taken), in ms.
pub const DOWN_MEMBER_KEPT_MS: u64 = 3_600_000;
pub use crate::config::{
    CLUSTER_DATAGRAM_BYTES_MAX as DATAGRAM_BYTES_MAX, CLUSTER_OUTBOX_DATAGRAMS_MAX as OUTBOX_DATAGRAMS_MAX,
};
/// Notifications waiting to be logged at most (older ones are dropped).
pub const NOTIFICATIONS_MAX: usize = 64;
/// Timers pending at most: foca keeps a few fixed ones and one or two per
/// suspect or down member.
pub const TIMERS_MAX: usize = 4 * MEMBERS_MAX + 64;
/// A node that knows no live member announces itself to its `--join`
/// addresses again this often, in ms: the seed may start later, the first
/// announce may be lost, and a node left alone (everyone else down) finds
/// the cluster again once a seed is back.
pub const JOIN_RETRY_MS: u64 = 1000;
/// A node whose load did not change re-publishes it this often, in ms, so
/// a member that missed it catches up.
pub const LOAD_REPUBLISH_MS: u64 = 5000;

/// A member's state as `GET /cluster` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    Alive,
    /// Alive as far as anyone knows, but a probe went unanswered: down
    /// after [`SUSPECT_TO_DOWN_MS`] unless it answers.
    Suspect,
    /// Declared down without having said goodbye (killed, cut off).
    Down,
    /// Left on purpose (SIGTERM).
    Left,
    /// Alive, but said it is leaving (SIGTERM): placement no longer counts
    /// it, so its replicas and leaderships move away before it leaves.
    Leaving,
}

impl MemberState {
    pub const ALL: [MemberState; 5] =
        [MemberState::Alive, MemberState::Suspect, MemberState::Down, MemberState::Left, MemberState::Leaving];

    pub fn name(self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Down => "down",
            MemberState::Left => "left",
            MemberState::Leaving => "leaving",
        }
    }
}

/// One member as this node sees it.
#[derive(Clone, Debug)]
pub struct MemberView {
    pub id: MemberId,
    pub state: MemberState,
    pub is_self: bool,
    /// Its latest load broadcast, if one arrived.
    pub load: Option<LoadEntry>,
}

/// What the membership counts about itself (`/cluster`, `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MembershipCounters {
    pub datagrams_received: u64,
    pub bytes_received: u64,
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
    /// Datagrams foca refused (undecodable, too big, from itself, ...).
    pub datagrams_refused: u64,
    /// Datagrams not sent because [`OUTBOX_DATAGRAMS_MAX`] were waiting.
    pub datagrams_dropped_outbox: u64,
    /// Datagrams ignored while [`MEMBERS_MAX`] members were known.
    pub datagrams_dropped_members_full: u64,
    pub timers_dropped: u64,
    pub loads_published: u64,
}

type Swim = Foca<MemberId, PostcardCodec, SeededRng, LoadHandler>;

/// foca's configuration for spate: the constants above.
pub fn foca_config() -> foca::Config {
    let ms = Duration::from_millis;
    let periodic = |frequency_ms, members| {
        Some(foca::PeriodicParams {
            frequency: ms(frequency_ms),
            num_members: NonZeroUsize::new(members).unwrap_or(NonZeroUsize::MIN),
        })
    };
    foca::Config {
        probe_period: ms(PROBE_PERIOD_MS),
        probe_rtt: ms(PROBE_RTT_MS),
        num_indirect_probes: NonZeroUsize::new(INDIRECT_PROBES).unwrap_or(NonZeroUsize::MIN),
        max_transmissions: NonZeroU8::new(UPDATE_TRANSMISSIONS).unwrap_or(NonZeroU8::MIN),
        suspect_to_down_after: ms(SUSPECT_TO_DOWN_MS),
        remove_down_after: Some(ms(DOWN_MEMBER_KEPT_MS)),
        max_packet_size: NonZeroUsize::new(DATAGRAM_BYTES_MAX).unwrap_or(NonZeroUsize::MIN),
        notify_down_members: true,
        periodic_announce: periodic(ANNOUNCE_INTERVAL_MS, 1),
        periodic_announce_to_down_members: periodic(ANNOUNCE_INTERVAL_MS, 2),
        periodic_gossip: periodic(GOSSIP_INTERVAL_MS, GOSSIP_FANOUT),
    }
}

/// One node's membership: foca, its timers, its outbox and the load table.
pub struct Membership {
    foca: Swim,
    runtime: AccumulatingRuntime<MemberId>,
    timers: BinaryHeap<Reverse<Scheduled<Timer<MemberId>>>>,
    timer_sequence: u64,
    outbox: VecDeque<(SocketAddr, Bytes)>,
    notifications: VecDeque<OwnedNotification<MemberId>>,
    loads: Rc<RefCell<LoadTable>>,
    load_sequence: u64,
    last_published: Option<(LoadSummary, Duration)>,
    left: bool,
    /// Said it is leaving ([`Membership::announce_leaving`]): every load
    /// broadcast says so from then on.
    leaving: bool,
    /// The `--join` addresses, and when to announce to them again while no
    /// member is alive.
    seeds: Vec<SocketAddr>,
    next_join_at: Option<Duration>,
    counters: MembershipCounters,
}

impl Membership {
    /// A member that knows nobody yet; `seed` drives foca's choices.
    pub fn new(identity: MemberId, seed: u64) -> Membership {
        let loads = Rc::new(RefCell::new(LoadTable::default()));
        let handler = LoadHandler { table: loads.clone() };
        let foca = Foca::with_custom_broadcast(identity, foca_config(), SeededRng::new(seed), PostcardCodec, handler);
        Membership {
            foca,
            runtime: AccumulatingRuntime::new(),
            timers: BinaryHeap::new(),
            timer_sequence: 0,
            outbox: VecDeque::with_capacity(OUTBOX_DATAGRAMS_MAX),
            notifications: VecDeque::new(),
            loads,
            load_sequence: 0,
            last_published: None,
            left: false,
            leaving: false,
            seeds: Vec::new(),
            next_join_at: None,
            counters: MembershipCounters::default(),
        }
    }

    /// This node's identity now (foca renews it after a false "down").
    pub fn identity(&self) -> &MemberId {
        self.foca.identity()
    }

    pub fn counters(&self) -> MembershipCounters {
        self.counters
    }

    /// Announces this node to the members at `seeds` (its own address is
    /// skipped, so every node may be given the same list), and again every
    /// [`JOIN_RETRY_MS`] while it knows no live member.
    pub fn join(&mut self, now: Duration, seeds: &[SocketAddr]) {
        let own = self.identity().addr();
        self.seeds = seeds.iter().copied().filter(|seed| *seed != own).take(MEMBERS_MAX).collect();
        self.announce_to_seeds(now);
    }

    fn announce_to_seeds(&mut self, now: Duration) {
        if self.seeds.is_empty() || self.left {
            self.next_join_at = None;
            return;
        }
        for seed in &self.seeds {
            // An announce only fails to encode, which a stand-in identity never does.
            let _ = self.foca.announce(MemberId::seed(*seed), &mut self.runtime);
        }
        self.next_join_at = Some(now + Duration::from_millis(JOIN_RETRY_MS));
        self.drain(now);
    }

    /// Hands foca a datagram that arrived.
    pub fn handle_datagram(&mut self, now: Duration, data: &[u8]) {
        self.counters.datagrams_received += 1;
        self.counters.bytes_received += data.len() as u64;
        if self.foca.iter_membership_state().len() >= MEMBERS_MAX {
            self.counters.datagrams_dropped_members_full += 1;
            return;
        }
        self.loads.borrow_mut().now = now;
        if self.foca.handle_data(data, &mut self.runtime).is_err() {
            self.counters.datagrams_refused += 1;
        }
        self.drain(now);
    }

    /// When the next timer (or join retry) is due, if any.
    pub fn next_timer_at(&self) -> Option<Duration> {
        let timer = self.timers.peek().map(|Reverse(scheduled)| scheduled.at);
        match (timer, self.next_join_at) {
            (Some(timer), Some(join)) => Some(timer.min(join)),
            (timer, join) => timer.or(join),
        }
    }

    /// Runs every timer due at `now`, in order, and retries the join when
    /// it is due and no member is alive.
    pub fn fire_due_timers(&mut self, now: Duration) {
        if self.next_join_at.is_some_and(|at| at <= now) {
            if self.foca.num_members() == 0 {
                self.announce_to_seeds(now);
            } else {
                self.next_join_at = Some(now + Duration::from_millis(JOIN_RETRY_MS));
            }
        }
        while self.timers.peek().is_some_and(|Reverse(scheduled)| scheduled.at <= now) {
            let Some(Reverse(scheduled)) = self.timers.pop() else { break };
            self.loads.borrow_mut().now = now;
            // foca errors only on encoding, which our codec does not fail.
            let _ = self.foca.handle_timer(scheduled.item, &mut self.runtime);
            self.drain(now);
        }
    }

    /// Publishes this node's load when it changed since the last time, or
    /// [`LOAD_REPUBLISH_MS`] passed; also forgets the loads of members foca
    /// no longer knows.
    pub fn publish_load(&mut self, now: Duration, load: LoadSummary) {
        if self.left {
            return;
        }
        let load = load.rounded();
        let unchanged = self.last_published.is_some_and(|(last, at)| {
            last == load && now.saturating_sub(at) < Duration::from_millis(LOAD_REPUBLISH_MS)
        });
        if unchanged {
            return;
        }
        self.add_load_broadcast(now, load, self.leaving);
        self.forget_unknown_loads();
    }

    fn add_load_broadcast(&mut self, now: Duration, load: LoadSummary, leaving: bool) {
        self.load_sequence += 1;
        let me = self.identity();
        let version = (me.started_unix_ms, me.incarnation, self.load_sequence);
        let broadcast = LoadBroadcast { node_id: me.node_id, version, leaving, load };
        self.loads.borrow_mut().now = now;
        // Our own broadcast always decodes and is always newer.
        let _ = self.foca.add_broadcast(&broadcast.encode());
        self.last_published = Some((load, now));
        self.counters.loads_published += 1;
    }

    fn forget_unknown_loads(&mut self) {
        let me = self.identity().node_id;
        let known: std::collections::HashSet<NodeId> =
            self.foca.iter_membership_state().map(|member| member.id().node_id).collect();
        self.loads.borrow_mut().retain(|node_id| node_id == me || known.contains(&node_id));
    }

    /// Says this node is leaving (a load broadcast with `leaving` set) while
    /// it stays a member: every node's placement stops counting it, so the
    /// groups' leaders move its replicas and leaderships away before it
    /// calls [`Self::leave`].
    pub fn announce_leaving(&mut self, now: Duration) {
        if self.left || self.leaving {
            return;
        }
        self.leaving = true;
        let load = self.last_published.map(|(load, _)| load).unwrap_or_default();
        self.add_load_broadcast(now, load, true);
        self.drain(now);
    }

    /// Leaves the cluster: a last load broadcast saying so, then foca's
    /// leave (this identity declared down, gossiped to a few members).
    /// Nothing is published afterwards.
    pub fn leave(&mut self, now: Duration) {
        if self.left {
            return;
        }
        let load = self.last_published.map(|(load, _)| load).unwrap_or_default();
        self.add_load_broadcast(now, load, true);
        // foca errors only on encoding, which our codec does not fail.
        let _ = self.foca.leave_cluster(&mut self.runtime);
        self.left = true;
        self.drain(now);
    }

    /// The next datagram to send, and where.
    pub fn take_datagram(&mut self) -> Option<(SocketAddr, Bytes)> {
        self.outbox.pop_front()
    }

    /// The next notification (member up, down, renamed, ...), to log.
    pub fn take_notification(&mut self) -> Option<OwnedNotification<MemberId>> {
        self.notifications.pop_front()
    }

    /// Moves what foca produced into the outbox, the timer heap and the
    /// notification queue, each bounded.
    fn drain(&mut self, now: Duration) {
        while let Some((to, data)) = self.runtime.to_send() {
            if self.outbox.len() >= OUTBOX_DATAGRAMS_MAX {
                self.counters.datagrams_dropped_outbox += 1;
                continue;
            }
            self.counters.datagrams_sent += 1;
            self.counters.bytes_sent += data.len() as u64;
            self.outbox.push_back((to.addr(), data));
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            if self.timers.len() >= TIMERS_MAX {
                self.counters.timers_dropped += 1;
                continue;
            }
            self.timer_sequence += 1;
            self.timers.push(Reverse(Scheduled { at: now + after, sequence: self.timer_sequence, item: timer }));
        }
        while let Some(notification) = self.runtime.to_notify() {
            if self.left && notification == OwnedNotification::Defunct {
                // The leave itself: this identity is down on purpose.
                continue;
            }
            if self.notifications.len() >= NOTIFICATIONS_MAX {
                self.notifications.pop_front();
            }
            self.notifications.push_back(notification);
        }
    }

    /// Every member this node knows, itself first, then by cluster address.
    pub fn members(&self) -> Vec<MemberView> {
        let loads = self.loads.borrow();
        let me = self.identity();
        let own_state = match (self.left, self.leaving) {
            (true, _) => MemberState::Left,
            (false, true) => MemberState::Leaving,
            (false, false) => MemberState::Alive,
        };
        let mut members =
            vec![MemberView { id: me.clone(), state: own_state, is_self: true, load: loads.get(me.node_id).copied() }];
        let mut others: Vec<MemberView> = self
            .foca
            .iter_membership_state()
            .map(|member| {
                let load = loads.get(member.id().node_id).copied();
                let leaving = load.is_some_and(|entry| entry.broadcast.leaving);
                let state = match member.state() {
                    State::Alive | State::Suspect if leaving => MemberState::Leaving,
                    State::Alive => MemberState::Alive,
                    State::Suspect => MemberState::Suspect,
                    State::Down if leaving => MemberState::Left,
                    State::Down => MemberState::Down,
                };
                MemberView { id: member.id().clone(), state, is_self: false, load }
            })
            .collect();
        others.sort_by_key(|member| member.id.addresses.cluster);
        members.extend(others);
        members
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::identity::{MemberAddresses, NodeIdentity};

    fn member(index: u16) -> MemberId {
        let address: SocketAddr = format!("127.0.0.1:{}", 9000 + index).parse().unwrap();
        let identity = NodeIdentity { node_id: NodeId(u128::from(index) + 1), incarnation: 1, started_unix_ms: 1 };
        MemberId::new(identity, MemberAddresses { cluster: address, ..MemberId::seed(address).addresses })
    }

    /// Moves every queued datagram between two members until both are quiet.
    fn exchange(a: &mut Membership, b: &mut Membership, now: Duration) {
        for _ in 0..16 {
            let mut moved = false;
            while let Some((to, data)) = a.take_datagram() {
                assert_eq!(to, b.identity().addr());
                b.handle_datagram(now, &data);
                moved = true;
            }
            while let Some((to, data)) = b.take_datagram() {
                assert_eq!(to, a.identity().addr());
                a.handle_datagram(now, &data);
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    /// A node that announces itself to a seed by address only (it does not
    /// know the seed's id) is taken in, and both then list each other alive.
    #[test]
    fn a_node_joins_through_a_seed_address() {
        let (mut seed, mut joiner) = (Membership::new(member(0), 1), Membership::new(member(1), 2));
        let now = Duration::ZERO;
        joiner.join(now, &[seed.identity().addr(), joiner.identity().addr()]);
        exchange(&mut joiner, &mut seed, now);
        for (node, other) in [(&seed, &joiner), (&joiner, &seed)] {
            let members = node.members();
            assert_eq!(members.len(), 2, "{members:?}");
            assert_eq!(members[1].id, *other.identity());
            assert_eq!(members[1].state, MemberState::Alive);
        }
    }

    /// A load published on one node reaches the other with the gossip, and
    /// an unchanged load is not published again before its refresh time.
    #[test]
    fn loads_are_gossiped_and_only_republished_when_due() {
        let (mut seed, mut joiner) = (Membership::new(member(0), 1), Membership::new(member(1), 2));
        joiner.join(Duration::ZERO, &[seed.identity().addr()]);
        exchange(&mut joiner, &mut seed, Duration::ZERO);
        let load = LoadSummary { events_per_s: 1234.4, partitions_owned: 7, shards: 2, ..Default::default() };
        joiner.publish_load(Duration::ZERO, load);
        joiner.publish_load(Duration::from_millis(100), load);
        assert_eq!(joiner.counters().loads_published, 1);
        let mut now = Duration::ZERO;
        while now < Duration::from_secs(2) {
            now += Duration::from_millis(50);
            seed.fire_due_timers(now);
            joiner.fire_due_timers(now);
            exchange(&mut joiner, &mut seed, now);
        }
        let seen = seed.members()[1].load.expect("the joiner's load arrived").broadcast.load;
        assert_eq!((seen.events_per_s, seen.partitions_owned), (1234.0, 7));
        joiner.publish_load(Duration::from_millis(LOAD_REPUBLISH_MS), load);
        assert_eq!(joiner.counters().loads_published, 2);
    }

    /// Garbage and oversized datagrams are counted and refused, never a panic.
    #[test]
    fn garbage_datagrams_are_refused() {
        let mut node = Membership::new(member(0), 1);
        for garbage in [&[][..], &[0xff; 3][..], &[0u8; DATAGRAM_BYTES_MAX + 1][..], &[1, 2, 3, 4, 5, 6, 7, 8][..]] {
            node.handle_datagram(Duration::ZERO, garbage);
        }
        assert_eq!(node.counters().datagrams_refused, 4);
        assert_eq!(node.members().len(), 1);
    }
}
