//! The thermal sampler: turns tegrastats events and sysfs snapshots into throttle, over-current,
//! counter, raw-sample and log events. Pure logic: the shells hand it their readings and the
//! time they were taken.
//!
//! **Counter series.** `ThrottleCounters` and `EnergyCounters` are cumulative since the series'
//! `start_time_unix_ns`, under one model version. Every call takes the model version running
//! now; when it differs from the series', the readings of that call are counted in the old
//! series, whose final counters are emitted (unless it never emitted and holds nothing), and a
//! new series starts from zero at that instant. Counters are emitted every `counters_interval`
//! of monotonic time, from whichever call finds them due; after a pause longer than an interval
//! the next emission is one interval later, never a burst.
//!
//! Invariants:
//! - No I/O, no clock: time comes in with each reading (or as an argument).
//! - Counters only grow within a series; a new series has a new start time.
//! - The counter events and the raw sample are rebuilt in reused storage: once every rail has
//!   been seen and the model version is stable, a tegrastats sample, a sysfs poll and a counter
//!   emission make no heap allocation (tested with a counting allocator).
//! - Every tegrastats start, exit, spawn failure and end of replay becomes a debug-tier
//!   `LogRecord`; malformed lines do too, on the 1st, 2nd, 4th, 8th, ... occurrence, with the
//!   running count, so a stream of garbage cannot flood the queue.

use edgewatch_proto::v1::{
    Attribute, ComponentSeconds, EnergyCounters, Event, LogLevel, LogRecord, ModelVersion,
    RailEnergy, ThrottleCounters, Tier, attribute::Value, event::Kind,
};

use super::config::ThermalConfig;
use super::energy::{EnergyIntegrator, EnergyStatus};
use super::raw_sample::RawSampler;
use super::sysfs::{SysfsInventory, SysfsSnapshot};
use super::tegrastats::{MalformedLine, TegrastatsEvent};
use super::throttle::{COMPONENTS, ThrottleDetector, ThrottleStatus};
use crate::sink::{EventSink, Now};

/// The `target` of the sampler's log records.
pub const LOG_TARGET: &str = "edgewatch_samplers::thermal";

/// The sampler's counters, for the agent's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThermalStatus {
    /// tegrastats samples taken.
    pub samples: u64,
    /// Malformed tegrastats lines seen.
    pub malformed: u64,
    /// tegrastats starts seen.
    pub tegrastats_starts: u64,
    /// tegrastats exits seen.
    pub tegrastats_exits: u64,
    /// tegrastats spawn failures seen.
    pub spawn_failures: u64,
    /// sysfs snapshots taken.
    pub sysfs_polls: u64,
    /// Raw samples sent to the debug tier.
    pub raw_samples: u64,
    /// Counter emissions (each is one `ThrottleCounters` and, with rails, one `EnergyCounters`).
    pub counter_emissions: u64,
    /// Counter series started (1 + model version changes).
    pub series: u64,
    /// Throttle detection.
    pub throttle: ThrottleStatus,
    /// Energy integration.
    pub energy: EnergyStatus,
}

/// Thermal and power sampling for one machine.
#[derive(Debug)]
pub struct ThermalSampler {
    throttle: ThrottleDetector,
    energy: EnergyIntegrator,
    raw: RawSampler,
    interval_ns: u64,
    next_due_ns: u64,
    /// Model of the current series (also held in both counter events).
    model: Option<ModelVersion>,
    series_start: Now,
    series_emitted: bool,
    throttle_counters: Event,
    energy_counters: Event,
    status: ThermalStatus,
}

impl ThermalSampler {
    /// A sampler for the machine described by `inventory` (from the sysfs reader), starting
    /// its first counter series at `now` under `model`.
    pub fn new(
        config: &ThermalConfig,
        inventory: &SysfsInventory,
        now: Now,
        model: Option<&ModelVersion>,
    ) -> Self {
        let interval_ns = u64::try_from(config.counters_interval.as_nanos()).unwrap_or(u64::MAX);
        let mut sampler = Self {
            throttle: ThrottleDetector::new(&config.throttle, inventory),
            energy: EnergyIntegrator::new(&config.energy, &inventory.power_inputs),
            raw: RawSampler::new(&config.debug_sample),
            interval_ns,
            next_due_ns: now.monotonic_ns.saturating_add(interval_ns),
            model: None,
            series_start: now,
            series_emitted: false,
            throttle_counters: Event {
                kind: Some(Kind::ThrottleCounters(ThrottleCounters {
                    start_time_unix_ns: now.wall_unix_ns,
                    components: COMPONENTS
                        .iter()
                        .map(|&c| ComponentSeconds {
                            component: c as i32,
                            throttled_seconds: 0.0,
                        })
                        .collect(),
                    model: None,
                })),
                ..Event::default()
            },
            energy_counters: Event {
                kind: Some(Kind::EnergyCounters(EnergyCounters::default())),
                ..Event::default()
            },
            status: ThermalStatus::default(),
        };
        sampler.start_series(now, model);
        sampler
    }

    /// Takes one event of the tegrastats source.
    pub fn on_tegrastats<S: EventSink + ?Sized>(
        &mut self,
        event: &TegrastatsEvent<'_>,
        model: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        let at = event.at();
        match event {
            TegrastatsEvent::Sample { sample, at } => {
                self.status.samples += 1;
                if self.raw.offer(sample, *at, sink) {
                    self.status.raw_samples += 1;
                }
                self.energy.observe_tegrastats(sample.rails(), *at);
                self.throttle
                    .observe_temperatures(sample.temperatures(), *at, sink);
            }
            TegrastatsEvent::Malformed { error, at } => {
                self.status.malformed += 1;
                if self.status.malformed.is_power_of_two() {
                    let reason = match error {
                        MalformedLine::Parse(e) => e.to_string(),
                        MalformedLine::Truncated => "line too long or cut short".to_owned(),
                        MalformedLine::NotUtf8 => "line is not UTF-8".to_owned(),
                    };
                    log(
                        sink,
                        *at,
                        LogLevel::Warn,
                        "A tegrastats line was not a sample; skipped.",
                        vec![
                            text("reason", reason),
                            int("malformed_total", self.status.malformed),
                        ],
                    );
                }
            }
            TegrastatsEvent::Started { pid, starts, at } => {
                self.status.tegrastats_starts += 1;
                let message = if *starts > 1 {
                    "tegrastats restarted."
                } else {
                    "tegrastats started."
                };
                log(
                    sink,
                    *at,
                    LogLevel::Info,
                    message,
                    vec![
                        int("pid", u64::from(pid.unwrap_or(0))),
                        int("starts", *starts),
                        int("restarts", starts.saturating_sub(1)),
                    ],
                );
            }
            TegrastatsEvent::Exited {
                exit,
                restart_in,
                exits,
                at,
            } => {
                self.status.tegrastats_exits += 1;
                self.energy.break_tegrastats();
                let mut attributes = vec![
                    int("exits", *exits),
                    int("lines", exit.lines),
                    float("ran_for_seconds", exit.ran_for.as_secs_f64()),
                    float("restart_in_seconds", restart_in.as_secs_f64()),
                ];
                if let Some(code) = exit.code {
                    attributes.push(int("code", u64::try_from(code).unwrap_or(0)));
                }
                if let Some(signal) = exit.signal {
                    attributes.push(int("signal", u64::try_from(signal).unwrap_or(0)));
                }
                log(
                    sink,
                    *at,
                    LogLevel::Warn,
                    "tegrastats exited; restarting after the backoff delay.",
                    attributes,
                );
            }
            TegrastatsEvent::SpawnFailed {
                error,
                restart_in,
                failures,
                at,
            } => {
                self.status.spawn_failures += 1;
                log(
                    sink,
                    *at,
                    LogLevel::Warn,
                    "tegrastats could not be started; retrying after the backoff delay.",
                    vec![
                        text("error", error.to_string()),
                        int("failures", *failures),
                        float("restart_in_seconds", restart_in.as_secs_f64()),
                    ],
                );
            }
            TegrastatsEvent::ReplayLooped { .. } => {}
            TegrastatsEvent::ReplayFinished { at } => {
                log(
                    sink,
                    *at,
                    LogLevel::Info,
                    "tegrastats replay reached the end of its capture.",
                    vec![],
                );
            }
        }
        self.after(at, model, sink);
    }

    /// Takes one sysfs snapshot read at `now` (shaped like the inventory given to `new`).
    pub fn on_sysfs<S: EventSink + ?Sized>(
        &mut self,
        snapshot: &SysfsSnapshot,
        now: Now,
        model: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        self.status.sysfs_polls += 1;
        self.energy.observe_power_inputs(&snapshot.power_mw, now);
        self.throttle.observe_sysfs(snapshot, now, sink);
        self.after(now, model, sink);
    }

    /// Advances time without readings: expires over-current holds and emits due counters.
    pub fn tick<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        model: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        self.throttle.tick(now, sink);
        self.after(now, model, sink);
    }

    /// Emits the counters now, whether due or not (e.g. at shutdown).
    pub fn flush<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        model: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        self.throttle.tick(now, sink);
        self.switch_series_if_needed(now, model, sink);
        self.emit_counters(now, sink);
        self.next_due_ns = now.monotonic_ns.saturating_add(self.interval_ns);
    }

    /// Monotonic time at which counters are next due.
    pub fn next_counters_due_ns(&self) -> u64 {
        self.next_due_ns
    }

    /// The throttle detector (current verdicts, cumulative seconds).
    pub fn throttle(&self) -> &ThrottleDetector {
        &self.throttle
    }

    /// The energy integrator (rails and joules of the current series).
    pub fn energy(&self) -> &EnergyIntegrator {
        &self.energy
    }

    /// The sampler's counters.
    pub fn status(&self) -> ThermalStatus {
        ThermalStatus {
            throttle: self.throttle.status(),
            energy: self.energy.status(),
            ..self.status
        }
    }

    fn after<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        model: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        self.switch_series_if_needed(now, model, sink);
        if now.monotonic_ns >= self.next_due_ns {
            self.emit_counters(now, sink);
            let next = self.next_due_ns.saturating_add(self.interval_ns);
            self.next_due_ns = if next > now.monotonic_ns {
                next
            } else {
                now.monotonic_ns.saturating_add(self.interval_ns)
            };
        }
    }

    fn switch_series_if_needed<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        model: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        if self.model.as_ref() == model {
            return;
        }
        let holds_something =
            self.throttle.throttled_seconds().iter().any(|s| *s > 0.0) || self.energy.has_energy();
        if self.series_emitted || holds_something {
            self.emit_counters(now, sink);
        }
        self.throttle.reset_seconds();
        self.energy.reset_totals();
        self.start_series(now, model);
    }

    fn start_series(&mut self, now: Now, model: Option<&ModelVersion>) {
        fn set(slot: &mut Option<ModelVersion>, model: Option<&ModelVersion>) {
            match (slot.as_mut(), model) {
                (Some(current), Some(m)) => current.clone_from(m),
                (_, m) => *slot = m.cloned(),
            }
        }
        set(&mut self.model, model);
        if let Some(Kind::ThrottleCounters(c)) = &mut self.throttle_counters.kind {
            set(&mut c.model, model);
            c.start_time_unix_ns = now.wall_unix_ns;
        }
        if let Some(Kind::EnergyCounters(c)) = &mut self.energy_counters.kind {
            set(&mut c.model, model);
            c.start_time_unix_ns = now.wall_unix_ns;
        }
        self.series_start = now;
        self.series_emitted = false;
        self.status.series += 1;
    }

    fn emit_counters<S: EventSink + ?Sized>(&mut self, now: Now, sink: &mut S) {
        let seconds = self.throttle.throttled_seconds();
        if let Some(Kind::ThrottleCounters(c)) = &mut self.throttle_counters.kind {
            for (entry, value) in c.components.iter_mut().zip(seconds) {
                entry.throttled_seconds = value;
            }
        }
        stamp(&mut self.throttle_counters, now);
        sink.emit(Tier::Slo, &self.throttle_counters);

        let rails = self.energy.status().rails;
        if rails > 0 {
            if let Some(Kind::EnergyCounters(c)) = &mut self.energy_counters.kind {
                c.rails.resize_with(rails, RailEnergy::default);
                for (entry, (label, joules)) in c.rails.iter_mut().zip(self.energy.rails()) {
                    if entry.rail != label {
                        entry.rail.clear();
                        entry.rail.push_str(label);
                    }
                    entry.joules = joules;
                }
            }
            stamp(&mut self.energy_counters, now);
            sink.emit(Tier::Slo, &self.energy_counters);
        }
        self.series_emitted = true;
        self.status.counter_emissions += 1;
    }
}

fn stamp(event: &mut Event, now: Now) {
    event.seq = 0;
    event.event_time_unix_ns = now.wall_unix_ns;
    event.monotonic_ns = now.monotonic_ns;
}

fn log<S: EventSink + ?Sized>(
    sink: &mut S,
    at: Now,
    level: LogLevel,
    message: &str,
    attributes: Vec<Attribute>,
) {
    let event = Event {
        seq: 0,
        event_time_unix_ns: at.wall_unix_ns,
        monotonic_ns: at.monotonic_ns,
        kind: Some(Kind::Log(LogRecord {
            level: level as i32,
            target: LOG_TARGET.to_owned(),
            message: message.to_owned(),
            attributes,
        })),
    };
    sink.emit(Tier::Debug, &event);
}

fn attribute(key: &str, value: Value) -> Attribute {
    Attribute {
        key: key.to_owned(),
        value: Some(value),
    }
}

fn int(key: &str, value: u64) -> Attribute {
    attribute(
        key,
        Value::IntValue(i64::try_from(value).unwrap_or(i64::MAX)),
    )
}

fn float(key: &str, value: f64) -> Attribute {
    attribute(key, Value::DoubleValue(value))
}

fn text(key: &str, value: String) -> Attribute {
    attribute(key, Value::StringValue(value))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sink::CollectingSink;
    use crate::thermal::config::RawThermalConfig;
    use crate::thermal::sysfs::{Trip, TripKind, ZoneInfo};
    use crate::thermal::tegrastats::ExitInfo;

    const S: u64 = 1_000_000_000;

    fn at(seconds: u64) -> Now {
        Now {
            wall_unix_ns: 1_700_000_000 * S as i64 + (seconds * S) as i64,
            monotonic_ns: 100 * S + seconds * S,
        }
    }

    fn model(version: &str) -> ModelVersion {
        ModelVersion {
            name: "haul-perception".into(),
            version: version.into(),
            ..ModelVersion::default()
        }
    }

    fn inventory() -> SysfsInventory {
        SysfsInventory {
            zones: vec![ZoneInfo {
                id: 0,
                kind: "cpu-thermal".into(),
                trips: vec![Trip {
                    index: 0,
                    celsius: 90.0,
                    kind: TripKind::Passive,
                    hysteresis_celsius: 0.0,
                }],
            }],
            ..SysfsInventory::default()
        }
    }

    fn sampler(m: Option<&ModelVersion>) -> ThermalSampler {
        let config = RawThermalConfig::default().validate().unwrap();
        ThermalSampler::new(&config, &inventory(), at(0), m)
    }

    fn feed(
        s: &mut ThermalSampler,
        line: &str,
        t: u64,
        m: Option<&ModelVersion>,
        sink: &mut CollectingSink,
    ) {
        let sample = tegrastats_parser::parse_line(line).unwrap();
        s.on_tegrastats(&TegrastatsEvent::Sample { sample, at: at(t) }, m, sink);
    }

    fn energy(sink: &CollectingSink) -> Vec<(i64, EnergyCounters)> {
        sink.events
            .iter()
            .filter_map(|(tier, e)| match &e.kind {
                Some(Kind::EnergyCounters(c)) => {
                    assert_eq!(*tier, Tier::Slo);
                    Some((e.event_time_unix_ns, c.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn throttle_counters(sink: &CollectingSink) -> Vec<ThrottleCounters> {
        sink.events
            .iter()
            .filter_map(|(_, e)| match &e.kind {
                Some(Kind::ThrottleCounters(c)) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }

    fn logs(sink: &CollectingSink) -> Vec<LogRecord> {
        sink.events
            .iter()
            .filter_map(|(tier, e)| match &e.kind {
                Some(Kind::Log(l)) => {
                    assert_eq!(*tier, Tier::Debug);
                    Some(l.clone())
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn counters_are_emitted_every_interval_with_the_model_and_series_start() {
        let m = model("4.2.1");
        let mut s = sampler(Some(&m));
        let mut sink = CollectingSink::default();
        for t in 0..=25 {
            feed(
                &mut s,
                "RAM 1/2MB CPU@91C VDD_IN 2000mW/2000mW",
                t,
                Some(&m),
                &mut sink,
            );
        }
        let e = energy(&sink);
        assert_eq!(e.len(), 2, "at 10 s and 20 s");
        assert_eq!(e[0].0, at(10).wall_unix_ns);
        assert_eq!(e[0].1.start_time_unix_ns, at(0).wall_unix_ns);
        assert_eq!(e[0].1.model.as_ref(), Some(&m));
        assert_eq!(e[0].1.rails[0].rail, "VDD_IN");
        assert!((e[0].1.rails[0].joules - 20.0).abs() < 1e-9);
        assert!((e[1].1.rails[0].joules - 40.0).abs() < 1e-9);
        let t = throttle_counters(&sink);
        assert_eq!(t.len(), 2);
        let cpu: Vec<f64> = t
            .iter()
            .map(|c| c.components[0].throttled_seconds)
            .collect();
        assert_eq!(cpu, [10.0, 20.0]);
        assert_eq!(
            t[0].components
                .iter()
                .map(|c| c.component)
                .collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }

    #[test]
    fn a_long_pause_emits_once_then_resumes_the_period() {
        let mut s = sampler(None);
        let mut sink = CollectingSink::default();
        feed(&mut s, "RAM 1/2MB VDD_IN 2000mW/2000mW", 0, None, &mut sink);
        feed(
            &mut s,
            "RAM 1/2MB VDD_IN 2000mW/2000mW",
            95,
            None,
            &mut sink,
        );
        assert_eq!(energy(&sink).len(), 1);
        assert_eq!(s.next_counters_due_ns(), at(105).monotonic_ns);
        assert_eq!(s.status().energy.gaps, 1);
    }

    #[test]
    fn a_model_change_closes_the_series_and_starts_a_new_one_from_zero() {
        let (a, b) = (model("1.0.0"), model("2.0.0"));
        let mut s = sampler(Some(&a));
        let mut sink = CollectingSink::default();
        for t in 0..=4 {
            feed(
                &mut s,
                "RAM 1/2MB VDD_IN 1000mW/1000mW",
                t,
                Some(&a),
                &mut sink,
            );
        }
        feed(
            &mut s,
            "RAM 1/2MB VDD_IN 1000mW/1000mW",
            5,
            Some(&b),
            &mut sink,
        );
        for t in 6..=15 {
            feed(
                &mut s,
                "RAM 1/2MB VDD_IN 1000mW/1000mW",
                t,
                Some(&b),
                &mut sink,
            );
        }
        let e = energy(&sink);
        assert_eq!(e.len(), 2);
        // The closing counters of model a include the interval ending at the switch.
        assert_eq!(e[0].1.model.as_ref(), Some(&a));
        assert!((e[0].1.rails[0].joules - 5.0).abs() < 1e-9);
        assert_eq!(e[0].0, at(5).wall_unix_ns);
        // Model b's series starts at the switch; due at 10 s (the period is not reset).
        assert_eq!(e[1].1.model.as_ref(), Some(&b));
        assert_eq!(e[1].1.start_time_unix_ns, at(5).wall_unix_ns);
        assert!((e[1].1.rails[0].joules - 5.0).abs() < 1e-9);
        assert_eq!(s.status().series, 2);
    }

    #[test]
    fn a_model_known_only_after_start_is_adopted_without_an_empty_closing_series() {
        let m = model("1.0.0");
        let mut s = sampler(None);
        let mut sink = CollectingSink::default();
        feed(
            &mut s,
            "RAM 1/2MB VDD_IN 1000mW/1000mW",
            0,
            Some(&m),
            &mut sink,
        );
        s.flush(at(1), Some(&m), &mut sink);
        let t = throttle_counters(&sink);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].model.as_ref(), Some(&m));
    }

    #[test]
    fn exits_break_energy_continuity_and_each_lifecycle_step_is_a_debug_log() {
        let mut s = sampler(None);
        let mut sink = CollectingSink::default();
        s.on_tegrastats(
            &TegrastatsEvent::Started {
                pid: Some(42),
                starts: 1,
                at: at(0),
            },
            None,
            &mut sink,
        );
        feed(&mut s, "RAM 1/2MB VDD_IN 1000mW/1000mW", 0, None, &mut sink);
        feed(&mut s, "RAM 1/2MB VDD_IN 1000mW/1000mW", 1, None, &mut sink);
        let exit = ExitInfo {
            code: Some(3),
            signal: None,
            ran_for: Duration::from_secs(1),
            lines: 2,
        };
        s.on_tegrastats(
            &TegrastatsEvent::Exited {
                exit,
                restart_in: Duration::from_secs(1),
                exits: 1,
                at: at(1),
            },
            None,
            &mut sink,
        );
        s.on_tegrastats(
            &TegrastatsEvent::Started {
                pid: Some(43),
                starts: 2,
                at: at(2),
            },
            None,
            &mut sink,
        );
        feed(&mut s, "RAM 1/2MB VDD_IN 1000mW/1000mW", 2, None, &mut sink);
        feed(&mut s, "RAM 1/2MB VDD_IN 1000mW/1000mW", 3, None, &mut sink);
        s.flush(at(3), None, &mut sink);
        // 0..1 and 2..3: the 1..2 interval spans the restart.
        assert!((energy(&sink)[0].1.rails[0].joules - 2.0).abs() < 1e-9);
        let messages: Vec<String> = logs(&sink).into_iter().map(|l| l.message).collect();
        assert_eq!(
            messages,
            [
                "tegrastats started.",
                "tegrastats exited; restarting after the backoff delay.",
                "tegrastats restarted.",
            ]
        );
        let exited = &logs(&sink)[1];
        assert_eq!(exited.level, LogLevel::Warn as i32);
        assert!(
            exited
                .attributes
                .iter()
                .any(|a| a.key == "code" && a.value == Some(Value::IntValue(3)))
        );
        let status = s.status();
        assert_eq!((status.tegrastats_starts, status.tegrastats_exits), (2, 1));
        assert_eq!(status.energy.continuity_breaks, 1);
    }

    #[test]
    fn malformed_lines_are_counted_and_logged_on_powers_of_two() {
        let mut s = sampler(None);
        let mut sink = CollectingSink::default();
        for t in 0..9 {
            let error = MalformedLine::NotUtf8;
            s.on_tegrastats(
                &TegrastatsEvent::Malformed { error, at: at(t) },
                None,
                &mut sink,
            );
        }
        assert_eq!(s.status().malformed, 9);
        assert_eq!(logs(&sink).len(), 4, "1st, 2nd, 4th and 8th");
    }

    #[test]
    fn raw_samples_follow_the_downsampling_config() {
        let config = RawThermalConfig {
            debug_sample_every: 5,
            ..RawThermalConfig::default()
        }
        .validate()
        .unwrap();
        let mut s = ThermalSampler::new(&config, &inventory(), at(0), None);
        let mut sink = CollectingSink::default();
        for t in 0..10 {
            feed(&mut s, "RAM 1/2MB CPU@40C", t, None, &mut sink);
        }
        let raw = sink
            .events
            .iter()
            .filter(|(tier, e)| {
                *tier == Tier::Debug && matches!(e.kind, Some(Kind::ThermalSample(_)))
            })
            .count();
        assert_eq!(raw, 2);
        assert_eq!(s.status().raw_samples, 2);
    }
}
