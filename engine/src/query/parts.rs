//! The partitions a `WHERE PARTS` clause names (JoinBase grammar): keys `k`, ranges `a..b`
//! (end excluded) and `a..=b` (end included), and `last N` (the N newest partitions that hold
//! rows). [`crate::query::dialect`] reads the clause from SQL tokens; the table provider applies it.
//!
//! Between the two the list travels inside the table's name (`t WHERE PARTS 1,2..4`), in the
//! canonical spelling [`PartsSpec`]'s `Display` writes and [`PartsSpec::parse`] reads back: so
//! a planned query carries it with no side channel, and `EXPLAIN` shows it.

use std::collections::BTreeSet;
use std::fmt;

/// One item of the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartsItem {
    /// One partition key.
    Key(u64),
    /// `lo..hi` (`inclusive`: `lo..=hi`).
    Range {
        /// First key.
        lo: u64,
        /// Last key, or one past it.
        hi: u64,
        /// Whether `hi` is in the range.
        inclusive: bool,
    },
    /// The `n` newest partitions.
    Last(u64),
}

impl PartsItem {
    fn admits(&self, k: u64) -> bool {
        match *self {
            Self::Key(x) => k == x,
            Self::Range { lo, hi, inclusive } => k >= lo && (k < hi || (inclusive && k == hi)),
            Self::Last(_) => false,
        }
    }
}

/// The whole list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartsSpec {
    /// Items in the order written.
    pub items: Vec<PartsItem>,
}

/// Marks a table name that carries a partition list.
pub(crate) const MARKER: &str = " WHERE PARTS ";

impl fmt::Display for PartsSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match item {
                PartsItem::Key(k) => write!(f, "{k}")?,
                PartsItem::Range { lo, hi, inclusive } => {
                    write!(f, "{lo}..{}{hi}", if *inclusive { "=" } else { "" })?
                }
                PartsItem::Last(n) => write!(f, "last {n}")?,
            }
        }
        Ok(())
    }
}

impl PartsSpec {
    /// Reads the canonical spelling back (only ever what `Display` wrote).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let items = text
            .split(',')
            .map(|item| {
                if let Some(n) = item.strip_prefix("last ") {
                    return Some(PartsItem::Last(n.parse().ok()?));
                }
                if let Some((lo, hi)) = item.split_once("..") {
                    let (hi, inclusive) = match hi.strip_prefix('=') {
                        Some(h) => (h, true),
                        None => (hi, false),
                    };
                    return Some(PartsItem::Range {
                        lo: lo.parse().ok()?,
                        hi: hi.parse().ok()?,
                        inclusive,
                    });
                }
                item.parse().ok().map(PartsItem::Key)
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self { items })
    }

    /// Splits a table name into the name and its partition list, if it carries one.
    pub(crate) fn split_name(name: &str) -> (&str, Option<Self>) {
        match name.split_once(MARKER) {
            Some((table, spec)) => match Self::parse(spec) {
                Some(spec) => (table, Some(spec)),
                None => (name, None),
            },
            None => (name, None),
        }
    }

    /// The table name that carries this list.
    pub(crate) fn table_name(&self, table: &str) -> String {
        format!("{table}{MARKER}{self}")
    }

    /// The keys named, given the keys of the partitions that hold rows (ascending), which
    /// `last N` picks from. Keys of partitions that do not exist may be returned: they are
    /// empty.
    pub(crate) fn selector(&self, existing: impl DoubleEndedIterator<Item = u64>) -> PartsSelector {
        let last = self
            .items
            .iter()
            .filter_map(|i| match i {
                PartsItem::Last(n) => Some(*n),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let newest: BTreeSet<u64> = existing
            .rev()
            .take(usize::try_from(last).unwrap_or(usize::MAX))
            .collect();
        PartsSelector {
            items: self.items.clone(),
            newest,
        }
    }
}

/// A [`PartsSpec`] resolved against the partitions that exist at scan time.
#[derive(Debug, Clone)]
pub(crate) struct PartsSelector {
    items: Vec<PartsItem>,
    newest: BTreeSet<u64>,
}

impl PartsSelector {
    /// True if partition `k` is named.
    pub(crate) fn admits(&self, k: u64) -> bool {
        let last = |n: u64| {
            // `newest` holds the largest count asked for; a smaller `last n` takes its top n.
            self.newest
                .iter()
                .rev()
                .take(usize::try_from(n).unwrap_or(usize::MAX))
                .any(|x| *x == k)
        };
        self.items.iter().any(|i| match i {
            PartsItem::Last(n) => last(*n),
            other => other.admits(k),
        })
    }

    /// Smallest and largest key that can be admitted (for a range scan of the partitions).
    pub(crate) fn bounds(&self) -> (u64, u64) {
        let mut lo = u64::MAX;
        let mut hi = 0;
        for i in &self.items {
            let (a, b) = match *i {
                PartsItem::Key(k) => (k, k),
                PartsItem::Range {
                    lo,
                    hi,
                    inclusive: true,
                } => (lo, hi),
                PartsItem::Range { lo, hi, .. } if hi > lo => (lo, hi - 1),
                PartsItem::Range { .. } => continue,
                PartsItem::Last(_) => match (self.newest.first(), self.newest.last()) {
                    (Some(a), Some(b)) => (*a, *b),
                    _ => continue,
                },
            };
            lo = lo.min(a);
            hi = hi.max(b);
        }
        (lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_round_trip() {
        let spec = PartsSpec {
            items: vec![
                PartsItem::Key(7),
                PartsItem::Range {
                    lo: 1,
                    hi: 5,
                    inclusive: false,
                },
                PartsItem::Range {
                    lo: 10,
                    hi: 12,
                    inclusive: true,
                },
                PartsItem::Last(3),
            ],
        };
        let text = spec.to_string();
        assert_eq!(text, "7,1..5,10..=12,last 3");
        assert_eq!(PartsSpec::parse(&text), Some(spec.clone()));
        assert_eq!(
            PartsSpec::split_name(&spec.table_name("t")),
            ("t", Some(spec))
        );
        assert_eq!(PartsSpec::split_name("plain"), ("plain", None));
    }

    #[test]
    fn selection() {
        let spec = PartsSpec::parse("3..5,9..=10,last 2").unwrap();
        let sel = spec.selector([1u64, 3, 4, 5, 9, 20, 30].into_iter());
        let picked: Vec<u64> = (0..40).filter(|k| sel.admits(*k)).collect();
        assert_eq!(picked, vec![3, 4, 9, 10, 20, 30]);
        assert_eq!(sel.bounds(), (3, 30));
        let one = PartsSpec::parse("last 1,last 3").unwrap();
        let sel = one.selector([1u64, 2, 3, 4].into_iter());
        assert_eq!(
            (0..10).filter(|k| sel.admits(*k)).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        let empty = PartsSpec::parse("5..5").unwrap();
        let sel = empty.selector(std::iter::empty());
        assert!((0..10).all(|k| !sel.admits(k)));
        assert!(sel.bounds().0 > sel.bounds().1);
    }
}
