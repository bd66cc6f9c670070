//! The database file alone bounds every fencing token ever issued (docs/design.md §7): its
//! durable `next_token` is above every token a caller was given, at every moment, so that no
//! loss of the log, detected or not, can make a token be issued twice.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::acquired;
use idemdb::redb::{ReadableDatabase, TableDefinition};
use idemdb::testing::queued_ops;
use idemdb::{IdemDb, Key, Scope};
use idemdb_testkit::{FaultBackend, SECTOR};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");

/// The token ceiling the database file's durable image holds, read with redb alone.
fn durable_ceiling(backend: &FaultBackend) -> u64 {
    let raw = idemdb::redb::Builder::new()
        .create_with_backend(FaultBackend::from_image(backend.durable_image()))
        .unwrap();
    let read = raw.begin_read().unwrap();
    let meta = read.open_table(META).unwrap();
    let bytes = meta.get("next_token").unwrap().unwrap();
    u64::from_le_bytes(bytes.value().try_into().unwrap())
}

#[test]
fn the_database_file_alone_bounds_every_token_issued() {
    let backend = FaultBackend::new();
    // Blocks of 8 tokens: batches raise the ceiling all the time; no checkpoint by age.
    let db = Arc::new(
        IdemDb::builder()
            .token_block(8)
            .checkpoint_interval(Duration::from_secs(3600))
            .open_with_backend(backend.clone(), backend.log())
            .unwrap(),
    );
    let issued = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (db, issued, backend) = (Arc::clone(&db), Arc::clone(&issued), backend.clone());
            std::thread::spawn(move || {
                for i in 0..150 {
                    let key = Key::new(format!("t{t}-{i}"));
                    let r = acquired(
                        db.reserve(&Scope::new("op", "p"), &key, b"p", common::LEASE)
                            .unwrap(),
                    );
                    issued.fetch_max(r.token().get(), Ordering::SeqCst);
                    if i % 3 == 0 {
                        db.complete(&r, b"ok".to_vec()).unwrap();
                    }
                    if i % 25 == 0 {
                        // Read after the answer: the token it returned is covered already.
                        let known = issued.load(Ordering::SeqCst);
                        let ceiling = durable_ceiling(&backend);
                        assert!(ceiling > known, "durable ceiling {ceiling}, token {known}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let known = issued.load(Ordering::SeqCst);
    assert!(known > 100, "{known}");
    assert!(durable_ceiling(&backend) > known);
    // And after a power loss, tokens resume above every token issued.
    let disk = common::power_loss_now(&backend, Arc::into_inner(db).unwrap());
    assert!(first_token_after_open(&disk) > known);
}

/// The token of the first reservation after `disk` is opened again.
fn first_token_after_open(disk: &FaultBackend) -> u64 {
    let db = IdemDb::builder()
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    let r = acquired(
        db.reserve(
            &Scope::new("op", "p"),
            &Key::new("probe"),
            b"p",
            common::LEASE,
        )
        .unwrap(),
    );
    r.token().get()
}

/// How long a test waits for threads to reach a point before it fails.
const WAIT: Duration = Duration::from_secs(10);

/// Blocks of `block` tokens; no checkpoint by age or size: the only checkpoints are the ones
/// batches take to raise the ceiling.
fn open_with_block(backend: &FaultBackend, block: u64) -> Arc<IdemDb> {
    Arc::new(
        IdemDb::builder()
            .token_block(block)
            .checkpoint_interval(Duration::from_secs(3600))
            .checkpoint_bytes(1 << 30)
            .open_with_backend(backend.clone(), backend.log())
            .unwrap(),
    )
}

fn reserve_in_thread(db: &Arc<IdemDb>, key: String) -> JoinHandle<u64> {
    let db = Arc::clone(db);
    std::thread::spawn(move || {
        let outcome = db
            .reserve(&Scope::new("op", "p"), &Key::new(key), b"p", common::LEASE)
            .unwrap();
        acquired(outcome).token().get()
    })
}

/// `n` reservations committed as one batch, as `n` callers arriving while a leader is stuck
/// in its log sync make it: the leader's reservation is held, the `n` callers queue behind
/// it, and all are released at once. Returns every token issued, the leader's first.
fn one_batch_behind_a_stuck_leader(backend: &FaultBackend, db: &Arc<IdemDb>, n: usize) -> Vec<u64> {
    let batches = |db: &IdemDb| {
        let h = db.stats().batch_size;
        (h.count, h.sum)
    };
    let (count, sum) = batches(db);
    backend.hold_syncs(true);
    let leader = reserve_in_thread(db, "leader".into());
    assert!(backend.wait_for_held(1, WAIT), "the leader never synced");
    let followers: Vec<_> = (0..n)
        .map(|i| reserve_in_thread(db, format!("k{i}")))
        .collect();
    let deadline = Instant::now() + WAIT;
    while queued_ops(db) < n {
        assert!(Instant::now() < deadline, "{n} reservations never queued");
        std::thread::sleep(Duration::from_millis(1));
    }
    backend.hold_syncs(false);
    backend.release_held();
    let mut tokens = vec![leader.join().unwrap()];
    tokens.extend(followers.into_iter().map(|f| f.join().unwrap()));
    // Two batches: the leader's alone, then the `n` queued behind it together.
    assert_eq!(
        batches(db),
        (count + 2, sum + 1 + n as u64),
        "not one batch of {n}"
    );
    tokens
}

/// I7 for a batch that needs more tokens than half a block: the checkpoint it takes before
/// anything is applied must raise the durable ceiling by what the batch needs (counter +
/// max(block, n)) whenever the ceiling would not cover it, so that the file alone bounds every
/// token the batch hands out. Catches the mutant that raises only when fewer than half a block
/// remain, ignoring the batch's own need (writer/checkpoint.rs, `commit_written_as_checkpoint`:
/// `(block / 2).max(need)` → `block / 2`): the batch then issues tokens up to the old ceiling
/// and past it.
#[test]
fn a_batch_needing_more_than_half_a_block_is_covered_by_the_durable_ceiling() {
    // A block exactly, and more than a block, each over half a block.
    for (block, n) in [(16, 16), (8, 20)] {
        let backend = FaultBackend::new();
        let db = open_with_block(&backend, block);
        let tokens = one_batch_behind_a_stuck_leader(&backend, &db, n);
        let max = *tokens.iter().max().unwrap();
        let ceiling = durable_ceiling(&backend);
        assert!(
            ceiling > max,
            "block {block}, a batch of {n}: durable ceiling {ceiling}, token {max}"
        );
    }
}

/// What the durable ceiling is for: after a power loss whose log then reads as a cycle whose
/// first append tore (its frames zeroed: undetectable, docs/design.md §5.6), tokens resume
/// from the database file alone, and must still be above every token of a batch that needed
/// more than half a block. Catches the same mutant as the test above (the probe is then given
/// a token the batch already handed out).
#[test]
fn tokens_of_a_batch_needing_more_than_half_a_block_are_not_issued_again_after_its_log_is_lost() {
    let backend = FaultBackend::new();
    let db = open_with_block(&backend, 8);
    let tokens = one_batch_behind_a_stuck_leader(&backend, &db, 20);
    let max = *tokens.iter().max().unwrap();
    let disk = common::power_loss_now(&backend, Arc::into_inner(db).unwrap());
    let mut log = disk.log().durable_image();
    log[2 * SECTOR..].fill(0);
    let zeroed = FaultBackend::from_images(disk.durable_image(), log);
    for (what, disk) in [("the log intact", disk), ("its frames zeroed", zeroed)] {
        let probe = first_token_after_open(&disk);
        assert!(
            probe > max,
            "{what}: token {probe} issued again (the batch's went up to {max})"
        );
    }
}
