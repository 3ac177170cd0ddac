//! The metadata group's snapshot, engine side: the catalog and the manifest as this node
//! holds them at a metadata index ([`Engine::meta_state`]), and installing them on a node
//! whose metadata log starts after that index ([`Engine::install_meta_state`]: a node that
//! joins once the log behind the snapshot was purged, or that was away that long).

use super::Engine;
use crate::error::{Error, Result};
use crate::store::catalog::CatalogData;
use crate::store::storage::Manifest;

impl Engine {
    /// The metadata group's index installed here, as it moves (published once the files
    /// and flushed indexes of its entry are in place); it ends with the engine.
    pub fn manifest_watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.manifest_index.subscribe()
    }

    /// The catalog and the manifest (JSON), as the metadata group's entries applied so far
    /// left them. Called from the group's snapshot, which no apply runs beside.
    pub fn meta_state(&self) -> Result<(String, String)> {
        let catalog = serde_json::to_string(&*self.store.catalog.snapshot());
        let handle = tokio::runtime::Handle::current();
        let manifest = tokio::task::block_in_place(|| {
            handle.block_on(async { serde_json::to_string(&*self.manifest.lock().await) })
        });
        let bad = |e: serde_json::Error| Error::Corrupt {
            what: "the metadata group's state".into(),
            reason: e.to_string(),
        };
        Ok((catalog.map_err(bad)?, manifest.map_err(bad)?))
    }

    /// Installs the catalog and the manifest of the metadata group's snapshot at
    /// `raft_index`, where this node has not got that far: the tables follow the catalog,
    /// each partition gets the snapshot's files, and each shard's rows those files hold
    /// leave the buffers.
    pub fn install_meta_state(&self, raft_index: u64, catalog: &str, manifest: &str) -> Result<()> {
        let bad = |what: &str, e: serde_json::Error| Error::Corrupt {
            what: format!("the {what} of the metadata group's snapshot"),
            reason: e.to_string(),
        };
        let catalog: CatalogData = serde_json::from_str(catalog).map_err(|e| bad("catalog", e))?;
        let snap: Manifest = serde_json::from_str(manifest).map_err(|e| bad("manifest", e))?;
        if self.store.catalog.replace(raft_index, catalog)? {
            self.follow_catalog();
        }
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| handle.block_on(self.install_manifest(raft_index, snap)))
    }

    async fn install_manifest(&self, raft_index: u64, snap: Manifest) -> Result<()> {
        let mut m = self.manifest.lock().await;
        if raft_index <= m.raft_index {
            return Ok(());
        }
        self.change_manifest(&mut m, |next| {
            next.tables = snap.tables.clone();
            next.raft_index = raft_index;
        })
        .await?;
        let mut gone = Vec::new();
        for t in self.store.tables.all() {
            let named = snap.tables.get(&t.def().id);
            let mut released = 0;
            let mut parts = t.parts.write();
            for (key, p) in parts.iter_mut() {
                if named.is_none_or(|n| !n.contains_key(key)) {
                    gone.extend(p.files.drain(..).map(|f| f.path));
                }
            }
            for (key, pm) in named.into_iter().flatten() {
                let p = t.partition_mut(&mut parts, *key);
                let keep: std::collections::HashSet<&str> =
                    pm.files.iter().map(|f| f.path.as_str()).collect();
                gone.extend(
                    (p.files.iter())
                        .filter(|f| !keep.contains(f.path.as_str()))
                        .map(|f| f.path.clone()),
                );
                p.files = pm.files.clone();
                for (shard, through) in &pm.shards {
                    released += t.shard_rows(p, *shard).persisted(*through);
                }
            }
            drop(parts);
            self.store.tables.release(released);
            t.rows_removed();
        }
        self.store.hot.remove(&gone);
        self.manifest_index.send_replace(raft_index);
        tracing::info!(raft_index, "installed the metadata group's snapshot");
        Ok(())
    }
}
