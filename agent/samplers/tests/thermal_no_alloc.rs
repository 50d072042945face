//! The thermal steady state makes no heap allocation, proved with a counting global allocator:
//! parsing a tegrastats line, updating throttle and energy state, polling sysfs, and emitting
//! throttle events, counters and raw samples into a sink that encodes into a reused buffer; and
//! reading lines from a replay and from a real child process.
//!
//! Counts are per thread, so the test harness's own threads cannot disturb them; each test runs
//! its runtime on its own thread.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::hint::black_box;

use edgewatch_proto::v1::{Event, ModelVersion, Tier, event::Kind};
use edgewatch_samplers::thermal::config::RawThermalConfig;
use edgewatch_samplers::thermal::{SysfsReader, TegrastatsEvent, TegrastatsSource, ThermalSampler};
use edgewatch_samplers::{EventSink, Now};
use edgewatch_test_kit::alloc::CountingAllocator;
use prost::Message;

#[path = "thermal/fake_sysfs.rs"]
#[allow(dead_code)]
mod fake_sysfs;
use fake_sysfs::RootedConfig;
#[path = "thermal/util.rs"]
#[allow(dead_code)]
mod util;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// A sink like the agent's: encodes each event into one reused buffer.
struct EncodingSink {
    buf: Vec<u8>,
    events: [u64; 4],
    throttle_events: u64,
    raw_samples: u64,
    counters: u64,
}

impl EncodingSink {
    fn new() -> Self {
        Self {
            buf: Vec::with_capacity(64 * 1024),
            events: [0; 4],
            throttle_events: 0,
            raw_samples: 0,
            counters: 0,
        }
    }
}

impl EventSink for EncodingSink {
    fn emit(&mut self, tier: Tier, event: &Event) {
        self.buf.clear();
        event.encode(&mut self.buf).unwrap();
        self.events[tier as usize] += 1;
        match event.kind {
            Some(Kind::ThrottleStarted(_) | Kind::ThrottleEnded(_)) => self.throttle_events += 1,
            Some(Kind::ThermalSample(_)) => self.raw_samples += 1,
            Some(Kind::ThrottleCounters(_) | Kind::EnergyCounters(_)) => self.counters += 1,
            _ => {}
        }
    }
}

fn at(second: u64) -> Now {
    Now {
        wall_unix_ns: 1_760_000_000_000_000_000 + (second * 1_000_000_000) as i64,
        monotonic_ns: 7_000_000_000 + second * 1_000_000_000,
    }
}

#[test]
fn the_counting_allocator_sees_an_allocation() {
    let (n, _) = ALLOCATOR.allocations_during(|| black_box(vec![1u8; 16]));
    assert_eq!(n, 1);
}

#[test]
fn a_line_a_sysfs_poll_and_their_events_allocate_nothing_after_warm_up() {
    // AGX Orin JetPack 6 lines of two shapes: eight zones with gpu@, five without.
    let lines: Vec<String> = [
        "orin-agx-64gb_jp6.x_l4t-r36.txt",
        "orin-agx-64gb_jp6.2.1_l4t-r36.4.4.txt",
    ]
    .iter()
    .flat_map(|file| {
        std::fs::read_to_string(util::capture(file))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    })
    .collect();
    assert_eq!(lines.len(), 6);

    let fake = fake_sysfs::FakeSysfs::orin().unwrap();
    // A 48 °C passive trip on the cpu zone: the lines' cpu@47.7..52.6C cross it both ways
    // every cycle, so throttle episodes start and end in the measured stretch too.
    fake.write(
        "sys/devices/virtual/thermal/thermal_zone0/trip_point_0_temp",
        "48000\n",
    )
    .unwrap();
    let config = fake.config(RawThermalConfig {
        debug_sample_every: 5,
        trip_hysteresis_celsius: 0.0,
        ..RawThermalConfig::default()
    });
    let mut reader = SysfsReader::open(&config.sysfs).unwrap();
    let model = ModelVersion {
        name: "haul-perception".into(),
        version: "4.2.1".into(),
        ..ModelVersion::default()
    };
    let mut sampler = ThermalSampler::new(&config, reader.inventory(), at(0), Some(&model));
    let mut sink = EncodingSink::new();

    let mut step = |second: u64, sink: &mut EncodingSink| {
        let line = &lines[second as usize % lines.len()];
        let sample = tegrastats_parser::parse_line(line).unwrap();
        let event = TegrastatsEvent::Sample {
            sample,
            at: at(second),
        };
        sampler.on_tegrastats(&event, Some(&model), sink);
        sampler.on_sysfs(reader.read(), at(second), Some(&model), sink);
    };

    for second in 0..60 {
        step(second, &mut sink);
    }
    let (throttle, raw, counters) = (sink.throttle_events, sink.raw_samples, sink.counters);
    let (n, ()) = ALLOCATOR.allocations_during(|| {
        for second in 60..300 {
            step(second, &mut sink);
        }
    });
    assert_eq!(n, 0, "the steady state allocated {n} times");
    // The measured stretch did emit every kind of event, not just update state.
    assert!(sink.throttle_events > throttle);
    assert!(sink.raw_samples >= raw + 240 / 5);
    assert_eq!(sink.counters, counters + 2 * 24);
}

#[test]
fn reading_a_replay_allocates_nothing_after_warm_up() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = RawThermalConfig {
        replay: Some(util::capture("thor_jp7.1_l4t-r38.4.txt")),
        replay_speed: 1e6,
        replay_loop: true,
        ..RawThermalConfig::default()
    }
    .validate()
    .unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    // One block_on, as the agent's whole life is one: the runtime's deferred-waker list lives
    // in it, and grows the first time the task exhausts tokio's cooperative budget (128 polls).
    let (n, rails) = runtime.block_on(async {
        let mut rails = 0;
        for _ in 0..300 {
            if let TegrastatsEvent::Sample { sample, .. } = source.next().await {
                rails += sample.rails().len();
            }
        }
        let before = ALLOCATOR.allocations_on_this_thread();
        for _ in 0..300 {
            if let TegrastatsEvent::Sample { sample, .. } = source.next().await {
                rails += sample.rails().len();
            }
        }
        (ALLOCATOR.allocations_on_this_thread() - before, rails)
    });
    assert_eq!(n, 0, "reading the replay allocated {n} times");
    assert!(rails >= 3 * 400, "{rails} rails read");
}

#[test]
fn reading_a_childs_lines_allocates_nothing_after_warm_up() {
    use std::os::unix::fs::PermissionsExt;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("tegrastats");
    let capture = util::capture("orin-agx-64gb_jp6.x_l4t-r36.txt");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\ni=0\nwhile [ $i -lt 200 ]; do cat '{}'; i=$((i+1)); done\nexec sleep 30\n",
            capture.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = RawThermalConfig {
        tegrastats: program,
        ..RawThermalConfig::default()
    }
    .validate()
    .unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    // One block_on for warm-up and measurement, as for the replay.
    let n = runtime.block_on(async {
        let mut samples = 0;
        let mut before = 0;
        while samples < 700 {
            if samples == 300 {
                before = ALLOCATOR.allocations_on_this_thread();
            }
            match source.next().await {
                TegrastatsEvent::Sample { sample, .. } => {
                    black_box(sample.rails().len());
                    samples += 1;
                }
                TegrastatsEvent::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        ALLOCATOR.allocations_on_this_thread() - before
    });
    assert_eq!(n, 0, "reading the child's lines allocated {n} times");
    runtime.block_on(source.shutdown());
}
