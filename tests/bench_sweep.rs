//! `spate bench --sweep` end to end: the real binary starts a real server,
//! runs two short open-loop points, and writes the sweep JSON; and, when
//! nats-server is installed, the same against NATS, then `--compare`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("spate-bench-sweep-{}-{name}", std::process::id()))
}

/// Runs `spate bench <args>`, failing the test with its output if it fails.
fn bench(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_spate")).arg("bench").args(args).output().expect("run spate bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "spate bench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the JSON was written")).expect("valid JSON")
}

/// Every point of a sweep sent events, and the subscriber timed them all.
fn assert_points_complete(sweep: &serde_json::Value, rates: &[f64]) {
    let points = sweep["points"].as_array().expect("points");
    assert_eq!(points.len(), rates.len(), "{sweep}");
    for (point, rate) in points.iter().zip(rates) {
        assert_eq!(point["rate_offered_per_s"].as_f64(), Some(*rate));
        let sent = point["events_sent"].as_u64().unwrap();
        assert!(sent as f64 >= rate * 0.9, "{rate}/s for 1.3 s sent only {sent}");
        assert_eq!(point["events_missing"], 0, "point {rate}: {point}");
        let timed = point["latency_us"]["count"].as_u64().unwrap();
        assert!(timed > 0 && timed < sent, "the warm-up is not timed: {timed} of {sent}");
        assert!(point["server_cpu_us_per_event"].as_f64().unwrap() > 0.0, "server CPU measured: {point}");
        assert!(point["latency_us"]["p99"].as_f64().unwrap() > 0.0);
    }
}

/// A two-point sweep against a started spate writes both points, each
/// with events, latency and server CPU, and none missing.
#[test]
fn sweep_against_spate_writes_every_point() {
    let json = temp_path("spate.json");
    let plots = temp_path("spate-plots");
    let table = bench(&[
        "--start-server",
        "--sweep",
        "20000,50000",
        "--duration-s",
        "1",
        "--warmup-s",
        "0.3",
        "--json",
        json.to_str().unwrap(),
        "--plot-dir",
        plots.to_str().unwrap(),
    ]);
    assert!(table.contains("sweep: spate"), "{table}");
    let sweep = read_json(&json);
    assert_eq!(sweep["target"], "spate");
    assert_points_complete(&sweep, &[20000.0, 50000.0]);
    assert!(plots.join("latency-vs-rate.svg").exists());
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_dir_all(&plots);
}

/// nats-server on a free port, killed on drop.
struct Nats(Child);

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_nats() -> Option<(Nats, String)> {
    let port = TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let child = Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let nats = Nats(child);
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((nats, addr))
}

/// The same sweep drives NATS core through the same generator (the pid of
/// the server found from its listening socket), and `--compare` lines the
/// two sweeps up. Skipped, saying so, where nats-server is not installed
/// (scripts/bench-peers/install.sh installs it).
#[test]
fn sweep_against_nats_and_compare() {
    let Some((_nats, addr)) = start_nats() else {
        eprintln!("SKIPPED: nats-server is not installed");
        return;
    };
    let nats_json = temp_path("nats.json");
    bench(&[
        "--target",
        "nats",
        "--nats",
        &addr,
        "--sweep",
        "20000",
        "--duration-s",
        "1",
        "--warmup-s",
        "0.3",
        "--json",
        nats_json.to_str().unwrap(),
    ]);
    let sweep = read_json(&nats_json);
    assert_eq!(sweep["target"], "nats");
    assert!(sweep["server"].as_str().unwrap().starts_with("nats-server 2."), "{}", sweep["server"]);
    assert_points_complete(&sweep, &[20000.0]);
    let other = temp_path("other.json");
    std::fs::write(
        &other,
        serde_json::to_string(&serde_json::json!({
            "label": "other", "target": "spate", "server": "x", "points": sweep["points"],
        }))
        .unwrap(),
    )
    .unwrap();
    let compare_json = temp_path("compare.json");
    let table = bench(&[
        "--compare",
        &format!("{},{}", other.display(), nats_json.display()),
        "--json",
        compare_json.to_str().unwrap(),
    ]);
    assert!(table.contains("1.00x"), "the same sweep twice has a p99 ratio of 1:\n{table}");
    assert_eq!(read_json(&compare_json)["rows"].as_array().unwrap().len(), 1);
    for path in [nats_json, other, compare_json] {
        let _ = std::fs::remove_file(path);
    }
}
