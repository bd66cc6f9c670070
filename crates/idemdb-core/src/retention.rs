//! Retention settings: how long a record counts as a duplicate (its TTL, per operation), how
//! records are grouped into time partitions, and what happens to a key that comes back after
//! its record was dropped.

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::duration_ms;
use crate::error::InputError;
use crate::record::Record;
use crate::scope::RecordKey;
use crate::state::RecordState;

/// What a store's `reserve` and `execute` do with
/// a key that comes back beyond its duplicate horizon: its record expired and is still stored,
/// or was dropped and its key is still recognised (see [`Retention::horizon_factor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BeyondHorizonPolicy {
    /// Run it as new, but say so: [`Reservation::is_beyond_horizon`](crate::Reservation::is_beyond_horizon)
    /// and the closure transaction's `is_beyond_horizon` are true and
    /// `Stats::beyond_horizon` counts it.
    #[default]
    Flag,
    /// Refuse it with `ReserveOutcome::BeyondHorizon` / `ExecuteOutcome::BeyondHorizon`;
    /// nothing is written.
    Refuse,
}

/// Retention settings; set them with the store's builder (`idemdb::Builder::retention`) or
/// the shortcuts next to it.
///
/// ```
/// use idemdb::{BeyondHorizonPolicy, IdemDb, Retention};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir()?;
/// let retention = Retention::default()
///     .ttl(Duration::from_secs(10 * 60))
///     .operation_ttl("redrive orders", Duration::from_secs(3 * 24 * 3600))
///     .beyond_horizon(BeyondHorizonPolicy::Refuse);
/// let db = IdemDb::builder().retention(retention).open(dir.path().join("db"))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// How long a record counts after its last change, for operations without a TTL of their
    /// own (default 24 hours).
    pub default_ttl: Duration,
    /// Width of a time partition; `None` (the default): the store's own, 10 s embedded
    /// (`idemdb::Builder::DEFAULT_PARTITION_WIDTH`); over PostgreSQL 1 h, the width this
    /// default had before (`PgStoreBuilder::RETENTION_PARTITION_WIDTH`; 6 h for a store built
    /// without a `Retention`). A partition holds the records last changed in one such window
    /// with one TTL, and is dropped whole once they all expired: one width after the last of
    /// them may have (plus the wait for the next compaction).
    pub partition_width: Option<Duration>,
    /// How long a dropped key is still recognised, as a multiple of its TTL counted from the
    /// end of its partition's window (default 4: three TTLs after the drop). At 0 or 1 no key
    /// is kept once dropped; an expired record not yet dropped is still recognised.
    pub horizon_factor: u32,
    /// What to do with a recognised key (default [`BeyondHorizonPolicy::Flag`]).
    pub beyond_horizon: BeyondHorizonPolicy,
    /// How often, in real time, the background compactor looks for due partitions (default
    /// 60 s). `None`: no background thread; call the store's `compact_now`.
    pub compact_interval: Option<Duration>,
    operation_ttls: HashMap<Box<[u8]>, Duration>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            default_ttl: Duration::from_secs(24 * 3600),
            partition_width: None,
            horizon_factor: 4,
            beyond_horizon: BeyondHorizonPolicy::Flag,
            compact_interval: Some(Duration::from_secs(60)),
            operation_ttls: HashMap::new(),
        }
    }
}

impl Retention {
    /// Sets [`default_ttl`](Self::default_ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// A TTL for one operation (as in [`Scope::new`](crate::Scope::new)), overriding the
    /// default.
    pub fn operation_ttl(mut self, operation: impl AsRef<[u8]>, ttl: Duration) -> Self {
        self.operation_ttls.insert(operation.as_ref().into(), ttl);
        self
    }

    /// Sets [`partition_width`](Self::partition_width).
    pub fn partition_width(mut self, width: Duration) -> Self {
        self.partition_width = Some(width);
        self
    }

    /// Sets [`horizon_factor`](Self::horizon_factor).
    pub fn horizon_factor(mut self, factor: u32) -> Self {
        self.horizon_factor = factor;
        self
    }

    /// Sets [`beyond_horizon`](Self::beyond_horizon).
    pub fn beyond_horizon(mut self, policy: BeyondHorizonPolicy) -> Self {
        self.beyond_horizon = policy;
        self
    }

    /// Sets [`compact_interval`](Self::compact_interval).
    pub fn compact_interval(mut self, interval: Option<Duration>) -> Self {
        self.compact_interval = interval;
        self
    }

    /// The TTL in force for `operation`.
    pub fn ttl_for(&self, operation: &[u8]) -> Duration {
        self.operation_ttls
            .get(operation)
            .copied()
            .unwrap_or(self.default_ttl)
    }

    /// Refuses a zero TTL or partition width (under a millisecond).
    pub fn validate(&self) -> Result<(), InputError> {
        let ttls = std::iter::once(("ttl", self.default_ttl))
            .chain(self.operation_ttls.values().map(|t| ("operation ttl", *t)));
        let width = self.partition_width.map(|w| ("partition width", w));
        for (what, d) in ttls.chain(width) {
            if duration_ms(d) == 0 {
                return Err(InputError::Empty { what });
            }
        }
        Ok(())
    }

    /// The partition width in force: the one set, else the store's `default_width`.
    pub fn width_or(&self, default_width: Duration) -> Duration {
        self.partition_width.unwrap_or(default_width)
    }

    /// The settings in milliseconds, as a store computes with them; `default_width` is the
    /// store's, for a [`partition_width`](Self::partition_width) not set.
    pub fn rules(&self, default_width: Duration) -> Rules {
        Rules {
            default_ttl_ms: duration_ms(self.default_ttl),
            width_ms: duration_ms(self.width_or(default_width)),
            horizon_factor: u64::from(self.horizon_factor),
            policy: self.beyond_horizon,
            operation_ttls: self
                .operation_ttls
                .iter()
                .map(|(op, ttl)| (op.clone(), duration_ms(*ttl)))
                .collect(),
        }
    }
}

/// [`Retention`] in milliseconds, as a store's writer and compactor use it.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The TTL of operations without one of their own.
    pub default_ttl_ms: u64,
    /// The width of a time partition.
    pub width_ms: u64,
    /// How many TTLs a removed key stays recognised (0: not at all).
    pub horizon_factor: u64,
    /// What a key beyond its horizon gets.
    pub policy: BeyondHorizonPolicy,
    operation_ttls: HashMap<Box<[u8]>, u64>,
}

impl Rules {
    /// The TTL of the record stored under `key`.
    pub fn ttl_ms(&self, key: &RecordKey) -> u64 {
        if self.operation_ttls.is_empty() {
            return self.default_ttl_ms;
        }
        RecordKey::split(key.as_bytes())
            .and_then(|(op, _, _)| self.operation_ttls.get(op).copied())
            .unwrap_or(self.default_ttl_ms)
    }

    /// Every TTL in use: the default and each operation's.
    pub fn ttls(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.default_ttl_ms).chain(self.operation_ttls.values().copied())
    }

    /// When `rec`, stored under a TTL of `ttl`, expires: a TTL after its lease ends while
    /// IN_PROGRESS, a TTL after its last change once finished (saturating).
    pub fn expires_at(&self, rec: &Record, ttl: u64) -> u64 {
        match rec.state {
            RecordState::InProgress => rec.lease_expires_at.saturating_add(ttl),
            RecordState::Completed | RecordState::Failed => rec.updated_at.saturating_add(ttl),
        }
    }

    /// Until when the key of a swept abandoned IN_PROGRESS record is recognised: its own
    /// lease end + factor × TTL.
    pub fn swept_horizon(&self, rec: &Record, ttl: u64) -> u64 {
        rec.lease_expires_at.saturating_add(self.horizon_ms(ttl))
    }

    /// Whether a key removed at `now` with horizon `until` is kept for recognition.
    pub fn keeps(&self, until: u64, now: u64) -> bool {
        self.recognition() && now < until
    }

    /// Whether removed keys are recognised at all (`horizon_factor > 0`).
    pub fn recognition(&self) -> bool {
        self.horizon_factor > 0
    }

    /// How long a key removed under a TTL of `ttl_ms` stays recognised: factor × TTL.
    pub fn horizon_ms(&self, ttl_ms: u64) -> u64 {
        ttl_ms.saturating_mul(self.horizon_factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;
    use crate::scope::{Key, Scope};

    #[test]
    fn per_operation_ttl_overrides_the_default() {
        let rules = Retention::default()
            .ttl(Duration::from_secs(60))
            .operation_ttl("redrive", Duration::from_secs(7200))
            .rules(Duration::from_secs(10));
        let key = |op: &str| {
            RecordKey::encode(&Scope::new(op, "p"), &Key::new("k"), &Limits::default()).unwrap()
        };
        assert_eq!(rules.ttl_ms(&key("redrive")), 7_200_000);
        assert_eq!(rules.ttl_ms(&key("other")), 60_000);
        assert_eq!(rules.horizon_ms(60_000), 240_000);
    }

    #[test]
    fn zero_durations_are_refused() {
        assert!(Retention::default().ttl(Duration::ZERO).validate().is_err());
        assert!(
            Retention::default()
                .partition_width(Duration::from_micros(10))
                .validate()
                .is_err()
        );
        assert!(
            Retention::default()
                .operation_ttl("x", Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(Retention::default().validate().is_ok());
    }

    #[test]
    fn an_unset_width_is_the_stores_own() {
        let unset = Retention::default();
        assert_eq!(unset.partition_width, None);
        assert_eq!(unset.rules(Duration::from_secs(10)).width_ms, 10_000);
        assert_eq!(unset.rules(Duration::from_secs(3600)).width_ms, 3_600_000);
        let set = unset.partition_width(Duration::from_secs(60));
        assert_eq!(set.rules(Duration::from_secs(10)).width_ms, 60_000);
    }
}
