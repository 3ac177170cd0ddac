//! The hot cache: decoded Parquet files kept in memory as Arrow, so repeated queries on recent
//! partitions read no Parquet at all. A file enters when a flush or a compaction writes it
//! (its rows are at hand then), or when a scan misses it while the cache still has room; the
//! least recently used file leaves when the budget (`query.hot_cache_bytes`) is exceeded, and a
//! file leaves at once when compaction, retention or DROP replaces it.

use crate::store::chunk::Chunk;
use datafusion::arrow::record_batch::RecordBatch;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

/// Rows per batch handed to a scan: big enough to keep operators busy, small enough to
/// spread over the cores.
const SLICE_ROWS: usize = 65_536;

#[derive(Debug)]
struct Entry {
    /// Slices of the file, each indexed as queries ask ([`Chunk`]; the indexes, at most 4
    /// bytes a row for each string column queried by value, are not counted in the budget).
    batches: Vec<Chunk>,
    bytes: usize,
    used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    files: HashMap<String, Entry>,
    bytes: usize,
    clock: u64,
    loading: HashSet<String>,
}

/// The cache, shared by every table.
#[derive(Debug)]
pub(crate) struct HotCache {
    budget: usize,
    inner: Mutex<Inner>,
}

impl HotCache {
    /// A cache holding at most `budget` bytes.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Keeps a file's rows.
    pub(crate) fn insert(&self, path: &str, batch: &RecordBatch) {
        let bytes = batch.get_array_memory_size();
        if bytes > self.budget || batch.num_rows() == 0 {
            return;
        }
        let batches = (0..batch.num_rows())
            .step_by(SLICE_ROWS)
            .map(|at| Chunk::sealed(batch.slice(at, SLICE_ROWS.min(batch.num_rows() - at))))
            .collect();
        let mut g = self.inner.lock();
        g.loading.remove(path);
        g.clock += 1;
        let used = g.clock;
        if let Some(old) = g.files.insert(
            path.to_string(),
            Entry {
                batches,
                bytes,
                used,
            },
        ) {
            g.bytes -= old.bytes;
        }
        g.bytes += bytes;
        while g.bytes > self.budget {
            let Some(victim) = g
                .files
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(p, _)| p.clone())
            else {
                break;
            };
            if let Some(e) = g.files.remove(&victim) {
                g.bytes -= e.bytes;
            }
        }
    }

    /// A file's rows, if cached.
    pub(crate) fn get(&self, path: &str) -> Option<Vec<Chunk>> {
        let mut g = self.inner.lock();
        g.clock += 1;
        let now = g.clock;
        let e = g.files.get_mut(path)?;
        e.used = now;
        Some(e.batches.clone())
    }

    /// Whether a missed file should be loaded: the cache has room for `estimate` more bytes
    /// and nobody is loading it already. The caller then loads it and calls
    /// [`HotCache::insert`] (or [`HotCache::abandon`]).
    pub(crate) fn claim(&self, path: &str, estimate: usize) -> bool {
        let mut g = self.inner.lock();
        if g.bytes + estimate > self.budget || g.loading.contains(path) {
            return false;
        }
        g.loading.insert(path.to_string())
    }

    /// Gives up a claim.
    pub(crate) fn abandon(&self, path: &str) {
        self.inner.lock().loading.remove(path);
    }

    /// Forgets files (replaced or dropped).
    pub(crate) fn remove(&self, paths: &[String]) {
        let mut g = self.inner.lock();
        for p in paths {
            if let Some(e) = g.files.remove(p) {
                g.bytes -= e.bytes;
            }
        }
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use std::sync::Arc;

    fn batch(n: i64) -> RecordBatch {
        RecordBatch::try_from_iter([("v", Arc::new(Int64Array::from_iter_values(0..n)) as _)])
            .unwrap()
    }

    #[test]
    fn least_recently_used_leaves_first() {
        let one = batch(1000).get_array_memory_size();
        let cache = HotCache::new(one * 2 + one / 2);
        cache.insert("a", &batch(1000));
        cache.insert("b", &batch(1000));
        assert!(cache.get("a").is_some());
        cache.insert("c", &batch(1000));
        assert!(cache.get("b").is_none(), "b was least recently used");
        assert!(cache.get("a").is_some() && cache.get("c").is_some());
        cache.remove(&["a".into()]);
        assert!(cache.get("a").is_none());
        assert_eq!(cache.bytes(), one);
        let big = batch(200_000);
        let slices = HotCache::new(usize::MAX);
        slices.insert("big", &big);
        let got = slices.get("big").unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(
            got.iter().map(|c| c.batch.num_rows()).sum::<usize>(),
            200_000
        );
        assert!(!cache.claim("x", one * 2), "no room");
        assert!(cache.claim("x", 1));
        assert!(!cache.claim("x", 1), "already loading");
    }
}
