//! The re-entry guard: a closure runs inside the commit of its batch, on the committing
//! thread, so a call from it that waits for the writer would wait for itself.

use std::cell::Cell;

use crate::error::Error;

thread_local! {
    /// Set while this thread commits a batch.
    static COMMITTING: Cell<bool> = const { Cell::new(false) };
}

/// Refuses a blocking call from inside a commit.
pub(crate) fn refuse_reentry() -> Result<(), Error> {
    if COMMITTING.with(Cell::get) {
        return Err(Error::Reentrant);
    }
    Ok(())
}

/// Whether this thread is committing a batch (a closure of it is running).
pub(crate) fn committing() -> bool {
    COMMITTING.with(Cell::get)
}

/// Marks this thread as committing until dropped.
pub(crate) struct Committing(());

impl Committing {
    pub(crate) fn start() -> Committing {
        COMMITTING.with(|c| c.set(true));
        Committing(())
    }
}

impl Drop for Committing {
    fn drop(&mut self) {
        COMMITTING.with(|c| c.set(false));
    }
}
