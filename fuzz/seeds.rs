//! Writes the seed corpora of both fuzz targets, so that a short run already fuzzes what
//! matters: `cargo run --manifest-path fuzz/Cargo.toml --bin seeds`. Deterministic: run again,
//! the same files.
//!
//! - `corpus/crash_recovery`: workloads of 8 to 64 keys, with batches of several callers and
//!   inbox polls, crashed at syncs spread over the run, half of them with the log altered
//!   afterwards (the layout is at the top of fuzz_targets/crash_recovery.rs).
//! - `corpus/decode`: a valid sample of every decoder's input (`testing::decode_seeds`), and a
//!   patch over a valid file and over a valid log.
//!
//! `seeds bench DIR` writes instead the inputs `crash_recovery`'s speed is measured on
//! (docs/design.md §12): 300 workloads of 16–17 keys, laid out as the seeds, half of them with
//! the log altered. Replay them with the built target:
//! `fuzz/target/x86_64-unknown-linux-gnu/release/crash_recovery -runs=3000 DIR`.

use std::fs;
use std::path::Path;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, dir] = args.as_slice()
        && mode == "bench"
    {
        return bench(Path::new(dir));
    }
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let crash = corpus.join("crash_recovery");
    fs::create_dir_all(&crash)?;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for i in 0..48usize {
        let keys = [8, 12, 16, 24, 32, 48, 64][i % 7];
        let mut input = head(&mut rng, i);
        input.extend(workload(&mut rng, keys));
        fs::write(crash.join(format!("seed-{i:02}-{keys}keys")), input)?;
    }
    let decode = corpus.join("decode");
    fs::create_dir_all(&decode)?;
    for (name, input) in idemdb::testing::decode_seeds() {
        fs::write(decode.join(name), input)?;
    }
    // A patch (64-byte unit, 4 bytes xored) over the valid file, and over the valid log.
    fs::write(decode.join("file-patch"), [9, 3, 0, 0xff, 0, 0, 1])?;
    fs::write(decode.join("log-patch"), [13, 17, 0, 0, 0, 0x10, 0])?;
    Ok(())
}

/// 300 inputs of 16–17 keys each, into `dir`.
fn bench(dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut written = 0;
    while written < 300 {
        let (steps, keys) = workload_of(&mut rng, 16);
        let mut input = head(&mut rng, written);
        if keys > 17 {
            continue;
        }
        input.extend(steps);
        fs::write(dir.join(format!("bench-{written:03}")), input)?;
        written += 1;
    }
    Ok(())
}

/// The 6 bytes before the steps of the `i`-th input: a crash at a sync spread over the run,
/// the pending writes dropped, kept or torn in turn, the log altered for every other input.
fn head(rng: &mut Rng, i: usize) -> Vec<u8> {
    let crash_sync = rng.below(160) as u16;
    let alteration = if i.is_multiple_of(2) {
        rng.below(128)
    } else {
        128 + rng.below(128)
    } as u8;
    let param = rng.below(65_536) as u16;
    let mut input = crash_sync.to_le_bytes().to_vec();
    input.extend([(i % 3) as u8, alteration]);
    input.extend(param.to_le_bytes());
    input
}

/// Steps of at least `keys` keys: scripts, batches, polls and now and then a reopen.
fn workload(rng: &mut Rng, keys: usize) -> Vec<u8> {
    workload_of(rng, keys).0
}

/// [`workload`], and how many keys it holds.
fn workload_of(rng: &mut Rng, keys: usize) -> (Vec<u8>, usize) {
    let (mut out, mut n) = (Vec::new(), 0);
    while n < keys {
        match rng.below(100) {
            0..=54 => {
                out.push(rng.below(160) as u8);
                n += 1;
            }
            // A batch or an inbox poll, alternately.
            55..=94 => {
                let first = if out.len() % 2 == 0 { 160 } else { 200 };
                let k = rng.below(15) as u8;
                out.extend([first + rng.below(40) as u8, k, rng.below(256) as u8]);
                n += 2 + usize::from(k);
            }
            _ => out.push(240 + rng.below(16) as u8),
        }
    }
    (out, n)
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
