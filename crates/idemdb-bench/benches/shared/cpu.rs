//! CPU time: the whole machine's busy time (/proc/stat), this process's (getrusage: every
//! thread, live or exited, to the µs), one thread's, and other processes' (a server the bench
//! talks to: /proc/<pid>/task/*/schedstat, to the ns).

use std::time::Duration;

/// Cumulative busy times at one instant.
#[derive(Clone, Copy, Default)]
pub struct Usage {
    /// Every CPU's non-idle time (user, nice, system, irq, softirq, steal).
    pub machine: Duration,
    /// This process's user + system time.
    pub process: Duration,
}

impl Usage {
    pub fn now() -> Usage {
        Usage {
            machine: machine_busy().unwrap_or_default(),
            process: process(),
        }
    }

    pub fn since(self, earlier: Usage) -> Usage {
        Usage {
            machine: self.machine.saturating_sub(earlier.machine),
            process: self.process.saturating_sub(earlier.process),
        }
    }

    pub fn add(&mut self, other: Usage) {
        self.machine += other.machine;
        self.process += other.process;
    }
}

/// The kernel's clock ticks are 1/100 s on Linux (USER_HZ).
fn ticks(t: u64) -> Duration {
    Duration::from_millis(t * 10)
}

fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7)?;
    Some(ticks(busy))
}

/// This process's user + system time, every thread's (exited ones too).
pub fn process() -> Duration {
    // SAFETY: getrusage only writes the struct it is given, which is plain data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// This process's context switches, every thread's (exited ones too): the times a thread gave
/// up its CPU (to sleep: `ru_nvcsw`) or lost it (preempted: `ru_nivcsw`).
pub fn process_switches() -> u64 {
    // SAFETY: as in `process`.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0;
        }
        usage
    };
    (usage.ru_nvcsw + usage.ru_nivcsw).max(0) as u64
}

/// The context switches of the live threads of process `pid` (voluntary and not, from
/// /proc/<pid>/task/*/status), or `None` if it is not on this machine.
pub fn switches_of_pid(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        tasks
            .filter_map(|t| {
                let status = std::fs::read_to_string(t.ok()?.path().join("status")).ok()?;
                Some(
                    status
                        .lines()
                        .filter_map(|l| {
                            let v = l
                                .strip_prefix("voluntary_ctxt_switches:")
                                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))?;
                            v.trim().parse::<u64>().ok()
                        })
                        .sum::<u64>(),
                )
            })
            .sum(),
    )
}

/// CPU time of the calling thread, from /proc/thread-self/schedstat.
pub fn thread() -> Duration {
    schedstat("/proc/thread-self/schedstat").unwrap_or_default()
}

/// CPU time of the live threads of process `pid`, or `None` if it is not on this machine.
pub fn of_pid(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        tasks
            .filter_map(|t| schedstat(&t.ok()?.path().join("schedstat").to_string_lossy()))
            .sum(),
    )
}

/// The first field of a schedstat file: time spent on a CPU, in ns.
fn schedstat(path: &str) -> Option<Duration> {
    let s = std::fs::read_to_string(path).ok()?;
    s.split_whitespace()
        .next()?
        .parse()
        .ok()
        .map(Duration::from_nanos)
}

/// The parent of process `pid`, from /proc/<pid>/stat.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(pid))
        .collect()
}

/// The fields of /proc/<pid>/stat after the command's closing parenthesis (state, ppid, …).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}
