//! The `--backend`/`--device` options every subcommand shares, and how they
//! resolve against `VMMW_BACKEND`.

use vmmweights::driver::{self, Opened};
use vmmweights::{BackendChoice, Result};

/// Which backend and device to run on.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// host, cuda or auto [default: $VMMW_BACKEND, else auto]
    #[arg(long)]
    pub backend: Option<String>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
}

impl BackendArgs {
    /// The requested choice and where it came from ("--backend cuda", "VMMW_BACKEND=host", "VMMW_BACKEND unset").
    pub fn choice(&self) -> Result<(BackendChoice, String)> {
        if let Some(b) = &self.backend {
            return Ok((BackendChoice::parse(b)?, format!("--backend {b}")));
        }
        match std::env::var("VMMW_BACKEND") {
            Ok(v) => Ok((BackendChoice::from_env()?, format!("VMMW_BACKEND={v}"))),
            Err(_) => Ok((BackendChoice::Auto, "VMMW_BACKEND unset".to_owned())),
        }
    }

    /// Open the driver; the reason says which backend was chosen and why.
    pub fn open(&self) -> Result<Opened> {
        let (choice, source) = self.choice()?;
        let mut opened = driver::open(choice, self.device)?;
        opened.reason = format!("{source}: {}", opened.reason);
        Ok(opened)
    }
}
