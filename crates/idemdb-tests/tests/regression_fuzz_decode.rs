//! Crashers found by the `decode` fuzz target (fuzz/fuzz_targets/decode.rs), kept as named
//! regression tests. Each input is a list of patches over a small valid idemdb file.

mod common;

use common::{acquired, on_backend};

use std::time::Duration;

use idemdb::{IdemDb, Key, Scope};
use idemdb_testkit::FaultBackend;

/// The fuzz target's valid file: one completed, one failed and one in-progress record.
fn valid_image() -> Vec<u8> {
    let backend = FaultBackend::new();
    let db = on_backend(&backend);
    let scope = Scope::new("op", "p");
    for (i, finish) in ["complete", "fail", "hold"].iter().enumerate() {
        let key = Key::new(format!("k{i}"));
        let r = acquired(
            db.reserve(&scope, &key, b"payload", Duration::from_secs(60))
                .unwrap(),
        );
        match *finish {
            "complete" => db.complete(&r, b"201 ok".to_vec()).unwrap(),
            "fail" => db.fail(&r, b"402 declined".to_vec()).unwrap(),
            _ => {}
        }
    }
    drop(db);
    backend.live_image()
}

/// Applies the fuzz target's patches: (u16 LE offset in 64-byte units, 4 bytes to xor)*.
fn patched(patches: &[u8]) -> Vec<u8> {
    let mut image = valid_image();
    for patch in patches.chunks_exact(6) {
        let at = (usize::from(u16::from_le_bytes([patch[0], patch[1]])) * 64) % image.len();
        for (i, b) in patch[2..].iter().enumerate() {
            if let Some(byte) = image.get_mut(at + i) {
                *byte ^= b;
            }
        }
    }
    image
}

/// crash-fed06de: damaged b-tree pages made redb panic inside open (btree_cursor.rs). With
/// `verify_on_open` the file is refused at redb's check; without it, redb's panic is contained
/// and the open answers `Corrupted`.
const CRASH_FED06DE: &[u8] = &[
    0xc9, 0x5b, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0x01, 0xc9, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x82, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0x10, 0x00, 0x00, 0x00,
    0x32, 0x34, 0x10, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00,
    0x00, 0xc9, 0xc9, 0xc9, 0xc9, 0x25,
];

#[test]
fn damaged_btree_pages_are_refused_not_a_panic() {
    for verify in [true, false] {
        damaged_btree_pages_opened(verify);
    }
}

/// Without the check, redb does panic on this file: the open's containment is what answers.
#[test]
fn damaged_btree_pages_unverified_make_redb_panic_and_the_open_answers_corrupted() {
    // The first byte picks the fuzz target's mode (odd: patches over the valid file).
    let backend = FaultBackend::from_image(patched(&CRASH_FED06DE[1..]));
    match IdemDb::builder()
        .verify_on_open(false)
        .open_with_backend(backend.clone(), backend.log())
    {
        Err(idemdb::Error::Corrupted(why)) => assert!(why.contains("panicked"), "{why}"),
        other => panic!("expected Corrupted from a contained panic, got {other:?}"),
    }
}

fn damaged_btree_pages_opened(verify: bool) {
    // The first byte picks the fuzz target's mode (odd: patches over the valid file).
    let image = patched(&CRASH_FED06DE[1..]);
    let backend = FaultBackend::from_image(image);
    match IdemDb::builder()
        .verify_on_open(verify)
        .open_with_backend(backend.clone(), backend.log())
    {
        Err(e) => assert!(
            matches!(e, idemdb::Error::Corrupted(_) | idemdb::Error::Storage(_)),
            "{e:?}"
        ),
        Ok(db) => {
            // If the damage missed every checked page, reads must still not panic.
            let _ = db.get(&Scope::new("op", "p"), &Key::new("k0"));
        }
    }
}
