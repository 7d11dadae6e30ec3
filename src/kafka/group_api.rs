//! The group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup (membership, [`super::groups`]), OffsetCommit and OffsetFetch
//! (offsets, in spate's group store through each entry's coordinator
//! shard), ListGroups and DescribeGroups.
//!
//! This process is every group's coordinator (node 0, as Metadata says).
//! An offset commit is answered once it is durable: the same file, fsync
//! and rename as a `GROUP` member's `COMMIT`. A Kafka group's name must be
//! a valid spate group name (`[a-z0-9._-]`, at most 64 bytes, as its
//! offsets are a file named after it): another gets INVALID_GROUP_ID. A
//! name a `GROUP` group of the same stream uses gets
//! INCONSISTENT_GROUP_PROTOCOL (and the `GROUP` member gets
//! `ERR group_conflict` the other way round).
//!
//! Offsets of a replicated stream (a cluster's, of replication factor
//! above one) are refused with INVALID_TOPIC_EXCEPTION, on commit and
//! fetch: groups are kept per node, not cluster-wide yet, as a `GROUP`
//! member's `ERR replicated_stream` says (README, "Cluster"). Consumers
//! that keep their own offsets (assign, no group) read it as any stream.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{OffsetFetchResponsePartition, OffsetFetchResponseTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::groups::{JoinAnswer, JoinRequest, SyncAnswer};
use super::{KafkaFace, codes};
use crate::group::messages::{GroupFrame, KafkaStream};
use crate::runtime::notify::{Either, first};
use crate::shard::Shard;

/// How often a waiting join or sync runs the groups' clock (session
/// expiry, rebalance deadlines).
const TICK_MS: u64 = 100;
/// The longest a coordinator shard may take to answer an offsets request.
const OFFSETS_WAIT_MS_MAX: u64 = 30_000;

fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_string())
}

/// Waits for a group answer, running the clock meanwhile; `None` if the
/// answer can no longer come.
async fn wait_for<T>(face: &KafkaFace, receiver: flume::Receiver<T>) -> Option<T> {
    let limit = Duration::from_millis(super::groups::SESSION_TIMEOUT_MS_MAX as u64) * 2;
    let started = Instant::now();
    while started.elapsed() < limit {
        let tick = glommio::timer::sleep(Duration::from_millis(TICK_MS));
        match first(receiver.recv_async(), tick).await {
            Either::Left(answer) => return answer.ok(),
            Either::Right(()) => face.groups.tick(Instant::now()),
        }
    }
    None
}

/// FindCoordinator: this broker, for groups; transactions are not served.
pub fn find_coordinator(face: &KafkaFace, request: FindCoordinatorRequest) -> FindCoordinatorResponse {
    let answer = |key: StrBytes| {
        let mut coordinator = Coordinator::default().with_key(key);
        if request.key_type == 0 {
            coordinator.node_id = BrokerId(0);
            coordinator.host = text(&face.advertised_host);
            coordinator.port = face.advertised_port;
        } else {
            coordinator.node_id = BrokerId(-1);
            coordinator.error_code = codes::COORDINATOR_NOT_AVAILABLE;
            coordinator.error_message = Some(StrBytes::from_static_str("spate serves no transactions"));
        }
        coordinator
    };
    // Version 4 asks for many keys and answers in `coordinators`; before
    // it, one key, answered in the top-level fields (the codec refuses
    // fields of the other shape).
    if !request.coordinator_keys.is_empty() {
        let coordinators = request.coordinator_keys.iter().cloned().map(answer).collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let single = answer(request.key.clone());
    FindCoordinatorResponse::default()
        .with_error_code(single.error_code)
        .with_error_message(single.error_message)
        .with_node_id(single.node_id)
        .with_host(single.host)
        .with_port(single.port)
}

/// JoinGroup: answered when the rebalance completes.
pub async fn join_group(face: &KafkaFace, request: JoinGroupRequest, client_id: &str) -> JoinGroupResponse {
    let group = request.group_id.0.to_string();
    let joined = if crate::protocol::group::is_valid_name(group.as_bytes()) {
        let request = JoinRequest {
            group,
            member_id: request.member_id.to_string(),
            client_id: client_id.to_string(),
            client_host: String::new(),
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: request.rebalance_timeout_ms.max(request.session_timeout_ms),
            protocol_type: request.protocol_type.to_string(),
            protocols: request
                .protocols
                .into_iter()
                .map(|protocol| (protocol.name.to_string(), protocol.metadata))
                .collect(),
        };
        face.groups.tick(Instant::now());
        let receiver = face.groups.join(request, Instant::now());
        wait_for(face, receiver).await
    } else {
        Some(JoinAnswer { error: codes::INVALID_GROUP_ID, ..JoinAnswer::default() })
    };
    join_response(joined.unwrap_or(JoinAnswer { error: codes::UNKNOWN_MEMBER_ID, ..JoinAnswer::default() }))
}

fn join_response(answer: JoinAnswer) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(answer.error)
        .with_generation_id(if answer.error == codes::NONE { answer.generation } else { -1 })
        .with_protocol_type(Some(text(&answer.protocol_type)))
        .with_protocol_name(Some(text(&answer.protocol)))
        .with_leader(text(&answer.leader))
        .with_member_id(text(&answer.member_id))
        .with_members(
            answer
                .members
                .into_iter()
                .map(|(id, metadata)| {
                    JoinGroupResponseMember::default().with_member_id(text(&id)).with_metadata(metadata)
                })
                .collect(),
        )
}

/// SyncGroup: the member's assignment, once the leader has sent it.
pub async fn sync_group(face: &KafkaFace, request: SyncGroupRequest) -> SyncGroupResponse {
    let assignments: Vec<(String, Bytes)> =
        request.assignments.into_iter().map(|given| (given.member_id.to_string(), given.assignment)).collect();
    let receiver =
        face.groups.sync(&request.group_id.0, &request.member_id, request.generation_id, assignments, Instant::now());
    let answer = wait_for(face, receiver).await;
    sync_response(answer.unwrap_or(SyncAnswer { error: codes::UNKNOWN_MEMBER_ID, ..SyncAnswer::default() }))
}

fn sync_response(answer: SyncAnswer) -> SyncGroupResponse {
    SyncGroupResponse::default()
        .with_error_code(answer.error)
        .with_protocol_type(Some(text(&answer.protocol_type)))
        .with_protocol_name(Some(text(&answer.protocol)))
        .with_assignment(answer.assignment)
}

pub fn heartbeat(face: &KafkaFace, request: HeartbeatRequest) -> HeartbeatResponse {
    let now = Instant::now();
    face.groups.tick(now);
    let code = face.groups.heartbeat(&request.group_id.0, &request.member_id, request.generation_id, now);
    HeartbeatResponse::default().with_error_code(code)
}

pub fn leave_group(face: &KafkaFace, request: LeaveGroupRequest) -> LeaveGroupResponse {
    let mut ids: Vec<String> = request.members.iter().map(|member| member.member_id.to_string()).collect();
    if ids.is_empty() {
        ids.push(request.member_id.to_string());
    }
    let codes = face.groups.leave(&request.group_id.0, &ids, Instant::now());
    let members: Vec<MemberResponse> = ids
        .iter()
        .zip(&codes)
        .map(|(id, &code)| MemberResponse::default().with_member_id(text(id)).with_error_code(code))
        .collect();
    // Before v3 one member leaves, and its code is the response's.
    if request.members.is_empty() {
        return LeaveGroupResponse::default().with_error_code(codes.first().copied().unwrap_or(codes::NONE));
    }
    LeaveGroupResponse::default().with_members(members)
}

pub fn list_groups(face: &KafkaFace) -> ListGroupsResponse {
    let groups = face
        .groups
        .describe(None)
        .into_iter()
        .map(|group| {
            ListedGroup::default()
                .with_group_id(GroupId(text(&group.group)))
                .with_protocol_type(text(&group.protocol_type))
                .with_group_state(StrBytes::from_static_str(group.state))
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub fn describe_groups(face: &KafkaFace, request: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let names: Vec<String> = request.groups.iter().map(|group| group.0.to_string()).collect();
    let groups = face
        .groups
        .describe(Some(&names))
        .into_iter()
        .map(|group| {
            let members = group
                .members
                .into_iter()
                .map(|member| {
                    DescribedGroupMember::default()
                        .with_member_id(text(&member.member_id))
                        .with_client_id(text(&member.client_id))
                        .with_client_host(text(&member.client_host))
                        .with_member_metadata(member.metadata)
                        .with_member_assignment(member.assignment)
                })
                .collect();
            DescribedGroup::default()
                .with_group_id(GroupId(text(&group.group)))
                .with_group_state(StrBytes::from_static_str(group.state))
                .with_protocol_type(text(&group.protocol_type))
                .with_protocol_data(text(&group.protocol))
                .with_members(members)
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

/// Sends a group frame to the coordinator of `(stream id, group)` and
/// waits for its answer.
async fn ask_coordinator<T>(
    shard: &Shard,
    key: (u32, String),
    frame: GroupFrame,
    answer: flume::Receiver<T>,
) -> Option<T> {
    shard.send_group(shard.group_coordinator(&key), frame);
    let timer = glommio::timer::sleep(Duration::from_millis(OFFSETS_WAIT_MS_MAX));
    match first(answer.recv_async(), timer).await {
        Either::Left(answer) => answer.ok(),
        Either::Right(()) => None,
    }
}

/// Commits one topic's offsets; the code for each of its partitions.
async fn commit_topic(shard: &Shard, group: &str, topic: &str, offsets: &[(i32, i64)]) -> i16 {
    let Some(route) = shard.route_for(topic.as_bytes()) else { return codes::UNKNOWN_TOPIC_OR_PARTITION };
    if shard.stream_is_replicated(route.id) {
        return codes::INVALID_TOPIC_EXCEPTION;
    }
    let mut local = Vec::with_capacity(offsets.len());
    for &(partition, offset) in offsets {
        match (u32::try_from(partition), u64::try_from(offset)) {
            (Ok(partition), Ok(offset)) if partition < route.partitions => local.push((partition, offset)),
            _ => return codes::UNKNOWN_TOPIC_OR_PARTITION,
        }
    }
    let key = (route.id, group.to_string());
    let stream = KafkaStream { name: topic.to_string(), base: route.base, partitions: route.partitions };
    let (reply, answer) = flume::bounded(1);
    let frame = GroupFrame::KafkaCommit { key: key.clone(), stream, offsets: local, reply };
    ask_coordinator(shard, key, frame, answer).await.unwrap_or(codes::COORDINATOR_NOT_AVAILABLE)
}

/// OffsetCommit: checks the member, then stores each topic's offsets
/// durably in the group store; answered once they are written.
pub async fn offset_commit(shard: &Shard, face: &KafkaFace, request: OffsetCommitRequest) -> OffsetCommitResponse {
    let group = request.group_id.0.to_string();
    let membership = if crate::protocol::group::is_valid_name(group.as_bytes()) {
        let generation = request.generation_id_or_member_epoch;
        face.groups.check_commit(&group, &request.member_id, generation, Instant::now())
    } else {
        codes::INVALID_GROUP_ID
    };
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let offsets: Vec<(i32, i64)> =
            topic.partitions.iter().map(|partition| (partition.partition_index, partition.committed_offset)).collect();
        let code = match membership {
            codes::NONE => commit_topic(shard, &group, &topic.name.0, &offsets).await,
            refused => refused,
        };
        let partitions = offsets
            .iter()
            .map(|&(index, _)| {
                OffsetCommitResponsePartition::default().with_partition_index(index).with_error_code(code)
            })
            .collect();
        topics.push(OffsetCommitResponseTopic::default().with_name(topic.name).with_partitions(partitions));
    }
    OffsetCommitResponse::default().with_topics(topics)
}

/// One topic's committed offsets for the wanted partitions (all when
/// `None`): (partition, offset or -1, code).
async fn fetch_topic(shard: &Shard, group: &str, topic: &str, wanted: Option<&[i32]>) -> Vec<(i32, i64, i16)> {
    let Some(route) = shard.route_for(topic.as_bytes()) else {
        return wanted.unwrap_or_default().iter().map(|&p| (p, -1, codes::UNKNOWN_TOPIC_OR_PARTITION)).collect();
    };
    let all: Vec<i32> = (0..route.partitions as i32).collect();
    let wanted = wanted.unwrap_or(&all);
    if shard.stream_is_replicated(route.id) {
        return wanted.iter().map(|&partition| (partition, -1, codes::INVALID_TOPIC_EXCEPTION)).collect();
    }
    let key = (route.id, group.to_string());
    let (reply, answer) = flume::bounded(1);
    let frame = GroupFrame::KafkaOffsets { key: key.clone(), reply };
    let committed = ask_coordinator(shard, key, frame, answer).await.unwrap_or(Err(codes::COORDINATOR_NOT_AVAILABLE));
    wanted
        .iter()
        .map(|&partition| match &committed {
            Err(code) => (partition, -1, *code),
            Ok(_) if !(0..route.partitions as i32).contains(&partition) => {
                (partition, -1, codes::UNKNOWN_TOPIC_OR_PARTITION)
            }
            Ok(offsets) => {
                let offset = offsets.get(partition as usize).copied().flatten();
                (partition, offset.map_or(-1, |offset| offset as i64), codes::NONE)
            }
        })
        .collect()
}

/// OffsetFetch (v1-7: one group): the committed offsets, -1 where none.
/// A null topic list asks for every stream the group committed to.
pub async fn offset_fetch(shard: &Shard, request: OffsetFetchRequest) -> OffsetFetchResponse {
    let group = request.group_id.0.to_string();
    if !crate::protocol::group::is_valid_name(group.as_bytes()) {
        return OffsetFetchResponse::default().with_error_code(codes::INVALID_GROUP_ID);
    }
    let asked: Vec<(String, Option<Vec<i32>>)> = match request.topics {
        Some(topics) => {
            topics.into_iter().map(|topic| (topic.name.0.to_string(), Some(topic.partition_indexes))).collect()
        }
        None => shard.stream_names().into_iter().map(|name| (name, None)).collect(),
    };
    let mut topics = Vec::with_capacity(asked.len());
    for (name, wanted) in asked {
        let found = fetch_topic(shard, &group, &name, wanted.as_deref()).await;
        if wanted.is_none() && found.iter().all(|&(_, offset, _)| offset < 0) {
            continue;
        }
        let partitions = found
            .into_iter()
            .map(|(index, offset, code)| {
                OffsetFetchResponsePartition::default()
                    .with_partition_index(index)
                    .with_committed_offset(offset)
                    .with_committed_leader_epoch(-1)
                    .with_metadata(Some(StrBytes::from_static_str("")))
                    .with_error_code(code)
            })
            .collect();
        topics.push(OffsetFetchResponseTopic::default().with_name(TopicName(text(&name))).with_partitions(partitions));
    }
    OffsetFetchResponse::default().with_topics(topics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::api::{SUPPORTED, respond};
    use crate::kafka::{KafkaGroups, ProducerTable};

    fn face() -> KafkaFace {
        KafkaFace {
            advertised_host: "127.0.0.1".into(),
            advertised_port: 9092,
            auto_create_partitions: None,
            request_size_max: 1 << 20,
            produce_discard: false,
            record_size_max: 1 << 20,
            stream_commands: flume::bounded(1).0,
            producers: std::sync::Arc::new(ProducerTable::new(16)),
            groups: std::sync::Arc::new(KafkaGroups::new(16, 16)),
            request_buffers: Default::default(),
        }
    }

    fn versions(key: ApiKey) -> std::ops::RangeInclusive<i16> {
        let &(_, min, max) = SUPPORTED.iter().find(|(served, _, _)| *served == key).unwrap();
        min..=max
    }

    fn encodes<T: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion>(
        key: ApiKey,
        version: i16,
        response: &T,
    ) {
        let encoded = respond(&mut Vec::new(), key, version, 1, response);
        assert_eq!(encoded, Ok(true), "{key:?} v{version}");
    }

    /// Every group response, as the handlers build it from a request of
    /// each served version, encodes at that version: the codec refuses a
    /// field the version lacks (FindCoordinator's two shapes, LeaveGroup's
    /// member list), which closed kafka-python's connections once.
    #[test]
    fn group_responses_encode_at_every_served_version() {
        let face = face();
        let members = vec![("m".to_string(), Bytes::from_static(b"meta"))];
        for version in versions(ApiKey::FindCoordinator) {
            let mut request = FindCoordinatorRequest::default();
            if version >= 4 {
                request.coordinator_keys = vec![StrBytes::from_static_str("g")];
            } else {
                request.key = StrBytes::from_static_str("g");
            }
            encodes(ApiKey::FindCoordinator, version, &find_coordinator(&face, request));
        }
        for version in versions(ApiKey::LeaveGroup) {
            let mut request = LeaveGroupRequest::default().with_group_id(GroupId(StrBytes::from_static_str("g")));
            if version >= 3 {
                request.members = vec![Default::default()];
            } else {
                request.member_id = StrBytes::from_static_str("m");
            }
            encodes(ApiKey::LeaveGroup, version, &leave_group(&face, request));
        }
        for version in versions(ApiKey::JoinGroup) {
            let answer = JoinAnswer { members: members.clone(), ..JoinAnswer::default() };
            encodes(ApiKey::JoinGroup, version, &join_response(answer));
        }
        for version in versions(ApiKey::SyncGroup) {
            let answer = SyncAnswer { assignment: Bytes::from_static(b"a"), ..SyncAnswer::default() };
            encodes(ApiKey::SyncGroup, version, &sync_response(answer));
        }
        for version in versions(ApiKey::Heartbeat) {
            encodes(ApiKey::Heartbeat, version, &heartbeat(&face, HeartbeatRequest::default()));
        }
        for version in versions(ApiKey::ListGroups) {
            encodes(ApiKey::ListGroups, version, &list_groups(&face));
        }
        for version in versions(ApiKey::DescribeGroups) {
            let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(StrBytes::from_static_str("g"))]);
            encodes(ApiKey::DescribeGroups, version, &describe_groups(&face, request));
        }
    }
}
