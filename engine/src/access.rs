//! Who may do what: the one authorization decision every path asks ([`Access::check`]):
//! MQTT CONNECT, PUBLISH, SUBSCRIBE and each delivery, HTTP writes, every SQL statement,
//! alerts (run with their creator's rights) and the HTTP administration routes.
//!
//! Users come from `[[user]]` (with a role, `admin` by default) and `CREATE USER [ADMIN]`
//! (plain by default). An administrator may do everything; a plain user reads and writes the
//! databases granted to it (`GRANT SELECT|INSERT|ALL ON DATABASE db TO user`, kept in the
//! catalog, so replicated in a cluster). `[[acl]]` rules on topics and tables apply to
//! everyone on top of that, first match wins. Without any user (loopback only) there is
//! nobody to tell apart: the anonymous caller is an administrator, and `[[acl]]` rules for
//! `anonymous` and `*` still apply.
//!
//! A refusal is logged with who, what and the rule or missing right that decided it, and
//! counted by kind (`sluice_access_refusals_total` in `/metrics`).

use crate::error::{Error, Result};
use crate::store::catalog::CatalogData;
use serde::{Deserialize, Serialize};
use sluice_conf::{AclRule, UserConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a caller asks to do.
#[derive(Debug, Clone, Copy)]
pub enum Need<'a> {
    /// Publish on a topic (`[[acl]]` publish rules).
    Publish(&'a str),
    /// Subscribe with a filter (`[[acl]]` subscribe rules, matched against the filter).
    Subscribe(&'a str),
    /// Be sent a message on a topic (`[[acl]]` subscribe rules, decided per delivered
    /// message). Counted, not logged: there may be many.
    Receive(&'a str),
    /// Store rows into a table: INSERT on its database, and `[[acl]]` write rules.
    Insert {
        /// Database.
        database: &'a str,
        /// Table.
        table: &'a str,
    },
    /// Read a database's tables (SELECT).
    Select(&'a str),
    /// Administer (users, grants, databases, tables, bridges, the cluster): what is done.
    Admin(&'a str),
}

impl Need<'_> {
    /// The kind, as `/metrics` labels it.
    fn kind(&self) -> usize {
        match self {
            Need::Publish(_) => 0,
            Need::Subscribe(_) => 1,
            Need::Receive(_) => 2,
            Need::Insert { .. } => 3,
            Need::Select(_) => 4,
            Need::Admin(_) => 5,
        }
    }
}

/// The user name a bridge's messages are stored as: `bridge:<name>`.
pub const BRIDGE_PREFIX: &str = "bridge:";

const KINDS: [&str; 6] = [
    "publish",
    "subscribe",
    "deliver",
    "insert",
    "select",
    "admin",
];

/// A plain user's rights on one database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rights {
    /// May read its tables.
    pub select: bool,
    /// May store rows into its tables.
    pub insert: bool,
}

impl Rights {
    /// `SELECT`, `INSERT`, `ALL` as SHOW GRANTS writes them.
    pub fn names(&self) -> &'static str {
        match (self.select, self.insert) {
            (true, true) => "ALL",
            (true, false) => "SELECT",
            (false, true) => "INSERT",
            (false, false) => "",
        }
    }
}

/// Failures forgiven (no delay) before an address is slowed down.
const FREE_FAILURES: u32 = 3;
/// The longest delay a failed login gets.
const MAX_LOGIN_DELAY: std::time::Duration = std::time::Duration::from_secs(5);
/// How long an address's failures are remembered after its last one.
const FAILURES_KEPT: std::time::Duration = std::time::Duration::from_secs(600);
/// Addresses remembered at most (the oldest are forgotten first).
const MAX_ADDRESSES: usize = 100_000;

/// Failed logins by source address: past a few, each further failure from the same address
/// is answered later (doubling up to [`MAX_LOGIN_DELAY`]), so guessing passwords from one
/// address is slow whatever the protocol; a success forgets the address.
#[derive(Debug, Default)]
pub struct LoginFailures {
    by_address: parking_lot::Mutex<HashMap<std::net::IpAddr, (u32, std::time::Instant)>>,
    total: AtomicU64,
}

impl LoginFailures {
    /// Records a failed login from `address`; returns how long to wait before answering.
    pub fn failed(&self, address: std::net::IpAddr) -> std::time::Duration {
        self.total.fetch_add(1, Ordering::Relaxed);
        let now = std::time::Instant::now();
        let mut map = self.by_address.lock();
        if map.len() >= MAX_ADDRESSES {
            map.retain(|_, (_, last)| now.duration_since(*last) < FAILURES_KEPT);
            if map.len() >= MAX_ADDRESSES {
                map.clear();
            }
        }
        let entry = map.entry(address).or_insert((0, now));
        if now.duration_since(entry.1) >= FAILURES_KEPT {
            entry.0 = 0;
        }
        *entry = (entry.0.saturating_add(1), now);
        let past = entry.0.saturating_sub(FREE_FAILURES);
        match past {
            0 => std::time::Duration::ZERO,
            n => (std::time::Duration::from_millis(100) * 2u32.saturating_pow(n.min(16) - 1))
                .min(MAX_LOGIN_DELAY),
        }
    }

    /// Forgets `address`'s failures after a successful login.
    pub fn succeeded(&self, address: std::net::IpAddr) {
        self.by_address.lock().remove(&address);
    }

    /// Failed logins since start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// A configured user.
#[derive(Debug)]
struct Configured {
    hash: String,
    admin: bool,
}

/// Users, roles, grants and rules, and the refusals counted.
#[derive(Debug, Default)]
pub struct Access {
    configured: HashMap<String, Configured>,
    rules: Vec<AclRule>,
    refused: [AtomicU64; 6],
    /// Failed logins, on every protocol.
    pub logins: LoginFailures,
}

impl Access {
    /// Checks every password hash parses, so a typo fails at start, not at first login.
    pub fn new(users: &[UserConfig], rules: &[AclRule]) -> Result<Self> {
        let mut configured = HashMap::new();
        for u in users {
            argon2::PasswordHash::new(&u.password_hash).map_err(|e| {
                Error::invalid(format!(
                    "user {:?}: password_hash is not an argon2 PHC string: {e}",
                    u.name
                ))
            })?;
            let admin = u.role != "user";
            let hash = u.password_hash.clone();
            configured.insert(u.name.clone(), Configured { hash, admin });
        }
        Ok(Self {
            configured,
            rules: rules.to_vec(),
            refused: Default::default(),
            logins: LoginFailures::default(),
        })
    }

    /// `user`'s argon2 password hash, from `[[user]]` or `CREATE USER`.
    pub(crate) fn password_hash(&self, cat: &CatalogData, user: &str) -> Option<String> {
        match self.configured.get(user) {
            Some(c) => Some(c.hash.clone()),
            None => cat.users.get(user).cloned(),
        }
    }

    /// Whether any user exists, so that every caller must log in.
    pub(crate) fn required(&self, cat: &CatalogData) -> bool {
        !self.configured.is_empty() || !cat.users.is_empty()
    }

    /// Whether a user of that name exists.
    pub(crate) fn exists(&self, cat: &CatalogData, user: &str) -> bool {
        self.configured.contains_key(user) || cat.users.contains_key(user)
    }

    /// Whether the user was configured (`[[user]]`), so SQL cannot change or drop it.
    pub(crate) fn configured(&self, user: &str) -> bool {
        self.configured.contains_key(user)
    }

    /// Whether `user` is an administrator (`None`, the anonymous caller of a server without
    /// users, or the server itself, is).
    pub(crate) fn is_admin(&self, cat: &CatalogData, user: Option<&str>) -> bool {
        let Some(user) = user else { return true };
        match self.configured.get(user) {
            Some(c) => c.admin,
            None => cat.admins.contains(user),
        }
    }

    /// Whether an `[[acl]]` rule exists (without rules only roles and grants decide).
    pub(crate) fn has_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// `user`'s rights on `database` (everything for an administrator).
    pub(crate) fn rights(&self, cat: &CatalogData, user: Option<&str>, database: &str) -> Rights {
        if self.is_admin(cat, user) {
            return Rights {
                select: true,
                insert: true,
            };
        }
        let granted = user.and_then(|u| cat.grants.get(u)?.get(database));
        granted.copied().unwrap_or_default()
    }

    /// Whether `user` may do what `need` says; a refusal says which right or rule is
    /// missing, and is logged and counted. `cat` is asked for only when roles or grants
    /// decide (never for the anonymous caller or a configured administrator).
    pub(crate) fn check(
        &self,
        cat: impl FnOnce() -> std::sync::Arc<CatalogData>,
        user: Option<&str>,
        need: Need<'_>,
    ) -> Result<()> {
        let refusal = match self.decide(cat, user, need) {
            None => return Ok(()),
            Some(r) => r,
        };
        self.refused[need.kind()].fetch_add(1, Ordering::Relaxed);
        let who = user.unwrap_or("anonymous");
        if !matches!(need, Need::Receive(_)) {
            tracing::warn!(user = who, ?need, why = %refusal, "access refused");
        }
        Err(Error::Denied {
            message: format!("user '{who}' may not {}: {refusal}", describe(&need)),
        })
    }

    /// Why `need` is refused, or `None` when it is allowed.
    fn decide(
        &self,
        cat: impl FnOnce() -> std::sync::Arc<CatalogData>,
        user: Option<&str>,
        need: Need<'_>,
    ) -> Option<String> {
        self.privilege_refusal(cat, user, need)
            .or_else(|| self.rule_refusal(user, need))
    }

    /// Why the user's role and grants refuse `need`, if they do.
    fn privilege_refusal(
        &self,
        cat: impl FnOnce() -> std::sync::Arc<CatalogData>,
        user: Option<&str>,
        need: Need<'_>,
    ) -> Option<String> {
        // The anonymous caller (no users exist) and the server itself are administrators, and
        // so are bridges (`bridge:<name>`, made by an administrator): [[acl]] rules alone
        // limit them.
        let user = user.filter(|u| !u.starts_with(BRIDGE_PREFIX))?;
        // Topics are governed by the [[acl]] rules alone.
        if matches!(
            need,
            Need::Publish(_) | Need::Subscribe(_) | Need::Receive(_)
        ) || self.configured.get(user).is_some_and(|c| c.admin)
        {
            return None;
        }
        let cat = cat();
        if self.is_admin(&cat, Some(user)) {
            return None;
        }
        match need {
            Need::Admin(_) => Some("needs the admin role".into()),
            Need::Select(db) => (!self.rights(&cat, Some(user), db).select)
                .then(|| format!("missing SELECT on database '{db}' (GRANT SELECT ON DATABASE {db} TO {user})")),
            Need::Insert { database: db, .. } => (!self.rights(&cat, Some(user), db).insert)
                .then(|| format!("missing INSERT on database '{db}' (GRANT INSERT ON DATABASE {db} TO {user})")),
            _ => None,
        }
    }

    /// Why an `[[acl]]` rule refuses `need`, if one does.
    fn rule_refusal(&self, user: Option<&str>, need: Need<'_>) -> Option<String> {
        if self.rules.is_empty() {
            return None;
        }
        let (action, name, table);
        match need {
            Need::Publish(t) => (action, name) = ("publish", t),
            Need::Subscribe(f) | Need::Receive(f) => (action, name) = ("subscribe", f),
            Need::Insert { database, table: t } => {
                table = format!("{database}.{t}");
                (action, name) = ("write", table.as_str());
            }
            Need::Select(_) | Need::Admin(_) => return None,
        }
        let rule = self.rule(user, action, name).filter(|r| !r.allow)?;
        Some(format!(
            "refused by the [[acl]] rule user = {:?}, action = {:?}, filter = {:?}",
            rule.user, rule.action, rule.filter
        ))
    }

    /// The first rule for `user` and `action` that matches `name`.
    fn rule(&self, user: Option<&str>, action: &str, name: &str) -> Option<&AclRule> {
        self.rules.iter().find(|r| {
            let who = match r.user.as_str() {
                "*" => true,
                "anonymous" => user.is_none(),
                u => user == Some(u),
            };
            let what = r.action == "all" || r.action == action;
            who && what
                && match action {
                    "write" => table_matches(&r.filter, name),
                    // A subscription filter is matched literally against the rule's filter.
                    _ => r.filter == name || topic_matches(&r.filter, name),
                }
        })
    }

    /// The refusals so far, in Prometheus text.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        out.push_str(
            "# HELP sluice_access_refusals_total Actions refused by a role, a missing grant \
             or an [[acl]] rule.\n# TYPE sluice_access_refusals_total counter\n",
        );
        for (kind, n) in KINDS.iter().zip(&self.refused) {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(out, "sluice_access_refusals_total{{action=\"{kind}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP sluice_login_failures_total Logins refused (wrong user or password), MQTT and HTTP.\n\
             # TYPE sluice_login_failures_total counter\nsluice_login_failures_total {}",
            self.logins.total()
        );
    }
}

fn describe(need: &Need<'_>) -> String {
    match need {
        Need::Publish(t) => format!("publish to '{t}'"),
        Need::Subscribe(f) => format!("subscribe to '{f}'"),
        Need::Receive(t) => format!("receive messages on '{t}'"),
        Need::Insert { database, table } => format!("write to '{database}.{table}'"),
        Need::Select(db) => format!("read database '{db}'"),
        Need::Admin(what) => what.to_string(),
    }
}

fn table_matches(pattern: &str, table: &str) -> bool {
    match pattern.strip_suffix(".*") {
        _ if pattern == "*" || pattern == table => true,
        Some(db) => table.split_once('.').is_some_and(|(d, _)| d == db),
        None => false,
    }
}

/// Whether MQTT topic filter `filter` matches `topic` (topics starting with `$` are not
/// matched by a wildcard in the first level).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut t = topic.split('/');
    for f in filter.split('/') {
        match (f, t.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (f, Some(level)) if f == level => {}
            _ => return false,
        }
    }
    t.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rule(user: &str, action: &str, filter: &str, allow: bool) -> AclRule {
        AclRule {
            user: user.into(),
            action: action.into(),
            filter: filter.into(),
            allow,
        }
    }

    fn user(name: &str, role: &str) -> UserConfig {
        UserConfig {
            name: name.into(),
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
                .into(),
            role: role.into(),
        }
    }

    #[test]
    fn failed_logins_slow_their_address_down() {
        let f = LoginFailures::default();
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let delays: Vec<u128> = (0..8).map(|_| f.failed(a).as_millis()).collect();
        assert_eq!(delays, vec![0, 0, 0, 100, 200, 400, 800, 1600]);
        assert_eq!(f.failed(b), std::time::Duration::ZERO);
        for _ in 0..20 {
            f.failed(a);
        }
        assert_eq!(f.failed(a), MAX_LOGIN_DELAY);
        f.succeeded(a);
        assert_eq!(f.failed(a), std::time::Duration::ZERO);
        assert_eq!(f.total(), 31);
    }

    #[test]
    fn first_matching_rule_decides() {
        let a = Access::new(
            &[],
            &[
                rule("*", "subscribe", "test/nosubscribe", false),
                rule("alice", "all", "secret/#", true),
                rule("*", "all", "secret/#", false),
                rule("anonymous", "write", "plant.*", false),
            ],
        )
        .unwrap();
        let cat = || Arc::new(CatalogData::default());
        let ok = |user, need| a.check(cat, user, need).is_ok();
        assert!(!ok(None, Need::Subscribe("test/nosubscribe")));
        assert!(ok(None, Need::Publish("test/nosubscribe")));
        assert!(ok(Some("alice"), Need::Subscribe("secret/x")));
        assert!(!ok(Some("bridge:b"), Need::Publish("secret/x")));
        let insert = |database| Need::Insert {
            database,
            table: "t",
        };
        assert!(!ok(None, insert("plant")));
        assert!(ok(Some("bridge:b"), insert("plant")));
        assert!(ok(None, insert("other")));
        assert!(!ok(None, Need::Receive("secret/a")));
    }

    #[test]
    fn roles_and_grants_decide_databases_and_administration() {
        let a = Access::new(&[user("root", "admin"), user("dev", "user")], &[]).unwrap();
        let mut cat = CatalogData::default();
        cat.users.insert("sql".into(), "h".into());
        cat.users.insert("boss".into(), "h".into());
        cat.admins.insert("boss".into());
        let plant = Rights {
            select: true,
            insert: false,
        };
        cat.grants
            .insert("dev".into(), [("plant".to_string(), plant)].into());
        let cat = Arc::new(cat);
        let ok = |user, need| a.check(|| cat.clone(), Some(user), need).is_ok();
        for admin in ["root", "boss"] {
            assert!(ok(admin, Need::Admin("manage users")));
            assert!(ok(admin, Need::Select("hr")));
        }
        assert!(ok("dev", Need::Select("plant")));
        let e = a.check(|| cat.clone(), Some("dev"), Need::Select("hr"));
        let e = e.unwrap_err().to_string();
        assert!(e.contains("missing SELECT on database 'hr'"), "{e}");
        let insert = Need::Insert {
            database: "plant",
            table: "t",
        };
        assert!(!ok("dev", insert));
        assert!(!ok("dev", Need::Admin("create tables")));
        assert!(!ok("sql", Need::Select("plant")));
        // Topics are left to the rules.
        assert!(ok("sql", Need::Publish("a/b")));
        let mut text = String::new();
        a.render_metrics(&mut text);
        assert!(text.contains("action=\"select\"} 2"), "{text}");
        assert!(text.contains("action=\"admin\"} 1"), "{text}");
    }
}
