//! A TCP proxy in front of PostgreSQL that cuts connections at random points: after a chunk
//! of the client's was forwarded (the server may act on it, the client hears nothing) or
//! instead of forwarding it, or while the server's answer is on its way. A cut closes both
//! sides at once. The rate is per chunk, in millionths, and can be changed while it runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct ChaosProxy {
    pub port: u16,
    rate: Arc<AtomicU32>,
    cuts: Arc<AtomicU64>,
}

impl ChaosProxy {
    /// A proxy to 127.0.0.1:`upstream`, cutting `per_million` of the chunks it carries.
    pub async fn start(upstream: u16, per_million: u32) -> ChaosProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let rate = Arc::new(AtomicU32::new(per_million));
        let cuts = Arc::new(AtomicU64::new(0));
        let (r, c) = (Arc::clone(&rate), Arc::clone(&cuts));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (r, c) = (Arc::clone(&r), Arc::clone(&c));
                tokio::spawn(async move {
                    // The server is down (restarting): the client's connection fails.
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        carry(client, server, r, c).await;
                    }
                });
            }
        });
        ChaosProxy { port, rate, cuts }
    }

    pub fn set_rate(&self, per_million: u32) {
        self.rate.store(per_million, Ordering::SeqCst);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// Whether to cut now: `rate` in a million.
fn roll(rate: &AtomicU32) -> bool {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    u32::from_le_bytes(b) % 1_000_000 < rate.load(Ordering::Relaxed)
}

/// Carries both ways until either side closes or a cut; a cut drops both sockets.
async fn carry(client: TcpStream, server: TcpStream, rate: Arc<AtomicU32>, cuts: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let cut = roll(&rate);
            // Half the cuts forward the chunk first: the server may commit it.
            let mut coin = [0u8; 1];
            getrandom::fill(&mut coin).unwrap();
            if cut && coin[0] & 1 == 0 {
                cuts.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if cut {
                cuts.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if roll(&rate) {
                cuts.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever way ends first ends the connection: both halves are dropped.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
