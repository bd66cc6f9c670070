//! Errors say what happened: a `Database` error shows the server's SQLSTATE, message and
//! detail (its `source()` is the driver's error).

mod common;

use std::error::Error as _;
use std::time::Duration;

use common::stores::{admin, fresh_database_url, runtime};
use idemdb_postgres::{Key, PgError, PgStore, Scope, Store};

#[test]
fn a_database_error_shows_the_server_s_sqlstate_message_and_detail() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let builder = PgStore::builder(&url).unwrap();
        builder.migrate().await.unwrap();
        let store = builder.connect().await.unwrap();
        let admin = admin(&url).await;
        // An operator's constraint refuses every new row: the server says which and why.
        admin
            .batch_execute(
                "ALTER TABLE idemdb_records ADD CONSTRAINT frozen CHECK (false) NOT VALID",
            )
            .await
            .unwrap();
        let scope = Scope::new("POST /x", "u");
        let lease = Duration::from_secs(30);
        let e = store
            .reserve(&scope, &Key::new("k"), b"req", lease)
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, PgError::Database(_)), "{e:?}");
        for said in [
            "23514",
            "violates check constraint \"frozen\"",
            "detail: Failing row contains",
        ] {
            assert!(text.contains(said), "{said:?} missing from: {text}");
        }
        assert!(e.source().is_some_and(|s| s.source().is_some()));

        // A missing table: SQLSTATE and the server's message.
        admin
            .batch_execute("DROP TABLE idemdb_records")
            .await
            .unwrap();
        let e = store.get(&scope, &Key::new("k")).await.unwrap_err();
        let text = e.to_string();
        for said in ["42P01", "relation \"idemdb_records\" does not exist"] {
            assert!(text.contains(said), "{said:?} missing from: {text}");
        }
    });
}
