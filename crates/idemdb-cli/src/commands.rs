//! `stats`, `get` and `compact`: one answer each.

use idemdb::Refusal;
use std::path::Path;

use idemdb::{BeyondHorizonPolicy, Error, Histogram, Key, Retention, Scope};
use serde_json::{Value, json};

use crate::cli::{Global, key_bytes};
use crate::errors::{CliError, code};
use crate::open::{open, open_with};
use crate::output::{Out, RecordView, duration, human_bytes, size, time};

/// Output mode and stdout, shared by every command.
pub struct Ctx {
    pub json: bool,
    pub quiet: bool,
    pub out: Out,
}

impl Ctx {
    /// A human line, or nothing in `--json` mode.
    pub fn say(&mut self, line: &str) -> Result<(), CliError> {
        if !self.json {
            self.out.line(line)?;
        }
        Ok(())
    }
}

pub fn stats(ctx: &mut Ctx, path: &Path, global: &Global) -> Result<u8, CliError> {
    let db = open(path, global)?;
    let s = db.stats();
    let retention = db.retention();
    if ctx.json {
        let v = json!({
            "path": path.display().to_string(),
            "stored_records": s.stored_records,
            "in_flight_records": s.in_flight_records,
            "partitions": s.partitions,
            "partitions_read_at_open": s.partitions_read_at_open,
            "indexed_keys": s.indexed_keys,
            "horizon_keys": s.horizon_keys,
            "bytes_on_disk": s.bytes_on_disk,
            "memory": {
                "page_cache": s.memory.page_cache,
                "replay_cache": s.memory.replay_cache,
                "key_index": s.memory.key_index,
                "key_filters": s.memory.key_filters,
                "horizon": s.memory.horizon,
                "total": s.memory.total(),
            },
            "since_open": {
                "acquired": s.acquired,
                "takeovers": s.takeovers,
                "replays_completed": s.replays_completed,
                "replays_failed": s.replays_failed,
                "mismatches": s.mismatches,
                "in_progress": s.in_progress,
                "fenced": s.fenced,
                "finished": s.finished,
                "releases": s.releases,
                "commits": s.commits,
                "beyond_horizon": s.beyond_horizon,
                "expired_records": s.expired_records,
                "partitions_dropped": s.partitions_dropped,
                "batch_size": histogram(&s.batch_size),
                "commit_latency_us": histogram(&s.commit_latency_us),
            },
            "retention": retention_json(retention, global),
            "log_losses_accepted": s.log_losses_accepted,
            "last_log_loss": s.last_log_loss.as_ref().map(|l| json!({
                "at_ms": l.at_ms,
                "what": l.what,
            })),
        });
        ctx.out.json(&v)?;
        return Ok(code::OK);
    }
    let finished = s.stored_records.saturating_sub(s.in_flight_records);
    let lines = [
        format!("file                {}", path.display()),
        format!("size on disk        {}", size(s.bytes_on_disk)),
        format!(
            "stored records      {} (in progress {}, finished {}; expired ones until dropped)",
            s.stored_records, s.in_flight_records, finished
        ),
        format!(
            "partitions          {} (keys read at open: {}; the others' from their summaries \
             or filters)",
            s.partitions, s.partitions_read_at_open
        ),
        format!(
            "indexed keys        {} (in memory: {})",
            s.indexed_keys,
            size(s.memory.key_index)
        ),
        format!("wide filters        {}", size(s.memory.key_filters)),
        format!(
            "horizon keys        {} (in memory: {})",
            s.horizon_keys,
            size(s.memory.horizon)
        ),
        format!(
            "memory              {} (page cache {}, replay cache {}, key index, filters and \
             horizon)",
            size(s.memory.total()),
            size(s.memory.page_cache),
            size(s.memory.replay_cache)
        ),
        format!("retention in force  {}", retention_line(retention, global)),
        format!(
            "since this open     acquired {}, replays {}/{}, mismatches {}, commits {}",
            s.acquired, s.replays_completed, s.replays_failed, s.mismatches, s.commits
        ),
    ];
    for line in lines {
        ctx.say(&line)?;
    }
    match &s.last_log_loss {
        Some(loss) => ctx.say(&format!(
            "log losses accepted {} (the last at {}: {})",
            s.log_losses_accepted,
            time(loss.at_ms),
            loss.what
        ))?,
        None => ctx.say("log losses accepted 0")?,
    }
    Ok(code::OK)
}

/// Opens `path` accepting a loss of its log, and says what was accepted.
pub fn accept_log_loss(ctx: &mut Ctx, path: &Path, global: &Global) -> Result<u8, CliError> {
    let db = open_with(path, global, true)?;
    let s = db.stats();
    let accepted = db.accepted_log_loss().map(|p| p.to_string());
    if ctx.json {
        ctx.out.json(&json!({
            "path": path.display().to_string(),
            "accepted": accepted,
            "frames_replayed": s.replayed_frames,
            "log_losses_accepted": s.log_losses_accepted,
        }))?;
        return Ok(code::OK);
    }
    match accepted {
        Some(what) => ctx.out.line(&format!(
            "accepted: the write-ahead log {what}. Kept {} intact frames; fencing tokens \
             restart above any issued before; a fresh log was started. Losses accepted over \
             this file's life: {}.",
            s.replayed_frames, s.log_losses_accepted
        ))?,
        None => ctx
            .out
            .line("nothing to accept: the write-ahead log is complete")?,
    };
    Ok(code::OK)
}

fn histogram(h: &Histogram) -> Value {
    json!({"count": h.count, "sum": h.sum, "mean": h.mean(), "buckets": h.buckets.to_vec()})
}

fn policy(p: BeyondHorizonPolicy) -> &'static str {
    match p {
        BeyondHorizonPolicy::Flag => "flag",
        BeyondHorizonPolicy::Refuse => "refuse",
        _ => "other",
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn retention_json(r: &Retention, global: &Global) -> Value {
    let operation_ttls: serde_json::Map<String, Value> = global
        .operation_ttls
        .iter()
        .map(|(op, ttl)| (op.clone(), json!(ms(*ttl))))
        .collect();
    json!({
        "default_ttl_ms": ms(r.default_ttl),
        "operation_ttls_ms": operation_ttls,
        "partition_width_ms": ms(r.width_or(idemdb::Builder::DEFAULT_PARTITION_WIDTH)),
        "horizon_factor": r.horizon_factor,
        "beyond_horizon": policy(r.beyond_horizon),
        "note": "this process's settings (the file does not store them): set with --ttl, \
                 --operation-ttl, --partition-width, --horizon-factor",
    })
}

fn retention_line(r: &Retention, global: &Global) -> String {
    let mut line = format!(
        "ttl {}, partition width {}, horizon factor {}, beyond horizon: {}",
        duration(ms(r.default_ttl)),
        duration(ms(r.width_or(idemdb::Builder::DEFAULT_PARTITION_WIDTH))),
        r.horizon_factor,
        policy(r.beyond_horizon)
    );
    for (op, ttl) in &global.operation_ttls {
        line.push_str(&format!(", {op}: {}", duration(ms(*ttl))));
    }
    line.push_str(" (this process's settings; the file does not store them)");
    line
}

pub struct GetArgs<'a> {
    pub operation: &'a str,
    pub principal: &'a str,
    pub key: &'a str,
    pub key_hex: bool,
}

pub fn get(ctx: &mut Ctx, path: &Path, global: &Global, a: GetArgs<'_>) -> Result<u8, CliError> {
    let key = key_bytes(a.key, a.key_hex)?;
    let db = open(path, global)?;
    let scope = Scope::new(a.operation, a.principal);
    let record = match db.get(&scope, &Key::new(&key)) {
        Ok(record) => record,
        Err(Error::Refused(Refusal::InvalidInput(e))) => {
            return Err(CliError::Usage(e.to_string()));
        }
        Err(e) => return Err(CliError::from_engine(path, e)),
    };
    let name = format!(
        "{} / {} / {}",
        human_bytes(a.operation.as_bytes()),
        human_bytes(a.principal.as_bytes()),
        human_bytes(&key)
    );
    let Some(record) = record else {
        if ctx.json {
            ctx.out.json(&json!({"found": false}))?;
        } else {
            ctx.out.line(&format!("no live record for {name}"))?;
        }
        return Ok(code::NEGATIVE);
    };
    let view = RecordView {
        operation: a.operation.as_bytes(),
        principal: a.principal.as_bytes(),
        key: &key,
        record: &record,
        expired: false,
        stored_in: None,
    };
    if ctx.json {
        ctx.out
            .json(&json!({"found": true, "record": view.json(true)}))?;
        return Ok(code::OK);
    }
    let r = &record;
    let plain = |c: char| !c.is_control() || matches!(c, '\n' | '\r' | '\t');
    let response = match std::str::from_utf8(&r.response) {
        Ok(text) if text.chars().all(plain) => {
            format!("{} bytes, UTF-8:\n{text}", r.response.len())
        }
        Ok(text) => format!(
            "{} bytes, UTF-8 with control characters, shown escaped:\n{}",
            r.response.len(),
            text.escape_debug()
        ),
        Err(_) => format!(
            "{} bytes, not UTF-8, shown as hex:\n{}",
            r.response.len(),
            crate::output::hex(&r.response)
        ),
    };
    let lines = [
        format!("record       {name}"),
        format!("state        {}", r.state.as_str()),
        format!("token        {}", r.token),
        format!("attempts     {}", r.attempts),
        format!("created      {}", time(r.created_at)),
        format!("updated      {}", time(r.updated_at)),
        format!("lease until  {}", time(r.lease_expires_at)),
        format!("expires      {}", time(r.expires_at)),
        format!("fingerprint  {:032x}", r.fingerprint.as_u128()),
        format!("response     {response}"),
    ];
    for line in lines {
        ctx.out.line(&line)?;
    }
    Ok(code::OK)
}

pub fn compact(ctx: &mut Ctx, path: &Path, global: &Global) -> Result<u8, CliError> {
    let db = open(path, global)?;
    let report = db
        .compact_now()
        .map_err(|e| CliError::from_engine(path, e))?;
    if ctx.json {
        ctx.out.json(&json!({
            "partitions_dropped": report.partitions_dropped,
            "records_expired": report.records_expired,
            "in_flight_expired": report.in_flight_expired,
            "horizon_sets_retired": report.horizon_sets_retired,
            "partitions_summarized": report.partitions_summarized,
            "wide_partitions_built": report.wide_partitions_built,
            "partitions_widened": report.partitions_widened,
            "tables_reclaimed": report.tables_reclaimed,
        }))?;
    } else {
        ctx.out.line(&format!(
            "dropped {} partitions ({} expired records), swept {} abandoned reservations, \
             retired {} horizon sets, summarised {} partitions, built {} wide partitions \
             from {}, freed {} tables",
            report.partitions_dropped,
            report.records_expired,
            report.in_flight_expired,
            report.horizon_sets_retired,
            report.partitions_summarized,
            report.wide_partitions_built,
            report.partitions_widened,
            report.tables_reclaimed
        ))?;
    }
    Ok(code::OK)
}
