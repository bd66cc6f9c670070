//! Where a record is in its life: the three states and their stored byte.

/// Where a record is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// Reserved by the holder of its fencing token; the work is running.
    InProgress,
    /// Finished; the stored response is replayed to every duplicate.
    Completed,
    /// Finished with a deterministic failure; the stored response is replayed, never re-run.
    Failed,
}

impl RecordState {
    /// The state's byte in a stored record (design.md §3).
    pub fn to_byte(self) -> u8 {
        match self {
            RecordState::InProgress => 1,
            RecordState::Completed => 2,
            RecordState::Failed => 3,
        }
    }

    /// The state a stored byte names, if any.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(RecordState::InProgress),
            2 => Some(RecordState::Completed),
            3 => Some(RecordState::Failed),
            _ => None,
        }
    }

    /// Lower-case name, as used in docs and exports.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InProgress => "in_progress",
            RecordState::Completed => "completed",
            RecordState::Failed => "failed",
        }
    }
}
