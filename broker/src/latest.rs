//! Retained messages served from tables: under a `[[topic]]` rule with `retain = "latest"`,
//! each key's newest row of the rule's table (its last-value cache) is the retained message
//! of the topic that row's named levels make, its payload a JSON object of the row's other
//! columns. The broker keeps no copy of those messages: the table is their store, so they
//! survive restarts and flushes and are the same on every node of a cluster.

use crate::BrokerState;
use crate::mapping::LatestRule;
use crate::session::{Delivery, Message, Session, SubOptions};
use crate::topic;
use arrow::array::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use rumqttc::v5::mqttbytes::QoS;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Said once per process: a rule whose table's key columns are not all its named levels.
static MISFIT_SAID: AtomicBool = AtomicBool::new(false);

/// What a new subscription of `session` to `filter` (not shared) gets from the tables of
/// the `retain = "latest"` rules it meets: each key's newest row whose topic it matches and
/// its user may receive, at QoS 1 at most (rows are stored durably), flagged retained.
pub(crate) async fn retained_rows(
    shared: &BrokerState,
    session: &Session,
    filter: &str,
    options: &SubOptions,
) -> Vec<Delivery> {
    let mut out = Vec::new();
    let user = session.user.lock().clone();
    for rule in shared.mapper.latest_rules(filter) {
        let (database, table) = rule.table();
        let latest = match shared.db.latest_rows(database, table).await {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(database, table, error = %e, "newest rows not read for retained messages");
                continue;
            }
        };
        let named: Vec<&str> = rule.named().collect();
        if let Some(k) = latest.keys.iter().find(|k| !named.contains(&k.as_str())) {
            if !MISFIT_SAID.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    database,
                    table,
                    key = %k,
                    "retain = \"latest\": the table's last-value key column is no named level of the rule's filter, so its rows do not make one topic each; no retained messages served"
                );
            }
            continue;
        }
        let messages = match messages(rule, &latest.rows, &named) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(database, table, error = %e, "newest rows not made into retained messages");
                continue;
            }
        };
        for (topic, payload) in messages {
            if !topic::matches(filter, &topic)
                || !crate::auth::may_receive(shared.db.as_ref(), user.as_deref(), &topic)
            {
                continue;
            }
            let qos = crate::router::min_qos(QoS::AtLeastOnce, options.qos);
            let message = Message {
                id: Default::default(),
                sent_to: Default::default(),
                topic: Arc::from(topic),
                payload: payload.into(),
                qos,
                retain: true,
                properties: None,
                expires: None,
                origin: Arc::from("$table"),
            };
            out.push(Delivery {
                message: Arc::new(message),
                qos,
                retain: true,
                subscription_ids: options.id.into_iter().collect(),
                lsn: 0,
            });
        }
    }
    out
}

/// Each row's topic and payload (JSON of its columns other than the `named` levels, NULLs
/// left out); rows whose level values cannot make a topic are skipped. `Err`: the rows could not be read as such (named why).
fn messages(
    rule: LatestRule<'_>,
    rows: &RecordBatch,
    named: &[&str],
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let schema = rows.schema();
    let options = FormatOptions::default();
    let mut levels = Vec::with_capacity(named.len());
    for n in named {
        let i = schema.index_of(n).map_err(|e| e.to_string())?;
        let column = rows.column(i);
        let f = ArrayFormatter::try_new(column.as_ref(), &options).map_err(|e| e.to_string())?;
        levels.push((*n, column, f));
    }
    let rest: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| !named.contains(&schema.field(i).name().as_str()))
        .collect();
    let payloads = json_lines(&rows.project(&rest).map_err(|e| e.to_string())?)?;
    let mut out = Vec::with_capacity(rows.num_rows());
    for (row, payload) in payloads.into_iter().enumerate() {
        let value = |name: &str| {
            let (_, column, f) = levels.iter().find(|(n, ..)| *n == name)?;
            (!column.is_null(row)).then(|| f.value(row).to_string())
        };
        if let Some(topic) = rule.topic(value) {
            out.push((topic, payload));
        }
    }
    Ok(out)
}

/// One JSON object per row of `batch`.
fn json_lines(batch: &RecordBatch) -> Result<Vec<Vec<u8>>, String> {
    let mut w = arrow::json::LineDelimitedWriter::new(Vec::new());
    w.write(batch).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    let text = w.into_inner();
    let lines: Vec<Vec<u8>> = (text.split(|&b| b == b'\n'))
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    match lines.len() == batch.num_rows() {
        true => Ok(lines),
        false => Err(format!(
            "{} JSON lines for {} rows",
            lines.len(),
            batch.num_rows()
        )),
    }
}
