//! Waiting duplicates across instances: every owner's `complete`, `fail` and `release`
//! notifies channel `idemdb_records` with its key's hash in the same transaction (PostgreSQL
//! delivers it at commit); one listening connection per store wakes the waiters of that key.
//! A waiter also looks again on a timer, so a lost notification costs latency, not
//! correctness.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;
use xxhash_rust::xxh3::xxh3_64;

use idemdb_core::scope::RecordKey;

/// The channel owners notify.
pub(crate) const CHANNEL: &str = "idemdb_records";

/// The payload of a key's notification: its hash, in hex.
pub(crate) fn payload(key: &RecordKey) -> String {
    format!("{:016x}", xxh3_64(key.as_bytes()))
}

/// The waiters of this store, by key hash.
#[derive(Default)]
pub(crate) struct Waits {
    keys: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

/// One waiter's registration: keeps its key's `Notify` while it waits.
pub(crate) struct Waiter<'a> {
    waits: &'a Waits,
    payload: String,
    pub(crate) notify: Arc<Notify>,
}

impl Waits {
    pub(crate) fn register(&self, key: &RecordKey) -> Waiter<'_> {
        let payload = payload(key);
        let mut keys = self.keys.lock();
        let entry = keys
            .entry(payload.clone())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        let notify = Arc::clone(&entry.0);
        Waiter {
            waits: self,
            payload,
            notify,
        }
    }

    fn wake(&self, payload: &str) {
        if let Some((notify, _)) = self.keys.lock().get(payload) {
            notify.notify_waiters();
        }
    }

    /// After the listener (re)connected: anything may have been missed.
    fn wake_all(&self) {
        for (notify, _) in self.keys.lock().values() {
            notify.notify_waiters();
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut keys = self.waits.keys.lock();
        if let Some(entry) = keys.get_mut(&self.payload) {
            entry.1 -= 1;
            if entry.1 == 0 {
                keys.remove(&self.payload);
            }
        }
    }
}

/// The listening connection, for as long as the store lives: reconnects after a failure.
pub(crate) async fn listen(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    waits: Weak<Waits>,
) {
    loop {
        if let Ok((client, mut connection)) = config.connect(tls.clone()).await {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let driver = tokio::spawn(async move {
                while let Some(Ok(message)) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    if let AsyncMessage::Notification(n) = message
                        && tx.send(n.payload().to_string()).is_err()
                    {
                        return;
                    }
                }
            });
            if client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .await
                .is_ok()
            {
                match waits.upgrade() {
                    Some(w) => w.wake_all(),
                    None => return,
                }
                while let Some(payload) = rx.recv().await {
                    match waits.upgrade() {
                        Some(w) => w.wake(&payload),
                        None => {
                            driver.abort();
                            return;
                        }
                    }
                }
            }
            driver.abort();
        }
        if waits.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
