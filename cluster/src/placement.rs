//! Which nodes hold which shard, and which node should lead it; which shard a row goes to.

use std::collections::{BTreeMap, BTreeSet};

/// One shard's replicas, its preferred leader first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// The placement after the node set changed to `nodes`: moves as few replicas as it can.
/// Replicas on nodes that left are dropped; shards short of `replication_factor` (capped by
/// the node count) get the nodes holding the fewest replicas; then replicas move one at a
/// time from the fullest node to the emptiest until they differ by at most one, and the
/// preferred leaderships likewise. Deterministic: every node computes the same.
pub fn rebalance(
    current: &[ShardPlacement],
    nodes: &BTreeSet<u64>,
    replication_factor: usize,
) -> Vec<ShardPlacement> {
    if nodes.is_empty() {
        return Vec::new();
    }
    let rf = replication_factor.clamp(1, nodes.len());
    let mut out: Vec<ShardPlacement> = (current.iter())
        .map(|p| {
            let mut replicas: Vec<u64> = Vec::with_capacity(rf);
            for r in &p.replicas {
                if nodes.contains(r) && !replicas.contains(r) && replicas.len() < rf {
                    replicas.push(*r);
                }
            }
            ShardPlacement {
                shard: p.shard,
                replicas,
            }
        })
        .collect();
    let held = |out: &[ShardPlacement], first_only: bool| -> BTreeMap<u64, usize> {
        let mut n: BTreeMap<u64, usize> = nodes.iter().map(|id| (*id, 0)).collect();
        for p in out {
            let counted = if first_only {
                &p.replicas[..1.min(p.replicas.len())]
            } else {
                &p.replicas[..]
            };
            for r in counted {
                *n.entry(*r).or_default() += 1;
            }
        }
        n
    };
    // The node with the fewest of `count` (lowest id among equals), not one of `not_in`.
    let fewest = |count: &BTreeMap<u64, usize>, not_in: &[u64]| {
        (count.iter())
            .filter(|(id, _)| !not_in.contains(id))
            .min_by_key(|(id, c)| (**c, **id))
            .map(|(id, _)| *id)
    };
    for i in 0..out.len() {
        while out[i].replicas.len() < rf {
            let count = held(&out, false);
            let Some(n) = fewest(&count, &out[i].replicas) else {
                break;
            };
            out[i].replicas.push(n);
        }
    }
    // Even out the replicas, then the preferred leaderships: each step moves one from a node
    // holding at least two more than the emptiest node to it, so the loops end.
    for leaders in [false, true] {
        for _ in 0..out.len() * rf * nodes.len() {
            let count = held(&out, leaders);
            let Some(least) = fewest(&count, &[]) else {
                break;
            };
            let lo = count[&least];
            // (shard index, position of the replica that moves), the fullest giver first;
            // among equals a replica that is not its shard's preferred leader, lowest shard.
            let best = (out.iter().enumerate())
                .filter(|(_, p)| p.replicas.contains(&least) == leaders)
                .flat_map(|(i, p)| {
                    let at: &[u64] = if leaders {
                        &p.replicas[..1]
                    } else {
                        &p.replicas
                    };
                    at.iter().enumerate().map(move |(k, r)| (i, k, *r))
                })
                .filter(|(_, _, r)| count[r] >= lo + 2)
                .min_by_key(|(i, k, r)| (std::cmp::Reverse(count[r]), *k == 0, *i));
            let Some((i, k, _)) = best else {
                break;
            };
            let p = &mut out[i];
            if leaders {
                let at = p.replicas.iter().position(|r| *r == least).unwrap_or(0);
                p.replicas.swap(0, at);
            } else {
                p.replicas[k] = least;
            }
        }
    }
    out
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

    fn replicas_of(p: &[ShardPlacement], n: u64) -> usize {
        p.iter().filter(|s| s.replicas.contains(&n)).count()
    }

    fn leads(p: &[ShardPlacement], n: u64) -> usize {
        p.iter().filter(|s| s.replicas[0] == n).count()
    }

    #[test]
    fn a_new_node_takes_its_share_and_little_else_moves() {
        let before = place(&[1, 2, 3].into(), 6, 3);
        let nodes: BTreeSet<u64> = [1, 2, 3, 4].into();
        let after = rebalance(&before, &nodes, 3);
        assert_eq!(after.len(), 6);
        for s in &after {
            let distinct: BTreeSet<_> = s.replicas.iter().collect();
            assert_eq!(distinct.len(), 3, "{s:?}");
        }
        // 18 replicas over 4 nodes: 4 or 5 each; 6 leaderships: 1 or 2 each.
        for n in &nodes {
            assert!((4..=5).contains(&replicas_of(&after, *n)), "{after:?}");
            assert!((1..=2).contains(&leads(&after, *n)), "{after:?}");
        }
        // Only the new node's share moved: each moved replica went to node 4.
        let moved: usize = (before.iter().zip(&after))
            .map(|(b, a)| {
                a.replicas
                    .iter()
                    .filter(|r| !b.replicas.contains(r))
                    .count()
            })
            .sum();
        assert_eq!(moved, replicas_of(&after, 4));
        // The same inputs give the same placement (every node computes it).
        assert_eq!(after, rebalance(&before, &nodes, 3));
        // Nothing changes when the nodes do not.
        assert_eq!(rebalance(&after, &nodes, 3), after);
    }

    #[test]
    fn a_leaving_node_hands_its_replicas_over() {
        let four: BTreeSet<u64> = [1, 2, 3, 4].into();
        let before = rebalance(&place(&[1, 2, 3].into(), 6, 3), &four, 3);
        let after = rebalance(&before, &[2, 3, 4].into(), 3);
        assert_eq!(replicas_of(&after, 1), 0);
        for n in [2, 3, 4] {
            assert_eq!(replicas_of(&after, n), 6, "{after:?}");
            assert_eq!(leads(&after, n), 2, "{after:?}");
        }
        // Down to two nodes: two replicas each (the factor is capped).
        let two = rebalance(&after, &[2, 4].into(), 3);
        assert!(two.iter().all(|s| s.replicas.len() == 2), "{two:?}");
        assert_eq!(leads(&two, 2), 3);
        // Replication factor 1 over 3 nodes: 2 shards each.
        let one = rebalance(&place(&[1, 2].into(), 6, 1), &[1, 2, 3].into(), 1);
        for n in [1, 2, 3] {
            assert_eq!(replicas_of(&one, n), 2, "{one:?}");
        }
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
