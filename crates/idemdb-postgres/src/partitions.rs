//! Time partitions of `idemdb_records`, by range of `expires_at`: made before a write needs
//! them (and ahead of time by the compactor), dropped whole once every row in them expired.
//! Never a `DELETE` sweep.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_postgres::error::SqlState;

use super::errors::database;
use super::rows::{ms, stored_ms};
use super::sql::clock;
use crate::error::PgError;

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgCompaction {
    /// Partitions dropped whole (every row in them had expired).
    pub partitions_dropped: u64,
    /// Partitions made ahead of the writes that will need them.
    pub partitions_created: u64,
    /// The longest time one partition took to detach and drop.
    pub longest_drop: Duration,
}

/// How far past the expiry a write was estimated to have the partitions made ahead of it:
/// the estimate of the server's time is the last reading plus the time since.
pub(crate) const PARTITION_SLACK_MS: u64 = 60_000;

/// The partitions this store knows exist, by start (ms).
pub(crate) struct Partitions {
    width_ms: u64,
    known: Mutex<HashSet<i64>>,
}

/// Partition names carry their bounds: `idemdb_records_<start>_<end>`, ms.
const PREFIX: &str = "idemdb_records_";

impl Partitions {
    pub(crate) fn new(width_ms: u64) -> Self {
        Partitions {
            width_ms: width_ms.max(1),
            known: Mutex::new(HashSet::new()),
        }
    }

    /// The bounds of the partition holding `expires_at`; the end is `None` for the last one.
    fn bounds(&self, expires_at: u64) -> (i64, Option<i64>) {
        let e = ms(expires_at);
        let width = ms(self.width_ms);
        let start = e - e.rem_euclid(width);
        (start, start.checked_add(width))
    }

    /// Makes sure the partitions for every `expires_at` in `from..=to` exist.
    pub(crate) async fn ensure_range(
        &self,
        client: &tokio_postgres::Client,
        from: u64,
        to: u64,
    ) -> Result<u64, tokio_postgres::Error> {
        let mut made = 0;
        let mut at = from;
        loop {
            made += u64::from(self.ensure(client, at).await?);
            let (_, end) = self.bounds(at);
            match end {
                Some(end) if u64::try_from(end).is_ok_and(|end| end <= to) => {
                    at = u64::try_from(end).unwrap_or(u64::MAX);
                }
                _ => return Ok(made),
            }
        }
    }

    /// Makes sure the partition for `expires_at` exists; whether this call made it. On the
    /// caller's own connection, outside any transaction: a second connection from the pool
    /// could wait for a pool that every holder is waiting on.
    pub(crate) async fn ensure(
        &self,
        client: &tokio_postgres::Client,
        expires_at: u64,
    ) -> Result<bool, tokio_postgres::Error> {
        let (start, end) = self.bounds(expires_at);
        if self.known.lock().contains(&start) {
            return Ok(false);
        }
        let (name, to) = match end {
            Some(end) => (format!("{PREFIX}{start}_{end}"), end.to_string()),
            None => (format!("{PREFIX}{start}_max"), "MAXVALUE".to_string()),
        };
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {name} PARTITION OF idemdb_records \
             FOR VALUES FROM ({start}) TO ({to})"
        );
        let made = match client.batch_execute(&sql).await {
            Ok(()) => true,
            // Another instance made it at the same moment, or a partition of another width
            // covers the range: the write finds its partition or says none does.
            Err(e)
                if matches!(
                    e.code(),
                    Some(
                        &SqlState::DUPLICATE_TABLE
                            | &SqlState::UNIQUE_VIOLATION
                            | &SqlState::INVALID_OBJECT_DEFINITION
                    )
                ) =>
            {
                false
            }
            // A deadlock with writes waiting on each other is retried by the caller.
            Err(e) => return Err(e),
        };
        self.known.lock().insert(start);
        Ok(made)
    }

    /// Forgets what is known of the partition holding `expires_at` and makes sure it exists:
    /// after a write found it missing (another instance dropped it, or the cache was wrong).
    pub(crate) async fn remake(
        &self,
        client: &tokio_postgres::Client,
        expires_at: u64,
    ) -> Result<bool, tokio_postgres::Error> {
        let (start, _) = self.bounds(expires_at);
        self.known.lock().remove(&start);
        self.ensure(client, expires_at).await
    }

    /// Forgets every partition known: the next writes make sure of theirs again.
    pub(crate) fn forget_all(&self) {
        self.known.lock().clear();
    }

    /// Drops every partition whose rows have all expired by the store's time (the server's
    /// clock, read by the statement that lists them): detached first (concurrently, where
    /// the server can, so that writes are not blocked) then dropped. The store's time.
    pub(crate) async fn drop_expired(
        &self,
        client: &tokio_postgres::Client,
        report: &mut PgCompaction,
    ) -> Result<u64, PgError> {
        let row = client
            .query_one(
                concat!(
                    "WITH ",
                    clock!(),
                    " SELECT (SELECT now_ms FROM clock), array(SELECT c.relname::text \
                     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                     WHERE i.inhparent = 'idemdb_records'::regclass)"
                ),
                &[],
            )
            .await
            .map_err(database)?;
        let now: i64 = row.try_get(0).map_err(database)?;
        let names: Vec<String> = row.try_get(1).map_err(database)?;
        for name in names {
            let Some((start, Some(end))) = parse(&name) else {
                continue;
            };
            // Every row in it has expires_at < end ≤ now: expired on every read already.
            if end > now {
                continue;
            }
            let began = Instant::now();
            detach(client, &name).await?;
            client
                .batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
                .await
                .map_err(database)?;
            report.longest_drop = report.longest_drop.max(began.elapsed());
            report.partitions_dropped += 1;
            self.known.lock().remove(&start);
        }
        stored_ms(now)
    }
}

/// Detaches `name` without blocking writes (PostgreSQL 14+), finishing a detach an earlier
/// compaction left half done; on older servers the drop alone does it.
async fn detach(client: &tokio_postgres::Client, name: &str) -> Result<(), PgError> {
    let concurrently = format!("ALTER TABLE idemdb_records DETACH PARTITION {name} CONCURRENTLY");
    match client.batch_execute(&concurrently).await {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) => {
            let finalize = format!("ALTER TABLE idemdb_records DETACH PARTITION {name} FINALIZE");
            client.batch_execute(&finalize).await.map_err(database)
        }
        Err(e) if e.code() == Some(&SqlState::SYNTAX_ERROR) => Ok(()),
        // Detached by another instance's compactor meanwhile: the drop finds it or not.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(()),
        Err(e) if e.code() == Some(&SqlState::INVALID_OBJECT_DEFINITION) => Ok(()),
        Err(e) => Err(database(e)),
    }
}

/// The bounds in a partition's name; `None` for a table that is not one of idemdb's.
fn parse(name: &str) -> Option<(i64, Option<i64>)> {
    let (start, end) = name.strip_prefix(PREFIX)?.split_once('_')?;
    let start = start.parse().ok()?;
    let end = match end {
        "max" => None,
        e => Some(e.parse().ok()?),
    };
    Some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_names_round_trip() {
        let p = Partitions::new(3_600_000);
        assert_eq!(p.bounds(7_200_001), (7_200_000, Some(10_800_000)));
        assert_eq!(p.bounds(0), (0, Some(3_600_000)));
        // The last window is open-ended: its end would pass bigint's.
        let (start, end) = p.bounds(u64::MAX);
        assert_eq!(end, None);
        assert_eq!(start, i64::MAX - i64::MAX % 3_600_000);
        assert_eq!(
            parse("idemdb_records_0_3600000"),
            Some((0, Some(3_600_000)))
        );
        assert_eq!(parse("idemdb_records_7_max"), Some((7, None)));
        assert_eq!(parse("idemdb_records_key"), None);
        assert_eq!(parse("orders_1_2"), None);
    }
}
