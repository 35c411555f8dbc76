//! How `vmmw` ends: exit code 2 for bad input (options, paths, checkpoint
//! files, mapping rules), 1 for a failure of the machine or driver (no GPU,
//! out of memory, a driver call failing, a verification mismatch). clap's own
//! usage errors exit 2 as well, and a panic (a bug) exits 1.

use std::fmt;
use std::io::ErrorKind;

use vmmweights::Error;

/// The exit code for input the user can fix.
pub const BAD_INPUT: u8 = 2;
/// The exit code for a failure of the machine, the driver or the library.
pub const FAILURE: u8 = 1;

/// The text `vmmw --help` ends with.
pub const HELP_EXIT_CODES: &str = "Exit codes:
  0  success (also when stdout's reader goes away early, as in `vmmw plan ... | head -1`)
  1  the machine or driver failed (no usable GPU, out of memory, a driver call failed, a check failed)
  2  bad input (an option, a path, a checkpoint file, mapping rules); the message names which

Sizes are written as 4096, 64K, 64M, 64MiB, 1G, 1GiB, 1.5G or 2GB (1G = 1GiB = 2^30; 1GB = 10^9).
With --json, stdout carries exactly one JSON document (docs/CLI.md describes each); other lines go to stderr.";

/// Why a command failed, and which exit code that gives.
#[derive(Debug)]
pub struct CliError {
    /// [`BAD_INPUT`] or [`FAILURE`].
    pub code: u8,
    /// What went wrong, for a person.
    pub message: String,
}

impl CliError {
    /// Input the user can fix.
    pub fn bad_input(message: impl Into<String>) -> CliError {
        CliError {
            code: BAD_INPUT,
            message: message.into(),
        }
    }

    /// A failure of the machine, driver or library.
    pub fn failure(message: impl Into<String>) -> CliError {
        CliError {
            code: FAILURE,
            message: message.into(),
        }
    }

    /// "bad_input" or "failure", as `--json` reports it.
    pub fn kind(&self) -> &'static str {
        if self.code == BAD_INPUT {
            "bad_input"
        } else {
            "failure"
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Error> for CliError {
    fn from(e: Error) -> CliError {
        let bad_input = match &e {
            Error::InvalidArgument(_)
            | Error::Checkpoint { .. }
            | Error::Plan(_)
            | Error::UnknownTag(_) => true,
            // A path the user named that is not there or not readable; other
            // I/O errors (EIO mid-read) are the machine's.
            Error::Io { source, .. } => matches!(
                source.kind(),
                ErrorKind::NotFound
                    | ErrorKind::PermissionDenied
                    | ErrorKind::IsADirectory
                    | ErrorKind::NotADirectory
                    | ErrorKind::InvalidInput
                    | ErrorKind::InvalidData
                    | ErrorKind::UnexpectedEof
            ),
            _ => false,
        };
        let message = crate::escape::escape_controls(&e.to_string());
        if bad_input {
            CliError::bad_input(message)
        } else {
            CliError::failure(message)
        }
    }
}

/// What a command returns.
pub type CliResult<T> = std::result::Result<T, CliError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_documented_codes() {
        let io = |k| Error::Io {
            path: "x".into(),
            source: std::io::Error::from(k),
        };
        assert_eq!(CliError::from(io(ErrorKind::NotFound)).code, BAD_INPUT);
        assert_eq!(CliError::from(io(ErrorKind::Other)).code, FAILURE);
        assert_eq!(
            CliError::from(Error::InvalidArgument("x".into())).code,
            BAD_INPUT
        );
        assert_eq!(
            CliError::from(Error::DriverUnavailable("no GPU".into())).code,
            FAILURE
        );
        assert_eq!(
            CliError::from(Error::InvalidState("mismatch".into())).code,
            FAILURE
        );
    }
}
