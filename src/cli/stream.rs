//! `spate stream create|list|delete`: the admin port's `/streams` endpoints
//! from the command line. The server's answer (JSON) goes to stdout; an
//! error status goes to stderr with the server's message and exits 1.

use std::time::Duration;

/// How long one admin request may take (a create opens files on every shard).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// `spate stream` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamArgs {
    /// Admin address of the server.
    #[arg(long, default_value = "127.0.0.1:9402", global = true)]
    pub admin: String,
    #[command(subcommand)]
    pub action: StreamAction,
}

/// What to do with streams.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum StreamAction {
    /// Create a stream: `spate stream create clicks --partitions 8`.
    Create {
        /// `[a-z0-9._-]{1,64}`.
        name: String,
        /// Partition count (fixed for the stream's life).
        #[arg(long, default_value_t = 8)]
        partitions: u32,
        /// Bytes kept per partition (default: the server's --retention-bytes).
        #[arg(long)]
        retention_bytes: Option<u64>,
        /// Age in milliseconds after which whole segments are deleted
        /// (default: the server's --retention-ms).
        #[arg(long)]
        retention_ms: Option<u64>,
        /// How line, JSON and ILP keys map to partitions: `xxh3` (default)
        /// or `murmur2` (as the Java Kafka client and kafka-python).
        #[arg(long, value_parser = ["xxh3", "murmur2"])]
        partitioner: Option<String>,
    },
    /// List streams with their partitions, bytes, events and next offsets.
    List,
    /// Delete a stream and its files.
    Delete { name: String },
}

/// Runs one `spate stream` command; the error is the server's message.
pub fn run_stream(args: &StreamArgs) -> Result<(), String> {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(REQUEST_TIMEOUT)).http_status_as_error(false).build().into();
    let base = format!("http://{}/streams", args.admin);
    let response = match &args.action {
        StreamAction::Create { name, partitions, retention_bytes, retention_ms, partitioner } => {
            let mut body = serde_json::json!({ "name": name, "partitions": partitions });
            if let Some(bytes) = retention_bytes {
                body["retention_bytes"] = (*bytes).into();
            }
            if let Some(ms) = retention_ms {
                body["retention_ms"] = (*ms).into();
            }
            if let Some(partitioner) = partitioner {
                body["partitioner"] = partitioner.as_str().into();
            }
            agent.post(&base).header("content-type", "application/json").send(body.to_string().as_bytes())
        }
        StreamAction::List => agent.get(&base).call(),
        StreamAction::Delete { name } => agent.delete(&format!("{base}/{name}")).call(),
    };
    let mut response = response.map_err(|error| format!("{base}: {error}"))?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().map_err(|error| format!("{base}: reading the answer: {error}"))?;
    if (200..300).contains(&status) {
        println!("{}", text.trim_end());
        Ok(())
    } else {
        Err(format!("{status}: {}", text.trim_end()))
    }
}
