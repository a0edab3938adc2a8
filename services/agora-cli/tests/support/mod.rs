//! Helpers shared by the `agora` command's test binaries.

use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A path in the temporary directory that no other test, or test process, uses.
pub fn unique_temp_path(prefix: &str, label: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "{prefix}-{}-{}-{label}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    std::env::temp_dir().join(name)
}

/// Standard output of a run that must have succeeded with nothing on standard error (which is
/// not a terminal in tests, so no progress bar either).
pub fn successful_stdout(output: &Output) -> &[u8] {
    assert!(
        output.status.success(),
        "agora failed with {:?}: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.stderr.is_empty(),
        "unexpected stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    &output.stdout
}
