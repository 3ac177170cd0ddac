//! Dead letters: messages that reached a table but could not be stored, kept whole.
//!
//! Each letter is one JSON line appended to `<data_dir>/dead_letters.jsonl` and fsynced
//! before the refusal is acknowledged, so a refused message survives a crash as surely as a
//! stored one. The newest [`KEPT_IN_MEMORY`] are also held in memory for
//! `system.dead_letters`; the file keeps them all.

use crate::error::{Error, Result};
use crate::ports::DeadLetter;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Letters `system.dead_letters` shows (the newest).
pub(crate) const KEPT_IN_MEMORY: usize = 100_000;

/// The on-disk line: the payload as hex so any bytes survive JSON.
#[derive(Serialize, Deserialize)]
struct Line {
    time_micros: i64,
    client_id: String,
    topic: String,
    payload_hex: String,
    reason: String,
    reason_code: u8,
}

/// The dead-letter store.
#[derive(Debug)]
pub(crate) struct DeadLetters {
    path: PathBuf,
    file: Arc<Mutex<std::fs::File>>,
    recent: Mutex<VecDeque<DeadLetter>>,
}

impl DeadLetters {
    /// Opens (or creates) the store in `dir`, loading the newest letters.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("dead_letters.jsonl");
        let mut recent = VecDeque::new();
        if let Ok(f) = std::fs::File::open(&path) {
            for line in std::io::BufReader::new(f).lines() {
                let line = line.map_err(|e| Error::io(&path, e))?;
                // A line torn by a crash mid-append is skipped; every whole one is kept.
                let Ok(l) = serde_json::from_str::<Line>(&line) else {
                    continue;
                };
                recent.push_back(DeadLetter {
                    time_micros: l.time_micros,
                    client_id: l.client_id,
                    topic: l.topic,
                    payload: crate::hex::decode(&l.payload_hex),
                    reason: l.reason,
                    reason_code: l.reason_code,
                });
                if recent.len() > KEPT_IN_MEMORY {
                    recent.pop_front();
                }
            }
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Ok(Self {
            path,
            file: Arc::new(Mutex::new(file)),
            recent: Mutex::new(recent),
        })
    }

    /// Appends `letter` durably.
    pub(crate) async fn add(&self, letter: DeadLetter) -> Result<()> {
        let mut line = serde_json::to_string(&Line {
            time_micros: letter.time_micros,
            client_id: letter.client_id.clone(),
            topic: letter.topic.clone(),
            payload_hex: crate::hex::encode(&letter.payload),
            reason: letter.reason.clone(),
            reason_code: letter.reason_code,
        })
        .map_err(|e| Error::io(&self.path, std::io::Error::other(e)))?;
        line.push('\n');
        let file = self.file.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let mut f = file.lock();
            f.write_all(line.as_bytes())?;
            f.sync_data()
        })
        .await
        .map_err(|e| Error::io(&path, std::io::Error::other(e)))?
        .map_err(|e| Error::io(&path, e))?;
        let mut recent = self.recent.lock();
        recent.push_back(letter);
        if recent.len() > KEPT_IN_MEMORY {
            recent.pop_front();
        }
        Ok(())
    }

    /// How many letters are in memory.
    pub(crate) fn len(&self) -> usize {
        self.recent.lock().len()
    }

    /// The letters in memory, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<DeadLetter> {
        self.recent.lock().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn letters_survive_reopen_and_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let d = DeadLetters::open(dir.path()).unwrap();
        let letter = DeadLetter {
            time_micros: 1,
            client_id: "c".into(),
            topic: "/db/t".into(),
            payload: vec![0, 255, b'x'],
            reason: "line 1: bad".into(),
            reason_code: 0x99,
        };
        d.add(letter.clone()).await.unwrap();
        drop(d);
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("dead_letters.jsonl"))
            .unwrap()
            .write_all(b"{\"time_mic")
            .unwrap();
        let d = DeadLetters::open(dir.path()).unwrap();
        assert_eq!(d.snapshot(), vec![letter]);
    }
}
