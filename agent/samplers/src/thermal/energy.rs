//! Energy per power rail: integrates sampled rail power (tegrastats rails, configured sysfs
//! inputs) into cumulative joules. Pure logic, time as an argument.
//!
//! **Rule.** Between two samples of one rail, at `t0` and `t1` with powers `p0` and `p1` (mW),
//! the rail used `(p0 + p1) / 2 × (t1 − t0)` (the trapezoid rule on CLOCK_MONOTONIC); the
//! first sample of a rail, or the first after a break, integrates nothing.
//!
//! **Rail names.** A rail keeps its printed (or configured) name. Later rails of the same name
//! on one tegrastats line (AGX Orin prints `NC` twice) are kept apart as `NAME#2`, `NAME#3`, ...
//! in line order; a tegrastats rail whose name is already taken by a configured sysfs input gets
//! the next free `#n`. Sysfs inputs are registered first, in configuration order, so the labels
//! are the same on every start.
//!
//! Invariants:
//! - An interval longer than `max_gap` is not integrated and is counted in
//!   [`EnergyStatus::gaps`]; a sample at or before its rail's previous one is ignored.
//! - A tegrastats exit breaks continuity of its rails ([`EnergyIntegrator::break_tegrastats`]):
//!   the first line of the next run integrates nothing. A replay that loops does not.
//! - Joules only grow within a series; [`EnergyIntegrator::reset_totals`] starts a new one.
//! - At most [`MAX_ENERGY_RAILS`] rails are kept; further names are counted in
//!   [`EnergyStatus::rails_dropped`], so a stream of novel names cannot grow memory.
//! - Once every rail has been seen, observing does not allocate.

use std::fmt::Write as _;

use tegrastats_parser::Rail;

use super::config::EnergyConfig;
use crate::sink::Now;

/// Most rails kept (the largest rail set observed has 6, plus sysfs inputs).
pub const MAX_ENERGY_RAILS: usize = 32;

/// Where a rail's samples come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RailSource {
    /// The `occurrence`-th (0-based) rail printed as `printed` on a tegrastats line.
    Tegrastats { printed: String, occurrence: usize },
    /// The configured sysfs power input at this index.
    Sysfs(usize),
}

#[derive(Debug)]
struct RailState {
    label: String,
    source: RailSource,
    previous: Option<(u64, f64)>,
    joules: f64,
}

/// Counters of the integrator's own bookkeeping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnergyStatus {
    /// Intervals not integrated because they were longer than `max_gap`.
    pub gaps: u64,
    /// tegrastats exits that broke the continuity of its rails.
    pub continuity_breaks: u64,
    /// Rail names refused because [`MAX_ENERGY_RAILS`] were already kept.
    pub rails_dropped: u64,
    /// Rails kept.
    pub rails: usize,
}

/// Cumulative joules per rail.
#[derive(Debug)]
pub struct EnergyIntegrator {
    max_gap_ns: u64,
    rails: Vec<RailState>,
    status: EnergyStatus,
}

/// Writes the label of the `occurrence`-th (0-based) rail named `name` on a line:
/// `name`, then `name#2`, `name#3`, ...
pub fn occurrence_label(out: &mut String, name: &str, occurrence: usize) {
    out.clear();
    out.push_str(name);
    if occurrence > 0 {
        // Writing into a String cannot fail.
        let _ = write!(out, "#{}", occurrence + 1);
    }
}

/// How many rails before `index` on the line have the same name.
pub fn occurrence_of(rails: &[Rail<&str>], index: usize) -> usize {
    let Some(rail) = rails.get(index) else {
        return 0;
    };
    rails
        .iter()
        .take(index)
        .filter(|other| other.name == rail.name)
        .count()
}

impl EnergyIntegrator {
    /// An integrator with the configured sysfs `power_inputs` registered first.
    pub fn new(config: &EnergyConfig, power_inputs: &[String]) -> Self {
        let mut integrator = Self {
            max_gap_ns: u64::try_from(config.max_gap.as_nanos()).unwrap_or(u64::MAX),
            rails: Vec::with_capacity(MAX_ENERGY_RAILS),
            status: EnergyStatus::default(),
        };
        for (i, rail) in power_inputs.iter().enumerate() {
            integrator.register(rail, 0, RailSource::Sysfs(i));
        }
        integrator
    }

    /// Integrates the rails of one tegrastats line sampled at `now`.
    pub fn observe_tegrastats(&mut self, rails: &[Rail<&str>], now: Now) {
        for (i, rail) in rails.iter().enumerate() {
            let occurrence = occurrence_of(rails, i);
            let found = self.rails.iter().position(|state| {
                matches!(&state.source, RailSource::Tegrastats { printed, occurrence: k }
                    if printed == rail.name && *k == occurrence)
            });
            let index = match found {
                Some(index) => Some(index),
                None => self.register(
                    rail.name,
                    occurrence,
                    RailSource::Tegrastats {
                        printed: rail.name.to_owned(),
                        occurrence,
                    },
                ),
            };
            if let Some(index) = index {
                self.integrate(index, now.monotonic_ns, f64::from(rail.current_mw));
            }
        }
    }

    /// Integrates the configured sysfs power inputs (mW, index-aligned with the configuration)
    /// read at `now`; unreadable ones are skipped.
    pub fn observe_power_inputs(&mut self, power_mw: &[Option<f64>], now: Now) {
        for i in 0..self.rails.len() {
            if let RailSource::Sysfs(input) = self.rails[i].source
                && let Some(Some(mw)) = power_mw.get(input)
            {
                self.integrate(i, now.monotonic_ns, *mw);
            }
        }
    }

    /// tegrastats stopped: its next line starts a new integration for each of its rails.
    pub fn break_tegrastats(&mut self) {
        for rail in &mut self.rails {
            if matches!(rail.source, RailSource::Tegrastats { .. }) {
                rail.previous = None;
            }
        }
        self.status.continuity_breaks += 1;
    }

    /// The rails and their joules, in registration order.
    pub fn rails(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.rails.iter().map(|r| (r.label.as_str(), r.joules))
    }

    /// Whether any rail has accumulated energy in this series.
    pub fn has_energy(&self) -> bool {
        self.rails.iter().any(|r| r.joules > 0.0)
    }

    /// Starts the totals over from zero (a new counter series); integration goes on from the
    /// last samples.
    pub fn reset_totals(&mut self) {
        for rail in &mut self.rails {
            rail.joules = 0.0;
        }
    }

    /// The integrator's bookkeeping counters.
    pub fn status(&self) -> EnergyStatus {
        EnergyStatus {
            rails: self.rails.len(),
            ..self.status
        }
    }

    fn register(&mut self, name: &str, occurrence: usize, source: RailSource) -> Option<usize> {
        if self.rails.len() >= MAX_ENERGY_RAILS {
            self.status.rails_dropped += 1;
            return None;
        }
        let mut label = String::new();
        occurrence_label(&mut label, name, occurrence);
        let mut n = occurrence + 2;
        while self.rails.iter().any(|r| r.label == label) {
            occurrence_label(&mut label, name, n - 1);
            n += 1;
        }
        self.rails.push(RailState {
            label,
            source,
            previous: None,
            joules: 0.0,
        });
        Some(self.rails.len() - 1)
    }

    fn integrate(&mut self, index: usize, t: u64, mw: f64) {
        let Some(rail) = self.rails.get_mut(index) else {
            return;
        };
        if let Some((t0, p0)) = rail.previous {
            if t <= t0 {
                return;
            }
            let dt = t - t0;
            if dt <= self.max_gap_ns {
                rail.joules += (p0 + mw) / 2.0 * (dt as f64 / 1e9) / 1_000.0;
            } else {
                self.status.gaps += 1;
            }
        }
        rail.previous = Some((t, mw));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(seconds: f64) -> Now {
        Now {
            wall_unix_ns: 0,
            monotonic_ns: 5_000_000_000 + (seconds * 1e9) as u64,
        }
    }

    fn integrator(inputs: &[&str]) -> EnergyIntegrator {
        let inputs: Vec<String> = inputs.iter().map(|s| (*s).to_owned()).collect();
        EnergyIntegrator::new(
            &EnergyConfig {
                max_gap: Duration::from_secs(5),
            },
            &inputs,
        )
    }

    fn joules(e: &EnergyIntegrator) -> Vec<(String, f64)> {
        e.rails().map(|(l, j)| (l.to_owned(), j)).collect()
    }

    fn line(text: &str) -> tegrastats_parser::Sample<'_> {
        tegrastats_parser::parse_line(text).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn rail_power_is_integrated_by_the_trapezoid_rule() {
        let mut e = integrator(&[]);
        e.observe_tegrastats(line("RAM 1/2MB VDD_IN 1000mW/1000mW").rails(), at(0.0));
        assert_eq!(joules(&e), [("VDD_IN".to_owned(), 0.0)]);
        e.observe_tegrastats(line("RAM 1/2MB VDD_IN 3000mW/2000mW").rails(), at(2.0));
        // (1 W + 3 W) / 2 × 2 s = 4 J
        assert!(close(joules(&e)[0].1, 4.0));
        e.observe_tegrastats(line("RAM 1/2MB VDD_IN 3000mW/2000mW").rails(), at(2.5));
        assert!(close(joules(&e)[0].1, 5.5));
    }

    #[test]
    fn a_gap_longer_than_the_limit_is_not_integrated_and_is_counted() {
        let mut e = integrator(&[]);
        let l = line("RAM 1/2MB VDD_IN 2000mW/2000mW");
        e.observe_tegrastats(l.rails(), at(0.0));
        e.observe_tegrastats(l.rails(), at(1.0));
        e.observe_tegrastats(l.rails(), at(7.0));
        e.observe_tegrastats(l.rails(), at(8.0));
        assert!(close(joules(&e)[0].1, 4.0));
        assert_eq!(e.status().gaps, 1);
        // Exactly at the limit still counts.
        e.observe_tegrastats(l.rails(), at(13.0));
        assert!(close(joules(&e)[0].1, 14.0));
    }

    #[test]
    fn a_tegrastats_restart_breaks_continuity_but_sysfs_inputs_go_on() {
        let mut e = integrator(&["VDD_SYS"]);
        let l = line("RAM 1/2MB VDD_IN 2000mW/2000mW");
        e.observe_tegrastats(l.rails(), at(0.0));
        e.observe_power_inputs(&[Some(1000.0)], at(0.0));
        e.break_tegrastats();
        e.observe_tegrastats(l.rails(), at(1.0));
        e.observe_power_inputs(&[Some(1000.0)], at(1.0));
        e.observe_tegrastats(l.rails(), at(2.0));
        assert_eq!(
            joules(&e)
                .iter()
                .map(|(l, _)| l.as_str())
                .collect::<Vec<_>>(),
            ["VDD_SYS", "VDD_IN"]
        );
        assert!(close(joules(&e)[0].1, 1.0));
        assert!(close(joules(&e)[1].1, 2.0), "only t=1..2");
        assert_eq!(e.status().continuity_breaks, 1);
    }

    #[test]
    fn duplicate_rail_names_on_a_line_are_kept_apart_in_line_order() {
        let mut e = integrator(&[]);
        let text = "RAM 1/2MB NC 100mW/0mW VDD_GPU_SOC 4788mW/4788mW NC 300mW/0mW";
        e.observe_tegrastats(line(text).rails(), at(0.0));
        e.observe_tegrastats(line(text).rails(), at(1.0));
        let j = joules(&e);
        assert_eq!(
            j.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(),
            ["NC", "VDD_GPU_SOC", "NC#2"]
        );
        assert!(close(j[0].1, 0.1) && close(j[1].1, 4.788) && close(j[2].1, 0.3));
    }

    #[test]
    fn a_tegrastats_rail_named_like_a_sysfs_input_takes_the_next_free_suffix() {
        let mut e = integrator(&["VDD_IN"]);
        e.observe_tegrastats(
            line("RAM 1/2MB VDD_IN 1mW/1mW VDD_IN 2mW/2mW").rails(),
            at(0.0),
        );
        let labels: Vec<String> = joules(&e).into_iter().map(|(l, _)| l).collect();
        assert_eq!(labels, ["VDD_IN", "VDD_IN#2", "VDD_IN#3"]);
    }

    #[test]
    fn unreadable_sysfs_inputs_are_skipped_and_samples_out_of_order_ignored() {
        let mut e = integrator(&["A"]);
        e.observe_power_inputs(&[Some(1000.0)], at(0.0));
        e.observe_power_inputs(&[None], at(1.0));
        e.observe_power_inputs(&[Some(1000.0)], at(2.0));
        e.observe_power_inputs(&[Some(9000.0)], at(1.5));
        e.observe_power_inputs(&[Some(9000.0)], at(2.0));
        assert!(close(joules(&e)[0].1, 2.0));
    }

    #[test]
    fn at_most_the_capacity_of_rails_is_kept() {
        let mut e = integrator(&[]);
        // A line holds at most the parser's 32 rails: novel names arrive over two lines.
        let text = |prefix: &str, n: usize| -> String {
            std::iter::once("RAM 1/2MB".to_owned())
                .chain((0..n).map(|i| format!(" {prefix}{i} 1mW/1mW")))
                .collect()
        };
        let (first, second) = (text("R", MAX_ENERGY_RAILS - 2), text("S", 5));
        e.observe_tegrastats(line(&first).rails(), at(0.0));
        e.observe_tegrastats(line(&second).rails(), at(1.0));
        assert_eq!(e.status().rails, MAX_ENERGY_RAILS);
        assert_eq!(e.status().rails_dropped, 3);
    }

    #[test]
    fn resetting_totals_keeps_integrating_from_the_last_sample() {
        let mut e = integrator(&[]);
        let l = line("RAM 1/2MB VDD_IN 2000mW/2000mW");
        e.observe_tegrastats(l.rails(), at(0.0));
        e.observe_tegrastats(l.rails(), at(1.0));
        assert!(e.has_energy());
        e.reset_totals();
        assert!(!e.has_energy());
        e.observe_tegrastats(l.rails(), at(2.0));
        assert!(close(joules(&e)[0].1, 2.0));
    }
}
