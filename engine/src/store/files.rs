//! Small state files (catalog, alert states, bridge origins, the broker's sessions and
//! bridges): replaced whole and durably, and read back leniently where losing them only
//! costs a fresh start.

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes` so that a crash leaves the old or the new content, never a
/// mix: a synced temporary file renamed over it, then the directory synced (so the rename
/// survives a power cut). Creates the directory if needed.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Reads the JSON state file `path` (`what` names it in the log). `None` when there is none,
/// when it cannot be read (logged), or when it does not parse: a damaged file is set aside
/// as `<path>.damaged` (logged) so that the next save does not destroy it.
pub fn read_state<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Option<T> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "{what} unreadable; starting without it");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            let mut aside = path.as_os_str().to_owned();
            aside.push(".damaged");
            let renamed = std::fs::rename(path, &aside);
            tracing::error!(
                path = %path.display(),
                error = %e,
                set_aside = renamed.is_ok(),
                "{what} damaged; set aside as .damaged, starting without it"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaced_then_read_back_and_a_damaged_file_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        assert_eq!(read_state::<Vec<u32>>(&path, "state"), None);
        replace_file(&path, b"[1,2]").unwrap();
        replace_file(&path, b"[3]").unwrap();
        assert_eq!(read_state::<Vec<u32>>(&path, "state"), Some(vec![3]));
        std::fs::write(&path, b"[3,").unwrap();
        assert_eq!(read_state::<Vec<u32>>(&path, "state"), None);
        assert!(!path.exists());
        assert_eq!(
            std::fs::read(dir.path().join("sub/state.json.damaged")).unwrap(),
            b"[3,"
        );
    }
}
