//! What the kernel says about a process, read from `/proc`: CPU time, faults, context switches,
//! memory, affinity, scheduling policy and mappings; and the machine's steal time.
//!
//! Invariants:
//! - The parsers are pure (text in, numbers out) and name what they could not read.
//! - The readers only read `/proc`; they never signal or trace the process they look at.

use std::path::Path;

/// A `/proc` file that could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// The file could not be read (the process may have exited).
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A field is missing or not a number.
    #[error("{path}: cannot read field `{field}`")]
    Field {
        /// The file.
        path: String,
        /// The field.
        field: &'static str,
    },
}

fn read(path: &str) -> Result<String, ProcError> {
    std::fs::read_to_string(path).map_err(|source| ProcError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Fields of `/proc/<pid>/stat` (whole process: live and exited threads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// Minor page faults (field 10).
    pub minflt: u64,
    /// Major page faults (field 12).
    pub majflt: u64,
    /// User time, clock ticks (field 14).
    pub utime: u64,
    /// System time, clock ticks (field 15).
    pub stime: u64,
    /// Threads (field 20).
    pub threads: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state).
    let at = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Stat {
        minflt: at(10)?,
        majflt: at(12)?,
        utime: at(14)?,
        stime: at(15)?,
        threads: at(20)?,
    })
}

/// Reads `/proc/<pid>/stat`.
pub fn stat(pid: u32) -> Result<Stat, ProcError> {
    let path = format!("/proc/{pid}/stat");
    parse_stat(&read(&path)?).ok_or(ProcError::Field {
        path,
        field: "stat",
    })
}

/// Fields of `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    /// Voluntary context switches (of the thread group leader, or of the task read).
    pub voluntary_ctxt_switches: u64,
    /// Involuntary context switches.
    pub nonvoluntary_ctxt_switches: u64,
    /// Peak resident set, KiB.
    pub vm_hwm_kib: u64,
    /// Resident set, KiB.
    pub vm_rss_kib: u64,
    /// CPUs the task may run on.
    pub cpus_allowed: Vec<usize>,
}

/// Parses `/proc/<pid>/status` (or a task's).
pub fn parse_status(text: &str) -> Option<Status> {
    let mut status = Status::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let number = || value.split_whitespace().next()?.parse::<u64>().ok();
        match key {
            "voluntary_ctxt_switches" => status.voluntary_ctxt_switches = number()?,
            "nonvoluntary_ctxt_switches" => status.nonvoluntary_ctxt_switches = number()?,
            "VmHWM" => status.vm_hwm_kib = number()?,
            "VmRSS" => status.vm_rss_kib = number()?,
            "Cpus_allowed_list" => status.cpus_allowed = parse_cpu_list(value)?,
            _ => continue,
        }
        seen += 1;
    }
    (seen >= 3).then_some(status)
}

/// Reads `/proc/<pid>/status`.
pub fn status(pid: u32) -> Result<Status, ProcError> {
    let path = format!("/proc/{pid}/status");
    parse_status(&read(&path)?).ok_or(ProcError::Field {
        path,
        field: "status",
    })
}

/// Parses a CPU list such as `0-2,5`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// Thread ids of a process.
pub fn tasks(pid: u32) -> Result<Vec<u32>, ProcError> {
    let path = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&path).map_err(|source| ProcError::Read {
        path: path.clone(),
        source,
    })?;
    let mut tids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// Context switches summed over the live threads of a process (`/proc/<pid>/task/*/status`).
pub fn context_switches(pid: u32) -> Result<(u64, u64), ProcError> {
    let mut total = (0, 0);
    for tid in tasks(pid)? {
        let path = format!("/proc/{pid}/task/{tid}/status");
        let status = parse_status(&read(&path)?).ok_or(ProcError::Field {
            path,
            field: "ctxt_switches",
        })?;
        total.0 += status.voluntary_ctxt_switches;
        total.1 += status.nonvoluntary_ctxt_switches;
    }
    Ok(total)
}

/// On-CPU time in nanoseconds summed over the live threads (`/proc/<pid>/task/*/schedstat`,
/// first field): finer than the clock ticks of `stat`.
pub fn cpu_ns(pid: u32) -> Result<u64, ProcError> {
    schedstat_sum(pid, 0, "run time")
}

/// Time in nanoseconds the live threads spent runnable but waiting for a CPU, summed
/// (`/proc/<pid>/task/*/schedstat`, second field): how long other processes kept them off a core.
pub fn run_queue_wait_ns(pid: u32) -> Result<u64, ProcError> {
    schedstat_sum(pid, 1, "run-queue wait")
}

fn schedstat_sum(pid: u32, index: usize, field: &'static str) -> Result<u64, ProcError> {
    let mut total = 0;
    for tid in tasks(pid)? {
        let path = format!("/proc/{pid}/task/{tid}/schedstat");
        let text = read(&path)?;
        total += text
            .split_whitespace()
            .nth(index)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or(ProcError::Field { path, field })?;
    }
    Ok(total)
}

/// The scheduling policy of every thread of `pid`, as (tid, policy).
pub fn policies(pid: u32) -> Result<Vec<(u32, libc::c_int)>, ProcError> {
    let mut out = Vec::new();
    for tid in tasks(pid)? {
        // SAFETY: sched_getscheduler takes a thread id and touches no memory of ours.
        let policy = unsafe { libc::sched_getscheduler(tid as libc::pid_t) };
        if policy < 0 {
            return Err(ProcError::Read {
                path: format!("sched_getscheduler({tid})"),
                source: std::io::Error::last_os_error(),
            });
        }
        out.push((tid, policy));
    }
    Ok(out)
}

/// A policy's name.
pub fn policy_name(policy: libc::c_int) -> &'static str {
    match policy {
        libc::SCHED_OTHER => "SCHED_OTHER",
        libc::SCHED_FIFO => "SCHED_FIFO",
        libc::SCHED_RR => "SCHED_RR",
        libc::SCHED_BATCH => "SCHED_BATCH",
        libc::SCHED_IDLE => "SCHED_IDLE",
        6 => "SCHED_DEADLINE",
        _ => "unknown",
    }
}

/// One line of `/proc/<pid>/maps`: permissions and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// `r--s`, `rw-p`, ...
    pub perms: String,
    /// The mapped file, if any.
    pub path: String,
}

/// The mappings of `maps` whose file is `file`.
pub fn mappings_of(maps: &str, file: &Path) -> Vec<Mapping> {
    let wanted = file.to_string_lossy();
    maps.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let _range = words.next()?;
            let perms = words.next()?;
            // offset, dev, inode, then the path (which may hold spaces).
            let path = words.skip(3).collect::<Vec<_>>().join(" ");
            (path == wanted || path == format!("{wanted} (deleted)")).then(|| Mapping {
                perms: perms.to_owned(),
                path,
            })
        })
        .collect()
}

/// Reads `/proc/<pid>/maps`.
pub fn maps(pid: u32) -> Result<String, ProcError> {
    read(&format!("/proc/{pid}/maps"))
}

/// Steal ticks of `/proc/stat`: of one CPU's line (`cpuN`), or of the total line.
pub fn parse_steal(text: &str, cpu: Option<usize>) -> Option<u64> {
    let name = cpu.map_or_else(|| "cpu".to_owned(), |c| format!("cpu{c}"));
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
    // user nice system idle iowait irq softirq steal
    line.split_whitespace().nth(8)?.parse().ok()
}

/// Steal ticks of a CPU (or of all CPUs) now.
pub fn steal(cpu: Option<usize>) -> Result<u64, ProcError> {
    parse_steal(&read("/proc/stat")?, cpu).ok_or(ProcError::Field {
        path: "/proc/stat".into(),
        field: "steal",
    })
}

/// The kernel's memory-management work that can take a page from under a process without the
/// process asking, so that its next touch of the page is a minor fault: pages scanned for
/// reclaim (kswapd and direct), pages migrated (compaction, among others), huge pages
/// collapsed by khugepaged. System-wide counters of `/proc/vmstat`; a field the kernel lacks
/// counts 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageWork {
    /// `pgscan_kswapd` + `pgscan_direct`.
    pub reclaim_scanned: u64,
    /// `pgmigrate_success`.
    pub migrated: u64,
    /// `thp_collapse_alloc`.
    pub collapsed: u64,
}

impl PageWork {
    /// The work done between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            reclaim_scanned: self.reclaim_scanned.saturating_sub(earlier.reclaim_scanned),
            migrated: self.migrated.saturating_sub(earlier.migrated),
            collapsed: self.collapsed.saturating_sub(earlier.collapsed),
        }
    }

    /// Whether any of it happened.
    pub fn any(&self) -> bool {
        self.reclaim_scanned + self.migrated + self.collapsed > 0
    }
}

impl std::fmt::Display for PageWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} pages scanned for reclaim, {} migrated, {} huge pages collapsed",
            self.reclaim_scanned, self.migrated, self.collapsed
        )
    }
}

/// Parses `/proc/vmstat` into [`PageWork`].
pub fn parse_page_work(text: &str) -> PageWork {
    let mut work = PageWork::default();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(name), Some(Ok(value))) = (fields.next(), fields.next().map(str::parse::<u64>))
        else {
            continue;
        };
        match name {
            "pgscan_kswapd" | "pgscan_direct" => work.reclaim_scanned += value,
            "pgmigrate_success" => work.migrated += value,
            "thp_collapse_alloc" => work.collapsed += value,
            _ => {}
        }
    }
    work
}

/// The kernel's page work so far (`/proc/vmstat`).
pub fn page_work() -> Result<PageWork, ProcError> {
    Ok(parse_page_work(&read("/proc/vmstat")?))
}

/// Clock ticks per second (`stat`'s unit).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// CPUs this process may use.
pub fn own_cpus() -> Vec<usize> {
    status(std::process::id())
        .map(|s| s.cpus_allowed)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_work_sums_reclaim_scans_and_reads_migrations_and_collapses() {
        let text = "nr_free_pages 100\npgscan_kswapd 7\npgscan_direct 3\npgscan_direct_throttle 9\n\
                    pgmigrate_success 5\npgmigrate_fail 8\nthp_collapse_alloc 2\nthp_collapse_alloc_failed 4\n";
        let work = parse_page_work(text);
        assert_eq!(
            work,
            PageWork {
                reclaim_scanned: 10,
                migrated: 5,
                collapsed: 2
            }
        );
        let later = parse_page_work("pgscan_kswapd 17\npgscan_direct 3\npgmigrate_success 5\n");
        assert_eq!(
            later.since(&work),
            PageWork {
                reclaim_scanned: 10,
                migrated: 0,
                collapsed: 0
            }
        );
        assert!(later.since(&work).any());
        assert!(!work.since(&work).any());
        assert_eq!(
            parse_page_work("garbage\npgscan_kswapd x\n"),
            PageWork::default()
        );
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = "1234 (edge (watch) x) S 1 1234 1234 0 -1 4194560 5123 0 7 0 42 17 0 0 39 19 3 0 100 123456 789 18446744073709551615";
        let s = parse_stat(text).unwrap();
        assert_eq!(
            (s.minflt, s.majflt, s.utime, s.stime, s.threads),
            (5123, 7, 42, 17, 3)
        );
        assert_eq!(parse_stat("1234 (x) S 1"), None);
    }

    #[test]
    fn status_gives_switches_memory_and_cpus() {
        let text = "Name:\tedgewatch-agent\nVmHWM:\t   12345 kB\nVmRSS:\t   10000 kB\nCpus_allowed:\t1\nCpus_allowed_list:\t0,2-3\nvoluntary_ctxt_switches:\t150\nnonvoluntary_ctxt_switches:\t2\n";
        let s = parse_status(text).unwrap();
        assert_eq!(s.vm_hwm_kib, 12345);
        assert_eq!(s.vm_rss_kib, 10000);
        assert_eq!(s.cpus_allowed, vec![0, 2, 3]);
        assert_eq!(
            (s.voluntary_ctxt_switches, s.nonvoluntary_ctxt_switches),
            (150, 2)
        );
    }

    #[test]
    fn cpu_lists_expand_ranges_and_refuse_garbage() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        assert_eq!(parse_cpu_list("4-2"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn the_mappings_of_one_file_are_found_with_their_permissions() {
        let maps = "7f00-7f10 r--s 00000000 00:1a 123 /dev/shm/a.probe\n7f10-7f20 rw-p 00000000 00:00 0 \n7f20-7f30 r--s 00000000 00:1a 124 /dev/shm/b.probe\n7f30-7f40 r--s 00000000 00:1a 123 /dev/shm/a.probe (deleted)\n";
        let found = mappings_of(maps, Path::new("/dev/shm/a.probe"));
        assert_eq!(found.len(), 2);
        assert!(found.iter().all(|m| m.perms == "r--s"));
    }

    #[test]
    fn steal_is_the_eighth_value_of_a_cpu_line() {
        let text = "cpu  1 2 3 4 5 6 7 90 0 0\ncpu0 1 2 3 4 5 6 7 40 0 0\ncpu1 1 2 3 4 5 6 7 50 0 0\nintr 1\n";
        assert_eq!(parse_steal(text, None), Some(90));
        assert_eq!(parse_steal(text, Some(1)), Some(50));
        assert_eq!(parse_steal(text, Some(2)), None);
    }

    #[test]
    fn three_threads_spinning_on_one_cpu_wait_twice_as_long_as_they_run() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier};

        let pid = std::process::id();
        let cpu = own_cpus().first().copied().unwrap_or(0);
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (stop, started) = (stop.clone(), started.clone());
                std::thread::spawn(move || {
                    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET adds one CPU; pid 0 is the
                    // calling thread.
                    let pinned = unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(cpu, &mut set);
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
                    };
                    started.wait();
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                    pinned
                })
            })
            .collect();
        started.wait();
        let before = (run_queue_wait_ns(pid).unwrap(), cpu_ns(pid).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(400));
        let after = (run_queue_wait_ns(pid).unwrap(), cpu_ns(pid).unwrap());
        stop.store(true, Ordering::Relaxed);
        for thread in threads {
            assert_eq!(thread.join().unwrap(), 0, "pinning a thread to CPU {cpu}");
        }
        // Three threads runnable on one CPU for 400 ms ran about 400 ms together and waited about
        // 800 ms (each two thirds of the time); other processes on that CPU only add waiting.
        let waited = after.0.saturating_sub(before.0);
        let ran = after.1.saturating_sub(before.1);
        assert!(
            waited >= 200_000_000 && waited as f64 >= 1.3 * ran as f64,
            "waited {waited} ns, ran {ran} ns"
        );
    }
}
