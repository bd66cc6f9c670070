//! What an open finds in the log (`Seen`), and the evidence that it lacks frames the database
//! relies on (`examine`): docs/design.md §5.6, the table of states after a crash.

use super::frame::{
    ALIGN, CYCLE_AT, Cycle, EffectRef, FRAMES_START, Frame, Header, decode_cycle, decode_header,
    read_frame,
};
use super::state::LogState;
use crate::log_problem::LogProblem;

/// The log as read at open.
pub(crate) struct Seen {
    /// Whether there is a log file at all.
    pub(crate) present: bool,
    /// Its length in bytes.
    pub(crate) len: u64,
    pub(crate) header: Header,
    /// The cycle sector (`None` in a version-1 log, which had none).
    pub(crate) cycle: Option<Cycle>,
    /// From the first frame offset, the frames whose sequence numbers follow each other.
    pub(crate) run: Vec<Frame>,
    /// Where the run ends (the first offset that does not continue it).
    pub(crate) run_end: u64,
    /// Every other intact frame of this database past the run, with its offset.
    pub(crate) others: Vec<(u64, Frame)>,
}

impl Seen {
    /// Reads `bytes`, the whole log (`None`: no file), keeping every frame's effects. `log_id`
    /// is the log the database records, for a header too damaged to say which log it is.
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) fn read(bytes: Option<&[u8]>, database_id: u64, log_id: Option<u64>) -> Seen {
        Seen::read_above(bytes, database_id, log_id, 0, &|_| 0)
    }

    /// [`Seen::read`], keeping the effects of the frames above `checkpoint` only (the only
    /// ones an open may replay), and each frame's [`Frame::token_bound`] as `bound` says.
    pub(crate) fn read_above(
        bytes: Option<&[u8]>,
        database_id: u64,
        log_id: Option<u64>,
        checkpoint: u64,
        bound: &dyn Fn(&EffectRef<'_>) -> u64,
    ) -> Seen {
        let frame_at = |b: &[u8]| {
            read_frame(b, database_id).map(|f| {
                let keep = f.seq > checkpoint;
                f.keep(keep, bound)
            })
        };
        let Some(bytes) = bytes else {
            return Seen {
                present: false,
                len: 0,
                header: Header::Invalid,
                cycle: None,
                run: Vec::new(),
                run_end: FRAMES_START,
                others: Vec::new(),
            };
        };
        let header = decode_header(bytes);
        // Version 1 (format 4) had no cycle sector: its frames start right after the header.
        let log_id = match header {
            Header::Of { log_id, .. } => log_id,
            Header::Invalid => log_id,
        };
        let (start, cycle) = match log_id {
            Some(id) => {
                let sector = bytes.get(CYCLE_AT as usize..).unwrap_or_default();
                (FRAMES_START, Some(decode_cycle(sector, database_id, id)))
            }
            None => (CYCLE_AT, None),
        };
        let mut at = start as usize;
        let mut run: Vec<Frame> = Vec::new();
        while let Some(frame) = bytes.get(at..).and_then(frame_at) {
            if run.last().is_some_and(|l| frame.seq != l.seq + 1) {
                break;
            }
            at += frame.len as usize;
            run.push(frame);
        }
        let run_end = at;
        // Past the run, every sector may start a frame left from before a recycle, or one
        // that proves a damaged frame.
        let mut others = Vec::new();
        while at < bytes.len() {
            match frame_at(&bytes[at..]) {
                Some(frame) => {
                    let len = frame.len as usize;
                    others.push((at as u64, frame));
                    at += len;
                }
                None => at += ALIGN as usize,
            }
        }
        Seen {
            present: true,
            len: bytes.len() as u64,
            header,
            cycle,
            run,
            run_end: run_end as u64,
            others,
        }
    }

    /// The run's frames above `checkpoint`: what a normal open replays.
    pub(crate) fn run_above(&self, checkpoint: u64) -> Vec<&Frame> {
        self.run.iter().filter(|f| f.seq > checkpoint).collect()
    }

    /// Every intact frame above `checkpoint`, wherever it lies, in sequence order, each
    /// sequence number once: what an open that accepts a loss keeps.
    pub(crate) fn every_frame_above(&self, checkpoint: u64) -> Vec<&Frame> {
        let mut all: Vec<&Frame> = self.all_frames().filter(|f| f.seq > checkpoint).collect();
        all.sort_by_key(|f| f.seq);
        all.dedup_by_key(|f| f.seq);
        all
    }

    /// The newest sequence number of any intact frame.
    pub(crate) fn newest_seq(&self) -> u64 {
        self.all_frames().map(|f| f.seq).max().unwrap_or(0)
    }

    /// Every intact frame: the run, then the others.
    pub(crate) fn all_frames(&self) -> impl Iterator<Item = &Frame> {
        self.run.iter().chain(self.others.iter().map(|(_, f)| f))
    }
}

/// For tests (`testing::LogLayout`): the checkpoint the cycle sector holds, and the run's
/// frames as (offset, length, sequence number), read from a log's bytes alone.
#[cfg(feature = "test-hooks")]
pub(crate) fn layout(bytes: &[u8]) -> (Option<u64>, Vec<(u64, u64, u64)>) {
    let database_id = match decode_header(bytes) {
        Header::Of { database_id, .. } => database_id,
        Header::Invalid => return (None, Vec::new()),
    };
    let seen = Seen::read(Some(bytes), database_id, None);
    let cycle = match seen.cycle {
        Some(Cycle::After(c)) => Some(c),
        _ => None,
    };
    let mut at = match seen.cycle {
        Some(_) => FRAMES_START,
        None => CYCLE_AT,
    };
    let run = seen
        .run
        .iter()
        .map(|f| {
            let span = (at, f.len, f.seq);
            at += f.len;
            span
        })
        .collect();
    (cycle, run)
}

/// What the database file records of its log, read at open.
pub(crate) struct Recorded {
    /// The last frame the database file holds (meta `log_checkpoint`).
    pub(crate) checkpoint: u64,
    /// Its record of the log (none in a new database, or one of format 4).
    pub(crate) state: Option<LogState>,
}

/// The evidence, if any, that the log lacks what the database relies on, or is not its log.
/// `None`: the run's frames above the checkpoint are everything acknowledged since it (as far
/// as two files can tell: design.md §5.6 lists what is undetectable, and why).
pub(crate) fn examine(seen: &Seen, database_id: u64, recorded: &Recorded) -> Option<LogProblem> {
    let c = recorded.checkpoint;
    if let Header::Of {
        database_id: found, ..
    } = seen.header
        && found != database_id
    {
        return Some(LogProblem::Foreign {
            found,
            expected: database_id,
        });
    }
    let in_use = recorded.state.filter(|s| s.in_use);
    if let Some(state) = in_use {
        // Opened and not closed cleanly: the log may hold outcomes the file does not.
        if let Some(problem) = examine_in_use(seen, state, c) {
            return Some(problem);
        }
    }
    let above = seen.run_above(c);
    if let Some(first) = above.first()
        && first.seq != c + 1
    {
        return Some(LogProblem::FramesMissing {
            checkpoint: c,
            resumes_at: first.seq,
        });
    }
    // A frame is appended only after the previous one's sync returned, so only the last can
    // be torn: an intact frame newer than the run past its end proves a damaged durable one.
    let newest = seen.run.last().map_or(c, |f| f.seq.max(c));
    if let Some((at, frame)) = seen.others.iter().find(|(_, f)| f.seq > newest) {
        return Some(LogProblem::FrameDamaged {
            offset: seen.run_end,
            intact: frame.seq,
            intact_offset: *at,
        });
    }
    None
}

/// The evidence that only a database in use (not closed cleanly) relies on: the log is there,
/// at its recorded length, the one recorded, and its cycle sector (rewritten after each
/// checkpoint, before any frame of the new cycle) agrees with the checkpoint.
fn examine_in_use(seen: &Seen, state: LogState, c: u64) -> Option<LogProblem> {
    if !seen.present {
        return Some(LogProblem::Missing { checkpoint: c });
    }
    // Another log's header says more than its length; a header cut away says less than it.
    if let Header::Of { log_id, .. } = seen.header
        && log_id != Some(state.id)
    {
        return Some(LogProblem::Replaced {
            found: log_id,
            expected: state.id,
        });
    }
    if seen.len < state.len {
        return Some(LogProblem::Cut {
            len: seen.len,
            expected: state.len,
        });
    }
    if seen.header == Header::Invalid {
        return Some(LogProblem::HeaderDamaged);
    }
    // The run reaches the checkpoint: the state a crash leaves between a checkpoint's commit
    // and the rewrite of the cycle sector, with the frames appended beside a checkpoint's
    // first phase after it (writer/checkpoint.rs).
    let reaches = seen.run.iter().any(|f| f.seq == c);
    match seen.cycle {
        // Written when the log was created, before the database recorded it: never zeros.
        Some(Cycle::Zero) | None => Some(LogProblem::Erased { checkpoint: c }),
        Some(Cycle::Invalid) if reaches => None,
        Some(Cycle::Invalid) => Some(LogProblem::HeaderDamaged),
        Some(Cycle::After(h)) if h > c => Some(LogProblem::FramesMissing {
            checkpoint: c,
            resumes_at: h + 1,
        }),
        Some(Cycle::After(h)) if h < c && !reaches => match seen.run.last() {
            // Frames of the new cycle behind a cycle sector that never said so: it was
            // overwritten.
            Some(f) if f.seq > c => Some(LogProblem::HeaderDamaged),
            last => Some(LogProblem::Older {
                last: last.map_or(h, |f| f.seq),
                checkpoint: c,
            }),
        },
        Some(Cycle::After(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::frame::{Effect, encode_cycle, encode_frame, encode_header};

    const DB: u64 = 5;
    const LOG: u64 = 9;

    fn effect(n: u64) -> Vec<Effect> {
        vec![Effect::Put {
            table: "idemdb_inflight".into(),
            key: vec![n as u8].into(),
            value: vec![n as u8; 700].into(),
        }]
    }

    /// A log whose cycle sector says `cycle`, holding frames `seqs` from its first frame offset.
    fn log_of(cycle: u64, seqs: &[u64]) -> Vec<u8> {
        let mut bytes = encode_header(DB, LOG);
        bytes.extend(encode_cycle(DB, LOG, cycle));
        for &s in seqs {
            bytes.extend(encode_frame(s, DB, &effect(s)));
        }
        bytes.resize(bytes.len() + 4096, 0);
        bytes
    }

    fn seqs(frames: &[&Frame]) -> Vec<u64> {
        frames.iter().map(|f| f.seq).collect()
    }

    fn in_use(checkpoint: u64, len: u64) -> Recorded {
        Recorded {
            checkpoint,
            state: Some(LogState {
                id: LOG,
                len,
                since: 0,
                in_use: true,
            }),
        }
    }

    fn clean(checkpoint: u64) -> Recorded {
        Recorded {
            checkpoint,
            state: Some(LogState {
                id: LOG,
                len: 1 << 20,
                since: 0,
                in_use: false,
            }),
        }
    }

    fn seen(bytes: &[u8]) -> Seen {
        Seen::read(Some(bytes), DB, Some(LOG))
    }

    fn problem(bytes: Option<&[u8]>, recorded: &Recorded) -> Option<LogProblem> {
        examine(&Seen::read(bytes, DB, Some(LOG)), DB, recorded)
    }

    fn frame_at(n: usize) -> usize {
        FRAMES_START as usize + n * encode_frame(1, DB, &effect(1)).len()
    }

    /// An open keeps the effects of the frames it may replay (above the checkpoint, in the
    /// run or past it) and, of every frame, the bound its effects show.
    #[test]
    fn only_frames_above_the_checkpoint_keep_their_effects_and_every_frame_its_bound() {
        let mut bytes = log_of(3, &[1, 2, 3, 4, 5]);
        // Past the run, after a torn frame: one older frame and one above the checkpoint.
        let at = frame_at(6);
        for (i, s) in [2u64, 9].into_iter().enumerate() {
            let frame = encode_frame(s, DB, &effect(s));
            let start = at + i * frame.len();
            bytes[start..start + frame.len()].copy_from_slice(&frame);
        }
        let bound = |e: &EffectRef<'_>| match e {
            EffectRef::Put { key, .. } => 100 + u64::from(key[0]),
            _ => 0,
        };
        let seen = Seen::read_above(Some(&bytes), DB, Some(LOG), 3, &bound);
        let all: Vec<(u64, usize, u64)> = seen
            .all_frames()
            .map(|f| (f.seq, f.effects.len(), f.token_bound))
            .collect();
        assert_eq!(
            all,
            [
                (1, 0, 101),
                (2, 0, 102),
                (3, 0, 103),
                (4, 1, 104),
                (5, 1, 105),
                (2, 0, 102),
                (9, 1, 109)
            ]
        );
        assert_eq!(seqs(&seen.run_above(3)), [4, 5]);
        assert_eq!(seen.run_above(3)[0].effects, effect(4));
        assert_eq!(seqs(&seen.every_frame_above(3)), [4, 5, 9]);
    }

    #[test]
    fn frames_above_the_checkpoint_are_replayed_in_order() {
        let bytes = log_of(3, &[4, 5, 6, 7]);
        assert_eq!(seqs(&seen(&bytes).run_above(5)), [6, 7]);
        assert_eq!(seqs(&seen(&bytes).run_above(3)), [4, 5, 6, 7]);
        assert!(seen(&bytes).run_above(7).is_empty());
        // A crash after a checkpoint's commit, before the cycle sector was rewritten: the run
        // still reaches the checkpoint.
        for c in [3, 7] {
            assert_eq!(problem(Some(&bytes), &in_use(c, 1024)), None, "{c}");
        }
        // A checkpoint whose commit ran beside batches 6 and 7 (its first phase), before the
        // cycle sector was rewritten: the run passes through it, and 6 and 7 are replayed.
        assert_eq!(problem(Some(&bytes), &in_use(5, 1024)), None);
        assert_eq!(seqs(&seen(&bytes).run_above(5)), [6, 7]);
        // Frames of a new cycle behind a cycle sector that never announced it (the run does
        // not pass through the checkpoint): the sector was overwritten.
        let newer = log_of(3, &[6, 7]);
        assert_eq!(
            problem(Some(&newer), &in_use(5, 1024)),
            Some(LogProblem::HeaderDamaged)
        );
    }

    #[test]
    fn an_older_frame_left_from_before_a_recycle_ends_the_run() {
        // 9 and 10 were written at the start after a checkpoint at 8; 3.. are left behind.
        let mut bytes = log_of(2, &[3, 4, 5, 6, 7, 8]);
        let new = log_of(8, &[9, 10]);
        let n = new.len() - 4096;
        bytes[..n].copy_from_slice(&new[..n]);
        assert_eq!(seqs(&seen(&bytes).run_above(8)), [9, 10]);
        assert_eq!(problem(Some(&bytes), &in_use(8, 1024)), None);
    }

    #[test]
    fn a_gap_after_the_checkpoint_is_frames_missing() {
        let bytes = log_of(6, &[7, 8]);
        for recorded in [in_use(5, 1024), clean(5)] {
            assert_eq!(
                problem(Some(&bytes), &recorded),
                Some(LogProblem::FramesMissing {
                    checkpoint: 5,
                    resumes_at: 7
                })
            );
        }
        // The cycle sector alone proves it too.
        assert_eq!(
            problem(Some(&log_of(6, &[])), &in_use(5, 1024)),
            Some(LogProblem::FramesMissing {
                checkpoint: 5,
                resumes_at: 7
            })
        );
    }

    #[test]
    fn a_damaged_frame_followed_by_an_intact_one_is_refused_and_a_torn_tail_is_not() {
        let mut bytes = log_of(0, &[1, 2, 3]);
        bytes[frame_at(1) + 40] ^= 1;
        assert!(matches!(
            problem(Some(&bytes), &in_use(0, 1024)),
            Some(LogProblem::FrameDamaged { intact: 3, .. })
        ));
        let mut bytes = log_of(0, &[1, 2, 3]);
        bytes[frame_at(2) + 40] ^= 1;
        assert_eq!(seqs(&seen(&bytes).run_above(0)), [1, 2]);
        assert_eq!(problem(Some(&bytes), &in_use(0, 1024)), None);
    }

    #[test]
    fn a_torn_first_frame_of_a_cycle_may_damage_the_old_cycle_behind_the_run() {
        // The cycle sector says 12: frame 13 was being written at the first frame offset and
        // tore, its first sector lost and later ones over frames 2 and 3 of the old cycle.
        let mut bytes = log_of(12, &[1, 2, 3, 4]);
        bytes[frame_at(1) + 40] ^= 1;
        bytes[frame_at(2) + 40] ^= 1;
        assert_eq!(seqs(&seen(&bytes).run_above(0)), [1]);
        assert_eq!(problem(Some(&bytes), &in_use(12, 1024)), None);
    }

    #[test]
    fn a_database_in_use_refuses_a_missing_cut_damaged_or_replaced_log() {
        let bytes = log_of(5, &[4, 5, 6]);
        let len = bytes.len() as u64;
        let recorded = in_use(5, len);
        assert_eq!(problem(Some(&bytes), &recorded), None);
        assert_eq!(
            problem(None, &recorded),
            Some(LogProblem::Missing { checkpoint: 5 })
        );
        for cut in [0, 512, 1000, len as usize - 1] {
            assert_eq!(
                problem(Some(&bytes[..cut]), &recorded),
                Some(LogProblem::Cut {
                    len: cut as u64,
                    expected: len
                }),
                "{cut}"
            );
        }
        let mut damaged = bytes.clone();
        damaged[3] ^= 1;
        assert_eq!(
            problem(Some(&damaged), &recorded),
            Some(LogProblem::HeaderDamaged)
        );
        let mut replaced = bytes.clone();
        replaced[..512].copy_from_slice(&encode_header(DB, LOG + 1));
        assert_eq!(
            problem(Some(&replaced), &recorded),
            Some(LogProblem::Replaced {
                found: Some(LOG + 1),
                expected: LOG
            })
        );
        // Closed cleanly, none of it matters: the log holds nothing the file needs.
        for bytes in [&bytes[..0], &bytes[..512], &damaged[..], &replaced[..]] {
            assert_eq!(problem(Some(bytes), &clean(5)), None);
        }
        assert_eq!(problem(None, &clean(5)), None);
    }

    #[test]
    fn a_cycle_sector_behind_the_checkpoint_is_an_older_log_unless_the_run_reaches_it() {
        // Rolled back: the log as it was before checkpoints 7 and 9.
        let bytes = log_of(3, &[4, 5, 6]);
        assert_eq!(
            problem(Some(&bytes), &in_use(9, 1024)),
            Some(LogProblem::Older {
                last: 6,
                checkpoint: 9
            })
        );
        assert_eq!(problem(Some(&bytes), &clean(9)), None);
        // A crash between checkpoint 6's commit and the cycle sector's rewrite.
        assert_eq!(problem(Some(&bytes), &in_use(6, 1024)), None);
        // The rewrite torn: the same.
        let mut torn = bytes.clone();
        torn[512 + 9] ^= 1;
        assert_eq!(problem(Some(&torn), &in_use(6, 1024)), None);
        assert_eq!(
            problem(Some(&torn), &in_use(9, 1024)),
            Some(LogProblem::HeaderDamaged)
        );
    }

    #[test]
    fn zeros_in_the_cycle_sector_are_an_erased_log_and_zeroed_frames_are_undetectable() {
        let mut bytes = log_of(3, &[4, 5, 6]);
        bytes[FRAMES_START as usize..].fill(0);
        assert_eq!(problem(Some(&bytes), &in_use(3, 1024)), None);
        bytes[512..].fill(0);
        assert_eq!(
            problem(Some(&bytes), &in_use(3, 1024)),
            Some(LogProblem::Erased { checkpoint: 3 })
        );
    }

    #[test]
    fn a_log_of_another_database_is_foreign_whatever_the_state() {
        let mut bytes = log_of(0, &[1]);
        bytes[..512].copy_from_slice(&encode_header(DB + 1, LOG));
        let foreign = Some(LogProblem::Foreign {
            found: DB + 1,
            expected: DB,
        });
        assert_eq!(problem(Some(&bytes), &in_use(0, 1024)), foreign);
        assert_eq!(problem(Some(&bytes), &clean(0)), foreign);
    }

    #[test]
    fn an_accepted_loss_keeps_every_intact_frame_above_the_checkpoint_once() {
        let mut bytes = log_of(0, &[1, 2, 3, 4]);
        bytes[frame_at(1) + 40] ^= 1;
        let seen = seen(&bytes);
        assert_eq!(seqs(&seen.every_frame_above(1)), [3, 4]);
        assert_eq!(seen.newest_seq(), 4);
    }

    #[test]
    fn a_version_1_log_has_its_frames_after_the_header() {
        let mut bytes = encode_header(DB, LOG);
        // As version 1 wrote it (no log identity, frames at 512).
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        bytes[24..40].fill(0);
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes[0..24]);
        bytes[24..32].copy_from_slice(&sum.to_le_bytes());
        for s in [1, 2] {
            bytes.extend(encode_frame(s, DB, &effect(s)));
        }
        let seen = Seen::read(Some(&bytes), DB, None);
        assert_eq!(seen.cycle, None);
        assert_eq!(seqs(&seen.run_above(0)), [1, 2]);
    }
}
