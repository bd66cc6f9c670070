//! The PostgreSQL test server (idemdb_testkit::postgres) against a real server: the shared
//! one (own cluster, or `IDEMDB_TEST_PG`) hands out distinct empty databases, from plain code
//! and from inside a tokio runtime; two started clusters are distinct, and a dropped one is
//! gone.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use idemdb_testkit::postgres::TestServer;
use tokio_postgres::{Client, NoTls};

/// Connects to `url`, the connection driven on the current runtime.
async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            panic!("connection error: {e}");
        }
    });
    client
}

/// `SELECT 1` and `current_database()` over a new connection to `url`.
async fn probe(url: &str) -> String {
    let client = connect(url).await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0)
}

/// The port of a `postgres://user@127.0.0.1:PORT/db` URL.
fn port(url: &str) -> u16 {
    let authority = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    authority.rsplit(':').next().unwrap().parse().unwrap()
}

fn refuses(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err()
}

#[tokio::test]
async fn shared_server_hands_out_distinct_empty_databases() {
    let server = TestServer::shared().unwrap();
    assert!(std::ptr::eq(server, TestServer::shared().unwrap()));
    // From inside a runtime: the creation runs on a thread of its own.
    let a = server.fresh_database().unwrap();
    let b = server.fresh_database().unwrap();
    assert_ne!(a, b);

    let name_a = probe(&a).await;
    let name_b = probe(&b).await;
    assert_ne!(name_a, name_b);
    assert!(name_a.starts_with("idemdb_t_"), "{name_a}");
    assert!(a.ends_with(&format!("/{name_a}")), "{a} is not {name_a}");
    assert!(b.ends_with(&format!("/{name_b}")), "{b} is not {name_b}");

    // Empty, and really separate: a table made in one is not in the other.
    let client_a = connect(&a).await;
    let tables: i64 = client_a
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);
    client_a
        .batch_execute("CREATE TABLE only_in_a (k text PRIMARY KEY)")
        .await
        .unwrap();
    let client_b = connect(&b).await;
    let in_b: i64 = client_b
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(in_b, 0);
}

#[test]
fn fresh_database_from_plain_code() {
    let server = TestServer::shared().unwrap();
    let url = server.fresh_database().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let name = runtime.block_on(probe(&url));
    assert!(url.ends_with(&format!("/{name}")), "{url} is not {name}");
}

#[test]
fn started_servers_are_distinct_and_stop_on_drop() {
    let first = TestServer::start().unwrap();
    let second = TestServer::start().unwrap();
    let (port_1, port_2) = (port(first.url()), port(second.url()));
    assert_ne!(port_1, port_2);
    assert_eq!(
        first.url(),
        format!("postgres://postgres@127.0.0.1:{port_1}/postgres")
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Both serve; a database made in the first is not in the second.
    let url = first.fresh_database().unwrap();
    let name = runtime.block_on(probe(&url));
    let on_second = runtime.block_on(async {
        let client = connect(second.url()).await;
        let count: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        count
    });
    assert_eq!(on_second, 0);

    drop(first);
    assert!(refuses(port_1), "port {port_1} still accepts after drop");
    assert_eq!(runtime.block_on(probe(second.url())), "postgres");
    drop(second);
    assert!(refuses(port_2), "port {port_2} still accepts after drop");
}
