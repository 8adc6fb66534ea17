//! Scratch directories and files for a test, removed when their guard
//! drops: at the end of the test, and when it panics.

use std::path::PathBuf;

pub use tempfile::TempDir;

/// A fresh directory `sqsf-{what}-XXXXXX` under the system's temporary
/// directory.
pub fn temp_dir(what: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("sqsf-{what}-"))
        .tempdir()
        .expect("make a temporary directory")
}

/// A fresh directory holding one file `name` with `contents`: its guard,
/// and the file's path.
pub fn temp_file(name: &str, contents: &str) -> (TempDir, PathBuf) {
    let dir = temp_dir("file");
    let path = dir.path().join(name);
    std::fs::write(&path, contents).expect("write a temporary file");
    (dir, path)
}

/// A TOML config of `tables` (name, TOML lines; one receiver each) in a
/// fresh file: its directory's guard, and its path.
pub fn tables_toml(tables: &[(&str, String)]) -> (TempDir, String) {
    let text: String = tables
        .iter()
        .map(|(t, lines)| format!("[tables.{t}]\nreceivers = 1\n{lines}"))
        .collect();
    let (dir, path) = temp_file("tables.toml", &text);
    (dir, path.to_str().expect("a UTF-8 temp path").to_string())
}
