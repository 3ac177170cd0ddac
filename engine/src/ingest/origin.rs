//! Where a bridged message came from, kept durably with its rows, so that a remote broker's
//! redelivery of a message Sluice stored but had not yet acknowledged is recognised and not
//! stored twice.
//!
//! A bridge stores a message as one write record carrying an [`Origin`]: the bridge's name,
//! the remote packet id, the topic and a digest of the payload. Applying the record (live or
//! on replay) remembers it in [`Origins`], one entry per (bridge, packet id): the last stored
//! message with that id. The remote may reuse a packet id only after Sluice acknowledged the
//! message that had it, so a redelivery (DUP set) whose id, topic and digest match the entry
//! is that same message. The entries outlive the log segments holding their records: before
//! segments are deleted, the entries are saved to `<data_dir>/origins.json`.

use crate::error::{Error, Result};
use blake2::Digest;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Format version of `origins.json`.
const FILE_VERSION: u32 = 1;

/// A stored message's identity at the broker it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The bridge's name.
    pub source: String,
    /// Packet id the remote broker gave the message.
    pub pkid: u16,
    /// Topic at the remote broker.
    pub topic: String,
    /// BLAKE2b-128 of the payload.
    pub digest: [u8; 16],
}

impl Origin {
    /// The origin of `payload` received on `topic` with `pkid` by bridge `source`.
    pub fn new(source: &str, pkid: u16, topic: &str, payload: &[u8]) -> Self {
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&blake2::Blake2b128::digest(payload));
        Self {
            source: source.into(),
            pkid,
            topic: topic.into(),
            digest,
        }
    }

    /// Encodes as `source_len:u16le source pkid:u16le topic_len:u32le topic digest[16]`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.source.len() as u16).to_le_bytes());
        out.extend_from_slice(self.source.as_bytes());
        out.extend_from_slice(&self.pkid.to_le_bytes());
        out.extend_from_slice(&(self.topic.len() as u32).to_le_bytes());
        out.extend_from_slice(self.topic.as_bytes());
        out.extend_from_slice(&self.digest);
    }

    /// Decodes from the front of `buf`, advancing it; `None` if malformed.
    pub fn decode(buf: &mut &[u8]) -> Option<Self> {
        let mut take = |n: usize| -> Option<&[u8]> {
            if buf.len() < n {
                return None;
            }
            let (head, rest) = buf.split_at(n);
            *buf = rest;
            Some(head)
        };
        let n = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
        let source = std::str::from_utf8(take(n)?).ok()?.to_string();
        let pkid = u16::from_le_bytes(take(2)?.try_into().ok()?);
        let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let topic = std::str::from_utf8(take(n)?).ok()?.to_string();
        let digest = take(16)?.try_into().ok()?;
        Some(Self {
            source,
            pkid,
            topic,
            digest,
        })
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Entry {
    lsn: u64,
    topic: String,
    /// Hex of the digest.
    digest: String,
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct File {
    version: u32,
    /// bridge -> packet id -> last stored message with that id.
    sources: BTreeMap<String, BTreeMap<u16, Entry>>,
}

/// The last stored message per (bridge, packet id).
#[derive(Debug)]
pub(crate) struct Origins {
    path: PathBuf,
    inner: parking_lot::Mutex<Inner>,
    /// Held while the file is written: writers share one temporary file, and an older
    /// snapshot must not be renamed over a newer one.
    writing: parking_lot::Mutex<()>,
}

/// The last stored message with a packet id: (LSN, topic, digest).
type Last = (u64, String, [u8; 16]);

#[derive(Debug, Default)]
struct Inner {
    /// bridge -> packet id -> last stored message.
    map: HashMap<String, HashMap<u16, Last>>,
    /// Largest LSN remembered, and the largest one saved to the file.
    newest: u64,
    saved: u64,
}

impl Origins {
    /// Loads `<dir>/origins.json` (none yet: empty). A damaged file stops startup: without
    /// it, redeliveries could be stored twice.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("origins.json");
        let mut inner = Inner::default();
        match std::fs::read(&path) {
            Ok(bytes) => {
                let corrupt = |reason: String| Error::Corrupt {
                    what: path.display().to_string(),
                    reason,
                };
                let file: File =
                    serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
                if file.version != FILE_VERSION {
                    return Err(corrupt(format!("unknown version {}", file.version)));
                }
                for (source, entries) in file.sources {
                    let m = inner.map.entry(source).or_default();
                    for (pkid, e) in entries {
                        let digest = <[u8; 16]>::try_from(crate::hex::decode(&e.digest))
                            .ok()
                            .ok_or_else(|| corrupt(format!("bad digest {:?}", e.digest)))?;
                        inner.newest = inner.newest.max(e.lsn);
                        m.insert(pkid, (e.lsn, e.topic, digest));
                    }
                }
                inner.saved = inner.newest;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&path, e)),
        }
        Ok(Self {
            writing: parking_lot::Mutex::new(()),
            path,
            inner: parking_lot::Mutex::new(inner),
        })
    }

    /// Remembers a message applied after every one remembered so far (a cluster node's
    /// shards have no one log position).
    pub(crate) fn remember_next(&self, origin: &Origin) {
        let next = self.inner.lock().newest + 1;
        self.remember(next, origin);
    }

    /// Remembers a message applied at `lsn` (replay may offer records older than what the
    /// file holds: the newer entry stays).
    pub(crate) fn remember(&self, lsn: u64, origin: &Origin) {
        let mut inner = self.inner.lock();
        inner.newest = inner.newest.max(lsn);
        let m = inner.map.entry(origin.source.clone()).or_default();
        match m.get(&origin.pkid) {
            Some((have, _, _)) if *have >= lsn => {}
            _ => {
                m.insert(origin.pkid, (lsn, origin.topic.clone(), origin.digest));
            }
        }
    }

    /// Whether `origin` is the last message stored with its packet id by its bridge.
    pub(crate) fn is_stored(&self, origin: &Origin) -> bool {
        let inner = self.inner.lock();
        inner
            .map
            .get(&origin.source)
            .and_then(|m| m.get(&origin.pkid))
            .is_some_and(|(_, topic, digest)| *topic == origin.topic && *digest == origin.digest)
    }

    /// Forgets a bridge's entries (the bridge was removed).
    pub(crate) fn forget(&self, source: &str) -> Result<()> {
        let changed = self.inner.lock().map.remove(source).is_some();
        if changed { self.write() } else { Ok(()) }
    }

    /// Saves the entries if some were remembered since the last save; called before log
    /// segments are deleted, so no entry exists only in a deleted segment.
    pub(crate) fn save(&self) -> Result<()> {
        let (newest, saved) = {
            let inner = self.inner.lock();
            (inner.newest, inner.saved)
        };
        if newest == saved {
            return Ok(());
        }
        self.write()
    }

    fn write(&self) -> Result<()> {
        let _writing = self.writing.lock();
        let (file, newest) = {
            let inner = self.inner.lock();
            let sources = (inner.map.iter())
                .map(|(s, m)| {
                    let entries = (m.iter())
                        .map(|(pkid, (lsn, topic, digest))| {
                            let e = Entry {
                                lsn: *lsn,
                                topic: topic.clone(),
                                digest: crate::hex::encode(digest),
                            };
                            (*pkid, e)
                        })
                        .collect();
                    (s.clone(), entries)
                })
                .collect();
            let file = File {
                version: FILE_VERSION,
                sources,
            };
            (file, inner.newest)
        };
        let bytes = serde_json::to_vec(&file).map_err(|e| Error::io(&self.path, e.into()))?;
        crate::store::catalog::write_atomic(&self.path, &bytes)?;
        let mut inner = self.inner.lock();
        inner.saved = inner.saved.max(newest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_round_trips() {
        let o = Origin::new("plant-1", 513, "a/b/ü", b"payload");
        let mut buf = Vec::new();
        o.encode(&mut buf);
        buf.extend_from_slice(b"rest");
        let mut s = &buf[..];
        assert_eq!(Origin::decode(&mut s), Some(o));
        assert_eq!(s, b"rest");
        for cut in 0..buf.len() - 4 {
            assert_eq!(Origin::decode(&mut &buf[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn the_last_message_per_packet_id_is_remembered_and_saved() {
        let dir = tempfile::tempdir().unwrap();
        let o = Origins::open(dir.path()).unwrap();
        let first = Origin::new("b", 7, "t", b"one");
        let second = Origin::new("b", 7, "t", b"two");
        o.remember(10, &first);
        assert!(o.is_stored(&first));
        o.remember(11, &second);
        assert!(!o.is_stored(&first), "packet id 7 was reused");
        assert!(o.is_stored(&second));
        // Replay of an older record does not bring the old message back.
        o.remember(10, &first);
        assert!(o.is_stored(&second));
        assert!(
            !o.is_stored(&Origin::new("b", 7, "u", b"two")),
            "topic differs"
        );
        assert!(
            !o.is_stored(&Origin::new("c", 7, "t", b"two")),
            "other bridge"
        );
        o.save().unwrap();
        let again = Origins::open(dir.path()).unwrap();
        assert!(again.is_stored(&second));
        again.forget("b").unwrap();
        assert!(!Origins::open(dir.path()).unwrap().is_stored(&second));
    }

    #[test]
    fn a_damaged_file_stops_startup() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("origins.json"), b"{not json").unwrap();
        let err = Origins::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("origins.json"), "{err}");
    }
}
