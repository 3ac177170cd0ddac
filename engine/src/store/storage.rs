//! Persistence: Parquet files and the manifest on an object store.
//!
//! Files are immutable; the manifest names the live ones. A manifest is one JSON document
//! written as a new object `manifest/<version>.json` (never overwritten), so replacing it is
//! atomic on every store; the highest version present is the current one. Per partition it
//! records `flushed_lsn`: every log record up to it is in the partition's files, which is what
//! replay needs to apply each acknowledged row exactly once.

use crate::error::{Error, Result};
use crate::query::groups::Groups;
use crate::query::synopsis::ColumnSynopsis;
use bytes::Bytes;
use datafusion::arrow::compute::{
    SortColumn, concat_batches, lexsort_to_indices, take_record_batch,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::metadata::SortingColumn;
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use sluice_conf::StorageConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Format number of manifest documents.
const MANIFEST_FORMAT: u32 = 1;
/// Manifest versions kept behind the current one.
const MANIFESTS_KEPT: u64 = 3;

/// One Parquet file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileMeta {
    /// Object path relative to the store root.
    pub path: String,
    /// Rows in the file.
    pub rows: u64,
    /// Size in bytes.
    pub bytes: u64,
    /// Smallest time value (microseconds), when the table has a time column.
    pub min_time: Option<i64>,
    /// Largest time value.
    pub max_time: Option<i64>,
    /// Per column count, sum, min and max (absent in files written before synopses, and
    /// in those whose synopsis an older manifest could not hold: see [`lenient`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub synopsis: Option<Arc<Vec<ColumnSynopsis>>>,
    /// Synopses per combination of values of the file's few-valued columns, when it has
    /// such columns ([`crate::query::groups`]). Not in the manifest: set when the file is written,
    /// read from its sidecar object ([`groups_path`]) when first asked after.
    #[serde(skip)]
    pub groups: Arc<OnceLock<Option<Arc<Groups>>>>,
}

/// A file's synopsis, or none when it does not read: manifests written before floats were
/// spelled out held a NaN or infinite sum or bound as `null`, which says not which it was,
/// so such a file is answered by the scan.
fn lenient<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Arc<Vec<ColumnSynopsis>>>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}

/// A partition's persisted state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PartitionManifest {
    /// Every log record with LSN <= this is in `files` (or was dropped by retention).
    pub flushed_lsn: u64,
    /// Live files.
    pub files: Vec<FileMeta>,
    /// In a cluster: per shard, the last log index whose rows of this partition are in
    /// `files`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shards: BTreeMap<u32, u64>,
}

/// The set of live files of every table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    format: u32,
    /// Grows by one per change; also the object's name.
    pub version: u64,
    /// Table id -> partition key -> state.
    pub tables: BTreeMap<u64, BTreeMap<u64, PartitionManifest>>,
    /// In a cluster: the metadata group's log index of the last change applied here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub raft_index: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Manifest {
    /// A partition's entry, created empty if absent.
    pub(crate) fn partition(&mut self, table_id: u64, key: u64) -> &mut PartitionManifest {
        self.tables
            .entry(table_id)
            .or_default()
            .entry(key)
            .or_default()
    }
}

impl Default for Manifest {
    fn default() -> Self {
        Self {
            format: MANIFEST_FORMAT,
            version: 0,
            tables: BTreeMap::new(),
            raft_index: 0,
        }
    }
}

/// A Parquet file encoded in memory, not yet stored.
#[derive(Debug)]
pub(crate) struct Encoded {
    /// The file's bytes.
    pub bytes: Bytes,
    /// Rows in it.
    pub rows: u64,
    /// Its time range (microseconds), when the table has a time column.
    pub time_range: Option<(i64, i64)>,
    /// Per column synopsis.
    pub synopsis: Vec<ColumnSynopsis>,
    /// Group synopses ([`Groups::of`]).
    pub groups: Option<Groups>,
    /// The rows as written (sorted), for the hot cache.
    pub batch: RecordBatch,
}

/// The object store holding Parquet files and manifests.
#[derive(Debug, Clone)]
pub(crate) struct Storage {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The URL DataFusion knows it by.
    pub url: ObjectStoreUrl,
    /// When the store is a local directory: its root, so writes can be fsynced.
    local_root: Option<PathBuf>,
    row_group_rows: usize,
}

impl Storage {
    /// Opens the store the config names; empty URL means `<data_dir>/objects`.
    pub(crate) fn open(config: &StorageConfig, data_dir: &Path) -> Result<Self> {
        let url = ObjectStoreUrl::parse("sluice://store/").map_err(Error::from)?;
        let local = |root: PathBuf| -> Result<Self> {
            std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
            let root = root.canonicalize().map_err(|e| Error::io(&root, e))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(&root)?;
            Ok(Self {
                store: Arc::new(store),
                url: url.clone(),
                local_root: Some(root),
                row_group_rows: config.row_group_rows,
            })
        };
        if config.url.is_empty() {
            return local(data_dir.join("objects"));
        }
        if let Some(path) = config.url.strip_prefix("file://") {
            return local(PathBuf::from(path));
        }
        if let Some(rest) = config.url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let mut b = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_region(&config.s3_region)
                .with_allow_http(config.s3_allow_http);
            if !config.s3_endpoint.is_empty() {
                b = b.with_endpoint(&config.s3_endpoint);
            }
            if !config.s3_access_key_id.is_empty() {
                b = b
                    .with_access_key_id(&config.s3_access_key_id)
                    .with_secret_access_key(&config.s3_secret_access_key);
            }
            let s3 = b.build()?;
            let store: Arc<dyn ObjectStore> = if prefix.trim_matches('/').is_empty() {
                Arc::new(s3)
            } else {
                Arc::new(object_store::prefix::PrefixStore::new(
                    s3,
                    prefix.trim_matches('/'),
                ))
            };
            return Ok(Self {
                store,
                url,
                local_root: None,
                row_group_rows: config.row_group_rows,
            });
        }
        Err(Error::invalid(format!(
            "storage.url '{}' must be empty, file:///path or s3://bucket/prefix",
            config.url
        )))
    }

    /// Writes an object and, on a local store, fsyncs it and its directory, so that the WAL
    /// may be truncated behind it.
    pub(crate) async fn put_durable(&self, path: &str, bytes: Bytes) -> Result<()> {
        self.store
            .put(&ObjPath::from(path), PutPayload::from(bytes))
            .await?;
        if let Some(root) = &self.local_root {
            let file = root.join(path);
            let root = root.clone();
            tokio::task::spawn_blocking(move || -> Result<()> {
                std::fs::File::open(&file)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| Error::io(&file, e))?;
                // Directories may be new too (tables/<id>/<partition>/): sync each one up to
                // the store's root so the file's path survives a power cut.
                let mut dir = file.parent();
                while let Some(d) = dir {
                    crate::store::catalog::sync_dir(d)?;
                    if d == root {
                        break;
                    }
                    dir = d.parent();
                }
                Ok(())
            })
            .await
            .map_err(|e| Error::io("fsync", std::io::Error::other(e)))??;
        }
        Ok(())
    }

    /// Reads an object whole.
    pub(crate) async fn get(&self, path: &str) -> Result<Bytes> {
        Ok(self.store.get(&ObjPath::from(path)).await?.bytes().await?)
    }

    /// Deletes objects (a Parquet file with its group synopses), ignoring ones already
    /// gone.
    pub(crate) async fn delete(&self, paths: &[String]) -> Result<()> {
        let sidecars = (paths.iter())
            .filter(|p| p.ends_with(".parquet"))
            .map(|p| groups_path(p));
        for p in paths.iter().cloned().chain(sidecars) {
            match self.store.delete(&ObjPath::from(p.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The group synopses of the file `meta`: from memory, else from its sidecar object
    /// (then kept); `None` when it has none, or the sidecar is missing or does not decode
    /// (also kept), or cannot be read now (asked again next time).
    pub(crate) async fn groups(&self, meta: &FileMeta) -> Option<Arc<Groups>> {
        if let Some(kept) = meta.groups.get() {
            return kept.clone();
        }
        let groups = match self.get(&groups_path(&meta.path)).await {
            Ok(bytes) => {
                let groups = Groups::decode(&bytes);
                if groups.is_none() {
                    let path = groups_path(&meta.path);
                    tracing::warn!(%path, "group synopses do not decode; the scan answers");
                }
                groups.map(Arc::new)
            }
            Err(Error::ObjectStore {
                source: object_store::Error::NotFound { .. },
            }) => None,
            Err(e) => {
                tracing::warn!(file = %meta.path, error = %e, "could not read group synopses");
                return None;
            }
        };
        meta.groups.get_or_init(|| groups).clone()
    }

    /// Lists object paths under a prefix.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let aged = self.list_aged(prefix).await?;
        Ok(aged.into_iter().map(|(path, _)| path).collect())
    }

    /// Lists object paths under a prefix with how long ago each was last written.
    pub(crate) async fn list_aged(&self, prefix: &str) -> Result<Vec<(String, Duration)>> {
        let prefix = ObjPath::from(prefix);
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        let now = chrono::Utc::now();
        Ok((metas.into_iter())
            .map(|m| {
                let age = (now - m.last_modified).to_std().unwrap_or_default();
                (m.location.to_string(), age)
            })
            .collect())
    }

    /// Loads the newest manifest, or an empty one for a new store.
    pub(crate) async fn load_manifest(&self) -> Result<Manifest> {
        let mut versions: Vec<(u64, String)> = self
            .list("manifest")
            .await?
            .into_iter()
            .filter_map(|p| {
                let v = p
                    .strip_prefix("manifest/")?
                    .strip_suffix(".json")?
                    .parse()
                    .ok()?;
                Some((v, p))
            })
            .collect();
        versions.sort();
        let Some((_, path)) = versions.pop() else {
            return Ok(Manifest::default());
        };
        let bytes = self.get(&path).await?;
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            what: path.clone(),
            reason: e.to_string(),
        })?;
        if m.format != MANIFEST_FORMAT {
            return Err(Error::Corrupt {
                what: path,
                reason: format!("unsupported manifest format {}", m.format),
            });
        }
        Ok(m)
    }

    /// Writes `m` as the next manifest version and deletes versions long superseded.
    pub(crate) async fn save_manifest(&self, m: &mut Manifest) -> Result<()> {
        m.version += 1;
        let bytes = serde_json::to_vec(m).expect("serialisable");
        self.put_durable(&format!("manifest/{:020}.json", m.version), bytes.into())
            .await?;
        if m.version > MANIFESTS_KEPT {
            let old = format!("manifest/{:020}.json", m.version - MANIFESTS_KEPT);
            self.delete(&[old]).await?;
        }
        Ok(())
    }

    /// Encodes rows as one Parquet file of `schema` sorted by `time_col`, with page-level
    /// statistics and the page index. Batches written before an ADD COLUMN are widened to
    /// `schema`. CPU-bound, so call it from a blocking thread.
    pub(crate) fn encode_parquet(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        time_col: Option<usize>,
    ) -> Result<Encoded> {
        let batches: Vec<RecordBatch> = batches
            .iter()
            .map(|b| crate::store::buffer::widen(b, schema))
            .collect();
        let batch = concat_batches(schema, &batches)?;
        let batch = match time_col {
            Some(i) if batch.num_rows() > 1 => {
                let idx = lexsort_to_indices(
                    &[SortColumn {
                        values: batch.column(i).clone(),
                        options: None,
                    }],
                    None,
                )?;
                take_record_batch(&batch, &idx)?
            }
            _ => batch,
        };
        let range = time_col.and_then(|i| time_range(batch.column(i)));
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(self.row_group_rows));
        if let Some(i) = time_col {
            props = props.set_sorting_columns(Some(vec![SortingColumn {
                column_idx: i as i32,
                descending: false,
                nulls_first: true,
            }]));
        }
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, schema.clone(), Some(props.build()))?;
        w.write(&batch)?;
        w.close()?;
        Ok(Encoded {
            bytes: Bytes::from(out),
            rows: batch.num_rows() as u64,
            time_range: range,
            synopsis: crate::query::synopsis::of_batches(
                std::slice::from_ref(&batch),
                schema.fields().len(),
            ),
            groups: Groups::of(&batch),
            batch,
        })
    }

    /// Stores an encoded file durably at `path` and describes it for the manifest.
    pub(crate) async fn put_file(&self, path: String, file: Encoded) -> Result<FileMeta> {
        let meta = FileMeta {
            path,
            rows: file.rows,
            bytes: file.bytes.len() as u64,
            min_time: file.time_range.map(|r| r.0),
            max_time: file.time_range.map(|r| r.1),
            synopsis: Some(Arc::new(file.synopsis)),
            groups: Arc::new(OnceLock::from(file.groups.clone().map(Arc::new))),
        };
        // The sidecar first: a file named by a manifest has one unless a crash tore it, and
        // then it is only a cache (one that does not decode is not used).
        if let Some(groups) = &file.groups {
            let path = ObjPath::from(groups_path(&meta.path));
            let bytes = PutPayload::from(groups.encode());
            self.store.put(&path, bytes).await?;
        }
        self.put_durable(&meta.path, file.bytes).await?;
        Ok(meta)
    }

    /// Decodes a whole Parquet file (for compaction).
    pub(crate) fn decode_parquet(bytes: Bytes) -> Result<Vec<RecordBatch>> {
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
        Ok(reader.collect::<Result<Vec<_>, _>>()?)
    }
}

/// The object holding the group synopses of the Parquet file at `path`.
pub(crate) fn groups_path(path: &str) -> String {
    format!("{path}.groups")
}

/// Min and max of a timestamp or date column, in microseconds.
pub(crate) fn time_range(col: &datafusion::arrow::array::ArrayRef) -> Option<(i64, i64)> {
    use datafusion::arrow::array::{Array, Date32Array, TimestampMicrosecondArray};
    use datafusion::arrow::compute::{max, min};
    if let Some(a) = col.as_any().downcast_ref::<TimestampMicrosecondArray>() {
        return Some((min(a)?, max(a)?));
    }
    if let Some(a) = col.as_any().downcast_ref::<Date32Array>() {
        let d = |x: i32| i64::from(x).saturating_mul(86_400_000_000);
        return Some((d(min(a)?), d(max(a)?)));
    }
    let _ = col.len();
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest written before floats were spelled out (a NaN sum as `null`) still opens;
    /// that file's synopsis is dropped, so the scan answers for it.
    #[test]
    fn an_old_manifest_with_a_null_float_opens() {
        let old = r#"{"path":"tables/1/1/a.parquet","rows":2,"bytes":10,"min_time":null,"max_time":null,"synopsis":[{"count":2,"sum":{"Float":null},"ordered":false}]}"#;
        let meta: FileMeta = serde_json::from_str(old).unwrap();
        assert_eq!((meta.rows, meta.synopsis), (2, None));
        let good = r#"{"path":"b","rows":1,"bytes":1,"min_time":null,"max_time":null,"synopsis":[{"count":1,"sum":{"Float":"inf"},"ordered":true}]}"#;
        let meta: FileMeta = serde_json::from_str(good).unwrap();
        let sum = meta.synopsis.unwrap()[0].sum;
        assert_eq!(sum, Some(crate::query::synopsis::Num::Float(f64::INFINITY)));
    }
}
