//! Where `outbox` finds the outbox: a database file, or a PostgreSQL database named by a
//! `postgres://` / `postgresql://` URL (its schema migrated by the service). The same six
//! tools on either: stats, pending, parked, retry, park, purge.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use idemdb::{IdemDb, MessageId, OutboxMessage, OutboxStats};
use idemdb_postgres::{PgError, PgStore, PgStoreBuilder, Retention};

use crate::cli::Global;
use crate::errors::CliError;
use crate::open::open;

/// An open outbox.
pub enum OutboxTarget<'a> {
    File(&'a Path, Box<IdemDb>),
    Postgres {
        /// The URL without its password, for messages.
        shown: String,
        runtime: tokio::runtime::Runtime,
        store: PgStore,
    },
}

/// Whether `target` names a PostgreSQL database rather than a file.
fn is_postgres_url(target: &str) -> bool {
    target.starts_with("postgres://") || target.starts_with("postgresql://")
}

/// `url` without a password, as `user:***@host` (and `password=***` in its query).
pub fn without_password(url: &str) -> String {
    let mut shown = url.to_string();
    if let Some(scheme_end) = shown.find("://") {
        let rest = scheme_end + 3;
        let authority_end = shown[rest..]
            .find(['/', '?'])
            .map_or(shown.len(), |i| rest + i);
        if let Some(at) = shown[rest..authority_end].rfind('@') {
            let userinfo = &shown[rest..rest + at];
            if let Some(colon) = userinfo.find(':') {
                shown.replace_range(rest + colon + 1..rest + at, "***");
            }
        }
    }
    if let Some(q) = shown.find('?') {
        let (head, query) = shown.split_at(q + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => pair.to_string(),
            })
            .collect();
        shown = format!("{head}{}", query.join("&"));
    }
    shown
}

impl<'a> OutboxTarget<'a> {
    /// Opens the file at `target` (as every command does), or connects to the PostgreSQL
    /// database its URL names: a pool of one connection, no compactor, nothing migrated.
    pub fn open(target: &'a Path, global: &Global) -> Result<OutboxTarget<'a>, CliError> {
        let Some(url) = target.to_str().filter(|t| is_postgres_url(t)) else {
            return Ok(OutboxTarget::File(target, Box::new(open(target, global)?)));
        };
        let shown = without_password(url);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::Io(target.to_path_buf(), e))?;
        let pg = |e| CliError::Postgres(shown.clone(), e);
        let store = runtime
            .block_on(async {
                PgStore::builder(url)?
                    .pool_size(1)
                    .pool_wait_timeout(Duration::from_secs(30))
                    .retention(
                        Retention::default()
                            .partition_width(PgStoreBuilder::DEFAULT_PARTITION_WIDTH)
                            .compact_interval(None),
                    )
                    .connect()
                    .await
            })
            .map_err(pg)?;
        Ok(OutboxTarget::Postgres {
            shown,
            runtime,
            store,
        })
    }

    /// `file` on a database file, or `pg` on the store, its error named by path or URL.
    fn call<'s, T, F>(
        &'s self,
        file: impl FnOnce(&IdemDb) -> Result<T, idemdb::Error>,
        pg: impl FnOnce(&'s PgStore) -> F,
    ) -> Result<T, CliError>
    where
        F: Future<Output = Result<T, PgError>> + 's,
    {
        match self {
            OutboxTarget::File(path, db) => file(db).map_err(|e| CliError::from_engine(path, e)),
            OutboxTarget::Postgres {
                shown,
                runtime,
                store,
            } => runtime
                .block_on(pg(store))
                .map_err(|e| CliError::Postgres(shown.clone(), e)),
        }
    }

    pub fn stats(&self) -> Result<OutboxStats, CliError> {
        self.call(|db| db.outbox_stats(), |store| store.outbox_stats())
    }

    /// Up to `limit` pending (or, if `parked`, parked) messages, oldest commit first.
    pub fn list(&self, parked: bool, limit: usize) -> Result<Vec<OutboxMessage>, CliError> {
        if parked {
            self.call(|db| db.outbox_parked(limit), |s| s.outbox_parked(limit))
        } else {
            self.call(|db| db.outbox_pending(limit), |s| s.outbox_pending(limit))
        }
    }

    pub fn retry_parked(&self, id: MessageId) -> Result<bool, CliError> {
        self.call(|db| db.retry_parked(id), |s| s.retry_parked(id))
    }

    pub fn park_message(&self, id: MessageId, reason: &str) -> Result<bool, CliError> {
        self.call(
            |db| db.park_message(id, reason),
            |s| s.park_message(id, reason),
        )
    }

    pub fn purge_parked(&self) -> Result<u64, CliError> {
        self.call(|db| db.purge_parked(), |s| s.purge_parked())
    }

    /// What to name in an I/O error while talking to the operator (the path, or the URL).
    pub fn shown(&self) -> std::path::PathBuf {
        match self {
            OutboxTarget::File(p, _) => p.to_path_buf(),
            OutboxTarget::Postgres { shown, .. } => shown.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_password() {
        assert_eq!(
            without_password("postgres://app:s3cr%40t@db:5432/shop?sslmode=require"),
            "postgres://app:***@db:5432/shop?sslmode=require"
        );
        assert_eq!(
            without_password("postgresql://db/shop?user=app&password=x&sslmode=disable"),
            "postgresql://db/shop?user=app&password=***&sslmode=disable"
        );
        assert_eq!(
            without_password("postgres://app@db/shop"),
            "postgres://app@db/shop"
        );
        assert!(is_postgres_url("postgresql://h/d"));
        assert!(!is_postgres_url("/var/lib/app/idem.db"));
    }
}
