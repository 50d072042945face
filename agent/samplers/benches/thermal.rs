//! The thermal sampler's cost per tegrastats line and per sysfs poll, each against a baseline
//! measured in the same run: parsing alone for a line, bare `pread`s of the same files for a
//! poll. Workloads are interleaved in rounds so machine load hits them alike.
//!
//! `cargo bench -p edgewatch-samplers --bench thermal` prints a Markdown table (medians over the
//! rounds). Without `--bench` (as under `cargo test --all-targets`) it runs one short round as a
//! smoke test.

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use edgewatch_proto::v1::{Event, ModelVersion, Tier};
use edgewatch_samplers::thermal::config::RawThermalConfig;
use edgewatch_samplers::thermal::{SysfsReader, TegrastatsEvent, ThermalSampler};
use edgewatch_samplers::{EventSink, Now};
use prost::Message;

#[path = "../tests/thermal/fake_sysfs.rs"]
#[allow(dead_code)]
mod fake_sysfs;
use fake_sysfs::RootedConfig;

/// A sink like the agent's: encodes each event into one reused buffer.
struct EncodingSink {
    buf: Vec<u8>,
    bytes: usize,
}

impl EventSink for EncodingSink {
    fn emit(&mut self, _tier: Tier, event: &Event) {
        self.buf.clear();
        event.encode(&mut self.buf).unwrap();
        self.bytes += self.buf.len();
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, per_round) = if full { (31, 2_000) } else { (1, 20) };

    let data = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tegrastats-parser/tests/data/"
    );
    let lines: Vec<String> = [
        "orin-agx-64gb_jp6.x_l4t-r36.txt",
        "orin-agx-64gb_jp6.2.1_l4t-r36.4.4.txt",
        "orin-nano-8gb_jp6.x_l4t-r36.txt",
        "thor_jp7.1_l4t-r38.4.txt",
    ]
    .iter()
    .flat_map(|f| {
        std::fs::read_to_string(format!("{data}{f}"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    })
    .collect();

    let fake = fake_sysfs::FakeSysfs::orin().unwrap();
    let config = fake.config(RawThermalConfig::default());
    let mut reader = SysfsReader::open(&config.sysfs).unwrap();
    let model = ModelVersion {
        name: "haul-perception".into(),
        version: "4.2.1".into(),
        ..ModelVersion::default()
    };
    let mut clock = Now {
        wall_unix_ns: 1_760_000_000_000_000_000,
        monotonic_ns: 1_000_000_000,
    };
    let mut sampler = ThermalSampler::new(&config, reader.inventory(), clock, Some(&model));
    let mut sink = EncodingSink {
        buf: Vec::with_capacity(64 * 1024),
        bytes: 0,
    };
    // The files one poll reads, opened for the bare-pread baseline.
    let metric_files: Vec<File> = [
        "sys/class/thermal/thermal_zone0/temp",
        "sys/class/thermal/thermal_zone1/temp",
        "sys/class/thermal/thermal_zone2/temp",
        "sys/class/thermal/thermal_zone3/temp",
        "sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq",
        "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq",
        "sys/devices/system/cpu/cpufreq/policy4/scaling_cur_freq",
        "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq",
        "sys/devices/system/cpu/cpufreq/policy8/scaling_cur_freq",
        "sys/devices/system/cpu/cpufreq/policy8/scaling_max_freq",
        "sys/class/devfreq/17000000.gpu/cur_freq",
        "sys/class/devfreq/17000000.gpu/max_freq",
        "sys/class/hwmon/hwmon3/oc1_event_cnt",
        "sys/class/hwmon/hwmon3/oc2_event_cnt",
        "sys/class/hwmon/hwmon3/oc3_event_cnt",
    ]
    .iter()
    .map(|rel| File::open(fake.path(rel)).unwrap())
    .collect();
    assert_eq!(metric_files.len(), reader.status().open_files);

    let mut results: [(&str, Vec<f64>); 4] = [
        ("baseline: `parse_line` alone", Vec::new()),
        ("line: parse + `on_tegrastats` + events", Vec::new()),
        ("baseline: one `pread` per metric file (15)", Vec::new()),
        (
            "poll: `SysfsReader::read` + `on_sysfs` + events",
            Vec::new(),
        ),
    ];
    let mut i = 0usize;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..per_round {
            let sample = tegrastats_parser::parse_line(black_box(&lines[i % lines.len()]));
            black_box(sample.unwrap().rails().len());
            i += 1;
        }
        results[0]
            .1
            .push(start.elapsed().as_nanos() as f64 / per_round as f64);

        let start = Instant::now();
        for _ in 0..per_round {
            clock.monotonic_ns += 1_000_000_000;
            clock.wall_unix_ns += 1_000_000_000;
            let sample = tegrastats_parser::parse_line(black_box(&lines[i % lines.len()]));
            let event = TegrastatsEvent::Sample {
                sample: sample.unwrap(),
                at: clock,
            };
            sampler.on_tegrastats(&event, Some(&model), &mut sink);
            i += 1;
        }
        results[1]
            .1
            .push(start.elapsed().as_nanos() as f64 / per_round as f64);

        let start = Instant::now();
        let mut buf = [0u8; 64];
        for _ in 0..per_round {
            for file in &metric_files {
                black_box(file.read_at(&mut buf, 0).unwrap());
            }
        }
        results[2]
            .1
            .push(start.elapsed().as_nanos() as f64 / per_round as f64);

        let start = Instant::now();
        for _ in 0..per_round {
            clock.monotonic_ns += 1_000_000_000;
            clock.wall_unix_ns += 1_000_000_000;
            sampler.on_sysfs(reader.read(), clock, Some(&model), &mut sink);
        }
        results[3]
            .1
            .push(start.elapsed().as_nanos() as f64 / per_round as f64);
    }

    println!("| workload | ns per operation (median of {rounds} rounds) | vs its baseline |");
    println!("|---|---:|---:|");
    let medians: Vec<f64> = results.iter().map(|(_, v)| median(v.clone())).collect();
    for (k, (name, _)) in results.iter().enumerate() {
        let baseline = medians[k - k % 2];
        println!(
            "| {name} | {:.0} | {:.1}x |",
            medians[k],
            medians[k] / baseline
        );
    }
    let per_second = Duration::from_nanos((medians[1] + medians[3]) as u64);
    println!(
        "\nOne line and one poll per second: {per_second:?} of CPU per second ({:.4} % of a core); {} bytes of events encoded.",
        per_second.as_secs_f64() * 100.0,
        sink.bytes
    );
}
