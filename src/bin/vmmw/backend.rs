//! The `--backend`/`--device` options every subcommand shares, and how they
//! resolve against `VMMW_BACKEND`.

use vmmweights::driver::{self, Opened};
use vmmweights::{BackendChoice, Error, Result};

use crate::exit::{CliError, CliResult};

/// Which backend and device to run on.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// host, cuda or auto [default: $VMMW_BACKEND, else auto]
    #[arg(long, value_parser = ["host", "cuda", "auto"])]
    pub backend: Option<String>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub device: i32,
}

impl BackendArgs {
    /// The requested choice and where it came from ("--backend cuda", "VMMW_BACKEND=host", "VMMW_BACKEND unset").
    pub fn choice(&self) -> Result<(BackendChoice, String)> {
        if let Some(b) = &self.backend {
            return Ok((BackendChoice::parse(b)?, format!("--backend {b}")));
        }
        match std::env::var("VMMW_BACKEND") {
            Ok(v) => match BackendChoice::parse(&v) {
                Ok(c) => Ok((c, format!("VMMW_BACKEND={v}"))),
                Err(_) => Err(Error::InvalidArgument(format!(
                    "VMMW_BACKEND=`{}`: expected host, cuda or auto (or unset it)",
                    crate::output::escape_name(&v)
                ))),
            },
            Err(std::env::VarError::NotPresent) => {
                Ok((BackendChoice::Auto, "VMMW_BACKEND unset".to_owned()))
            }
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::InvalidArgument(
                "VMMW_BACKEND is not valid UTF-8: expected host, cuda or auto".to_owned(),
            )),
        }
    }

    /// Check the choice without opening anything (before any device work).
    pub fn check(&self) -> CliResult<()> {
        self.choice()
            .map(|_| ())
            .map_err(|e| CliError::bad_input(strip_kind(&e)))
    }

    /// Open the driver; the reason says which backend was chosen and why.
    pub fn open(&self) -> Result<Opened> {
        let (choice, source) = self.choice()?;
        let mut opened = driver::open(choice, self.device)?;
        opened.reason = format!("{source}: {}", opened.reason);
        Ok(opened)
    }
}

/// The message of an `InvalidArgument` without its "invalid argument: " prefix.
pub fn strip_kind(e: &Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
}
