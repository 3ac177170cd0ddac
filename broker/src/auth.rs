//! Who may connect (users with argon2 password hashes) and what they may do (ACL rules on
//! topic filters and tables, first match wins, allowed when no rule matches).

use crate::error::{Error, Result};
use crate::topic;
use argon2::PasswordVerifier;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Login};
use sluice_conf::{AclRule, UserConfig};
use sluice_engine::Logins;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a rule governs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Publish = 0,
    Subscribe = 1,
    /// Storing rows into a table.
    Write = 2,
}

/// Users and rules.
#[derive(Debug, Default)]
pub(crate) struct Auth {
    users: HashMap<String, String>,
    rules: Vec<AclRule>,
    /// Refusals by the rules: publish, subscribe, write, and deliveries withheld.
    refused: [AtomicU64; 4],
}

impl Auth {
    /// Checks every password hash parses, so a typo fails at start, not at first login.
    pub(crate) fn new(users: &[UserConfig], rules: &[AclRule]) -> Result<Self> {
        let mut map = HashMap::new();
        for u in users {
            argon2::PasswordHash::new(&u.password_hash).map_err(|e| Error::Setup {
                what: format!("user {:?}", u.name),
                reason: format!("password_hash is not an argon2 PHC string: {e}"),
            })?;
            map.insert(u.name.clone(), u.password_hash.clone());
        }
        Ok(Self {
            users: map,
            rules: rules.to_vec(),
            refused: Default::default(),
        })
    }

    /// The user a CONNECT logs in as (`None`: anonymous, allowed only when no users are
    /// configured). Password checks run off the async threads (argon2 is slow by design).
    /// Users come from the config and from `CREATE USER` (asked of `db`).
    pub(crate) async fn login(
        &self,
        login: Option<Login>,
        db: Option<&dyn Logins>,
    ) -> std::result::Result<Option<Arc<str>>, ConnectReturnCode> {
        if self.users.is_empty() && !db.is_some_and(|db| db.has_users()) {
            // Nobody can be verified, so nobody is anybody: rules for `anonymous` and `*` apply.
            return Ok(None);
        }
        let Some(login) = login else {
            return Err(ConnectReturnCode::NotAuthorized);
        };
        match self.verify(&login.username, login.password, db).await {
            true => Ok(Some(Arc::from(login.username.as_str()))),
            false => Err(ConnectReturnCode::BadUserNamePassword),
        }
    }

    /// Whether any user exists (in the config or made with `CREATE USER`).
    pub(crate) fn required(&self, db: &dyn Logins) -> bool {
        !self.users.is_empty() || db.has_users()
    }

    /// `user`'s password hash, from the config or `CREATE USER`.
    pub(crate) fn password_hash(&self, user: &str, db: Option<&dyn Logins>) -> Option<String> {
        (self.users.get(user).cloned()).or_else(|| db.and_then(|db| db.password_hash(user)))
    }

    /// Whether `password` is `user`'s (checked off the async threads).
    async fn verify(&self, user: &str, password: String, db: Option<&dyn Logins>) -> bool {
        let Some(hash) = self.password_hash(user, db) else {
            return false;
        };
        tokio::task::spawn_blocking(move || {
            argon2::Argon2::default()
                .verify_password(password.as_bytes(), hash.as_str())
                .is_ok()
        })
        .await
        .unwrap_or(false)
    }

    /// Whether any ACL rule exists (without rules everything is allowed).
    pub(crate) fn has_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Whether a session of `user` may be sent a message on `topic`: the subscribe rules
    /// are decided for each message delivered (as Mosquitto's read ACL), so a subscription
    /// to `#` gets nothing from a denied `secret/#`.
    /// Counted, not logged (there may be many).
    pub(crate) fn may_receive(&self, user: Option<&str>, topic: &str) -> bool {
        if !self.has_rules()
            || self
                .rule(user, Action::Subscribe, topic)
                .is_none_or(|r| r.allow)
        {
            return true;
        }
        self.refused[3].fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Whether `user` may do `action` on `name` (a topic, a subscription filter, or
    /// `db.table`). A refusal is logged with the rule that decided it, and counted.
    pub(crate) fn allowed(&self, user: Option<&str>, action: Action, name: &str) -> bool {
        let Some(rule) = self.rule(user, action, name).filter(|r| !r.allow) else {
            return true;
        };
        self.refused[action as usize].fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            user = user.unwrap_or("anonymous"), ?action, %name,
            rule_user = %rule.user, rule_action = %rule.action, rule_filter = %rule.filter,
            "refused by an ACL rule"
        );
        false
    }

    /// The refusals so far, in Prometheus text.
    pub(crate) fn render_metrics(&self) -> String {
        let n = |i: usize| self.refused[i].load(Ordering::Relaxed);
        format!(
            "# HELP sluice_acl_refusals_total Actions refused by an [[acl]] rule.\n\
             # TYPE sluice_acl_refusals_total counter\n\
             sluice_acl_refusals_total{{action=\"publish\"}} {}\n\
             sluice_acl_refusals_total{{action=\"subscribe\"}} {}\n\
             sluice_acl_refusals_total{{action=\"write\"}} {}\n\
             sluice_acl_refusals_total{{action=\"deliver\"}} {}\n",
            n(0),
            n(1),
            n(2),
            n(3)
        )
    }

    /// The first rule for `user` and `action` that matches `name`.
    fn rule(&self, user: Option<&str>, action: Action, name: &str) -> Option<&AclRule> {
        for r in &self.rules {
            let who = match r.user.as_str() {
                "*" => true,
                "anonymous" => user.is_none(),
                u => user == Some(u),
            };
            let what = matches!(
                (r.action.as_str(), action),
                ("all", _)
                    | ("publish", Action::Publish)
                    | ("subscribe", Action::Subscribe)
                    | ("write", Action::Write)
            );
            if !(who && what) {
                continue;
            }
            let hit = match action {
                Action::Write => table_matches(&r.filter, name),
                // A subscription filter is matched literally against the rule's filter.
                _ => r.filter == name || topic::matches(&r.filter, name),
            };
            if hit {
                return Some(r);
            }
        }
        None
    }
}

fn table_matches(pattern: &str, table: &str) -> bool {
    match pattern.strip_suffix(".*") {
        _ if pattern == "*" || pattern == table => true,
        Some(db) => table.split_once('.').is_some_and(|(d, _)| d == db),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(user: &str, action: &str, filter: &str, allow: bool) -> AclRule {
        AclRule {
            user: user.into(),
            action: action.into(),
            filter: filter.into(),
            allow,
        }
    }

    #[test]
    fn first_matching_rule_decides() {
        let a = Auth::new(
            &[],
            &[
                rule("*", "subscribe", "test/nosubscribe", false),
                rule("alice", "all", "secret/#", true),
                rule("*", "all", "secret/#", false),
                rule("anonymous", "write", "plant.*", false),
            ],
        )
        .unwrap();
        assert!(!a.allowed(None, Action::Subscribe, "test/nosubscribe"));
        assert!(a.allowed(None, Action::Publish, "test/nosubscribe"));
        assert!(a.allowed(Some("alice"), Action::Subscribe, "secret/x"));
        assert!(!a.allowed(Some("bob"), Action::Publish, "secret/x"));
        assert!(!a.allowed(None, Action::Write, "plant.telemetry"));
        assert!(a.allowed(Some("bob"), Action::Write, "plant.telemetry"));
        assert!(a.allowed(None, Action::Write, "other.t"));
    }

    #[tokio::test]
    async fn passwords_are_checked_against_argon2_hashes() {
        use argon2::PasswordHasher;
        let hash = argon2::Argon2::default()
            .hash_password(b"s3cret")
            .unwrap()
            .to_string();
        let a = Auth::new(
            &[UserConfig {
                name: "gw".into(),
                password_hash: hash,
            }],
            &[],
        )
        .unwrap();
        let login = |u: &str, p: &str| Some(Login::new(u, p));
        assert_eq!(
            a.login(login("gw", "s3cret"), None)
                .await
                .unwrap()
                .as_deref(),
            Some("gw")
        );
        assert_eq!(
            a.login(login("gw", "wrong"), None).await.unwrap_err(),
            ConnectReturnCode::BadUserNamePassword
        );
        assert_eq!(
            a.login(None, None).await.unwrap_err(),
            ConnectReturnCode::NotAuthorized
        );
        assert!(
            Auth::new(
                &[UserConfig {
                    name: "x".into(),
                    password_hash: "plain".into()
                }],
                &[]
            )
            .is_err()
        );
    }
}
