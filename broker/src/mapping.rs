//! Which table a topic writes into, and with which payload format.
//!
//! Tried in order: MQTT 5 user properties `db` and `table` on the message; the `[[topic]]`
//! rules of the config (named wildcards capture levels into columns); the JoinBase
//! convention `/db/table`. A topic none of them maps is plain publish/subscribe.

use crate::error::{Error, Result};
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use sluice_conf::{RetainFrom, TopicRule};
use sluice_engine::Format;

/// Where one message goes; names borrow from the topic, its properties or the rule, so
/// mapping a message allocates nothing unless a rule captures levels.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Target<'a> {
    pub(crate) database: &'a str,
    pub(crate) table: &'a str,
    pub(crate) format: Format,
    /// Columns filled from captured topic levels: (column, text).
    pub(crate) fixed: Vec<(String, String)>,
}

#[derive(Debug)]
enum Level {
    Exact(String),
    /// `+` or `+name` (captured into column `name`).
    One(Option<String>),
    /// A final `#`.
    Rest,
}

#[derive(Debug)]
struct Rule {
    levels: Vec<Level>,
    database: String,
    table: String,
    format: Option<Format>,
    /// `retain = "latest"`: the table's newest rows are the topics' retained messages.
    latest: bool,
}

/// A `retain = "latest"` rule ([`Mapper::latest_rules`]): its table, and the topic each of
/// its rows makes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LatestRule<'a>(&'a Rule);

/// The compiled topic rules.
#[derive(Debug, Default)]
pub(crate) struct Mapper {
    rules: Vec<Rule>,
}

impl Mapper {
    /// Compiles the `[[topic]]` rules, refusing filters that could never match.
    pub(crate) fn new(rules: &[TopicRule]) -> Result<Self> {
        let mut out = Vec::with_capacity(rules.len());
        for (i, r) in rules.iter().enumerate() {
            let bad = |reason: String| Error::Setup {
                what: format!("topic rule {} ({:?})", i + 1, r.filter),
                reason,
            };
            let parts: Vec<&str> = r.filter.split('/').collect();
            let mut levels = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                levels.push(match *p {
                    "#" if j + 1 == parts.len() => Level::Rest,
                    "+" => Level::One(None),
                    p if p.starts_with('+') => Level::One(Some(p[1..].to_string())),
                    p if p.contains(['+', '#']) => {
                        return Err(bad(format!("level {p:?}: wildcards fill a whole level")));
                    }
                    p => Level::Exact(p.to_string()),
                });
            }
            let (database, table) = match r.table.split_once('.') {
                Some((d, t)) => (d.to_string(), t.to_string()),
                None => ("default".to_string(), r.table.clone()),
            };
            let format = match r.format.as_str() {
                "json" => Some(Format::Json),
                "csv" => Some(Format::Csv),
                "line" => Some(Format::LineProtocol),
                "auto" => None,
                other => return Err(bad(format!("unknown format {other:?}"))),
            };
            out.push(Rule {
                levels,
                database,
                table,
                format,
                latest: r.retain == RetainFrom::Latest,
            });
        }
        Ok(Self { rules: out })
    }

    /// Whether `topic`'s retained message is its table's newest row (it maps through a
    /// `retain = "latest"` rule), not one the broker keeps.
    pub(crate) fn retains_latest(&self, topic: &str) -> bool {
        (self.rules.iter())
            .find(|r| r.capture(topic).is_some())
            .is_some_and(|r| r.latest)
    }

    /// The `retain = "latest"` rules some of whose topics `filter` (a subscription's)
    /// matches.
    pub(crate) fn latest_rules(&self, filter: &str) -> impl Iterator<Item = LatestRule<'_>> {
        (self.rules.iter())
            .filter(move |r| r.latest && r.meets(filter))
            .map(LatestRule)
    }

    /// The table `topic` writes into, if any.
    pub(crate) fn map<'a>(
        &'a self,
        topic: &'a str,
        props: Option<&'a PublishProperties>,
        payload: &[u8],
    ) -> Option<Target<'a>> {
        let user = |key: &str| {
            props.and_then(|p| {
                p.user_properties
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.as_str())
            })
        };
        let declared = user("format").and_then(Format::from_name).or_else(|| {
            props
                .and_then(|p| p.content_type.as_deref())
                .and_then(format_of_content_type)
        });
        let format =
            |rule: Option<Format>| rule.or(declared).unwrap_or_else(|| Format::sniff(payload));
        if let Some(table) = user("table") {
            return Some(Target {
                database: user("db").unwrap_or("default"),
                table,
                format: format(None),
                fixed: Vec::new(),
            });
        }
        for rule in &self.rules {
            if let Some(fixed) = rule.capture(topic) {
                return Some(Target {
                    database: &rule.database,
                    table: &rule.table,
                    format: format(rule.format),
                    fixed,
                });
            }
        }
        let (db, table) = topic.strip_prefix('/')?.split_once('/')?;
        if db.is_empty() || table.is_empty() || table.contains('/') {
            return None;
        }
        Some(Target {
            database: db,
            table,
            format: format(None),
            fixed: Vec::new(),
        })
    }
}

impl<'a> LatestRule<'a> {
    /// The rule's table: (database, table).
    pub(crate) fn table(&self) -> (&'a str, &'a str) {
        (&self.0.database, &self.0.table)
    }

    /// The names of the levels a topic fills (the columns a row makes its topic of).
    pub(crate) fn named(&self) -> impl Iterator<Item = &'a str> {
        (self.0.levels.iter()).filter_map(|l| match l {
            Level::One(Some(n)) => Some(n.as_str()),
            _ => None,
        })
    }

    /// The topic of a row whose named levels' values `value` gives (`None` for a value
    /// that cannot be a level: missing, empty, or holding `/`, `+` or `#`).
    pub(crate) fn topic(&self, mut value: impl FnMut(&str) -> Option<String>) -> Option<String> {
        let mut out = Vec::with_capacity(self.0.levels.len());
        for l in &self.0.levels {
            out.push(match l {
                Level::Exact(e) => e.clone(),
                Level::One(Some(n)) => {
                    let v = value(n)?;
                    if v.is_empty() || v.contains(['/', '+', '#']) {
                        return None;
                    }
                    v
                }
                // Refused by the config's validation.
                Level::One(None) | Level::Rest => return None,
            });
        }
        Some(out.join("/"))
    }
}

impl Rule {
    /// Whether some topic matches both this rule's filter and `filter`.
    fn meets(&self, filter: &str) -> bool {
        let mut parts = filter.split('/');
        for level in &self.levels {
            match (level, parts.next()) {
                (_, Some("#")) | (Level::Rest, _) => return true,
                (_, None) => return false,
                (Level::One(_), Some(_)) | (_, Some("+")) => {}
                (Level::Exact(e), Some(p)) if e == p => {}
                _ => return false,
            }
        }
        match parts.next() {
            None => true,
            // `a/#` matches `a` itself.
            Some("#") => parts.next().is_none(),
            Some(_) => false,
        }
    }

    fn capture(&self, topic: &str) -> Option<Vec<(String, String)>> {
        let mut fixed = Vec::new();
        let mut parts = topic.split('/');
        for level in &self.levels {
            match (level, parts.next()) {
                (Level::Rest, _) => return Some(fixed),
                (Level::One(name), Some(p)) => {
                    if let Some(name) = name {
                        fixed.push((name.clone(), p.to_string()));
                    }
                }
                (Level::Exact(e), Some(p)) if e == p => {}
                _ => return None,
            }
        }
        parts.next().is_none().then_some(fixed)
    }
}

fn format_of_content_type(ct: &str) -> Option<Format> {
    let ct = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match ct.as_str() {
        "application/json" | "application/x-ndjson" | "application/jsonl" => Some(Format::Json),
        "text/csv" => Some(Format::Csv),
        "application/x-influx-line-protocol" | "text/x-influx-line-protocol" => {
            Some(Format::LineProtocol)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(filter: &str, table: &str) -> TopicRule {
        TopicRule {
            filter: filter.into(),
            table: table.into(),
            format: "auto".into(),
            retain: RetainFrom::Messages,
        }
    }

    #[test]
    fn latest_rules_meet_filters_and_make_topics() {
        let mut r = rule("factory/+site/+device/telemetry", "iot.telemetry");
        r.retain = RetainFrom::Latest;
        let m = Mapper::new(&[r, rule("other/+x", "iot.other")]).unwrap();
        assert!(m.retains_latest("factory/berlin/d7/telemetry"));
        assert!(!m.retains_latest("other/x1"));
        assert!(!m.retains_latest("factory/berlin/d7"));
        for (filter, meets) in [
            ("#", true),
            ("factory/#", true),
            ("factory/+/+/telemetry", true),
            ("factory/berlin/d7/telemetry", true),
            ("factory/+/d7/#", true),
            ("factory/+/+/telemetry/#", true),
            ("factory/+/+", false),
            ("factory/+/+/status", false),
            ("plant/#", false),
            ("other/#", false),
            ("factory/a/b/telemetry/x", false),
        ] {
            assert_eq!(m.latest_rules(filter).count() == 1, meets, "{filter}");
        }
        let l = m.latest_rules("#").next().unwrap();
        assert_eq!(l.table(), ("iot", "telemetry"));
        assert_eq!(l.named().collect::<Vec<_>>(), ["site", "device"]);
        let value = |bad: &'static str| {
            move |n: &str| match n {
                "site" => Some("berlin".to_string()),
                _ => Some(bad.to_string()),
            }
        };
        assert_eq!(
            l.topic(value("d7")).as_deref(),
            Some("factory/berlin/d7/telemetry")
        );
        for bad in ["", "a/b", "a+", "#"] {
            assert_eq!(l.topic(value(bad)), None, "{bad:?}");
        }
        assert_eq!(l.topic(|_| None), None);
    }

    #[test]
    fn rules_capture_named_levels() {
        let m = Mapper::new(&[rule("factory/+site/+device/telemetry", "iot.telemetry")]).unwrap();
        let t = m.map("factory/berlin/d7/telemetry", None, b"{}").unwrap();
        assert_eq!((t.database, t.table), ("iot", "telemetry"));
        assert_eq!(
            t.fixed,
            vec![
                ("site".into(), "berlin".into()),
                ("device".into(), "d7".into())
            ]
        );
        assert_eq!(t.format, Format::Json);
        assert!(m.map("factory/berlin/d7/other", None, b"").is_none());
        assert!(m.map("factory/berlin/telemetry", None, b"").is_none());
    }

    #[test]
    fn joinbase_convention_and_user_properties() {
        let m = Mapper::default();
        let t = m.map("/db1/t1", None, b"1,2").unwrap();
        assert_eq!((t.database, t.table, t.format), ("db1", "t1", Format::Csv));
        assert!(m.map("db1/t1", None, b"").is_none());
        assert!(m.map("/db1/t1/x", None, b"").is_none());
        let props = PublishProperties {
            user_properties: vec![("db".into(), "d".into()), ("table".into(), "t".into())],
            content_type: Some("application/x-influx-line-protocol".into()),
            ..Default::default()
        };
        let t = m.map("any/topic", Some(&props), b"x").unwrap();
        assert_eq!((t.database, t.table), ("d", "t"));
        assert_eq!(t.format, Format::LineProtocol);
    }
}
