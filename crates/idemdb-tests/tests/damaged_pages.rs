//! A database file whose record pages are damaged where no check looked (opened without
//! `verify_on_open`, the default): redb may panic on a damaged page, and every read idemdb
//! makes for a caller contains that panic as `Corrupted` (src/contain.rs). Whatever the
//! damage, no call panics, and a record that is read is the record stored (its checksum,
//! docs/design.md §3). Damage to redb's own trees is not in scope: redb can panic on it inside
//! a commit and again in a destructor while unwinding, which aborts the process (design.md
//! §10; `verify_on_open(true)` refuses such a file).

mod common;

use std::ops::ControlFlow;
use std::time::Duration;

use common::{acquired, on_backend};
use idemdb::{Error, IdemDb, Key, ReserveOutcome, ScanFilter, Scope};
use idemdb_testkit::FaultBackend;

const KEYS: usize = 300;

fn response(i: usize) -> Vec<u8> {
    format!("answer {i} {}", "x".repeat(i % 97)).into_bytes()
}

/// A closed database of `KEYS` completed records (several leaf pages) and a few in flight.
fn valid_image() -> Vec<u8> {
    let backend = FaultBackend::new();
    let db = on_backend(&backend);
    let scope = Scope::new("op", "p");
    for i in 0..KEYS {
        let r = acquired(
            db.reserve(
                &scope,
                &Key::new(format!("k{i}")),
                b"x",
                Duration::from_secs(600),
            )
            .unwrap(),
        );
        if i % 50 != 0 {
            db.complete(&r, response(i)).unwrap();
        }
    }
    drop(db);
    backend.live_image()
}

/// xorshift64*, deterministic per seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Every call a service makes, on the damaged file: each answers, none panics. Returns how
/// many answered `Corrupted` from a contained panic.
fn exercise(db: &IdemDb) -> usize {
    let scope = Scope::new("op", "p");
    let mut contained = 0;
    let mut note = |r: &Result<(), Error>| {
        if let Err(Error::Corrupted(why)) = r
            && why.contains("panicked")
        {
            contained += 1;
        }
    };
    for i in 0..KEYS {
        let key = Key::new(format!("k{i}"));
        let got = db.get(&scope, &key).map(|record| {
            // A record read is the one stored: damage is never replayed.
            if let Some(record) = record
                && !record.response.is_empty()
            {
                assert_eq!(record.response, response(i), "k{i}");
            }
        });
        note(&got);
        let reserved = db
            .reserve(&scope, &key, b"x", Duration::from_secs(600))
            .map(|outcome| {
                if let ReserveOutcome::Completed(bytes) = outcome {
                    assert_eq!(bytes, response(i), "k{i}");
                }
            });
        note(&reserved);
    }
    note(
        &db.scan(&ScanFilter::default(), |_| ControlFlow::Continue(()))
            .map(drop),
    );
    note(&db.verify(5, |_| {}).map(drop));
    note(&db.compact_now().map(drop));
    let _ = db.stats();
    contained
}

#[test]
fn random_damage_opened_without_verification_never_panics() {
    let image = valid_image();
    // The 4 KiB pages where a stored response lies: leaves of idemdb's record tables.
    let mut record_pages: Vec<usize> = image
        .windows(7)
        .enumerate()
        .filter(|(_, w)| *w == b"answer ")
        .map(|(at, _)| at - at % 4096)
        .collect();
    record_pages.dedup();
    assert!(record_pages.len() >= 4, "{record_pages:?}");
    // redb's panics are expected here (and contained): only others are printed.
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.location().is_some_and(|l| l.file().contains("/redb-")) {
            print(info);
        }
    }));
    let mut rng = Rng(0x1d3e_2b59_7a11_c0de);
    let (mut opened, mut refused, mut contained) = (0, 0, 0);
    for round in 0..400 {
        let mut damaged = image.clone();
        // A few damaged spans, 1 to 16 bytes each, in pages that hold records.
        for _ in 0..1 + rng.next() % 4 {
            let page = record_pages[(rng.next() as usize) % record_pages.len()];
            let at = page + (rng.next() as usize) % 4096;
            for b in damaged
                .iter_mut()
                .skip(at)
                .take(1 + (rng.next() as usize) % 16)
            {
                *b ^= (rng.next() as u8) | 1;
            }
        }
        let backend = FaultBackend::from_image(damaged);
        match IdemDb::builder()
            .verify_on_open(false)
            .open_with_backend(backend.clone(), backend.log())
        {
            Ok(db) => {
                opened += 1;
                contained += exercise(&db);
            }
            Err(Error::Corrupted(why)) => {
                refused += 1;
                if why.contains("panicked") {
                    contained += 1;
                }
            }
            Err(e) => {
                refused += 1;
                assert!(
                    matches!(e, Error::Storage(_) | Error::NotIdemdb(_)),
                    "round {round}: {e:?}"
                );
            }
        }
    }
    eprintln!("opened {opened}, refused {refused}, panics contained {contained}");
    assert!(opened > 0 && refused > 0);
    // Without this, the containment would not have been tested.
    assert!(contained > 0, "no damage made redb panic");
}
