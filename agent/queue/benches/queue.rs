//! Queue benchmarks, each against a baseline measured in the same run: appending length-prefixed,
//! CRC32C-checked records to a plain file with the same fsync policy.
//!
//! `cargo bench -p edgewatch-queue --bench queue` runs every scenario, each in its own child
//! process (so peak RSS, VmHWM, is per scenario), and prints a markdown table of medians.
//! `cargo bench -p edgewatch-queue --bench queue -- <scenario>` runs one: safety, bulk, drain,
//! rss, recovery, space, compaction. `EDGEWATCH_BENCH_DIR` chooses where the data goes (default: a
//! temporary directory beside the system's temp dir).
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use edgewatch_proto::v1::{Attribute, CustomEvent, Event, Tier, attribute, event::Kind};
use edgewatch_queue::{BatchLimits, Queue, RawQueueConfig};
use prost::Message;

const RUNS: usize = 5;
const CACHE_BYTES: u64 = 8 * 1024 * 1024;

fn event(i: u64, pad: usize) -> Event {
    Event {
        seq: 0,
        event_time_unix_ns: 1_700_000_000_000_000_000 + i as i64,
        monotonic_ns: i,
        kind: Some(Kind::Custom(CustomEvent {
            name: format!("bench-{i}"),
            attributes: vec![Attribute {
                key: "pad".into(),
                value: Some(attribute::Value::StringValue("p".repeat(pad))),
            }],
        })),
    }
}

fn config(dir: &Path, budget: u64) -> RawQueueConfig {
    let mut config = RawQueueConfig::new(dir);
    config.cache_bytes = CACHE_BYTES;
    config.budget_bytes = budget;
    config.max_pending_bytes = 64 * 1024 * 1024;
    config.max_record_bytes = 64 * 1024;
    config.share_percent.safety = 100;
    config.share_percent.slo = 100;
    config.share_percent.debug = 100;
    config.offline_window_threshold = None;
    config.max_age.slo = None;
    config.max_age.debug = None;
    config
}

/// The baseline: one file, records `len:u32 | crc32c:u32 | bytes`, fdatasync per policy. The
/// checksum is the queue's own routine (`record::checksum`), so that the comparison is of the
/// queue's work beyond a plain log, not of two CRC32C implementations.
struct PlainLog {
    file: File,
    buf: Vec<u8>,
}

impl PlainLog {
    fn create(path: &Path) -> Self {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .unwrap();
        Self {
            file,
            buf: Vec::new(),
        }
    }

    fn append(&mut self, record: &[u8]) {
        self.buf
            .extend_from_slice(&(record.len() as u32).to_le_bytes());
        self.buf
            .extend_from_slice(&edgewatch_queue::record::checksum(record).to_le_bytes());
        self.buf.extend_from_slice(record);
    }

    fn sync(&mut self) {
        self.file.write_all(&self.buf).unwrap();
        self.buf.clear();
        self.file.sync_data().unwrap();
    }
}

/// Reads a plain log back, checking every CRC; calls `chunk` every `per` records.
fn scan_plain(path: &Path, per: usize, mut chunk: impl FnMut(usize)) -> u64 {
    let mut reader = BufReader::with_capacity(1 << 20, File::open(path).unwrap());
    let mut header = [0u8; 8];
    let mut record = Vec::new();
    let (mut n, mut in_chunk) = (0u64, 0usize);
    while reader.read_exact(&mut header).is_ok() {
        let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().unwrap());
        record.resize(len, 0);
        if reader.read_exact(&mut record).is_err()
            || edgewatch_queue::record::checksum(&record) != crc
        {
            break;
        }
        n += 1;
        in_chunk += 1;
        if in_chunk == per {
            chunk(in_chunk);
            in_chunk = 0;
        }
    }
    if in_chunk > 0 {
        chunk(in_chunk);
    }
    n
}

/// Runs `queue` and `plain` alternately `RUNS` times (so a disk whose flush latency drifts
/// affects both columns alike) and returns both medians.
fn paired(mut queue: impl FnMut(usize) -> f64, mut plain: impl FnMut(usize) -> f64) -> (f64, f64) {
    let (mut q, mut p) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        q.push(queue(run));
        p.push(plain(run));
    }
    (median(q), median(p))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn fresh_dir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// Appends `n` records of `pad` bytes to `tier`, flushing every `per` appends; returns records/s.
///
/// The queue takes the time as an argument; the wall clock is read once per flush group, as the
/// baseline (which stores no time) reads it never: neither column pays a clock read per record.
fn queue_appends(dir: &Path, tier: Tier, n: u64, pad: usize, per: u64) -> f64 {
    let (mut queue, _) = Queue::open(config(dir, 4 << 30), now()).unwrap();
    let events: Vec<Vec<u8>> = (0..256).map(|i| event(i, pad).encode_to_vec()).collect();
    let start = Instant::now();
    let mut time = now();
    for i in 0..n {
        queue
            .append_encoded(tier, &events[(i % 256) as usize], time)
            .unwrap();
        if (i + 1) % per == 0 {
            queue.flush(time).unwrap();
            time = now();
        }
    }
    queue.flush(time).unwrap();
    n as f64 / start.elapsed().as_secs_f64()
}

fn plain_appends(path: &Path, n: u64, pad: usize, per: u64) -> f64 {
    let events: Vec<Vec<u8>> = (0..256).map(|i| event(i, pad).encode_to_vec()).collect();
    let mut log = PlainLog::create(path);
    let start = Instant::now();
    for i in 0..n {
        log.append(&events[(i % 256) as usize]);
        if (i + 1) % per == 0 {
            log.sync();
        }
    }
    log.sync();
    n as f64 / start.elapsed().as_secs_f64()
}

fn scenario(name: &str, root: &Path) -> Vec<(String, String, String)> {
    let mut rows = Vec::new();
    match name {
        "safety" => {
            // Each safety event alone in its flush: the worst case of group commit.
            let n = 2000;
            let (queue, plain) = paired(
                |r| queue_appends(&fresh_dir(root, &format!("s{r}")), Tier::Safety, n, 100, 1),
                |r| plain_appends(&fresh_dir(root, &format!("p{r}")).join("log"), n, 100, 1),
            );
            rows.push((
                "safety appends/s, fsync per append (140 B events)".into(),
                format!("{queue:.0}"),
                format!("{plain:.0}"),
            ));
            let (queue, plain) = paired(
                |r| {
                    queue_appends(
                        &fresh_dir(root, &format!("g{r}")),
                        Tier::Safety,
                        n * 5,
                        100,
                        10,
                    )
                },
                |r| {
                    plain_appends(
                        &fresh_dir(root, &format!("q{r}")).join("log"),
                        n * 5,
                        100,
                        10,
                    )
                },
            );
            rows.push((
                "safety appends/s, group commit of 10".into(),
                format!("{queue:.0}"),
                format!("{plain:.0}"),
            ));
        }
        "bulk" => {
            let n = 200_000;
            for (tier, label) in [(Tier::Slo, "SLO"), (Tier::Debug, "debug")] {
                let (queue, plain) = paired(
                    |r| queue_appends(&fresh_dir(root, &format!("b{r}")), tier, n, 150, 1000),
                    |r| plain_appends(&fresh_dir(root, &format!("c{r}")).join("log"), n, 150, 1000),
                );
                rows.push((
                    format!("{label} appends/s, fsync per 1000 (190 B events)"),
                    format!("{queue:.0}"),
                    format!("{plain:.0}"),
                ));
            }
        }
        "drain" => {
            let n = 200_000u64;
            let mut queue_rates = Vec::new();
            let mut plain_rates = Vec::new();
            for r in 0..3 {
                let dir = fresh_dir(root, &format!("d{r}"));
                queue_appends(&dir, Tier::Debug, n, 150, 10_000);
                let (mut queue, _) = Queue::open(config(&dir, 4 << 30), now()).unwrap();
                let limits = BatchLimits {
                    max_records: 1000,
                    max_bytes: 512 * 1024,
                };
                let start = Instant::now();
                let mut read = 0;
                while let Some(batch) = queue.next_batch(limits).unwrap() {
                    read += batch.len() as u64;
                    let (tier, epoch, first, last) = (
                        batch.tier(),
                        batch.epoch(),
                        batch.first_seq(),
                        batch.last_seq(),
                    );
                    queue.ack(tier, epoch, first..=last, now());
                    queue.flush(now()).unwrap();
                }
                assert_eq!(read, n);
                queue_rates.push(n as f64 / start.elapsed().as_secs_f64());

                let path = fresh_dir(root, &format!("e{r}")).join("log");
                plain_appends(&path, n, 150, 10_000);
                let mut cursor = File::create(path.with_extension("cursor")).unwrap();
                let mut offset = 0u64;
                let start = Instant::now();
                let got = scan_plain(&path, 1000, |k| {
                    offset += k as u64;
                    cursor.write_all(&offset.to_le_bytes()).unwrap();
                    cursor.sync_data().unwrap();
                });
                assert_eq!(got, n);
                plain_rates.push(n as f64 / start.elapsed().as_secs_f64());
            }
            rows.push((
                "read + ack records/s, 1000 per batch, fsync per ack".into(),
                format!("{:.0}", median(queue_rates)),
                format!("{:.0}", median(plain_rates)),
            ));
        }
        "rss" => {
            let n = 1_000_000u64;
            let dir = fresh_dir(root, "rss");
            let start = Instant::now();
            queue_appends(&dir, Tier::Debug, n, 1000, 1000);
            let fill = start.elapsed();
            let after_fill = vm_hwm_kib();
            let (mut queue, _) = Queue::open(config(&dir, 4 << 30), now()).unwrap();
            let file = queue.file_bytes();
            let limits = BatchLimits {
                max_records: 1000,
                max_bytes: 2 * 1024 * 1024,
            };
            while let Some(batch) = queue.next_batch(limits).unwrap() {
                let (tier, epoch, first, last) = (
                    batch.tier(),
                    batch.epoch(),
                    batch.first_seq(),
                    batch.last_seq(),
                );
                queue.ack(tier, epoch, first..=last, now());
                queue.flush(now()).unwrap();
            }
            let after_drain = vm_hwm_kib();
            drop(queue);
            let _ = std::fs::remove_dir_all(&dir);
            let path = fresh_dir(root, "rss-plain").join("log");
            let plain_rss = run_child("rss-plain", &path);
            rows.push((
                format!(
                    "peak RSS (VmHWM), 1 GB backlog: 1M × 1 KB appended (fsync per 1000, {:.0} s), \
                 file {} MiB, cache {} MiB",
                    fill.as_secs_f64(),
                    file >> 20,
                    CACHE_BYTES >> 20
                ),
                format!("{} MiB", after_fill / 1024),
                plain_rss.clone(),
            ));
            rows.push((
                "peak RSS (VmHWM) after draining the 1 GB backlog (read + ack)".into(),
                format!("{} MiB", after_drain / 1024),
                plain_rss,
            ));
        }
        "rss-plain" => {
            // Child of "rss": the baseline's own process, so its VmHWM is its own.
            let path = root.to_owned();
            plain_appends(&path, 1_000_000, 1000, 1000);
            scan_plain(&path, 1000, |_| {});
            let _ = std::fs::remove_file(&path);
            println!("RESULT {} MiB", vm_hwm_kib() / 1024);
        }
        "recovery" => {
            let n = 1_000_000u64;
            let dir = fresh_dir(root, "recovery");
            queue_appends(&dir, Tier::Debug, n, 150, 10_000);
            let file_mib = Queue::open(config(&dir, 4 << 30), now())
                .unwrap()
                .0
                .file_bytes()
                >> 20;
            let time_open = |verify: bool| {
                median(
                    (0..3)
                        .map(|_| {
                            let mut config = config(&dir, 4 << 30);
                            config.verify_on_open = verify;
                            let start = Instant::now();
                            let (queue, report) = Queue::open(config, now()).unwrap();
                            let elapsed = start.elapsed().as_secs_f64();
                            assert_eq!(report.records.debug, n);
                            drop(queue);
                            elapsed
                        })
                        .collect(),
                )
            };
            let clean = time_open(true);
            let clean_no_verify = time_open(false);
            let crashed = median(
                (0..3)
                    .map(|_| {
                        // A child opens the queue, writes one flush, and dies without closing it.
                        let status = Command::new(std::env::current_exe().unwrap())
                            .args(["crash-child", dir.to_str().unwrap()])
                            .status()
                            .unwrap();
                        assert!(!status.success());
                        let start = Instant::now();
                        let (queue, report) = Queue::open(config(&dir, 4 << 30), now()).unwrap();
                        let elapsed = start.elapsed().as_secs_f64();
                        assert!(report.quarantined.is_none());
                        drop(queue);
                        elapsed
                    })
                    .collect(),
            );
            let path = fresh_dir(root, "recovery-plain").join("log");
            plain_appends(&path, n, 150, 10_000);
            let plain = median(
                (0..3)
                    .map(|_| {
                        let start = Instant::now();
                        assert_eq!(scan_plain(&path, usize::MAX, |_| {}), n);
                        start.elapsed().as_secs_f64()
                    })
                    .collect(),
            );
            rows.push((
                format!("open after a crash, 1M records ({file_mib} MiB file): repair + verify"),
                format!("{crashed:.2} s"),
                format!("{plain:.2} s (CRC scan of the log)"),
            ));
            rows.push((
                "open after a clean close, 1M records, verify_on_open = true".into(),
                format!("{clean:.2} s"),
                format!("{plain:.2} s"),
            ));
            rows.push((
                "open after a clean close, 1M records, verify_on_open = false".into(),
                format!("{clean_no_verify:.2} s"),
                "".into(),
            ));
            // Damage the flash could do: the middle half of every segment reads as zeros. The
            // open skips to the next frame that passes its checks and counts what lies between.
            let mut zeroed = 0u64;
            for entry in std::fs::read_dir(dir.join("queue.log")).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|ext| ext != "seg") {
                    continue;
                }
                let len = std::fs::metadata(&path).unwrap().len();
                let file = OpenOptions::new().write(true).open(&path).unwrap();
                let zeros = vec![0u8; (len / 2) as usize];
                file.write_all_at(&zeros, len / 4).unwrap();
                file.sync_all().unwrap();
                zeroed += len / 2;
            }
            let damaged = median(
                (0..3)
                    .map(|_| {
                        let start = Instant::now();
                        let (queue, report) = Queue::open(config(&dir, 4 << 30), now()).unwrap();
                        let elapsed = start.elapsed().as_secs_f64();
                        assert!(report.quarantined.is_none());
                        assert!(report.records.debug < n);
                        drop(queue);
                        elapsed
                    })
                    .collect(),
            );
            rows.push((
                format!(
                    "open with the middle half of every segment zeroed ({} MiB of zeros)",
                    zeroed >> 20
                ),
                format!("{damaged:.2} s"),
                format!("{plain:.2} s (CRC scan of the whole log)"),
            ));
            let _ = std::fs::remove_dir_all(&dir);
        }
        "crash-child" => {
            let (mut queue, _) = Queue::open(config(root, 4 << 30), now()).unwrap();
            queue.append(Tier::Safety, &event(0, 10), now()).unwrap();
            queue.flush(now()).unwrap();
            std::process::abort();
        }
        "space" => {
            let n = 1_000_000u64;
            let dir = fresh_dir(root, "space");
            queue_appends(&dir, Tier::Debug, n, 150, 10_000);
            let (mut queue, _) = Queue::open(config(&dir, 4 << 30), now()).unwrap();
            let full = queue.file_bytes();
            let mut first = 1;
            while first <= n * 9 / 10 {
                let last = (first + 9_999).min(n * 9 / 10);
                let epoch = queue.epoch();
                queue.ack(Tier::Debug, epoch, first..=last, now());
                queue.flush(now()).unwrap();
                first = last + 1;
            }
            let after_delete = queue.file_bytes();
            let start = Instant::now();
            let compacted = queue.compact_if_drained(now()).unwrap();
            let compact_time = start.elapsed();
            let after_compact = queue.file_bytes();
            assert!(!compacted, "a log is never compacted");
            drop(queue);
            let path = fresh_dir(root, "space-plain").join("log");
            plain_appends(&path, n, 150, 10_000);
            let plain_full = std::fs::metadata(&path).unwrap().len();
            plain_appends(&path, n / 10, 150, 10_000);
            let plain_tenth = std::fs::metadata(&path).unwrap().len();
            let mib = |b: u64| format!("{:.0} MiB", b as f64 / 1048576.0);
            rows.push((
                "on-disk size, 1M records of 190 B".into(),
                mib(full),
                mib(plain_full),
            ));
            rows.push((
                "on-disk size after acknowledging the oldest 90%".into(),
                mib(after_delete),
                format!("{} (a log reclaims nothing from its head)", mib(plain_full)),
            ));
            rows.push((
                format!(
                    "on-disk size after compact_if_drained ({:.1} s; a log: nothing to do)",
                    compact_time.as_secs_f64()
                ),
                mib(after_compact),
                format!("{} (a log holding only the 10%)", mib(plain_tenth)),
            ));
            let _ = std::fs::remove_dir_all(&dir);
        }
        "compaction" => {
            // A backlog of 200,000 debug records of 1 KB, 90 % of it delivered (the newest 10 %
            // still at the file's end), while safety events keep arriving: one append and its
            // flush every 10 ms, the agent's safety group commit. The copy runs on its own
            // thread, as in the agent; the agent's thread pauses only for the flush that swaps.
            let n = 200_000u64;
            let dir = fresh_dir(root, "compaction");
            queue_appends(&dir, Tier::Debug, n, 1000, 1000);
            let (mut queue, _) = Queue::open(config(&dir, 4 << 30), now()).unwrap();
            let epoch = queue.epoch();
            let delivered = n * 9 / 10;
            let mut first = 1;
            while first <= delivered {
                let last = (first + 9_999).min(delivered);
                queue.ack(Tier::Debug, epoch, first..=last, now());
                queue.flush(now()).unwrap();
                first = last + 1;
            }
            let high_water = queue.file_bytes();
            let mut i = 0u64;
            let mut safety_flush = |queue: &mut Queue| {
                i += 1;
                queue.append(Tier::Safety, &event(i, 100), now()).unwrap();
                let start = Instant::now();
                queue.flush(now()).unwrap();
                let took = start.elapsed();
                std::thread::sleep(Duration::from_millis(10).saturating_sub(took));
                took
            };
            let baseline: Vec<Duration> = (0..300).map(|_| safety_flush(&mut queue)).collect();
            assert!(
                queue.begin_compaction(now()).is_none(),
                "a log is never due for compaction"
            );
            // The rest is delivered: the drained segments go with the acknowledgement's commit.
            queue.ack(Tier::Debug, epoch, delivered + 1..=n, now());
            queue.ack(Tier::Safety, epoch, 1..=u64::MAX - 1, now());
            let start = Instant::now();
            queue.flush(now()).unwrap();
            let drain_flush = start.elapsed();
            let drained = queue.file_bytes();
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            let pct = |values: &[Duration], p: usize| {
                let mut sorted = values.to_vec();
                sorted.sort();
                ms(sorted[(sorted.len() - 1) * p / 100])
            };
            let stats = |values: &[Duration]| {
                format!(
                    "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} flushes)",
                    pct(values, 50),
                    pct(values, 99),
                    pct(values, 100),
                    values.len()
                )
            };
            let mib = |b: u64| format!("{:.1} MiB", b as f64 / 1048576.0);
            rows.push((
                "file, 200,000 × 1 KB debug records, 90 % delivered".into(),
                mib(high_water),
                "".into(),
            ));
            rows.push((
                "safety append + flush, every 10 ms, beside the 20,000-record backlog".into(),
                stats(&baseline),
                "".into(),
            ));
            rows.push((
                "the flush that acknowledges the rest and unlinks its segments".into(),
                format!("{:.1} ms", ms(drain_flush)),
                "".into(),
            ));
            rows.push((
                "file after the rest drained".into(),
                mib(drained),
                "".into(),
            ));
            let _ = std::fs::remove_dir_all(&dir);
        }
        other => panic!("unknown scenario {other}"),
    }
    rows
}

fn run_child(name: &str, root: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, root.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    match args.as_slice() {
        [name, root] => {
            // A child: run one scenario, print its rows.
            for (what, queue, plain) in scenario(name, Path::new(root)) {
                println!("RESULT | {what} | {queue} | {plain} |");
            }
        }
        _ => {
            let base = std::env::var_os("EDGEWATCH_BENCH_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| std::env::temp_dir().join("edgewatch-queue-bench"));
            std::fs::create_dir_all(&base).unwrap();
            let all = [
                "safety",
                "bulk",
                "drain",
                "recovery",
                "space",
                "rss",
                "compaction",
            ];
            let chosen: Vec<&str> = if args.is_empty() {
                all.to_vec()
            } else {
                args.iter().map(String::as_str).collect()
            };
            println!("| measurement | queue (log) | baseline (plain file, same fsync) |");
            println!("|---|---|---|");
            for name in chosen {
                let dir = fresh_dir(&base, name);
                let started = Instant::now();
                let rows = run_child(name, &dir);
                println!("{rows}");
                eprintln!("{name}: {:.0} s", started.elapsed().as_secs_f64());
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}
