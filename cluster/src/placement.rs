//! Which nodes hold which shard, and which node should lead it; which shard a row goes to.

use std::collections::BTreeSet;

/// One shard's replicas, its preferred leader first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlacement {
    /// The shard's number.
    pub shard: u32,
    /// Nodes holding a replica; the first is the preferred leader.
    pub replicas: Vec<u64>,
}

/// Places `shards` shards on `nodes` with `replication_factor` replicas each (capped by the
/// node count): shard `s` goes to the `replication_factor` nodes after position `s` in id
/// order, so each node holds the same number of replicas (give or take one) and prefers to
/// lead every n-th shard, spreading the leaders evenly.
pub fn place(nodes: &BTreeSet<u64>, shards: u32, replication_factor: usize) -> Vec<ShardPlacement> {
    let nodes: Vec<u64> = nodes.iter().copied().collect();
    if nodes.is_empty() {
        return Vec::new();
    }
    let rf = replication_factor.clamp(1, nodes.len());
    (0..shards)
        .map(|shard| ShardPlacement {
            shard,
            replicas: (0..rf)
                .map(|k| nodes[(shard as usize + k) % nodes.len()])
                .collect(),
        })
        .collect()
}

/// The shard of a row whose shard key is `key` (stable across nodes, restarts and releases:
/// CRC-32 of the key's bytes).
pub fn shard_of(key: &[u8], shards: u32) -> u32 {
    crc32fast::hash(key) % shards.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_and_leaders_are_spread_evenly() {
        let nodes: BTreeSet<u64> = [1, 2, 3].into();
        let p = place(&nodes, 6, 3);
        assert_eq!(p.len(), 6);
        for n in &nodes {
            let leads = p.iter().filter(|s| s.replicas[0] == *n).count();
            assert_eq!(leads, 2, "node {n} leads {leads} of 6");
            assert_eq!(p.iter().filter(|s| s.replicas.contains(n)).count(), 6);
        }
        for s in &p {
            let distinct: BTreeSet<_> = s.replicas.iter().collect();
            assert_eq!(distinct.len(), 3);
        }
    }

    #[test]
    fn the_replication_factor_is_capped_by_the_nodes() {
        let p = place(&[7].into(), 2, 3);
        assert_eq!(p[0].replicas, vec![7]);
        assert_eq!(p[1].replicas, vec![7]);
        let p = place(&[1, 2, 3, 4, 5].into(), 5, 2);
        assert!(p.iter().all(|s| s.replicas.len() == 2));
        assert!(place(&BTreeSet::new(), 3, 3).is_empty());
    }

    #[test]
    fn shard_keys_hash_stably() {
        assert_eq!(
            shard_of(b"plant-a/dev-7", 8),
            crc32fast::hash(b"plant-a/dev-7") % 8
        );
        let mut hits = [0u32; 4];
        for d in 0..4000 {
            hits[shard_of(format!("device-{d}").as_bytes(), 4) as usize] += 1;
        }
        assert!(hits.iter().all(|h| (800..1200).contains(h)), "{hits:?}");
    }
}
