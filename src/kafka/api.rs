//! Dispatch of one Kafka request, and the APIs that only describe or change
//! the catalog: ApiVersions, Metadata, CreateTopics, DeleteTopics.

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse, ProducerId,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};

use super::codes;
use super::{Frame, FrameError, KafkaFace};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;

/// Every API spate serves, with the versions it answers (all within what
/// the `kafka-protocol` crate encodes). ApiVersions lists exactly these.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
];

/// Whether spate answers `api_key` at `version`.
pub fn is_supported(api_key: i16, version: i16) -> bool {
    SUPPORTED.iter().any(|&(key, min, max)| key as i16 == api_key && (min..=max).contains(&version))
}

/// Handles one request, writing its response (size prefix included) into
/// `out`. `Ok(false)`: nothing to send (Produce with acks=0). `Err`: the
/// connection closes (the request cannot be answered in its own format).
pub async fn handle(shard: &Shard, face: &KafkaFace, frame: Frame, out: &mut Vec<u8>) -> Result<bool, FrameError> {
    let Frame { api_key, api_version: version, correlation_id, body, client_id } = frame;
    let Ok(key) = ApiKey::try_from(api_key) else {
        ShardMetrics::add(&shard.metrics().kafka_errors_unsupported, 1);
        return Err(FrameError::Malformed(format!("unknown API key {api_key}")));
    };
    if key == ApiKey::ApiVersions {
        return Ok(api_versions(version, correlation_id, out));
    }
    if !is_supported(api_key, version) {
        ShardMetrics::add(&shard.metrics().kafka_errors_unsupported, 1);
        return Err(FrameError::Malformed(format!("{key:?} v{version} is not supported")));
    }
    let mut body = body;
    match key {
        ApiKey::Metadata => {
            let request = decode::<MetadataRequest>(&mut body, version)?;
            let response = metadata(shard, face, request).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::CreateTopics => {
            let request = decode::<CreateTopicsRequest>(&mut body, version)?;
            let response = create_topics(shard, face, request).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::DeleteTopics => {
            let request = decode::<DeleteTopicsRequest>(&mut body, version)?;
            let response = delete_topics(face, request).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::Produce => {
            // The connection pipelines Produce requests (`decode_produce`);
            // answered here, one is routed and waited for at once.
            let mut check = super::batch::EntryCheck::default();
            let routed = super::produce::route(shard, face, decode(&mut body, version)?, &mut check).await;
            routed.answerable(shard.ingress()).await;
            match routed.answer(face).await {
                Some(response) => respond(out, key, version, correlation_id, &response),
                None => Ok(false),
            }
        }
        ApiKey::Fetch => {
            let request = decode(&mut body, version)?;
            let response = super::fetch::fetch(shard, face, request).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::ListOffsets => {
            let request = decode(&mut body, version)?;
            let response = super::fetch::list_offsets(shard, request).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::InitProducerId => {
            let response = init_producer_id(face, decode(&mut body, version)?);
            respond(out, key, version, correlation_id, &response)
        }
        _ => {
            let request = Request { key, version, correlation_id, body, client_id };
            handle_group(shard, face, request, out).await
        }
    }
}

/// Decodes a Produce request's body (of `version`): the connection routes
/// it ([`super::produce::route`]) and answers it once it is answerable.
pub fn decode_produce(version: i16, mut body: Bytes) -> Result<kafka_protocol::messages::ProduceRequest, FrameError> {
    decode(&mut body, version)
}

/// A request the group APIs serve, decoded up to its body.
struct Request {
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: Bytes,
    client_id: StrBytes,
}

/// The group APIs ([`super::group_api`]).
async fn handle_group(
    shard: &Shard,
    face: &KafkaFace,
    request: Request,
    out: &mut Vec<u8>,
) -> Result<bool, FrameError> {
    use super::group_api as group;
    let Request { key, version, correlation_id, mut body, client_id } = request;
    let body = &mut body;
    match key {
        ApiKey::FindCoordinator => {
            let response = group::find_coordinator(face, decode(body, version)?);
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::JoinGroup => {
            let response = group::join_group(face, decode(body, version)?, &client_id).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::SyncGroup => {
            let response = group::sync_group(face, decode(body, version)?).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::Heartbeat => {
            respond(out, key, version, correlation_id, &group::heartbeat(face, decode(body, version)?))
        }
        ApiKey::LeaveGroup => {
            respond(out, key, version, correlation_id, &group::leave_group(face, decode(body, version)?))
        }
        ApiKey::OffsetCommit => {
            let response = group::offset_commit(shard, face, decode(body, version)?).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::OffsetFetch => {
            let response = group::offset_fetch(shard, decode(body, version)?).await;
            respond(out, key, version, correlation_id, &response)
        }
        ApiKey::ListGroups => respond(out, key, version, correlation_id, &group::list_groups(face)),
        ApiKey::DescribeGroups => {
            respond(out, key, version, correlation_id, &group::describe_groups(face, decode(body, version)?))
        }
        _ => Err(FrameError::Malformed(format!("{key:?} is not served"))),
    }
}

/// Decodes a request body with the decoder of its API and version, as
/// [`handle`] does, without serving it; a Produce's record batches are
/// checked and their records walked too. Pure: the fuzz target's.
pub fn decode_body(api_key: i16, version: i16, body: &mut Bytes, record_size_max: usize) -> Result<(), FrameError> {
    use kafka_protocol::messages::*;
    let Ok(key) = ApiKey::try_from(api_key) else { return Ok(()) };
    if !is_supported(api_key, version) {
        return Ok(());
    }
    match key {
        ApiKey::Produce => {
            let request: ProduceRequest = decode(body, version)?;
            let mut check = super::batch::EntryCheck::default();
            for partition in request.topic_data.into_iter().flat_map(|topic| topic.partition_data) {
                let records = partition.records.unwrap_or_default();
                if check.check(&records, 0, record_size_max).is_err() {
                    continue;
                }
                for (index, batch) in check.batches().iter().enumerate() {
                    let count = check.records(&records, index).count();
                    assert_eq!(count as i32, batch.record_count, "a checked batch's records are all routed");
                    if let Some(run) = check.staged(index) {
                        assert_eq!(run.ends.len() as i32, batch.record_count, "every staged record is routed");
                    }
                }
            }
        }
        ApiKey::Fetch => {
            decode::<FetchRequest>(body, version)?;
        }
        ApiKey::ListOffsets => {
            decode::<ListOffsetsRequest>(body, version)?;
        }
        ApiKey::Metadata => {
            decode::<MetadataRequest>(body, version)?;
        }
        ApiKey::ApiVersions => {
            decode::<ApiVersionsRequest>(body, version)?;
        }
        ApiKey::CreateTopics => {
            decode::<CreateTopicsRequest>(body, version)?;
        }
        ApiKey::DeleteTopics => {
            decode::<DeleteTopicsRequest>(body, version)?;
        }
        ApiKey::InitProducerId => {
            decode::<InitProducerIdRequest>(body, version)?;
        }
        ApiKey::FindCoordinator => {
            decode::<FindCoordinatorRequest>(body, version)?;
        }
        ApiKey::JoinGroup => {
            decode::<JoinGroupRequest>(body, version)?;
        }
        ApiKey::SyncGroup => {
            decode::<SyncGroupRequest>(body, version)?;
        }
        ApiKey::Heartbeat => {
            decode::<HeartbeatRequest>(body, version)?;
        }
        ApiKey::LeaveGroup => {
            decode::<LeaveGroupRequest>(body, version)?;
        }
        ApiKey::OffsetCommit => {
            decode::<OffsetCommitRequest>(body, version)?;
        }
        ApiKey::OffsetFetch => {
            decode::<OffsetFetchRequest>(body, version)?;
        }
        ApiKey::ListGroups => {
            decode::<ListGroupsRequest>(body, version)?;
        }
        ApiKey::DescribeGroups => {
            decode::<DescribeGroupsRequest>(body, version)?;
        }
        _ => {}
    }
    Ok(())
}

fn decode<T: Decodable>(body: &mut Bytes, version: i16) -> Result<T, FrameError> {
    T::decode(body, version).map_err(|error| FrameError::Malformed(format!("request body: {error}")))
}

/// Writes a response: size, header (in the header version the API and
/// version call for), body.
pub fn respond<T: Encodable + HeaderVersion>(
    out: &mut Vec<u8>,
    _key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &T,
) -> Result<bool, FrameError> {
    // Encoded in place, after what `out` holds: a Fetch answer's records
    // are copied once, from the rendered batches into `out`.
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let encoded = header.encode(out, T::header_version(version)).and_then(|()| response.encode(out, version));
    if let Err(error) = encoded {
        out.truncate(start);
        return Err(FrameError::Malformed(format!("response does not encode: {error}")));
    }
    let size = (out.len() - start - 4) as i32;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
    Ok(true)
}

/// ApiVersions: the versions of [`SUPPORTED`]. A version past spate's gets
/// UNSUPPORTED_VERSION in a version 0 response with the same list (KIP-511),
/// and the client asks again with a version listed.
fn api_versions(version: i16, correlation_id: i32, out: &mut Vec<u8>) -> bool {
    let (min, max) = (0, 3);
    let keys = SUPPORTED
        .iter()
        .map(|&(key, min_version, max_version)| {
            ApiVersion::default().with_api_key(key as i16).with_min_version(min_version).with_max_version(max_version)
        })
        .collect();
    let mut response = ApiVersionsResponse::default().with_api_keys(keys);
    let version = if (min..=max).contains(&version) {
        version
    } else {
        response.error_code = codes::UNSUPPORTED_VERSION;
        0
    };
    respond(out, ApiKey::ApiVersions, version, correlation_id, &response).unwrap_or(false)
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// Metadata: one broker (this process) leads every partition; topics are
/// the streams asked for (all, for a null list). An unknown one is created
/// when the client allows it and `--kafka-auto-create` is on.
async fn metadata(shard: &Shard, face: &KafkaFace, request: MetadataRequest) -> MetadataResponse {
    let names: Vec<String> = match &request.topics {
        None => super::topics::stream_names(shard),
        Some(topics) => topics.iter().filter_map(|topic| topic.name.as_ref().map(|name| name.0.to_string())).collect(),
    };
    let mut topics = Vec::with_capacity(names.len());
    for name in names {
        let route = match shard.route_for(name.as_bytes()) {
            None if request.allow_auto_topic_creation => super::topics::auto_create(shard, face, &name).await,
            route => route,
        };
        let mut topic = MetadataResponseTopic::default().with_name(Some(topic_name(&name)));
        match route {
            None => topic.error_code = codes::UNKNOWN_TOPIC_OR_PARTITION,
            Some(route) => {
                topic.partitions = (0..route.partitions as i32)
                    .map(|index| {
                        MetadataResponsePartition::default()
                            .with_partition_index(index)
                            .with_leader_id(BrokerId(0))
                            .with_replica_nodes(vec![BrokerId(0)])
                            .with_isr_nodes(vec![BrokerId(0)])
                    })
                    .collect()
            }
        }
        topics.push(topic);
    }
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(0))
        .with_host(StrBytes::from_string(face.advertised_host.clone()))
        .with_port(face.advertised_port);
    MetadataResponse::default()
        .with_brokers(vec![broker])
        .with_cluster_id(Some(StrBytes::from_static_str("spate")))
        .with_controller_id(BrokerId(0))
        .with_topics(topics)
}

/// CreateTopics: each topic becomes a stream of `num_partitions` (the
/// replication factor must be 1 or -1, the default: one box, one copy).
async fn create_topics(shard: &Shard, face: &KafkaFace, request: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let mut result = CreatableTopicResult::default().with_name(topic.name.clone());
        let partitions = match topic.num_partitions {
            -1 => face.auto_create_partitions.unwrap_or(shard.config().partitions),
            count => count as u32,
        };
        let refusal = if topic.num_partitions == 0 || topic.num_partitions < -1 {
            Some((codes::INVALID_PARTITIONS, format!("{} partitions", topic.num_partitions)))
        } else if topic.replication_factor != 1 && topic.replication_factor != -1 {
            Some((codes::INVALID_REPLICATION_FACTOR, "spate keeps one copy: replication factor 1".to_string()))
        } else if shard.route_for(name.as_bytes()).is_some() {
            Some((codes::TOPIC_ALREADY_EXISTS, format!("stream {name} exists")))
        } else if request.validate_only {
            None
        } else {
            super::topics::create(face, &name, partitions).await.err()
        };
        if let Some((code, message)) = refusal {
            result.error_code = code;
            result.error_message = Some(StrBytes::from_string(message));
        } else {
            result.num_partitions = partitions as i32;
            result.replication_factor = 1;
        }
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// InitProducerId: a new producer id at epoch 0, or, for a producer that
/// names its id and epoch (KIP-360, after an error that needs a clean
/// sequence), the same id at the next epoch. Transactions are not served:
/// a transactional id gets INVALID_REQUEST.
fn init_producer_id(face: &KafkaFace, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let response = InitProducerIdResponse::default();
    if request.transactional_id.is_some() {
        return response
            .with_error_code(codes::INVALID_REQUEST)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    let (producer_id, epoch) = match (request.producer_id.0, request.producer_epoch) {
        (id, epoch) if id >= 0 && (0..i16::MAX).contains(&epoch) => (id, epoch + 1),
        _ => (face.producers.allocate(), 0),
    };
    response.with_producer_id(ProducerId(producer_id)).with_producer_epoch(epoch)
}

/// DeleteTopics: deletes each named stream (as `DELETE /streams/NAME`).
async fn delete_topics(face: &KafkaFace, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut names: Vec<TopicName> = request.topic_names;
    names.extend(request.topics.into_iter().filter_map(|topic| topic.name));
    let mut results = Vec::with_capacity(names.len());
    for name in names {
        let mut result = DeletableTopicResult::default().with_name(Some(name.clone()));
        if let Err((code, message)) = super::topics::delete(face, &name.0).await {
            result.error_code = code;
            result.error_message = Some(StrBytes::from_string(message));
        }
        results.push(result);
    }
    DeleteTopicsResponse::default().with_responses(results)
}
