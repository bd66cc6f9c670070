//! idemdb, through its public sync API (and its async API in the async cells: [`IdemTask`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idemdb::{ExecuteOutcome, IdemDb, Key, Outcome, ReserveOutcome, Scope};

use crate::interface::{Engine, ORDERS, Session};
use crate::shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, key_bytes};

/// Every reservation's lease (Redis's is the same 30 s, in ms).
pub const LEASE: Duration = Duration::from_secs(30);

/// The store on a fresh file in `dir`, as every idemdb cell opens it (sync and async API).
pub fn open_idemdb(dir: &Path) -> Arc<IdemDb> {
    // `orders` registered: execute's business insert is logged with its record.
    Arc::new(
        IdemDb::builder()
            .table(ORDERS)
            .open(dir.join("bench.idemdb"))
            .expect("open idemdb"),
    )
}

pub struct Idem {
    pub db: Arc<IdemDb>,
}

struct IdemSession {
    db: Arc<IdemDb>,
    scope: Scope,
}

impl Engine for Idem {
    fn session(&self) -> Box<dyn Session> {
        Box::new(IdemSession {
            db: Arc::clone(&self.db),
            scope: Scope::new(OPERATION, PRINCIPAL),
        })
    }

    fn commits(&self) -> Option<u64> {
        Some(self.db.stats().commits)
    }

    fn preload(&self, n: u64) {
        // Many concurrent callers, so that group commit writes the preload in large batches.
        let threads = 128.min(n.max(1));
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    let mut session = self.session();
                    let mut id = t;
                    while id < n {
                        session.lifecycle(id);
                        id += threads;
                    }
                });
            }
        });
    }
}

impl IdemSession {
    fn acquire(&self, id: u64) -> idemdb::Reservation {
        match self
            .db
            .reserve(&self.scope, &Key::new(key_bytes(id)), PAYLOAD, LEASE)
            .expect("idemdb reserve")
        {
            ReserveOutcome::Acquired(reservation) => reservation,
            other => panic!("fresh key not acquired: {other:?}"),
        }
    }
}

impl Session for IdemSession {
    fn reserve(&mut self, id: u64) {
        self.acquire(id);
    }

    fn lifecycle(&mut self, id: u64) {
        let reservation = self.acquire(id);
        self.db
            .complete(&reservation, RESPONSE)
            .expect("idemdb complete");
    }

    fn execute(&mut self, id: u64) {
        let key = key_bytes(id);
        let done = self
            .db
            .execute(&self.scope, &Key::new(key), PAYLOAD, move |tx| {
                tx.open_table(ORDERS)?.insert(&key[..], 1999)?;
                Ok::<_, idemdb::Error>(Outcome::Completed(RESPONSE.to_vec()))
            })
            .expect("idemdb execute");
        assert!(matches!(done, ExecuteOutcome::Executed(_)), "{done:?}");
    }

    fn replay(&mut self, id: u64) -> usize {
        match self
            .db
            .reserve(&self.scope, &Key::new(key_bytes(id)), PAYLOAD, LEASE)
            .expect("idemdb replay")
        {
            ReserveOutcome::Completed(response) => response.len(),
            other => panic!("preloaded key not completed: {other:?}"),
        }
    }
}

/// One task's handle for the async cells: the async API, awaited on any executor (the
/// futures are woken by idemdb's committer thread).
pub struct IdemTask {
    db: Arc<IdemDb>,
    scope: Scope,
}

impl IdemTask {
    pub fn new(db: &Arc<IdemDb>) -> IdemTask {
        IdemTask {
            db: Arc::clone(db),
            scope: Scope::new(OPERATION, PRINCIPAL),
        }
    }

    /// `reserve_async` of a fresh key, which must be acquired, then `complete_async`.
    pub async fn lifecycle(&self, id: u64) {
        let key = Key::new(key_bytes(id));
        let reserved = self
            .db
            .reserve_async(&self.scope, &key, PAYLOAD, LEASE)
            .await
            .expect("idemdb reserve_async");
        let reservation = match reserved {
            ReserveOutcome::Acquired(reservation) => reservation,
            other => panic!("fresh key not acquired: {other:?}"),
        };
        self.db
            .complete_async(&reservation, RESPONSE)
            .await
            .expect("idemdb complete_async");
    }
}
