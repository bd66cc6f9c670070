//! The one place every write goes through: a leader-based group commit.
//!
//! A caller queues its op. If no commit is running it becomes the leader: it takes what is
//! queued (its own op first, up to `max_batch`), applies it on its own thread, makes it
//! durable with one fsync'd commit, answers the followers and hands leadership to the first op
//! that queued meanwhile. A lone caller pays one commit and no thread hand-off; under load, a
//! batch is whatever arrived while the previous commit ran.
//!
//! Within a batch, ops without closures share a transaction; each op that runs caller code
//! gets a transaction of its own so its failure undoes only its writes. All transactions but
//! the last commit with `Durability::None` (visible, not yet on disk); the last one commits
//! durably and covers them. Nobody is answered before that durable commit returns.

mod apply;
pub(crate) mod op;
mod queue;

use std::ops::Range;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use redb::{Durability, WriteTransaction};

use crate::config::WriterConfig;
use crate::engine::Engine;
use crate::error::Error;
use crate::meta::{META, NEXT_TOKEN_KEY};
use crate::reentry::Committing;
use crate::scope::RecordKey;
use crate::stats::Counter;

use apply::{Applied, Ctx, Records, apply};
use op::{OpOutput, WriteOp};
use queue::{Job, Queue};

/// The queue, the leader state and the commits: everything that writes goes through here.
pub(crate) struct Writer {
    pub(crate) engine: Arc<Engine>,
    config: WriterConfig,
    queue: Mutex<Queue>,
    /// Wakes the committer thread (with `queue`'s lock) to lead for async callers.
    committer: Condvar,
    /// Wakes sync callers waiting for room in a full queue (with `queue`'s lock).
    room: Condvar,
    /// Held by the leader for the whole batch.
    leader: Mutex<LeaderState>,
}

/// Tokens reserved on disk at a time: the meta entry `next_token` is a ceiling, rewritten only
/// when issued tokens reach it, so most batches skip the meta write. After a reopen, tokens
/// resume at the ceiling; up to this many are skipped, never reused.
const TOKEN_BLOCK: u64 = 4096;

/// One applied, not yet committed transaction of a batch.
struct Segment {
    txn: WriteTransaction,
    applied: Vec<Applied>,
    /// The token ceiling this transaction writes, to take effect in memory once it commits.
    ceiling: Option<u64>,
    /// Partitions it added to the catalog (forgotten unless it commits), and how many of
    /// them lie behind a newer one.
    created: (Vec<crate::partition::PartitionId>, u64),
}

struct LeaderState {
    next_token: u64,
    /// The committed ceiling: every token in a committed record is below it.
    token_ceiling: u64,
    batch_seq: u64,
}

impl Writer {
    pub(crate) fn new(engine: Arc<Engine>, config: WriterConfig, next_token: u64) -> Self {
        Writer {
            engine,
            config,
            queue: Mutex::new(Queue::default()),
            committer: Condvar::new(),
            room: Condvar::new(),
            leader: Mutex::new(LeaderState {
                next_token,
                token_ceiling: next_token,
                batch_seq: 0,
            }),
        }
    }

    /// Runs `f` in a durable write transaction of its own, between the writer's batches (the
    /// compactor's drops); once it committed, `publish` applies its in-memory side, still
    /// between batches, and the snapshot is refreshed. A failed commit poisons the writer, as
    /// a batch's would, and publishes nothing.
    pub(crate) fn exclusive<T>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T, Error>,
        publish: impl FnOnce(&T),
    ) -> Result<T, Error> {
        let engine = &*self.engine;
        let _leader = self.leader.lock();
        if engine.is_poisoned() {
            return Err(engine.refusal());
        }
        let fail = |e: Error| {
            engine.poison();
            match e {
                Error::Storage(s) => Error::OutcomeUnknown(s),
                other => other,
            }
        };
        let mut txn = engine.db.begin_write().map_err(|e| fail(e.into()))?;
        txn.set_quick_repair(self.config.quick_repair);
        let out = match f(&txn) {
            Ok(out) => out,
            Err(e) => {
                // Nothing committed; but a storage error is treated as a failed commit.
                let _ = txn.abort();
                return Err(match e {
                    e @ (Error::Storage(_) | Error::OutcomeUnknown(_)) => fail(e),
                    other => other,
                });
            }
        };
        txn.commit().map_err(|e| fail(e.into()))?;
        publish(&out);
        engine.snapshots.refresh();
        Ok(out)
    }

    fn commit_batch(&self, batch: Vec<Job>) -> Vec<Result<OpOutput, Error>> {
        let _committing = Committing::start();
        let engine = &*self.engine;
        let n = batch.len();
        let started = std::time::Instant::now();
        if engine.is_poisoned() {
            return (0..n).map(|_| Err(engine.refusal())).collect();
        }
        let mut leader = self.leader.lock();
        leader.batch_seq += 1;
        let seq = leader.batch_seq;
        let LeaderState {
            next_token,
            token_ceiling,
            ..
        } = &mut *leader;
        let now_ms = engine.clock.now_ms();
        engine.layout.note_write_time(now_ms);
        let keys: Vec<Option<RecordKey>> = batch.iter().map(|j| j.op.key().cloned()).collect();
        let segments = segments(&batch);
        let mut ops = batch.into_iter().map(|j| j.op);
        let mut results: Vec<Result<OpOutput, Error>> = Vec::with_capacity(n);
        let mut changed: Vec<bool> = Vec::with_capacity(n);
        // Some non-durable commit of this batch is not yet covered by a durable one.
        let mut uncovered = false;
        let mut committed = false;
        let last = segments.len().saturating_sub(1);
        for (i, range) in segments.iter().enumerate() {
            let durable = i == last;
            let seg_ops: Vec<WriteOp> = ops.by_ref().take(range.len()).collect();
            let mut ctx = Ctx {
                now_ms,
                database_id: engine.database_id,
                next_token,
                limits: &engine.limits,
            };
            let segment = self.apply_segment(seg_ops, durable, &mut ctx, *token_ceiling);
            let Segment {
                txn,
                applied,
                ceiling,
                created,
            } = match segment {
                Ok(done) => done,
                Err(e) => return self.fail_batch(e, n),
            };
            let rollback = applied.iter().find(|a| a.abort).map(|a| match &a.output {
                Err(e) => e.clone(),
                Ok(_) => Error::Internal("rolled back without an error".into()),
            });
            // A transaction that changed nothing is not worth an fsync.
            let wrote = applied.iter().any(|a| a.changed);
            let step = match &rollback {
                None if wrote => {
                    if !durable {
                        // A `run` has no key; the mark still holds back `begin_read`.
                        engine
                            .durability
                            .mark(keys[range.clone()].iter().flatten(), seq);
                    }
                    txn.commit().map_err(Error::from)
                }
                _ => txn.abort().map_err(Error::from).and_then(|()| {
                    if durable && uncovered {
                        // Earlier non-durable commits still need a durable one to cover them.
                        let mut cover = engine.db.begin_write()?;
                        cover.set_quick_repair(self.config.quick_repair);
                        cover.commit()?;
                    }
                    Ok(())
                }),
            };
            if let Err(e) = step {
                return self.fail_batch(e, n);
            }
            // In-memory state follows the commit (design.md, I19): the ceiling moves only
            // with the transaction that wrote it; partitions placed by a transaction that did
            // not commit are forgotten.
            if rollback.is_none() && wrote {
                if let Some(c) = ceiling {
                    *token_ceiling = c;
                }
                engine.stats.add_n(Counter::ClockBehind, created.1);
            } else {
                for id in created.0 {
                    engine.layout.partitions.remove(id);
                }
            }
            uncovered |= !durable && rollback.is_none() && wrote;
            committed |= rollback.is_none() && wrote;
            for a in applied {
                if a.beyond_horizon && rollback.is_none() {
                    engine.stats.add(Counter::BeyondHorizon);
                }
                if a.execute_takeover && rollback.is_none() {
                    engine.stats.add(Counter::Takeovers);
                }
                changed.push(a.changed && rollback.is_none());
                results.push(match &rollback {
                    // A write in this transaction failed: its neighbours were rolled back too.
                    Some(e) if !a.abort => Err(e.clone()),
                    _ => a.output,
                });
            }
        }
        if committed {
            // Before anyone is answered or woken: see snapshot.rs.
            engine.snapshots.refresh();
            engine.stats.record_batch(n, started.elapsed());
        }
        engine.durability.durable(seq);
        engine.waits.notify(
            keys.iter()
                .zip(&changed)
                .filter(|(_, c)| **c)
                .filter_map(|(k, _)| k.as_ref()),
        );
        results
    }

    /// Opens a transaction and applies `ops` to it in order, leaving it uncommitted.
    fn apply_segment(
        &self,
        ops: Vec<WriteOp>,
        durable: bool,
        ctx: &mut Ctx<'_>,
        token_ceiling: u64,
    ) -> Result<Segment, Error> {
        let mut txn = self.engine.db.begin_write()?;
        if !durable {
            txn.set_durability(Durability::None)?;
        } else if self.config.quick_repair {
            txn.set_quick_repair(true);
        }
        let mut applied = Vec::with_capacity(ops.len());
        let created = {
            let mut records = Records::open(&txn, &self.engine.layout)?;
            for op in ops {
                applied.push(apply(op, &txn, &mut records, ctx));
            }
            records.created_partitions()
        };
        // Every token in a committed record must be below a ceiling committed with it (or
        // before it). Tokens of an acquisition that rolls back are skipped, never exposed.
        let commits = applied.iter().any(|a| a.changed) && !applied.iter().any(|a| a.abort);
        let mut ceiling = None;
        if commits && *ctx.next_token > token_ceiling {
            let raised = ctx.next_token.saturating_add(TOKEN_BLOCK);
            txn.open_table(META)?
                .insert(NEXT_TOKEN_KEY, &raised.to_le_bytes()[..])?;
            ceiling = Some(raised);
        }
        Ok(Segment {
            txn,
            applied,
            ceiling,
            created,
        })
    }

    /// A transaction failed to begin, apply or commit: nobody in the batch can know whether
    /// what the batch did is durable. Writes are refused from now on.
    fn fail_batch(&self, e: Error, n: usize) -> Vec<Result<OpOutput, Error>> {
        self.engine.poison();
        let source = match e {
            Error::Storage(s) | Error::OutcomeUnknown(s) => s,
            other => Arc::new(redb::Error::Corrupted(other.to_string())),
        };
        (0..n)
            .map(|_| Err(Error::OutcomeUnknown(Arc::clone(&source))))
            .collect()
    }
}

/// Splits a batch into transactions: runs of plain ops share one; each closure op has its own.
fn segments(batch: &[Job]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut start = 0;
    for (i, job) in batch.iter().enumerate() {
        if job.op.runs_closure() {
            if start < i {
                out.push(start..i);
            }
            out.push(i..i + 1);
            start = i + 1;
        }
    }
    if start < batch.len() {
        out.push(start..batch.len());
    }
    out
}
