//! `scan`, `export` and `verify`: passes over every stored record, streamed, with a progress
//! bar on long ones.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

use idemdb::{ScanFilter, ScannedRecord, VerifyReport};
use serde_json::json;

use crate::cli::{Global, ScanArgs};
use crate::commands::Ctx;
use crate::errors::{CliError, code};
use crate::open::open;
use crate::output::{RecordView, human_bytes, json_bytes, size};
use crate::progress::Progress;

/// How a record is written: a `scan` line (human or JSON, no response) or an `export` line.
#[derive(Clone, Copy)]
enum Form {
    ScanLine,
    ScanJson,
    Export,
}

pub fn scan(
    ctx: &mut Ctx,
    path: &Path,
    global: &Global,
    args: &ScanArgs,
    limit: Option<u64>,
) -> Result<u8, CliError> {
    let mut filter = ScanFilter::default().include_expired(args.include_expired);
    if let Some(state) = args.state {
        filter = filter.state(state.into());
    }
    if let Some(op) = &args.operation {
        filter = filter.operation(op);
    }
    let form = if ctx.json {
        Form::ScanJson
    } else {
        Form::ScanLine
    };
    pass(ctx, path, global, &filter, limit, form, "scan")
}

pub fn export(
    ctx: &mut Ctx,
    path: &Path,
    global: &Global,
    include_expired: bool,
) -> Result<u8, CliError> {
    let filter = ScanFilter::default().include_expired(include_expired);
    pass(ctx, path, global, &filter, None, Form::Export, "export")
}

fn pass(
    ctx: &mut Ctx,
    path: &Path,
    global: &Global,
    filter: &ScanFilter,
    limit: Option<u64>,
    form: Form,
    what: &'static str,
) -> Result<u8, CliError> {
    let db = open(path, global)?;
    let progress = Progress::new(what, db.stats().stored_records, ctx.quiet, true);
    let mut written = 0u64;
    let mut failure = None;
    let out = &mut ctx.out;
    let summary = if limit == Some(0) {
        None
    } else {
        let visit = |rec: ScannedRecord| {
            let view = RecordView {
                operation: rec.scope.operation(),
                principal: rec.scope.principal(),
                key: rec.key.as_bytes(),
                record: &rec.record,
                expired: rec.expired,
                stored_in: Some(rec.stored_in),
            };
            let wrote = match form {
                Form::ScanLine => out.line(&view.line()),
                Form::ScanJson => out.json(&view.json(false)),
                Form::Export => out.json(&view.json(true)),
            };
            match wrote {
                Ok(true) => {
                    written += 1;
                    if limit.is_some_and(|l| written >= l) {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                }
                Ok(false) => ControlFlow::Break(()),
                Err(e) => {
                    failure = Some(e);
                    ControlFlow::Break(())
                }
            }
        };
        let summary = db
            .scan_with_progress(filter, |n| progress.set(n), visit)
            .map_err(|e| CliError::from_engine(path, e))?;
        Some(summary)
    };
    progress.finish();
    if let Some(e) = failure {
        return Err(e);
    }
    ctx.out.flush()?;
    if !ctx.quiet && !ctx.json && !ctx.out.is_closed() {
        let read = summary.map_or(0, |s| s.entries_read);
        let verb = if matches!(form, Form::Export) {
            "exported"
        } else {
            "listed"
        };
        // Only a summary: a closed stderr is no reason to fail.
        let _ = writeln!(
            std::io::stderr(),
            "{verb} {written} records ({read} stored entries read)"
        );
    }
    Ok(code::OK)
}

pub fn verify(
    ctx: &mut Ctx,
    path: &Path,
    global: &Global,
    max_problems: usize,
) -> Result<u8, CliError> {
    // Opening verifies every page checksum; a damaged file fails here as corrupt.
    let db = open(path, global)?;
    let stats = db.stats();
    let progress = Progress::new("verify", stats.stored_records, ctx.quiet, false);
    let report = db
        .verify(max_problems, |n| progress.set(n))
        .map_err(|e| CliError::from_engine(path, e))?;
    progress.finish();
    if ctx.json {
        ctx.out.json(&verify_json(&report, stats.bytes_on_disk))?;
    } else {
        verify_human(ctx, &report, stats.bytes_on_disk)?;
    }
    Ok(if report.is_ok() {
        code::OK
    } else {
        code::NEGATIVE
    })
}

fn verify_json(r: &VerifyReport, bytes: u64) -> serde_json::Value {
    let problems: Vec<serde_json::Value> = r
        .problems
        .iter()
        .map(|p| {
            let mut v = json!({"table": p.table, "what": p.what});
            if let Some(key) = &p.key {
                let (text, encoding) = json_bytes(key);
                v["key"] = json!(text);
                v["key_encoding"] = json!(encoding);
            }
            v
        })
        .collect();
    json!({
        "ok": r.is_ok(),
        "page_checksums": "ok",
        "bytes_on_disk": bytes,
        "partitions": r.partitions,
        "in_flight_records": r.in_flight_records,
        "finished_records": r.finished_records,
        "expired_records": r.expired_records,
        "horizon_rows": r.horizon_rows,
        "horizon_tags": r.horizon_tags,
        "other_tables": r.other_tables,
        "problem_count": r.problem_count,
        "problems": problems,
    })
}

fn verify_human(ctx: &mut Ctx, r: &VerifyReport, bytes: u64) -> Result<(), CliError> {
    let mut lines = vec![
        format!("page checksums   ok, verified at open ({})", size(bytes)),
        format!("partitions       {}", r.partitions),
        format!("in-flight        {} records", r.in_flight_records),
        format!(
            "finished         {} records ({} expired, awaiting compaction)",
            r.finished_records, r.expired_records
        ),
        format!(
            "horizon          {} rows, {} key tags",
            r.horizon_rows, r.horizon_tags
        ),
        format!(
            "other tables     {} (not idemdb's; not checked)",
            r.other_tables
        ),
    ];
    if r.is_ok() {
        lines.push("OK: no problems found".to_string());
    } else {
        lines.push(format!(
            "FAILED: {} problems found{}:",
            r.problem_count,
            if r.problem_count > r.problems.len() as u64 {
                format!(" (the first {} listed)", r.problems.len())
            } else {
                String::new()
            }
        ));
        for p in &r.problems {
            let key = p
                .key
                .as_deref()
                .map(|k| format!(" key {}", human_bytes(k)))
                .unwrap_or_default();
            lines.push(format!("  {}{key}: {}", p.table, p.what));
        }
    }
    for line in lines {
        ctx.out.line(&line)?;
    }
    Ok(())
}
