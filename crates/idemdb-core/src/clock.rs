//! Time source. Every timestamp idemdb stores is milliseconds since the Unix epoch, taken from a
//! [`Clock`] so that tests can move time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// Lease expiry and record timestamps are read from it. Implementations must be cheap: the clock
/// is read on every reservation.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clock ([`SystemTime::now`]). A clock set before 1970 reads as 0.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; clones share one time.
///
/// ```
/// use idemdb_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000);
/// let shared = clock.clone();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(shared.now_ms(), 3_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let ms = duration_ms(by);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(ms))
            });
    }

    /// Sets the clock to `ms`, forwards or backwards.
    pub fn set(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lease in whole milliseconds, rounded up so that a sub-millisecond lease is not zero; a
/// zero lease is refused.
pub fn lease_ms(lease: Duration) -> Result<u64, crate::error::InputError> {
    if lease.is_zero() {
        return Err(crate::error::InputError::ZeroLease);
    }
    let ms = duration_ms(lease);
    Ok(if lease > Duration::from_millis(ms) {
        ms.saturating_add(1)
    } else {
        ms
    })
}
