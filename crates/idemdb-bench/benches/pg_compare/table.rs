//! The hand-written table (`shared/pg_table.rs`) as `pg_compare` drives it: as many
//! connections as callers, each call taking an idle one, on the bench's shared runtime.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::runtime::Handle;

use crate::shared::keys::{RESPONSE, key_bytes};
use crate::shared::pg_table::{Conn, Reserved};

/// The baseline on one database.
pub struct Table {
    idle: Mutex<Vec<Conn>>,
}

impl Table {
    /// Makes the table in the (fresh) database at `url` and opens `connections` connections.
    pub fn open(rt: &Handle, url: &str, connections: usize) -> Table {
        rt.block_on(async {
            Conn::create_schema(url).await;
            let mut idle = Vec::with_capacity(connections);
            for _ in 0..connections {
                idle.push(Conn::connect(url).await);
            }
            Table {
                idle: Mutex::new(idle),
            }
        })
    }

    fn take(&self) -> Conn {
        self.idle.lock().pop().expect("one connection per caller")
    }

    fn give_back(&self, conn: Conn) {
        self.idle.lock().push(conn);
    }

    /// reserve + complete of the fresh key `id`.
    pub async fn lifecycle(self: &Arc<Self>, id: u64) -> (std::time::Instant, std::time::Duration) {
        let conn = self.take();
        let key = key_bytes(id).to_vec();
        let start = std::time::Instant::now();
        let reserved = conn.reserve(&key).await;
        let took = start.elapsed();
        let Reserved::Acquired(token) = reserved else {
            panic!("fresh key {id} not acquired by the baseline");
        };
        conn.complete(&key, token).await;
        self.give_back(conn);
        (start, took)
    }

    /// reserve of the completed key `id`: a replay.
    pub async fn replay(self: &Arc<Self>, id: u64) {
        let conn = self.take();
        let key = key_bytes(id).to_vec();
        match conn.reserve(&key).await {
            Reserved::Completed(bytes) => {
                assert_eq!(bytes.len(), RESPONSE.len(), "the stored response");
                std::hint::black_box(bytes);
            }
            Reserved::Acquired(_) => panic!("completed key {id} acquired again by the baseline"),
        }
        self.give_back(conn);
    }
}
