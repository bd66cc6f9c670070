//! The owner's calls over PostgreSQL: each is one update (or delete) guarded by the
//! presented token and the IN_PROGRESS state, so that a stale owner is fenced by the
//! database itself. When the guard matches nothing, the shared `check_owner` says why.

use idemdb_core::error::Refusal;
use std::time::Duration;

use super::store::Inner;
use tokio_postgres::types::ToSql;

use super::batch::{BatchAnswer, BatchOp, answer_of};
use super::batch_run::Turn;
use super::errors::{MAX_ATTEMPTS, Step, backoff, database, partition_missing, pool};
use super::rows::{Found, KeyParts, newest, state_code, stored_ms, token_value};
use super::sql::{clock, key_is_params, span};
use super::wait::{CHANNEL, payload};
use crate::error::PgError;
use idemdb_core::RecordState;
use idemdb_core::clock::lease_ms;
use idemdb_core::decide::check_owner;
use idemdb_core::token::Reservation;

/// Finishes a record (`$5` state, `$6` response, `$7` TTL); notifies at commit if a duplicate
/// announced it waits (a notification takes a cluster-wide lock through the commit's flush:
/// commits that notify go one at a time, so only those that wake someone do).
pub(crate) const FINISH: &str = concat!(
    "WITH ",
    clock!(),
    ", done AS (UPDATE idemdb_records SET state = $5, response = $6, \
     updated_at = clock.now_ms, expires_at = clock.now_ms + $7 FROM clock WHERE ",
    key_is_params!(),
    " AND token = $4 AND state = 1 AND expires_at > clock.now_ms \
     RETURNING idemdb_records.waiters) \
     SELECT CASE WHEN waiters > 0 THEN pg_notify($8, $9)::text END FROM done"
);

const RELEASE: &str = concat!(
    "WITH ",
    clock!(),
    ", gone AS (DELETE FROM idemdb_records USING clock WHERE ",
    key_is_params!(),
    " AND token = $4 AND state = 1 AND expires_at > clock.now_ms \
     RETURNING idemdb_records.waiters) \
     SELECT CASE WHEN waiters > 0 THEN pg_notify($5, $6)::text END FROM gone"
);

/// Renews the lease (`$5`) from the store's time; `$6` the TTL.
const EXTEND: &str = concat!(
    "WITH ",
    clock!(),
    " UPDATE idemdb_records SET lease_expires_at = clock.now_ms + $5, \
     updated_at = clock.now_ms, expires_at = clock.now_ms + $5 + $6 FROM clock WHERE ",
    key_is_params!(),
    " AND token = $4 AND state = 1 AND expires_at > clock.now_ms \
     RETURNING idemdb_records.lease_expires_at"
);

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
    pub(crate) fn check_issuer(&self, reservation: &Reservation) -> Result<(), PgError> {
        if reservation.database_id() != self.database_id {
            return Err(PgError::Refused(Refusal::ForeignReservation));
        }
        Ok(())
    }

    pub(crate) async fn finish(
        &self,
        reservation: &Reservation,
        state: RecordState,
        response: Vec<u8>,
    ) -> Result<(), PgError> {
        self.check_issuer(reservation)?;
        self.limits.check_response(&response)?;
        let op = OwnerOp::Finish {
            state,
            response: &response,
        };
        self.guarded(reservation, &op).await.map(drop)
    }

    pub(crate) async fn release(&self, reservation: &Reservation) -> Result<(), PgError> {
        self.check_issuer(reservation)?;
        self.guarded(reservation, &OwnerOp::Release).await.map(drop)
    }

    pub(crate) async fn extend(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> Result<(), PgError> {
        self.check_issuer(reservation)?;
        let op = OwnerOp::Extend {
            lease_ms: lease_ms(lease)?,
        };
        let renewed = self.guarded(reservation, &op).await?;
        reservation.renewed(renewed);
        Ok(())
    }

    /// Runs `op` with retries; when its guard matches nothing, the error `check_owner` gives
    /// for the record as it is now. The new lease end, for `Extend`.
    async fn guarded(&self, reservation: &Reservation, op: &OwnerOp<'_>) -> Result<u64, PgError> {
        let OwnerOp::Finish { state, response } = op else {
            return self.guarded_alone(reservation, op).await;
        };
        let key = reservation.record_key();
        let turn = self.turn(|| BatchOp::Finish {
            key: key.clone(),
            token: reservation.token(),
            state: state_code(*state),
            response: response.to_vec(),
            ttl_ms: self.rules.ttl_ms(key),
        });
        let rx = match turn {
            Turn::Alone(running) => {
                let answer = self.guarded_alone(reservation, op).await;
                drop(running);
                return answer;
            }
            Turn::Queued(rx) => rx,
        };
        match answer_of(rx).await? {
            BatchAnswer::Finished => Ok(0),
            // Matched nothing, or the batch could not run it: nothing of it committed; on
            // its own path `check_owner` says why, or it runs again.
            BatchAnswer::Reserved(_) | BatchAnswer::Alone => {
                self.guarded_alone(reservation, op).await
            }
        }
    }

    /// [`guarded`](Self::guarded) on the call's own path.
    async fn guarded_alone(
        &self,
        reservation: &Reservation,
        op: &OwnerOp<'_>,
    ) -> Result<u64, PgError> {
        let p = KeyParts::of(reservation.record_key())?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let client = self.pool.get().await.map_err(pool)?;
            match self.run_op(&client, reservation, &p, op).await {
                Ok(Some(lease_end)) => return Ok(lease_end),
                Ok(None) => {
                    let row = newest(&client, &p).await.map_err(database)?;
                    let live = self.seen(Found::of(&row, 9)?).live;
                    match check_owner(live, reservation.token()) {
                        Err(e) => return Err(e.into()),
                        // Owned after all: the record moved between the two statements.
                        Ok(_) if attempt < MAX_ATTEMPTS => self.counters.retried(),
                        Ok(_) => {
                            return Err(PgError::Internal(
                                "a guarded update kept missing its own record".into(),
                            ));
                        }
                    }
                }
                Err(Step::Partition(at)) if attempt < MAX_ATTEMPTS => {
                    self.counters.retried();
                    self.remake_partition(at).await?;
                }
                Err(Step::Retry(_)) if attempt < MAX_ATTEMPTS => {
                    self.counters.retried();
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(Step::Partition(_)) => return Err(partition_missing()),
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
    ) -> Result<Option<u64>, Step> {
        let key = reservation.record_key();
        let ttl = self.rules.ttl_ms(key);
        let token = token_value(reservation.token());
        let (channel, hash) = (CHANNEL, payload(key));
        let (p1, p2, p3) = (&p.operation, &p.principal, &p.key);
        // Where the write will land, estimated: a missed partition is made when the write
        // says so, and the write runs again.
        let (sql, expires) = match op {
            OwnerOp::Finish { .. } => (FINISH, Some(ttl)),
            OwnerOp::Release => (RELEASE, None),
            OwnerOp::Extend { lease_ms } => (EXTEND, Some(lease_ms.saturating_add(ttl))),
        };
        if let Some(span_ms) = expires {
            let expires = self.server_time().saturating_add(span_ms);
            self.partitions
                .ensure(client, expires)
                .await
                .map_err(Step::before_commit)?;
        }
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(Step::before_commit)?;
        let ttl_v = span(ttl);
        let began = std::time::Instant::now();
        let result = match op {
            OwnerOp::Finish { state, response } => {
                let state = state_code(*state);
                let params: [&(dyn ToSql + Sync); 9] = [
                    p1, p2, p3, &token, &state, response, &ttl_v, &channel, &hash,
                ];
                client.query(&stmt, &params).await
            }
            OwnerOp::Release => {
                let params: [&(dyn ToSql + Sync); 6] = [p1, p2, p3, &token, &channel, &hash];
                client.query(&stmt, &params).await
            }
            OwnerOp::Extend { lease_ms } => {
                let lease_v = span(*lease_ms);
                let params: [&(dyn ToSql + Sync); 6] = [p1, p2, p3, &token, &lease_v, &ttl_v];
                client.query(&stmt, &params).await
            }
        };
        let rows = result.map_err(Step::autocommit)?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        self.counters.committed(began.elapsed());
        match op {
            OwnerOp::Extend { .. } => {
                let lease_end: i64 = row.try_get(0).map_err(Step::before_commit)?;
                Ok(Some(stored_ms(lease_end)?))
            }
            _ => Ok(Some(0)),
        }
    }
}
