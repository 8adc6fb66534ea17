//! A table's IAM role: `role_arn`, `role_external_id` and
//! `role_session_name` of `[tables.NAME]`, checked at start against what
//! STS's AssumeRole accepts, so that a typo stops the server with the key
//! named instead of failing every call later.

use std::fmt;

/// The role a table's SQS (and S3) calls are made as: credentials from
/// STS AssumeRole, called with the process's own AWS chain.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RoleConfig {
    /// `arn:aws:iam::ACCOUNT:role/NAME` (other partitions too).
    pub arn: String,
    /// The external id the role's trust policy asks for, if any. Never
    /// logged nor put in an error message.
    pub external_id: Option<String>,
    /// The session name given; `None`: [`RoleConfig::session_name`]'s
    /// default, `sqs-flight-<table>`.
    pub session_name: Option<String>,
}

/// The prefix of a default session name: an auditor reading CloudTrail in
/// the queue's account sees `sqs-flight-orders` and knows what assumed it.
pub(crate) const DEFAULT_SESSION_PREFIX: &str = "sqs-flight-";
/// STS's bounds on a role session name (AssumeRole's `RoleSessionName`).
const SESSION_NAME_LEN: (usize, usize) = (2, 64);
/// STS's bounds on an external id (AssumeRole's `ExternalId`).
const EXTERNAL_ID_LEN: (usize, usize) = (2, 1224);
/// STS's bounds on a role ARN (AssumeRole's `RoleArn`).
const ARN_LEN: (usize, usize) = (20, 2048);
/// The longest role name IAM allows (the ARN's last segment).
const MAX_ROLE_NAME: usize = 64;

impl RoleConfig {
    /// The session name STS is given for table `table`: the one set, else
    /// `sqs-flight-<table>`, cut to STS's 64 characters (a table name's
    /// characters are all allowed in a session name).
    pub fn session_name(&self, table: &str) -> String {
        match &self.session_name {
            Some(name) => name.clone(),
            None => {
                let mut name = format!("{DEFAULT_SESSION_PREFIX}{table}");
                name.truncate(SESSION_NAME_LEN.1);
                name
            }
        }
    }

    /// Each key within what STS accepts; the problem and the key's name
    /// (`role_arn`, ...) otherwise. The external id's value is never
    /// quoted back.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        check_arn(&self.arn).map_err(|p| ("role_arn", p))?;
        if let Some(id) = &self.external_id {
            check_chars(id, EXTERNAL_ID_LEN, "=,.@:/-+")
                .map_err(|p| ("role_external_id", format!("the external id {p}")))?;
        }
        if let Some(name) = &self.session_name {
            check_chars(name, SESSION_NAME_LEN, "=,.@-+")
                .map_err(|p| ("role_session_name", format!("{name:?} {p}")))?;
        }
        Ok(())
    }
}

impl fmt::Debug for RoleConfig {
    /// The external id shows as `<set>`: it is not printed anywhere.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoleConfig")
            .field("arn", &self.arn)
            .field("external_id", &self.external_id.as_ref().map(|_| "<set>"))
            .field("session_name", &self.session_name)
            .finish()
    }
}

/// `arn:PARTITION:iam::ACCOUNT:role/[PATH/]NAME`: a partition `aws` or
/// `aws-...` (`aws-cn`, `aws-us-gov`), a 12-digit account, and a role
/// name (with its path) of IAM's characters.
fn check_arn(arn: &str) -> Result<(), String> {
    let shape = || {
        format!(
            "{arn:?} is not a role ARN: expected arn:aws:iam::<12-digit account>:role/<name> \
             (e.g. \"arn:aws:iam::123456789012:role/sqs-reader\")"
        )
    };
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let ["arn", partition, "iam", "", account, resource] = parts.as_slice() else {
        return Err(shape());
    };
    let partition_ok = *partition == "aws"
        || partition.strip_prefix("aws-").is_some_and(|p| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
        });
    let account_ok = account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit());
    let Some(path_and_name) = resource.strip_prefix("role/") else {
        return Err(shape());
    };
    let name = path_and_name.rsplit('/').next().unwrap_or_default();
    let chars_ok = path_and_name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_+=,.@/-".contains(&b));
    if !(partition_ok && account_ok && chars_ok) || name.is_empty() || name.len() > MAX_ROLE_NAME {
        return Err(shape());
    }
    if !(ARN_LEN.0..=ARN_LEN.1).contains(&arn.len()) {
        return Err(format!(
            "is {} characters long; STS takes {} to {}",
            arn.len(),
            ARN_LEN.0,
            ARN_LEN.1
        ));
    }
    Ok(())
}

/// `value` within `len` characters, each a letter, a digit, `_` or one of
/// `others`: what STS's patterns (`[\w+=,.@-]*` and the like) accept.
fn check_chars(value: &str, len: (usize, usize), others: &str) -> Result<(), String> {
    if !(len.0..=len.1).contains(&value.len()) {
        return Err(format!(
            "is {} characters long; STS takes {} to {}",
            value.len(),
            len.0,
            len.1
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || others.contains(*c)))
    {
        return Err(format!(
            "holds {bad:?}; STS takes letters, digits and `_{others}` only"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(arn: &str) -> RoleConfig {
        RoleConfig {
            arn: arn.into(),
            external_id: None,
            session_name: None,
        }
    }

    #[test]
    fn role_arns_of_every_partition_and_path_pass() {
        for arn in [
            "arn:aws:iam::123456789012:role/sqs-reader",
            "arn:aws-cn:iam::123456789012:role/team/app/reader",
            "arn:aws-us-gov:iam::123456789012:role/a+b=c,d.e@f_g-h",
        ] {
            assert_eq!(role(arn).check(), Ok(()), "{arn}");
        }
    }

    #[test]
    fn other_arns_are_refused_naming_the_key_and_the_shape() {
        for arn in [
            "",
            "sqs-reader",
            "arn:aws:iam::12345678901:role/short-account",
            "arn:aws:iam::123456789012:user/not-a-role",
            "arn:aws:sts::123456789012:role/wrong-service",
            "arn:aws:iam:eu-west-1:123456789012:role/regional",
            "arn:azure:iam::123456789012:role/partition",
            "arn:aws:iam::123456789012:role/",
            "arn:aws:iam::123456789012:role/trailing/",
            "arn:aws:iam::123456789012:role/sp ace",
            &format!("arn:aws:iam::123456789012:role/{}", "n".repeat(65)),
        ] {
            let (key, problem) = role(arn).check().unwrap_err();
            assert_eq!(key, "role_arn", "{arn}");
            assert!(
                problem.contains("arn:aws:iam::<12-digit account>:role/"),
                "{problem}"
            );
        }
    }

    #[test]
    fn external_ids_and_session_names_follow_sts_patterns_and_lengths() {
        let with = |external_id: Option<&str>, session_name: Option<&str>| RoleConfig {
            external_id: external_id.map(str::to_string),
            session_name: session_name.map(str::to_string),
            ..role("arn:aws:iam::123456789012:role/r")
        };
        assert_eq!(
            with(Some("a1:b/c=d,e.f@g-h+i_j"), Some("s=,.@-+_1")).check(),
            Ok(())
        );
        let refused = [
            (
                with(Some("x"), None),
                "role_external_id",
                "1 characters long",
            ),
            (
                with(Some(&"x".repeat(1225)), None),
                "role_external_id",
                "1225",
            ),
            (with(Some("secret value"), None), "role_external_id", "' '"),
            (with(None, Some("s")), "role_session_name", "2 to 64"),
            (with(None, Some(&"s".repeat(65))), "role_session_name", "65"),
            (with(None, Some("a/b")), "role_session_name", "'/'"),
        ];
        for (role, key, says) in refused {
            let (k, problem) = role.check().unwrap_err();
            assert_eq!(k, key, "{problem}");
            assert!(problem.contains(says), "{problem}");
            assert!(
                !problem.contains("secret"),
                "the external id is not quoted: {problem}"
            );
        }
    }

    #[test]
    fn the_default_session_name_names_the_table_within_64_characters() {
        let r = role("arn:aws:iam::123456789012:role/r");
        assert_eq!(r.session_name("orders"), "sqs-flight-orders");
        let long = r.session_name(&"t".repeat(200));
        assert_eq!(long.len(), 64);
        assert!(long.starts_with("sqs-flight-ttt"));
        let named = RoleConfig {
            session_name: Some("audit-me".into()),
            ..r
        };
        assert_eq!(named.session_name("orders"), "audit-me");
        assert!(
            !format!(
                "{:?}",
                RoleConfig {
                    external_id: Some("hush".into()),
                    ..named
                }
            )
            .contains("hush")
        );
    }
}
