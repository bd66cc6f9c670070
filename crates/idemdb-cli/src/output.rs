//! Writing results: a line writer on stdout that ends quietly on a closed pipe, and the
//! renderings of bytes, times and records shared by the commands.

use std::io::{BufWriter, ErrorKind, StdoutLock, Write};

use idemdb::{Record, StoredIn};
use serde_json::{Value, json};

use crate::errors::CliError;

/// Stdout, buffered. A closed pipe (`idemdb export f | head`) is not an error: the command
/// stops and exits as if it had finished.
pub struct Out {
    w: BufWriter<StdoutLock<'static>>,
    closed: bool,
}

impl Out {
    pub fn new() -> Out {
        Out {
            w: BufWriter::new(std::io::stdout().lock()),
            closed: false,
        }
    }

    /// Writes one line; `Ok(false)` once the reader went away.
    pub fn line(&mut self, line: &str) -> Result<bool, CliError> {
        if self.closed {
            return Ok(false);
        }
        let written = self
            .w
            .write_all(line.as_bytes())
            .and_then(|()| self.w.write_all(b"\n"));
        self.check(written)
    }

    /// One JSON value on one line.
    pub fn json(&mut self, value: &Value) -> Result<bool, CliError> {
        self.line(&value.to_string())
    }

    pub fn flush(&mut self) -> Result<bool, CliError> {
        if self.closed {
            return Ok(false);
        }
        let flushed = self.w.flush();
        self.check(flushed)
    }

    /// Whether the reader went away.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    fn check(&mut self, result: std::io::Result<()>) -> Result<bool, CliError> {
        match result {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(false)
            }
            Err(e) => Err(CliError::Output(e)),
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// Standard base64 (RFC 4648 §4) with padding.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Bytes for JSON: the text if it is UTF-8, else base64; and which.
pub fn json_bytes(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_string(), "utf8"),
        Err(_) => (base64(bytes), "base64"),
    }
}

/// Bytes on a human line: plain if printable UTF-8 without spaces, quoted and escaped if
/// UTF-8, `0x…` hex otherwise.
pub fn human_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text)
            if !text.is_empty()
                && !text.starts_with('"')
                && !text.starts_with("0x")
                && text.chars().all(|c| !c.is_whitespace() && !c.is_control()) =>
        {
            text.to_string()
        }
        Ok(text) => format!("\"{}\"", text.escape_debug()),
        Err(_) => format!("0x{}", hex(bytes)),
    }
}

/// ms since the Unix epoch as RFC 3339 UTC, e.g. `2023-11-14T22:13:20.000Z`; `never` for
/// `u64::MAX`.
pub fn time(ms: u64) -> String {
    if ms == u64::MAX {
        return "never".to_string();
    }
    let days = ms / 86_400_000;
    let rest = ms % 86_400_000;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1_000 % 60,
        rest % 1_000
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// A duration in ms, roughly: `3d 4h`, `12m 5s`, `250ms`.
pub fn duration(ms: u64) -> String {
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    let mut parts = Vec::new();
    let mut rest = ms;
    for (size, name) in units {
        if rest >= size {
            parts.push(format!("{}{name}", rest / size));
            rest %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    if parts.is_empty() {
        format!("{ms}ms")
    } else {
        parts.join(" ")
    }
}

/// A size in bytes, e.g. `1.5 MiB (1572864 bytes)`.
pub fn size(bytes: u64) -> String {
    let units = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in units {
        if bytes >= unit {
            return format!("{:.1} {name} ({bytes} bytes)", bytes as f64 / unit as f64);
        }
    }
    format!("{bytes} bytes")
}

/// One record and its name, as the commands print it.
pub struct RecordView<'a> {
    pub operation: &'a [u8],
    pub principal: &'a [u8],
    pub key: &'a [u8],
    pub record: &'a Record,
    pub expired: bool,
    pub stored_in: Option<StoredIn>,
}

impl RecordView<'_> {
    /// The JSON object of `scan --json` (`with_response` false: its length only), `export` and
    /// `get --json` (with the response).
    pub fn json(&self, with_response: bool) -> Value {
        let r = self.record;
        let (operation, operation_encoding) = json_bytes(self.operation);
        let (principal, principal_encoding) = json_bytes(self.principal);
        let (key, key_encoding) = json_bytes(self.key);
        let mut v = json!({
            "operation": operation,
            "operation_encoding": operation_encoding,
            "principal": principal,
            "principal_encoding": principal_encoding,
            "key": key,
            "key_encoding": key_encoding,
            "state": r.state.as_str(),
            "token": r.token.get(),
            "attempts": r.attempts,
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "lease_expires_at": r.lease_expires_at,
            "expires_at": r.expires_at,
            "expired": self.expired,
            "fingerprint": format!("{:032x}", r.fingerprint.as_u128()),
            "response_len": r.response.len(),
        });
        match self.stored_in {
            Some(StoredIn::Partition {
                start_ms,
                width_ms,
                ttl_ms,
            }) => {
                v["stored_in"] = json!("partition");
                v["partition"] = json!({"start": start_ms, "width": width_ms, "ttl": ttl_ms});
            }
            Some(other) => v["stored_in"] = json!(stored_in_name(other)),
            None => {}
        }
        if with_response {
            let (response, encoding) = json_bytes(&r.response);
            v["response"] = json!(response);
            v["response_encoding"] = json!(encoding);
        }
        v
    }

    /// One line of `scan`.
    pub fn line(&self) -> String {
        let r = self.record;
        format!(
            "{:<11} {} {} {} token={} attempts={} updated={} expires={}{} response={}B",
            r.state.as_str(),
            human_bytes(self.operation),
            human_bytes(self.principal),
            human_bytes(self.key),
            r.token,
            r.attempts,
            time(r.updated_at),
            time(r.expires_at),
            if self.expired { " (expired)" } else { "" },
            r.response.len()
        )
    }
}

pub fn stored_in_name(stored_in: StoredIn) -> &'static str {
    match stored_in {
        StoredIn::InFlight => "in_flight",
        StoredIn::Partition { .. } => "partition",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
        assert_eq!(time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(human_bytes(b"a b"), "\"a b\"");
        assert_eq!(human_bytes(&[0xff]), "0xff");
        assert_eq!(duration(90_061_000), "1d 1h");
    }
}
