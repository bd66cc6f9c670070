//! TLS to the server, as the connection string's `sslmode` asks, with libpq's meanings:
//! `disable` (plain), `prefer` (TLS if the server offers it, unverified; the default),
//! `require` (TLS, unverified), `verify-ca` (TLS, the certificate chains to a trusted root),
//! `verify-full` (and names the host connected to). Trusted roots: the CA certificates given
//! ([`PgStoreBuilder::tls_root_certificates`](crate::PgStoreBuilder::tls_root_certificates),
//! or `sslrootcert=<file>` in the string), else the operating system's.
//!
//! tokio-postgres knows neither `verify-*` nor `sslrootcert`: both are taken out of the string
//! before it parses it, and the verification is rustls's.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::PgError;

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Result<Mode, PgError> {
        Ok(match value {
            "disable" => Mode::Disable,
            // libpq's `allow` tries plain first; TLS when offered is as safe.
            "allow" | "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            other => return Err(invalid(format!("sslmode={other} is not a TLS mode"))),
        })
    }

    /// What the driver is told: whether to ask for TLS, and whether to insist.
    pub(crate) fn driver(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

fn invalid(why: String) -> PgError {
    PgError::Database(Arc::new(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        why,
    )))
}

/// The TLS settings of a connection string, and the string without them.
pub(crate) struct Split {
    pub(crate) rest: String,
    pub(crate) mode: Mode,
    pub(crate) root_file: Option<String>,
}

/// Takes `sslmode` and `sslrootcert` out of a URL (`postgres://…?sslmode=…`) or a key=value
/// string.
pub(crate) fn split(conn: &str) -> Result<Split, PgError> {
    let mut split = Split {
        rest: String::new(),
        mode: Mode::Prefer,
        root_file: None,
    };
    let mut take = |key: &str, value: &str| -> Result<bool, PgError> {
        match key {
            "sslmode" => split.mode = Mode::parse(value)?,
            "sslrootcert" => split.root_file = Some(value.to_string()),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        let (base, query) = conn.split_once('?').unwrap_or((conn, ""));
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !take(&percent_decoded(key)?, &percent_decoded(value)?)? {
                kept.push(pair);
            }
        }
        if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        let mut kept = Vec::new();
        for (key, value, text) in key_values(conn)? {
            if !take(&key, &value)? {
                kept.push(text);
            }
        }
        kept.join(" ")
    };
    split.rest = rest;
    Ok(split)
}

/// `%XX` escapes of a URL's query decoded.
fn percent_decoded(s: &str) -> Result<String, PgError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| invalid(format!("a bad %-escape in {s:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid(format!("{s:?} is not UTF-8 once decoded")))
}

/// The `key = value` pairs of a libpq string: each key, its value unquoted, and its text.
fn key_values(conn: &str) -> Result<Vec<(String, String, String)>, PgError> {
    let mut pairs = Vec::new();
    let mut chars = conn.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else {
            return Ok(pairs);
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|(_, c)| *c == '=').is_none() {
            return Err(invalid(format!(
                "{key:?} has no value in the connection string"
            )));
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match chars.next() {
                    Some((_, '\\')) => value.extend(chars.next().map(|(_, c)| c)),
                    Some((_, '\'')) => break,
                    Some((_, c)) => value.push(c),
                    None => return Err(invalid(format!("{key:?}'s quoted value never ends"))),
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                value.push(c);
            }
        }
        let end = chars.peek().map_or(conn.len(), |&(i, _)| i);
        pairs.push((key, value, conn[start..end].trim_end().to_string()));
    }
}

/// The connector for `mode`, trusting `roots_pem` (PEM CA certificates) or, without them,
/// the operating system's roots.
pub(crate) fn connector(
    mode: Mode,
    roots_pem: Option<&[u8]>,
) -> Result<MakeRustlsConnect, PgError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        Mode::Disable | Mode::Prefer | Mode::Require => Arc::new(Unverified {
            algorithms: provider.signature_verification_algorithms,
        }),
        Mode::VerifyCa | Mode::VerifyFull => {
            let roots = Arc::new(roots(roots_pem)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                .build()
                .map_err(|e| invalid(format!("TLS roots: {e}")))?;
            if mode == Mode::VerifyCa {
                Arc::new(AnyName(webpki))
            } else {
                webpki
            }
        }
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS versions: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The trusted roots: the PEM certificates given, else the operating system's.
fn roots(pem: Option<&[u8]>) -> Result<RootCertStore, PgError> {
    let mut store = RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = match pem {
        Some(pem) => CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(format!("TLS root certificates: {e}")))?,
        None => rustls_native_certs::load_native_certs().certs,
    };
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(invalid(
            "no trusted root certificate to verify the server with".into(),
        ));
    }
    Ok(store)
}

/// `prefer` and `require`: encrypted, the server not authenticated (libpq's meaning). The
/// handshake's signatures are still checked.
#[derive(Debug)]
struct Unverified {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain is verified, the host name is not. rustls checks the name after
/// the chain, so a wrong name is the only error passed over.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_taken_out_of_urls_and_key_value_strings() {
        let s = split("postgres://u@h:5/db?sslmode=verify-full&connect_timeout=5").unwrap();
        assert_eq!(s.rest, "postgres://u@h:5/db?connect_timeout=5");
        assert_eq!(s.mode, Mode::VerifyFull);
        let s = split("postgresql://h/db?sslrootcert=%2Ftmp%2Fca.pem&sslmode=verify-ca").unwrap();
        assert_eq!(s.rest, "postgresql://h/db");
        assert_eq!(s.root_file.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(s.mode, Mode::VerifyCa);
        let s = split("postgres://h/db").unwrap();
        assert_eq!((s.rest.as_str(), s.mode), ("postgres://h/db", Mode::Prefer));
        let s = split("host=h sslmode = require  user='a b\\'c' sslrootcert='/x y'").unwrap();
        assert_eq!(s.rest, "host=h user='a b\\'c'");
        assert_eq!(s.mode, Mode::Require);
        assert_eq!(s.root_file.as_deref(), Some("/x y"));
        assert!(split("host=h sslmode=sometimes").is_err());
        assert!(split("host=h user='unterminated").is_err());
    }
}
