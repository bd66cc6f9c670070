//! The line-up: the engines under test ([`Kind`], each opened behind the one small interface of
//! `interface.rs`) and the servers this run has ([`Lineup`]). The fsync floor is in
//! `shared/floor.rs`, and as an engine of one sync per write per caller in `floors.rs`.
//!
//! - `idemdb`: the crate, through its public sync API (and its async API in the async cells:
//!   [`IdemTask`](crate::idem::IdemTask)) (`idem.rs`).
//! - `redb_naive`: what a user would write on redb alone: one `Durability::Immediate` write
//!   transaction per operation (`naive.rs`).
//! - `sqlite`: rusqlite (bundled SQLite), WAL, `synchronous=FULL`, one connection per thread
//!   (`sqlite.rs`).
//! - `redis`: a `redis-server` the bench starts, `appendfsync always` (`redis.rs`).
//! - `postgres`: the hand-written table on a PostgreSQL server (`postgres.rs`).
//!
//! Every engine stores the same logical record: the scope-qualified key, a 128-bit payload
//! fingerprint, a state, a fencing token and the response bytes. The two servers are in the
//! run only where their binaries are found and start ([`Lineup::probe`]).

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::floors::Floors;
use crate::idem::{Idem, open_idemdb};
use crate::interface::Engine;
use crate::naive::Naive;
use crate::postgres::Postgres;
use crate::redis::Redis;
use crate::sqlite::{Sqlite, SqliteShared};

/// Which engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Idem,
    Naive,
    Sqlite,
    SqliteShared,
    Redis,
    Postgres,
    /// The fsync floor, one file and one sync per write per caller (`floors.rs`).
    Floor,
}

impl Kind {
    /// The embedded engines every cell compares.
    pub const MAIN: [Kind; 3] = [Kind::Idem, Kind::Naive, Kind::Sqlite];
    /// Every engine, in the summary's column order.
    pub const ALL: [Kind; 7] = [
        Kind::Idem,
        Kind::Naive,
        Kind::Sqlite,
        Kind::SqliteShared,
        Kind::Redis,
        Kind::Postgres,
        Kind::Floor,
    ];

    /// The embedded engines compared in a cell with `threads` concurrent callers: the shared
    /// SQLite connection only differs from a connection per thread when there are several.
    pub fn for_threads(threads: usize) -> &'static [Kind] {
        if threads > 1 {
            &Kind::ALL[..4]
        } else {
            &Kind::MAIN
        }
    }

    /// The benchmark id, also the directory name under target/criterion/<cell>/.
    pub fn id(self) -> &'static str {
        match self {
            Kind::Idem => "idemdb",
            Kind::Naive => "redb_naive",
            Kind::Sqlite => "sqlite",
            Kind::SqliteShared => "sqlite_shared",
            Kind::Redis => "redis",
            Kind::Postgres => "postgres",
            Kind::Floor => "fsync_floor",
        }
    }

    /// Opens the engine on a fresh file in `dir` (Redis: a server with its data in `dir`;
    /// PostgreSQL: a fresh schema). Call on the main thread (see `redis.rs`).
    pub fn open(self, dir: &Path) -> Arc<dyn Engine> {
        match self {
            Kind::Idem => Arc::new(Idem {
                db: open_idemdb(dir),
            }),
            Kind::Naive => Arc::new(Naive::open(&dir.join("bench.redb"))),
            Kind::Sqlite => Arc::new(Sqlite::open(&dir.join("bench.sqlite"))),
            Kind::SqliteShared => {
                let sqlite = Sqlite::open(&dir.join("bench.sqlite"));
                Arc::new(SqliteShared {
                    conn: Arc::new(Mutex::new(sqlite.connection())),
                    sqlite,
                })
            }
            Kind::Redis => Arc::new(Redis::open(dir)),
            Kind::Postgres => Arc::new(Postgres::open()),
            Kind::Floor => Arc::new(Floors::new(dir)),
        }
    }
}

/// The servers this run has: each is started once when the run begins, and one that is
/// missing or fails to start is left out of every cell, with the reason printed.
#[derive(Clone, Copy)]
pub struct Lineup {
    redis: bool,
    postgres: bool,
}

impl Lineup {
    /// Probes both servers (Redis with its data in a directory under `root`); returns the
    /// lineup and, per server, the summary's note on it.
    pub fn probe(root: &Path) -> (Lineup, Vec<(String, String)>) {
        let dir = tempfile::tempdir_in(root).expect("tempdir");
        let probes = [
            ("Redis", crate::redis::probe(dir.path())),
            ("PostgreSQL", crate::postgres::probe()),
        ];
        let mut notes = Vec::new();
        for (name, probe) in &probes {
            let note = match probe {
                Ok(note) => note.clone(),
                Err(why) => {
                    println!("{name} is left out of this run: {why}");
                    format!("left out of this run: {why}")
                }
            };
            notes.push((name.to_string(), note));
        }
        let lineup = Lineup {
            redis: probes[0].1.is_ok(),
            postgres: probes[1].1.is_ok(),
        };
        (lineup, notes)
    }

    /// `embedded` and the servers this run has.
    pub fn with_servers(self, embedded: &[Kind]) -> Vec<Kind> {
        let mut kinds = embedded.to_vec();
        kinds.extend(
            [(Kind::Redis, self.redis), (Kind::Postgres, self.postgres)]
                .into_iter()
                .filter_map(|(kind, here)| here.then_some(kind)),
        );
        kinds
    }
}
