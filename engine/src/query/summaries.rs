//! Synopses where the rows are. A query answered from synopses (`SluiceSynopsisExec`:
//! counts, sums, bounds and averages, ungrouped or grouped by few-valued columns) on a
//! cluster node that holds replicas of only some shards needs the other shards' buffered
//! rows too. Instead of reading those rows and grouping them here, it asks one replica of
//! each such shard for their synopses per group ([`SummaryQuery`] on a `RowsRequest`): the
//! replica adds up the group synopses its sealed chunks keep (made once per chunk), so a
//! few hundred bytes travel instead of every row.
//!
//! Exact as a split aggregate is ([`crate::query::split`]): the replica answers with the
//! shard's flushed index of each partition it summarized, this node waits until it
//! installed the replica's manifest index, and keeps the synopses only if its own flushed
//! indexes of those (partition, shard) pairs equal the replica's, read before and after it
//! made its part of the answer (they only grow, so equal reads mean the answer saw them);
//! otherwise it asks again, and the last time reads the rows instead. A replica that cannot
//! summarize (a filter its chunks' synopses do not decide) is read as rows, and so are all
//! of them for a `WHERE PARTS` list (it picks partitions by what this node knows of them).

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::query::groups::{Answer, GroupKey, WireKey};
use crate::query::provider::SluiceTable;
use crate::query::synopsis::ColumnSynopsis;
use crate::store::chunk::{Chunk, RowFilter};
use crate::store::remote::{
    Remote, RowsRequest, SummaryAnswer, SummaryGroup, SummaryQuery, answers_of, cut_after,
    cut_alike,
};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::Operator;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// Times a node asks the replicas for synopses before it reads their rows.
const TRIES: usize = 3;

impl SummaryQuery {
    /// The synopses of `columns` per combination of `keys` over the rows `filter` admits.
    pub(crate) fn new(keys: &[GroupKey], columns: &[usize], filter: &RowFilter) -> Self {
        Self {
            keys: keys.to_vec(),
            columns: columns.to_vec(),
            equal: filter.equal.clone(),
            time: filter.time.clone(),
            value: (filter.value.iter())
                .map(|(c, op, v)| (*c, op.to_string(), *v))
                .collect(),
        }
    }

    fn filter(&self) -> Result<RowFilter> {
        let op = |s: &str| match s {
            "<" => Ok(Operator::Lt),
            "<=" => Ok(Operator::LtEq),
            ">" => Ok(Operator::Gt),
            ">=" => Ok(Operator::GtEq),
            "=" => Ok(Operator::Eq),
            other => Err(Error::invalid(format!("no such comparison: {other}"))),
        };
        Ok(RowFilter {
            equal: self.equal.clone(),
            time: self.time.clone(),
            value: (self.value.iter())
                .map(|(c, o, v)| Ok((*c, op(o)?, *v)))
                .collect::<Result<_>>()?,
        })
    }
}

impl SummaryAnswer {
    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| Error::invalid(format!("synopses: {e}")))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| Error::Replication {
            reason: format!("a replica's synopses could not be read: {e}"),
        })
    }
}

/// `answer` (a synopsis answer made here, with what other nodes contribute in its
/// [`Remote`]) for a query of `table` whose part on other nodes `query` describes (`None`:
/// their rows are read). Returns the answer and the [`Remote`] it was made with.
pub(crate) async fn answered(
    table: &SluiceTable,
    query: Option<SummaryQuery>,
    mut answer: impl FnMut(&Remote) -> (Option<RecordBatch>, bool),
) -> Result<((Option<RecordBatch>, bool), Remote)> {
    let store = table.store();
    let id = table.def().id;
    let Some(reader) = store.reader() else {
        let remote = Remote::default();
        return Ok((answer(&remote), remote));
    };
    // The partitions the filter's time bounds admit. A `WHERE PARTS` list picks partitions
    // by what this node knows of them (`last n` by the rows in them): those read rows.
    let bounds = |q: &SummaryQuery| table.key_bounds(&q.filter().ok()?);
    let keys = (query.as_ref()).filter(|_| table.whole()).and_then(bounds);
    let query = query.filter(|_| keys.is_some());
    let keys = keys.unwrap_or((0, u64::MAX, None));
    for attempt in 1..=TRIES {
        let elsewhere = reader.remote_shards();
        let ask = (query.clone()).filter(|_| attempt < TRIES && !elsewhere.is_empty());
        let request = |shard: u32| RowsRequest {
            summary: ask.clone(),
            ..RowsRequest::new(id, shard, keys.clone())
        };
        let ask_one = |shard: u32| reader.summary(request(shard));
        let asking = ask.is_some();
        let (answered, read) =
            answers_of(&elsewhere, asking, ask_one, |_, _| true, "synopses").await;
        let all = (0, u64::MAX, None);
        let mut remote = Remote::read_of(store, id, all, None, elsewhere, &read).await?;
        let named = answered
            .iter()
            .flat_map(|(s, a)| a.flushed.iter().map(|(p, _)| (*p, *s)));
        let before = flushed_here(table, named);
        let alike = (answered.iter()).all(|(s, a)| cut_alike(*s, &a.flushed, &before));
        remote.summaries = answered.into_values().collect();
        if !alike {
            continue;
        }
        let out = answer(&remote);
        // The flushed indexes only grow: the same after as before, the answer saw them.
        if flushed_here(table, before.keys().copied()) == before {
            if out.0.is_some() {
                let rows: u64 = remote.summaries.iter().map(|a| a.rows).sum();
                store.remote_aggregated.fetch_add(rows, Ordering::Relaxed);
            }
            return Ok((out, remote));
        }
    }
    Err(Error::Replication {
        reason: "synopses: the last try reads rows, which always cut alike".into(),
    })
}

/// This node's flushed index of each (partition, shard) of `pairs` (none: 0).
fn flushed_here(
    table: &SluiceTable,
    pairs: impl Iterator<Item = (u64, u32)>,
) -> BTreeMap<(u64, u32), u64> {
    let parts = table.state().parts.read();
    let flushed =
        |p: u64, s: u32| (parts.get(&p).and_then(|x| x.shards.get(&s))).map_or(0, |r| r.flushed);
    pairs.map(|(p, s)| ((p, s), flushed(p, s))).collect()
}

impl Engine {
    /// Answers another node's [`SummaryQuery`] (`request.summary`; the caller ran the
    /// shard's read barrier): the synopses of this node's buffered rows of the shard per
    /// group, with the shard's flushed index of each partition. Blocks while this node's
    /// catalog does not know the table yet (run it off the runtime's threads).
    pub fn serve_summary(&self, request: &RowsRequest) -> Result<Vec<u8>> {
        let Some(query) = &request.summary else {
            return Err(Error::invalid("not a request for synopses"));
        };
        let table = self.table_asked(request.table_id)?;
        let cannot = || Error::Replication {
            reason: format!(
                "shard {}'s rows of table {} cannot be summarized by their synopses here",
                request.shard, request.table_id
            ),
        };
        let filter = query.filter()?;
        let schema = table.schema();
        // The chunks are taken under the lock, grouped after it: rows being applied do not
        // wait for the grouping.
        let (mut chunks, mut flushed) = (Vec::new(), Vec::new());
        for (key, p) in table.parts.read().iter() {
            let Some(s) = p
                .shards
                .get(&request.shard)
                .filter(|_| request.admits(*key))
            else {
                continue;
            };
            flushed.push((*key, s.flushed));
            let rest = |c: &Chunk, skip: usize| {
                Chunk::plain(c.batch.slice(skip, c.batch.num_rows() - skip))
            };
            let rows = |c: &Chunk| c.batch.num_rows();
            let all = s.buffer.chunks(&schema);
            chunks.extend(cut_after(
                all,
                &s.buffer.lsn_starts(),
                s.flushed,
                rows,
                rest,
            ));
        }
        let mut answer = Answer::new(query.keys.clone(), query.columns.clone());
        let mut one = (0, vec![ColumnSynopsis::default(); query.columns.len()]);
        let rows = chunks.iter().map(|c| c.batch.num_rows() as u64).sum();
        for c in &chunks {
            if !query.keys.is_empty() {
                c.groups_into(&mut answer, &filter).ok_or_else(cannot)?;
                continue;
            }
            let (n, syn) = c
                .synopsis_where(&query.columns, &filter)
                .ok_or_else(cannot)?;
            one.0 += n;
            for (o, s) in one.1.iter_mut().zip(&syn) {
                o.merge(s);
            }
        }
        let groups: Vec<SummaryGroup> = match query.keys.is_empty() {
            true => vec![(Vec::new(), one.0, one.1)],
            false => (answer.groups.into_iter())
                .map(|(k, (n, syn))| (k.iter().map(WireKey::from).collect(), n, syn))
                .collect(),
        };
        SummaryAnswer {
            manifest_index: self.manifest_index(),
            flushed,
            rows,
            groups,
        }
        .encode()
    }
}
