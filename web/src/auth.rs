//! Who may use the HTTP API: when users exist (the same users as MQTT), every request but
//! the console's static files, `/health`, `/mqtt` (which checks MQTT logins itself) and the
//! login endpoint needs credentials: HTTP Basic, or the session cookie the console gets from
//! `POST /v1/session`. With no users the API is open; it then listens on loopback only
//! (`Config::validate` refuses anything else).
//!
//! Passwords are argon2 hashes, slow to check by design, so a verified Basic credential is
//! remembered (as a keyed hash, never the password) for a few minutes: a program sending
//! thousands of queries a second pays the check once.

use crate::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a console login lasts without use.
const SESSION_IDLE: Duration = Duration::from_secs(12 * 3600);
/// How long a verified Basic credential is trusted without checking its hash again.
const BASIC_TTL: Duration = Duration::from_secs(300);
/// The console's session cookie.
const COOKIE: &str = "sluice_session";
/// Remembered sessions or credentials beyond which the oldest are forgotten.
const MAX_REMEMBERED: usize = 10_000;

/// The users (the broker's: `[[user]]` entries and `CREATE USER`).
pub trait Authenticator: Send + Sync + 'static {
    /// Whether any user exists, so that requests need credentials.
    fn required(&self) -> bool;
    /// `user`'s argon2 password hash (PHC string), if there is such a user.
    fn password_hash(&self, user: &str) -> Option<String>;
    /// Whether `user` is an administrator (may manage bridges and the cluster).
    fn is_admin(&self, user: &str) -> bool;
    /// Records a failed login from `peer`; returns how long to wait before answering.
    fn login_failed(&self, _peer: std::net::IpAddr) -> Duration {
        Duration::ZERO
    }
    /// Forgets `peer`'s failed logins after a good one.
    fn login_succeeded(&self, _peer: std::net::IpAddr) {}
}

/// The address a request came from, when the server knows it.
fn peer_of(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    let info = extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()?;
    Some(info.0.ip())
}

/// Who made a request (`None`: nobody needs to log in), for the handlers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Caller(pub(crate) Option<String>);

/// No users, no checks (tests of other layers, embedded use).
#[derive(Debug)]
pub struct Open;

impl Authenticator for Open {
    fn required(&self) -> bool {
        false
    }
    fn password_hash(&self, _: &str) -> Option<String> {
        None
    }
    fn is_admin(&self, _: &str) -> bool {
        true
    }
}

/// Password checks running at once: each takes argon2's memory (about 19 MiB) and a core
/// for tens of milliseconds, so a flood of wrong passwords must queue, not pile up.
static CHECKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Whether `password` matches `hash` (off the async threads: argon2 is slow by design).
pub(crate) async fn matches(hash: String, password: String) -> bool {
    let Ok(_permit) = CHECKS.acquire().await else {
        return false;
    };
    tokio::task::spawn_blocking(move || {
        use argon2::PasswordVerifier;
        argon2::PasswordHash::new(&hash).is_ok_and(|h| {
            argon2::Argon2::default()
                .verify_password(password.as_bytes(), &h)
                .is_ok()
        })
    })
    .await
    .unwrap_or(false)
}

/// Logins and remembered credentials. Each remembers the password hash it was checked
/// against, so a changed password or a dropped user ends it at once.
pub(crate) struct Gate {
    auth: Arc<dyn Authenticator>,
    /// Session token -> (user, hash, last use).
    sessions: parking_lot::Mutex<HashMap<String, (String, String, Instant)>>,
    /// Keyed hash of (user, password, password hash) -> when it was verified.
    basic: parking_lot::Mutex<HashMap<u64, Instant>>,
    keys: RandomState,
}

impl Gate {
    pub(crate) fn new(auth: Arc<dyn Authenticator>) -> Self {
        Self {
            auth,
            sessions: Default::default(),
            basic: Default::default(),
            keys: RandomState::new(),
        }
    }

    /// The user a request is made as: `Ok(None)` when no credentials are needed.
    async fn user(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Option<String>, ApiError> {
        let found = self.credentials(headers).await;
        if let Some(peer) = peer {
            match &found {
                Ok(Some(_)) => self.auth.login_succeeded(peer),
                Ok(None) => {}
                Err(_) => tokio::time::sleep(self.auth.login_failed(peer)).await,
            }
        }
        found
    }

    /// The user the request's credentials name, if they are right.
    async fn credentials(&self, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
        if !self.auth.required() {
            return Ok(None);
        }
        if let Some(token) = cookie(headers, COOKIE) {
            let mut sessions = self.sessions.lock();
            if let Some((user, hash, used)) = sessions.get_mut(token)
                && used.elapsed() < SESSION_IDLE
                && self.auth.password_hash(user).as_ref() == Some(hash)
            {
                *used = Instant::now();
                return Ok(Some(user.clone()));
            }
        }
        if let Some((user, password)) = basic(headers) {
            let Some(hash) = self.auth.password_hash(&user) else {
                return Err(unauthorized("wrong user or password"));
            };
            let key = self.keys.hash_one((&user, &password, &hash));
            if let Some(at) = self.basic.lock().get(&key)
                && at.elapsed() < BASIC_TTL
            {
                return Ok(Some(user));
            }
            if matches(hash, password).await {
                let mut basic = self.basic.lock();
                forget_oldest(&mut basic, |at| *at);
                basic.insert(key, Instant::now());
                return Ok(Some(user));
            }
            return Err(unauthorized("wrong user or password"));
        }
        Err(unauthorized(
            "credentials needed: HTTP Basic, or log in at POST /v1/session",
        ))
    }
}

/// Makes room in a full map by forgetting its least recently used entry.
fn forget_oldest<K: Clone + std::hash::Hash + Eq, V>(
    map: &mut HashMap<K, V>,
    used: impl Fn(&V) -> Instant,
) {
    if map.len() >= MAX_REMEMBERED
        && let Some(k) = map
            .iter()
            .min_by_key(|(_, v)| used(v))
            .map(|(k, _)| k.clone())
    {
        map.remove(&k);
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `Authorization: Basic base64(user:password)`, or InfluxDB's `Token user:password` (what
/// its client libraries send, the token being a Sluice user and password).
fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    use base64::Engine;
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, b64) = v.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("token") {
        let (u, p) = b64.trim().split_once(':')?;
        return Some((u.to_string(), p.to_string()));
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// InfluxDB 1.x clients may send their credentials on `/write` as `?u=USER&p=PASSWORD`:
/// they count as `Authorization: Token USER:PASSWORD` when no header is sent.
fn v1_credentials(request: &mut Request) {
    type Params = std::collections::HashMap<String, String>;
    if request.uri().path() != "/write" || request.headers().contains_key(header::AUTHORIZATION) {
        return;
    }
    let Ok(q) = axum::extract::Query::<Params>::try_from_uri(request.uri()) else {
        return;
    };
    if let (Some(u), Some(p)) = (q.get("u"), q.get("p"))
        && let Ok(v) = HeaderValue::from_str(&format!("Token {u}:{p}"))
    {
        request.headers_mut().insert(header::AUTHORIZATION, v);
    }
}

/// Paths anyone may reach.
fn open_path(path: &str) -> bool {
    path == "/"
        || path.starts_with("/assets/")
        || path == "/v1/session"
        || path == "/health"
        || path == "/mqtt"
        || path == "/favicon.ico"
}

/// Routes for administrators only: bridges and the cluster.
fn admin_path(path: &str) -> bool {
    ["/v1/bridges", "/v1/cluster"].iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|r| r.is_empty() || r.starts_with('/'))
    })
}

/// Whether a browser sent this from another site's page (`Sec-Fetch-Site`, which browsers
/// set and pages cannot forge). Programs send no such header.
fn cross_site(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .is_some_and(|v| v != "same-origin" && v != "none")
}

/// The middleware: refuses requests without valid credentials when users exist, and
/// requests that change something when another site's page makes them (so a page cannot
/// use the open loopback API, or credentials the browser remembers).
pub(crate) async fn check(
    State(gate): State<Arc<Gate>>,
    mut request: Request,
    next: Next,
) -> Response {
    let method = request.method();
    if method != axum::http::Method::GET
        && method != axum::http::Method::HEAD
        && cross_site(request.headers())
    {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_site",
            "requests from another site's page may only read",
        )
        .into_response();
    }
    if open_path(request.uri().path()) {
        return next.run(request).await;
    }
    v1_credentials(&mut request);
    let peer = peer_of(request.extensions());
    match gate.user(request.headers(), peer).await {
        Ok(Some(user)) if admin_path(request.uri().path()) && !gate.auth.is_admin(&user) => {
            tracing::warn!(%user, path = %request.uri().path(), "access refused: needs the admin role");
            ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "user '{user}' may not manage bridges or the cluster: needs the admin role"
                ),
            )
            .into_response()
        }
        Ok(user) => {
            request.extensions_mut().insert(Caller(user));
            next.run(request).await
        }
        Err(e) => {
            let mut r = e.into_response();
            // Programs get the standard challenge; the console shows its own form instead
            // of the browser's dialog, so its requests (same-origin, or marked) get none.
            let h = request.headers();
            let console = h.contains_key("x-sluice-console")
                || h.get("sec-fetch-site").is_some_and(|v| v == "same-origin");
            if !console {
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"sluice\""),
                );
            }
            r
        }
    }
}

#[derive(serde::Deserialize)]
pub(crate) struct Login {
    user: String,
    password: String,
}

/// `GET /v1/session`: whether a login is needed and who is logged in.
pub(crate) async fn whoami(State(gate): State<Arc<Gate>>, headers: HeaderMap) -> Response {
    let required = gate.auth.required();
    let user = gate.credentials(&headers).await.ok().flatten();
    axum::Json(serde_json::json!({"auth_required": required, "user": user})).into_response()
}

/// `POST /v1/session` `{"user", "password"}`: 204 with the session cookie, or 401.
pub(crate) async fn login(
    State(gate): State<Arc<Gate>>,
    request: Request,
) -> Result<Response, ApiError> {
    let peer = peer_of(request.extensions());
    let body = axum::body::to_bytes(request.into_body(), 64 * 1024)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "login too large",
            )
        })?;
    let login: Login = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("expected {{\"user\": \"...\", \"password\": \"...\"}}: {e}"),
        )
    })?;
    let hash = gate.auth.password_hash(&login.user);
    let ok = match hash.clone() {
        Some(h) => matches(h, login.password).await,
        None => false,
    };
    let (Some(hash), true) = (hash, ok) else {
        tracing::info!(user = %login.user, "console login refused");
        if let Some(peer) = peer {
            tokio::time::sleep(gate.auth.login_failed(peer)).await;
        }
        return Err(unauthorized("wrong user or password"));
    };
    if let Some(peer) = peer {
        gate.auth.login_succeeded(peer);
    }
    let token = sluice_engine::hex::encode(&random_bytes()?);
    {
        let mut sessions = gate.sessions.lock();
        sessions.retain(|_, (_, _, used)| used.elapsed() < SESSION_IDLE);
        forget_oldest(&mut sessions, |(_, _, used)| *used);
        sessions.insert(token.clone(), (login.user, hash, Instant::now()));
    }
    let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
    Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response())
}

/// `DELETE /v1/session`: logs out.
pub(crate) async fn logout(State(gate): State<Arc<Gate>>, headers: HeaderMap) -> Response {
    if let Some(token) = cookie(&headers, COOKIE) {
        gate.sessions.lock().remove(token);
    }
    let expired = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, expired)]).into_response()
}

fn random_bytes() -> Result<[u8; 16], ApiError> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| ApiError::internal(format!("no randomness for a session token: {e}")))?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_read_from_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; sluice_session=abc"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        // "ana:s3:cret" in base64: the password may hold colons.
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic YW5hOnMzOmNyZXQ="),
        );
        assert_eq!(basic(&h), Some(("ana".into(), "s3:cret".into())));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Token gw:s3"),
        );
        assert_eq!(basic(&h), Some(("gw".into(), "s3".into())));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert_eq!(basic(&h), None);
        assert!(open_path("/assets/app.js") && !open_path("/v1/sql"));
        assert!(admin_path("/v1/bridges") && admin_path("/v1/cluster/nodes/2"));
        assert!(!admin_path("/v1/bridgesx") && !admin_path("/v1/sql"));
        assert!(!cross_site(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_site(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(!cross_site(&h));
    }
}
