//! What the replicated logs carry: one openraft type configuration for every group (the
//! metadata group and the data shards), so that one connection pool serves them all.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

openraft::declare_raft_types!(
    /// Sluice's raft types: node ids are `u64`, a node is known by its node-to-node address.
    pub Tc:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
);

/// A log entry's payload, as committed by a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Rows for one table: the body of the engine's log record (the bytes the single-node
    /// log holds for the same write).
    Write(#[serde(with = "as_bytes")] Bytes),
    /// A catalog statement (the metadata group).
    Catalog(String),
    /// Parquet files joining the manifest (the metadata group), as JSON.
    Files(String),
    /// The replica that should lead a data shard from now on (the metadata group): set by
    /// an operator, it replaces the placement's first replica.
    Leader {
        /// The data shard.
        shard: u32,
        /// The node, one of the shard's replicas.
        node: u64,
    },
    /// The cluster's nodes and where each shard's replicas should be (the metadata group),
    /// as JSON: set when a node is added or removed.
    Topology(String),
    /// A data shard's voters are now these nodes (the metadata group): its leader committed
    /// the membership change that the topology asked for.
    Members {
        /// The data shard.
        shard: u32,
        /// Its voters, the preferred leader first.
        replicas: Vec<u64>,
        /// The shard group's log index of that membership (a later one wins).
        at: u64,
    },
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Write(b) => write!(f, "write({} bytes)", b.len()),
            Command::Catalog(s) => write!(f, "catalog({s})"),
            Command::Files(s) => write!(f, "files({} bytes)", s.len()),
            Command::Leader { shard, node } => write!(f, "leader(shard {shard}: node {node})"),
            Command::Topology(s) => write!(f, "topology({s})"),
            Command::Members {
                shard,
                replicas,
                at,
            } => {
                write!(f, "members(shard {shard}: {replicas:?} at {at})")
            }
        }
    }
}

/// What applying a [`Command`] answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Rows applied.
    pub rows: u64,
    /// Why the command was refused, when it was (it is committed and refused on every node
    /// alike, so every replica stays the same).
    pub error: Option<String>,
}

/// A raft group: the metadata group or one data shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GroupId {
    /// Catalog, shard placement and the manifests of Parquet files.
    Meta,
    /// One data shard.
    Shard(u32),
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupId::Meta => f.write_str("meta"),
            GroupId::Shard(n) => write!(f, "shard-{n}"),
        }
    }
}

/// `Bytes` as a CBOR byte string (serde's default would be a sequence of numbers).
pub(crate) mod as_bytes {
    use bytes::Bytes;
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;

    pub(crate) fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes::copy_from_slice(v))
            }
            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes::from(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = seq.next_element::<u8>()? {
                    v.push(b);
                }
                Ok(Bytes::from(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

impl Command {
    /// About how many bytes the command takes encoded (its rows, and room for the rest).
    pub(crate) fn size_hint(&self) -> usize {
        match self {
            Command::Write(rows) => rows.len() + 64,
            _ => 64,
        }
    }
}

/// About how many bytes `entry` takes encoded.
pub(crate) fn entry_size_hint(entry: &openraft::type_config::alias::EntryOf<Tc>) -> usize {
    match &entry.payload {
        openraft::EntryPayload::Normal(c) => c.size_hint() + 16,
        _ => 64,
    }
}

/// About how many bytes `entries` take encoded.
pub(crate) fn entries_size_hint(entries: &[openraft::type_config::alias::EntryOf<Tc>]) -> usize {
    entries.iter().map(entry_size_hint).sum()
}

/// Encodes `value` as CBOR.
pub fn to_cbor<T: Serialize>(value: &T) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    cbor_into(value, &mut out)?;
    Ok(out)
}

/// Appends `value`, encoded as CBOR, to `out` (so a log record or a frame is encoded in
/// place rather than copied in after).
pub(crate) fn cbor_into<T: Serialize>(value: &T, out: &mut Vec<u8>) -> std::io::Result<()> {
    ciborium::into_writer(value, out).map_err(std::io::Error::other)
}

/// Scratch space [`from_cbor`] keeps per thread, at most.
const KEPT_SCRATCH: usize = 4 << 20;

/// Decodes CBOR made by [`to_cbor`].
///
/// ciborium reads a byte string (a shard entry's rows) through its scratch buffer, one
/// buffer-full at a time, into a vector that grows as it goes: with its default 4 KiB
/// scratch a 1 MiB entry took 256 pieces and a dozen reallocations, each copying what came
/// before. A scratch as long as the input reads every byte string in one piece into a
/// vector of its exact size. The scratch is kept per thread, at most [`KEPT_SCRATCH`] long
/// (a longer byte string, such as a large snapshot, comes in pieces of that size).
pub fn from_cbor<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> std::io::Result<T> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let decode = |scratch: &mut [u8]| {
        ciborium::de::from_reader_with_buffer(bytes, scratch)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
    };
    let want = bytes.len().clamp(4096, KEPT_SCRATCH);
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            if scratch.len() < want {
                scratch.resize(want.next_power_of_two().min(KEPT_SCRATCH), 0);
            }
            decode(&mut scratch)
        }
        // Called again while decoding (not done today): a scratch of its own.
        Err(_) => decode(&mut vec![0; want]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte strings longer than ciborium's own scratch, and than the scratch kept per
    /// thread, come back whole; so does a short one after a long one (the kept scratch is
    /// longer than its input).
    #[test]
    fn commands_of_every_size_round_trip() {
        for len in [0, 100, 4096, 4097, 1 << 20, KEPT_SCRATCH + 1, 10] {
            let rows: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let c = Command::Write(Bytes::from(rows));
            let back: Command = from_cbor(&to_cbor(&c).unwrap()).unwrap();
            assert_eq!(back, c, "{len} bytes");
        }
        let truncated = &to_cbor(&Command::Write(Bytes::from(vec![1; 9000]))).unwrap()[..5000];
        assert!(from_cbor::<Command>(truncated).is_err());
    }
}
