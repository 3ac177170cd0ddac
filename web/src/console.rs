//! The web console: plain HTML, CSS and JavaScript modules from `web/assets/`, compiled into
//! the binary so that running Sluice needs no build step, no CDN and no internet. `/` is the
//! page; `/assets/<name>` the rest. Pages talk to the same HTTP API as any program.

use axum::Router;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// (name, content type, text) of every asset.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../assets/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../assets/style.css"),
    ),
    ("app.js", JS, include_str!("../assets/app.js")),
    ("api.js", JS, include_str!("../assets/api.js")),
    ("chart.js", JS, include_str!("../assets/chart.js")),
    ("scale.js", JS, include_str!("../assets/scale.js")),
    ("sql.js", JS, include_str!("../assets/sql.js")),
    ("catalog.js", JS, include_str!("../assets/catalog.js")),
    ("live.js", JS, include_str!("../assets/live.js")),
    ("alerts.js", JS, include_str!("../assets/alerts.js")),
    ("cluster.js", JS, include_str!("../assets/cluster.js")),
];

const JS: &str = "text/javascript; charset=utf-8";

fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        // Assets change with the binary; a browser must not keep last version's scripts.
        Some((_, ct, text)) => (
            [
                (header::CONTENT_TYPE, *ct),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *text,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// `/` and `/assets/{name}`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset("index.html") }))
        .route(
            "/assets/{name}",
            get(|Path(name): Path<String>| async move { asset(&name) }),
        )
}
