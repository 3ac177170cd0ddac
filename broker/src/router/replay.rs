//! Rebuilding the router from the journal at start: the records after the snapshot's LSN,
//! applied in order (see `journal`).

use super::Router;
use crate::journal::Record;
use crate::session::{Message, Outgoing, Session};
use sluice_engine::Logins;
use std::sync::Arc;
use std::time::Instant;

/// A session's queued copies a replay dropped: its client, and their LSNs.
pub(crate) type Copies = (Arc<str>, Vec<u64>);

/// A will still to be published after a replay: its client, the message and its delay.
pub(crate) type Will = (Arc<str>, Arc<Message>, u32);

impl Router {
    /// A `Queued` record at `lsn`: its message joins its session, in flight under the
    /// packet id it was sent under, else queued (`in_order`: before the later messages of
    /// its node's run, [`Session::push_in_order`]).
    pub(crate) fn replay_queued(&self, lsn: u64, record: Record, in_order: bool) {
        let Record::Queued {
            client,
            qos,
            retain,
            ids,
            message,
            sent,
        } = record
        else {
            return;
        };
        let Some(s) = self.session(&client) else {
            return;
        };
        let d = crate::session::Delivery {
            message,
            qos,
            retain,
            subscription_ids: ids,
            lsn,
        };
        match sent {
            Some(pkid) => s.push_in_flight(Outgoing::Published(d), pkid),
            None if in_order => s.push_in_order(d),
            None => s.push(d),
        }
    }

    /// Applies the journal record at `lsn`.
    pub(crate) fn replay(&self, lsn: u64, record: Record, auth: &dyn Logins) {
        match record {
            Record::Open {
                client,
                user,
                expiry,
                fresh,
                will,
            } => {
                if fresh || expiry == 0 {
                    self.forget(&client);
                }
                if expiry == 0 {
                    return;
                }
                let s = self.session_or_new(&client);
                *s.user.lock() = user;
                *s.will.lock() = will;
                let mut st = s.state.lock();
                st.expiry_secs = expiry;
                // Connected, unless a Close follows: its connection ended with the server.
                st.disconnected_at = None;
            }
            Record::Close {
                client,
                expiry,
                will_pending,
            } => {
                if expiry == 0 {
                    self.forget(&client);
                } else if let Some(s) = self.session(&client) {
                    if !will_pending {
                        *s.will.lock() = None;
                    }
                    let mut st = s.state.lock();
                    st.expiry_secs = expiry;
                    st.disconnected_at = Some(Instant::now());
                }
            }
            Record::End { client } => self.forget(&client),
            Record::Subscribe {
                client,
                filter,
                options,
                retained,
            } => {
                if let Some(s) = self.session(&client) {
                    self.subscribe_with_retained(&s, &filter, options, (retained, true), auth);
                }
            }
            Record::Unsubscribe { client, filter } => {
                if let Some(s) = self.session(&client) {
                    self.unsubscribe(&s, &filter);
                }
            }
            Record::Message {
                message,
                chosen,
                incoming,
                will_of,
            } => {
                if let Some(s) = will_of.and_then(|c| self.session(&c)) {
                    *s.will.lock() = None;
                }
                if message.retain {
                    self.retain(&message, lsn);
                }
                if let Some((c, pkid)) = incoming
                    && let Some(s) = self.session(&c)
                {
                    s.state.lock().incoming_qos2.insert(pkid);
                }
                for (s, mut d) in self.lasting_targets(&message, auth, &chosen) {
                    d.lsn = lsn;
                    s.push_routed(d);
                }
            }
            Record::Sent { client, items } => self.with_state(&client, |st| {
                for (lsn, pkid) in items {
                    st.mark_sent(lsn, pkid);
                }
            }),
            Record::Received { client, lsn, pkid } => {
                self.with_state(&client, |st| st.mark_received(lsn, pkid))
            }
            Record::Acked { client, lsns } => self.with_state(&client, |st| st.forget_acked(&lsns)),
            Record::Released { client, pkid } => self.with_state(&client, |st| {
                st.incoming_qos2.remove(&pkid);
            }),
            Record::Relayed {
                from,
                incarnation,
                last,
            } => self.relayed(from, incarnation, last),
            Record::Barrier => {}
            r @ Record::Queued { .. } => self.replay_queued(lsn, r, false),
            Record::Releasing { client, pkid } => {
                if let Some(s) = self.session(&client) {
                    s.push_in_flight(Outgoing::Released(lsn), pkid);
                }
            }
            Record::Standby { client, node, lsn } => {
                if let Some(s) = self.session(&client) {
                    crate::standby::note(&s, node, lsn);
                }
            }
            Record::Pulled {
                client,
                node,
                marks,
            } => self.with_state(&client, |st| st.note_pulled(node, marks)),
            Record::Withdrawn { .. } => {}
        }
    }

    /// After the replay: sessions whose connection the stop ended are offline from now,
    /// hold each message once (a copy handed over that its own delivery had reached while
    /// it was logged is in the journal too: dropped, returned to be logged as done), and
    /// hold at most `mqtt.max_queued_messages` (the oldest beyond it dropped and counted,
    /// as for any offline session). Returns the wills still to be published (the
    /// connection ended with the server, or their delay had not run out), by client id.
    pub(crate) fn replayed(&self) -> (Vec<Will>, Vec<Copies>) {
        let now = Instant::now();
        let (mut wills, mut copies) = (Vec::new(), Vec::new());
        for s in self.sessions() {
            if let Some((m, delay)) = s.will.lock().clone() {
                wills.push((s.client_id.clone(), m, delay));
            }
            let mut st = s.state.lock();
            if st.disconnected_at.is_none() {
                st.disconnected_at = Some(now);
            }
            let dropped = st.drop_copies();
            if !dropped.is_empty() {
                copies.push((s.client_id.clone(), dropped));
            }
            let over = st.queue.len().saturating_sub(self.max_queued);
            if over > 0 {
                st.queue.drain(..over);
                st.dropped += over as u64;
                tracing::warn!(client_id = %s.client_id, dropped = over, "offline session's queue over mqtt.max_queued_messages after the restart: its oldest messages dropped");
            }
        }
        (wills, copies)
    }

    fn with_state(&self, client: &str, f: impl FnOnce(&mut crate::session::State)) {
        if let Some(s) = self.session(client) {
            f(&mut s.state.lock());
        }
    }

    fn session_or_new(&self, client: &Arc<str>) -> Arc<Session> {
        let mut sessions = self.sessions.lock();
        sessions
            .entry(client.clone())
            .or_insert_with(|| self.new_session(client.clone()))
            .clone()
    }

    /// Removes the session `client` and its subscriptions.
    pub(crate) fn forget(&self, client: &str) {
        let old = self.sessions.lock().remove(client);
        if let Some(old) = old {
            self.unsubscribe_all(&old);
        }
    }
}
