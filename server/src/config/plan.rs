//! The plan parameters (docs/protocol.md, "Plan parameters: defaults and
//! limits"), defined once in the schemas crate's `plan_params!` list (with
//! their built-in defaults and limits): here [`Plan`] of them, the
//! `[limits]` settings, and the bounds a plan must keep. The configuration checks a table's
//! defaults with [`Plan::check`] and the registry checks each plan command
//! with it, so both keep the same rules.

use serde::{Deserialize, Serialize};
use sqs_flight_schemas::PlanCommand;

use sqs_flight_schemas::plan::COUNT;

use super::ConfigError;
use super::setting::check_bound;

/// Makes, from the list of `plan_params!`: [`Plan`], the `DEFAULT_*` and
/// `LIMIT_*` constants (here as in the schemas crate), [`PlanParams::DEFAULTS`]
/// and [`PlanParams::LIMITS`], and [`LimitSettings`] with its flags.
macro_rules! plan {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident {
                default: $default_name:ident = $default:expr,
                limit: $limit_name:ident = $limit:expr,
                zero: $zero:literal,
                limit_flag: $flag:literal, $env:literal, $value_name:literal {
                    $(#[doc = $flag_doc:literal])*
                },
                spark: $spark:literal,
                client: $client:ident: $client_ty:ty,
                cli: [$({ $(#[doc = $cli_doc:literal])* })?],
            }
        )*
    ) => {
        pub use sqs_flight_schemas::plan::{$($default_name, $limit_name),*};

        /// The plan parameters, each of type `T`: [`PlanParams`] holds values,
        /// [`PlanOverrides`] the ones a table or a plan command sets.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct Plan<T> {
            $( $(#[doc = $doc])* pub $name: T, )*
        }

        impl<T> Plan<T> {
            /// Each parameter's name and its values here and in `other`, combined by `f`.
            fn zip<U, V>(
                self,
                other: Plan<U>,
                mut f: impl FnMut(&'static str, T, U) -> V,
            ) -> Plan<V> {
                Plan {
                    $( $name: f(stringify!($name), self.$name, other.$name), )*
                }
            }

            /// `(name, value)` pairs, in the order of the fields.
            pub fn fields(self) -> [(&'static str, T); COUNT] {
                [$( (stringify!($name), self.$name) ),*]
            }
        }

        impl PlanParams {
            /// The built-in defaults.
            pub const DEFAULTS: Self = Self { $( $name: $default_name, )* };
            /// The built-in limits.
            pub const LIMITS: Self = Self { $( $name: $limit_name, )* };
        }

        /// Whether each parameter may be 0.
        const MAY_BE_ZERO_EACH: Plan<bool> = Plan { $( $name: $zero, )* };

        impl From<&PlanCommand> for PlanOverrides {
            fn from(cmd: &PlanCommand) -> Self {
                Self { $( $name: cmd.$name, )* }
            }
        }

        /// The server's limits of the plan parameters: flags `--limit-*`, TOML
        /// table `[limits]`; the built-in [`PlanParams::LIMITS`] where not set.
        #[derive(Debug, Clone, Default, clap::Args, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[command(next_help_heading = "Plan limits")]
        pub struct LimitSettings {
            $(
                $(#[doc = $flag_doc])*
                #[arg(long = $flag, env = $env, value_name = $value_name)]
                pub $name: Option<u64>,
            )*
        }

        impl LimitSettings {
            /// The limits set here, each `None` where not set.
            fn set(&self) -> PlanOverrides {
                Plan { $( $name: self.$name, )* }
            }

            /// The default of the limit `key` as docs/configuration.md
            /// shows it; `None` if `key` is not a plan parameter.
            pub(crate) fn default_shown(key: &str) -> Option<String> {
                match key {
                    $(
                        stringify!($name) => Some(super::setting::shown(
                            key,
                            Some(toml::Value::try_from($limit_name)),
                            stringify!($limit_name),
                        )),
                    )*
                    _ => None,
                }
            }
        }

        impl From<PlanOverrides> for LimitSettings {
            fn from(set: PlanOverrides) -> Self {
                Self { $( $name: set.$name, )* }
            }
        }
    };
}

sqs_flight_schemas::plan_params!(plan);

/// The smallest limit of a plan parameter (`[limits]`): 0 would refuse every plan.
pub(crate) const MIN_LIMIT: u64 = 1;

/// Plan parameters: a table's defaults, a batch's values, or the server's limits.
pub type PlanParams = Plan<u64>;
/// The plan parameters that something sets, each `None` where it does not.
pub(crate) type PlanOverrides = Plan<Option<u64>>;

/// A plan parameter out of its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfBounds {
    AboveLimit {
        field: &'static str,
        value: u64,
        limit: u64,
    },
    /// 0 where it may not be (see [`may_be_zero`]).
    Zero { field: &'static str },
}

impl PlanParams {
    /// Within `limits`, and not 0 unless it may be ([`may_be_zero`]); the first field
    /// out of bounds otherwise.
    pub fn check(self, limits: PlanParams) -> Result<(), OutOfBounds> {
        let bounds = limits.zip(MAY_BE_ZERO_EACH, |_, limit, zero| (limit, zero));
        for ((field, value), (_, (limit, zero))) in self.fields().into_iter().zip(bounds.fields()) {
            if value > limit {
                return Err(OutOfBounds::AboveLimit {
                    field,
                    value,
                    limit,
                });
            }
            if value == 0 && !zero {
                return Err(OutOfBounds::Zero { field });
            }
        }
        Ok(())
    }

    /// As limits: each at least [`MIN_LIMIT`] (a limit of 0 would refuse
    /// every plan); the first that is below otherwise.
    #[cfg(test)]
    fn check_limits(self) -> Result<(), &'static str> {
        match self
            .fields()
            .into_iter()
            .find(|(_, limit)| *limit < MIN_LIMIT)
        {
            Some((field, _)) => Err(field),
            None => Ok(()),
        }
    }

    /// As the server's limits (`[limits]`): each at least [`MIN_LIMIT`] (a
    /// limit of 0 would refuse every plan), with the error naming the
    /// setting as every bound's does.
    pub(crate) fn check_as_limits(self) -> Result<(), ConfigError> {
        for (field, limit) in self.fields() {
            let setting = format!("limits.{field}");
            check_bound(&setting, Some(limit), (MIN_LIMIT, None), "", |n| {
                n.to_string()
            })?;
        }
        Ok(())
    }
}

impl PlanOverrides {
    /// These values where set, `base`'s elsewhere.
    pub(crate) fn over(self, base: PlanParams) -> PlanParams {
        self.zip(base, |_, value, base| value.unwrap_or(base))
    }
}

impl LimitSettings {
    /// The limits these settings give.
    pub(crate) fn limits(&self) -> PlanParams {
        self.set().over(PlanParams::LIMITS)
    }

    /// These settings where set, `other`'s elsewhere.
    pub fn or(self, other: Self) -> Self {
        self.set()
            .zip(other.set(), |_, value, other| value.or(other))
            .into()
    }
}

#[cfg(test)]
mod tests {
    use sqs_flight_schemas::plan::may_be_zero;

    use super::*;

    #[test]
    fn only_max_wait_ms_and_read_ahead_may_be_zero_and_nothing_above_its_limit() {
        let limits = PlanParams::LIMITS;
        assert_eq!(PlanParams::DEFAULTS.check(limits), Ok(()));
        let no_wait = PlanParams {
            max_wait_ms: 0,
            ..PlanParams::DEFAULTS
        };
        assert_eq!(no_wait.check(limits), Ok(()));
        for (field, _) in PlanParams::DEFAULTS.fields() {
            if may_be_zero(field) {
                continue;
            }
            let zero =
                Plan::<()>::default().zip(
                    PlanParams::DEFAULTS,
                    |name, (), d| {
                        if name == field { 0 } else { d }
                    },
                );
            assert_eq!(zero.check(limits), Err(OutOfBounds::Zero { field }));
        }
        let big = PlanParams {
            receivers: LIMIT_RECEIVERS + 1,
            ..PlanParams::DEFAULTS
        };
        assert_eq!(
            big.check(limits),
            Err(OutOfBounds::AboveLimit {
                field: "receivers",
                value: LIMIT_RECEIVERS + 1,
                limit: LIMIT_RECEIVERS
            })
        );
        let no_limit = PlanParams {
            max_wait_ms: 0,
            ..limits
        };
        assert_eq!(no_limit.check_limits(), Err("max_wait_ms"));
    }

    #[test]
    fn overrides_replace_only_what_they_set() {
        let cmd = PlanCommand {
            partitions: Some(3),
            receivers: Some(0),
            ..PlanCommand::default()
        };
        let p = PlanOverrides::from(&cmd).over(PlanParams::DEFAULTS);
        assert_eq!((p.partitions, p.receivers), (3, 0));
        assert_eq!(p.max_messages, DEFAULT_MAX_MESSAGES);
    }
}
