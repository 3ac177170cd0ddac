//! `SLUICE_*` environment overrides, mapped onto the config's key tree generically so that
//! a new key is overridable without code here.

use crate::{Config, Error, Result};
use toml::Value;

pub(crate) fn apply(
    config: &mut Config,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<()> {
    let mut tree = Value::try_from(&*config).map_err(|e| Error::Env {
        var: "SLUICE_*".into(),
        reason: e.to_string(),
    })?;
    let mut touched = false;
    for (var, raw) in vars {
        let Some(rest) = var.strip_prefix("SLUICE_") else {
            continue;
        };
        let name = rest.to_ascii_lowercase();
        let slot = find(&mut tree, &name).ok_or_else(|| Error::Env {
            var: var.clone(),
            // The one optional section: absent, its keys are not in the tree.
            reason: match name.starts_with("cluster_") && config.cluster.is_none() {
                true => "names a key of [cluster], which this configuration has not \
                         (a single node: set [cluster] node_id, listen and peers first)"
                    .into(),
                false => "names no configuration key".into(),
            },
        })?;
        *slot = typed(slot, &raw).ok_or_else(|| Error::Env {
            var: var.clone(),
            reason: format!("'{raw}' is not a valid value for this key"),
        })?;
        touched = true;
    }
    if touched {
        *config = tree.try_into().map_err(|e: toml::de::Error| Error::Env {
            var: "SLUICE_*".into(),
            reason: e.to_string(),
        })?;
    }
    Ok(())
}

/// Finds the leaf whose `_`-joined path equals `name` (keys may contain `_` themselves).
fn find<'a>(node: &'a mut Value, name: &str) -> Option<&'a mut Value> {
    let table = node.as_table_mut()?;
    let key = table.keys().find(|k| {
        let v = &table[k.as_str()];
        if v.is_table() {
            name.strip_prefix(k.as_str())
                .is_some_and(|r| r.starts_with('_'))
        } else {
            name == k.as_str()
        }
    })?;
    let key = key.clone();
    let child = table.get_mut(&key)?;
    if child.is_table() {
        find(child, &name[key.len() + 1..])
    } else {
        Some(child)
    }
}

fn typed(current: &Value, raw: &str) -> Option<Value> {
    Some(match current {
        Value::String(_) => Value::String(raw.to_string()),
        Value::Integer(_) => Value::Integer(raw.trim().parse().ok()?),
        Value::Float(_) => Value::Float(raw.trim().parse().ok()?),
        Value::Boolean(_) => Value::Boolean(match raw.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => return None,
        }),
        // Lists of strings are written comma-separated: `SLUICE_MQTT_AUTO_CREATE_DATABASES=a,b`.
        Value::Array(items) if items.iter().all(Value::is_str) => Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        ),
        _ => return None,
    })
}
