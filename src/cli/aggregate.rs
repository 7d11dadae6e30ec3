//! `spate aggregate create|list|delete|get|top`: the admin port's aggregate
//! endpoints from the command line. The server's answer (JSON) goes to
//! stdout; an error status goes to stderr with the server's message and
//! exits 1.

use std::time::Duration;

/// How long one admin request may take (a declaration waits for a
/// checkpoint on every shard).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// `spate aggregate` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct AggregateArgs {
    /// Admin address of the server.
    #[arg(long, default_value = "127.0.0.1:9402", global = true)]
    pub admin: String,
    #[command(subcommand)]
    pub action: AggregateAction,
}

/// What to do with aggregates.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum AggregateAction {
    /// Declare an aggregate on a stream:
    /// `spate aggregate create clicks --name per-user --kind count --window tumbling:60000 --output clicks-per-minute`.
    Create {
        /// The input stream.
        stream: String,
        /// `[a-z0-9._-]{1,64}`, unique across streams.
        #[arg(long)]
        name: String,
        /// count, sum, min, max, avg, last or distinct-estimate.
        #[arg(long)]
        kind: String,
        /// Where the value comes from: json:<pointer>, ilp:<field>, number
        /// (the payload is a number) or payload (distinct-estimate only).
        #[arg(long)]
        value: Option<String>,
        /// none, tumbling:<size_ms> or hopping:<size_ms>:<step_ms>.
        #[arg(long, default_value = "none")]
        window: String,
        /// Event time: arrival (default), json:<pointer> or ilp.
        #[arg(long)]
        time: Option<String>,
        /// How far behind the largest event time an event may be and still count.
        #[arg(long)]
        allowed_lateness_ms: Option<u64>,
        /// The stream closed windows are appended to (required when windowed).
        #[arg(long)]
        output: Option<String>,
    },
    /// List a stream's aggregates with their keys, memory and counters.
    List { stream: String },
    /// Delete an aggregate and its state.
    Delete { stream: String, name: String },
    /// One key's open windows and last closed window.
    Get { name: String, key: String },
    /// The N keys with the largest value, merged across shards.
    Top {
        name: String,
        #[arg(long, default_value_t = 10)]
        n: usize,
    },
}

/// The window flag as declaration JSON.
fn window_json(text: &str) -> Result<serde_json::Value, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let number = |text: &str| text.parse::<u64>().map_err(|_| format!("--window {text:?}: not a number of ms"));
    match parts.as_slice() {
        ["none"] => Ok(serde_json::json!({"type": "none"})),
        ["tumbling", size] => Ok(serde_json::json!({"type": "tumbling", "size_ms": number(size)?})),
        ["hopping" | "sliding", size, step] => {
            Ok(serde_json::json!({"type": "hopping", "size_ms": number(size)?, "step_ms": number(step)?}))
        }
        _ => Err(format!("--window {text:?}: expected none, tumbling:<size_ms> or hopping:<size_ms>:<step_ms>")),
    }
}

/// Percent-encodes a query value.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Runs one `spate aggregate` command; the error is the server's message.
pub fn run_aggregate(args: &AggregateArgs) -> Result<(), String> {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(REQUEST_TIMEOUT)).http_status_as_error(false).build().into();
    let base = format!("http://{}", args.admin);
    let (url, response) = match &args.action {
        AggregateAction::Create { stream, name, kind, value, window, time, allowed_lateness_ms, output } => {
            let mut body = serde_json::json!({ "name": name, "kind": kind, "window": window_json(window)? });
            for (field, text) in [("value", value), ("time", time), ("output", output)] {
                if let Some(text) = text {
                    body[field] = text.clone().into();
                }
            }
            if let Some(ms) = allowed_lateness_ms {
                body["allowed_lateness_ms"] = (*ms).into();
            }
            let url = format!("{base}/streams/{stream}/aggregates");
            let response =
                agent.post(&url).header("content-type", "application/json").send(body.to_string().as_bytes());
            (url, response)
        }
        AggregateAction::List { stream } => {
            let url = format!("{base}/streams/{stream}/aggregates");
            let response = agent.get(&url).call();
            (url, response)
        }
        AggregateAction::Delete { stream, name } => {
            let url = format!("{base}/streams/{stream}/aggregates/{name}");
            let response = agent.delete(&url).call();
            (url, response)
        }
        AggregateAction::Get { name, key } => {
            let url = format!("{base}/aggregates/{name}?key={}", encode(key));
            let response = agent.get(&url).call();
            (url, response)
        }
        AggregateAction::Top { name, n } => {
            let url = format!("{base}/aggregates/{name}/top?n={n}");
            let response = agent.get(&url).call();
            (url, response)
        }
    };
    let mut response = response.map_err(|error| format!("{url}: {error}"))?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().map_err(|error| format!("{url}: reading the answer: {error}"))?;
    if (200..300).contains(&status) {
        println!("{}", text.trim_end());
        Ok(())
    } else {
        Err(format!("{status}: {}", text.trim_end()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Window flags become the declaration's window objects; bad ones are refused with the flag.
    #[test]
    fn window_flags() {
        assert_eq!(window_json("tumbling:1000").unwrap(), serde_json::json!({"type": "tumbling", "size_ms": 1000}));
        assert_eq!(window_json("hopping:60:10").unwrap()["step_ms"], 10);
        assert!(window_json("tumbling:x").unwrap_err().contains("--window"));
        assert!(window_json("weekly").is_err());
        assert_eq!(encode("a b&c"), "a%20b%26c");
    }
}
