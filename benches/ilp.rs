//! The InfluxDB line protocol parser, in ns/line, next to the line format's
//! `parse_line` over lines of the same size (the baseline ratio).
//!
//! Corpora, 1000 lines of ~100 bytes each (`cpu,<3 tags> <4 fields> <ts>`):
//!
//! * `sorted`: tags already in key order and no escapes, as most clients
//!   send: the series key borrows the line's prefix.
//! * `unsorted`: the same tags in reverse order: sort and write the key.
//! * `escaped`: a space and a comma escaped in tag values: unescape, sort,
//!   re-escape.
//!
//! Benches: `parse` (parse_ilp_line: validation of everything + series
//! key), `parse_and_sum_fields` (plus iterating the fields and summing the
//! floats, what an aggregate would do), and `baseline_parse_line`. A summary
//! after criterion's report times each again (fastest of 20 windows of 50 ms)
//! and prints ns/line, lines/s, the ratio to the baseline and heap
//! allocations per line (counting allocator). Run:
//! `nice -n 10 cargo bench --bench ilp`. `ILP_BENCH_ONLY` (see `only_one`)
//! runs one bench alone for `valgrind --tool=callgrind`, whose instruction
//! counts per line are repeatable on a shared machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use spate::protocol::ilp::{FieldValue, IlpLine, IlpScratch, parse_ilp_line};

/// Counts allocations, so the summary can show that parsing allocates
/// nothing per line once the scratch buffers have grown.
struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Lines per iteration.
const LINE_COUNT: usize = 1000;

fn corpus(kind: &str) -> Vec<Vec<u8>> {
    let mut state = 0x1A2B_u64;
    (0..LINE_COUNT)
        .map(|index| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let host = (state >> 40) % 500;
            let tags = match kind {
                "sorted" => format!("dc=fra1,host=server-{host},region=eu-west"),
                "unsorted" => format!("region=eu-west,host=server-{host},dc=fra1"),
                _ => format!(r"region=eu\ west,host=server\,{host},dc=fra1"),
            };
            format!(
                "cpu,{tags} usage_user={}.{},usage_system=3.25,requests={}i,ok=t {}",
                state % 100,
                (state >> 8) % 100,
                (state >> 16) % 10_000,
                1_700_000_000_000_000_000u64 + index as u64
            )
            .into_bytes()
        })
        .collect()
}

fn parse_all(lines: &[Vec<u8>], scratch: &mut IlpScratch) -> usize {
    let mut total = 0;
    for line in lines {
        if let Ok(IlpLine::Point(point)) = parse_ilp_line(black_box(line), scratch) {
            total += point.series_key().len();
        }
    }
    total
}

fn parse_and_sum_fields(lines: &[Vec<u8>], scratch: &mut IlpScratch) -> f64 {
    let mut sum = 0.0;
    for line in lines {
        if let Ok(IlpLine::Point(point)) = parse_ilp_line(black_box(line), scratch) {
            for (_, value) in point.fields() {
                if let FieldValue::Float(value) = value {
                    sum += value;
                }
            }
        }
    }
    sum
}

fn baseline(lines: &[Vec<u8>]) -> usize {
    let mut total = 0;
    for line in lines {
        if let Ok(spate::protocol::Line::Event { key, .. }) = spate::protocol::parse_line(black_box(line), 1 << 20) {
            total += key.len();
        }
    }
    total
}

type Run = fn(&[Vec<u8>], &mut IlpScratch) -> f64;

fn runs() -> [(&'static str, Run); 3] {
    [
        ("baseline_parse_line", |lines, _| baseline(lines) as f64),
        ("parse", |lines, scratch| parse_all(lines, scratch) as f64),
        ("parse_and_sum_fields", parse_and_sum_fields),
    ]
}

fn bench(criterion: &mut Criterion) {
    for kind in ["sorted", "unsorted", "escaped"] {
        let lines = corpus(kind);
        let mut scratch = IlpScratch::default();
        assert_eq!(lines.iter().filter(|line| parse_ilp_line(line, &mut scratch).is_ok()).count(), LINE_COUNT);
        let mut group = criterion.benchmark_group(format!("ilp {kind}"));
        group.throughput(Throughput::Elements(LINE_COUNT as u64));
        group.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(30);
        for (name, run) in runs() {
            group.bench_function(name, |bencher| bencher.iter(|| run(&lines, &mut scratch)));
        }
        group.finish();
    }
}

fn summary() {
    println!("\n## ILP parsing, {LINE_COUNT} lines per corpus");
    println!("\n| corpus | bench | bytes/line | ns/line | lines/s | x baseline | allocs/line |");
    println!("|---|---|---|---|---|---|---|");
    for kind in ["sorted", "unsorted", "escaped"] {
        let lines = corpus(kind);
        let bytes_per_line = lines.iter().map(Vec::len).sum::<usize>() / LINE_COUNT;
        let mut scratch = IlpScratch::default();
        let mut baseline_ns = 0.0;
        for (name, run) in runs() {
            run(&lines, &mut scratch);
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            run(&lines, &mut scratch);
            let allocations = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / LINE_COUNT as f64;
            // The fastest of 20 windows of 50 ms: on a shared machine the
            // minimum is the least disturbed measurement.
            let mut ns_per_line = f64::MAX;
            for _ in 0..20 {
                let (started, mut passes) = (Instant::now(), 0u64);
                while started.elapsed() < Duration::from_millis(50) {
                    black_box(run(&lines, &mut scratch));
                    passes += 1;
                }
                let window = started.elapsed().as_nanos() as f64 / (passes as f64 * LINE_COUNT as f64);
                ns_per_line = ns_per_line.min(window);
            }
            if name == "baseline_parse_line" {
                baseline_ns = ns_per_line;
            }
            println!(
                "| {kind} | {name} | {bytes_per_line} | {ns_per_line:.0} | {:.2} M | {:.1} | {allocations:.1} |",
                1e3 / ns_per_line,
                ns_per_line / baseline_ns
            );
        }
    }
}

/// `ILP_BENCH_ONLY=<bench> ILP_BENCH_PASSES=<n>`: run one bench `n` times
/// over each corpus and nothing else, for `valgrind --tool=callgrind`
/// (instructions per line are repeatable on a shared machine; time is not).
fn only_one(name: &str, passes: usize) {
    let (_, run) = runs().into_iter().find(|(bench, _)| *bench == name).expect("bench name");
    for kind in ["sorted", "unsorted", "escaped"] {
        let lines = corpus(kind);
        let mut scratch = IlpScratch::default();
        let mut total = 0.0;
        for _ in 0..passes {
            total += run(&lines, &mut scratch);
        }
        println!("{name} {kind}: {passes} passes, {total}");
    }
}

fn main() {
    if let Ok(name) = std::env::var("ILP_BENCH_ONLY") {
        let passes = std::env::var("ILP_BENCH_PASSES").ok().and_then(|text| text.parse().ok()).unwrap_or(10);
        return only_one(&name, passes);
    }
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
    // `cargo test --benches` runs this binary without `--bench`: skip the timed summary.
    if std::env::args().any(|argument| argument == "--bench") {
        summary();
    }
}
