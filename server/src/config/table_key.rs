//! How one definition makes a key of `[tables.NAME]`: the list
//! `table_keys!` (in `table.rs`) gives each key once (doc comment, TOML
//! type, default, bounds, and where a [`super::TableConfig`] holds its
//! value), and [`table_toml!`] makes from it the field of
//! [`super::TableToml`], its bounds check, its line of `--print-config`
//! ([`super::TableToml::of`]) and its row of docs/configuration.md. What
//! a key's value does (a backend, a payload, a visibility timeout) is the
//! code that reads the field.
//!
//! The plan parameters, which a table also sets, come from `plan_params!`.

/// Makes [`super::TableToml`] from the keys of the list (each entry,
/// `/// doc  name: Raw [= DEFAULT] [=> "shown"], [min MIN [max MAX]
/// ["suffix"],] of |t| VALUE;`) and the names of the plan parameters,
/// which take the place of `@plan_parameters;` in it:
///
/// - the field `name: Option<Raw>`, the TOML key, documented by the doc;
/// - `VALUE`, the key's value in a [`super::TableConfig`] as the file
///   would set it (`None` where unset): its `--print-config` line, and
///   what `MIN` and `MAX` bound (the error names `tables.NAME.name` and
///   says `must be MIN to MAX` or `must be at least MIN`, then the
///   suffix), checked by `TableToml::check_bounds`;
/// - its row of docs/configuration.md: the key, the default (`shown`,
///   else `DEFAULT` as the settings show theirs, else `none`), the doc.
macro_rules! table_toml {
    (
        { $($plan:ident)* }
        $(
            $(#[doc = $doc:literal])*
            $name:ident: $raw:ty $(= $default:expr)? $(=> $shown:literal)?,
                $(min $min:tt $(max $max:tt)? $($suffix:literal)?,)?
                of $of:expr;
        )*
        @plan_parameters;
        $(
            $(#[doc = $adoc:literal])*
            $aname:ident: $araw:ty $(= $adefault:expr)? $(=> $ashown:literal)?,
                $(min $amin:tt $(max $amax:tt)? $($asuffix:literal)?,)?
                of $aof:expr;
        )*
    ) => {
        /// Per-table settings in the TOML file (`[tables.NAME]`), and as
        /// `--print-config` prints a table; absent fields take the defaults.
        #[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct TableToml {
            $(
                $(#[doc = $doc])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<$raw>,
            )*
            $(
                /// A plan parameter (its default here, [`plan`](super::plan)), as
                /// in a plan command.
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $plan: Option<u64>,
            )*
            $(
                $(#[doc = $adoc])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $aname: Option<$araw>,
            )*
        }

        $crate::config::table_key::table_toml! {
            @impls
            { $($plan)* }
            $(
                $(#[doc = $doc])*
                $name: $raw $(= $default)? $(=> $shown)?,
                    $(min $min $(max $max)? $($suffix)?,)? of $of;
            )*
            $(
                $(#[doc = $adoc])*
                $aname: $araw $(= $adefault)? $(=> $ashown)?,
                    $(min $amin $(max $amax)? $($asuffix)?,)? of $aof;
            )*
        }
    };
    (
        @impls
        { $($plan:ident)* }
        $(
            $(#[doc = $doc:literal])*
            $name:ident: $raw:ty $(= $default:expr)? $(=> $shown:literal)?,
                $(min $min:tt $(max $max:tt)? $($suffix:literal)?,)?
                of $of:expr;
        )*
    ) => {
        impl TableToml {
            /// The plan parameters set here.
            fn plan(&self) -> PlanOverrides {
                PlanOverrides { $( $plan: self.$plan, )* }
            }

            /// `table` as the file would set it: its plan parameters all
            /// given, every other key where it has one.
            pub fn of(table: &TableConfig) -> Self {
                Self {
                    $( $name: {
                        let of: fn(&TableConfig) -> Option<$raw> = $of;
                        of(table)
                    }, )*
                    $( $plan: Some(table.defaults.$plan), )*
                }
            }

            /// Each key of `table` within the bounds its entry declares;
            /// the first one out of them otherwise, in the order of the
            /// entries.
            fn check_bounds(table: &TableConfig) -> Result<(), ConfigError> {
                use $crate::config::setting::Bounded;
                $($(
                    let of: fn(&TableConfig) -> Option<$raw> = $of;
                    $crate::config::setting::check_bound(
                        &format!("tables.{}.{}", table.name, stringify!($name)),
                        of(table).bounded(),
                        ($min, None $(.or(Some::<u64>($max)))?),
                        concat!("" $(, $suffix)?),
                        |n| n.to_string(),
                    )?;
                )?)*
                Ok(())
            }

            /// Each key's row of the per-table table of
            /// docs/configuration.md (`| key | default | meaning |`), by
            /// key, in the order of the entries; not the plan parameters.
            #[cfg(test)]
            pub(crate) fn doc_rows() -> Vec<(&'static str, String)> {
                vec![$(
                    (
                        stringify!($name),
                        $crate::config::table_key::row(
                            stringify!($name),
                            $crate::config::table_key::table_toml!(
                                @shown $name $(= $default)? $(=> $shown)?
                            ),
                            &[$($doc),*],
                        ),
                    ),
                )*]
            }
        }
    };
    // A key's default as the docs show it.
    (@shown $name:ident => $shown:literal) => {
        $shown.to_string()
    };
    (@shown $name:ident = $default:expr) => {
        $crate::config::setting::shown(
            stringify!($name),
            Some(toml::Value::try_from($default)),
            stringify!($default),
        )
    };
    (@shown $name:ident) => {
        "none".to_string()
    };
}

pub(crate) use table_toml;

/// A key's row of the per-table table: `| `key` | default | meaning |`,
/// the meaning being the doc comment on one line.
#[cfg(test)]
pub(crate) fn row(key: &str, shown: String, doc: &[&str]) -> String {
    let meaning = doc
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let cells = [format!("`{key}`"), shown, meaning];
    let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
    format!("| {} |", cells.join(" | "))
}
