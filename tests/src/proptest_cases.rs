//! How many cases a property test runs: the one definition the property
//! tests of every crate share. The schemas' and the server's tests, which
//! cannot depend on this crate (it depends on theirs), include this file by
//! its path (`#[path = "../../tests/src/proptest_cases.rs"] mod
//! proptest_cases;`), so it uses nothing but proptest.

use proptest::test_runner::Config as ProptestConfig;

/// Cases per property: `PROPTEST_CASES` when set, else `default`; no
/// failure persistence files (`PROPTEST_RNG_SEED=N` replays a run).
pub fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
