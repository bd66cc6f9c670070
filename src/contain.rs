//! redb trusts the pages it reads: a page damaged on disk that no check verified (with
//! `verify_on_open` off, or damaged after the open) can make it panic (an index out of
//! bounds, an `unwrap` on a length it read). Every read of the file that a caller's thread
//! makes runs through [`contained`], which turns such a panic into [`Error::Corrupted`] for
//! that caller; the writer's threads catch their own (a panic there poisons the engine:
//! writer/group_commit.rs `lead`, writer/settle.rs, writer/checkpoint.rs, compactor.rs).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::Error;

/// Runs `read`; a panic inside it is `Corrupted`, naming `what` was being read and the panic's
/// words. The panic hook still runs first (by default it prints the panic to stderr).
pub(crate) fn contained<T>(
    what: &str,
    read: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    catch_unwind(AssertUnwindSafe(read)).unwrap_or_else(|panic| Err(corrupted(what, &*panic)))
}

/// What a panic said: its message, if its payload is a string.
pub(crate) fn panic_words(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string panic payload")
}

/// The error a panic while reading `what` becomes.
pub(crate) fn corrupted(what: &str, panic: &(dyn Any + Send)) -> Error {
    let words = panic_words(panic);
    Error::Corrupted(format!(
        "reading {what} panicked ({words}): a damaged page of the database file; \
         `IdemDb::verify`, or an open with `verify_on_open`, checks the whole file"
    ))
}

/// A caller's closure called inside a [`contained`] read (a scan's `visit`, a `progress`): its
/// own panic is kept and resumed once the read returned ([`CallerPanic::resume`]), never taken
/// for damage.
#[derive(Default)]
pub(crate) struct CallerPanic(std::cell::Cell<Option<Box<dyn Any + Send>>>);

impl CallerPanic {
    /// Calls `f`; if it panics, keeps the first panic and answers `instead`.
    pub(crate) fn call<R>(&self, f: impl FnOnce() -> R, instead: R) -> R {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
            let first = self.0.take().unwrap_or(panic);
            self.0.set(Some(first));
            instead
        })
    }

    /// Resumes the caller's panic, if its closure panicked; else hands `result` back.
    pub(crate) fn resume<T>(self, result: T) -> T {
        match self.0.into_inner() {
            Some(panic) => std::panic::resume_unwind(panic),
            None => result,
        }
    }
}
