//! TLS to a real server (`ssl=on`, with a certificate this test makes): `sslmode` has libpq's
//! meanings. verify-full connects with the right CA and refuses a wrong CA or a wrong host
//! name; verify-ca checks the chain only; require and prefer encrypt without verifying;
//! disable does not encrypt; require refuses a server without TLS.

mod common;

use std::time::Duration;

use common::stores::{fresh_database_url, runtime};
use idemdb_postgres::{Key, PgError, PgStore, ReserveOutcome, Scope, Store};
use idemdb_testkit::postgres::TestServer;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA, and a server certificate it signed for `names`.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn pki(names: &[&str]) -> Pki {
    let ca = ca("idemdb test CA");
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// `url` (postgres://postgres@127.0.0.1:PORT/db) with `host` named instead of the address
/// (reached at 127.0.0.1 all the same) and `query` appended.
fn with(url: &str, host: &str, query: &str) -> String {
    let rest = url.strip_prefix("postgres://postgres@127.0.0.1").unwrap();
    format!("postgres://postgres@{host}{rest}?hostaddr=127.0.0.1&{query}")
}

/// Migrates, connects and runs one reservation; whether the store's connection is TLS.
async fn use_store(builder: idemdb_postgres::PgStoreBuilder) -> Result<bool, PgError> {
    builder.migrate().await?;
    let store = builder.connect().await?;
    let outcome = store
        .reserve(
            &Scope::new("POST /tls", "u"),
            &Key::new(format!("k{}", rand_suffix())),
            b"req",
            Duration::from_secs(30),
        )
        .await?;
    assert!(matches!(outcome, ReserveOutcome::Acquired(_)));
    let client = store.pool().get().await.unwrap();
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    Ok(row.get(0))
}

fn rand_suffix() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    u64::from_le_bytes(b)
}

fn assert_refused(result: Result<bool, PgError>, says: &str) {
    match result {
        Err(e @ PgError::Database(_)) => {
            let text = e.to_string();
            assert!(text.contains(says), "{says:?} missing from: {text}");
        }
        other => panic!("expected a refusal naming {says:?}, got {other:?}"),
    }
}

#[test]
fn sslmode_verifies_as_libpq_does_against_a_real_server() {
    let pki = pki(&["db.test", "localhost"]);
    let server = TestServer::start_with_tls(&pki.cert_pem, &pki.key_pem).unwrap();
    let url = server.fresh_database().unwrap();
    let wrong_ca = ca("another CA").pem();
    runtime().block_on(async {
        let builder = |host: &str, mode: &str, ca: &str| {
            PgStore::builder(&with(&url, host, &format!("sslmode={mode}")))
                .unwrap()
                .tls_root_certificates(ca.as_bytes().to_vec())
        };
        // verify-full: the right CA and the certificate's name.
        assert!(
            use_store(builder("db.test", "verify-full", &pki.ca_pem))
                .await
                .unwrap()
        );
        // A wrong CA, a wrong host name: refused, and the text says why.
        assert_refused(
            use_store(builder("db.test", "verify-full", &wrong_ca)).await,
            "UnknownIssuer",
        );
        assert_refused(
            use_store(builder("other.test", "verify-full", &pki.ca_pem)).await,
            "certificate not valid for name \"other.test\"",
        );
        // verify-ca: the chain only, so the other name passes and the wrong CA does not.
        assert!(
            use_store(builder("other.test", "verify-ca", &pki.ca_pem))
                .await
                .unwrap()
        );
        assert_refused(
            use_store(builder("db.test", "verify-ca", &wrong_ca)).await,
            "UnknownIssuer",
        );
        // require and prefer (the default) encrypt without verifying; disable does not.
        assert!(
            use_store(builder("other.test", "require", &wrong_ca))
                .await
                .unwrap()
        );
        let default = PgStore::builder(&url).unwrap();
        assert!(use_store(default).await.unwrap());
        assert!(
            !use_store(builder("db.test", "disable", &wrong_ca))
                .await
                .unwrap()
        );
        // The CA from the URL's sslrootcert.
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &pki.ca_pem).unwrap();
        let query = format!("sslmode=verify-full&sslrootcert={}", ca_file.display());
        let from_url = PgStore::builder(&with(&url, "localhost", &query)).unwrap();
        assert!(use_store(from_url).await.unwrap());
    });
}

#[test]
fn require_refuses_a_server_without_tls() {
    let url = fresh_database_url();
    runtime().block_on(async {
        let plain = format!("{url}?sslmode=require");
        let result = PgStore::builder(&plain).unwrap().migrate().await;
        assert!(matches!(result, Err(PgError::Database(_))), "{result:?}");
        // prefer falls back to plain.
        assert!(!use_store(PgStore::builder(&url).unwrap()).await.unwrap());
    });
}
