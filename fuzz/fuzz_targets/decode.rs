//! Arbitrary bytes fed to every decoder of stored bytes, and as a whole file to open(): an
//! error or a value, never a panic, and what a decoder accepts round-trips. The first byte
//! chooses, modulo 16: below `testing::DECODERS`, one decoder (a record, a log frame, a
//! partition name, a horizon row, the log's header and cycle sector, the log's record in meta,
//! a partition's summary row, a wide partition's filter row: `testing::decode_any`); 8, the
//! rest as a whole database file; 9–12, patches over a valid
//! idemdb file, so the fuzzer gets past the file header into redb's and idemdb's own checks;
//! 13–15, patches over a valid write-ahead log whose frames open() must replay (the database
//! file as a crash left it), so recovery's frame parsing and checks run. The seed corpus
//! (`fuzz/corpus/decode`, written by `fuzz/seeds.rs`) holds a valid sample of each. Files are
//! opened with `verify_on_open(true)`: without it, damage in redb's own trees can make redb
//! panic inside a commit and again in a destructor while unwinding, which aborts the process
//! (docs/design.md §10).

#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use idemdb::testing::{DECODERS, decode_any};
use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
use idemdb_testkit::FaultBackend;
use libfuzzer_sys::fuzz_target;

/// The database after a clean close, and the database and log as a crash left them.
type Images = (Vec<u8>, (Vec<u8>, Vec<u8>));

/// A small valid database: records in every state.
fn valid_images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let backend = FaultBackend::new();
        let db = IdemDb::builder()
            .checkpoint_interval(Duration::from_secs(3600))
            .open_with_backend(backend.clone(), backend.log())
            .expect("open an empty backend");
        let scope = Scope::new("op", "p");
        for (i, finish) in ["complete", "fail", "hold"].iter().enumerate() {
            let key = Key::new(format!("k{i}"));
            if let Ok(ReserveOutcome::Acquired(r)) =
                db.reserve(&scope, &key, b"payload", Duration::from_secs(60))
            {
                let _ = match *finish {
                    "complete" => db.complete(&r, b"201 ok".to_vec()),
                    "fail" => db.fail(&r, b"402 declined".to_vec()),
                    _ => Ok(()),
                };
            }
        }
        let crashed = (backend.durable_image(), backend.log().durable_image());
        drop(db);
        (backend.live_image(), crashed)
    })
}

/// Xors `patches` ((u16 offset in 64-byte units, 4 bytes) repeated) into a copy of `image`.
fn patched(image: &[u8], patches: &[u8]) -> Vec<u8> {
    let mut image = image.to_vec();
    for patch in patches.chunks_exact(6) {
        let unit = usize::from(u16::from_le_bytes([patch[0], patch[1]]));
        let at = (unit * 64) % image.len().max(1);
        for (i, b) in patch[2..].iter().enumerate() {
            if let Some(byte) = image.get_mut(at + i) {
                *byte ^= b;
            }
        }
    }
    image
}

fn exercise(image: Vec<u8>, log: Vec<u8>) {
    let backend = FaultBackend::from_images(image, log);
    if let Ok(db) = IdemDb::builder()
        .verify_on_open(true)
        .open_with_backend(backend.clone(), backend.log())
    {
        let scope = Scope::new("op", "p");
        for i in 0..4 {
            let _ = db.get(&scope, &Key::new(format!("k{i}")));
        }
        let _ = db.reserve(&scope, &Key::new("k9"), b"payload", Duration::from_secs(1));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (closed, (crashed_db, crashed_log)) = valid_images();
    match mode % 16 {
        m if m < DECODERS => decode_any(data),
        8 => exercise(rest.to_vec(), Vec::new()),
        9..=12 => exercise(patched(closed, rest), Vec::new()),
        _ => exercise(crashed_db.clone(), patched(crashed_log, rest)),
    }
});
