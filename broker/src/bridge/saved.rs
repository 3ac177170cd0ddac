//! `<data_dir>/broker/bridges.json`: the bridges the admin API added or removed, and what
//! each last subscribed to.

use crate::error::BridgeError;
use sluice_conf::BridgeConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Bridges added or removed through the admin API, and what each last subscribed to.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Saved {
    version: u32,
    pub(super) added: Vec<BridgeConfig>,
    pub(super) removed: Vec<String>,
    /// Bridge -> the filters (and QoS) its remote session is subscribed to.
    #[serde(default)]
    pub(super) subscribed: BTreeMap<String, Vec<(String, u8)>>,
}

/// `<data_dir>/broker/bridges.json`.
#[derive(Debug)]
pub(super) struct SavedFile {
    pub(super) path: PathBuf,
    pub(super) saved: parking_lot::Mutex<Saved>,
}

impl SavedFile {
    pub(super) fn open(path: PathBuf) -> Self {
        let saved =
            sluice_engine::read_state(&path, "bridges saved by the admin API").unwrap_or_default();
        Self {
            path,
            saved: parking_lot::Mutex::new(saved),
        }
    }

    pub(super) fn change(&self, f: impl FnOnce(&mut Saved)) -> Result<(), BridgeError> {
        let mut saved = self.saved.lock();
        f(&mut saved);
        saved.version = 1;
        let bytes = serde_json::to_vec_pretty(&*saved).map_err(|e| BridgeError::Save {
            path: self.path.clone(),
            source: e.into(),
        })?;
        sluice_engine::replace_file(&self.path, &bytes).map_err(|source| BridgeError::Save {
            path: self.path.clone(),
            source,
        })
    }
}
