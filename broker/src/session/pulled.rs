//! Messages a session took from what the nodes kept for a node that does not answer (it
//! came from that node's standby copy: `takeover::pull`).

use super::{Delivery, Message, Session, State};

/// Per node that did not answer, the last number the session took of each (node, run) of
/// what the nodes kept for it.
pub(crate) type PulledMarks = Vec<(u64, Vec<((u64, u64), u64)>)>;

impl State {
    /// The session took, of what the nodes kept for node `node` (which did not answer), the
    /// messages it subscribes of each node's run up to these numbers: when `node` comes back
    /// and gives what it received meanwhile, those are left out ([`Self::was_pulled`]). A
    /// node's queue for another holds its messages in the order numbered, so each one
    /// numbered up to the mark that `node` received later came through that queue.
    pub(crate) fn note_pulled(
        &mut self,
        node: u64,
        marks: impl IntoIterator<Item = ((u64, u64), u64)>,
    ) {
        for ((from, run), seq) in marks {
            let mark = self.pulled.entry((node, from, run)).or_default();
            *mark = (*mark).max(seq);
        }
    }

    /// What [`Self::note_pulled`] noted, per node that did not answer (for a snapshot, a
    /// hand-over and the standby copy).
    pub(crate) fn pulled_marks(&self) -> PulledMarks {
        let mut out: PulledMarks = Vec::new();
        for (&(node, from, run), &seq) in &self.pulled {
            match out.iter_mut().find(|(n, _)| *n == node) {
                Some((_, marks)) => marks.push(((from, run), seq)),
                None => out.push((node, vec![((from, run), seq)])),
            }
        }
        out.sort_unstable_by_key(|(n, _)| *n);
        for (_, marks) in &mut out {
            marks.sort_unstable();
        }
        out
    }

    /// Whether `message` is one [`Self::note_pulled`] covers: relayed to a node whose queue
    /// the session took up to its number.
    pub(crate) fn was_pulled(&self, message: &Message) -> bool {
        let (Some(id), Some(to)) = (message.id.get(), message.sent_to.get()) else {
            return false;
        };
        (to.iter()).any(|node| {
            (self.pulled.get(&(*node, id.node, id.run))).is_some_and(|mark| id.seq <= *mark)
        })
    }
}

impl Session {
    /// Queues `d` (taken from what the nodes kept for a node that does not answer) before
    /// the first queued message of the same node's run numbered after it (it came here
    /// directly meanwhile), else last: in the order its publisher sent them.
    pub(crate) fn push_in_order(&self, d: Delivery) {
        let mut st = self.state.lock();
        let at = d.message.id.get().and_then(|id| {
            st.queue.iter().position(|q| {
                q.message
                    .id
                    .get()
                    .is_some_and(|q| (q.node, q.run) == (id.node, id.run) && q.seq > id.seq)
            })
        });
        match at {
            Some(at) => st.queue.insert(at, d),
            None => st.queue.push_back(d),
        }
        drop(st);
        self.wake_writer.notify_one();
    }
}
