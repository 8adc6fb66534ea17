//! How one definition makes a setting: [`settings!`] takes each setting
//! once (doc comment, type, default, `SQSF_*` variable) and makes from it
//! the flag and TOML key (a field of [`super::Settings`]), the field of
//! [`super::Config`], its default, its merge (flag or variable, else the
//! file, else the default), its line of `--print-config` and its row of
//! docs/configuration.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A setting's type in [`super::Config`], and how it is written in a flag,
/// an `SQSF_*` variable and the TOML file (its raw form).
pub trait Setting: Sized {
    type Raw;
    fn from_raw(raw: Self::Raw) -> Self;
    /// `None` where unset (only an optional setting is ever unset).
    fn to_raw(&self) -> Option<Self::Raw>;
}

macro_rules! written_as_is {
    ($($t:ty),*) => {$(
        impl Setting for $t {
            type Raw = $t;
            fn from_raw(raw: $t) -> Self {
                raw
            }
            fn to_raw(&self) -> Option<$t> {
                Some(self.clone())
            }
        }
    )*};
}

written_as_is!(u32, u64, String, PathBuf, SocketAddr);

/// Durations are written in whole seconds.
impl Setting for Duration {
    type Raw = u64;
    fn from_raw(secs: u64) -> Self {
        Duration::from_secs(secs)
    }
    fn to_raw(&self) -> Option<u64> {
        Some(self.as_secs())
    }
}

/// An optional setting is written like its value, and unset by leaving it out.
impl<T: Setting> Setting for Option<T> {
    type Raw = T::Raw;
    fn from_raw(raw: T::Raw) -> Self {
        Some(T::from_raw(raw))
    }
    fn to_raw(&self) -> Option<T::Raw> {
        self.as_ref().and_then(T::to_raw)
    }
}

/// Each entry, `/// doc  name: Type = default [=> "shown when unset"],
/// [min MIN [max MAX],] "SQSF_NAME" [, clap attribute = value]*;`, makes a field `name` of
/// [`super::Config`] (type `Type`, documented by the doc) and a field
/// `name` of [`super::Settings`]: the flag `--name`, the variable, the TOML
/// key `name`, with the doc as its help and its row's meaning, and with
/// `min` (and `max`) its bounds, which [`super::Config::validate`] checks
/// (a duration in seconds). Then come
/// the fields that only `Settings` has and those that only `Config` has
/// (with their defaults), as written.
macro_rules! settings {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident: $ty:ty = $default:expr $(=> $unset:literal)?,
                $(min $min:tt $(max $max:tt)?,)? $env:literal
                $(, $key:ident = $value:expr)*;
        )*
        @only_in_settings { $($settings_only:tt)* }
        @only_in_config {
            $( $(#[$cmeta:meta])* pub $cname:ident: $cty:ty = $cdefault:expr, )*
        }
    ) => {
        /// The settings of the flags, the `SQSF_*` variables and the TOML
        /// file, in one struct: the command line fills it, the `--config`
        /// file fills another, and each value is the command line's, else
        /// the file's, else the default. Each field is unset (`None`) where
        /// not given.
        #[derive(Debug, Default, clap::Args, serde::Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields)]
        #[command(next_help_heading = SERVER)]
        pub struct Settings {
            $(
                $(#[doc = $doc])*
                #[arg(long, env = $env $(, $key = $value)*)]
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<<$ty as $crate::config::setting::Setting>::Raw>,
            )*
            $($settings_only)*
        }

        /// The validated configuration the server runs with.
        #[derive(Debug, Clone)]
        pub struct Config {
            $( $(#[doc = $doc])* pub $name: $ty, )*
            $( $(#[$cmeta])* pub $cname: $cty, )*
        }

        impl Config {
            /// Each setting within the bounds its entry declares; the first
            /// one out of them otherwise, in the order of the entries.
            fn check_bounds(&self) -> Result<(), ConfigError> {
                use $crate::config::setting::Bounded;
                $($(
                    $crate::config::setting::check_bound(
                        stringify!($name),
                        self.$name.bounded(),
                        $min,
                        None $(.or(Some(u64::from($max))))?,
                    )?;
                )?)*
                Ok(())
            }

            /// Every setting at its default.
            fn defaults() -> Self {
                Self {
                    $( $name: $default, )*
                    $( $cname: $cdefault, )*
                }
            }
        }

        impl Settings {
            /// Sets each setting of `config` that is given here, else in `file`.
            fn apply(&mut self, file: &mut Settings, config: &mut Config) {
                use $crate::config::setting::Setting;
                $(
                    if let Some(raw) = self.$name.take().or_else(|| file.$name.take()) {
                        config.$name = Setting::from_raw(raw);
                    }
                )*
            }

            /// `config`'s values, as the file would set them (the fields
            /// only `Settings` has are left unset).
            fn of(config: &Config) -> Self {
                use $crate::config::setting::Setting;
                Self {
                    $( $name: config.$name.to_raw(), )*
                    ..Self::default()
                }
            }

            /// The default of the setting `key` as docs/configuration.md
            /// shows it; `None` if `key` is not defined here.
            pub(crate) fn default_shown(key: &str) -> Option<String> {
                use $crate::config::setting::Setting;
                match key {
                    $(
                        stringify!($name) => {
                            let value: $ty = $default;
                            let unset: Option<&str> = None $(.or(Some($unset)))?;
                            Some($crate::config::setting::shown(
                                key,
                                value.to_raw().map(toml::Value::try_from),
                                stringify!($default),
                                unset,
                            ))
                        }
                    )*
                    _ => None,
                }
            }
        }
    };
}

pub(crate) use settings;

/// A setting's value as its bounds are checked.
pub trait Bounded {
    fn bounded(&self) -> u64;
}

impl Bounded for u32 {
    fn bounded(&self) -> u64 {
        u64::from(*self)
    }
}

impl Bounded for u64 {
    fn bounded(&self) -> u64 {
        *self
    }
}

/// In whole seconds, as it is written.
impl Bounded for Duration {
    fn bounded(&self) -> u64 {
        self.as_secs()
    }
}

/// `value` of `setting` within `min` and `max` (if any).
pub(crate) fn check_bound(
    setting: &str,
    value: u64,
    min: u64,
    max: Option<u64>,
) -> Result<(), super::ConfigError> {
    let problem = match max {
        Some(max) if !(min..=max).contains(&value) => format!("must be {min} to {max}"),
        None if value < min => format!("must be at least {min}"),
        _ => return Ok(()),
    };
    Err(super::value_error(setting.to_string(), value, &problem))
}

/// A default for the docs: `` `value` (`DEFAULT_NAME`) ``, with the size
/// in units for a byte count, or the text for an unset setting.
pub(crate) fn shown(
    key: &str,
    value: Option<Result<toml::Value, toml::ser::Error>>,
    expr: &str,
    unset: Option<&str>,
) -> String {
    let value = match value {
        Some(Ok(toml::Value::String(s))) => s,
        Some(Ok(v)) => v.to_string(),
        Some(Err(e)) => panic!("{key}: default does not serialize: {e}"),
        None => return unset.unwrap_or("none").to_string(),
    };
    let mut text = format!("`{value}`");
    if key.ends_with("_bytes")
        && let Ok(n) = value.parse::<u64>()
    {
        text += &format!(" = {}", super::sql::show_bytes(n));
    }
    let constant = expr
        .split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .find(|w| w.starts_with("DEFAULT_"));
    if let Some(name) = constant {
        text += &format!(" (`{name}`)");
    }
    text
}
