//! Scratch directories for unit tests, removed when their guard drops: at
//! the end of the test, and when it panics.

/// A fresh directory `sqsf-{what}-XXXXXX` under the system's temporary
/// directory; keep the guard for as long as the directory is used.
pub(crate) fn dir(what: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("sqsf-{what}-"))
        .tempdir()
        .expect("make a temporary directory")
}
