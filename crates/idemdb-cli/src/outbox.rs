//! `outbox`: the operator's view of the outbox (pending and parked messages) and its tools:
//! retry or park one message, purge the parked ones after confirmation; on a database file
//! or over PostgreSQL (outbox_target.rs).

use std::io::{BufRead, IsTerminal, Write};

use idemdb::{MessageId, OutboxMessage};
use serde_json::json;

use crate::cli::{Global, OutboxAction};
use crate::commands::Ctx;
use crate::errors::{CliError, code};
use crate::outbox_target::OutboxTarget;
use crate::output::{json_bytes, time};

pub fn outbox(ctx: &mut Ctx, global: &Global, action: &OutboxAction) -> Result<u8, CliError> {
    match action {
        OutboxAction::List {
            path,
            parked,
            limit,
        } => list(ctx, &OutboxTarget::open(path, global)?, *parked, *limit),
        OutboxAction::Retry { path, id } => {
            let id = parse_id(id)?;
            let back = OutboxTarget::open(path, global)?.retry_parked(id)?;
            answer(
                ctx,
                back,
                &format!("{id}: back in line"),
                &format!("{id}: no parked message"),
            )
        }
        OutboxAction::Park { path, id, reason } => {
            let id = parse_id(id)?;
            let parked = OutboxTarget::open(path, global)?.park_message(id, reason)?;
            answer(
                ctx,
                parked,
                &format!("{id}: parked"),
                &format!("{id}: no pending message"),
            )
        }
        OutboxAction::Purge { path, yes } => purge(ctx, &OutboxTarget::open(path, global)?, *yes),
    }
}

fn parse_id(text: &str) -> Result<MessageId, CliError> {
    MessageId::parse(text)
        .ok_or_else(|| CliError::Usage(format!("{text:?} is not a message id (32 hex digits)")))
}

/// Exit 0 if `done`, else 1 (nothing matched), with a line or `{"done": …}`.
fn answer(ctx: &mut Ctx, done: bool, yes: &str, no: &str) -> Result<u8, CliError> {
    if ctx.json {
        ctx.out.json(&json!({ "done": done }))?;
    } else {
        ctx.say(if done { yes } else { no })?;
    }
    Ok(if done { code::OK } else { code::NEGATIVE })
}

fn list(
    ctx: &mut Ctx,
    outbox: &OutboxTarget<'_>,
    parked_only: bool,
    limit: Option<usize>,
) -> Result<u8, CliError> {
    let limit = limit.unwrap_or(usize::MAX);
    let stats = outbox.stats()?;
    let mut rows: Vec<(&str, OutboxMessage)> = Vec::new();
    if !parked_only {
        let pending = outbox.list(false, limit)?;
        rows.extend(pending.into_iter().map(|m| ("pending", m)));
    }
    let room = limit.saturating_sub(rows.len());
    let parked = outbox.list(true, room)?;
    rows.extend(parked.into_iter().map(|m| ("parked", m)));
    for (status, m) in &rows {
        if ctx.json {
            let (payload, encoding) = json_bytes(&m.payload);
            let key = m.ordering_key.as_deref().map(json_bytes);
            ctx.out.json(&json!({
                "status": status,
                "id": m.id.to_string(),
                "seq": m.seq,
                "destination": m.destination,
                "ordering_key": key.as_ref().map(|(k, _)| k),
                "staged_at_ms": m.staged_at_ms,
                "attempts": m.attempts,
                "last_error": m.last_error,
                "headers": m.headers.len(),
                "payload": payload,
                "payload_encoding": encoding,
            }))?;
        } else {
            let key = m
                .ordering_key
                .as_deref()
                .map_or("-".to_string(), |k| String::from_utf8_lossy(k).into_owned());
            let error = m.last_error.as_deref().unwrap_or("");
            ctx.say(&format!(
                "{status:<7} {} #{} {} key={key} staged={} attempts={} {}B {error}",
                m.id,
                m.seq,
                m.destination,
                time(m.staged_at_ms),
                m.attempts,
                m.payload.len(),
            ))?;
        }
    }
    if !ctx.quiet && !ctx.json {
        let _ = writeln!(
            std::io::stderr(),
            "{} pending, {} parked",
            stats.backlog,
            stats.parked
        );
    }
    Ok(code::OK)
}

/// Removes every parked message for good, after `--yes` or a typed `yes` on a terminal.
fn purge(ctx: &mut Ctx, outbox: &OutboxTarget<'_>, yes: bool) -> Result<u8, CliError> {
    let parked = outbox.stats()?.parked;
    if parked == 0 {
        answer_purged(ctx, 0)?;
        return Ok(code::OK);
    }
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Err(CliError::Usage(format!(
                "{parked} parked messages would be removed for good: pass --yes to confirm"
            )));
        }
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "Remove {parked} parked messages for good (they will never be sent)? Type yes: "
        );
        let _ = err.flush();
        let mut line = String::new();
        stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| CliError::Io(outbox.shown(), e))?;
        if line.trim() != "yes" {
            return Err(CliError::Usage("not confirmed: nothing removed".into()));
        }
    }
    let purged = outbox.purge_parked()?;
    answer_purged(ctx, purged)?;
    Ok(code::OK)
}

fn answer_purged(ctx: &mut Ctx, purged: u64) -> Result<(), CliError> {
    if ctx.json {
        ctx.out.json(&json!({ "purged": purged })).map(drop)
    } else {
        ctx.say(&format!("{purged} parked messages removed"))
    }
}
