//! The command line's `--name value` flags. Each flag is given once; an unknown one is an
//! error rather than ignored, so that a typo cannot silently fall back to a default.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::BoxError;

/// The flags after the subcommand.
#[derive(Debug)]
pub struct Flags(BTreeMap<String, String>);

impl Flags {
    /// Reads `--name value` pairs.
    pub fn parse(mut argv: impl Iterator<Item = String>) -> Result<Flags, BoxError> {
        let mut flags = BTreeMap::new();
        while let Some(arg) = argv.next() {
            let name = arg
                .strip_prefix("--")
                .ok_or_else(|| format!("expected a --flag, got {arg:?}"))?;
            let value = argv
                .next()
                .ok_or_else(|| format!("--{name} needs a value"))?;
            if flags.insert(name.to_string(), value).is_some() {
                return Err(format!("--{name} given twice").into());
            }
        }
        Ok(Flags(flags))
    }

    /// Refuses any flag not in `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), BoxError> {
        match self.0.keys().find(|k| !known.contains(&k.as_str())) {
            Some(unknown) => Err(format!("unknown flag --{unknown}").into()),
            None => Ok(()),
        }
    }

    /// A required flag's value.
    pub fn get(&self, name: &str) -> Result<&str, BoxError> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("--{name} is required").into())
    }

    /// A required flag's value, as a path.
    pub fn path(&self, name: &str) -> Result<PathBuf, BoxError> {
        self.get(name).map(PathBuf::from)
    }
}
