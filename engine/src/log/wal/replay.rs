//! Reading the log back at start: every intact record in LSN order, a torn tail cut.

use super::record::{self, FrameError, WriteRecord, decode_frame};
use super::{SEGMENT_MAGIC, list_segments};
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

/// What replay found.
#[derive(Debug, Default)]
pub(crate) struct ReplayReport {
    /// Records applied (or offered to the sink).
    pub records: u64,
    /// The LSN the next append gets.
    pub next_lsn: u64,
    /// Where a torn or corrupt tail was cut: file, offset, reason, bytes dropped.
    pub cut: Option<(PathBuf, u64, String, u64)>,
}

/// Replays every segment under `dir` in order, offering each intact write to `apply` and
/// each journal record ([`Journal`]) to `journal`.
/// A torn or corrupt record at the end of the newest segment ends the log: the segment is cut
/// there (those records were never acknowledged). Damage anywhere else, or a record whose
/// checksum is valid but whose content is not, stops startup with [`Error::Corrupt`].
pub(crate) fn replay(
    dir: &Path,
    mut apply: impl FnMut(u64, &WriteRecord),
    mut journal: impl FnMut(u64, &[u8]),
) -> Result<ReplayReport> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let segments = list_segments(dir)?;
    let mut report = ReplayReport {
        next_lsn: 1,
        ..Default::default()
    };
    let mut last_lsn = 0u64;
    for (i, (first, path)) in segments.iter().enumerate() {
        let mut bytes = Vec::new();
        File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| Error::io(path, e))?;
        let mut stop: Option<(usize, String)> = None;
        if bytes.len() < SEGMENT_MAGIC.len() || &bytes[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
            if SEGMENT_MAGIC.starts_with(&bytes) {
                stop = Some((0, "segment header torn".into()));
            } else {
                stop = Some((0, "not a Sluice WAL segment (bad magic)".into()));
            }
        }
        let mut off = SEGMENT_MAGIC.len();
        report.next_lsn = report.next_lsn.max(*first);
        while stop.is_none() {
            // Preallocated space never written reads as zeros: that is the clean end.
            if bytes[off..].iter().all(|b| *b == 0) {
                break;
            }
            match decode_frame(&bytes[off..]) {
                Ok(None) => break,
                Ok(Some((frame, n))) => {
                    // A record with a valid checksum that still makes no sense is not a torn
                    // write: cutting there could drop acknowledged records, so stop instead.
                    let fatal = |why: String| Error::Corrupt {
                        what: format!("WAL segment {} at offset {off}", path.display()),
                        reason: format!(
                            "{why}; refusing to start rather than drop what follows (move the segment aside to inspect it)"
                        ),
                    };
                    if frame.lsn <= last_lsn {
                        return Err(fatal(format!("LSN {} after {last_lsn}", frame.lsn)));
                    }
                    if frame.kind == record::KIND_JOURNAL {
                        journal(frame.lsn, frame.payload);
                    } else {
                        let Some(rec) = WriteRecord::decode(frame.kind, frame.payload) else {
                            return Err(fatal(format!(
                                "record of kind {} does not decode",
                                frame.kind
                            )));
                        };
                        apply(frame.lsn, &rec);
                    }
                    report.records += 1;
                    last_lsn = frame.lsn;
                    report.next_lsn = frame.lsn + 1;
                    off += n;
                }
                Err(FrameError::Torn) => stop = Some((off, "torn record".into())),
                Err(FrameError::Corrupt(why)) => stop = Some((off, why)),
            }
        }
        if let Some((at, reason)) = stop {
            if i + 1 < segments.len() {
                // Only the newest segment can end in a write cut short by a crash.
                return Err(Error::Corrupt {
                    what: format!("WAL segment {} at offset {at}", path.display()),
                    reason: format!(
                        "{reason}, and newer segments follow; refusing to start rather than drop them"
                    ),
                });
            }
            let dropped = (bytes.len() - at) as u64;
            let keep = if at == 0 { 0 } else { at };
            if keep == 0 {
                std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
            } else {
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| Error::io(path, e))?;
                f.set_len(keep as u64).map_err(|e| Error::io(path, e))?;
                f.sync_all().map_err(|e| Error::io(path, e))?;
            }
            crate::store::catalog::sync_dir(dir)?;
            tracing::error!(
                segment = %path.display(), offset = at, %reason, bytes_dropped = dropped,
                "WAL tail cut: records after this point were never acknowledged"
            );
            report.cut = Some((path.clone(), at as u64, reason, dropped));
            break;
        }
    }
    Ok(report)
}
