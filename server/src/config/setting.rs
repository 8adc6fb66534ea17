//! How one definition makes a setting: [`settings!`] takes each setting
//! of a group (the top level, `[sql]`) once (doc comment, type, default,
//! bounds, `SQSF_*` variable) and makes from it the flag and TOML key (a
//! field of the group's settings struct, [`super::Settings`] or
//! [`super::sql::SqlSettings`]), the field of its config struct
//! ([`super::Config`], [`super::sql::SqlConfig`]), its default, its merge
//! (flag or variable, else the file, else the default), its bounds check,
//! its line of `--print-config` and its row of docs/configuration.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::ConfigError;

/// A setting's type in a config struct, and how it is written in a flag,
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

written_as_is!(bool, u32, u64, String, PathBuf, SocketAddr);

/// A count held as `usize` is written as a `u64`.
impl Setting for usize {
    type Raw = u64;
    fn from_raw(raw: u64) -> Self {
        raw as usize
    }
    fn to_raw(&self) -> Option<u64> {
        Some(*self as u64)
    }
}

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

/// How a setting of type `T` is read from and written as its raw form: by
/// default as [`Setting`] says (`impl Form<T> for T`); an entry's `as
/// FORM` names another, for a value that may fail to read (a size with a
/// unit, [`super::sql::Size`]).
pub trait Form<T> {
    type Raw;
    /// The value of `raw`; an error names `setting`.
    fn read(setting: &str, raw: Self::Raw) -> Result<T, ConfigError>;
    /// `None` where unset.
    fn write(value: &T) -> Option<Self::Raw>;
    /// A bound as an error shows it.
    fn show(bound: u64) -> String {
        bound.to_string()
    }
}

impl<T: Setting> Form<T> for T {
    type Raw = T::Raw;
    fn read(_: &str, raw: T::Raw) -> Result<T, ConfigError> {
        Ok(T::from_raw(raw))
    }
    fn write(value: &T) -> Option<T::Raw> {
        value.to_raw()
    }
}

/// The form of an entry: its `as FORM`, else its type.
macro_rules! form {
    ($ty:ty) => {
        $ty
    };
    ($ty:ty, $form:ty) => {
        $form
    };
}

pub(crate) use form;

/// Each entry, `/// doc  name: Type [as Form] = default [=> "shown"],
/// [min MIN [max MAX] ["suffix"],] "SQSF_NAME" [, clap attribute = value]*;`,
/// makes a field `name` of the config struct (type `Type`, documented by
/// the doc) and a field `name` of the settings struct: the flag `--name`
/// (another with `long = "..."`), the variable, the TOML key `name`, with
/// the doc as its help and its row's meaning. `shown` is what the docs
/// give as the default where it is no plain value (unset, or the
/// machine's). With `min` (and `max`) the value must be within them (a
/// duration in seconds): the config struct's `check_bounds` checks every
/// value, the settings struct's `check_bounds` each given one; the error
/// names the setting (after the group's `names` prefix) and says `must be
/// MIN to MAX` or `must be at least MIN`, then the suffix. Then come the
/// fields that only the settings struct has and those that only the config
/// struct has (with their defaults), as written.
///
/// The group is named first: `#[attributes] pub struct Settings;
/// #[attributes] pub struct Config; names "prefix";`.
macro_rules! settings {
    (
        $(#[$smeta:meta])* pub struct $settings:ident;
        $(#[$cmeta:meta])* pub struct $config:ident;
        names $prefix:literal;
        $(
            $(#[doc = $doc:literal])*
            $name:ident: $ty:ty $(as $form:ty)? = $default:expr $(=> $shown:literal)?,
                $(min $min:tt $(max $max:tt)? $($suffix:literal)?,)? $env:literal
                $(, $key:ident = $value:expr)*;
        )*
        @only_in_settings { $($settings_only:tt)* }
        @only_in_config { $($config_only:tt)* }
    ) => {
        // Each entry with its form spelled out (a bound's code, nested
        // deeper than `as FORM`, could not name it otherwise).
        $crate::config::setting::settings! {
            @formed
            $(#[$smeta])* pub struct $settings;
            $(#[$cmeta])* pub struct $config;
            names $prefix;
            $(
                $(#[doc = $doc])*
                $name: $ty as $crate::config::setting::form!($ty $(, $form)?)
                    = $default $(=> $shown)?,
                    $(min $min $(max $max)? $($suffix)?,)? $env
                    $(, $key = $value)*;
            )*
            @only_in_settings { $($settings_only)* }
            @only_in_config { $($config_only)* }
        }
    };
    (
        @formed
        $(#[$smeta:meta])* pub struct $settings:ident;
        $(#[$cmeta:meta])* pub struct $config:ident;
        names $prefix:literal;
        $(
            $(#[doc = $doc:literal])*
            $name:ident: $ty:ty as $form:ty = $default:expr $(=> $shown:literal)?,
                $(min $min:tt $(max $max:tt)? $($suffix:literal)?,)? $env:literal
                $(, $key:ident = $value:expr)*;
        )*
        @only_in_settings { $($settings_only:tt)* }
        @only_in_config {
            $( $(#[$ometa:meta])* pub $cname:ident: $cty:ty = $cdefault:expr, )*
        }
    ) => {
        #[derive(Debug, Default, clap::Args, serde::Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields)]
        $(#[$smeta])*
        pub struct $settings {
            $(
                $(#[doc = $doc])*
                #[arg(long, env = $env $(, $key = $value)*)]
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<<$form as $crate::config::setting::Form<$ty>>::Raw>,
            )*
            $($settings_only)*
        }

        $(#[$cmeta])*
        pub struct $config {
            $( $(#[doc = $doc])* pub $name: $ty, )*
            $( $(#[$ometa])* pub $cname: $cty, )*
        }

        impl $config {
            /// Each setting within the bounds its entry declares; the first
            /// one out of them otherwise, in the order of the entries.
            #[allow(dead_code, reason = "a group checks its values or its given settings")]
            fn check_bounds(&self) -> Result<(), $crate::config::ConfigError> {
                use $crate::config::setting::Bounded;
                $($(
                    $crate::config::setting::check_bound(
                        concat!($prefix, stringify!($name)),
                        self.$name.bounded(),
                        ($min, None $(.or(Some(u64::from($max))))?),
                        concat!("" $(, $suffix)?),
                        <$form as $crate::config::setting::Form<$ty>>::show,
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

        impl $settings {
            /// Sets each setting of `config` that is given here, else in `file`.
            fn apply(
                &mut self,
                file: &mut $settings,
                config: &mut $config,
            ) -> Result<(), $crate::config::ConfigError> {
                use $crate::config::setting::Form;
                $(
                    if let Some(raw) = self.$name.take().or_else(|| file.$name.take()) {
                        config.$name = <$form as Form<$ty>>::read(concat!($prefix, stringify!($name)), raw)?;
                    }
                )*
                Ok(())
            }

            /// Each setting given here within the bounds its entry
            /// declares; the first one out of them (or that does not
            /// read) otherwise, in the order of the entries.
            #[allow(dead_code, reason = "a group checks its values or its given settings")]
            fn check_bounds(&self) -> Result<(), $crate::config::ConfigError> {
                use $crate::config::setting::{Bounded, Form};
                $($(
                    if let Some(raw) = &self.$name {
                        let setting = concat!($prefix, stringify!($name));
                        let value: $ty = <$form as Form<$ty>>::read(setting, raw.clone())?;
                        $crate::config::setting::check_bound(
                            setting,
                            value.bounded(),
                            ($min, None $(.or(Some(u64::from($max))))?),
                            concat!("" $(, $suffix)?),
                            <$form as Form<$ty>>::show,
                        )?;
                    }
                )?)*
                Ok(())
            }

            /// The settings set here, else in `other` (the fields only
            /// this struct has are this one's).
            #[allow(clippy::needless_update, reason = "a group may have no fields of its own")]
            pub fn or(self, other: Self) -> Self {
                Self {
                    $( $name: self.$name.or(other.$name), )*
                    ..self
                }
            }

            /// `config`'s values, as the file would set them (the fields
            /// only this struct has are left unset).
            #[allow(clippy::needless_update, reason = "a group may have no fields of its own")]
            pub fn of(config: &$config) -> Self {
                use $crate::config::setting::Form;
                Self {
                    $(
                        $name: <$form as Form<$ty>>::write(&config.$name),
                    )*
                    ..Self::default()
                }
            }

            /// The default of the setting `key` as docs/configuration.md
            /// shows it; `None` if `key` is not defined here.
            pub(crate) fn default_shown(key: &str) -> Option<String> {
                use $crate::config::setting::Form;
                match key {
                    $(
                        stringify!($name) => {
                            let shown: Option<&str> = None $(.or(Some($shown)))?;
                            Some(shown.map_or_else(
                                || {
                                    let value: $ty = $default;
                                    $crate::config::setting::shown(
                                        key,
                                        <$form as Form<$ty>>::write(&value)
                                            .map(toml::Value::try_from),
                                        stringify!($default),
                                    )
                                },
                                str::to_string,
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

/// A setting's value as its bounds are checked; `None` where unset.
pub(crate) trait Bounded {
    fn bounded(&self) -> Option<u64>;
}

impl Bounded for u32 {
    fn bounded(&self) -> Option<u64> {
        Some(u64::from(*self))
    }
}

impl Bounded for u64 {
    fn bounded(&self) -> Option<u64> {
        Some(*self)
    }
}

impl Bounded for usize {
    fn bounded(&self) -> Option<u64> {
        Some(*self as u64)
    }
}

/// In whole seconds, as it is written.
impl Bounded for Duration {
    fn bounded(&self) -> Option<u64> {
        Some(self.as_secs())
    }
}

/// An unset setting has nothing to check.
impl<T: Bounded> Bounded for Option<T> {
    fn bounded(&self) -> Option<u64> {
        self.as_ref().and_then(T::bounded)
    }
}

/// `value` of `setting` within `min` and `max` (if any): otherwise an
/// error naming it, with the bounds as `show` writes them and `suffix`
/// after them.
pub(crate) fn check_bound(
    setting: &str,
    value: Option<u64>,
    (min, max): (u64, Option<u64>),
    suffix: &str,
    show: fn(u64) -> String,
) -> Result<(), ConfigError> {
    let Some(value) = value else {
        return Ok(());
    };
    let problem = match max {
        Some(max) if !(min..=max).contains(&value) => {
            format!("must be {} to {}{suffix}", show(min), show(max))
        }
        None if value < min => format!("must be at least {}{suffix}", show(min)),
        _ => return Ok(()),
    };
    Err(super::value_error(setting.to_string(), value, &problem))
}

/// A default for the docs: `` `value` (`DEFAULT_NAME`) ``, with the size
/// in units for a byte count, or `none` for an unset setting.
pub(crate) fn shown(
    key: &str,
    value: Option<Result<toml::Value, toml::ser::Error>>,
    expr: &str,
) -> String {
    let value = match value {
        Some(Ok(toml::Value::String(s))) => s,
        Some(Ok(v)) => v.to_string(),
        Some(Err(e)) => panic!("{key}: default does not serialize: {e}"),
        None => return "none".to_string(),
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
