//! The `sluice` binary: command line, configuration layering and wiring of the crates (the
//! engine, a cluster node when configured, the broker, the HTTP API). The bridge routes and
//! the broker's logins for HTTP live in `admin.rs`, where the two siblings meet.

mod admin;
mod tls;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice_cluster::Cluster;
use sluice_conf::Config;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "sluice", version, about = "MQTT-native IoT database")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server.
    Serve {
        /// TOML configuration file (see conf/sluice.toml); SLUICE_* variables override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides data_dir).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// HTTP listen address (overrides http.listen); port 0 picks a free port.
        #[arg(long)]
        http_listen: Option<SocketAddr>,
        /// MQTT listen address (overrides mqtt.listen); port 0 picks a free port.
        #[arg(long)]
        mqtt_listen: Option<SocketAddr>,
        /// PostgreSQL protocol listen address (overrides pg.listen); port 0 picks a free
        /// port, an empty value turns the listener off.
        #[arg(long)]
        pg_listen: Option<String>,
    },
    /// Read a password from stdin and print its argon2 hash for a [[user]] entry.
    HashPassword,
}

/// Keeps freed memory for a while before giving it back to the kernel. A steady stream of
/// small messages frees and takes memory all the time; with mimalloc's default 10 ms every
/// page went back and was faulted in again, zeroed by the kernel (a quarter of the CPU in
/// bridged ingest).
fn tune_allocator() {
    /// `mi_option_purge_delay` in mimalloc 3's `mi_option_e`.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: setting an option of the allocator is allowed at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 5_000) };
}

/// Turns transparent huge pages off for this process (as Redis does). With THP `always`,
/// every page the allocator takes from the kernel is faulted in as a 2 MiB huge page that
/// the kernel zeroes first: under a steady stream of small messages that zeroing took 38%
/// of the CPU and bridged ingest ran at a third of its speed.
fn disable_transparent_huge_pages() {
    // SAFETY: prctl with PR_SET_THP_DISABLE only sets a flag on this process.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r != 0 {
        eprintln!(
            "sluice: could not turn transparent huge pages off: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn main() -> anyhow::Result<()> {
    disable_transparent_huge_pages();
    tune_allocator();
    let (config, data_dir, http_listen, mqtt_listen, pg_listen) = match Cli::parse().command {
        Command::Serve {
            config,
            data_dir,
            http_listen,
            mqtt_listen,
            pg_listen,
        } => (config, data_dir, http_listen, mqtt_listen, pg_listen),
        Command::HashPassword => return hash_password(),
    };
    let mut cfg = match &config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    cfg.apply_env(std::env::vars())?;
    if let Some(d) = data_dir {
        cfg.data_dir = d;
    }
    if let Some(a) = http_listen {
        cfg.http.listen = a;
    }
    if let Some(a) = mqtt_listen {
        cfg.mqtt.listen = a;
    }
    if let Some(a) = pg_listen {
        cfg.pg.listen = a;
    }
    cfg.validate()?;
    // The raft library reports every vote and election at info; a cluster's log keeps its
    // warnings unless the configured filter names it.
    let raft = sluice_cluster::RAFT_LOG_TARGET;
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| match cfg.log.contains(raft) {
        true => cfg.log.clone(),
        false => format!("{},{raft}=warn", cfg.log),
    });
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(cfg))
}

fn hash_password() -> anyhow::Result<()> {
    use argon2::PasswordHasher;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let password = line.trim_end_matches(['\r', '\n']);
    anyhow::ensure!(!password.is_empty(), "no password on stdin");
    let hash = argon2::Argon2::default()
        .hash_password(password.as_bytes())
        .map_err(|e| anyhow::anyhow!("hashing: {e}"))?;
    println!("{hash}");
    Ok(())
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    let engine = sluice_engine::Engine::open(cfg.clone())
        .await
        .with_context(|| format!("opening data directory {}", cfg.data_dir.display()))?;
    let cancel = CancellationToken::new();
    let cluster = match &cfg.cluster {
        None => None,
        Some(c) => {
            let cluster = Cluster::start(c, &cfg.data_dir, &engine, cancel.clone())
                .await
                .context("starting the cluster node")?;
            println!(
                "sluice: cluster node {} listening on {}",
                c.node_id, c.listen
            );
            Some(cluster)
        }
    };
    let background = engine.spawn_background(cancel.clone());
    let ingest: Arc<dyn sluice_engine::IngestPort> = engine.clone();
    let queries: Arc<dyn sluice_engine::QueryPort> = engine.clone();
    let broker = sluice_broker::Broker::new(&cfg, ingest, cancel.clone())?;
    let mqtt = tokio::net::TcpListener::bind(cfg.mqtt.listen)
        .await
        .with_context(|| format!("binding MQTT on {}", cfg.mqtt.listen))?;
    let mqtt_addr = mqtt.local_addr()?;
    let listener = tokio::net::TcpListener::bind(cfg.http.listen)
        .await
        .with_context(|| format!("binding HTTP on {}", cfg.http.listen))?;
    let addr = listener.local_addr()?;
    // SIGTERM/SIGINT are taken over before the ready lines below: a supervisor that stops the
    // server as soon as it is up must get a clean shutdown, not the default of dying at once.
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let certificates = tls::Certificates::load(&cfg)?;
    certificates.watch(cancel.clone())?;
    tracing::info!(http = %addr, mqtt = %mqtt_addr, data_dir = %cfg.data_dir.display(), "sluice ready");
    // Lines on stdout that scripts and tests wait for (the ports are real even when 0 was
    // asked); the http line comes last.
    println!("sluice: mqtt listening on {mqtt_addr}");
    let mqtt_task = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.serve_tcp(mqtt).await })
    };
    let tls_task = if let Some(tls) = certificates.mqtt.clone() {
        let l = tokio::net::TcpListener::bind(&cfg.mqtt.tls_listen)
            .await
            .with_context(|| format!("binding MQTT/TLS on {}", cfg.mqtt.tls_listen))?;
        println!("sluice: mqtts listening on {}", l.local_addr()?);
        let broker = broker.clone();
        Some(tokio::spawn(async move { broker.serve_tls(l, tls).await }))
    } else {
        None
    };
    if !cfg.pg.listen.is_empty() {
        let l = tokio::net::TcpListener::bind(&cfg.pg.listen)
            .await
            .with_context(|| format!("binding the PostgreSQL protocol on {}", cfg.pg.listen))?;
        println!("sluice: pg listening on {}", l.local_addr()?);
        tokio::spawn(sluice_web::serve_pg(
            l,
            queries.clone(),
            Arc::new(admin::BrokerAuth(broker.clone())),
            certificates.pg.clone(),
            cfg.pg.max_connections,
            cancel.clone(),
        ));
    }
    let scheme = if certificates.http.is_some() {
        "https"
    } else {
        "http"
    };
    println!("sluice: {scheme} listening on {addr}");
    broker.start_bridges(&cfg.bridge).await;

    let signal_cancel = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        signal_cancel.cancel();
    });

    let ws: sluice_web::StreamHandler = {
        let broker = broker.clone();
        Arc::new(move |stream, peer| broker.serve_connection(stream, peer))
    };
    let routes = {
        let (broker, queries) = (broker.clone(), queries.clone());
        let cluster_routes = (cluster.clone())
            .map(|c| sluice_web::cluster_routes(c as Arc<dyn sluice_engine::ClusterAdmin>));
        sluice_web::stream_route("/mqtt", "mqtt", ws)
            .merge(admin::bridge_routes(broker.bridges().clone()))
            .merge(cluster_routes.unwrap_or_default())
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let text = broker.metrics_text() + &queries.metrics();
                    async move {
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4",
                            )],
                            text,
                        )
                    }
                }),
            )
    };
    let extras = sluice_web::Extras {
        routes,
        auth: Arc::new(admin::BrokerAuth(broker.clone())),
        live: {
            let broker = broker.clone();
            Arc::new(move || broker.live())
        },
        publish: Some({
            let broker = broker.clone();
            Arc::new(move |topic: String, payload| {
                let broker = broker.clone();
                Box::pin(async move { broker.publish(&topic, payload, "$http").await })
            })
        }),
    };
    let alerts = engine.start_alerts(broker.alert_sink(), cancel.clone());
    let https = certificates.http.clone();
    sluice_web::serve(listener, queries, &cfg.http, extras, https, cancel.clone()).await?;
    cancel.cancel();
    // Connections end, their stored messages finish, before the engine persists and stops.
    let _ = mqtt_task.await;
    if let Some(t) = tls_task {
        let _ = t.await;
    }
    let _ = alerts.await;
    let _ = background.await;
    engine
        .shutdown()
        .await
        .context("persisting buffers at shutdown")?;
    if let Some(c) = cluster {
        c.shutdown().await;
    }
    tracing::info!("stopped cleanly");
    Ok(())
}
