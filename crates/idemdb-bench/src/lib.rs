//! idemdb's benchmarks live in `benches/` (`cargo bench -p idemdb-bench`); see docs/benchmarks.md.
