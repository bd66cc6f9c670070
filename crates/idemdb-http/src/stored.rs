//! The stored form of an HTTP response: what a replay sends back, byte for byte.
//!
//! Layout (all integers big-endian): `version u8 = 1 | status u16 | header count u16 |`
//! per header `name length u16 | name | value length u32 | value |` then the body to the end.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const VERSION: u8 = 1;

/// A response as stored: status, the allow-listed headers, the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Vec<u8>,
}

impl StoredResponse {
    /// Keeps the headers named in `allow` (in the response's order).
    pub(crate) fn new(
        status: StatusCode,
        headers: &HeaderMap,
        allow: &[HeaderName],
        body: Vec<u8>,
    ) -> Self {
        let headers = headers
            .iter()
            .filter(|(name, _)| allow.contains(name))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        StoredResponse {
            status,
            headers,
            body,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + self.body.len());
        out.push(VERSION);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        // At most 65,535 headers are kept; a response with more is not one we store.
        let n = self.headers.len().min(usize::from(u16::MAX));
        out.extend_from_slice(&(n as u16).to_be_bytes());
        for (name, value) in self.headers.iter().take(n) {
            let name = name.as_str().as_bytes();
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&self.body);
        out
    }

    /// `None` for bytes that are not a stored response (never a panic).
    pub(crate) fn decode(bytes: &[u8]) -> Option<StoredResponse> {
        let mut r = Reader(bytes);
        if r.take(1)? != [VERSION] {
            return None;
        }
        let status = StatusCode::from_u16(u16::from_be_bytes(r.array()?)).ok()?;
        let n = u16::from_be_bytes(r.array()?);
        let mut headers = Vec::with_capacity(usize::from(n).min(64));
        for _ in 0..n {
            let name_len = u16::from_be_bytes(r.array()?);
            let name = HeaderName::from_bytes(r.take(usize::from(name_len))?).ok()?;
            let value_len = u32::from_be_bytes(r.array()?);
            let value = HeaderValue::from_bytes(r.take(usize::try_from(value_len).ok()?)?).ok()?;
            headers.push((name, value));
        }
        Some(StoredResponse {
            status,
            headers,
            body: r.0.to_vec(),
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("x-secret", HeaderValue::from_static("no"));
        headers.append("location", HeaderValue::from_static("/orders/1"));
        let allow = [
            HeaderName::from_static("content-type"),
            HeaderName::from_static("location"),
        ];
        let stored = StoredResponse::new(StatusCode::CREATED, &headers, &allow, vec![0, 255, 7]);
        assert_eq!(stored.headers.len(), 2, "x-secret is not on the allow-list");
        let bytes = stored.encode();
        assert_eq!(StoredResponse::decode(&bytes), Some(stored));
        for cut in 0..bytes.len() - 3 {
            assert_eq!(StoredResponse::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        assert_eq!(StoredResponse::decode(&[2, 0, 200, 0, 0]), None);
        assert_eq!(StoredResponse::decode(&[1, 0, 5, 0, 0]), None, "status 5");
    }
}
