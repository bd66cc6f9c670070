//! The one place every write goes through: a leader-based group commit.
//!
//! - group_commit.rs: `Writer`: the queue, the leader's state, leading and answering;
//! - batch.rs: one batch: segments, their transactions, the durability point, poisoning;
//! - apply.rs: applying each op of a segment over the overlay and the snapshot;
//! - op.rs, queue.rs: the ops and their answer slots;
//! - committer.rs: async callers' futures, the committer thread, shutdown;
//! - checkpoint.rs, settle.rs, applier.rs: checkpoints, writing the overlay into redb, and the
//!   applier thread that does both in the background;
//! - exclusive.rs: the compactor's transactions between batches.

mod applier;
mod apply;
mod batch;
mod checkpoint;
mod committer;
mod exclusive;
mod group_commit;
pub(crate) mod op;
mod queue;
mod settle;

pub(crate) use exclusive::Touches;
pub(crate) use group_commit::Writer;
