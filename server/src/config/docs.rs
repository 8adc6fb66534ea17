//! What the definitions say beside the flags: each setting's TOML key and
//! default, shown in `--help` and in the settings tables of
//! docs/configuration.md. The tables (flag, variable, TOML key, default,
//! and the doc comment as the meaning, one per help heading) sit between
//! `<!-- settings: HEADING -->` and `<!-- end settings -->`. In the table
//! of "Per table", each key of [`super::TableToml`] but the plan
//! parameters has its row made from its entry (see
//! [`table_keys!`](super::table_key::table_toml)), in place; a new key's
//! row goes at the end. A test fails when the file differs, and
//! `SQSF_BLESS=1` rewrites them in place.

use clap::Arg;
#[cfg(test)]
use clap::{Args, Command, CommandFactory};

use super::Settings;
use super::plan::LimitSettings;
#[cfg(test)]
use super::plan::PlanParams;
use super::sql::SqlSettings;
#[cfg(test)]
use super::{Cli, SERVER, TableToml};

/// docs/configuration.md of the checkout under test: the manifest
/// directory cargo gives the test at run time (a test binary reused from a
/// target directory another checkout built names that one at compile time).
#[cfg(test)]
fn doc_path() -> std::path::PathBuf {
    manifest_dir().join("../docs/configuration.md")
}

/// The server crate's directory in the checkout under test.
#[cfg(test)]
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        std::path::PathBuf::from,
    )
}
#[cfg(test)]
const END: &str = "<!-- end settings -->";

/// The ids of a group's flags.
#[cfg(test)]
fn ids(augment: fn(Command) -> Command) -> Vec<String> {
    augment(Command::new("group"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect()
}

/// Where the setting of flag `id` is in the TOML file; `None` for the
/// flags of the command line only.
#[cfg(test)]
fn toml_key(id: &str) -> Option<String> {
    if ids(SqlSettings::augment_args).iter().any(|i| i == id) {
        Some(format!("sql.{id}"))
    } else if ids(LimitSettings::augment_args).iter().any(|i| i == id) {
        Some(format!("limits.{id}"))
    } else if ids(Settings::augment_args).iter().any(|i| i == id) {
        Some(id.to_string())
    } else if id == "tables" {
        Some("[tables.NAME] queue_url".into())
    } else {
        None
    }
}

/// The default of a flag's setting, as the docs show it.
fn default_shown(arg: &Arg) -> String {
    let id = arg.get_id().as_str();
    let defaults = arg.get_default_values();
    Settings::default_shown(id)
        .or_else(|| SqlSettings::default_shown(id))
        .or_else(|| LimitSettings::default_shown(id))
        .or_else(|| (!defaults.is_empty()).then(|| format!("`{}`", defaults[0].to_string_lossy())))
        .unwrap_or_else(|| {
            if arg.get_action().takes_values() {
                "none"
            } else {
                ""
            }
            .into()
        })
}

/// `arg` with its setting's default at the end of its help, as clap shows
/// the defaults it knows (the settings' flags have none: an unset flag must
/// leave the file's value).
pub(super) fn with_default(arg: Arg) -> Arg {
    if !arg.get_default_values().is_empty() || !arg.get_action().takes_values() {
        return arg;
    }
    let Some(suffix) = default_suffix(&arg) else {
        return arg;
    };
    let long = arg.get_long_help().map(|h| format!("{h}{suffix}"));
    let short = arg.get_help().map(|h| format!("{h}{suffix}"));
    let arg = match long {
        Some(long) => arg.long_help(long),
        None => arg,
    };
    match short {
        Some(short) => arg.help(short),
        None => arg,
    }
}

/// ` [default: VALUE]`, the docs' default without its markup; `None` for
/// a setting that is unset by default.
fn default_suffix(arg: &Arg) -> Option<String> {
    let shown = default_shown(arg);
    let value = shown.split(" (`DEFAULT_").next().unwrap_or_default();
    let value = value.replace('`', "");
    (value != "none" && !value.is_empty()).then(|| format!(" [default: {value}]"))
}

#[cfg(test)]
fn flag(arg: &Arg) -> String {
    let long = arg.get_long().expect("every setting has a long flag");
    if !arg.get_action().takes_values() {
        return format!("`--{long}`");
    }
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_string())
        .collect();
    let value = if values.is_empty() {
        arg.get_value_names()
            .map_or_else(|| arg.get_id().to_string(), |v| v.join(" "))
    } else {
        values.join("|")
    };
    format!("`--{long} {value}`")
}

/// The doc comment, without the default `--help` shows after it.
#[cfg(test)]
fn meaning(arg: &Arg) -> String {
    let text = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|t| t.to_string())
        .unwrap_or_default();
    let suffix = default_suffix(arg).unwrap_or_default();
    let text = text.strip_suffix(&suffix).unwrap_or(&text);
    let mut text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if !text.ends_with('.') {
        text.push('.');
    }
    text
}

/// The rows of one heading's table.
#[cfg(test)]
fn table(heading: &str) -> String {
    let mut out = String::from(
        "| flag | environment | TOML key | default | meaning |\n| --- | --- | --- | --- | --- |\n",
    );
    let command = Cli::command();
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        if arg.get_long().is_none() || arg.get_help_heading().unwrap_or(SERVER) != heading {
            continue;
        }
        let code = |s: String| if s.is_empty() { s } else { format!("`{s}`") };
        let env = arg
            .get_env()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_default();
        let env = match arg.get_value_delimiter() {
            Some(',') => format!("`{env}` (comma-separated)"),
            _ => code(env),
        };
        let cells = [
            flag(arg),
            env,
            code(toml_key(arg.get_id().as_str()).unwrap_or_default()),
            default_shown(arg),
            meaning(arg),
        ];
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
        out += &format!("| {} |\n", cells.join(" | "));
    }
    out
}

/// Every help heading, in the order of the flags.
#[cfg(test)]
fn headings() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for arg in Cli::command().get_arguments() {
        let h = arg.get_help_heading().unwrap_or(SERVER).to_string();
        if arg.get_long().is_some() && !out.contains(&h) {
            out.push(h);
        }
    }
    out
}

/// `doc` with each marked table rendered anew.
#[cfg(test)]
fn rendered(doc: &str) -> String {
    let mut out = String::new();
    let mut rest = doc;
    while let Some(start) = rest.find("<!-- settings: ") {
        let open_end = start + rest[start..].find("-->").expect("marker closes") + 3;
        let heading = rest[start + 15..open_end - 3].trim();
        let close = open_end + rest[open_end..].find(END).expect("a table ends");
        out += &rest[..open_end];
        out += "\n";
        out += &table(heading);
        rest = &rest[close..];
    }
    with_table_keys(&(out + rest))
}

/// The heading of the section whose table holds the keys of `[tables.NAME]`.
#[cfg(test)]
const PER_TABLE: &str = "### Per table";

/// `doc` with the rows of the per-table table made anew from the
/// entries of the table keys: each in its place, a new key's at the
/// end; a row of a key that is neither an entry nor a plan parameter
/// goes.
#[cfg(test)]
fn with_table_keys(doc: &str) -> String {
    let section = doc.find(PER_TABLE).expect("a per-table section");
    let start = section + doc[section..].find("\n|").expect("a per-table table") + 1;
    let end = doc[start..]
        .find("\n\n")
        .map_or(doc.len(), |at| start + at + 1);
    let keys = TableToml::doc_rows();
    let plan: Vec<&str> = PlanParams::DEFAULTS.fields().map(|(f, _)| f).into();
    let mut rows: Vec<String> = Vec::new();
    for (i, line) in doc[start..end].lines().enumerate() {
        let key = line.split('`').nth(1).unwrap_or_default();
        let made = keys.iter().find(|(k, _)| *k == key);
        match made {
            _ if i < 2 => rows.push(line.to_string()),
            Some((_, row)) => rows.push(row.clone()),
            None if plan.contains(&key) => rows.push(line.to_string()),
            None => {}
        }
    }
    for (key, row) in &keys {
        if !rows.iter().any(|r| r.starts_with(&format!("| `{key}` |"))) {
            rows.push(row.clone());
        }
    }
    format!("{}{}\n{}", &doc[..start], rows.join("\n"), &doc[end..])
}

#[cfg(test)]
#[test]
fn the_docs_tables_are_the_definitions() {
    let doc = std::fs::read_to_string(doc_path()).unwrap();
    for heading in headings() {
        let marker = format!("<!-- settings: {heading} -->");
        assert!(
            doc.contains(&marker),
            "docs/configuration.md has no {marker}"
        );
    }
    let marked = doc.matches("<!-- settings: ").count();
    assert_eq!(
        marked,
        headings().len(),
        "a table for a heading no flag has"
    );
    let new = rendered(&doc);
    if std::env::var_os("SQSF_BLESS").is_some() {
        std::fs::write(doc_path(), &new).unwrap();
    } else {
        assert!(
            new == doc,
            "docs/configuration.md's settings tables differ from the definitions; \
             run `SQSF_BLESS=1 cargo test -p sqs-flight-server --lib config::docs` and review the diff"
        );
    }
}

#[cfg(test)]
#[test]
fn a_new_table_key_gets_a_row_and_a_gone_one_loses_its_own() {
    let doc = with_table_keys(&std::fs::read_to_string(doc_path()).unwrap());
    let (_, rtt_row) = TableToml::doc_rows()
        .into_iter()
        .find(|(key, _)| *key == "rtt_ms")
        .unwrap();
    let edited = doc.replace(&format!("{rtt_row}\n"), "").replace(
        "| `payload` |",
        "| `gone` | none | Was a key. |\n| `payload` |",
    );
    assert!(!edited.contains(&rtt_row) && edited.contains("`gone`"));
    let new = with_table_keys(&edited);
    assert!(!new.contains("`gone`"), "{new}");
    let section = &new[new.find(PER_TABLE).unwrap()..];
    let rows = section.split("\n\n").find(|part| part.starts_with('|'));
    let last_row = rows.and_then(|rows| rows.lines().last());
    assert_eq!(last_row, Some(rtt_row.as_str()), "{new}");
}

#[cfg(test)]
#[test]
fn the_docs_name_each_plan_default() {
    let doc = std::fs::read_to_string(doc_path()).unwrap();
    let tables = &doc[doc.find("### Per table").expect("a per-table section")..];
    for (field, value) in PlanParams::DEFAULTS.fields() {
        let row = format!("| `{field}` | `{value}`");
        assert!(tables.contains(&row), "docs/configuration.md: no row {row}");
    }
}

/// Names in backticks in docs/*.md that look like constants and are not
/// the code's: gRPC status codes, the environment of other programs, the
/// operating system's.
#[cfg(test)]
const NOT_CODE_CONSTANTS: &[&str] = &[
    "DEADLINE_EXCEEDED",
    "FAILED_PRECONDITION",
    "INVALID_ARGUMENT",
    "OUT_OF_RANGE",
    "RESOURCE_EXHAUSTED",
    "AWS_ACCESS_KEY_ID",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL_STS",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_SECRET_ACCESS_KEY",
    "DB_DRIVER_IP",
    "PYSPARK_PYTHON",
    "RUST_LOG",
    "PR_SET_PDEATHSIG",
    "RLIMIT_DATA",
];

/// The `UPPER_SNAKE` names in backticks in `text` (two words at least).
#[cfg(test)]
fn constant_names(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            w.contains('_')
                && w.starts_with(|c: char| c.is_ascii_uppercase())
                && !w.ends_with('_')
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect()
}

/// The text of every `.rs` and `.py` file under `dir`.
#[cfg(test)]
fn sources(dir: &std::path::Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs" || e == "py") {
            *out += &std::fs::read_to_string(&path).unwrap();
            out.push('\n');
        }
    }
}

/// Whether `source` defines the constant `name`: `const NAME`, `static
/// NAME`, an entry's `default: NAME =` / `limit: NAME =` of the plan
/// parameters' list, or a Python module's `NAME = `.
#[cfg(test)]
fn defines(source: &str, name: &str) -> bool {
    ["const ", "static ", "default: ", "limit: ", "\n"]
        .iter()
        .any(|before| {
            source
                .match_indices(&format!("{before}{name}"))
                .any(|(at, m)| {
                    let rest = &source[at + m.len()..];
                    if *before == "\n" || before.ends_with(": ") {
                        rest.starts_with(" =")
                    } else {
                        rest.starts_with(':')
                    }
                })
        })
}

#[cfg(test)]
#[test]
fn the_docs_name_only_constants_that_exist() {
    let root = manifest_dir().join("..");
    let mut code = String::new();
    for dir in [
        "server/src",
        "client/src",
        "schemas/src",
        "client/python/src",
    ] {
        sources(&root.join(dir), &mut code);
    }
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for name in constant_names(&text) {
            let not_code = name.starts_with("SQSF_") || NOT_CODE_CONSTANTS.contains(&name);
            if !not_code && !defines(&code, name) {
                missing.push(format!("{}: `{name}`", path.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs name constants the code does not define (renamed or gone? \
         a name that is not the code's goes in NOT_CODE_CONSTANTS): {missing:#?}"
    );
}
