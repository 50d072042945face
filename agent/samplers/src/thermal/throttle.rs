//! Throttling detection per component (cpu, gpu, soc): pure logic over sysfs snapshots and
//! tegrastats temperatures, with time as an argument.
//!
//! A component is throttled while any of its *conditions* holds. Each condition has its own
//! episode, reported as `throttle_started` / `throttle_ended`:
//!
//! | condition | holds while | component | tier |
//! |---|---|---|---|
//! | passive trip of a zone | zone ≥ trip; left below trip − hysteresis | by zone name | SLO |
//! | hot or critical trip | same | by zone name | safety |
//! | frequency cap of a cpufreq policy / the GPU | `scaling_max_freq` / devfreq `max_freq` + tolerance < nominal maximum | cpu / gpu | SLO |
//! | over-current channel `ocN` | less than `oc_hold` since the counter last incremented | soc | safety |
//!
//! **Hysteresis.** A trip is entered at `temp ≥ trip` and left only at `temp < trip − h`, with
//! `h` the larger of the zone's own `trip_point_N_hyst` and `trip_hysteresis_celsius` (default
//! 2 °C): a reading that dances around the trip (±0.5 °C sensor jitter) keeps the episode open
//! instead of flapping. Caps are discrete setpoints written by nvpmodel or a cooling governor and
//! carry no noise; the tolerance only absorbs kHz/MHz rounding. An over-current increment holds
//! its condition for `oc_hold` and each further increment re-arms it, so a burst of events is one
//! episode.
//!
//! **Nominal maximum** of a clock, per current nvpmodel power mode: the mode's configured value,
//! else the default configured value, else the hardware maximum (`cpuinfo_max_freq`, the highest
//! devfreq `available_frequencies`); a configured value above the hardware maximum is lowered
//! to it (a slower cluster is not capped by a faster cluster's nominal). Without any of them the
//! cap condition is never true.
//!
//! Invariants:
//! - No I/O, no clock: every entry point takes a [`Now`]; state changes happen at those instants.
//! - Throttled seconds of a component accumulate by zero-order hold: the interval from one
//!   observation to the next counts if the component was throttled after the first. An interval
//!   longer than `max_gap` counts for nothing and is counted in [`ThrottleStatus::gaps`].
//!   Episode durations are plain differences of the start and end instants, gaps included.
//! - A value that could not be read (`None`) leaves its condition as it was.
//! - Over-current increments are never lost: the first of an episode is reported at once, later
//!   ones at most every `oc_report_interval`, and what is left at the episode's end; the deltas
//!   of one channel sum to the counter's increase. A counter that goes down (driver reload) is a
//!   new baseline, counted in [`ThrottleStatus::oc_counter_resets`].
//! - Events are built in reused storage: after each condition has emitted once, emitting does
//!   not allocate.

use std::collections::BTreeMap;

use edgewatch_proto::v1::{
    Component, Event, OverCurrent, Throttle, ThrottleCause, Tier, event::Kind,
};
use tegrastats_parser::Temperature;

use super::config::{NominalMax, ThrottleConfig, ZoneComponent};
use super::sysfs::{SysfsInventory, SysfsSnapshot, TripKind};
use crate::sink::{EventSink, Now};

/// The components reported, in `ThrottleCounters` order.
pub const COMPONENTS: [Component; 3] = [Component::Cpu, Component::Gpu, Component::Soc];

fn slot(component: Component) -> usize {
    match component {
        Component::Gpu => 1,
        Component::Soc => 2,
        Component::Cpu | Component::Unspecified => 0,
    }
}

/// Normalises a thermal zone type to the name tegrastats prints: lower case, without the
/// `-thermal`, `-therm` or `_tegra` suffix (`cpu-thermal` → `cpu`, `Tboard_tegra` → `tboard`).
pub fn zone_short_name(kind: &str) -> String {
    let lower = kind.trim().to_ascii_lowercase();
    for suffix in ["-thermal", "-therm", "_tegra"] {
        if let Some(stem) = lower.strip_suffix(suffix) {
            return stem.to_owned();
        }
    }
    lower
}

/// The component a zone's trips throttle: a configured override (by type or short name), else
/// `cpu*`/`bcpu*`/`mcpu*` → cpu, `gpu*` → gpu, `pmic*` → ignored (a constant on Jetson), any
/// other zone (junction `tj`, `soc*`, `cv*`, board sensors) → soc.
pub fn zone_component(kind: &str, overrides: &[(String, ZoneComponent)]) -> ZoneComponent {
    let short = zone_short_name(kind);
    let lower = kind.trim().to_ascii_lowercase();
    if let Some((_, component)) = overrides
        .iter()
        .find(|(name, _)| *name == short || *name == lower)
    {
        return *component;
    }
    if ["cpu", "bcpu", "mcpu"].iter().any(|p| short.starts_with(p)) {
        ZoneComponent::Cpu
    } else if short.starts_with("gpu") {
        ZoneComponent::Gpu
    } else if short.starts_with("pmic") {
        ZoneComponent::Ignore
    } else {
        ZoneComponent::Soc
    }
}

/// Counters of the detector's own bookkeeping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThrottleStatus {
    /// Intervals between observations longer than `max_gap`, not counted.
    pub gaps: u64,
    /// Over-current counters that went down and were taken as a new baseline.
    pub oc_counter_resets: u64,
    /// Episodes open now.
    pub open_episodes: usize,
    /// Trip, cap and over-current conditions watched.
    pub conditions: usize,
}

#[derive(Debug)]
struct TripCondition {
    zone: usize,
    component: Component,
    cause: ThrottleCause,
    source: String,
    trip_celsius: f64,
    leave_below: f64,
    started_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
enum CapTarget {
    CpuPolicy(usize),
    Gpu,
}

#[derive(Debug)]
struct CapCondition {
    target: CapTarget,
    component: Component,
    source: String,
    hardware_max_khz: Option<u64>,
    cap_khz: Option<u64>,
    started_ns: Option<u64>,
    /// Nominal at the start, reported again at the end.
    nominal_khz: Option<u64>,
}

#[derive(Debug)]
struct OcCondition {
    channel: String,
    count: Option<u64>,
    last_increment_ns: Option<u64>,
    unreported: u64,
    last_report_ns: Option<u64>,
    started_ns: Option<u64>,
}

/// The values a `Throttle` event carries.
struct Fields<'a> {
    component: Component,
    cause: ThrottleCause,
    source: &'a str,
    celsius: Option<f64>,
    trip_celsius: Option<f64>,
    cap_khz: Option<u64>,
    nominal_khz: Option<u64>,
    duration_seconds: Option<f64>,
}

/// Throttling state of one machine. Built from the configuration and the sysfs inventory.
#[derive(Debug)]
pub struct ThrottleDetector {
    trips: Vec<TripCondition>,
    caps: Vec<CapCondition>,
    ocs: Vec<OcCondition>,
    /// Short names of the inventory's zones, for matching tegrastats temperatures.
    zone_names: Vec<String>,
    /// Last readable temperature per zone.
    zone_celsius: Vec<Option<f64>>,
    nominal: NominalMax,
    per_power_mode: BTreeMap<u32, NominalMax>,
    power_mode: Option<u32>,
    cap_tolerance_khz: u64,
    oc_hold_ns: u64,
    oc_report_ns: u64,
    max_gap_ns: u64,
    throttled: [bool; 3],
    seconds: [f64; 3],
    last_ns: Option<u64>,
    status: ThrottleStatus,
    throttle_event: Event,
    oc_event: Event,
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn mhz(khz: Option<u64>) -> Option<u32> {
    khz.map(|k| u32::try_from(k / 1_000).unwrap_or(u32::MAX))
}

fn seconds_between(start_ns: u64, end_ns: u64) -> f64 {
    end_ns.saturating_sub(start_ns) as f64 / 1e9
}

impl ThrottleDetector {
    /// Sets up one condition per throttling trip point, cpufreq policy, GPU and over-current
    /// channel in `inventory`.
    pub fn new(config: &ThrottleConfig, inventory: &SysfsInventory) -> Self {
        let mut trips = Vec::new();
        for (zone, info) in inventory.zones.iter().enumerate() {
            let component = match zone_component(&info.kind, &config.zone_components) {
                ZoneComponent::Cpu => Component::Cpu,
                ZoneComponent::Gpu => Component::Gpu,
                ZoneComponent::Soc => Component::Soc,
                ZoneComponent::Ignore => continue,
            };
            for trip in &info.trips {
                let cause = match trip.kind {
                    TripKind::Passive => ThrottleCause::PassiveTrip,
                    TripKind::Hot | TripKind::Critical => ThrottleCause::CriticalTrip,
                    TripKind::Active => continue,
                };
                let hysteresis = trip.hysteresis_celsius.max(config.trip_hysteresis_celsius);
                trips.push(TripCondition {
                    zone,
                    component,
                    cause,
                    source: info.kind.clone(),
                    trip_celsius: trip.celsius,
                    leave_below: trip.celsius - hysteresis,
                    started_ns: None,
                });
            }
        }
        let mut caps: Vec<CapCondition> = inventory
            .cpu_policies
            .iter()
            .enumerate()
            .map(|(i, policy)| CapCondition {
                target: CapTarget::CpuPolicy(i),
                component: Component::Cpu,
                source: policy.name.clone(),
                hardware_max_khz: policy.hardware_max_khz,
                cap_khz: None,
                started_ns: None,
                nominal_khz: None,
            })
            .collect();
        if let Some(gpu) = &inventory.gpu {
            caps.push(CapCondition {
                target: CapTarget::Gpu,
                component: Component::Gpu,
                source: gpu.device.clone(),
                hardware_max_khz: gpu.hardware_max_khz,
                cap_khz: None,
                started_ns: None,
                nominal_khz: None,
            });
        }
        let ocs: Vec<OcCondition> = inventory
            .oc_channels
            .iter()
            .map(|channel| OcCondition {
                channel: channel.clone(),
                count: None,
                last_increment_ns: None,
                unreported: 0,
                last_report_ns: None,
                started_ns: None,
            })
            .collect();
        let conditions = trips.len() + caps.len() + ocs.len();
        Self {
            trips,
            caps,
            ocs,
            zone_names: inventory
                .zones
                .iter()
                .map(|z| zone_short_name(&z.kind))
                .collect(),
            zone_celsius: vec![None; inventory.zones.len()],
            nominal: config.nominal,
            per_power_mode: config.per_power_mode.clone(),
            power_mode: None,
            cap_tolerance_khz: config.cap_tolerance_khz,
            oc_hold_ns: nanos(config.oc_hold),
            oc_report_ns: nanos(config.oc_report_interval),
            max_gap_ns: nanos(config.max_gap),
            throttled: [false; 3],
            seconds: [0.0; 3],
            last_ns: None,
            status: ThrottleStatus {
                conditions,
                ..ThrottleStatus::default()
            },
            throttle_event: Event::default(),
            oc_event: Event::default(),
        }
    }

    /// Takes one sysfs poll: zone temperatures, clock caps, over-current counters, power mode.
    /// `snapshot` must be shaped like the inventory the detector was built from.
    pub fn observe_sysfs<S: EventSink + ?Sized>(
        &mut self,
        snapshot: &SysfsSnapshot,
        now: Now,
        sink: &mut S,
    ) {
        self.advance(now);
        for (slot, reading) in self.zone_celsius.iter_mut().zip(&snapshot.zone_celsius) {
            if reading.is_some() {
                *slot = *reading;
            }
        }
        if snapshot.power_mode.is_some() {
            self.power_mode = snapshot.power_mode;
        }
        for cap in &mut self.caps {
            let reading = match cap.target {
                CapTarget::CpuPolicy(i) => snapshot.cpu_policies.get(i).copied(),
                CapTarget::Gpu => snapshot.gpu,
            };
            if let Some(max) = reading.and_then(|r| r.max_khz) {
                cap.cap_khz = Some(max);
            }
        }
        for (oc, reading) in self.ocs.iter_mut().zip(&snapshot.oc_counts) {
            let Some(count) = *reading else { continue };
            match oc.count {
                Some(previous) if count > previous => {
                    oc.unreported += count - previous;
                    oc.last_increment_ns = Some(now.monotonic_ns);
                    let due = oc.started_ns.is_none()
                        || oc.last_report_ns.is_none_or(|at| {
                            now.monotonic_ns.saturating_sub(at) >= self.oc_report_ns
                        });
                    if due {
                        emit_over_current(
                            &mut self.oc_event,
                            sink,
                            now,
                            &oc.channel,
                            count,
                            oc.unreported,
                        );
                        oc.unreported = 0;
                        oc.last_report_ns = Some(now.monotonic_ns);
                    }
                }
                Some(previous) if count < previous => self.status.oc_counter_resets += 1,
                _ => {}
            }
            oc.count = Some(count);
        }
        self.evaluate(now, sink);
    }

    /// Takes the temperatures of one tegrastats line; zones are matched by short name, case
    /// ignored. Unreadable (`-256C`) readings are skipped.
    pub fn observe_temperatures<S: EventSink + ?Sized>(
        &mut self,
        temperatures: &[Temperature<&str>],
        now: Now,
        sink: &mut S,
    ) {
        self.advance(now);
        for t in temperatures {
            let Some(celsius) = t.celsius else { continue };
            for (name, slot) in self.zone_names.iter().zip(self.zone_celsius.iter_mut()) {
                if name.eq_ignore_ascii_case(t.zone) {
                    *slot = Some(f64::from(celsius));
                }
            }
        }
        self.evaluate(now, sink);
    }

    /// Advances time without new readings (ends over-current holds that have expired).
    pub fn tick<S: EventSink + ?Sized>(&mut self, now: Now, sink: &mut S) {
        self.advance(now);
        self.evaluate(now, sink);
    }

    /// Cumulative throttled seconds per component, in [`COMPONENTS`] order.
    pub fn throttled_seconds(&self) -> [f64; 3] {
        self.seconds
    }

    /// Whether `component` is throttled now.
    pub fn is_throttled(&self, component: Component) -> bool {
        self.throttled[slot(component)]
    }

    /// Starts the cumulative seconds over from zero (a new counter series); episodes go on.
    pub fn reset_seconds(&mut self) {
        self.seconds = [0.0; 3];
    }

    /// The detector's bookkeeping counters.
    pub fn status(&self) -> ThrottleStatus {
        let open = self.trips.iter().filter(|c| c.started_ns.is_some()).count()
            + self.caps.iter().filter(|c| c.started_ns.is_some()).count()
            + self.ocs.iter().filter(|c| c.started_ns.is_some()).count();
        ThrottleStatus {
            open_episodes: open,
            ..self.status
        }
    }

    fn advance(&mut self, now: Now) {
        let t = now.monotonic_ns;
        match self.last_ns {
            Some(last) if t > last => {
                let dt = t - last;
                if dt <= self.max_gap_ns {
                    for (seconds, throttled) in self.seconds.iter_mut().zip(self.throttled) {
                        if throttled {
                            *seconds += dt as f64 / 1e9;
                        }
                    }
                } else {
                    self.status.gaps += 1;
                }
                self.last_ns = Some(t);
            }
            Some(_) => {}
            None => self.last_ns = Some(t),
        }
    }

    fn nominal_khz(&self, component: Component, hardware_max_khz: Option<u64>) -> Option<u64> {
        let pick = |n: &NominalMax| match component {
            Component::Gpu => n.gpu_mhz,
            _ => n.cpu_mhz,
        };
        let configured = self
            .power_mode
            .and_then(|mode| self.per_power_mode.get(&mode))
            .and_then(pick)
            .or_else(|| pick(&self.nominal))
            .map(|mhz| u64::from(mhz) * 1_000);
        match (configured, hardware_max_khz) {
            (Some(c), Some(h)) => Some(c.min(h)),
            (c, h) => c.or(h),
        }
    }

    fn evaluate<S: EventSink + ?Sized>(&mut self, now: Now, sink: &mut S) {
        let t = now.monotonic_ns;
        let mut throttled = [false; 3];

        for trip in &mut self.trips {
            let celsius = self.zone_celsius.get(trip.zone).copied().flatten();
            match (trip.started_ns, celsius) {
                (None, Some(c)) if c >= trip.trip_celsius => {
                    trip.started_ns = Some(t);
                    emit_throttle(
                        &mut self.throttle_event,
                        sink,
                        now,
                        true,
                        &Fields {
                            component: trip.component,
                            cause: trip.cause,
                            source: &trip.source,
                            celsius: Some(c),
                            trip_celsius: Some(trip.trip_celsius),
                            cap_khz: None,
                            nominal_khz: None,
                            duration_seconds: None,
                        },
                    );
                }
                (Some(start), Some(c)) if c < trip.leave_below => {
                    trip.started_ns = None;
                    emit_throttle(
                        &mut self.throttle_event,
                        sink,
                        now,
                        false,
                        &Fields {
                            component: trip.component,
                            cause: trip.cause,
                            source: &trip.source,
                            celsius: Some(c),
                            trip_celsius: Some(trip.trip_celsius),
                            cap_khz: None,
                            nominal_khz: None,
                            duration_seconds: Some(seconds_between(start, t)),
                        },
                    );
                }
                _ => {}
            }
            throttled[slot(trip.component)] |= trip.started_ns.is_some();
        }

        for i in 0..self.caps.len() {
            let nominal = self.nominal_khz(self.caps[i].component, self.caps[i].hardware_max_khz);
            let cap = &mut self.caps[i];
            let capped = match (cap.cap_khz, nominal) {
                (Some(c), Some(n)) => Some(c.saturating_add(self.cap_tolerance_khz) < n),
                _ => None,
            };
            match (cap.started_ns, capped) {
                (None, Some(true)) => {
                    cap.started_ns = Some(t);
                    cap.nominal_khz = nominal;
                    emit_throttle(
                        &mut self.throttle_event,
                        sink,
                        now,
                        true,
                        &Fields {
                            component: cap.component,
                            cause: ThrottleCause::FrequencyCap,
                            source: &cap.source,
                            celsius: None,
                            trip_celsius: None,
                            cap_khz: cap.cap_khz,
                            nominal_khz: nominal,
                            duration_seconds: None,
                        },
                    );
                }
                (Some(start), Some(false)) => {
                    cap.started_ns = None;
                    emit_throttle(
                        &mut self.throttle_event,
                        sink,
                        now,
                        false,
                        &Fields {
                            component: cap.component,
                            cause: ThrottleCause::FrequencyCap,
                            source: &cap.source,
                            celsius: None,
                            trip_celsius: None,
                            cap_khz: cap.cap_khz,
                            nominal_khz: nominal,
                            duration_seconds: Some(seconds_between(start, t)),
                        },
                    );
                }
                _ => {}
            }
            throttled[slot(cap.component)] |= cap.started_ns.is_some();
        }

        for oc in &mut self.ocs {
            let holding = oc
                .last_increment_ns
                .is_some_and(|at| t < at.saturating_add(self.oc_hold_ns));
            match (oc.started_ns, holding) {
                (None, true) => {
                    oc.started_ns = Some(t);
                    emit_throttle(
                        &mut self.throttle_event,
                        sink,
                        now,
                        true,
                        &Fields {
                            component: Component::Soc,
                            cause: ThrottleCause::OverCurrent,
                            source: &oc.channel,
                            celsius: None,
                            trip_celsius: None,
                            cap_khz: None,
                            nominal_khz: None,
                            duration_seconds: None,
                        },
                    );
                }
                (Some(start), false) => {
                    oc.started_ns = None;
                    if oc.unreported > 0 {
                        let count = oc.count.unwrap_or_default();
                        emit_over_current(
                            &mut self.oc_event,
                            sink,
                            now,
                            &oc.channel,
                            count,
                            oc.unreported,
                        );
                        oc.unreported = 0;
                        oc.last_report_ns = Some(t);
                    }
                    emit_throttle(
                        &mut self.throttle_event,
                        sink,
                        now,
                        false,
                        &Fields {
                            component: Component::Soc,
                            cause: ThrottleCause::OverCurrent,
                            source: &oc.channel,
                            celsius: None,
                            trip_celsius: None,
                            cap_khz: None,
                            nominal_khz: None,
                            duration_seconds: Some(seconds_between(start, t)),
                        },
                    );
                }
                _ => {}
            }
            throttled[slot(Component::Soc)] |= oc.started_ns.is_some();
        }

        self.throttled = throttled;
    }
}

/// The tier of a throttle episode's events.
pub fn throttle_tier(cause: ThrottleCause) -> Tier {
    match cause {
        ThrottleCause::CriticalTrip | ThrottleCause::OverCurrent => Tier::Safety,
        ThrottleCause::PassiveTrip | ThrottleCause::FrequencyCap | ThrottleCause::Unspecified => {
            Tier::Slo
        }
    }
}

fn stamp(event: &mut Event, now: Now) {
    event.seq = 0;
    event.event_time_unix_ns = now.wall_unix_ns;
    event.monotonic_ns = now.monotonic_ns;
}

fn emit_throttle<S: EventSink + ?Sized>(
    event: &mut Event,
    sink: &mut S,
    now: Now,
    started: bool,
    fields: &Fields<'_>,
) {
    let mut throttle = match event.kind.take() {
        Some(Kind::ThrottleStarted(t) | Kind::ThrottleEnded(t)) => t,
        _ => Throttle::default(),
    };
    throttle.component = fields.component as i32;
    throttle.cause = fields.cause as i32;
    throttle.source.clear();
    throttle.source.push_str(fields.source);
    throttle.celsius = fields.celsius;
    throttle.trip_celsius = fields.trip_celsius;
    throttle.cap_mhz = mhz(fields.cap_khz);
    throttle.nominal_max_mhz = mhz(fields.nominal_khz);
    throttle.duration_seconds = fields.duration_seconds;
    stamp(event, now);
    event.kind = Some(if started {
        Kind::ThrottleStarted(throttle)
    } else {
        Kind::ThrottleEnded(throttle)
    });
    sink.emit(throttle_tier(fields.cause), event);
}

fn emit_over_current<S: EventSink + ?Sized>(
    event: &mut Event,
    sink: &mut S,
    now: Now,
    channel: &str,
    count: u64,
    delta: u64,
) {
    let mut oc = match event.kind.take() {
        Some(Kind::OverCurrent(oc)) => oc,
        _ => OverCurrent::default(),
    };
    oc.channel.clear();
    oc.channel.push_str(channel);
    oc.event_count = count;
    oc.delta = delta;
    stamp(event, now);
    event.kind = Some(Kind::OverCurrent(oc));
    sink.emit(Tier::Safety, event);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sink::CollectingSink;
    use crate::thermal::config::ThermalConfig;
    use crate::thermal::sysfs::{CpuPolicyInfo, FreqReading, GpuInfo, Trip, ZoneInfo};

    const S: u64 = 1_000_000_000;

    fn at(seconds: f64) -> Now {
        let ns = (seconds * 1e9) as u64;
        Now {
            wall_unix_ns: 1_700_000_000_000_000_000 + ns as i64,
            monotonic_ns: 1_000 * S + ns,
        }
    }

    fn config() -> ThrottleConfig {
        ThermalConfig::default().throttle
    }

    fn trip(index: u32, celsius: f64, kind: TripKind) -> Trip {
        Trip {
            index,
            celsius,
            kind,
            hysteresis_celsius: 0.0,
        }
    }

    fn inventory() -> SysfsInventory {
        SysfsInventory {
            zones: vec![
                ZoneInfo {
                    id: 0,
                    kind: "cpu-thermal".into(),
                    trips: vec![
                        trip(0, 50.0, TripKind::Active),
                        trip(1, 95.0, TripKind::Passive),
                        trip(2, 105.0, TripKind::Critical),
                    ],
                },
                ZoneInfo {
                    id: 1,
                    kind: "gpu-thermal".into(),
                    trips: vec![trip(0, 95.0, TripKind::Passive)],
                },
                ZoneInfo {
                    id: 2,
                    kind: "PMIC-Die".into(),
                    trips: vec![trip(0, 90.0, TripKind::Passive)],
                },
            ],
            cpu_policies: vec![
                CpuPolicyInfo {
                    name: "policy0".into(),
                    hardware_max_khz: Some(2_201_600),
                },
                CpuPolicyInfo {
                    name: "policy4".into(),
                    hardware_max_khz: Some(1_984_000),
                },
            ],
            gpu: Some(GpuInfo {
                device: "17000000.gpu".into(),
                hardware_max_khz: Some(1_300_500),
            }),
            oc_channels: vec!["oc1".into(), "oc2".into(), "oc3".into()],
            power_inputs: vec![],
        }
    }

    fn snapshot(inv: &SysfsInventory) -> SysfsSnapshot {
        let mut s = SysfsSnapshot::shaped_like(inv);
        for p in &mut s.cpu_policies {
            p.max_khz = Some(2_201_600);
        }
        s.cpu_policies[1].max_khz = Some(1_984_000);
        s.gpu = Some(FreqReading {
            cur_khz: Some(306_000),
            max_khz: Some(1_300_500),
        });
        s.oc_counts = vec![Some(0), Some(0), Some(100)];
        s.zone_celsius = vec![Some(60.0), Some(55.0), Some(100.0)];
        s
    }

    fn throttles(sink: &CollectingSink) -> Vec<(Tier, bool, Throttle)> {
        sink.events
            .iter()
            .filter_map(|(tier, e)| match &e.kind {
                Some(Kind::ThrottleStarted(t)) => Some((*tier, true, t.clone())),
                Some(Kind::ThrottleEnded(t)) => Some((*tier, false, t.clone())),
                _ => None,
            })
            .collect()
    }

    fn over_currents(sink: &CollectingSink) -> Vec<OverCurrent> {
        sink.events
            .iter()
            .filter_map(|(tier, e)| match &e.kind {
                Some(Kind::OverCurrent(oc)) => {
                    assert_eq!(*tier, Tier::Safety);
                    Some(oc.clone())
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn zone_names_map_to_components_by_prefix_with_overrides_first() {
        let none: &[(String, ZoneComponent)] = &[];
        assert_eq!(zone_component("cpu-thermal", none), ZoneComponent::Cpu);
        assert_eq!(zone_component("BCPU-therm", none), ZoneComponent::Cpu);
        assert_eq!(zone_component("gpu-thermal", none), ZoneComponent::Gpu);
        assert_eq!(zone_component("tj-thermal", none), ZoneComponent::Soc);
        assert_eq!(zone_component("soc0-thermal", none), ZoneComponent::Soc);
        assert_eq!(zone_component("PMIC-Die", none), ZoneComponent::Ignore);
        let overrides = [("tj".to_owned(), ZoneComponent::Cpu)];
        assert_eq!(zone_component("tj-thermal", &overrides), ZoneComponent::Cpu);
        assert_eq!(zone_short_name("Tboard_tegra"), "tboard");
        assert_eq!(zone_short_name("CPU-therm"), "cpu");
    }

    #[test]
    fn a_passive_trip_starts_an_slo_episode_and_ends_it_below_the_hysteresis_band() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        assert!(throttles(&sink).is_empty());

        // Dancing around 95 °C with the default 2 °C hysteresis: one episode, no flapping.
        for (i, celsius) in [95.0, 94.6, 95.3, 93.5, 94.9, 93.1].into_iter().enumerate() {
            snap.zone_celsius[0] = Some(celsius);
            d.observe_sysfs(&snap, at(1.0 + i as f64), &mut sink);
        }
        let events = throttles(&sink);
        assert_eq!(events.len(), 1, "only the start so far");
        let (tier, started, t) = &events[0];
        assert_eq!((*tier, *started), (Tier::Slo, true));
        assert_eq!(t.component, Component::Cpu as i32);
        assert_eq!(t.cause, ThrottleCause::PassiveTrip as i32);
        assert_eq!(t.source, "cpu-thermal");
        assert_eq!((t.celsius, t.trip_celsius), (Some(95.0), Some(95.0)));
        assert!(d.is_throttled(Component::Cpu));

        snap.zone_celsius[0] = Some(92.9);
        d.observe_sysfs(&snap, at(7.0), &mut sink);
        let events = throttles(&sink);
        assert_eq!(events.len(), 2);
        let (tier, started, t) = &events[1];
        assert_eq!((*tier, *started), (Tier::Slo, false));
        assert_eq!(t.duration_seconds, Some(6.0));
        assert_eq!(t.celsius, Some(92.9));
        assert!(!d.is_throttled(Component::Cpu));
        // Throttled from t=1 to t=7 by zero-order hold.
        assert_eq!(d.throttled_seconds(), [6.0, 0.0, 0.0]);
    }

    #[test]
    fn a_zones_own_hysteresis_wins_when_it_is_larger() {
        let mut inv = inventory();
        inv.zones[1].trips[0].hysteresis_celsius = 5.0;
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        snap.zone_celsius[1] = Some(96.0);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        snap.zone_celsius[1] = Some(91.0);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        assert!(
            d.is_throttled(Component::Gpu),
            "91 °C is inside a 5 °C band"
        );
        snap.zone_celsius[1] = Some(89.9);
        d.observe_sysfs(&snap, at(2.0), &mut sink);
        assert!(!d.is_throttled(Component::Gpu));
    }

    #[test]
    fn a_critical_trip_is_a_safety_episode_beside_the_passive_one() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        snap.zone_celsius[0] = Some(106.0);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        let events = throttles(&sink);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].0, Tier::Slo);
        assert_eq!(events[0].2.cause, ThrottleCause::PassiveTrip as i32);
        assert_eq!(events[1].0, Tier::Safety);
        assert_eq!(events[1].2.cause, ThrottleCause::CriticalTrip as i32);
        assert_eq!(events[1].2.trip_celsius, Some(105.0));
    }

    #[test]
    fn active_trips_and_ignored_zones_never_throttle() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        // 60 °C is above the cpu zone's active (fan) trip; PMIC reads 100 °C over a 90 °C trip.
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        snap.zone_celsius[2] = Some(120.0);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        assert!(throttles(&sink).is_empty());
    }

    #[test]
    fn an_unreadable_temperature_keeps_the_verdict() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        snap.zone_celsius[1] = Some(97.0);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        snap.zone_celsius[1] = None;
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        assert!(d.is_throttled(Component::Gpu));
        assert_eq!(throttles(&sink).len(), 1);
    }

    #[test]
    fn tegrastats_temperatures_update_zones_by_short_name_ignoring_case() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let line = "RAM 1/2MB CPU@96.5C gpu@-256C";
        let sample = tegrastats_parser::parse_line(line).unwrap();
        d.observe_temperatures(sample.temperatures(), at(0.0), &mut sink);
        assert!(d.is_throttled(Component::Cpu));
        assert!(!d.is_throttled(Component::Gpu));
        assert_eq!(throttles(&sink)[0].2.celsius, Some(96.5));
    }

    #[test]
    fn a_cap_below_the_hardware_maximum_throttles_until_it_is_lifted() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        snap.cpu_policies[0].max_khz = Some(1_497_600);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        snap.cpu_policies[0].max_khz = Some(2_201_600);
        d.observe_sysfs(&snap, at(4.0), &mut sink);
        let events = throttles(&sink);
        assert_eq!(events.len(), 2);
        let (tier, started, t) = &events[0];
        assert_eq!((*tier, *started), (Tier::Slo, true));
        assert_eq!(t.cause, ThrottleCause::FrequencyCap as i32);
        assert_eq!(t.source, "policy0");
        assert_eq!((t.cap_mhz, t.nominal_max_mhz), (Some(1497), Some(2201)));
        assert_eq!(events[1].2.duration_seconds, Some(3.0));
        assert_eq!(d.throttled_seconds(), [3.0, 0.0, 0.0]);
    }

    #[test]
    fn the_nominal_maximum_follows_the_power_mode_and_never_exceeds_the_hardware() {
        let mut cfg = config();
        cfg.nominal = NominalMax {
            cpu_mhz: Some(2201),
            gpu_mhz: Some(1300),
        };
        cfg.per_power_mode.insert(
            2,
            NominalMax {
                cpu_mhz: Some(1497),
                gpu_mhz: None,
            },
        );
        let inv = inventory();
        let mut d = ThrottleDetector::new(&cfg, &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        // policy4's hardware maximum (1984 MHz) is below the configured 2201: not a cap.
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        assert!(throttles(&sink).is_empty());
        // Mode 2 caps the CPU at 1497 MHz by design; the GPU falls back to the default 1300.
        snap.power_mode = Some(2);
        snap.cpu_policies[0].max_khz = Some(1_497_600);
        snap.cpu_policies[1].max_khz = Some(1_497_600);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        assert!(throttles(&sink).is_empty());
        snap.gpu = Some(FreqReading {
            cur_khz: None,
            max_khz: Some(612_000),
        });
        d.observe_sysfs(&snap, at(2.0), &mut sink);
        let events = throttles(&sink);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].2.component, Component::Gpu as i32);
        assert_eq!(events[0].2.source, "17000000.gpu");
        assert_eq!(
            (events[0].2.cap_mhz, events[0].2.nominal_max_mhz),
            (Some(612), Some(1300))
        );
        // Back to mode 0 with the mode-2 CPU cap still written: now it is a cap.
        snap.power_mode = Some(0);
        d.observe_sysfs(&snap, at(3.0), &mut sink);
        assert_eq!(throttles(&sink).len(), 3);
    }

    #[test]
    fn a_cap_within_the_tolerance_is_rounding_not_throttling() {
        let mut cfg = config();
        cfg.nominal.cpu_mhz = Some(2202);
        let mut inv = inventory();
        inv.cpu_policies[0].hardware_max_khz = None;
        let mut d = ThrottleDetector::new(&cfg, &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        // 2201.6 MHz read against a nominal of 2202 configured: within 1 MHz.
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        assert!(throttles(&sink).is_empty());
        // 2200.9 MHz is more than 1 MHz below.
        snap.cpu_policies[0].max_khz = Some(2_200_900);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        assert_eq!(throttles(&sink).len(), 1);
    }

    #[test]
    fn an_over_current_increment_is_a_safety_report_and_episode_held_for_the_hold_time() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        assert!(
            over_currents(&sink).is_empty(),
            "the first read is a baseline"
        );
        snap.oc_counts[2] = Some(104);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        let ocs = over_currents(&sink);
        assert_eq!(ocs.len(), 1);
        assert_eq!(
            (ocs[0].channel.as_str(), ocs[0].event_count, ocs[0].delta),
            ("oc3", 104, 4)
        );
        let events = throttles(&sink);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].0, Tier::Safety);
        assert_eq!(events[0].2.component, Component::Soc as i32);
        assert_eq!(events[0].2.cause, ThrottleCause::OverCurrent as i32);
        // The OverCurrent report comes before the episode's start.
        let kinds: Vec<bool> = sink
            .events
            .iter()
            .map(|(_, e)| matches!(e.kind, Some(Kind::OverCurrent(_))))
            .collect();
        assert_eq!(kinds, [true, false]);

        d.tick(at(1.5), &mut sink);
        assert!(d.is_throttled(Component::Soc), "inside the 1 s hold");
        d.observe_sysfs(&snap, at(2.0), &mut sink);
        let events = throttles(&sink);
        assert_eq!(events.len(), 2);
        assert_eq!((events[1].0, events[1].1), (Tier::Safety, false));
        assert_eq!(events[1].2.duration_seconds, Some(1.0));
        assert_eq!(d.throttled_seconds(), [0.0, 0.0, 1.0]);
    }

    #[test]
    fn continuous_over_current_is_one_episode_with_rate_limited_reports_whose_deltas_sum_up() {
        let mut cfg = config();
        cfg.oc_report_interval = Duration::from_secs(10);
        let inv = inventory();
        let mut d = ThrottleDetector::new(&cfg, &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        let mut count = 100;
        for second in 1..=25 {
            count += 3;
            snap.oc_counts[2] = Some(count);
            d.observe_sysfs(&snap, at(f64::from(second)), &mut sink);
        }
        d.observe_sysfs(&snap, at(26.0), &mut sink);
        let ocs = over_currents(&sink);
        // At 1 (first), 11, 21, then what is left at the end.
        assert_eq!(ocs.len(), 4);
        assert_eq!(ocs.iter().map(|oc| oc.delta).sum::<u64>(), 75);
        assert_eq!(ocs.last().unwrap().event_count, 175);
        assert_eq!(throttles(&sink).len(), 2, "one episode");
        assert_eq!(d.throttled_seconds()[2], 25.0);
    }

    #[test]
    fn a_counter_that_goes_down_is_a_new_baseline_not_an_event() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        snap.oc_counts[2] = Some(3);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        assert!(sink.events.is_empty());
        assert_eq!(d.status().oc_counter_resets, 1);
        snap.oc_counts[2] = Some(5);
        d.observe_sysfs(&snap, at(2.0), &mut sink);
        assert_eq!(over_currents(&sink)[0].delta, 2);
    }

    #[test]
    fn an_interval_longer_than_the_largest_gap_is_not_counted_as_throttled() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        snap.zone_celsius[1] = Some(97.0);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        d.observe_sysfs(&snap, at(1.0), &mut sink);
        // 30 s without a sample (the default max gap is 5 s).
        d.observe_sysfs(&snap, at(31.0), &mut sink);
        d.observe_sysfs(&snap, at(32.0), &mut sink);
        assert_eq!(d.throttled_seconds(), [0.0, 2.0, 0.0]);
        assert_eq!(d.status().gaps, 1);
    }

    #[test]
    fn overlapping_causes_count_a_components_time_once() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        snap.zone_celsius[0] = Some(96.0);
        snap.cpu_policies[0].max_khz = Some(1_000_000);
        d.observe_sysfs(&snap, at(0.0), &mut sink);
        d.observe_sysfs(&snap, at(4.0), &mut sink);
        assert_eq!(throttles(&sink).len(), 2);
        assert_eq!(d.throttled_seconds(), [4.0, 0.0, 0.0]);
        assert_eq!(d.status().open_episodes, 2);
    }

    #[test]
    fn time_that_runs_backwards_is_ignored() {
        let inv = inventory();
        let mut d = ThrottleDetector::new(&config(), &inv);
        let mut sink = CollectingSink::default();
        let mut snap = snapshot(&inv);
        snap.zone_celsius[1] = Some(97.0);
        d.observe_sysfs(&snap, at(5.0), &mut sink);
        d.observe_sysfs(&snap, at(4.0), &mut sink);
        d.observe_sysfs(&snap, at(6.0), &mut sink);
        assert_eq!(d.throttled_seconds(), [0.0, 1.0, 0.0]);
    }
}
