//! The command line: subcommands and options (clap derive).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idemdb::{RecordState, Retention};

use crate::errors::CliError;

/// Operator tool for idemdb databases: inspect, scan, export, verify and compact a file, and
/// accept a lost write-ahead log knowingly.
///
/// The file must not be open in another process (redb locks it). Exit codes: 0 success;
/// 1 no record (`get`) or problems found (`verify`); 2 usage; 3 missing file; 4 locked by
/// another process; 5 not an idemdb database; 6 corrupt; 7 unsupported format; 8 other errors.
#[derive(Debug, Parser)]
#[command(name = "idemdb", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: Global,
}

#[derive(Debug, Args)]
pub struct Global {
    /// Machine-readable output: JSON (one object per line for scan and export); errors as a
    /// JSON object on stderr.
    #[arg(long, global = true)]
    pub json: bool,
    /// No progress bar and no summary on stderr.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Default TTL in force, as the service sets it (e.g. 24h, 30m, 90s, 500ms). The file does
    /// not store its retention: pass the service's settings so that `stats` shows them and
    /// `compact` keeps beyond-horizon sets as long as the service would.
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// The TTL of one operation, as the service sets it; repeatable.
    #[arg(long = "operation-ttl", global = true, value_name = "OPERATION=DURATION",
          value_parser = parse_operation_ttl)]
    pub operation_ttls: Vec<(String, Duration)>,
    /// Partition width in force (shown by `stats`; the CLI writes no records).
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    pub partition_width: Option<Duration>,
    /// Beyond-horizon factor in force: how long `compact` keeps dropped keys' tags, in TTLs.
    #[arg(long, global = true, value_name = "N")]
    pub horizon_factor: Option<u32>,
    /// The most memory the open may plan for (e.g. 300M, 2G, or bytes): a file whose key
    /// index would not fit is refused with each part named, instead of running out.
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_size)]
    pub memory_budget: Option<u64>,
}

impl Global {
    /// The retention the database is opened with.
    pub fn retention(&self) -> Retention {
        let mut retention = Retention::default();
        if let Some(ttl) = self.ttl {
            retention = retention.ttl(ttl);
        }
        for (op, ttl) in &self.operation_ttls {
            retention = retention.operation_ttl(op, *ttl);
        }
        if let Some(width) = self.partition_width {
            retention = retention.partition_width(width);
        }
        if let Some(factor) = self.horizon_factor {
            retention = retention.horizon_factor(factor);
        }
        retention
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Gauges of the file (records, partitions, index and horizon sizes, size on disk), the
    /// counters since this open, and the retention in force.
    Stats {
        /// The database file.
        path: PathBuf,
    },
    /// One live record: state, token, timestamps, fingerprint and response.
    Get {
        /// The database file.
        path: PathBuf,
        /// The scope's operation.
        operation: String,
        /// The scope's principal (may be empty: "").
        principal: String,
        /// The key.
        key: String,
        /// KEY is hex (for binary keys, e.g. from `Key::from_parts`).
        #[arg(long)]
        key_hex: bool,
    },
    /// Stored records, one per line (without response bodies: see `export`).
    Scan {
        /// The database file.
        path: PathBuf,
        #[command(flatten)]
        filter: ScanArgs,
        /// Stop after N records.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
    },
    /// One compaction pass now: drop expired partitions, sweep abandoned reservations, retire
    /// horizon sets, summarise closed partitions, merge those of a closed hour into one and,
    /// under a TTL of 48 h or more, the hours of a closed group (1/24 of the TTL) into one.
    Compact {
        /// The database file.
        path: PathBuf,
    },
    /// Open a database whose write-ahead log lacks acknowledged outcomes (missing, cut,
    /// older, damaged), accepting the loss knowingly: every intact frame still in the log is
    /// kept, fencing tokens restart above any that could have been issued, a fresh log is
    /// started, and the loss is noted in the file (shown by `stats`). Retries of the lost
    /// intents will run again. Does nothing to a database whose log is complete.
    AcceptLogLoss {
        /// The database file.
        path: PathBuf,
    },
    /// Integrity check: page checksums, then every stored entry decoded and checked against
    /// idemdb's invariants. Exit code 1 if anything is wrong.
    Verify {
        /// The database file.
        path: PathBuf,
        /// Problems listed at most (all are counted).
        #[arg(long, value_name = "N", default_value_t = 20)]
        max_problems: usize,
    },
    /// Every record as JSON lines, with fingerprint and response.
    Export {
        /// The database file.
        path: PathBuf,
        /// Also export expired records not yet dropped.
        #[arg(long)]
        include_expired: bool,
    },
    /// The outbox: list pending and parked messages, retry or park one, purge the parked.
    Outbox {
        #[command(subcommand)]
        action: OutboxAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum OutboxAction {
    /// Pending messages (oldest commit first), then parked ones, with their attempts and last
    /// error; a count of each on stderr.
    List {
        /// The database file, or a postgres:// URL (its schema migrated by the service).
        path: PathBuf,
        /// Only the parked messages.
        #[arg(long)]
        parked: bool,
        /// Stop after N messages.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
    /// Put a parked message back in line (its attempts reset). Exit code 1 if no parked
    /// message has that id.
    Retry {
        /// The database file, or a postgres:// URL (its schema migrated by the service).
        path: PathBuf,
        /// The message id (32 hex digits, as `list` shows it).
        id: String,
    },
    /// Park a pending message: it is not sent, and holds back later messages of its ordering
    /// key, until `retry`. Exit code 1 if no pending message has that id.
    Park {
        /// The database file, or a postgres:// URL (its schema migrated by the service).
        path: PathBuf,
        /// The message id.
        id: String,
        /// Why (stored as its last error).
        #[arg(long, default_value = "parked from the command line")]
        reason: String,
    },
    /// Remove every parked message for good (never sent). Asks for `yes` on a terminal.
    Purge {
        /// The database file, or a postgres:// URL (its schema migrated by the service).
        path: PathBuf,
        /// Confirm without asking (needed when stdin is not a terminal).
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Only records in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Only records of this operation.
    #[arg(long, value_name = "OP")]
    pub operation: Option<String>,
    /// Also list expired records not yet dropped.
    #[arg(long)]
    pub include_expired: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum StateArg {
    InProgress,
    Completed,
    Failed,
}

impl From<StateArg> for RecordState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::InProgress => RecordState::InProgress,
            StateArg::Completed => RecordState::Completed,
            StateArg::Failed => RecordState::Failed,
        }
    }
}

/// `90`, `90s`, `500ms`, `30m`, `24h`, `7d`; a bare number is seconds.
/// A size in bytes: digits, then nothing (bytes) or K, M, G (also KiB, MiB, GiB; powers of
/// 1,024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size such as 300M, 2G or 1048576"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use K, M or G")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 90s, 30m, 24h or 7d"))?;
    let ms_per = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?}: use ms, s, m, h or d"
            ));
        }
    };
    let ms = n
        .checked_mul(ms_per)
        .ok_or_else(|| format!("{s:?} is too long"))?;
    if ms == 0 {
        return Err("a duration must be at least 1 ms".to_string());
    }
    Ok(Duration::from_millis(ms))
}

fn parse_operation_ttl(s: &str) -> Result<(String, Duration), String> {
    let (op, ttl) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("{s:?} is not OPERATION=DURATION"))?;
    if op.is_empty() {
        return Err("the operation must not be empty".to_string());
    }
    Ok((op.to_string(), parse_duration(ttl)?))
}

/// A key given on the command line, as bytes.
pub fn key_bytes(key: &str, hex: bool) -> Result<Vec<u8>, CliError> {
    if !hex {
        return Ok(key.as_bytes().to_vec());
    }
    let digits: Vec<u8> = key.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(CliError::Usage(format!(
            "--key-hex: {key:?} has an odd number of hex digits"
        )));
    }
    digits
        .chunks_exact(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| CliError::Usage(format!("--key-hex: {key:?} is not hex")))
        })
        .collect()
}
