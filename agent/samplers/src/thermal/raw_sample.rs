//! Raw tegrastats samples for the debug tier, downsampled: one `ThermalSample` per
//! `debug_sample_every` samples, and at least `debug_sample_min_interval` apart.
//!
//! Invariants:
//! - The first sample is emitted (when `every` > 0); after an emission, the next one needs both
//!   `every` more samples and the minimum interval; `every` = 0 emits nothing.
//! - The event is filled in place, and entries a shorter line does not need are parked in spare
//!   pools rather than freed: once lines of each shape seen have been emitted, emitting does not
//!   allocate, even when the zone set changes (JetPack 6 omits `gpu@` while the GPU is gated).
//! - Rails carry the same `NAME#n` labels for duplicates as `EnergyCounters` (see `energy`);
//!   values tegrastats did not print stay absent (load `NaN` for offline cores, clock 0).

use edgewatch_proto::v1::{
    Event, RailPower, Temperature as ProtoTemperature, ThermalSample, Tier, event::Kind,
};
use tegrastats_parser::{MAX_CPUS, MAX_RAILS, MAX_TEMPERATURES, Sample};

use super::config::DebugSampleConfig;
use super::energy::{occurrence_label, occurrence_of};
use crate::sink::{EventSink, Now};

/// Decides which samples go to the debug tier and builds their events.
#[derive(Debug)]
pub struct RawSampler {
    every: u32,
    min_interval_ns: u64,
    since_last: u32,
    last_emit_ns: Option<u64>,
    emitted: u64,
    event: Event,
    spare_temperatures: Vec<ProtoTemperature>,
    spare_rails: Vec<RailPower>,
}

impl RawSampler {
    /// A sampler for `config`.
    pub fn new(config: &DebugSampleConfig) -> Self {
        Self {
            every: config.every,
            min_interval_ns: u64::try_from(config.min_interval.as_nanos()).unwrap_or(u64::MAX),
            since_last: config.every.saturating_sub(1),
            last_emit_ns: None,
            emitted: 0,
            event: Event {
                kind: Some(Kind::ThermalSample(ThermalSample {
                    temperatures: Vec::with_capacity(MAX_TEMPERATURES),
                    rails: Vec::with_capacity(MAX_RAILS),
                    cpu_load_pct: Vec::with_capacity(MAX_CPUS),
                    cpu_freq_mhz: Vec::with_capacity(MAX_CPUS),
                    ..ThermalSample::default()
                })),
                ..Event::default()
            },
            spare_temperatures: Vec::with_capacity(MAX_TEMPERATURES),
            spare_rails: Vec::with_capacity(MAX_RAILS),
        }
    }

    /// Offers one sample; emits it to the debug tier when due. Returns whether it was emitted.
    pub fn offer<S: EventSink + ?Sized>(
        &mut self,
        sample: &Sample<'_>,
        now: Now,
        sink: &mut S,
    ) -> bool {
        if self.every == 0 {
            return false;
        }
        self.since_last = self.since_last.saturating_add(1);
        let spaced = self
            .last_emit_ns
            .is_none_or(|at| now.monotonic_ns.saturating_sub(at) >= self.min_interval_ns);
        if self.since_last < self.every || !spaced {
            return false;
        }
        self.since_last = 0;
        self.last_emit_ns = Some(now.monotonic_ns);
        self.emitted += 1;
        self.event.seq = 0;
        self.event.event_time_unix_ns = now.wall_unix_ns;
        self.event.monotonic_ns = now.monotonic_ns;
        if !matches!(self.event.kind, Some(Kind::ThermalSample(_))) {
            self.event.kind = Some(Kind::ThermalSample(ThermalSample::default()));
        }
        if let Some(Kind::ThermalSample(out)) = &mut self.event.kind {
            fill(
                out,
                sample,
                &mut self.spare_temperatures,
                &mut self.spare_rails,
            );
        }
        sink.emit(Tier::Debug, &self.event);
        true
    }

    /// Samples emitted so far.
    pub fn emitted(&self) -> u64 {
        self.emitted
    }
}

/// Makes `items` `len` long, parking surplus entries in `spare` and taking from it first, so
/// their strings keep their capacity.
fn set_len<T: Default>(items: &mut Vec<T>, spare: &mut Vec<T>, len: usize) {
    while items.len() > len {
        if let Some(item) = items.pop() {
            spare.push(item);
        }
    }
    while items.len() < len {
        items.push(spare.pop().unwrap_or_default());
    }
}

fn fill(
    out: &mut ThermalSample,
    sample: &Sample<'_>,
    spare_temperatures: &mut Vec<ProtoTemperature>,
    spare_rails: &mut Vec<RailPower>,
) {
    let temperatures = sample.temperatures();
    set_len(
        &mut out.temperatures,
        spare_temperatures,
        temperatures.len(),
    );
    for (dst, src) in out.temperatures.iter_mut().zip(temperatures) {
        dst.zone.clear();
        dst.zone.push_str(src.zone);
        dst.celsius = src.celsius.map(f64::from);
    }

    let rails = sample.rails();
    set_len(&mut out.rails, spare_rails, rails.len());
    for (i, (dst, src)) in out.rails.iter_mut().zip(rails).enumerate() {
        occurrence_label(&mut dst.rail, src.name, occurrence_of(rails, i));
        dst.current_mw = f64::from(src.current_mw);
        dst.average_mw = src.average_mw.map(f64::from);
    }

    out.cpu_load_pct.clear();
    out.cpu_freq_mhz.clear();
    for cpu in sample.cpus() {
        let load = cpu.load_pct.filter(|_| cpu.online).map(f64::from);
        out.cpu_load_pct.push(load.unwrap_or(f64::NAN));
        out.cpu_freq_mhz
            .push(cpu.freq_mhz.filter(|_| cpu.online).unwrap_or(0));
    }

    let gpu = sample.gpu();
    out.gpu_load_pct = gpu.and_then(|g| g.load_pct).map(f64::from);
    out.gpu_freq_mhz.clear();
    if let Some(gpu) = gpu {
        out.gpu_freq_mhz.extend_from_slice(&gpu.freq_mhz);
    }
    out.emc_freq_mhz = sample.emc().and_then(|e| e.freq_mhz.first().copied());
    let ram = sample.ram();
    out.ram_used_mb = ram.map(|r| u64::from(r.used_mb));
    out.ram_total_mb = ram.map(|r| u64::from(r.total_mb));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sink::CollectingSink;

    const LINE: &str = "10-16-2023 10:59:22 RAM 1205/30623MB (lfb 6429x4MB) CPU [0%@729,off,1%@730] \
        EMC_FREQ 0%@204 GR3D_FREQ 0%@114 GR3D2_FREQ 0%@114 CV0@-256C CPU@43.5C \
        VDD_GPU_SOC 4788mW/4788mW NC 0mW/0mW NC 7mW/0mW";

    fn at(ms: u64) -> Now {
        Now {
            wall_unix_ns: 1_000 + ms as i64 * 1_000_000,
            monotonic_ns: ms * 1_000_000,
        }
    }

    fn sampler(every: u32, min_interval_ms: u64) -> RawSampler {
        RawSampler::new(&DebugSampleConfig {
            every,
            min_interval: Duration::from_millis(min_interval_ms),
        })
    }

    #[test]
    fn every_nth_sample_goes_to_the_debug_tier_starting_with_the_first() {
        let sample = tegrastats_parser::parse_line(LINE).unwrap();
        let mut raw = sampler(3, 0);
        let mut sink = CollectingSink::default();
        let emitted: Vec<bool> = (0..7)
            .map(|i| raw.offer(&sample, at(i * 1000), &mut sink))
            .collect();
        assert_eq!(emitted, [true, false, false, true, false, false, true]);
        assert!(sink.events.iter().all(|(tier, _)| *tier == Tier::Debug));
    }

    #[test]
    fn a_minimum_interval_spaces_samples_further() {
        let sample = tegrastats_parser::parse_line(LINE).unwrap();
        let mut raw = sampler(1, 2500);
        let mut sink = CollectingSink::default();
        let emitted: Vec<bool> = (0..7)
            .map(|i| raw.offer(&sample, at(i * 1000), &mut sink))
            .collect();
        assert_eq!(emitted, [true, false, false, true, false, false, true]);
        assert_eq!(raw.emitted(), 3);
    }

    #[test]
    fn zero_emits_nothing() {
        let sample = tegrastats_parser::parse_line(LINE).unwrap();
        let mut raw = sampler(0, 0);
        let mut sink = CollectingSink::default();
        assert!(!raw.offer(&sample, at(0), &mut sink));
        assert!(sink.events.is_empty());
    }

    #[test]
    fn the_sample_carries_what_the_line_printed_and_leaves_absent_values_absent() {
        let sample = tegrastats_parser::parse_line(LINE).unwrap();
        let mut raw = sampler(1, 0);
        let mut sink = CollectingSink::default();
        raw.offer(&sample, at(5), &mut sink);
        let (_, event) = &sink.events[0];
        assert_eq!(event.event_time_unix_ns, 1_000 + 5_000_000);
        let Some(Kind::ThermalSample(s)) = &event.kind else {
            panic!("not a thermal sample")
        };
        let zones: Vec<(&str, Option<f64>)> = s
            .temperatures
            .iter()
            .map(|t| (t.zone.as_str(), t.celsius))
            .collect();
        assert_eq!(zones, [("CV0", None), ("CPU", Some(43.5))]);
        let rails: Vec<(&str, f64)> = s
            .rails
            .iter()
            .map(|r| (r.rail.as_str(), r.current_mw))
            .collect();
        assert_eq!(rails, [("VDD_GPU_SOC", 4788.0), ("NC", 0.0), ("NC#2", 7.0)]);
        assert_eq!(s.cpu_freq_mhz, [729, 0, 730]);
        assert!(s.cpu_load_pct[1].is_nan());
        assert_eq!(s.cpu_load_pct[2], 1.0);
        assert_eq!(s.gpu_load_pct, Some(0.0));
        assert_eq!(s.gpu_freq_mhz, [114, 114]);
        assert_eq!(s.emc_freq_mhz, Some(204));
        assert_eq!((s.ram_used_mb, s.ram_total_mb), (Some(1205), Some(30623)));
    }
}
