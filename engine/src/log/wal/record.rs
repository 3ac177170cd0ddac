//! The WAL record format (version 1).
//!
//! ```text
//! frame   = len:u32le  crc:u32le  body          (len = body length, crc = CRC-32 of body)
//! body    = version:u8  kind:u8  lsn:u64le  payload
//! payload (kind 1, write) = table_id:u64le  ncols:u16le  nrows:u32le  value*(nrows*ncols)
//! payload (kind 2, bridged write) = origin  write   (origin: see crate::ingest::origin::Origin::encode)
//! payload (kind 3, journal) = bytes in the format of the layer that logged them (the broker)
//! value   = tag:u8 [data]  0 null | 1 false | 2 true | 3 i64 | 4 u64 | 5 f64 | 6 str | 7 bytes
//!                          | 8 timestamp i64 | 9 date i32     (str/bytes: len:u32le then bytes)
//! ```
//! A record whose length runs past the end of the file, or whose CRC does not match, is a torn
//! or corrupt tail: replay stops there and the file is cut.

use crate::ingest::origin::Origin;
use crate::types::Value;

/// Version byte written in every record.
pub(crate) const RECORD_VERSION: u8 = 1;
/// Kind byte of a write (rows for one table).
pub(crate) const KIND_WRITE: u8 = 1;
/// Kind byte of a write of a message received from a bridged broker, with its origin.
pub(crate) const KIND_WRITE_ORIGIN: u8 = 2;
/// Kind byte of a journal record (see [`crate::log::wal::Journal`]).
pub(crate) const KIND_JOURNAL: u8 = 3;
/// Frame header: len + crc.
pub(crate) const FRAME_HEADER: usize = 8;
/// Body header: version + kind + lsn.
pub(crate) const BODY_HEADER: usize = 10;
/// Largest body accepted on replay; anything longer is corruption.
pub(crate) const MAX_BODY: usize = 1 << 30;

/// Rows for one table: what a write appends and what apply consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRecord {
    /// Catalog id of the table (ids are never reused).
    pub table_id: u64,
    /// Number of columns each row carries (the table's width when it was written).
    pub ncols: usize,
    /// Rows, each exactly `ncols` values in column order.
    pub rows: Vec<Vec<Value>>,
    /// The bridged message these rows came from, if they came from one.
    pub origin: Option<Origin>,
}

impl WriteRecord {
    /// The record kind this write is logged as.
    pub fn kind(&self) -> u8 {
        match self.origin {
            Some(_) => KIND_WRITE_ORIGIN,
            None => KIND_WRITE,
        }
    }

    /// Encodes the payload (not the frame) of [`WriteRecord::kind`].
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.rows.len() * self.ncols * 9);
        self.encode_into(&mut out);
        out
    }

    /// Appends the payload of [`WriteRecord::kind`] to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        if let Some(o) = &self.origin {
            o.encode(out);
        }
        out.extend_from_slice(&self.table_id.to_le_bytes());
        out.extend_from_slice(&(self.ncols as u16).to_le_bytes());
        out.extend_from_slice(&(self.rows.len() as u32).to_le_bytes());
        for row in &self.rows {
            debug_assert_eq!(row.len(), self.ncols);
            for v in row {
                encode_value(v, out);
            }
        }
    }

    /// Decodes the payload of a record of `kind`; `None` if it is malformed.
    pub fn decode(kind: u8, mut buf: &[u8]) -> Option<Self> {
        let origin = match kind {
            KIND_WRITE => None,
            KIND_WRITE_ORIGIN => Some(Origin::decode(&mut buf)?),
            _ => return None,
        };
        let table_id = u64::from_le_bytes(take(&mut buf, 8)?.try_into().ok()?);
        let ncols = u16::from_le_bytes(take(&mut buf, 2)?.try_into().ok()?) as usize;
        let nrows = u32::from_le_bytes(take(&mut buf, 4)?.try_into().ok()?) as usize;
        // Every value takes at least one byte: refuse counts the buffer cannot hold.
        if nrows.checked_mul(ncols)? > buf.len() {
            return None;
        }
        let mut rows = Vec::with_capacity(nrows);
        for _ in 0..nrows {
            let mut row = Vec::with_capacity(ncols);
            for _ in 0..ncols {
                row.push(decode_value(&mut buf)?);
            }
            rows.push(row);
        }
        buf.is_empty().then_some(Self {
            table_id,
            ncols,
            rows,
            origin,
        })
    }
}

fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(0),
        Value::Bool(false) => out.push(1),
        Value::Bool(true) => out.push(2),
        Value::Int(x) => {
            out.push(3);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::UInt(x) => {
            out.push(4);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Float(x) => {
            out.push(5);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Str(s) => {
            out.push(6);
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bytes(b) => {
            out.push(7);
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        Value::Timestamp(x) => {
            out.push(8);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Date(x) => {
            out.push(9);
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if buf.len() < n {
        return None;
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Some(head)
}

fn decode_value(buf: &mut &[u8]) -> Option<Value> {
    let tag = take(buf, 1)?[0];
    let eight = |buf: &mut &[u8]| -> Option<[u8; 8]> { take(buf, 8)?.try_into().ok() };
    Some(match tag {
        0 => Value::Null,
        1 => Value::Bool(false),
        2 => Value::Bool(true),
        3 => Value::Int(i64::from_le_bytes(eight(buf)?)),
        4 => Value::UInt(u64::from_le_bytes(eight(buf)?)),
        5 => Value::Float(f64::from_le_bytes(eight(buf)?)),
        6 | 7 => {
            let len = u32::from_le_bytes(take(buf, 4)?.try_into().ok()?) as usize;
            let bytes = take(buf, len)?;
            if tag == 6 {
                Value::Str(std::str::from_utf8(bytes).ok()?.to_string())
            } else {
                Value::Bytes(bytes.to_vec())
            }
        }
        8 => Value::Timestamp(i64::from_le_bytes(eight(buf)?)),
        9 => Value::Date(i32::from_le_bytes(take(buf, 4)?.try_into().ok()?)),
        _ => return None,
    })
}

/// Appends one frame (header, body header, payload) to `out`.
pub(crate) fn encode_frame(lsn: u64, kind: u8, payload: &[u8], out: &mut Vec<u8>) {
    let body_len = BODY_HEADER + payload.len();
    let mut head = [0u8; BODY_HEADER];
    head[0] = RECORD_VERSION;
    head[1] = kind;
    head[2..].copy_from_slice(&lsn.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    crc.update(payload);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
}

/// One frame read back.
#[derive(Debug, PartialEq)]
pub(crate) struct Frame<'a> {
    /// Log sequence number.
    pub lsn: u64,
    /// Record kind.
    pub kind: u8,
    /// Payload bytes.
    pub payload: &'a [u8],
}

/// Why reading stopped before the end of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// The buffer ends inside a frame (a write cut short by a crash).
    Torn,
    /// The frame is complete but its checksum, version or length is wrong.
    Corrupt(String),
}

/// Reads the frame at the start of `buf`. `Ok(None)` at a clean end.
pub(crate) fn decode_frame(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.len() < FRAME_HEADER {
        return Err(FrameError::Torn);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if !(BODY_HEADER..=MAX_BODY).contains(&len) {
        // A zeroed or garbage length: a preallocated or torn tail looks like this too.
        return Err(if buf[..8].iter().all(|b| *b == 0) {
            FrameError::Torn
        } else {
            FrameError::Corrupt(format!("impossible record length {len}"))
        });
    }
    if buf.len() < FRAME_HEADER + len {
        return Err(FrameError::Torn);
    }
    let body = &buf[FRAME_HEADER..FRAME_HEADER + len];
    if crc32fast::hash(body) != crc {
        return Err(FrameError::Corrupt("checksum mismatch".into()));
    }
    if body[0] != RECORD_VERSION {
        return Err(FrameError::Corrupt(format!(
            "unknown record version {}",
            body[0]
        )));
    }
    let lsn = u64::from_le_bytes(body[2..10].try_into().expect("8 bytes"));
    Ok(Some((
        Frame {
            lsn,
            kind: body[1],
            payload: &body[BODY_HEADER..],
        },
        FRAME_HEADER + len,
    )))
}

/// Appends a record as a shard's log carries it to `out`: its kind, then its payload.
pub fn encode_record(record: &WriteRecord, out: &mut Vec<u8>) {
    out.push(record.kind());
    record.encode_into(out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            any::<u64>().prop_map(Value::UInt),
            any::<f64>()
                .prop_filter("NaN != NaN", |f| !f.is_nan())
                .prop_map(Value::Float),
            ".{0,40}".prop_map(Value::Str),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
            any::<i64>().prop_map(Value::Timestamp),
            any::<i32>().prop_map(Value::Date),
        ]
    }

    fn origin() -> impl Strategy<Value = Option<Origin>> {
        proptest::option::of(
            (
                "[a-z0-9_-]{1,12}",
                any::<u16>(),
                ".{0,30}",
                any::<Vec<u8>>(),
            )
                .prop_map(|(s, pkid, topic, payload)| Origin::new(&s, pkid, &topic, &payload)),
        )
    }

    fn record() -> impl Strategy<Value = WriteRecord> {
        (1usize..6).prop_flat_map(|ncols| {
            (
                any::<u64>(),
                proptest::collection::vec(proptest::collection::vec(value(), ncols), 0..8),
                origin(),
            )
                .prop_map(move |(table_id, rows, origin)| WriteRecord {
                    table_id,
                    ncols,
                    rows,
                    origin,
                })
        })
    }

    proptest! {
        #[test]
        fn payload_roundtrip(r in record()) {
            prop_assert_eq!(WriteRecord::decode(r.kind(), &r.encode()), Some(r));
        }

        #[test]
        fn frames_roundtrip_and_every_cut_is_detected(
            recs in proptest::collection::vec(record(), 1..5),
            cut_seed in any::<usize>(),
            flip_seed in any::<usize>(),
        ) {
            let mut log = Vec::new();
            let mut ends = Vec::new();
            for (i, r) in recs.iter().enumerate() {
                encode_frame(i as u64 + 1, r.kind(), &r.encode(), &mut log);
                ends.push(log.len());
            }
            // Whole log reads back exactly.
            let mut off = 0;
            for (i, r) in recs.iter().enumerate() {
                let (f, n) = decode_frame(&log[off..]).unwrap().unwrap();
                prop_assert_eq!(f.lsn, i as u64 + 1);
                prop_assert_eq!(WriteRecord::decode(f.kind, f.payload), Some(r.clone()));
                off += n;
            }
            prop_assert_eq!(decode_frame(&log[off..]), Ok(None));

            // A cut anywhere yields exactly the records that ended before it, then Torn.
            let cut = cut_seed % log.len();
            let mut off = 0;
            let mut read = 0;
            loop {
                match decode_frame(&log[off..cut]) {
                    Ok(Some((_, n))) => { off += n; read += 1; }
                    Ok(None) => break,
                    Err(e) => { prop_assert_eq!(e, FrameError::Torn); break; }
                }
            }
            prop_assert_eq!(read, ends.iter().filter(|e| **e <= cut).count());

            // A flipped bit anywhere is never read back as a valid different record.
            let mut bad = log.clone();
            let pos = flip_seed % bad.len();
            bad[pos] ^= 0x10;
            let mut off = 0;
            let mut i = 0;
            while let Ok(Some((f, n))) = decode_frame(&bad[off..]) {
                prop_assert_eq!(WriteRecord::decode(f.kind, f.payload), Some(recs[i].clone()));
                off += n;
                i += 1;
            }
            prop_assert!(i < recs.len(), "a flipped bit went unnoticed");
        }
    }
}
