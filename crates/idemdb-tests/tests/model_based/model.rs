//! The reference model: what docs/semantics.md says every operation does, in plain maps.
//!
//! Nothing of the engine is used here. The model keeps every stored copy of a record (the
//! in-flight table and the finished records' time partitions, placed as docs/design.md §8.2
//! says), because a stored expired copy is what makes a key beyond horizon (§6), and the
//! recognised keys with the time until which each is recognised.

use std::collections::{BTreeMap, BTreeSet};

/// Scopes and keys of the test: few of each, so duplicates and takeovers are frequent.
pub const SCOPES: usize = 2;
pub const KEYS: usize = 3;

/// A record's identity: (scope index, key index).
pub type Id = (usize, usize);

/// Every identity, in a fixed order.
pub fn all_ids() -> impl Iterator<Item = Id> {
    (0..SCOPES).flat_map(|s| (0..KEYS).map(move |k| (s, k)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum St {
    InProgress,
    Completed,
    Failed,
}

/// One stored copy of a record (semantics.md §5 fields; `payload` stands for the fingerprint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub state: St,
    pub payload: usize,
    /// `None`: issued by an acquisition whose token the test has not seen yet (an `execute`,
    /// or a `reserve` in flight at a power loss); learnt from the first `get`.
    pub token: Option<u64>,
    pub lease_expires_at: u64,
    pub created_at: u64,
    pub updated_at: u64,
    pub attempts: u32,
    pub expires_at: u64,
    pub response: Vec<u8>,
}

/// The retention and limits a run is opened with (constant across reopen).
#[derive(Debug, Clone)]
pub struct Config {
    /// TTL per scope (the scopes have different operations), ms.
    pub ttl: [u64; SCOPES],
    pub width: u64,
    pub factor: u64,
    pub max_response: usize,
}

/// What `reserve` / `execute` decide on the live record (semantics.md §1, §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Acquire { beyond: bool },
    TakeOver { attempt: u32 },
    Mismatch,
    Completed(Vec<u8>),
    Failed(Vec<u8>),
    InProgress { retry_after_ms: u64 },
}

/// Why an owner operation is refused (semantics.md §4, checks 2–5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Unknown,
    Fenced { presented: u64, current: u64 },
    NotInProgress(St),
}

/// A state change an acknowledged operation made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    None,
    Acquire {
        id: Id,
        payload: usize,
        lease_ms: u64,
        takeover: bool,
    },
    Execute {
        id: Id,
        payload: usize,
        state: St,
        response: Vec<u8>,
        takeover: bool,
        row: u64,
    },
    Finish {
        id: Id,
        state: St,
        response: Vec<u8>,
        row: Option<u64>,
    },
    Release {
        id: Id,
    },
    Extend {
        id: Id,
        lease_ms: u64,
    },
}

/// What a compaction pass removed (the `CompactionReport` fields the docs pin down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    pub partitions_dropped: u64,
    pub records_expired: u64,
    pub in_flight_expired: u64,
}

/// Partition class and window: (start, ttl); the width is the same for all.
type PartKey = (u64, u64);

#[derive(Debug, Clone)]
pub struct Model {
    pub cfg: Config,
    /// Policy `Refuse` (else `Flag`); may change at each reopen.
    pub refuse: bool,
    /// IN_PROGRESS copies, live or expired, not swept yet: at most one per identity.
    inflight: BTreeMap<Id, Rec>,
    /// Finished copies per partition: at most one per identity in each.
    parts: BTreeMap<PartKey, BTreeMap<Id, Rec>>,
    /// Recognised identities in memory: until when (exclusive).
    horizon: BTreeMap<Id, u64>,
    /// The horizon rows on disk, (until, identity): written with each drop or sweep, deleted
    /// by the pass after their horizon; what a reopen loads recognition from.
    horizon_rows: BTreeSet<(u64, Id)>,
    /// The business row each committed closure wrote: the step number.
    pub rows: BTreeMap<Id, u64>,
    /// Every token issued so far is ≤ this.
    pub max_token: u64,
}

impl Model {
    pub fn new(cfg: Config, refuse: bool) -> Self {
        Model {
            cfg,
            refuse,
            inflight: BTreeMap::new(),
            parts: BTreeMap::new(),
            horizon: BTreeMap::new(),
            horizon_rows: BTreeSet::new(),
            rows: BTreeMap::new(),
            max_token: 0,
        }
    }

    pub fn ttl(&self, id: Id) -> u64 {
        self.cfg.ttl[id.0]
    }

    /// Every stored copy of `id`, live or expired.
    fn copies(&self, id: Id) -> impl Iterator<Item = &Rec> {
        self.inflight
            .get(&id)
            .into_iter()
            .chain(self.parts.values().filter_map(move |p| p.get(&id)))
    }

    /// The live record: a copy with `now < expires_at`; should two look live, the one with
    /// the higher token (an unseen token is the newest).
    pub fn live(&self, id: Id, now: u64) -> Option<&Rec> {
        self.copies(id)
            .filter(|r| now < r.expires_at)
            .max_by_key(|r| r.token.unwrap_or(u64::MAX))
    }

    /// Beyond horizon: no live record, and an expired copy is stored or the key is
    /// recognised (semantics.md §6).
    fn beyond(&self, id: Id, now: u64) -> bool {
        self.copies(id).next().is_some() || self.horizon.get(&id).is_some_and(|&u| now < u)
    }

    pub fn decide(&self, id: Id, payload: usize, now: u64) -> Decision {
        let Some(r) = self.live(id, now) else {
            return Decision::Acquire {
                beyond: self.beyond(id, now),
            };
        };
        if r.payload != payload {
            return Decision::Mismatch;
        }
        match r.state {
            St::InProgress if now < r.lease_expires_at => Decision::InProgress {
                retry_after_ms: r.lease_expires_at - now,
            },
            St::InProgress => Decision::TakeOver {
                attempt: r.attempts + 1,
            },
            St::Completed => Decision::Completed(r.response.clone()),
            St::Failed => Decision::Failed(r.response.clone()),
        }
    }

    /// Owner checks 2–5 of semantics.md §4.
    pub fn check_owner(&self, id: Id, token: u64, now: u64) -> Result<(), Refusal> {
        let Some(r) = self.live(id, now) else {
            return Err(Refusal::Unknown);
        };
        let current = r.token.expect("live tokens are learnt after each step");
        if current > token {
            return Err(Refusal::Fenced {
                presented: token,
                current,
            });
        }
        if current < token {
            return Err(Refusal::Unknown);
        }
        match r.state {
            St::InProgress => Ok(()),
            state => Err(Refusal::NotInProgress(state)),
        }
    }

    /// Records a token the engine returned; it must be above every earlier one.
    pub fn note_token(&mut self, token: u64) -> Result<(), String> {
        if token <= self.max_token {
            return Err(format!(
                "token {token} issued, not above {} issued before",
                self.max_token
            ));
        }
        self.max_token = token;
        Ok(())
    }

    /// Sets the unseen token of `id`'s live record.
    pub fn learn_token(&mut self, id: Id, now: u64, token: u64) {
        let copies = self
            .inflight
            .get_mut(&id)
            .into_iter()
            .chain(self.parts.values_mut().filter_map(|p| p.get_mut(&id)));
        for r in copies {
            if r.token.is_none() && now < r.expires_at {
                r.token = Some(token);
            }
        }
    }

    /// Applies an acknowledged change at `now`; `token` is the acquisition's, if seen.
    pub fn apply(&mut self, effect: &Effect, now: u64, token: Option<u64>) {
        match effect {
            Effect::None => {}
            Effect::Acquire {
                id,
                payload,
                lease_ms,
                takeover,
            } => {
                let (created_at, attempts) = self.acquired_from(*id, now, *takeover);
                let lease = now.saturating_add(*lease_ms);
                let rec = Rec {
                    state: St::InProgress,
                    payload: *payload,
                    token,
                    lease_expires_at: lease,
                    created_at,
                    updated_at: now,
                    attempts,
                    expires_at: lease.saturating_add(self.ttl(*id)),
                    response: Vec::new(),
                };
                self.inflight.insert(*id, rec);
            }
            Effect::Execute {
                id,
                payload,
                state,
                response,
                takeover,
                row,
            } => {
                let (created_at, attempts) = self.acquired_from(*id, now, *takeover);
                let rec = Rec {
                    state: *state,
                    payload: *payload,
                    token: None,
                    lease_expires_at: now,
                    created_at,
                    updated_at: now,
                    attempts,
                    expires_at: now.saturating_add(self.ttl(*id)),
                    response: response.clone(),
                };
                self.store_finished(*id, rec);
                self.rows.insert(*id, *row);
            }
            Effect::Finish {
                id,
                state,
                response,
                row,
            } => {
                let mut rec = self.inflight[id].clone();
                rec.state = *state;
                rec.updated_at = now;
                rec.expires_at = now.saturating_add(self.ttl(*id));
                rec.response = response.clone();
                self.store_finished(*id, rec);
                if let Some(row) = row {
                    self.rows.insert(*id, *row);
                }
            }
            Effect::Release { id } => {
                self.inflight.remove(id);
            }
            Effect::Extend { id, lease_ms } => {
                let ttl = self.ttl(*id);
                let rec = self.inflight.get_mut(id).expect("extend of a live record");
                rec.lease_expires_at = now.saturating_add(*lease_ms);
                rec.updated_at = now;
                rec.expires_at = rec.lease_expires_at.saturating_add(ttl);
            }
        }
    }

    /// `created_at` and `attempts` of a new acquisition (semantics.md §5).
    fn acquired_from(&self, id: Id, now: u64, takeover: bool) -> (u64, u32) {
        match (takeover, self.live(id, now)) {
            (true, Some(prev)) => (prev.created_at, prev.attempts.saturating_add(1)),
            _ => (now, 1),
        }
    }

    /// A finished record leaves the in-flight table for the partition of its class and its
    /// own window, whatever newer partitions exist (design §8.2).
    fn store_finished(&mut self, id: Id, rec: Rec) {
        self.inflight.remove(&id);
        let ttl = self.ttl(id);
        let window = rec.updated_at - rec.updated_at % self.cfg.width;
        self.parts.entry((window, ttl)).or_default().insert(id, rec);
    }

    /// One compaction pass at `now` (semantics.md §6): due partitions, then abandoned
    /// IN_PROGRESS records, then recognition that ran out.
    pub fn compact(&mut self, now: u64) -> Report {
        let mut report = Report::default();
        for key in self.due(now) {
            report.partitions_dropped += 1;
            report.records_expired += self.drop_partition(key, now);
        }
        report.in_flight_expired = self.sweep(now);
        self.retire(now);
        report
    }

    /// Recognition that ran out leaves memory and disk.
    fn retire(&mut self, now: u64) {
        self.horizon.retain(|_, until| now < *until);
        self.horizon_rows.retain(|(until, _)| now < *until);
    }

    /// The states a pass at `now` can leave after a power loss: each removal step is a
    /// durable commit of its own (semantics.md §6), so any prefix of them.
    pub fn compaction_prefixes(&self, now: u64) -> Vec<Model> {
        let mut states = vec![self.clone()];
        let mut m = self.clone();
        for key in m.due(now) {
            m.drop_partition(key, now);
            states.push(m.clone());
        }
        if m.sweep(now) > 0 {
            states.push(m.clone());
        }
        m.retire(now);
        states.push(m);
        states
    }

    /// Partitions due at `now`, oldest first: all their records have expired.
    fn due(&self, now: u64) -> Vec<PartKey> {
        let width = self.cfg.width;
        self.parts
            .keys()
            .filter(|(start, ttl)| start.saturating_add(width).saturating_add(*ttl) <= now)
            .copied()
            .collect()
    }

    /// Drops a partition, keeping its keys recognised until window end + factor × TTL.
    fn drop_partition(&mut self, key: PartKey, now: u64) -> u64 {
        let records = self.parts.remove(&key).unwrap_or_default();
        let (start, ttl) = key;
        let until = start
            .saturating_add(self.cfg.width)
            .saturating_add(ttl.saturating_mul(self.cfg.factor));
        for id in records.keys() {
            self.recognise(*id, until, now);
        }
        records.len() as u64
    }

    /// Removes the IN_PROGRESS records that expired; returns how many.
    fn sweep(&mut self, now: u64) -> u64 {
        let swept: Vec<Id> = self
            .inflight
            .iter()
            .filter(|(_, r)| now >= r.expires_at)
            .map(|(id, _)| *id)
            .collect();
        for id in &swept {
            let rec = self.inflight.remove(id).expect("collected above");
            let until = sweep_horizon(&rec, self.ttl(*id), self.cfg.factor);
            self.recognise(*id, until, now);
        }
        swept.len() as u64
    }

    fn recognise(&mut self, id: Id, until: u64, now: u64) {
        if self.cfg.factor > 0 && now < until {
            let entry = self.horizon.entry(id).or_insert(until);
            *entry = (*entry).max(until);
            self.horizon_rows.insert((until, id));
        }
    }

    /// Records stored now (live or expired), of those in flight, partitions, and recognised
    /// keys: the `Stats` fields read at call time. A recognised key is counted while a row
    /// holding it is on disk (until the pass after its horizon), across reopens.
    pub fn stored(&self) -> (u64, u64, u64, u64) {
        let in_flight = self.inflight.len() as u64;
        let finished: u64 = self.parts.values().map(|p| p.len() as u64).sum();
        let parts = self.parts.len() as u64;
        let recognised: BTreeSet<Id> = self.horizon_rows.iter().map(|&(_, id)| id).collect();
        (
            in_flight + finished,
            in_flight,
            parts,
            recognised.len() as u64,
        )
    }

    /// At open, recognition is loaded from the rows on disk that have not run out at `now`
    /// (design.md §8.4): a clock that went back finds rows no pass retired yet. Until then, a
    /// key stays in memory until the pass after its horizon.
    pub fn reopened(&mut self, now: u64) {
        self.horizon.clear();
        for &(until, id) in &self.horizon_rows {
            if now < until {
                let entry = self.horizon.entry(id).or_insert(until);
                *entry = (*entry).max(until);
            }
        }
    }
}

/// Until when a swept IN_PROGRESS record's key is recognised: semantics.md §6 says its own
/// lease end + `horizon_factor` × TTL (issue 11, defect 3: the engine used the latest of the
/// whole sweep).
fn sweep_horizon(rec: &Rec, ttl: u64, factor: u64) -> u64 {
    rec.lease_expires_at
        .saturating_add(ttl.saturating_mul(factor))
}
