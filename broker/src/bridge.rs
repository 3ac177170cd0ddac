//! Bridges: Sluice as a client of other MQTT brokers, storing what they deliver without
//! losing a message.
//!
//! Each bridge runs one task ([`run`]) that polls its connection (`link`, rumqttc's 3.1.1 or
//! 5.0 client with a persistent session and manual acks). A received PUBLISH goes through the
//! same path as a direct one (`ingest`: topic -> table, a durable append), carrying its
//! [`Origin`] (bridge, packet id, topic, payload digest) into the log record; the messages
//! already received when one arrives (up to [`MAX_BATCH`]) are stored together, with one log
//! submission and one completion, on a task per batch ([`store_batch`]). Only once the
//! rows are durable is the message acknowledged to the remote broker, in the order received;
//! then it is routed to local subscribers. So a crash, a kill or a lost connection leaves
//! every unacknowledged message queued at the remote, which delivers it again (DUP set): one
//! whose origin matches the last message stored with that packet id is acknowledged without
//! being stored twice. A message that can never fit its table goes to the dead letters and
//! is acknowledged; one refused for a reason that passes (disk or buffers full) is retried
//! and holds back the acks behind it, so the remote keeps it.
//!
//! Optionally local topics (`forward`) are published to the remote through a local session
//! `$bridge/<name>`, kept like any persistent session.
//!
//! [`Bridges`] is the registry the admin API uses: list, add, remove, restart. Bridges
//! added or removed at run time are kept in `<data_dir>/broker/bridges.json`.
//!
//! [`Origin`]: sluice_engine::Origin
//! [`MAX_BATCH`]: task::MAX_BATCH
//! [`store_batch`]: store::store_batch

mod forward;
mod link;
mod saved;
mod status;
mod store;
mod task;

pub use status::BridgeStatus;
pub(crate) use status::{render_metrics, system_table};

use crate::BrokerState;
use crate::error::BridgeError;
use forward::forward_session;
use saved::SavedFile;
use sluice_conf::BridgeConfig;
use status::{Status, status_of};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use task::run;
use tokio_util::sync::CancellationToken;

struct Running {
    config: BridgeConfig,
    /// In a cluster: the restarts asked when it started (see `ApiBridges::restarts`).
    restarts: u64,
    status: Arc<Status>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the bridge (its stores in flight finish and are acknowledged); returns its
    /// configuration.
    async fn stop(self) -> BridgeConfig {
        self.stop.cancel();
        let _ = self.task.await;
        self.config
    }
}

/// The running bridges.
pub struct Bridges {
    shared: Arc<BrokerState>,
    running: tokio::sync::Mutex<BTreeMap<String, Running>>,
    saved: Arc<SavedFile>,
    /// Ends every bridge (server shutdown).
    shutdown: CancellationToken,
    /// The configuration's bridges.
    configured: parking_lot::Mutex<Vec<BridgeConfig>>,
    /// Whether the bridges run here: always on a single node; in a cluster, while this
    /// node runs the once-per-cluster work (the metadata group's leader).
    active: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Bridges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridges")
            .field("saved", &self.saved.path)
            .finish_non_exhaustive()
    }
}

impl Bridges {
    /// The registry; [`Bridges::start`] starts the configured and saved bridges.
    pub(crate) fn new(shared: Arc<BrokerState>, data_dir: &std::path::Path) -> Self {
        let path = data_dir.join("broker").join("bridges.json");
        Self {
            shutdown: shared.shutdown.clone(),
            shared,
            running: tokio::sync::Mutex::new(BTreeMap::new()),
            saved: Arc::new(SavedFile::open(path)),
            configured: parking_lot::Mutex::new(Vec::new()),
            active: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Starts the configured bridges (those the admin API removed excepted) and those it
    /// added. In a cluster they run on one node at a time, the one that runs the
    /// once-per-cluster work: each node checks twice a second, starts them when that
    /// becomes its task and stops them when it no longer is, so they move to another node
    /// within seconds of a failure. Redeliveries after a move are recognised by their
    /// origins, which every node applies with the rows.
    pub(crate) async fn start(self: &Arc<Self>, configured: &[BridgeConfig]) {
        *self.configured.lock() = configured.to_vec();
        let local = {
            let s = self.saved.saved.lock();
            s.added.len() + s.removed.len()
        };
        if self.shared.router.node.is_some() && local > 0 {
            tracing::warn!(
                file = %self.saved.path.display(),
                changes = local,
                "in a cluster the bridges added or removed over the admin API are the \
                 catalog's; those this file keeps from single-node runs are not used \
                 (add them again through /v1/bridges)"
            );
        }
        if self.shared.router.node.is_none() {
            self.active.store(true, Ordering::Release);
            self.start_wanted().await;
            return;
        }
        let me = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(b) = me.upgrade() else { return };
                let here = b.shared.db.runs_singletons();
                if here && !b.active.swap(true, Ordering::AcqRel) {
                    tracing::info!("this node runs the cluster's bridges now");
                    b.start_wanted().await;
                } else if here {
                    b.follow().await;
                } else if !here && b.active.swap(false, Ordering::AcqRel) {
                    tracing::info!(
                        "another node runs the cluster's bridges now: stopping them here"
                    );
                    b.stop_all().await;
                }
            }
        });
    }

    /// The bridges there should be: the configured ones less those removed, and those added
    /// (in a cluster, as the metadata group holds them).
    fn wanted(&self) -> BTreeMap<String, BridgeConfig> {
        let (added, removed) = match self.shared.db.api_bridges() {
            Some(b) => (b.added, b.removed),
            None => {
                let s = self.saved.saved.lock();
                (s.added.clone(), s.removed.clone())
            }
        };
        let mut all: BTreeMap<String, BridgeConfig> = (self.configured.lock().iter())
            .filter(|b| !removed.contains(&b.name))
            .map(|b| (b.name.clone(), b.clone()))
            .collect();
        for b in added {
            all.insert(b.name.clone(), b);
        }
        all
    }

    /// Starts every wanted bridge not running.
    async fn start_wanted(&self) {
        let mut running = self.running.lock().await;
        for (name, cfg) in self.wanted() {
            if let std::collections::btree_map::Entry::Vacant(e) = running.entry(name) {
                e.insert(self.spawn(cfg));
            }
        }
    }

    /// In a cluster, on the node running the bridges: starts those added and stops those
    /// removed through another node.
    async fn follow(&self) {
        let mut running = self.running.lock().await;
        let wanted = self.wanted();
        let names: Vec<String> = running.keys().cloned().collect();
        for name in names {
            let r = &running[&name];
            // Removed, or removed and added again with another configuration.
            let gone = wanted.get(&name) != Some(&r.config);
            // A restart asked through another node.
            let again = !gone && self.restarts_of(&name) != r.restarts;
            if !(gone || again) {
                continue;
            }
            let Some(r) = running.remove(&name) else {
                continue;
            };
            let config = r.stop().await;
            if gone {
                self.forget(&name);
            } else {
                tracing::info!(bridge = %name, "bridge restarted, as asked on another node");
                running.insert(name, self.spawn(config));
            }
        }
        for (name, cfg) in wanted {
            if let std::collections::btree_map::Entry::Vacant(e) = running.entry(name) {
                tracing::info!(bridge = %cfg.name, "bridge added on another node: starting it here");
                e.insert(self.spawn(cfg));
            }
        }
    }

    /// Keeps a change of the bridges added and removed: through the metadata group in a
    /// cluster (so the node running the bridges follows it), else in `bridges.json`.
    fn keep(
        &self,
        change: impl Fn(&mut Vec<BridgeConfig>, &mut Vec<String>),
    ) -> Result<(), BridgeError> {
        if self.shared.router.node.is_some() {
            return (self.shared.db)
                .change_api_bridges(&mut |b| change(&mut b.added, &mut b.removed))
                .map_err(|e| BridgeError::Cluster(e.to_string()));
        }
        self.saved.change(|s| change(&mut s.added, &mut s.removed))
    }

    /// Forgets a removed bridge's packet ids and its forwarding session here.
    fn forget(&self, name: &str) {
        if let Err(e) = self.shared.db.forget_origins(name) {
            tracing::error!(bridge = name, error = %e, "forgetting a removed bridge's packet ids failed");
        }
        let key = forward_session(name);
        if let Some(s) = self.shared.router.session(&key) {
            self.shared.router.discard(&s);
        }
    }

    /// Stops every bridge (their stores in flight finish and are acknowledged).
    async fn stop_all(&self) {
        let mut running = self.running.lock().await;
        for (_, r) in std::mem::take(&mut *running) {
            r.stop().await;
        }
    }

    fn spawn(&self, config: BridgeConfig) -> Running {
        let status = Arc::new(Status::default());
        let stop = self.shutdown.child_token();
        let task = tokio::spawn(run(
            self.shared.clone(),
            config.clone(),
            status.clone(),
            stop.clone(),
            self.saved.clone(),
        ));
        Running {
            restarts: self.restarts_of(&config.name),
            config,
            status,
            stop,
            task,
        }
    }

    /// In a cluster: how many restarts of `name` were asked (0 on a single node).
    fn restarts_of(&self, name: &str) -> u64 {
        (self.shared.db.api_bridges())
            .and_then(|b| b.restarts.get(name).copied())
            .unwrap_or(0)
    }

    /// Every bridge's figures, by name.
    pub async fn status(&self) -> Vec<BridgeStatus> {
        let running = self.running.lock().await;
        self.statuses(&running)
    }

    /// The figures without waiting for a change in progress (for `system.bridges` and
    /// `/metrics`, which must not block).
    pub fn status_now(&self) -> Vec<BridgeStatus> {
        match self.running.try_lock() {
            Ok(running) => self.statuses(&running),
            Err(_) => Vec::new(),
        }
    }

    /// The figures of the bridges running here, and in a cluster those running elsewhere.
    fn statuses(&self, running: &BTreeMap<String, Running>) -> Vec<BridgeStatus> {
        let node = self.shared.router.node;
        let mut all: Vec<BridgeStatus> = running.values().map(|r| status_of(r, node)).collect();
        if node.is_some() {
            // The others run on the node that runs the cluster's bridges.
            let there = self.shared.db.singletons_node();
            for (name, cfg) in self.wanted() {
                if !running.contains_key(&name) {
                    all.push(BridgeStatus::elsewhere(&cfg, there));
                }
            }
        }
        all
    }

    /// Starts a new bridge and keeps it across restarts.
    pub async fn add(&self, config: BridgeConfig) -> Result<(), BridgeError> {
        config
            .validate("bridge")
            .map_err(|e| BridgeError::Invalid(e.to_string()))?;
        let mut running = self.running.lock().await;
        if running.contains_key(&config.name) || self.wanted().contains_key(&config.name) {
            return Err(BridgeError::Exists(config.name));
        }
        self.keep(|added, removed| {
            removed.retain(|n| *n != config.name);
            added.retain(|b| b.name != config.name);
            added.push(config.clone());
        })?;
        tracing::info!(bridge = %config.name, address = %config.address, "bridge added");
        if self.active.load(Ordering::Acquire) {
            running.insert(config.name.clone(), self.spawn(config));
        }
        Ok(())
    }

    /// Stops a bridge (its stores in flight finish and are acknowledged), forgets what it
    /// stored, and keeps it removed across restarts.
    pub async fn remove(&self, name: &str) -> Result<(), BridgeError> {
        let mut running = self.running.lock().await;
        // In a cluster it may run on another node, which stops it once the change reaches it.
        let r = running.remove(name);
        if r.is_none() && !(self.shared.router.node.is_some() && self.wanted().contains_key(name)) {
            return Err(BridgeError::NotFound(name.into()));
        }
        if let Some(r) = r {
            r.stop().await;
        }
        self.saved.change(|s| {
            s.subscribed.remove(name);
        })?;
        self.keep(|added, removed| {
            added.retain(|b| b.name != name);
            if !removed.iter().any(|n| n == name) {
                removed.push(name.to_string());
            }
        })?;
        self.forget(name);
        tracing::info!(bridge = name, "bridge removed");
        Ok(())
    }

    /// Stops a bridge and starts it again (a new connection, figures reset).
    pub async fn restart(&self, name: &str) -> Result<(), BridgeError> {
        let mut running = self.running.lock().await;
        if self.shared.router.node.is_some() {
            // Counted in the catalog, so the node running it (this one or another) restarts
            // it; here at once.
            if !self.wanted().contains_key(name) {
                return Err(BridgeError::NotFound(name.into()));
            }
            (self.shared.db)
                .change_api_bridges(&mut |b| *b.restarts.entry(name.to_string()).or_default() += 1)
                .map_err(|e| BridgeError::Cluster(e.to_string()))?;
            if !running.contains_key(name) {
                return Ok(());
            }
        }
        let r = running
            .remove(name)
            .ok_or_else(|| BridgeError::NotFound(name.into()))?;
        let config = r.stop().await;
        tracing::info!(bridge = name, "bridge restarted");
        running.insert(name.to_string(), self.spawn(config));
        Ok(())
    }

    /// Waits for every bridge to stop (after shutdown was signalled).
    pub(crate) async fn stopped(&self) {
        self.stop_all().await;
    }
}
