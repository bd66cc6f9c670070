//! Crash points in the sender's publisher, for the kill test: `OUTBOX_CRASH=before_publish`
//! or `after_publish`, and `OUTBOX_CRASH_AT=<n>` (default 1): the n-th publish attempt of a
//! message this process committed itself (numbered above the outbox at open), so that the
//! crash lands in the window of a message this process acknowledged, not on a backlog an
//! earlier crash left. The process aborts (`std::process::abort`: no destructors, nothing
//! flushed that the engine has not made durable itself, as under `kill -9`).
//!
//! - `before_publish`: the message's commit is durable and nothing was sent. The next start
//!   must send it (a lost message otherwise).
//! - `after_publish`: the receiver answered 2xx (its inbox committed the effect) and the
//!   dispatcher was not told. The next start sends it again, and the receiver's inbox must
//!   drop it (a doubled effect otherwise).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::BoxError;

/// Where in the publisher the process dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Between the commit and the publish.
    BeforePublish,
    /// Between the publish (the receiver's 2xx) and the delivery mark.
    AfterPublish,
}

/// The crash point this process was started with, if any, and the publish attempts so far.
#[derive(Debug)]
pub struct Crash {
    point: Option<Point>,
    at: u64,
    /// Messages numbered up to this one were staged before this process opened the file.
    backlog_up_to: u64,
    attempts: AtomicU64,
}

impl Crash {
    /// No crash point.
    pub fn none() -> Crash {
        Crash {
            point: None,
            at: 0,
            backlog_up_to: 0,
            attempts: AtomicU64::new(0),
        }
    }

    /// The crash point named by `OUTBOX_CRASH` and `OUTBOX_CRASH_AT`.
    pub fn from_env() -> Result<Crash, BoxError> {
        let point = match std::env::var("OUTBOX_CRASH").ok().as_deref() {
            None | Some("") => return Ok(Crash::none()),
            Some("before_publish") => Point::BeforePublish,
            Some("after_publish") => Point::AfterPublish,
            Some(other) => {
                return Err(format!(
                    "OUTBOX_CRASH={other:?}: expected before_publish or after_publish"
                )
                .into());
            }
        };
        let at = match std::env::var("OUTBOX_CRASH_AT") {
            Err(_) => 1,
            Ok(n) => n
                .parse::<u64>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("OUTBOX_CRASH_AT={n:?}: expected a count from 1"))?,
        };
        Ok(Crash {
            point: Some(point),
            at,
            backlog_up_to: 0,
            attempts: AtomicU64::new(0),
        })
    }

    /// Whether a crash point is set (the sender then learns its backlog at open).
    pub fn is_armed(&self) -> bool {
        self.point.is_some()
    }

    /// Counts only messages numbered above `seq` (the highest pending at open).
    pub fn backlog_up_to(mut self, seq: u64) -> Crash {
        self.backlog_up_to = seq;
        self
    }

    /// Counts a publish attempt of message number `seq`; its number (from 1) if it counts.
    pub fn attempt(&self, seq: u64) -> Option<u64> {
        (self.point.is_some() && seq > self.backlog_up_to)
            .then(|| self.attempts.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Aborts the process if `point` is this process's crash point and `attempt` its count.
    pub fn at(&self, point: Point, attempt: Option<u64>, what: &str) {
        if let Some(attempt) = attempt
            && self.point == Some(point)
            && attempt == self.at
        {
            eprintln!("outbox sender: crash {point:?} at publish {attempt} ({what})");
            std::process::abort();
        }
    }
}
