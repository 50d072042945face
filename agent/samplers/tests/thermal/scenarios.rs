//! End-to-end scenarios: real captures replayed and fake sysfs trees read by the real reader,
//! fed to the sampler, checked against the events and counters they must produce.
//!
//! No capture crosses a real trip point (the hottest, an Orin NX 8GB under load, prints
//! `cpu@65.562C`), so the trip scenario gives the fake tree a 65 °C passive trip and replays
//! that line over it.

use edgewatch_proto::v1::{Component, ThrottleCause, Tier};
use edgewatch_samplers::thermal::config::RawThermalConfig;
use edgewatch_samplers::thermal::{
    SysfsReader, TegrastatsEvent, TegrastatsSource, ThermalSampler, clock,
};
use edgewatch_samplers::{CollectingSink, Now};

use crate::fake_sysfs::{FakeSysfs, RootedConfig};
use crate::util::{
    assert_close, capture, energy, joules, later, over_currents, throttle_counters, throttles,
};

fn t0() -> Now {
    Now {
        wall_unix_ns: 1_760_000_000_000_000_000,
        monotonic_ns: 50_000_000_000,
    }
}

/// (tier, started?, component, cause, source) of each throttle event.
fn summary(sink: &CollectingSink) -> Vec<(Tier, bool, Component, ThrottleCause, String)> {
    throttles(&sink.events)
        .into_iter()
        .map(|(tier, started, t)| {
            (
                tier,
                started,
                Component::try_from(t.component).unwrap(),
                ThrottleCause::try_from(t.cause).unwrap(),
                t.source,
            )
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_replayed_line_over_a_passive_trip_is_an_slo_episode_and_a_critical_reading_a_safety_one()
{
    let fake = FakeSysfs::orin().unwrap();
    let config = fake.config(RawThermalConfig {
        replay: Some(capture("orin-nx-8gb_jp6.x_l4t-r36.txt")),
        replay_speed: 1000.0,
        ..RawThermalConfig::default()
    });
    let mut reader = SysfsReader::open(&config.sysfs).unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    let start = clock::now();
    let mut sampler = ThermalSampler::new(&config, reader.inventory(), start, None);
    let mut sink = CollectingSink::default();
    sampler.on_sysfs(reader.read(), start, None, &mut sink);
    assert!(summary(&sink).is_empty(), "50 °C everywhere is quiet");

    // `cv0@63.031C cpu@65.562C ... gpu@63.5C tj@65.562C`: over the cpu zone's 65 °C passive
    // trip, under the tj zone's 70 °C and the gpu zone's 95.5 °C.
    let event = source.next().await;
    let TegrastatsEvent::Sample { at: t, .. } = &event else {
        panic!("the capture's line did not parse")
    };
    let t = *t;
    sampler.on_tegrastats(&event, None, &mut sink);
    let started = throttles(&sink.events);
    assert_eq!(started.len(), 1);
    let (tier, is_start, throttle) = &started[0];
    assert_eq!((*tier, *is_start), (Tier::Slo, true));
    assert_eq!(throttle.component, Component::Cpu as i32);
    assert_eq!(throttle.cause, ThrottleCause::PassiveTrip as i32);
    assert_eq!(throttle.source, "cpu-thermal");
    assert!((throttle.celsius.unwrap() - 65.562).abs() < 1e-3);
    assert_eq!(throttle.trip_celsius, Some(65.0));

    // Cooling: 64 °C is inside the 2 °C hysteresis band, 62.9 °C is below it.
    fake.set_temp(0, 64_000).unwrap();
    sampler.on_sysfs(reader.read(), later(t, 1.0), None, &mut sink);
    assert_eq!(throttles(&sink.events).len(), 1, "no flap inside the band");
    fake.set_temp(0, 62_900).unwrap();
    sampler.on_sysfs(reader.read(), later(t, 2.0), None, &mut sink);
    // Then a critical reading, and back to normal.
    fake.set_temp(0, 105_500).unwrap();
    sampler.on_sysfs(reader.read(), later(t, 3.0), None, &mut sink);
    fake.set_temp(0, 40_000).unwrap();
    sampler.on_sysfs(reader.read(), later(t, 4.0), None, &mut sink);

    let cpu = |tier, started, cause| {
        (
            tier,
            started,
            Component::Cpu,
            cause,
            "cpu-thermal".to_owned(),
        )
    };
    use ThrottleCause::{CriticalTrip, PassiveTrip};
    assert_eq!(
        summary(&sink),
        [
            cpu(Tier::Slo, true, PassiveTrip),
            cpu(Tier::Slo, false, PassiveTrip),
            cpu(Tier::Slo, true, PassiveTrip),
            cpu(Tier::Safety, true, CriticalTrip),
            cpu(Tier::Slo, false, PassiveTrip),
            cpu(Tier::Safety, false, CriticalTrip),
        ]
    );
    let events = throttles(&sink.events);
    let durations: Vec<Option<f64>> = events
        .iter()
        .filter(|(_, started, _)| !started)
        .map(|(_, _, t)| t.duration_seconds)
        .collect();
    assert_eq!(durations, [Some(2.0), Some(1.0), Some(1.0)]);
    assert_eq!(events[3].2.trip_celsius, Some(105.0));
    assert_eq!(events[3].2.celsius, Some(105.5));

    sampler.flush(later(t, 4.0), None, &mut sink);
    let (tier, counters) = throttle_counters(&sink).pop().unwrap();
    assert_eq!(tier, Tier::Slo);
    let seconds: Vec<f64> = counters
        .components
        .iter()
        .map(|c| c.throttled_seconds)
        .collect();
    // Throttled over [t, t+2] and [t+3, t+4].
    assert_eq!(seconds, [3.0, 0.0, 0.0]);
}

#[test]
fn caps_lowered_below_nominal_on_cpufreq_and_gpu_devfreq_are_slo_episodes() {
    let fake = FakeSysfs::orin().unwrap();
    let config = fake.config(
        toml::from_str::<RawThermalConfig>("[power_mode_nominal_max_mhz.2]\ncpu = 1497\ngpu = 612")
            .unwrap(),
    );
    let mut reader = SysfsReader::open(&config.sysfs).unwrap();
    let mut sampler = ThermalSampler::new(&config, reader.inventory(), t0(), None);
    let mut sink = CollectingSink::default();
    sampler.on_sysfs(reader.read(), t0(), None, &mut sink);

    fake.set_scaling_max(4, 1_497_600).unwrap();
    sampler.on_sysfs(reader.read(), later(t0(), 1.0), None, &mut sink);
    fake.set_gpu_max("17000000.gpu", 612_000_000).unwrap();
    sampler.on_sysfs(reader.read(), later(t0(), 2.0), None, &mut sink);
    fake.set_scaling_max(4, 2_201_600).unwrap();
    fake.set_gpu_max("17000000.gpu", 1_300_500_000).unwrap();
    sampler.on_sysfs(reader.read(), later(t0(), 5.0), None, &mut sink);

    use ThrottleCause::FrequencyCap;
    assert_eq!(
        summary(&sink),
        [
            (
                Tier::Slo,
                true,
                Component::Cpu,
                FrequencyCap,
                "policy4".to_owned()
            ),
            (
                Tier::Slo,
                true,
                Component::Gpu,
                FrequencyCap,
                "17000000.gpu".to_owned()
            ),
            (
                Tier::Slo,
                false,
                Component::Cpu,
                FrequencyCap,
                "policy4".to_owned()
            ),
            (
                Tier::Slo,
                false,
                Component::Gpu,
                FrequencyCap,
                "17000000.gpu".to_owned()
            ),
        ]
    );
    let events = throttles(&sink.events);
    let caps: Vec<(Option<u32>, Option<u32>, Option<f64>)> = events
        .iter()
        .map(|(_, _, t)| (t.cap_mhz, t.nominal_max_mhz, t.duration_seconds))
        .collect();
    assert_eq!(
        caps,
        [
            (Some(1497), Some(2201), None),
            (Some(612), Some(1300), None),
            (Some(2201), Some(2201), Some(4.0)),
            (Some(1300), Some(1300), Some(3.0)),
        ]
    );

    // nvpmodel mode 2 caps every cluster at 1497 MHz and the GPU at 612 MHz by design.
    fake.power_mode(2).unwrap();
    for policy in [0, 4, 8] {
        fake.set_scaling_max(policy, 1_497_600).unwrap();
    }
    fake.set_gpu_max("17000000.gpu", 612_000_000).unwrap();
    sampler.on_sysfs(reader.read(), later(t0(), 6.0), None, &mut sink);
    assert_eq!(
        throttles(&sink.events).len(),
        4,
        "the power mode's own caps"
    );

    sampler.flush(later(t0(), 7.0), None, &mut sink);
    let (_, counters) = throttle_counters(&sink).pop().unwrap();
    let seconds: Vec<f64> = counters
        .components
        .iter()
        .map(|c| c.throttled_seconds)
        .collect();
    assert_eq!(seconds, [4.0, 3.0, 0.0]);
}

#[test]
fn an_over_current_increment_is_a_safety_report_and_a_safety_episode_held_one_poll() {
    let fake = FakeSysfs::orin().unwrap();
    let config = fake.config(RawThermalConfig::default());
    let mut reader = SysfsReader::open(&config.sysfs).unwrap();
    let mut sampler = ThermalSampler::new(&config, reader.inventory(), t0(), None);
    let mut sink = CollectingSink::default();
    sampler.on_sysfs(reader.read(), t0(), None, &mut sink);
    assert!(
        over_currents(&sink.events).is_empty(),
        "1200 since boot is a baseline"
    );

    fake.set_oc(3, 1204).unwrap();
    sampler.on_sysfs(reader.read(), later(t0(), 1.0), None, &mut sink);
    let ocs = over_currents(&sink.events);
    assert_eq!(ocs.len(), 1);
    let (tier, oc) = &ocs[0];
    assert_eq!(*tier, Tier::Safety);
    assert_eq!(
        (oc.channel.as_str(), oc.event_count, oc.delta),
        ("oc3", 1204, 4)
    );
    use ThrottleCause::OverCurrent;
    assert_eq!(
        summary(&sink),
        [(
            Tier::Safety,
            true,
            Component::Soc,
            OverCurrent,
            "oc3".to_owned()
        )]
    );

    sampler.on_sysfs(reader.read(), later(t0(), 2.0), None, &mut sink);
    let events = throttles(&sink.events);
    assert_eq!(events.len(), 2);
    assert_eq!((events[1].0, events[1].1), (Tier::Safety, false));
    assert_eq!(events[1].2.duration_seconds, Some(1.0));

    sampler.flush(later(t0(), 3.0), None, &mut sink);
    let (_, counters) = throttle_counters(&sink).pop().unwrap();
    assert_eq!(counters.components[2].throttled_seconds, 1.0);
    assert_eq!(counters.components[2].component, Component::Soc as i32);
}

/// Replays `file` to its end (or `samples` samples when looping) into a fresh sampler, and
/// flushes the counters at the last event's time.
async fn replay_energy(file: &str, looped: bool, samples: usize) -> CollectingSink {
    let fake = FakeSysfs::empty().unwrap();
    let config = fake.config(RawThermalConfig {
        replay: Some(capture(file)),
        replay_speed: 1000.0,
        replay_loop: looped,
        ..RawThermalConfig::default()
    });
    let reader = SysfsReader::open(&config.sysfs).unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    let mut sampler = ThermalSampler::new(&config, reader.inventory(), clock::now(), None);
    let mut sink = CollectingSink::default();
    let mut seen = 0;
    let last = loop {
        let event = source.next().await;
        sampler.on_tegrastats(&event, None, &mut sink);
        match event {
            TegrastatsEvent::Sample { at, .. } => {
                seen += 1;
                if seen == samples {
                    break at;
                }
            }
            TegrastatsEvent::ReplayFinished { at } => break at,
            TegrastatsEvent::ReplayLooped { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(seen, samples);
    sampler.flush(last, None, &mut sink);
    sink
}

#[tokio::test(flavor = "current_thread")]
async fn energy_over_a_replayed_thor_capture_matches_the_hand_computation() {
    let sink = replay_energy("thor_jp7.1_l4t-r38.4.txt", false, 3).await;
    // Three lines replayed 1 s apart (trapezoid rule, mW × s = mJ):
    //   VDD_CPU_SOC_MSS 4165, 4923, 4544 mW: (4165+4923)/2 + (4923+4544)/2 = 9277.5 mJ
    //   VIN_SYS_5V0     4126, 4327, 4428 mW: (4126+4327)/2 + (4327+4428)/2 = 8604 mJ
    //   VDD_GPU         0 mW throughout
    let (tier, counters) = energy(&sink).pop().unwrap();
    assert_eq!(tier, Tier::Slo);
    let rails: Vec<&str> = counters.rails.iter().map(|r| r.rail.as_str()).collect();
    assert_eq!(rails, ["VDD_GPU", "VDD_CPU_SOC_MSS", "VIN_SYS_5V0"]);
    assert_close(joules(&sink, "VDD_GPU"), 0.0);
    assert_close(joules(&sink, "VDD_CPU_SOC_MSS"), 9.2775);
    assert_close(joules(&sink, "VIN_SYS_5V0"), 8.604);
}

#[tokio::test(flavor = "current_thread")]
async fn a_looped_agx_orin_line_keeps_its_duplicate_nc_rails_apart() {
    // One line, looped into three samples 1 s apart: each rail's power times 2 s.
    let sink = replay_energy("orin-agx-32gb_jp5.0.2_l4t-r35.1.txt", true, 3).await;
    let (_, counters) = energy(&sink).pop().unwrap();
    let rails: Vec<(&str, f64)> = counters
        .rails
        .iter()
        .map(|r| (r.rail.as_str(), r.joules))
        .collect();
    let expected = [
        ("VDD_GPU_SOC", 4.788 * 2.0),
        ("VDD_CPU_CV", 0.798 * 2.0),
        ("VIN_SYS_5V0", 3.842 * 2.0),
        ("NC", 0.0),
        ("VDDQ_VDD2_1V8AO", 0.707 * 2.0),
        ("NC#2", 0.0),
    ];
    assert_eq!(rails.len(), expected.len());
    for ((rail, j), (want_rail, want_j)) in rails.iter().zip(expected) {
        assert_eq!(*rail, want_rail);
        assert_close(*j, want_j);
    }
}

#[test]
fn configured_sysfs_power_inputs_are_integrated_too() {
    let fake = FakeSysfs::orin().unwrap();
    let config = fake.config(
        toml::from_str::<RawThermalConfig>(
            "tegrastats_enabled = false\n[[power_input]]\nrail = \"VDD_IN\"\n\
             millivolts = \"/sys/class/hwmon/hwmon0/in1_input\"\n\
             milliamps = \"/sys/class/hwmon/hwmon0/curr1_input\"",
        )
        .unwrap(),
    );
    let mut reader = SysfsReader::open(&config.sysfs).unwrap();
    let mut sampler = ThermalSampler::new(&config, reader.inventory(), t0(), None);
    let mut sink = CollectingSink::default();
    // 5000 mV × 1200 mA = 6 W at 0 s and 1 s, then 5000 mV × 1800 mA = 9 W at 2 s.
    sampler.on_sysfs(reader.read(), t0(), None, &mut sink);
    sampler.on_sysfs(reader.read(), later(t0(), 1.0), None, &mut sink);
    fake.write(
        "sys/devices/platform/i2c-1/1-0040/hwmon/hwmon0/curr1_input",
        "1800\n",
    )
    .unwrap();
    sampler.on_sysfs(reader.read(), later(t0(), 2.0), None, &mut sink);
    sampler.flush(later(t0(), 2.0), None, &mut sink);
    // 6 J + (6 + 9) / 2 J
    assert_close(joules(&sink, "VDD_IN"), 13.5);
}
