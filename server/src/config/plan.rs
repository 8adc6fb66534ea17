//! The plan parameters (docs/protocol.md, "Plan parameters: defaults and
//! limits"): their built-in defaults and limits, the `[limits]` settings,
//! and the bounds a plan must keep. The configuration checks a table's
//! defaults with [`Plan::check`] and the registry checks each plan command
//! with it, so both keep the same rules.

use serde::{Deserialize, Serialize};
use sqs_flight_schemas::PlanCommand;

/// Partitions (endpoints) per batch unless the command or table says otherwise.
pub const DEFAULT_PARTITIONS: u64 = 2;
/// Messages per partition of a batch.
pub const DEFAULT_MAX_MESSAGES: u64 = 1000;
/// Idle time without a message after which a partition's stream ends.
pub const DEFAULT_MAX_WAIT_MS: u64 = 1000;
/// Bytes per partition of a batch.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Time after which a partition's stream ends however busy the queue is.
pub const DEFAULT_MAX_DURATION_MS: u64 = 30_000;
/// ReceiveMessage calls a partition keeps in flight at most. It grows to
/// this while receives come back full and shrinks while they do not, so an
/// idle queue costs one long poll per partition whatever this is. Why 32:
/// "Choosing the defaults" in benches/results/2026-12-01-round5-ddbdb76.md
/// (figure 3, receive + commit through a 20 ms proxy at 8, 16 and 32, and
/// at 0 ms; linked from benches/RESULTS.md).
pub const DEFAULT_RECEIVERS: u64 = 32;
/// Upper limit of `receivers`.
pub const LIMIT_RECEIVERS: u64 = 128;
/// Upper limit of `partitions`.
pub const LIMIT_PARTITIONS: u64 = 64;
/// Upper limit of `max_messages`.
pub const LIMIT_MAX_MESSAGES: u64 = 100_000;
/// Upper limit of `max_bytes`.
pub const LIMIT_MAX_BYTES: u64 = 256 << 20;
/// Upper limit of `max_wait_ms`.
pub const LIMIT_MAX_WAIT_MS: u64 = 20_000;
/// Upper limit of `max_duration_ms`.
pub const LIMIT_MAX_DURATION_MS: u64 = 300_000;

/// The one plan parameter that may be 0: a partition then makes one
/// receive call and does not wait. Its limit is at least 1 like the others.
pub const MAY_BE_ZERO: &str = "max_wait_ms";

/// The six plan parameters, each of type `T`: [`PlanParams`] holds values,
/// [`PlanOverrides`] the ones a table or a plan command sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Plan<T> {
    pub partitions: T,
    pub max_messages: T,
    pub max_wait_ms: T,
    pub max_bytes: T,
    pub max_duration_ms: T,
    pub receivers: T,
}

/// Plan parameters: a table's defaults, a batch's values, or the server's limits.
pub type PlanParams = Plan<u64>;
/// The plan parameters that something sets, each `None` where it does not.
pub type PlanOverrides = Plan<Option<u64>>;

impl<T> Plan<T> {
    /// Each parameter's name and its values here and in `other`, combined by `f`.
    fn zip<U, V>(self, other: Plan<U>, mut f: impl FnMut(&'static str, T, U) -> V) -> Plan<V> {
        Plan {
            partitions: f("partitions", self.partitions, other.partitions),
            max_messages: f("max_messages", self.max_messages, other.max_messages),
            max_wait_ms: f("max_wait_ms", self.max_wait_ms, other.max_wait_ms),
            max_bytes: f("max_bytes", self.max_bytes, other.max_bytes),
            max_duration_ms: f(
                "max_duration_ms",
                self.max_duration_ms,
                other.max_duration_ms,
            ),
            receivers: f("receivers", self.receivers, other.receivers),
        }
    }

    /// `(name, value)` pairs, in the order of the fields.
    pub fn fields(self) -> [(&'static str, T); 6] {
        let p = self.zip(Plan::<()>::default(), |name, value, ()| (name, value));
        [
            p.partitions,
            p.max_messages,
            p.max_wait_ms,
            p.max_bytes,
            p.max_duration_ms,
            p.receivers,
        ]
    }
}

/// A plan parameter out of its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfBounds {
    AboveLimit {
        field: &'static str,
        value: u64,
        limit: u64,
    },
    /// 0 where only [`MAY_BE_ZERO`] may be.
    Zero { field: &'static str },
}

impl PlanParams {
    /// The built-in defaults.
    pub const DEFAULTS: Self = Self {
        partitions: DEFAULT_PARTITIONS,
        max_messages: DEFAULT_MAX_MESSAGES,
        max_wait_ms: DEFAULT_MAX_WAIT_MS,
        max_bytes: DEFAULT_MAX_BYTES,
        max_duration_ms: DEFAULT_MAX_DURATION_MS,
        receivers: DEFAULT_RECEIVERS,
    };
    /// The built-in limits.
    pub const LIMITS: Self = Self {
        partitions: LIMIT_PARTITIONS,
        max_messages: LIMIT_MAX_MESSAGES,
        max_wait_ms: LIMIT_MAX_WAIT_MS,
        max_bytes: LIMIT_MAX_BYTES,
        max_duration_ms: LIMIT_MAX_DURATION_MS,
        receivers: LIMIT_RECEIVERS,
    };

    /// Within `limits`, and not 0 unless [`MAY_BE_ZERO`]; the first field
    /// out of bounds otherwise.
    pub fn check(self, limits: PlanParams) -> Result<(), OutOfBounds> {
        for ((field, value), (_, limit)) in self.fields().into_iter().zip(limits.fields()) {
            if value > limit {
                return Err(OutOfBounds::AboveLimit {
                    field,
                    value,
                    limit,
                });
            }
            if value == 0 && field != MAY_BE_ZERO {
                return Err(OutOfBounds::Zero { field });
            }
        }
        Ok(())
    }

    /// As limits: each at least 1 (a limit of 0 would refuse every plan);
    /// the first that is 0 otherwise.
    pub fn check_limits(self) -> Result<(), &'static str> {
        match self.fields().into_iter().find(|(_, limit)| *limit == 0) {
            Some((field, _)) => Err(field),
            None => Ok(()),
        }
    }
}

impl PlanOverrides {
    /// These values where set, `base`'s elsewhere.
    pub fn over(self, base: PlanParams) -> PlanParams {
        self.zip(base, |_, value, base| value.unwrap_or(base))
    }
}

impl From<&PlanCommand> for PlanOverrides {
    fn from(cmd: &PlanCommand) -> Self {
        Self {
            partitions: cmd.partitions,
            max_messages: cmd.max_messages,
            max_wait_ms: cmd.max_wait_ms,
            max_bytes: cmd.max_bytes,
            max_duration_ms: cmd.max_duration_ms,
            receivers: cmd.receivers,
        }
    }
}

/// The server's limits of the plan parameters: flags `--limit-*`, TOML
/// table `[limits]`; the built-in [`PlanParams::LIMITS`] where not set.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Plan limits")]
pub struct LimitSettings {
    /// Largest `partitions` a plan may ask for: partitions (endpoints) per batch.
    #[arg(
        long = "limit-partitions",
        env = "SQSF_LIMIT_PARTITIONS",
        value_name = "N"
    )]
    pub partitions: Option<u64>,
    /// Largest `max_messages`: messages per partition and batch.
    #[arg(
        long = "limit-max-messages",
        env = "SQSF_LIMIT_MAX_MESSAGES",
        value_name = "N"
    )]
    pub max_messages: Option<u64>,
    /// Largest `max_wait_ms`: idle time that ends a partition's stream.
    #[arg(
        long = "limit-max-wait-ms",
        env = "SQSF_LIMIT_MAX_WAIT_MS",
        value_name = "MS"
    )]
    pub max_wait_ms: Option<u64>,
    /// Largest `max_bytes`: bytes per partition and batch.
    #[arg(
        long = "limit-max-bytes",
        env = "SQSF_LIMIT_MAX_BYTES",
        value_name = "N"
    )]
    pub max_bytes: Option<u64>,
    /// Largest `max_duration_ms`: total time of a partition's stream.
    #[arg(
        long = "limit-max-duration-ms",
        env = "SQSF_LIMIT_MAX_DURATION_MS",
        value_name = "MS"
    )]
    pub max_duration_ms: Option<u64>,
    /// Largest `receivers`: ReceiveMessage calls in flight per partition.
    #[arg(
        long = "limit-receivers",
        env = "SQSF_LIMIT_RECEIVERS",
        value_name = "N"
    )]
    pub receivers: Option<u64>,
}

impl LimitSettings {
    /// The limits these settings give.
    pub fn limits(&self) -> PlanParams {
        let set = PlanOverrides {
            partitions: self.partitions,
            max_messages: self.max_messages,
            max_wait_ms: self.max_wait_ms,
            max_bytes: self.max_bytes,
            max_duration_ms: self.max_duration_ms,
            receivers: self.receivers,
        };
        set.over(PlanParams::LIMITS)
    }

    /// These settings where set, `other`'s elsewhere.
    pub fn or(self, other: Self) -> Self {
        Self {
            partitions: self.partitions.or(other.partitions),
            max_messages: self.max_messages.or(other.max_messages),
            max_wait_ms: self.max_wait_ms.or(other.max_wait_ms),
            max_bytes: self.max_bytes.or(other.max_bytes),
            max_duration_ms: self.max_duration_ms.or(other.max_duration_ms),
            receivers: self.receivers.or(other.receivers),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_max_wait_ms_may_be_zero_and_nothing_above_its_limit() {
        let limits = PlanParams::LIMITS;
        assert_eq!(PlanParams::DEFAULTS.check(limits), Ok(()));
        let no_wait = PlanParams {
            max_wait_ms: 0,
            ..PlanParams::DEFAULTS
        };
        assert_eq!(no_wait.check(limits), Ok(()));
        for (field, _) in PlanParams::DEFAULTS.fields() {
            if field == MAY_BE_ZERO {
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
