//! What this instance last learnt of the store's time (the server's clock, as statements read
//! it): an estimate of it now, to choose the partitions to make ahead of a write, and how far
//! the instance's own clock is from it, for [`PgStats`](crate::PgStats). No judgement of a
//! lease or an expiry reads either: those are made by the statements, on the server.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

pub(crate) struct ServerTime {
    /// The last reading of the server's time, and when (by this instance's monotonic clock).
    last: Mutex<(u64, Instant)>,
    /// The instance's clock minus the server's, ms, at the last reading.
    skew_ms: AtomicI64,
}

impl ServerTime {
    pub(crate) fn new(server_ms: u64, local_ms: u64) -> Self {
        let time = ServerTime {
            last: Mutex::new((server_ms, Instant::now())),
            skew_ms: AtomicI64::new(0),
        };
        time.saw(server_ms, local_ms);
        time
    }

    /// A statement read the server's time `server_ms`; the instance's clock says `local_ms`.
    pub(crate) fn saw(&self, server_ms: u64, local_ms: u64) {
        *self.last.lock() = (server_ms, Instant::now());
        let skew = i128::from(local_ms) - i128::from(server_ms);
        let skew = i64::try_from(skew).unwrap_or(if skew < 0 { i64::MIN } else { i64::MAX });
        self.skew_ms.store(skew, Ordering::Relaxed);
    }

    /// The server's time now, estimated: the last reading plus the time since.
    pub(crate) fn estimate(&self) -> u64 {
        let (at, when) = *self.last.lock();
        let since = u64::try_from(when.elapsed().as_millis()).unwrap_or(u64::MAX);
        at.saturating_add(since)
    }

    pub(crate) fn skew_ms(&self) -> i64 {
        self.skew_ms.load(Ordering::Relaxed)
    }
}
