//! The key from the `Idempotency-Key` header: strictly an RFC 8941 sf-string, as the draft
//! specifies, or leniently the unquoted value.

use http::{HeaderMap, HeaderName};

use idemdb_core::Key;

/// The request's key: `Ok(None)` without the header; `Err(why)` for a value that is no key.
pub(crate) fn parse_key(
    headers: &HeaderMap,
    name: &HeaderName,
    max_len: usize,
    strict: bool,
) -> Result<Option<Key>, &'static str> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    // Two field lines are one comma-joined list to RFC 8941: refused either way.
    if values.next().is_some() {
        return Err("more than one Idempotency-Key header");
    }
    let raw = value.as_bytes();
    let key = if strict {
        sf_string(raw)?
    } else {
        match raw {
            [b'"', inner @ .., b'"'] if !inner.contains(&b'"') => inner.to_vec(),
            _ => raw.to_vec(),
        }
    };
    if key.is_empty() {
        return Err("the key is empty");
    }
    if key.len() > max_len {
        return Err("the key is too long");
    }
    Ok(Some(Key::new(key)))
}

/// RFC 8941 §4.2.5: a quoted string of %x20-7E, `\"` and `\\` escaped, with optional
/// spaces around it and nothing else (no list, no parameters).
fn sf_string(raw: &[u8]) -> Result<Vec<u8>, &'static str> {
    const NOT_STRING: &str = "the key is not a quoted string (RFC 8941 sf-string)";
    let mut bytes = raw.iter().copied().skip_while(|&b| b == b' ');
    if bytes.next() != Some(b'"') {
        return Err(NOT_STRING);
    }
    let mut key = Vec::with_capacity(raw.len());
    loop {
        match bytes.next() {
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(b @ (b'"' | b'\\')) => key.push(b),
                _ => return Err("the key has an invalid escape"),
            },
            Some(b @ 0x20..=0x7e) => key.push(b),
            Some(_) => return Err("the key has a character outside %x20-7E"),
            None => return Err("the key's closing quote is missing"),
        }
    }
    if bytes.any(|b| b != b' ') {
        return Err("one key per Idempotency-Key header, without parameters");
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_keys_are_sf_strings() {
        let ok = |raw: &[u8]| sf_string(raw).map_err(|_| ());
        assert_eq!(ok(b"\"abc\""), Ok(b"abc".to_vec()));
        assert_eq!(ok(b"  \"a b\"  "), Ok(b"a b".to_vec()));
        assert_eq!(ok(b"\"a\\\"b\\\\\""), Ok(b"a\"b\\".to_vec()));
        assert_eq!(ok(b"\"\""), Ok(Vec::new()));
        for bad in [
            &b"abc"[..],
            b"\"abc",
            b"\"a\", \"b\"",
            b"\"a\";p=1",
            b"\"a\\nb\"",
            b"\"\xc3\xa9\"",
            b"\"a\tb\"",
            b"",
        ] {
            assert_eq!(ok(bad), Err(()), "{bad:?}");
        }
    }
}
