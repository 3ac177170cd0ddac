//! `[[user]]` and `[[acl]]`: who may connect, and what each may publish, subscribe to and
//! write.

use serde::{Deserialize, Serialize};

/// One `[[user]]`: a name and an argon2 password hash (PHC string, from
/// `sluice hash-password`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// User name (the MQTT CONNECT user name).
    pub name: String,
    /// `$argon2id$v=19$...`; never the password itself.
    pub password_hash: String,
    /// `admin` (the default for configured users: manages users, grants, databases, tables,
    /// bridges and the cluster, and reads and writes everything) or `user` (reads and writes
    /// only the databases granted with `GRANT`).
    #[serde(default = "admin_role")]
    pub role: String,
}

fn admin_role() -> String {
    "admin".into()
}

/// One `[[acl]]` rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    /// A user name, `*` for everyone, or `anonymous` for connections without a user.
    pub user: String,
    /// `publish` or `subscribe` (topic filters), `write` (tables), or `all`.
    pub action: String,
    /// For publish/subscribe a topic filter (`+`/`#` allowed); for write `db.table`, `db.*`
    /// or `*`.
    pub filter: String,
    /// Allow or refuse what the rule matches.
    pub allow: bool,
}
