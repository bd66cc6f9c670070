//! # The transactional outbox, end to end
//!
//! Two services, each with its own idemdb file:
//!
//! - **sender**: `POST /purchases` runs `IdemDb::execute` under the request's
//!   `Idempotency-Key`; its closure writes the purchase row and stages an `order.created`
//!   message (destination `orders`, ordering key: the customer) in the same commit, and the
//!   201 it answers is the stored response (a retry of the key replays the same bytes). A
//!   [`Dispatcher`](idemdb::Dispatcher) thread POSTs each durable message to the receiver,
//!   with its stable message id in the `Message-Id` header.
//! - **receiver**: `POST /events` consumes the message through idemdb's inbox
//!   (`IdemDb::consume`, keyed by that message id) and applies the effect (one `effects` row
//!   per order, counting how many times it was applied) in the inbox record's own commit. A
//!   re-sent message is a duplicate there, and the effect happens once.
//!
//! Delivery is at least once (a crash between the receiver's 2xx and the sender's "delivered"
//! mark re-sends); the receiver's inbox makes the effect exactly once.
//!
//! ## By hand
//!
//! ```text
//! cargo build --release -p idemdb-example-outbox
//! target/release/outbox receiver --db /tmp/receiver.idemdb --listen 127.0.0.1:3001 &
//! target/release/outbox sender --db /tmp/sender.idemdb --listen 127.0.0.1:3000 \
//!     --receiver http://127.0.0.1:3001 &
//!
//! curl -i -X POST http://127.0.0.1:3000/purchases -H 'Idempotency-Key: k-1' \
//!     -H 'Content-Type: application/json' -d '{"order_id":"o-1","customer":"c-1","qty":2}'
//! # 201 {"message_id":"53b3…","order_id":"o-1","status":"created"}; the same request again
//! # replays these bytes; the same key with another body is a 422; qty 0 is a 422, not stored
//! curl -s http://127.0.0.1:3001/effects
//! # {"duplicates":0,"effects":[{"applied":1,"message_id":"53b3…","order_id":"o-1"}],"processed":1}
//! curl -s http://127.0.0.1:3000/purchases
//! # {"backlog":0,"parked":0,"purchases":["o-1"]}
//!
//! # A crash after the receiver's 2xx: the next purchase aborts this sender once the receiver
//! # has applied it; start it again without the variable, and the message is re-sent: the
//! # receiver's "duplicates" goes up, "applied" stays 1.
//! kill %2; OUTBOX_CRASH=after_publish target/release/outbox sender --db /tmp/sender.idemdb \
//!     --listen 127.0.0.1:3000 --receiver http://127.0.0.1:3001 &
//! ```
//!
//! Each service prints `listening on http://<addr>` once it accepts connections (`--listen
//! 127.0.0.1:0` picks a free port). Stop them with a signal: both files are crash-safe, and a
//! message published but not yet marked delivered is sent again at the next start.
//!
//! ## Crash points (for tests/kill.rs)
//!
//! `OUTBOX_CRASH=before_publish` or `after_publish` with `OUTBOX_CRASH_AT=<n>` (default 1)
//! makes the sender abort (no destructors, as under `kill -9`) at the n-th publish of a
//! message it committed itself: before sending (between the commit and the publish), or
//! after the receiver's 2xx (between the publish and the delivery mark). See `crash.rs`.

mod args;
mod crash;
mod http;
mod publisher;
mod receiver;
mod sender;

use std::error::Error;

/// The binary's error: anything printable, sendable across the runtime's tasks.
pub type BoxError = Box<dyn Error + Send + Sync>;

const USAGE: &str = "usage:
  outbox receiver --db <path> --listen <addr>
  outbox sender   --db <path> --listen <addr> --receiver <url>";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut argv = std::env::args().skip(1);
    let command = argv.next().ok_or(USAGE)?;
    let flags = args::Flags::parse(argv).map_err(|e| format!("{e}\n{USAGE}"))?;
    match command.as_str() {
        "receiver" => {
            flags.only(&["db", "listen"])?;
            receiver::run(flags.path("db")?, flags.get("listen")?).await
        }
        "sender" => {
            flags.only(&["db", "listen", "receiver"])?;
            let crash = crash::Crash::from_env()?;
            sender::run(
                flags.path("db")?,
                flags.get("listen")?,
                flags.get("receiver")?,
                crash,
            )
            .await
        }
        other => Err(format!("unknown command {other:?}\n{USAGE}").into()),
    }
}
