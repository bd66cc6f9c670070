//! `idemdb`: the operator CLI (crate `idemdb-cli`). `idemdb --help` lists the commands; the
//! exit codes are in errors.rs.

#![forbid(unsafe_code)]

mod cli;
mod commands;
mod errors;
mod open;
mod outbox;
mod outbox_target;
mod output;
mod progress;
mod records;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use serde_json::json;

use cli::{Cli, Command};
use commands::{Ctx, GetArgs};
use errors::CliError;
use output::Out;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut ctx = Ctx {
        json: cli.global.json,
        quiet: cli.global.quiet,
        out: Out::new(),
    };
    let result = run(&mut ctx, &cli).and_then(|code| {
        ctx.out.flush()?;
        Ok(code)
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // What was written before the failure goes out first.
            let _ = ctx.out.flush();
            report(&e, ctx.json);
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(ctx: &mut Ctx, cli: &Cli) -> Result<u8, CliError> {
    let global = &cli.global;
    match &cli.command {
        Command::Stats { path } => commands::stats(ctx, path, global),
        Command::Get {
            path,
            operation,
            principal,
            key,
            key_hex,
        } => {
            let args = GetArgs {
                operation,
                principal,
                key,
                key_hex: *key_hex,
            };
            commands::get(ctx, path, global, args)
        }
        Command::Scan {
            path,
            filter,
            limit,
        } => records::scan(ctx, path, global, filter, *limit),
        Command::Compact { path } => commands::compact(ctx, path, global),
        Command::AcceptLogLoss { path } => commands::accept_log_loss(ctx, path, global),
        Command::Verify { path, max_problems } => records::verify(ctx, path, global, *max_problems),
        Command::Export {
            path,
            include_expired,
        } => records::export(ctx, path, global, *include_expired),
        Command::Outbox { action } => outbox::outbox(ctx, global, action),
    }
}

/// The error on stderr: a line of text, or a JSON object with `--json`. A closed stderr is
/// ignored (the exit code still tells).
fn report(e: &CliError, json: bool) {
    let line = if json {
        json!({
            "error": e.kind(),
            "message": e.to_string(),
            "exit_code": e.exit_code(),
        })
        .to_string()
    } else {
        format!("idemdb: error: {e}")
    };
    let _ = writeln!(std::io::stderr(), "{line}");
}
