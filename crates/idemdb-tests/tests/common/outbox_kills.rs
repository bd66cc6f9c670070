//! The outbox kill -9 loop both stores' tests share: a worker process (examples/outbox_worker.rs
//! or examples/pg_outbox_worker.rs) stages one message per acknowledged `execute`, printing
//! `ACK <key>`, and appends `SENT <id> <key>` per publish to a file; it is killed at random
//! moments. [`Published::check`] then holds what was published against what was acknowledged.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use idemdb::{Key, Limits, MessageId, RecordKey, Scope};

/// The workers' scope.
pub fn scope() -> Scope {
    Scope::new("outbox", "worker")
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Runs the worker `bin` `kills` times, run `r<n>` given as its argument after `before` and
/// `sent` after it, each SIGKILLed after a random 0–`spread_ms` past `least_ms` from its
/// `READY`; the keys it acknowledged.
pub fn kill_runs(
    bin: &Path,
    before: &str,
    sent: &Path,
    kills: usize,
    (least_ms, spread_ms): (u64, u64),
) -> BTreeSet<String> {
    let mut acked = BTreeSet::new();
    let mut rng = 0x5851_f42d_4c95_7f2d ^ u64::from(std::process::id());
    for run in 0..kills {
        let mut child = Command::new(bin)
            .arg(before)
            .arg(format!("r{run}"))
            .arg(sent)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 6];
        stdout.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"READY\n");
        std::thread::sleep(Duration::from_millis(
            least_ms + xorshift(&mut rng) % spread_ms,
        ));
        child.kill().unwrap(); // SIGKILL
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        child.wait().unwrap();
        // A last line cut by the kill has no newline: skipped.
        for line in out.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            if let Some(key) = line.trim_end().strip_prefix("ACK ") {
                acked.insert(key.to_string());
            }
        }
    }
    acked
}

/// Every publication, in order: the workers' file, then the drain's.
pub struct Published(pub Vec<(MessageId, String)>);

impl Published {
    /// The file's `SENT` lines.
    pub fn read(sent: &Path) -> Published {
        let file = std::fs::File::open(sent).unwrap();
        let mut published = Vec::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line.unwrap();
            let mut parts = line.splitn(3, ' ');
            let (Some("SENT"), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next())
            else {
                panic!("a torn line in the sent file: {line:?}");
            };
            published.push((MessageId::parse(id).unwrap(), key.to_string()));
        }
        Published(published)
    }

    /// Checks that each id derives from its record, that `committed(key)` holds for each
    /// published key (none invented), that each ordering key's (the key less its `-<n>`)
    /// first publications are its messages 0, 1, 2, … in order, and that every acknowledged
    /// key was published. Returns (distinct keys published, duplicates).
    pub fn check(
        &self,
        acked: &BTreeSet<String>,
        mut committed: impl FnMut(&str) -> bool,
    ) -> (usize, usize) {
        let mut first_of: BTreeMap<String, u64> = BTreeMap::new();
        let mut sent_keys: BTreeSet<String> = BTreeSet::new();
        let mut duplicates = 0;
        for (id, key) in &self.0 {
            let record = RecordKey::encode(&scope(), &Key::new(key), &Limits::default()).unwrap();
            assert_eq!(
                *id,
                MessageId::derive(&record, 0),
                "{key}: the id derives from its record"
            );
            if !sent_keys.insert(key.clone()) {
                duplicates += 1;
                continue;
            }
            assert!(
                committed(key),
                "{key} was published but its commit is not in the database"
            );
            let (stream, i) = key.rsplit_once('-').unwrap();
            let i: u64 = i.parse().unwrap();
            let expected = first_of.get(stream).map_or(0, |prev| prev + 1);
            assert_eq!(
                i, expected,
                "{stream}: {i} first published where {expected} was due"
            );
            first_of.insert(stream.to_string(), i);
        }
        for key in acked {
            assert!(
                sent_keys.contains(key),
                "{key} was acknowledged and never published"
            );
        }
        (sent_keys.len(), duplicates)
    }
}
