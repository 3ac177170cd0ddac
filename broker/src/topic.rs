//! Topic names and filters: validation, shared-subscription syntax, and the subscription
//! tree that finds every filter matching a topic without looking at the others.

use std::collections::HashMap;

/// Longest topic name or filter MQTT can carry.
const MAX_LEN: usize = 65_535;

/// A topic name a client may publish to: non-empty, no wildcards, no NUL.
pub(crate) fn valid_name(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= MAX_LEN && !topic.contains(['+', '#', '\0'])
}

/// A topic filter: `+` fills a whole level, `#` only the whole last level.
pub(crate) fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.len() > MAX_LEN || filter.contains('\0') {
        return false;
    }
    let levels: Vec<&str> = filter.split('/').collect();
    levels.iter().enumerate().all(|(i, l)| match *l {
        "#" => i == levels.len() - 1,
        "+" => true,
        l => !l.contains(['+', '#']),
    })
}

/// Splits `$share/{group}/{filter}` into the group and the filter.
pub(crate) fn parse_shared(filter: &str) -> Option<(&str, &str)> {
    let rest = filter.strip_prefix("$share/")?;
    let (group, filter) = rest.split_once('/')?;
    Some((group, filter))
}

pub(crate) use sluice_engine::access::topic_matches as matches;

/// Filters arranged by level, each leaf holding the values subscribed with that filter.
#[derive(Debug)]
pub(crate) struct Tree<K, V> {
    root: Node<K, V>,
}

#[derive(Debug)]
struct Node<K, V> {
    children: HashMap<String, Node<K, V>>,
    values: HashMap<K, V>,
}

impl<K, V> Default for Node<K, V> {
    fn default() -> Self {
        Self {
            children: HashMap::new(),
            values: HashMap::new(),
        }
    }
}

impl<K, V> Default for Tree<K, V> {
    fn default() -> Self {
        Self {
            root: Node::default(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone, V> Tree<K, V> {
    /// Adds or replaces `key`'s value under `filter`; returns the value it replaced.
    pub(crate) fn insert(&mut self, filter: &str, key: K, value: V) -> Option<V> {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.children.entry(level.to_string()).or_default();
        }
        node.values.insert(key, value)
    }

    /// Removes `key` from `filter`; returns its value. Empty branches are pruned.
    pub(crate) fn remove(&mut self, filter: &str, key: &K) -> Option<V> {
        fn go<K: std::hash::Hash + Eq, V>(
            node: &mut Node<K, V>,
            levels: &[&str],
            key: &K,
        ) -> Option<V> {
            let Some((first, rest)) = levels.split_first() else {
                return node.values.remove(key);
            };
            let child = node.children.get_mut(*first)?;
            let out = go(child, rest, key);
            if child.values.is_empty() && child.children.is_empty() {
                node.children.remove(*first);
            }
            out
        }
        let levels: Vec<&str> = filter.split('/').collect();
        go(&mut self.root, &levels, key)
    }

    /// Calls `f(filter_node_values)` for every filter matching `topic`.
    pub(crate) fn for_each_match<'a>(&'a self, topic: &str, mut f: impl FnMut(&'a K, &'a V)) {
        // Nothing subscribed: no filter can match (a topic has at least one level).
        if self.root.children.is_empty() {
            return;
        }
        // The levels on the stack for the usual topic, in a vector past `SHORT` of them.
        const SHORT: usize = 16;
        let mut short = [""; SHORT];
        let mut long = Vec::new();
        let mut n = 0;
        for level in topic.split('/') {
            match n < SHORT {
                true => short[n] = level,
                false if long.is_empty() => {
                    long.extend_from_slice(&short);
                    long.push(level);
                }
                false => long.push(level),
            }
            n += 1;
        }
        let levels = if n <= SHORT { &short[..n] } else { &long[..] };
        let dollar = topic.starts_with('$');
        walk(&self.root, levels, 0, dollar, &mut f);
    }

    /// Number of filters with at least one value.
    #[cfg(test)]
    fn len(&self) -> usize {
        fn count<K, V>(n: &Node<K, V>) -> usize {
            usize::from(!n.values.is_empty()) + n.children.values().map(count).sum::<usize>()
        }
        count(&self.root)
    }
}

fn walk<'a, K, V>(
    node: &'a Node<K, V>,
    levels: &[&str],
    depth: usize,
    dollar: bool,
    f: &mut impl FnMut(&'a K, &'a V),
) {
    let wild = !(dollar && depth == 0);
    if wild {
        // `a/#` matches `a` itself as well as everything below it.
        if let Some(hash) = node.children.get("#") {
            hash.values.iter().for_each(|(k, v)| f(k, v));
        }
    }
    let Some((first, rest)) = levels.split_first() else {
        node.values.iter().for_each(|(k, v)| f(k, v));
        return;
    };
    if let Some(child) = node.children.get(*first) {
        walk(child, rest, depth + 1, dollar, f);
    }
    if wild && let Some(child) = node.children.get("+") {
        walk(child, rest, depth + 1, dollar, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hits(tree: &Tree<u32, ()>, topic: &str) -> Vec<u32> {
        let mut out = Vec::new();
        tree.for_each_match(topic, |k, _| out.push(*k));
        out.sort();
        out
    }

    #[test]
    fn wildcards_and_dollar_topics() {
        let mut t = Tree::default();
        for (i, f) in ["a/b", "a/+", "a/#", "#", "+/b", "$SYS/#", "a/b/#"]
            .iter()
            .enumerate()
        {
            t.insert(f, i as u32, ());
        }
        assert_eq!(hits(&t, "a/b"), vec![0, 1, 2, 3, 4, 6]);
        assert_eq!(hits(&t, "a"), vec![2, 3]);
        assert_eq!(hits(&t, "$SYS/x"), vec![5]);
        assert_eq!(hits(&t, "x/b/c"), vec![3]);
        assert!(t.remove("a/b/#", &6).is_some());
        assert!(t.remove("a/b/#", &6).is_none());
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn empty_trees_and_deep_topics() {
        let mut t = Tree::default();
        assert_eq!(hits(&t, "a/b"), Vec::<u32>::new());
        // Past the levels kept on the stack, matching goes on the same.
        let deep: Vec<String> = (0..40).map(|i| format!("l{i}")).collect();
        let topic = deep.join("/");
        for (i, f) in [
            topic.clone(),
            format!("{}/+", deep[..39].join("/")),
            format!("{}/#", deep[..16].join("/")),
            format!("{}/#", deep[..17].join("/")),
            format!("{}/x", deep[..39].join("/")),
            format!("{}/l16", deep[..16].join("/")),
        ]
        .iter()
        .enumerate()
        {
            t.insert(f, i as u32, ());
        }
        assert_eq!(hits(&t, &topic), vec![0, 1, 2, 3]);
        assert_eq!(hits(&t, &deep[..17].join("/")), vec![2, 3, 5]);
        assert_eq!(hits(&t, &deep[..16].join("/")), vec![2]);
    }

    #[test]
    fn validation() {
        assert!(valid_filter("a/+/c/#") && valid_filter("#") && valid_filter("+"));
        assert!(!valid_filter("a/#/c") && !valid_filter("a+") && !valid_filter(""));
        assert!(valid_name("a/b") && !valid_name("a/+") && !valid_name(""));
        assert_eq!(parse_shared("$share/g/a/+"), Some(("g", "a/+")));
        assert_eq!(parse_shared("$share/g"), None);
    }

    proptest! {
        #[test]
        fn tree_agrees_with_matches(
            filters in prop::collection::vec("(a|b|\\+|\\$s)(/(a|b|\\+))*(/#)?", 1..12),
            topic in "(a|b|\\$s)(/(a|b)){0,4}",
        ) {
            let mut tree = Tree::default();
            for (i, f) in filters.iter().enumerate() {
                tree.insert(f, i as u32, ());
            }
            let mut expect: Vec<u32> = filters
                .iter()
                .enumerate()
                .filter(|(_, f)| matches(f, &topic))
                .map(|(i, _)| i as u32)
                .collect();
            expect.sort();
            prop_assert_eq!(hits(&tree, &topic), expect);
        }
    }
}
