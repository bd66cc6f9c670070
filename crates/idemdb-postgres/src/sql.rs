//! SQL shared by the store's statements: the store's clock, and how a statement finds a key.

/// The store's time, ms since the epoch, as the CTE `clock (now_ms)`: the server's clock, read
/// once by the statement that judges or writes with it (a CTE with a volatile function is
/// evaluated once). No instance's clock enters a record. `idemdb_meta.frozen_now_ms` is NULL
/// except in tests, which set it to move time by hand (`idemdb_testkit::postgres::ServerClock`).
macro_rules! clock {
    () => {
        "clock AS (SELECT COALESCE(m.frozen_now_ms, \
         floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now_ms \
         FROM idemdb_meta m WHERE m.id = 1)"
    };
}
pub(crate) use clock;

/// The fixed-size hash a record is indexed by (SHA-256 of its key's three parts, each
/// length-prefixed but the last, so that no two keys share the bytes hashed): the generated
/// column `key_hash`, and the value a statement looks it up with.
macro_rules! key_hash {
    ($operation:literal, $principal:literal, $key:literal) => {
        concat!(
            "sha256(int4send(length(",
            $operation,
            ")) || ",
            $operation,
            " || int4send(length(",
            $principal,
            ")) || ",
            $principal,
            " || ",
            $key,
            ")"
        )
    };
}
pub(crate) use key_hash;

/// The rows of the key in parameters `$1` (operation), `$2` (principal), `$3` (key): found
/// through the hash's index, the full key compared.
macro_rules! key_is_params {
    () => {
        concat!(
            "key_hash = ",
            $crate::sql::key_hash!("$1::bytea", "$2::bytea", "$3::bytea"),
            " AND operation = $1 AND principal = $2 AND key = $3"
        )
    };
}
pub(crate) use key_is_params;

/// The largest lease or TTL a statement adds to the clock, in ms (about 73 million years):
/// `now + lease + ttl` stays within `bigint`.
pub(crate) const MAX_SPAN_MS: i64 = 1 << 61;

/// `ms` as a statement's span parameter.
pub(crate) fn span(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(MAX_SPAN_MS).min(MAX_SPAN_MS)
}
