//! The demo's fleet and its timeline: which machines exist, what each one's control loop
//! injects, and when the partition and the heat wave happen. Pure: no I/O, no clock; every
//! time is an offset from the moment the control loops start.
//!
//! Invariants:
//! - Everything scales with the run's duration, so a shortened run (tests) shows the same story.
//! - Each machine plays one role; the roles together cover deadline misses of every kind
//!   (overruns, late starts, a hang) and fallbacks, autonomy modes and interventions, thermal
//!   throttling, a partition that heals, and an agent killed and started again.
//! - Machines differ in class, site and model version, so the report has several rows.
//! - Every loop parks (`mode idle`) in its last activation: its autonomous time ends at an
//!   instant the loop and its probe share, not at the loop's exit, which no agent can see (an
//!   agent closes a dead loop's time at its last heartbeat). So the report can equal the loop's
//!   own tally exactly.
//! - Nothing is scripted in the last activations but the parking: a skip or hang there would
//!   not be seen by the probe (it counts a skip when the next cycle records).

use std::time::Duration;

/// Control-loop rate of every machine: 25 Hz.
pub const LOOP_RATE_HZ: u32 = 25;
/// Per-cycle budget: 40 ms, the whole period.
pub const LOOP_BUDGET_MS: u32 = 40;
/// Loop name: the built-in SLO catalog's `safety-control` SLO selects `loop="safety"`.
pub const LOOP_NAME: &str = "safety";
/// The perception model every machine runs, in two versions.
pub const MODEL: &str = "pit-perception";
/// Shortest run the timeline makes sense for: the partition must outlast the agent's keepalive.
pub const MIN_DURATION: Duration = Duration::from_secs(24);
/// Longest run accepted.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// A real tegrastats capture from the parser's fixtures, replayed by one machine's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    /// File name under `agent/tegrastats-parser/tests/data/`.
    pub name: &'static str,
    /// Its lines, verbatim.
    pub text: &'static str,
}

/// AGX Orin 64 GB, JetPack 6: four lines.
pub const ORIN_AGX_JP6: Capture = Capture {
    name: "orin-agx-64gb_jp6.x_l4t-r36.txt",
    text: include_str!(
        "../../../agent/tegrastats-parser/tests/data/orin-agx-64gb_jp6.x_l4t-r36.txt"
    ),
};
/// AGX Orin 64 GB, JetPack 6.2.1: two lines.
pub const ORIN_AGX_JP621: Capture = Capture {
    name: "orin-agx-64gb_jp6.2.1_l4t-r36.4.4.txt",
    text: include_str!(
        "../../../agent/tegrastats-parser/tests/data/orin-agx-64gb_jp6.2.1_l4t-r36.4.4.txt"
    ),
};
/// Jetson Thor, JetPack 7.1: three lines.
pub const THOR_JP71: Capture = Capture {
    name: "thor_jp7.1_l4t-r38.4.txt",
    text: include_str!("../../../agent/tegrastats-parser/tests/data/thor_jp7.1_l4t-r38.4.txt"),
};
/// Orin Nano 8 GB, JetPack 6: four lines.
pub const ORIN_NANO_JP6: Capture = Capture {
    name: "orin-nano-8gb_jp6.x_l4t-r36.txt",
    text: include_str!(
        "../../../agent/tegrastats-parser/tests/data/orin-nano-8gb_jp6.x_l4t-r36.txt"
    ),
};

/// Activations a loop runs for `duration` at [`LOOP_RATE_HZ`]: the synthetic loop's own
/// arithmetic for `--duration <ms>ms` (seconds times rate, rounded down).
pub fn activations(duration: Duration) -> u64 {
    (duration.as_millis() as f64 * 1e-3 * f64::from(LOOP_RATE_HZ)).floor() as u64
}

/// What a machine shows in the demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Deadline misses of every kind: sporadic and bursty overruns, a burst of late starts and
    /// a short hang; each burst ends in a fallback to the safety controller. Its agent is killed
    /// mid-run and started again.
    Overruns,
    /// Its link to the broker goes through a fault proxy that is blackholed for a while, then
    /// healed; the agent queues on disk meanwhile and drains afterwards.
    Partitioned,
    /// Autonomy-mode changes: operator interventions, a safe stop, teleoperation.
    Autonomy,
    /// Its (fake) GPU thermal zone is heated past its passive trip point for a while.
    Throttling,
}

impl Role {
    /// One line for the terminal.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Overruns => {
                "deadline misses (overruns, late starts, a hang), fallbacks; agent killed and restarted"
            }
            Self::Partitioned => "link cut off for a while, then healed",
            Self::Autonomy => "operator interventions, a safe stop, teleoperation",
            Self::Throttling => "GPU heated past its passive trip point",
        }
    }
}

/// One simulated machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// Machine id (MQTT client id, topic level, `machine_id` label).
    pub id: &'static str,
    /// Machine class.
    pub class: &'static str,
    /// Site.
    pub site: &'static str,
    /// Model version its manifest names.
    pub model_version: &'static str,
    /// What it shows.
    pub role: Role,
    /// The capture its agent replays.
    pub capture: Capture,
    /// The synthetic loop's pattern rules, one per line.
    pub script: Vec<String>,
}

/// A stretch of the run, as offsets from the loops' start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// When it begins.
    pub start: Duration,
    /// When it ends.
    pub end: Duration,
}

/// The whole scenario for one run length.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// How long the control loops run.
    pub duration: Duration,
    /// The fleet.
    pub machines: Vec<Machine>,
    /// When the partitioned machine's link is blackholed.
    pub partition: Span,
    /// When the throttling machine's GPU zone is above its trip point.
    pub heat: Span,
    /// When the overrunning machine's agent is down: SIGKILLed at the start, started again at
    /// the end, while its loop keeps running.
    pub agent_down: Span,
}

/// Why a run length was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--duration: {0:?} is out of range ({MIN_DURATION:?} to {MAX_DURATION:?})")]
pub struct DurationOutOfRange(pub Duration);

/// Fractions of the run at which things happen.
mod at {
    pub const PARTITION: (f64, f64) = (0.25, 0.55);
    pub const HEAT: (f64, f64) = (0.35, 0.65);
    /// The overrunning machine's agent is killed, then started again.
    pub const AGENT_DOWN: (f64, f64) = (0.45, 0.55);
    /// First overrun burst (and its fallback) of the overrunning machine.
    pub const BURST_1: f64 = 0.30;
    /// Its burst of late starts (and a fallback), while its agent is down.
    pub const LATE_BURST: f64 = 0.50;
    /// Its hang, after its agent is back.
    pub const HANG: f64 = 0.60;
    /// Second overrun burst.
    pub const BURST_2: f64 = 0.75;
    /// The partitioned machine's own short burst, while it is cut off.
    pub const OFFLINE_BURST: f64 = 0.40;
    /// Autonomy timeline of the autonomy machine: (fraction, rules at that time).
    pub const AUTONOMY: [(f64, &[&str]); 6] = [
        (0.25, &["intervention", "mode manual"]),
        (0.38, &["mode autonomous"]),
        (0.55, &["safe-stop", "mode teleoperated"]),
        (0.66, &["mode autonomous"]),
        (0.80, &["intervention", "mode manual"]),
        (0.88, &["mode autonomous"]),
    ];
}

impl Plan {
    /// The scenario for loops running `duration`.
    pub fn new(duration: Duration) -> Result<Self, DurationOutOfRange> {
        if !(MIN_DURATION..=MAX_DURATION).contains(&duration) {
            return Err(DurationOutOfRange(duration));
        }
        let time = |fraction: f64| {
            Duration::from_millis((duration.as_secs_f64() * fraction * 1000.0).round() as u64)
        };
        let cycle = |fraction: f64| {
            (duration.as_secs_f64() * fraction * f64::from(LOOP_RATE_HZ)).round() as u64
        };
        let ms = |fraction: f64| time(fraction).as_millis();

        let burst_1 = cycle(at::BURST_1);
        let late = cycle(at::LATE_BURST);
        let burst_2 = cycle(at::BURST_2);
        let overruns = vec![
            "mode autonomous at 0s".to_owned(),
            // Sporadic misses: a cycle 30 % over budget now and then.
            "overrun 1.3x every 211 from 150".to_owned(),
            format!("overrun 2x at cycles {burst_1}..{}", burst_1 + 6),
            format!("fallback at cycle {}", burst_1 + 6),
            // Late wake-ups: each step is short but completes past its deadline (45 ms after
            // a 40 ms deadline's release): deadline misses that are no overruns.
            format!("late-start 45ms at cycles {late}..{}", late + 5),
            format!("fallback at cycle {}", late + 5),
            // No record and no heartbeat for 600 ms: 15 skipped activations, counted while
            // the loop hangs.
            format!("hang 600ms at cycle {}", cycle(at::HANG)),
            format!("overrun 2.5x at cycles {burst_2}..{}", burst_2 + 4),
            format!("fallback at cycle {}", burst_2 + 4),
        ];
        let offline = cycle(at::OFFLINE_BURST);
        let partitioned = vec![
            "mode autonomous at 0s".to_owned(),
            format!("overrun 2x at cycles {offline}..{}", offline + 3),
        ];
        let mut autonomy = vec!["mode autonomous at 0s".to_owned()];
        for (fraction, rules) in at::AUTONOMY {
            for rule in rules {
                autonomy.push(format!("{rule} at {}ms", ms(fraction)));
            }
        }
        let throttling = vec!["mode autonomous at 0s".to_owned()];
        // Every machine parks in its last activation (see the module's invariants).
        let park = format!(
            "mode idle at cycle {}",
            activations(duration).saturating_sub(1)
        );
        let [overruns, partitioned, autonomy, throttling] =
            [overruns, partitioned, autonomy, throttling].map(|mut script| {
                script.push(park.clone());
                script
            });

        let machines = vec![
            Machine {
                id: "truck-101",
                class: "haul-truck",
                site: "north-pit",
                model_version: "4.2.1",
                role: Role::Overruns,
                capture: ORIN_AGX_JP6,
                script: overruns,
            },
            Machine {
                id: "truck-102",
                class: "haul-truck",
                site: "north-pit",
                model_version: "4.2.1",
                role: Role::Partitioned,
                capture: ORIN_AGX_JP621,
                script: partitioned,
            },
            Machine {
                id: "excavator-201",
                class: "excavator",
                site: "south-pit",
                model_version: "4.3.0",
                role: Role::Autonomy,
                capture: THOR_JP71,
                script: autonomy,
            },
            Machine {
                id: "grader-301",
                class: "grader",
                site: "south-pit",
                model_version: "4.2.1",
                role: Role::Throttling,
                capture: ORIN_NANO_JP6,
                script: throttling,
            },
        ];
        Ok(Self {
            duration,
            machines,
            partition: Span {
                start: time(at::PARTITION.0),
                end: time(at::PARTITION.1),
            },
            heat: Span {
                start: time(at::HEAT.0),
                end: time(at::HEAT.1),
            },
            agent_down: Span {
                start: time(at::AGENT_DOWN.0),
                end: time(at::AGENT_DOWN.1),
            },
        })
    }

    /// The machine playing `role`.
    pub fn machine(&self, role: Role) -> Option<&Machine> {
        self.machines.iter().find(|m| m.role == role)
    }

    /// Autonomous seconds the scripts plan for the machines running `version` (`None`: all),
    /// used to size the demo's cost shares.
    pub fn planned_autonomous_seconds(&self, version: Option<&str>) -> f64 {
        let total = self.duration.as_secs_f64();
        let manual: f64 = at::AUTONOMY
            .windows(2)
            .filter(|pair| !pair[0].1.contains(&"mode autonomous"))
            .map(|pair| (pair[1].0 - pair[0].0) * total)
            .sum();
        self.machines
            .iter()
            .filter(|m| version.is_none_or(|v| v == m.model_version))
            .map(|m| match m.role {
                Role::Autonomy => total - manual,
                _ => total,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seconds: u64) -> Plan {
        Plan::new(Duration::from_secs(seconds)).unwrap()
    }

    #[test]
    fn every_role_is_played_by_exactly_one_machine() {
        let plan = plan(90);
        for role in [
            Role::Overruns,
            Role::Partitioned,
            Role::Autonomy,
            Role::Throttling,
        ] {
            assert_eq!(
                plan.machines.iter().filter(|m| m.role == role).count(),
                1,
                "{role:?}"
            );
        }
    }

    #[test]
    fn the_fleet_spans_several_classes_sites_and_model_versions() {
        let plan = plan(90);
        let distinct = |f: fn(&Machine) -> &str| {
            plan.machines
                .iter()
                .map(f)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        assert!(distinct(|m| m.class) >= 3);
        assert!(distinct(|m| m.site) >= 2);
        assert!(distinct(|m| m.model_version) >= 2);
        assert!(plan.machines.len() >= 3);
    }

    #[test]
    fn the_timeline_scales_with_the_duration() {
        let short = plan(40);
        let long = plan(120);
        assert_eq!(short.partition.start * 3, long.partition.start);
        assert_eq!(short.heat.end * 3, long.heat.end);
        let bursts = |p: &Plan| p.machine(Role::Overruns).unwrap().script[2].clone();
        assert_eq!(bursts(&short), "overrun 2x at cycles 300..306");
        assert_eq!(bursts(&long), "overrun 2x at cycles 900..906");
    }

    #[test]
    fn the_partition_outlasts_the_agents_keepalive_even_in_the_shortest_run() {
        let plan = Plan::new(MIN_DURATION).unwrap();
        let partition = plan.partition.end - plan.partition.start;
        // Keepalive 5 s: the agent notices the dead link within 7.5 s and must then wait.
        assert!(partition >= Duration::from_secs(7), "{partition:?}");
    }

    #[test]
    fn the_offline_burst_falls_inside_the_partition() {
        let plan = plan(90);
        let burst = Duration::from_secs_f64(90.0 * at::OFFLINE_BURST);
        assert!(plan.partition.start < burst && burst < plan.partition.end);
    }

    #[test]
    fn planned_autonomy_leaves_out_the_manual_and_teleoperated_stretches() {
        let plan = plan(100);
        // Manual 25 %→38 %, teleoperated 55 %→66 %, manual 80 %→88 %: 32 s of 100.
        let all = plan.planned_autonomous_seconds(None);
        assert!((all - (400.0 - 32.0)).abs() < 1e-6, "{all}");
        let newer = plan.planned_autonomous_seconds(Some("4.3.0"));
        assert!((newer - 68.0).abs() < 1e-6, "{newer}");
    }

    #[test]
    fn every_loop_parks_in_its_last_activation_and_nothing_else_is_scripted_near_it() {
        for seconds in [24, 36, 90, 3600] {
            let plan = plan(seconds);
            let last = activations(plan.duration) - 1;
            assert_eq!(last, seconds * u64::from(LOOP_RATE_HZ) - 1);
            for m in &plan.machines {
                let (park, rules) = m.script.split_last().unwrap();
                assert_eq!(park, &format!("mode idle at cycle {last}"), "{}", m.id);
                // Rules by cycle number end more than a second before the last activation.
                for rule in rules {
                    let Some((_, cycles)) = rule
                        .split_once(" at cycles ")
                        .or_else(|| rule.split_once(" at cycle "))
                        .or_else(|| rule.split_once(" from "))
                    else {
                        continue;
                    };
                    let end: u64 = cycles.rsplit("..").next().unwrap().parse().unwrap();
                    assert!(end + u64::from(LOOP_RATE_HZ) < last, "{}: {rule}", m.id);
                }
            }
        }
        // Rules by time are due at these fractions of the run, all well before its end.
        let fractions = [
            at::BURST_1,
            at::LATE_BURST,
            at::HANG,
            at::BURST_2,
            at::OFFLINE_BURST,
        ];
        let timeline = at::AUTONOMY.iter().map(|(f, _)| *f);
        assert!(fractions.into_iter().chain(timeline).all(|f| f <= 0.9));
    }

    #[test]
    fn the_late_starts_fall_while_the_agent_is_down_and_the_hang_after_it_is_back() {
        for seconds in [24, 36, 90] {
            let plan = plan(seconds);
            let script = &plan.machine(Role::Overruns).unwrap().script;
            let cycles_of = |verb: &str| -> (u64, u64) {
                let rule = script.iter().find(|r| r.starts_with(verb)).unwrap();
                let when = rule.rsplit(' ').next().unwrap();
                let (a, b) = when.split_once("..").unwrap_or((when, when));
                (a.parse().unwrap(), b.parse().unwrap())
            };
            let at = |cycle: u64| Duration::from_millis(cycle * 1000 / u64::from(LOOP_RATE_HZ));
            let (first, end) = cycles_of("late-start");
            assert_eq!(end - first, 5);
            let down = plan.agent_down;
            assert!(down.start < at(first) && at(end) < down.end, "{seconds} s");
            let (hang, _) = cycles_of("hang");
            assert!(down.end < at(hang), "{seconds} s");
            // The agent has reported the loop before it is killed (snapshot every second).
            assert!(down.start > Duration::from_secs(5));
        }
    }

    #[test]
    fn durations_out_of_range_are_refused() {
        assert!(Plan::new(Duration::from_secs(5)).is_err());
        assert!(Plan::new(Duration::from_secs(7200)).is_err());
    }
}
