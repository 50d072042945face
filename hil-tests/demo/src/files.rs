//! Where the demo puts its files, and the text of the configuration files it writes there (agent
//! TOML, model manifest, loop script, gateway TOML with its price book). Rendering is pure; only
//! [`Layout::create`] touches the disk.
//!
//! Invariants:
//! - Everything a run writes lives under one output directory, so a run can be inspected (or
//!   removed) as a whole, and two runs never share anything.
//! - The configurations use only documented keys (`docs/configuration.md`, `docs/samplers.md`,
//!   `docs/slo-catalog.md`): they are examples a user can copy.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::scenario::{LOOP_NAME, MODEL, Machine, Plan, Role};

/// Paths of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The output directory.
    pub root: PathBuf,
}

/// Paths of one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinePaths {
    /// `machines/<id>`.
    pub dir: PathBuf,
    /// The agent's configuration.
    pub agent_config: PathBuf,
    /// The agent's log (stdout and stderr).
    pub agent_log: PathBuf,
    /// The agent's queue directory.
    pub queue: PathBuf,
    /// The agent's status file.
    pub status: PathBuf,
    /// The agent's local event socket.
    pub socket: PathBuf,
    /// The model manifest.
    pub manifest: PathBuf,
    /// The replayed tegrastats capture.
    pub capture: PathBuf,
    /// The sysfs tree the agent reads (fake for the throttling machine, empty otherwise).
    pub sysfs: PathBuf,
    /// The control loop's probe file.
    pub probe: PathBuf,
    /// The control loop's pattern script.
    pub script: PathBuf,
    /// The control loop's JSON summary (its stdout).
    pub loop_summary: PathBuf,
    /// The control loop's log (its stderr).
    pub loop_log: PathBuf,
}

impl Layout {
    /// The layout under `root` (nothing is created).
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The gateway's directory.
    pub fn gateway_dir(&self) -> PathBuf {
        self.root.join("gateway")
    }

    /// The gateway's configuration.
    pub fn gateway_config(&self) -> PathBuf {
        self.gateway_dir().join("gateway.toml")
    }

    /// The gateway's embedded store.
    pub fn store(&self) -> PathBuf {
        self.gateway_dir().join("store.redb")
    }

    /// The gateway's log.
    pub fn gateway_log(&self) -> PathBuf {
        self.gateway_dir().join("gateway.log")
    }

    /// The report as printed.
    pub fn report_text(&self) -> PathBuf {
        self.root.join("report.txt")
    }

    /// The report as JSON (`report --json`).
    pub fn report_json(&self) -> PathBuf {
        self.root.join("report.json")
    }

    /// The FOCUS cost rows.
    pub fn focus_csv(&self) -> PathBuf {
        self.root.join("focus.csv")
    }

    /// The FOCUS companion table (autonomous machine-hours).
    pub fn focus_autonomy_csv(&self) -> PathBuf {
        self.root.join("focus-autonomy.csv")
    }

    /// What the run did, as JSON (timeline, loop summaries, agent counters).
    pub fn summary(&self) -> PathBuf {
        self.root.join("demo-summary.json")
    }

    /// Paths of machine `id`.
    pub fn machine(&self, id: &str) -> MachinePaths {
        let dir = self.root.join("machines").join(id);
        MachinePaths {
            agent_config: dir.join("agent.toml"),
            agent_log: dir.join("agent.log"),
            queue: dir.join("queue"),
            status: dir.join("agent-status.json"),
            socket: dir.join("agent.sock"),
            manifest: dir.join("model.json"),
            capture: dir.join("tegrastats.txt"),
            sysfs: dir.join("sysfs"),
            probe: dir.join("safety.probe"),
            script: dir.join("loop.script"),
            loop_summary: dir.join("loop-summary.json"),
            loop_log: dir.join("loop.log"),
            dir,
        }
    }

    /// Creates the directories and writes every file that does not depend on ports: manifests,
    /// captures, loop scripts, empty sysfs trees.
    pub fn create(&self, plan: &Plan) -> std::io::Result<()> {
        std::fs::create_dir_all(self.gateway_dir())?;
        for machine in &plan.machines {
            let paths = self.machine(machine.id);
            std::fs::create_dir_all(&paths.sysfs)?;
            std::fs::write(&paths.manifest, manifest_json(machine))?;
            std::fs::write(&paths.capture, capture_text(machine))?;
            std::fs::write(&paths.script, script_text(machine))?;
        }
        Ok(())
    }
}

/// The capture a machine's agent replays: verbatim, except that the throttling machine's lines
/// lose their `gpu@` reading. The agent takes zone temperatures from tegrastats and sysfs alike
/// (on a Jetson both read the same sensor); a replayed cool reading would otherwise end, at every
/// line, the heat wave the demo writes into the fake sysfs tree.
pub fn capture_text(machine: &Machine) -> String {
    if machine.role != Role::Throttling {
        return machine.capture.text.to_owned();
    }
    let mut text = String::with_capacity(machine.capture.text.len());
    for line in machine.capture.text.lines() {
        let kept: Vec<&str> = line
            .split(' ')
            .filter(|token| !token.to_ascii_lowercase().starts_with("gpu@"))
            .collect();
        text.push_str(&kept.join(" "));
        text.push('\n');
    }
    text
}

/// Quotes a path for TOML (basic string).
fn toml_path(path: &Path) -> String {
    let text = path.display().to_string();
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The model manifest (`docs/model-manifest.md`): name and version, no engine to hash.
pub fn manifest_json(machine: &Machine) -> String {
    format!(
        "{{\n  \"name\": \"{MODEL}\",\n  \"version\": \"{}\",\n  \"precision\": \"fp16\"\n}}\n",
        machine.model_version
    )
}

/// The loop's pattern script (`agent/synthetic-loop/README.md`).
pub fn script_text(machine: &Machine) -> String {
    let mut text = format!("# {}: {}\n", machine.id, machine.role.describe());
    for rule in &machine.script {
        text.push_str(rule);
        text.push('\n');
    }
    text
}

/// The agent's configuration; `broker` is where its uplink connects (the broker, or the fault
/// proxy in front of it).
pub fn agent_toml(machine: &Machine, paths: &MachinePaths, broker: SocketAddr) -> String {
    let mut text = String::new();
    let _ = write!(
        text,
        r#"# edgewatch agent of {id} ({role}). Keys: docs/configuration.md, docs/samplers.md.
[machine]
id = "{id}"
site = "{site}"
class = "{class}"

[queue]
dir = {queue}
budget_bytes = 67108864
bulk_flush = "200ms"

[uplink]
host = "{host}"
port = {port}
# A dead link shows within two keepalives; reconnects are retried quickly so the demo's
# partition heals within seconds.
keep_alive = "5s"
backoff_min = "200ms"
backoff_max = "2s"
initial_delay_max = "500ms"

[scheduling]
# On a machine, the agent runs at idle priority beside the control loop. Here it shares a
# workstation with everything else, where idle priority could starve it.
idle_priority = false

[ingest]
socket = {socket}

[status]
file = {status}

[deadline]
# One SLO snapshot a second (default 10 s): the demo's run lasts minutes, not hours.
snapshot_interval = "1s"

[[probe]]
path = {probe}
loop_name = "{loop_name}"

[model]
manifest = {manifest}

[thermal]
# A real capture, replayed in a loop at its own pace instead of running tegrastats.
replay = {capture}
replay_loop = true
sysfs_root = {sysfs}
counters_interval = "2s"
"#,
        id = machine.id,
        role = machine.role.describe(),
        site = machine.site,
        class = machine.class,
        queue = toml_path(&paths.queue),
        host = broker.ip(),
        port = broker.port(),
        socket = toml_path(&paths.socket),
        status = toml_path(&paths.status),
        probe = toml_path(&paths.probe),
        loop_name = LOOP_NAME,
        manifest = toml_path(&paths.manifest),
        capture = toml_path(&paths.capture),
        sysfs = toml_path(&paths.sysfs),
    );
    if machine.role == Role::Throttling {
        text.push_str(
            "# The fake tree holds the zone the demo heats; its other zones stay cool.\n",
        );
    }
    text
}

/// Settings of the gateway's configuration that are only known at run time.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// The broker.
    pub broker: SocketAddr,
    /// Where `/metrics` listens.
    pub metrics: SocketAddr,
    /// Where the fleet page listens.
    pub page: SocketAddr,
    /// The store file.
    pub store: PathBuf,
    /// The UTC days the run touches: (midnight in Unix ms, share of the run's time in that day).
    pub days: Vec<(i64, f64)>,
}

/// The UTC days `[start_ms, start_ms + length_ms)` touches, with the share of it in each.
pub fn days_of(start_ms: i64, length_ms: i64) -> Vec<(i64, f64)> {
    let day = edgewatch_slo::MS_PER_DAY;
    let end_ms = start_ms + length_ms.max(1);
    let mut out = Vec::new();
    let mut midnight = start_ms.div_euclid(day) * day;
    while midnight < end_ms {
        let covered = end_ms.min(midnight + day) - start_ms.max(midnight);
        out.push((midnight, covered as f64 / (end_ms - start_ms) as f64));
        midnight += day;
    }
    out
}

/// Share of cloud inference per autonomous machine-hour, USD.
pub const INFERENCE_PER_HOUR: f64 = 0.60;
/// Share of training per autonomous machine-hour of model version 4.3.0, USD.
pub const TRAINING_PER_HOUR: f64 = 2.40;

/// The gateway's configuration: embedded store, `/metrics`, the fleet page, the built-in SLO
/// catalog and a
/// price book. The shares are sized for this run: a month's bill spread over a month of fleet
/// hours gives a rate per autonomous machine-hour; the demo charges that rate for the hours its
/// scripts plan, one share per UTC day the run touches (shares are spread over whole days).
pub fn gateway_toml(plan: &Plan, settings: &GatewaySettings) -> String {
    let hours = |version| plan.planned_autonomous_seconds(version) / 3600.0;
    let mut text = format!(
        r#"# edgewatch gateway of the demo. Keys: docs/configuration.md (gateway), docs/slo-catalog.md.
# No [slo] table: the built-in SLO catalog applies (safety-control 99.99 %, assistive-control,
# safety-event-freshness 95 %, gpu-throttled-time 99 %; 30-day period; SRE-workbook burn rates).
[mqtt]
host = "{host}"
port = {port}
client_id = "demo-gateway"
keep_alive = "5s"

[store]
path = {store}

[metrics]
listen = "{metrics}"

# The fleet page (docs/gateway.md, "Fleet page"), on loopback.
[http]
listen = "{page}"

[prices]
currency = "USD"

# Edge computer per machine class, amortized per hour of machine time.
[prices.machine_classes.haul-truck]
purchase_price = 4200.0                 # AGX Orin 64 GB, carrier, enclosure, install
lifetime_hours = 30000.0                # 0.14 per machine hour

[prices.machine_classes.excavator]
purchase_price = 6500.0                 # Jetson Thor
lifetime_hours = 30000.0

[prices.machine_classes.grader]
purchase_price = 1900.0                 # Orin Nano 8 GB
lifetime_hours = 25000.0

# Energy tariff per site, applied to the rail energy measured by tegrastats.
[prices.sites.north-pit]
energy_price_per_kwh = 0.19

[prices.sites.south-pit]
energy_price_per_kwh = 0.27

# Shares, spread over the UTC days of their period and allocated by autonomous hours. Sized for
# this run: {inference_rate:.2} USD of inference and {training_rate:.2} USD of 4.3.0 training per
# planned autonomous machine-hour ({fleet_hours:.4} h for the fleet, {newer_hours:.4} h on 4.3.0).
"#,
        host = settings.broker.ip(),
        port = settings.broker.port(),
        store = toml_path(&settings.store),
        metrics = settings.metrics,
        page = settings.page,
        inference_rate = INFERENCE_PER_HOUR,
        training_rate = TRAINING_PER_HOUR,
        fleet_hours = hours(None),
        newer_hours = hours(Some("4.3.0")),
    );
    for &(midnight, share) in &settings.days {
        let start = edgewatch_slo::format_rfc3339(midnight);
        let end = edgewatch_slo::format_rfc3339(midnight + edgewatch_slo::MS_PER_DAY);
        let _ = write!(
            text,
            r#"
[[prices.shares]]
service = "cloud-inference"
amount = {inference:.6}
start = "{start}"
end = "{end}"
description = "Map and fleet-planning inference endpoint"

[[prices.shares]]
service = "training"
amount = {training:.6}
start = "{start}"
end = "{end}"
model = "{MODEL}"
model_version = "4.3.0"
description = "Fine-tuning of {MODEL} 4.3.0"
"#,
            inference = INFERENCE_PER_HOUR * hours(None) * share,
            training = TRAINING_PER_HOUR * hours(Some("4.3.0")) * share,
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_throttling_machines_capture_loses_its_gpu_temperature() {
        let plan = Plan::new(std::time::Duration::from_secs(90)).unwrap_or_else(|e| panic!("{e}"));
        for m in &plan.machines {
            let text = capture_text(m);
            assert_eq!(
                text.lines().count(),
                m.capture.text.lines().count(),
                "{}",
                m.id
            );
            if m.role == Role::Throttling {
                assert!(!text.contains("gpu@"), "{}", m.id);
                assert!(text.contains("cpu@") && text.contains("VDD_IN"), "{}", m.id);
                for line in text.lines() {
                    let sample = tegrastats_parser::parse_line(line)
                        .unwrap_or_else(|e| panic!("{e:?}: {line}"));
                    assert!(sample.temperatures().iter().all(|t| t.zone != "gpu"));
                    assert!(sample.temperatures().iter().any(|t| t.zone == "cpu"));
                }
            } else {
                assert_eq!(text, m.capture.text, "{}", m.id);
            }
        }
    }

    #[test]
    fn a_run_within_one_day_touches_one_day() {
        let day = edgewatch_slo::MS_PER_DAY;
        assert_eq!(days_of(10 * day + 1000, 90_000), vec![(10 * day, 1.0)]);
    }

    #[test]
    fn a_run_across_midnight_is_split_by_its_time_in_each_day() {
        let day = edgewatch_slo::MS_PER_DAY;
        let days = days_of(11 * day - 30_000, 120_000);
        assert_eq!(days, vec![(10 * day, 0.25), (11 * day, 0.75)]);
    }

    #[test]
    fn the_gateway_configuration_is_valid_and_prices_every_class_and_site() {
        let plan = Plan::new(std::time::Duration::from_secs(90)).unwrap_or_else(|e| panic!("{e}"));
        let day = edgewatch_slo::MS_PER_DAY;
        let text = gateway_toml(
            &plan,
            &GatewaySettings {
                broker: "127.0.0.1:1883".parse().unwrap_or_else(|e| panic!("{e}")),
                metrics: "127.0.0.1:9464".parse().unwrap_or_else(|e| panic!("{e}")),
                page: "127.0.0.1:9465".parse().unwrap_or_else(|e| panic!("{e}")),
                store: PathBuf::from("/tmp/store.redb"),
                days: days_of(20_000 * day - 30_000, 120_000),
            },
        );
        let config = edgewatch_gateway::config::Config::from_toml(&text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let prices = config.prices.unwrap_or_else(|| panic!("no [prices]"));
        for m in &plan.machines {
            assert!(prices.machine_classes.contains_key(m.class), "{}", m.class);
            assert!(prices.sites.contains_key(m.site), "{}", m.site);
        }
        // One inference and one training share per day touched.
        assert_eq!(prices.shares.len(), 4);
        let inference: f64 = prices
            .shares
            .iter()
            .filter(|s| s.config.service.service_name() == "cloud-inference")
            .map(|s| s.config.amount)
            .sum();
        let expected = INFERENCE_PER_HOUR * plan.planned_autonomous_seconds(None) / 3600.0;
        assert!(
            (inference - expected).abs() < 1e-5,
            "{inference} vs {expected}"
        );
    }

    #[test]
    fn every_agent_configuration_is_valid() {
        let plan = Plan::new(std::time::Duration::from_secs(90)).unwrap_or_else(|e| panic!("{e}"));
        let layout = Layout::new(PathBuf::from("/tmp/demo"));
        for m in &plan.machines {
            let paths = layout.machine(m.id);
            let text = agent_toml(
                m,
                &paths,
                "127.0.0.1:1883".parse().unwrap_or_else(|e| panic!("{e}")),
            );
            let config = edgewatch_agent::config::Config::parse(&text, Path::new("agent.toml"))
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(config.machine.id, m.id);
            assert_eq!(config.machine.class, m.class);
            assert_eq!(config.deadline.probes.len(), 1);
        }
    }
}
