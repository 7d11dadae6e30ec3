//! Streams as Kafka topics: names, and creation and deletion through the
//! admin thread (the one holder of the catalog), exactly as `POST /streams`
//! and `DELETE /streams/NAME` do them.

use crate::admin::{StreamCommand, StreamFailure};
use crate::shard::Shard;
use crate::stream::StreamRoute;

use super::KafkaFace;
use super::codes;

/// The active streams' names, as Metadata lists them.
pub fn stream_names(shard: &Shard) -> Vec<String> {
    shard.stream_names()
}

/// The Kafka error for a refused stream change.
fn refusal(failure: StreamFailure) -> (i16, String) {
    let code = match failure.status {
        409 => codes::TOPIC_ALREADY_EXISTS,
        404 => codes::UNKNOWN_TOPIC_OR_PARTITION,
        400 => codes::INVALID_TOPIC_EXCEPTION,
        507 => codes::KAFKA_STORAGE_ERROR,
        _ => codes::POLICY_VIOLATION,
    };
    (code, failure.message.trim_end().to_string())
}

/// Creates stream `name` with `partitions`; once this returns `Ok`, every
/// shard has it active.
pub async fn create(face: &KafkaFace, name: &str, partitions: u32) -> Result<(), (i16, String)> {
    let (reply, answer) = flume::bounded(1);
    let command = StreamCommand::Create { name: name.to_string(), partitions, reply };
    ask(face, command, answer).await
}

/// Deletes stream `name`.
pub async fn delete(face: &KafkaFace, name: &str) -> Result<(), (i16, String)> {
    let (reply, answer) = flume::bounded(1);
    ask(face, StreamCommand::Delete { name: name.to_string(), reply }, answer).await
}

async fn ask(
    face: &KafkaFace,
    command: StreamCommand,
    answer: flume::Receiver<Result<(), StreamFailure>>,
) -> Result<(), (i16, String)> {
    let unavailable = || (codes::UNKNOWN_SERVER_ERROR, "the admin thread is not running".to_string());
    face.stream_commands.send_async(command).await.map_err(|_| unavailable())?;
    match answer.recv_async().await {
        Ok(result) => result.map_err(refusal),
        Err(_) => Err(unavailable()),
    }
}

/// Creates an unknown stream a client names, when `--kafka-auto-create` is
/// on; its route once it exists (a racing creator's is as good).
pub async fn auto_create(shard: &Shard, face: &KafkaFace, name: &str) -> Option<StreamRoute> {
    let partitions = face.auto_create_partitions?;
    let _ = create(face, name, partitions).await;
    shard.route_for(name.as_bytes())
}
