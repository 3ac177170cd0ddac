//! MQTT logins: a CONNECT's user name and password checked against the users the engine
//! knows (`[[user]]` and `CREATE USER`, argon2 hashes). What a logged-in user may then do
//! is the engine's one decision ([`sluice_engine::access`]), asked through
//! [`Logins::authorize`].

use argon2::PasswordVerifier;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Login};
use sluice_engine::Logins;
use sluice_engine::access::Need;
use std::sync::Arc;

/// The user a CONNECT from `peer` logs in as (`None`: anonymous, allowed only when no user
/// exists). A refusal is counted and, after a few from the same address, answered late
/// ([`sluice_engine::access::LoginFailures`]).
pub(crate) async fn login(
    login: Option<Login>,
    db: &dyn Logins,
    peer: std::net::IpAddr,
) -> Result<Option<Arc<str>>, ConnectReturnCode> {
    let outcome = check(login, db).await;
    match outcome {
        Ok(Some(_)) => db.logins().succeeded(peer),
        Ok(None) => {}
        Err(_) => tokio::time::sleep(db.logins().failed(peer)).await,
    }
    outcome
}

/// The user a CONNECT's credentials name, if they are right. Password checks run off the
/// async threads (argon2 is slow by design).
async fn check(
    login: Option<Login>,
    db: &dyn Logins,
) -> Result<Option<Arc<str>>, ConnectReturnCode> {
    if !db.has_users() {
        // Nobody can be verified, so nobody is anybody: rules for `anonymous` and `*` apply.
        return Ok(None);
    }
    let Some(login) = login else {
        return Err(ConnectReturnCode::NotAuthorized);
    };
    let Some(hash) = db.password_hash(&login.username) else {
        return Err(ConnectReturnCode::BadUserNamePassword);
    };
    let password = login.password;
    let ok = tokio::task::spawn_blocking(move || {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), hash.as_str())
            .is_ok()
    })
    .await
    .unwrap_or(false);
    match ok {
        true => Ok(Some(Arc::from(login.username.as_str()))),
        false => Err(ConnectReturnCode::BadUserNamePassword),
    }
}

/// Whether a session of `user` may be sent a message on `topic`: the subscribe rules are
/// decided for each message delivered (as Mosquitto's read ACL), so a subscription to `#`
/// gets nothing from a denied `secret/#`.
pub(crate) fn may_receive(db: &dyn Logins, user: Option<&str>, topic: &str) -> bool {
    !db.has_rules() || db.authorize(user, Need::Receive(topic)).is_ok()
}
