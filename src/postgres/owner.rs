//! The owner's calls over PostgreSQL: each is one update (or delete) guarded by the
//! presented token and the IN_PROGRESS state, so that a stale owner is fenced by the
//! database itself. When the guard matches nothing, the shared `check_owner` says why.

use std::time::Duration;

use super::Inner;
use tokio_postgres::types::ToSql;

use super::errors::{MAX_ATTEMPTS, Step, after_commit, backoff, database, is_retryable, pool};
use super::rows::{Found, KeyParts, ms, newest, state_code, token_value};
use super::wait::{CHANNEL, payload};
use crate::decide::check_owner;
use crate::error::Error;
use crate::ops::lease_ms;
use crate::record::RecordState;
use crate::token::Reservation;

/// Finishes a record; notifies at commit if a duplicate announced it waits (a notification
/// takes a cluster-wide lock through the commit's flush: commits that notify go one at a
/// time, so only those that wake someone do).
pub(crate) const FINISH: &str = "WITH done AS (UPDATE idemdb_records SET state = $5, \
     response = $6, updated_at = $7, expires_at = $8 \
     WHERE operation = $1 AND principal = $2 AND key = $3 AND token = $4 AND state = 1 \
     AND expires_at > $7 RETURNING waiters) \
     SELECT CASE WHEN waiters > 0 THEN pg_notify($9, $10)::text END FROM done";

const RELEASE: &str = "WITH gone AS (DELETE FROM idemdb_records \
     WHERE operation = $1 AND principal = $2 AND key = $3 AND token = $4 AND state = 1 \
     AND expires_at > $5 RETURNING waiters) \
     SELECT CASE WHEN waiters > 0 THEN pg_notify($6, $7)::text END FROM gone";

const EXTEND: &str = "UPDATE idemdb_records SET lease_expires_at = $5, updated_at = $6, \
     expires_at = $7 \
     WHERE operation = $1 AND principal = $2 AND key = $3 AND token = $4 AND state = 1 \
     AND expires_at > $6 RETURNING token";

/// An owner's statement, guarded by its token.
enum OwnerOp<'a> {
    Finish {
        state: RecordState,
        response: &'a [u8],
    },
    Release,
    Extend {
        lease_ms: u64,
    },
}

impl Inner {
    /// Refuses a reservation of another database.
    pub(crate) fn check_issuer(&self, reservation: &Reservation) -> Result<(), Error> {
        if reservation.database_id != self.database_id {
            return Err(Error::ForeignReservation);
        }
        Ok(())
    }

    pub(crate) async fn finish(
        &self,
        reservation: &Reservation,
        state: RecordState,
        response: Vec<u8>,
    ) -> Result<(), Error> {
        self.check_issuer(reservation)?;
        self.limits.check_response(&response)?;
        let op = OwnerOp::Finish {
            state,
            response: &response,
        };
        self.guarded(reservation, &op).await.map(drop)
    }

    pub(crate) async fn release(&self, reservation: &Reservation) -> Result<(), Error> {
        self.check_issuer(reservation)?;
        self.guarded(reservation, &OwnerOp::Release).await.map(drop)
    }

    pub(crate) async fn extend(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> Result<(), Error> {
        self.check_issuer(reservation)?;
        let op = OwnerOp::Extend {
            lease_ms: lease_ms(lease)?,
        };
        reservation.lease_expires_at = self.guarded(reservation, &op).await?;
        Ok(())
    }

    /// Runs `op` with retries; when its guard matches nothing, the error `check_owner` gives
    /// for the record as it is now. The new lease end, for `Extend`.
    async fn guarded(&self, reservation: &Reservation, op: &OwnerOp<'_>) -> Result<u64, Error> {
        let p = KeyParts::of(&reservation.record_key)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let client = self.pool.get().await.map_err(pool)?;
            let now = self.clock.now_ms();
            match self.run_op(&client, reservation, &p, op, now).await {
                Ok(Some(lease_end)) => return Ok(lease_end),
                Ok(None) => {
                    let row = newest(&client, &p).await.map_err(database)?;
                    let live = Found::of(row.as_ref(), self.clock.now_ms())?.live;
                    match check_owner(live, reservation.token) {
                        Err(e) => return Err(e),
                        // Owned after all: the record moved between the two statements.
                        Ok(_) if attempt < MAX_ATTEMPTS => self.counters.retried(),
                        Ok(_) => {
                            return Err(Error::Internal(
                                "a guarded update kept missing its own record".into(),
                            ));
                        }
                    }
                }
                Err(Step::Retry(_)) if attempt < MAX_ATTEMPTS => {
                    self.counters.retried();
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(Step::Retry(e) | Step::Fail(e)) => return Err(e),
            }
        }
    }

    /// One guarded statement (it commits by itself); `None` when it matched nothing.
    async fn run_op(
        &self,
        client: &deadpool_postgres::Client,
        reservation: &Reservation,
        p: &KeyParts<'_>,
        op: &OwnerOp<'_>,
        now: u64,
    ) -> Result<Option<u64>, Step> {
        let key = &reservation.record_key;
        let ttl = self.rules.ttl_ms(key);
        let token = token_value(reservation.token);
        let (channel, hash) = (CHANNEL, payload(key));
        let (p1, p2, p3) = (&p.operation, &p.principal, &p.key);
        let (sql, lease_end, expires) = match op {
            OwnerOp::Finish { .. } => (FINISH, 0, now.saturating_add(ttl)),
            OwnerOp::Release => (RELEASE, 0, 0),
            OwnerOp::Extend { lease_ms } => {
                let lease_end = now.saturating_add(*lease_ms);
                (EXTEND, lease_end, lease_end.saturating_add(ttl))
            }
        };
        if expires > 0 {
            self.partitions
                .ensure(client, expires)
                .await
                .map_err(Step::before_commit)?;
        }
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(Step::before_commit)?;
        let (now_v, expires_v, lease_v) = (ms(now), ms(expires), ms(lease_end));
        let result = match op {
            OwnerOp::Finish { state, response } => {
                let state = state_code(*state);
                let params: [&(dyn ToSql + Sync); 10] = [
                    p1, p2, p3, &token, &state, response, &now_v, &expires_v, &channel, &hash,
                ];
                client.query(&stmt, &params).await
            }
            OwnerOp::Release => {
                let params: [&(dyn ToSql + Sync); 7] =
                    [p1, p2, p3, &token, &now_v, &channel, &hash];
                client.query(&stmt, &params).await
            }
            OwnerOp::Extend { .. } => {
                let params: [&(dyn ToSql + Sync); 7] =
                    [p1, p2, p3, &token, &lease_v, &now_v, &expires_v];
                client.query(&stmt, &params).await
            }
        };
        match result {
            Ok(rows) if rows.is_empty() => Ok(None),
            Ok(_) => Ok(Some(lease_end)),
            Err(e) if is_retryable(&e) => Err(Step::Retry(database(e))),
            // The server answered: refused, nothing changed. Else the commit may have happened.
            Err(e) => Err(Step::Fail(after_commit(e))),
        }
    }
}
