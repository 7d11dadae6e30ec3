//! `GET /cluster` and the cluster's `/metrics` families: this node's view
//! of the membership, from the cluster thread.

use std::fmt::Write;

use serde_json::json;

use crate::admin::{AdminState, SHARD_REPLY_TIMEOUT};
use crate::cluster::membership::{MemberState, MemberView};
use crate::cluster::{ClusterRequest, ClusterView, MemberAddresses};

/// This node's view of the cluster, or `None` when the cluster thread did
/// not answer in time.
pub async fn collect(state: &AdminState) -> Option<ClusterView> {
    let (sender, receiver) = flume::bounded(1);
    state.cluster.try_send(ClusterRequest::View(sender)).ok()?;
    tokio::time::timeout(SHARD_REPLY_TIMEOUT, receiver.recv_async()).await.ok()?.ok()
}

/// A member's addresses; `cluster` is null on a node that does not gossip.
fn addresses_json(addresses: &MemberAddresses, gossip: bool) -> serde_json::Value {
    json!({
        "cluster": gossip.then(|| addresses.cluster.to_string()),
        "ingest": addresses.ingest.to_string(),
        "ingest_json": addresses.ingest_json.map(|address| address.to_string()),
        "ingest_ilp": addresses.ingest_ilp.map(|address| address.to_string()),
        "subscribe": addresses.subscribe.to_string(),
        "admin": addresses.admin.to_string(),
    })
}

fn member_json(member: &MemberView, view: &ClusterView) -> serde_json::Value {
    let load = member.load.map(|entry| {
        let load = entry.broadcast.load;
        json!({
            "events_per_s": load.events_per_s,
            "bytes_per_s": load.bytes_per_s,
            "busy_ratio": load.busy_ratio,
            "disk_bytes": load.disk_bytes,
            "partitions_owned": load.partitions_owned,
            "shards": load.shards,
            "age_ms": view.now.saturating_sub(entry.received_at).as_millis() as u64,
        })
    });
    json!({
        "node_id": member.id.node_id.to_string(),
        "self": member.is_self,
        "state": member.state,
        "incarnation": member.id.incarnation,
        "started_unix_ms": member.id.started_unix_ms,
        "addresses": addresses_json(&member.id.addresses, view.enabled),
        "load": load,
    })
}

/// How many members are in each state.
fn counts(view: &ClusterView) -> [(MemberState, usize); 5] {
    MemberState::ALL.map(|state| (state, view.members.iter().filter(|member| member.state == state).count()))
}

/// `GET /cluster`: every member this node knows (itself first) with its
/// state, addresses, incarnation and latest load; the gossip counters; the
/// Raft group of every replicated partition this node holds (`partitions`,
/// the catalog group among them as stream `(catalog)`); where the
/// cluster's catalog stands here (`catalog`, null on a single node).
pub fn json(view: &ClusterView, catalog: serde_json::Value) -> String {
    let members: Vec<serde_json::Value> = view.members.iter().map(|member| member_json(member, view)).collect();
    let counts: serde_json::Map<String, serde_json::Value> =
        counts(view).iter().map(|(state, count)| (state.name().to_string(), json!(count))).collect();
    let counters = view.counters;
    let document = json!({
        "node_id": view.members.first().map(|member| member.id.node_id.to_string()),
        "gossip": view.enabled,
        "members": members,
        "counts": counts,
        "transport": view.peers,
        "partitions": view.groups,
        "catalog": catalog,
        "replication": view.replication,
        "gossip_counters": {
            "datagrams_received": counters.datagrams_received,
            "bytes_received": counters.bytes_received,
            "datagrams_sent": counters.datagrams_sent,
            "bytes_sent": counters.bytes_sent,
            "datagrams_refused": counters.datagrams_refused,
            "datagrams_dropped": counters.datagrams_dropped_outbox + counters.datagrams_dropped_members_full,
            "loads_published": counters.loads_published,
        },
    });
    serde_json::to_string_pretty(&document).expect("json serializes")
}

/// The cluster's `/metrics` families: members by state, gossip traffic.
pub fn metrics(out: &mut String, view: &ClusterView) {
    let name = "spate_cluster_members";
    let _ = writeln!(out, "# HELP {name} Cluster members this node knows, by state (itself included).");
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (state, count) in counts(view) {
        let _ = writeln!(out, "{name}{{state=\"{}\"}} {count}", state.name());
    }
    let counters = view.counters;
    let totals = [
        ("spate_cluster_gossip_datagrams_received_total", "Gossip datagrams received.", counters.datagrams_received),
        ("spate_cluster_gossip_bytes_received_total", "Gossip bytes received.", counters.bytes_received),
        ("spate_cluster_gossip_datagrams_sent_total", "Gossip datagrams sent.", counters.datagrams_sent),
        ("spate_cluster_gossip_bytes_sent_total", "Gossip bytes sent.", counters.bytes_sent),
        (
            "spate_cluster_gossip_datagrams_refused_total",
            "Gossip datagrams refused (undecodable, oversized, stale).",
            counters.datagrams_refused,
        ),
    ];
    for (name, help, value) in totals {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    replication_metrics(out, view);
    transport_metrics(out, view);
}

/// The Raft store's families: its entries against the bound, proposals
/// refused while it was full, compactions, rewrites and snapshots.
fn replication_metrics(out: &mut String, view: &ClusterView) {
    let stats = view.replication;
    let families = [
        ("spate_raft_log_entry_bytes", "gauge", "Bytes of Raft log entries held (every group).", stats.entry_bytes),
        ("spate_raft_log_entry_bytes_max", "gauge", "The bound on them (--raft-log-bytes-max).", stats.entry_bytes_max),
        (
            "spate_raft_log_full_refusals_total",
            "counter",
            "Proposals refused because the Raft log was full (compaction behind).",
            stats.full_refusals,
        ),
        ("spate_raft_log_compactions_total", "counter", "Raft log compactions of a group.", stats.compactions),
        (
            "spate_raft_syncs_total",
            "counter",
            "Raft log syncs (one per round that wrote, for every group).",
            stats.syncs,
        ),
        ("spate_raft_messages_sent_total", "counter", "Raft messages sent to peers.", stats.messages_sent),
        ("spate_raft_batches_sent_total", "counter", "Peer batches sent (one per peer per round).", stats.batches_sent),
        ("spate_raft_proposals_total", "counter", "Entries proposed by this node as a leader.", stats.proposals),
        (
            "spate_raft_proposals_retried_total",
            "counter",
            "This node's proposals sent again (their leader changed, or no answer within 2 s).",
            stats.proposals_retried,
        ),
        (
            "spate_raft_proposals_deduplicated_total",
            "counter",
            "Retried proposals this node, as the leader, found already in its log and did not store again.",
            stats.proposals_deduplicated,
        ),
        (
            "spate_raft_refusals_of_resent_total",
            "counter",
            "Refusals of a proposal sent more than once (another send may have been taken): sent again with a lookup in the leader's log, not answered refused.",
            stats.refusals_of_resent,
        ),
        ("spate_raft_entries_applied_total", "counter", "Committed entries applied.", stats.applied_entries),
        (
            "spate_raft_delivery_waves_total",
            "counter",
            "Waves of committed records sent to the shards.",
            stats.delivery_waves,
        ),
        ("spate_raft_deliveries_total", "counter", "Deliveries of committed records to a partition.", stats.deliveries),
        (
            "spate_raft_log_rewrites_total",
            "counter",
            "Bases of the Raft log written (the live state, after which older files are deleted).",
            stats.store_rewrites,
        ),
        (
            "spate_raft_snapshots_installed_total",
            "counter",
            "Raft snapshots installed (the leader had compacted what this replica needed).",
            stats.snapshots_installed,
        ),
        (
            "spate_raft_partition_gaps_total",
            "counter",
            "Deliveries held: a partition lacked records before its group's compaction point.",
            stats.gaps,
        ),
        (
            "spate_raft_gaps_open",
            "gauge",
            "Partitions lacking records before their group's compaction point now (fetching them from peers).",
            stats.gaps_open,
        ),
        (
            "spate_raft_gap_records_fetched_total",
            "counter",
            "Records fetched from peers' partition logs for gaps.",
            stats.gap_fetches.records_fetched,
        ),
        (
            "spate_raft_gap_bytes_fetched_total",
            "counter",
            "Bytes of those records (log format).",
            stats.gap_fetches.bytes_fetched,
        ),
        (
            "spate_raft_gaps_closed_total",
            "counter",
            "Gaps closed by fetching their records from peers.",
            stats.gap_fetches.gaps_closed,
        ),
        (
            "spate_raft_gap_peer_lacked_total",
            "counter",
            "Gap reads a peer answered without the records (its retention deleted them).",
            stats.gap_fetches.peer_lacked,
        ),
        (
            "spate_raft_gap_request_failures_total",
            "counter",
            "Gap reads that timed out or a peer could not serve (retried on the next replica).",
            stats.gap_fetches.request_failures,
        ),
        (
            "spate_raft_gap_reads_served_total",
            "counter",
            "Gap reads this node served for peers.",
            stats.gap_fetches.reads_served,
        ),
        (
            "spate_raft_mirrors_open",
            "gauge",
            "Partitions mirrored now: a subscriber here reads them and this node holds no replica.",
            stats.mirrors.open,
        ),
        (
            "spate_raft_mirror_records_total",
            "counter",
            "Records read from replicas into mirrored partitions.",
            stats.mirrors.records,
        ),
        ("spate_raft_mirror_bytes_total", "counter", "Bytes of those records (log format).", stats.mirrors.bytes),
        ("spate_raft_mirror_requests_total", "counter", "Mirror reads sent to replicas.", stats.mirrors.requests),
        (
            "spate_raft_mirror_request_failures_total",
            "counter",
            "Mirror reads that timed out or a replica could not serve (retried on the next replica).",
            stats.mirrors.request_failures,
        ),
        (
            "spate_raft_mirror_peer_lacked_total",
            "counter",
            "Mirror reads a replica answered without the records (its retention deleted them).",
            stats.mirrors.peer_lacked,
        ),
        (
            "spate_raft_mirror_reads_served_total",
            "counter",
            "Mirror reads this node served for peers.",
            stats.mirrors.reads_served,
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
}

/// The transport's families, one series per peer (`peer` = its node id).
fn transport_metrics(out: &mut String, view: &ClusterView) {
    type Field = fn(&crate::transport::runtime::PeerCounters) -> f64;
    let families: [(&str, &str, &str, Field); 10] = [
        ("spate_transport_bytes_sent_total", "counter", "Transport bytes written to the peer.", |c| {
            c.bytes_sent as f64
        }),
        ("spate_transport_frames_sent_total", "counter", "Transport messages written to the peer.", |c| {
            c.frames_sent as f64
        }),
        ("spate_transport_bytes_received_total", "counter", "Transport bytes received from the peer.", |c| {
            c.bytes_received as f64
        }),
        ("spate_transport_frames_received_total", "counter", "Transport messages received from the peer.", |c| {
            c.frames_received as f64
        }),
        ("spate_transport_reconnects_total", "counter", "Connections to the peer made after the first.", |c| {
            c.reconnects as f64
        }),
        ("spate_transport_connect_failures_total", "counter", "Failed connection attempts to the peer.", |c| {
            c.connect_failures as f64
        }),
        ("spate_transport_credit_stalls_total", "counter", "Times the link to the peer ran out of credit.", |c| {
            c.credit_stalls as f64
        }),
        ("spate_transport_sender_waits_total", "counter", "Sends to the peer that waited for queue room.", |c| {
            c.sender_waits as f64
        }),
        ("spate_transport_queued_bytes", "gauge", "Bytes queued for the peer, not yet written.", |c| {
            c.queued_bytes as f64
        }),
        ("spate_transport_rtt_seconds", "gauge", "The latest ping round trip to the peer.", |c| {
            c.rtt_us.unwrap_or(0) as f64 / 1e6
        }),
    ];
    for (name, kind, help, field) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for peer in &view.peers {
            let _ = writeln!(out, "{name}{{peer=\"{}\"}} {}", peer.node_id, field(&peer.counters));
        }
    }
}
