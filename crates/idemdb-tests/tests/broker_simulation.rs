//! A simulated broker delivers 100,000 events for 1,000 entities with duplicates, reordering
//! and redeliveries after simulated power losses (the fault-injecting backend). The consumer
//! uses the inbox (dedupe by event id) and a version guard (last writer wins). The final state
//! must equal applying each event once in version order, and each handler side effect must be
//! counted exactly once.

mod common;

use common::on_backend;

use std::collections::VecDeque;

use idemdb::redb::{ReadableTable, ReadableTableMetadata, TableDefinition};
use idemdb::{Consumed, Error, Tx, Versioned};
use idemdb_testkit::{FaultBackend, TearMode};

const ENTITIES: u64 = 1_000;
const VERSIONS: u64 = 100;
const POLL: usize = 250;
/// A power loss every this many polls, on average.
const CRASH_EVERY: u64 = 40;

const STATE: TableDefinition<u64, Versioned> = TableDefinition::new("entity_state");
/// The handler's side effect: how many times each event's handler committed.
const EFFECTS: TableDefinition<&str, u64> = TableDefinition::new("side_effects");

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The high bits: xorshift's low bits are correlated from one output to the next.
    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 24) % n
    }
}

#[derive(Clone, Copy, Debug)]
struct Event {
    entity: u64,
    version: u64,
}

impl Event {
    fn id(&self) -> String {
        format!("e{}-v{}", self.entity, self.version)
    }

    fn value(&self) -> Vec<u8> {
        format!("{}@{}", self.entity, self.version).into_bytes()
    }
}

fn handler(event: Event) -> impl FnOnce(&mut Tx<'_>) -> Result<(), Error> + Send + 'static {
    move |tx| {
        let _ = tx.apply_if_newer(STATE, event.entity, event.version, &event.value())?;
        let id = event.id();
        let mut effects = tx.open_table(EFFECTS)?;
        let n = effects.get(id.as_str())?.map(|v| v.value()).unwrap_or(0);
        effects.insert(id.as_str(), n + 1)?;
        Ok(())
    }
}

#[test]
fn final_state_equals_each_event_applied_once_in_version_order() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Reordering: a shuffled stream; duplicates: 10% of events queued twice.
    let mut events: Vec<Event> = (0..ENTITIES)
        .flat_map(|entity| (1..=VERSIONS).map(move |version| Event { entity, version }))
        .collect();
    let dupes: Vec<Event> = events
        .iter()
        .filter(|_| rng.below(10) == 0)
        .copied()
        .collect();
    events.extend(dupes);
    for i in (1..events.len()).rev() {
        events.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut queue: VecDeque<Event> = events.into();
    let mut acked = vec![false; (ENTITIES * VERSIONS) as usize];
    let slot = |e: &Event| (e.entity * VERSIONS + e.version - 1) as usize;

    let mut backend = FaultBackend::new();
    let mut db = on_backend(&backend);
    let (mut crashes, mut redelivered, mut duplicates, mut polls) = (0u64, 0u64, 0u64, 0u64);
    while !queue.is_empty() {
        polls += 1;
        let armed = rng.below(CRASH_EVERY) == 0;
        if armed {
            // A poll's durable commit takes two syncs: strike in one of them.
            backend.crash_at_sync(rng.below(2), TearMode::Random(rng.next()));
        }
        let poll: Vec<Event> = (0..POLL).filter_map(|_| queue.pop_front()).collect();
        let answers = db
            .consume_batch("projector", poll.iter().map(|e| (e.id(), handler(*e))))
            .expect("not called from a closure");
        for (event, answer) in poll.iter().zip(answers) {
            match answer {
                Ok(Consumed::Processed) => acked[slot(event)] = true,
                Ok(Consumed::Duplicate) => {
                    assert!(
                        acked[slot(event)] || crashes > 0,
                        "duplicate of an unseen event"
                    );
                    acked[slot(event)] = true;
                    duplicates += 1;
                }
                Ok(other) => panic!("{event:?}: {other:?}"),
                // The power went: not acknowledged, so the broker redelivers it.
                Err(_) => {
                    queue.push_back(*event);
                    redelivered += 1;
                }
            }
        }
        if let Some(disk) = backend.crashed_disk() {
            crashes += 1;
            drop(db);
            backend = disk;
            db = on_backend(&backend);
            // The broker also redelivers some acknowledged events after a consumer restart.
            for _ in 0..POLL / 5 {
                let entity = rng.below(ENTITIES);
                let version = 1 + rng.below(VERSIONS);
                queue.push_back(Event { entity, version });
            }
        } else if armed {
            // The armed crash did not strike in this poll: disarm it.
            drop(db);
            backend = backend.durable_disk();
            db = on_backend(&backend);
        }
    }
    assert!(acked.iter().all(|a| *a), "every event acknowledged");
    assert!(crashes >= 5, "only {crashes} power losses in {polls} polls");
    assert!(redelivered > 0 && duplicates > 0);

    let read = db.begin_read().unwrap();
    let state = read.open_table(STATE).unwrap();
    assert_eq!(state.len().unwrap(), ENTITIES);
    for entity in 0..ENTITIES {
        let last = Event {
            entity,
            version: VERSIONS,
        };
        let stored = state.get(entity).unwrap().unwrap();
        assert_eq!(
            stored.value(),
            (VERSIONS, last.value().as_slice()),
            "entity {entity}"
        );
    }
    let effects = read.open_table(EFFECTS).unwrap();
    assert_eq!(effects.len().unwrap(), ENTITIES * VERSIONS);
    for entry in effects.iter().unwrap() {
        let (id, n) = entry.unwrap();
        assert_eq!(
            n.value(),
            1,
            "side effect of {} counted {} times",
            id.value(),
            n.value()
        );
    }
    eprintln!(
        "{} events in {polls} polls: {crashes} power losses, {redelivered} calls redelivered \
         after a loss, {duplicates} duplicates answered without running the handler",
        ENTITIES * VERSIONS
    );
}
