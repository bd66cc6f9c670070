//! Arbitrary bytes fed to the record decoder, and as a whole file to open(): an error or a
//! value, never a panic.

#![no_main]

use idemdb::testing::FaultBackend;
use idemdb::{IdemDb, Record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data) {
        // A record that decodes must describe itself consistently.
        assert!(record.attempts > 0);
        assert!(record.token.get() > 0);
    }
    if let Ok(db) = IdemDb::builder().open_with_backend(FaultBackend::from_image(data.to_vec())) {
        // An image that opens must serve reads without panicking.
        let _ = db.get(&idemdb::Scope::new("op", "p"), &idemdb::Key::new("k"));
    }
});
