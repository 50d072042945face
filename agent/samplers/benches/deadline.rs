//! CPU cost of the deadline sampler: the sampler thread's own CPU time per second
//! (`getrusage(RUSAGE_THREAD)`) while it samples two 1 kHz loops, against a baseline measured in
//! the same run (the same thread polling a sampler with no probes, with the loops still
//! running). Phases alternate in rounds so that machine load hits them alike.
//!
//! `cargo bench -p edgewatch-samplers --bench deadline`
//! (`DEADLINE_BENCH_SECONDS` per phase, default 4; `DEADLINE_BENCH_ROUNDS`, default 3).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use edgewatch_proto::v1::{Event, Tier};
use edgewatch_samplers::deadline::{
    DeadlineConfig, DeadlineSampler, RawDeadlineConfig, RawProbeConfig,
};
use edgewatch_samplers::{EventSink, Now};
use loop_probe::{AutonomyMode, Cycle, ProbeWriter, WriterConfig};
use prost::Message;

/// Encodes each event into a reused buffer: about what the agent's queue does before writing.
struct EncodingSink {
    buf: Vec<u8>,
    events: u64,
}

impl EventSink for EncodingSink {
    fn emit(&mut self, _tier: Tier, event: &Event) {
        self.buf.clear();
        let _ = event.encode(&mut self.buf);
        self.events += 1;
    }
}

fn now() -> Now {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    Now {
        wall_unix_ns: wall.as_nanos() as i64,
        monotonic_ns: loop_probe::clock::monotonic_ns(),
    }
}

fn thread_cpu_ns() -> u64 {
    // SAFETY: an all-zero rusage is valid; getrusage writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A 1 kHz loop on its own thread: sleeps to each absolute release, records a cycle.
fn spawn_loop(
    path: std::path::PathBuf,
    id: u32,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut w = ProbeWriter::create(
            &path,
            &WriterConfig::new(id, &format!("loop{id}"), 1_000_000, 800_000),
        )
        .unwrap();
        w.handle().set_model_version(0x42, "bench-1.0").unwrap();
        w.handle()
            .set_autonomy(AutonomyMode::Autonomous, loop_probe::clock::monotonic_ns())
            .unwrap();
        let t0 = loop_probe::clock::monotonic_ns();
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let release = t0 + k * 1_000_000;
            let now = loop_probe::clock::monotonic_ns();
            if release > now {
                std::thread::sleep(Duration::from_nanos(release - now));
            }
            let start = loop_probe::clock::monotonic_ns();
            let duration = if k.is_multiple_of(1000) {
                900_000
            } else {
                50_000
            };
            w.record(&Cycle {
                cycle: k,
                release_ns: release,
                start_ns: start,
                duration_ns: duration,
                flags: 0,
            });
            k += 1;
        }
        k
    })
}

fn config(probes: Vec<RawProbeConfig>, poll_hz: f64) -> DeadlineConfig {
    let d = RawDeadlineConfig {
        poll_hz: Some(poll_hz),
        ..RawDeadlineConfig::default()
    };
    DeadlineConfig::from_raw(&d, &probes).unwrap()
}

/// Runs `sampler` on this thread for `seconds`, polling at its interval; returns CPU ns per
/// wall second, one sample per second.
fn measure(sampler: &mut DeadlineSampler, sink: &mut EncodingSink, seconds: u64) -> Vec<f64> {
    let interval = sampler.poll_interval();
    let mut out = Vec::new();
    let mut next = Instant::now();
    for _ in 0..seconds {
        let (cpu0, wall0) = (thread_cpu_ns(), Instant::now());
        let end = wall0 + Duration::from_secs(1);
        while Instant::now() < end {
            sampler.poll(now(), None, sink);
            next += interval;
            let n = Instant::now();
            if next > n {
                std::thread::sleep(next - n);
            } else {
                next = n;
            }
        }
        let cpu = thread_cpu_ns() - cpu0;
        out.push(cpu as f64 / wall0.elapsed().as_secs_f64());
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let seconds: u64 = std::env::var("DEADLINE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let rounds: u64 = std::env::var("DEADLINE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::Builder::new()
        .prefix("deadline-bench")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let paths: Vec<_> = (1..=2)
        .map(|i| dir.path().join(format!("loop{i}.probe")))
        .collect();
    let loops: Vec<_> = paths
        .iter()
        .zip(1..)
        .map(|(p, i)| spawn_loop(p.clone(), i, stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_millis(300));

    let probes = || {
        paths
            .iter()
            .map(|p| RawProbeConfig {
                path: Some(p.clone()),
                ..RawProbeConfig::default()
            })
            .collect::<Vec<_>>()
    };
    let mut sink = EncodingSink {
        buf: Vec::with_capacity(4096),
        events: 0,
    };
    let mut baseline = DeadlineSampler::new(config(Vec::new(), 10.0), now());
    let mut at_10hz = DeadlineSampler::new(config(probes(), 10.0), now());
    let mut at_100hz = DeadlineSampler::new(config(probes(), 100.0), now());
    let (mut b, mut s10, mut s100) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        b.extend(measure(&mut baseline, &mut sink, seconds));
        s10.extend(measure(&mut at_10hz, &mut sink, seconds));
        s100.extend(measure(&mut at_100hz, &mut sink, seconds));
    }
    stop.store(true, Ordering::Relaxed);
    let cycles: Vec<u64> = loops.into_iter().map(|h| h.join().unwrap()).collect();
    let cycles_seen: u64 = at_10hz.status(now()).map(|s| s.counts.cycles).sum();

    println!(
        "deadline sampler: sampler-thread CPU per wall second, medians of {} one-second samples",
        b.len()
    );
    println!("| case | CPU µs per second | % of one core |");
    println!("|---|---:|---:|");
    for (name, v) in [
        ("baseline: sampler with no probes, polled at 10 Hz", &mut b),
        ("two 1 kHz loops, polled at 10 Hz (default)", &mut s10),
        ("two 1 kHz loops, polled at 100 Hz", &mut s100),
    ] {
        let m = median(v);
        println!("| {name} | {:.1} | {:.4} |", m / 1e3, m / 1e7);
    }
    println!(
        "loops recorded {cycles:?} cycles; events emitted {}; the 10 Hz sampler saw {cycles_seen} cycles in total",
        sink.events
    );
}
