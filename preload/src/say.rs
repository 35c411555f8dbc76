//! The interposer's few lines on stderr: why it passes everything through,
//! why it serves no control socket. Each is said once; nothing is printed
//! on the allocation path.

use std::collections::HashSet;
use std::io::Write;
use std::sync::Mutex;

/// Write `line` to stderr, prefixed, unless the same line was said before.
pub fn once(line: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(line.to_owned())
    {
        let _ = writeln!(std::io::stderr(), "vmmw preload: {line}");
    }
}
