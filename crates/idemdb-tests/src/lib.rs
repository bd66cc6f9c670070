//! idemdb's integration tests live in `tests/`; this library only holds the doctests of the
//! README and docs/choosing.md, which use crates (axum, tokio) a user's first example should
//! not have to build.

/// docs/choosing.md's examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../../../docs/choosing.md")]
#[cfg(doctest)]
pub struct ChoosingDoctests;

/// The README's examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
