//! `reserve` and `reserve_or_wait`, sync and async: a duplicate is answered from the shared
//! snapshot when it can be; an acquisition goes to the writer, which decides again inside its
//! write transaction (atomic reservation).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::{Call, lease_ms, unexpected};
use crate::db::IdemDb;
use crate::error::Error;
use crate::observe::snapshot_span;
use crate::stats::{Counter, StatsCollector};
use crate::timer::Timer;
use crate::wait::WaitGuard;
use crate::writer::op::{OpOutput, RecordOp, WriteOp};
use idemdb_core::decide::{Decision, Replay, decide};
use idemdb_core::fingerprint::{Fingerprint, Payload};
use idemdb_core::outcome::ReserveOutcome;
use idemdb_core::scope::{Key, RecordKey, Scope};

type Reserved = Result<ReserveOutcome, Error>;

impl IdemDb {
    /// Reserves the intent `key` in `scope` for the request `payload`, atomically.
    ///
    /// Returns exactly one [`ReserveOutcome`]; see docs/semantics.md for the full table. On
    /// `Acquired` the IN_PROGRESS record is durable and leased for `lease`; the caller runs
    /// the work and then calls [`complete`](Self::complete), [`fail`](Self::fail) or
    /// [`release`](Self::release). Replays and in-progress answers come from a snapshot
    /// without waiting for the writer.
    ///
    /// ```
    /// use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let db = IdemDb::open(dir.path().join("db"))?;
    /// let scope = Scope::new("POST /orders", "user-7"); // operation + principal
    /// let key = Key::new("intent-1");                    // the Idempotency-Key
    /// let lease = Duration::from_secs(30);
    ///
    /// let ReserveOutcome::Acquired(owner) = db.reserve(&scope, &key, b"{\"sku\":1}", lease)? else {
    ///     panic!("a fresh key is acquired");
    /// };
    /// // A duplicate while the owner works is told to retry later (409): it does not run.
    /// assert!(matches!(
    ///     db.reserve(&scope, &key, b"{\"sku\":1}", lease)?,
    ///     ReserveOutcome::InProgress { .. }
    /// ));
    /// // Another request under the same key is refused (422), never given this one's answer.
    /// assert_eq!(db.reserve(&scope, &key, b"{\"sku\":2}", lease)?, ReserveOutcome::Mismatch);
    /// db.complete(&owner, b"201 order o-1".to_vec())?;
    /// // Every retry now gets the first answer, byte for byte.
    /// assert_eq!(
    ///     db.reserve(&scope, &key, b"{\"sku\":1}", lease)?,
    ///     ReserveOutcome::Completed(b"201 order o-1".to_vec())
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> Reserved {
        self.call(self.prepare_reserve(scope, key, payload.into(), lease))
    }

    /// [`reserve`](Self::reserve), awaiting the commit instead of blocking.
    ///
    /// ```
    /// # use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// let scope = Scope::new("purchase", "u1");
    /// let outcome = block_on(db.reserve_async(
    ///     &scope, &Key::new("k"), b"req", Duration::from_secs(30)))?;
    /// assert!(matches!(outcome, ReserveOutcome::Acquired(_)));
    /// // Any executor will do: the engine's own thread wakes the task. The smallest one:
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::sync::Arc;
    /// #     use std::task::{Context, Poll, Wake};
    /// #     struct Unpark(std::thread::Thread);
    /// #     impl Wake for Unpark {
    /// #         fn wake(self: Arc<Self>) { self.0.unpark() }
    /// #     }
    /// #     let waker = Arc::new(Unpark(std::thread::current())).into();
    /// #     let mut cx = Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; }
    /// #         std::thread::park();
    /// #     }
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reserve_async<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> Reserved {
        let call = self.prepare_reserve(scope, key, payload.into(), lease);
        self.call_async(call).await
    }

    /// Like [`reserve`](Self::reserve), but a duplicate that finds the intent IN_PROGRESS waits,
    /// in this process, until the owner completes, fails or releases it (it is woken by the
    /// owner's commit, not by polling), or until its lease runs out and it may take over, or
    /// until `timeout` passes, when it returns `InProgress`.
    ///
    /// The timeout is measured in real time; lease expiry by the database's clock.
    pub fn reserve_or_wait<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> Reserved {
        // Refused input counts as nothing, as for `reserve`.
        let wait = Wait::new(self, scope, key, payload.into(), lease, timeout)?;
        let waiter = self.engine.waits.register(&wait.key);
        let outcome = loop {
            let seen = waiter.generation();
            let outcome = self.call(wait.attempt(self));
            match outcome.as_ref().map(|o| wait.next_look(o)) {
                Ok(Some(until)) => waiter.wait_past(seen, until),
                _ => break outcome,
            };
        };
        // Each attempt went uncounted: the caller is told once.
        self.call(Call::answer(outcome).counted(count_reserve))
    }

    /// [`reserve_or_wait`](Self::reserve_or_wait), awaiting instead of blocking: the task is
    /// woken by the owner's commit, or by idemdb's timer thread when the owner's lease or
    /// `timeout` runs out.
    pub async fn reserve_or_wait_async<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> Reserved {
        // Refused input counts as nothing, as for `reserve`.
        let wait = Wait::new(self, scope, key, payload.into(), lease, timeout)?;
        let waiter = self.engine.waits.register(&wait.key);
        let outcome = loop {
            let seen = waiter.generation();
            let outcome = self.call_async(wait.attempt(self)).await;
            let until = match outcome.as_ref().map(|o| wait.next_look(o)) {
                Ok(Some(until)) => until,
                _ => break outcome,
            };
            let timer = match self.timer() {
                Ok(timer) => timer,
                Err(e) => break Err(e),
            };
            WaitUntil {
                waiter: &waiter,
                seen,
                until,
                timer,
                registration: None,
            }
            .await;
        };
        // Each attempt went uncounted: the caller is told once.
        self.call(Call::answer(outcome).counted(count_reserve))
    }

    pub(crate) fn prepare_reserve(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
    ) -> Call<'static, Reserved> {
        let prepared = || {
            let record_key = RecordKey::encode(scope, key, self.limits())?;
            let lease_ms = lease_ms(lease)?;
            let fingerprint = self.fingerprinter.resolve(payload);
            self.reserve_encoded(record_key, fingerprint, lease_ms)
        };
        Call::checked(prepared()).counted(count_reserve)
    }

    /// A reservation of an encoded key: the snapshot's answer, or the op for the writer.
    fn reserve_encoded(
        &self,
        key: RecordKey,
        fingerprint: Fingerprint,
        lease_ms: u64,
    ) -> Result<Call<'static, Reserved>, Error> {
        if let Some(replay) = self.answer_from_snapshot(&key, fingerprint)? {
            return Ok(Call::answer(Ok(replay.into())));
        }
        let op = WriteOp::Record {
            key,
            op: RecordOp::Reserve {
                fingerprint,
                lease_ms,
            },
        };
        Ok(Call::submit(op, |out| match out? {
            OpOutput::Reserved(outcome) => Ok(outcome),
            other => Err(unexpected(other)),
        }))
    }

    /// The answer a duplicate gets without writing, if the snapshot decides it and what it
    /// shows is durable. `None`: the writer must decide, inside its write transaction.
    pub(crate) fn answer_from_snapshot(
        &self,
        key: &RecordKey,
        fingerprint: Fingerprint,
    ) -> Result<Option<Replay>, Error> {
        let span = snapshot_span(key);
        let _span = span.enter();
        let engine = &*self.engine;
        let now = engine.clock.now_ms();
        let hash = engine.layout.index.hash(key.as_bytes());
        // The generation is read with the probe, before the snapshot: a fill must not outlive
        // a change committed after it.
        let (cached, seen) = engine.replays.get(key, hash);
        if let Some(cached) = cached.filter(|r| !r.is_expired(now))
            && let Decision::Replay(r) = decide(Some(cached), fingerprint, now)
            && engine.durability.pending_for(key).is_none()
        {
            return Ok(Some(r));
        }
        let existing = engine.snapshots.find(key, now)?.live;
        // A live finished record is always answered as a replay (`decide`), so it is filled
        // exactly when it is answered: when it is durable, and from its second sighting on
        // (`admit`). `fill` skips IN_PROGRESS ones.
        if let Some(record) = &existing
            && engine.durability.pending_for(key).is_none()
            && engine.replays.admit(hash)
        {
            engine.replays.fill(key, hash, record, seen);
        }
        match decide(existing, fingerprint, now) {
            Decision::Replay(r) if engine.durability.pending_for(key).is_none() => Ok(Some(r)),
            _ => Ok(None),
        }
    }
}

/// Counts what a reservation was told.
fn count_reserve(stats: &StatsCollector, result: &Reserved) {
    match result {
        Ok(ReserveOutcome::Acquired(r)) => {
            stats.add(Counter::Acquired);
            if r.is_takeover() {
                stats.add(Counter::Takeovers);
            }
        }
        Ok(ReserveOutcome::Completed(_)) => stats.add(Counter::ReplaysCompleted),
        Ok(ReserveOutcome::Failed(_)) => stats.add(Counter::ReplaysFailed),
        Ok(ReserveOutcome::Mismatch) => stats.add(Counter::Mismatches),
        Ok(ReserveOutcome::InProgress { .. }) => stats.add(Counter::InProgress),
        Ok(ReserveOutcome::BeyondHorizon) | Err(_) => {}
    }
}

/// A `reserve_or_wait` under way: what each attempt reserves, and until when it may wait.
struct Wait {
    key: RecordKey,
    fingerprint: Fingerprint,
    lease_ms: u64,
    deadline: Option<Instant>,
}

impl Wait {
    fn new(
        db: &IdemDb,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Wait, Error> {
        Ok(Wait {
            key: RecordKey::encode(scope, key, db.limits())?,
            lease_ms: lease_ms(lease)?,
            fingerprint: db.fingerprinter.resolve(payload),
            deadline: Instant::now().checked_add(timeout),
        })
    }

    /// One attempt: a reservation of the key, not counted (the wait's answer is).
    fn attempt(&self, db: &IdemDb) -> Call<'static, Reserved> {
        Call::checked(db.reserve_encoded(self.key.clone(), self.fingerprint, self.lease_ms))
    }

    /// After an attempt answered `outcome`: when to look again (if the intent is in progress,
    /// the owner's lease end or the timeout, whichever comes first), or `None` when the
    /// caller is answered now.
    fn next_look(&self, outcome: &ReserveOutcome) -> Option<Instant> {
        let ReserveOutcome::InProgress { retry_after } = *outcome else {
            return None;
        };
        let now = Instant::now();
        let lease_end = now.checked_add(retry_after);
        match (self.deadline, lease_end) {
            (Some(d), _) if d <= now => None,
            (Some(d), Some(l)) => Some(d.min(l)),
            (Some(d), None) => Some(d),
            (None, Some(l)) => Some(l),
            (None, None) => Some(now + Duration::from_secs(3600)),
        }
    }
}

/// Resolves when the key changes or `until` passes.
struct WaitUntil<'a> {
    waiter: &'a WaitGuard<'a>,
    seen: u64,
    until: Instant,
    timer: &'a Timer,
    registration: Option<u64>,
}

impl Future for WaitUntil<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.waiter.poll_past(self.seen, cx).is_ready() || Instant::now() >= self.until {
            return Poll::Ready(());
        }
        match self.registration {
            Some(id) => self.timer.update(id, cx.waker()),
            None => {
                let id = self.timer.register(self.until, cx.waker().clone());
                self.registration = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for WaitUntil<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.registration {
            self.timer.cancel(id);
        }
    }
}
