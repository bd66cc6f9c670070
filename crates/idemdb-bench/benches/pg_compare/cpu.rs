//! CPU spent during a cell, from /proc: the whole machine's busy time (the bench and the
//! PostgreSQL server share its 2 cores) and this process's own share.

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
            process: process_busy().unwrap_or_default(),
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

fn process_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let v: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = v.get(11)?.parse().ok()?;
    let stime: u64 = v.get(12)?.parse().ok()?;
    Some(ticks(utime + stime))
}
