//! Why an open refused the write-ahead log: the evidence that acknowledged outcomes may be
//! missing, or that the log is not this database's (docs/design.md §5.6).

use std::fmt;

/// What an open found wrong with the write-ahead log, refusing it with
/// [`Error::LogRefused`](crate::Error::LogRefused). Nothing was changed on disk: put the log
/// (or the database file) back as it was and open again, or, where
/// [`can_accept`](Self::can_accept) says so, accept the loss knowingly with
/// [`Builder::accept_log_loss`](crate::Builder::accept_log_loss) or `idemdb accept-log-loss`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogProblem {
    /// The log is missing, but the database was in use with it (it was not closed cleanly):
    /// outcomes acknowledged after the checkpoint may live only in the log.
    Missing {
        /// The last frame the database file holds.
        checkpoint: u64,
    },
    /// The log is shorter than the length the database recorded for it: it was cut, and
    /// whatever frames lay past the cut are gone.
    Cut {
        /// Its length now, in bytes.
        len: u64,
        /// The length the database recorded.
        expected: u64,
    },
    /// The log's header (written once, when the log was created) or its cycle sector (which
    /// says which checkpoint its frames follow) is damaged.
    HeaderDamaged,
    /// The log is not the one the database was using: an older log, or another copy, was put
    /// in its place.
    Replaced {
        /// The identity in the log's header (`None` for a log written before logs had one).
        found: Option<u64>,
        /// The identity the database recorded.
        expected: u64,
    },
    /// The log's frames end below the database's checkpoint: it is an older copy of the log.
    Older {
        /// The newest frame of the log.
        last: u64,
        /// The last frame the database file holds.
        checkpoint: u64,
    },
    /// The log's frames resume above the database's checkpoint: the frames in between are
    /// lost. The database file is older than its log (restored from a copy).
    FramesMissing {
        /// The last frame the database file holds.
        checkpoint: u64,
        /// The first frame the log holds after it.
        resumes_at: u64,
    },
    /// A frame is damaged but a newer one after it is intact: a frame that was durable was
    /// lost (a torn last frame is normal after a crash; a damaged earlier one is not).
    FrameDamaged {
        /// Where the damaged frame starts, in bytes.
        offset: u64,
        /// The intact newer frame.
        intact: u64,
        /// Where it starts, in bytes.
        intact_offset: u64,
    },
    /// The log was erased: zeros in its cycle sector (written when the log was created, before
    /// the database recorded it, and never zero since).
    Erased {
        /// The last frame the database file holds.
        checkpoint: u64,
    },
    /// The log belongs to another database: it was copied or renamed beside the wrong file.
    /// Not acceptable as a loss: move it away.
    Foreign {
        /// The identity in the log.
        found: u64,
        /// This database's identity.
        expected: u64,
    },
    /// The database file is missing or empty but its log is there: the log alone holds only
    /// what followed the last checkpoint. Not acceptable as a loss: restore the file, or
    /// delete the log to start an empty database.
    DatabaseMissing {
        /// The identity of the database the log belongs to.
        database: u64,
    },
}

impl LogProblem {
    /// Whether an open may accept this loss knowingly
    /// ([`Builder::accept_log_loss`](crate::Builder::accept_log_loss)). A log of another
    /// database, or a log without its database file, is never taken: that is a mix-up of files,
    /// not a loss.
    pub fn can_accept(&self) -> bool {
        !matches!(
            self,
            LogProblem::Foreign { .. } | LogProblem::DatabaseMissing { .. }
        )
    }
}

impl fmt::Display for LogProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogProblem::Missing { checkpoint } => write!(
                f,
                "is missing, but the database was in use with it (not closed cleanly): \
                 outcomes acknowledged after its checkpoint (frame {checkpoint}) may live \
                 only in the log"
            ),
            LogProblem::Cut { len, expected } => write!(
                f,
                "is {len} bytes, shorter than the {expected} bytes the database recorded for \
                 it: it was cut, and the frames past the cut are lost"
            ),
            LogProblem::HeaderDamaged => write!(
                f,
                "has a damaged header or cycle sector (its first two sectors, which say whose \
                 log it is and which checkpoint its frames follow): it was overwritten or \
                 damaged"
            ),
            LogProblem::Replaced { found, expected } => match found {
                Some(found) => write!(
                    f,
                    "is not the log the database was using (log {found:016x}, the database \
                     uses log {expected:016x}): an older log or another copy was put in its \
                     place"
                ),
                None => write!(
                    f,
                    "is an older log (written before logs had an identity), not the log \
                     {expected:016x} the database was using"
                ),
            },
            LogProblem::Older { last, checkpoint } => write!(
                f,
                "ends at frame {last}, below the database's checkpoint (frame {checkpoint}): \
                 it is an older copy of the log, and the frames written since are lost"
            ),
            LogProblem::FramesMissing {
                checkpoint,
                resumes_at,
            } => write!(
                f,
                "resumes at frame {resumes_at} but the database file holds frames up to \
                 {checkpoint}: the frames in between are lost (the database file is older \
                 than its log)"
            ),
            LogProblem::FrameDamaged {
                offset,
                intact,
                intact_offset,
            } => write!(
                f,
                "has a damaged frame at offset {offset} but frame {intact} at offset \
                 {intact_offset} is intact: a frame that was durable was lost"
            ),
            LogProblem::Erased { checkpoint } => write!(
                f,
                "has zeros in its cycle sector, which was synced when the log was created: it \
                 was erased, and outcomes acknowledged after frame {checkpoint} may be lost"
            ),
            LogProblem::Foreign { found, expected } => write!(
                f,
                "belongs to another database (identity {found:016x}, this one is \
                 {expected:016x}): it was copied or renamed beside the wrong file"
            ),
            LogProblem::DatabaseMissing { database } => write!(
                f,
                "is there (of database {database:016x}) but the database file is missing or \
                 empty: restore the file, or delete the log to start an empty database"
            ),
        }
    }
}
