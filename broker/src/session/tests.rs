use super::*;

fn delivery(lsn: u64) -> Delivery {
    Delivery {
        message: Arc::new(Message {
            topic: Arc::from("t"),
            payload: bytes::Bytes::from_static(b"x"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: None,
            expires: None,
            origin: Arc::from("p"),
            id: Default::default(),
            sent_to: Default::default(),
        }),
        qos: QoS::AtLeastOnce,
        retain: false,
        subscription_ids: Vec::new(),
        lsn,
    }
}

fn numbered(node: u64, run: u64, seq: u64) -> Delivery {
    let d = delivery(seq);
    d.message.id.set(MessageId { node, run, seq }).unwrap();
    d
}

fn sent_to(d: Delivery, to: &[u64]) -> Delivery {
    d.message.sent_to.set(Arc::from(to)).unwrap();
    d
}

/// Session `c` on node 1, subscribed to `t` (with these options).
fn subscribed() -> (Arc<Session>, SubOptions) {
    let s = Session::new(Arc::from("c"), 100, Some(1));
    let sub = SubOptions {
        qos: QoS::AtLeastOnce,
        no_local: false,
        retain_as_published: false,
        id: None,
    };
    s.state.lock().subscriptions.insert("t".into(), sub.clone());
    (s, sub)
}

/// What a session came to this node with tells which copies another node gives back
/// are left out: this node's messages numbered after, others' sent here and numbered
/// above what had come from their run.
#[test]
fn copies_given_back_are_known_by_their_numbers() {
    let (s, sub) = subscribed();
    // Received here so far: node 2's run 7 up to 100, run 8 up to 1, node 3's run 1
    // up to 1, node 4's up to 9.
    let now = Arrivals {
        max: [
            ((2, 7), 100),
            ((2, 8), 1),
            ((3, 1), 1),
            ((4, 1), 9),
            ((6, 1), 9),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    assert!(
        !s.state
            .lock()
            .routed_here(&sent_to(numbered(2, 7, 9), &[1]).message, &now)
    );
    s.install(Installed {
        node: 1,
        run: 50,
        next: 40,
        then: Arrivals {
            max: [((2, 7), 5)].into_iter().collect(),
            unnumbered: [4].into_iter().collect(),
            gapped: [(6, 1)].into_iter().collect(),
        },
        filters: Vec::new(),
        until: Some(Instant::now() + LATE_FOR),
        late: HashSet::new(),
        pending: false,
    });
    // Set once: a later one (another hand-over) does not replace it.
    s.install(Installed {
        node: 1,
        run: 50,
        next: 99,
        then: Arrivals::default(),
        filters: Vec::new(),
        until: None,
        late: HashSet::new(),
        pending: false,
    });
    let here = |node, run, seq, to: &[u64]| {
        s.state
            .lock()
            .routed_here(&sent_to(numbered(node, run, seq), to).message, &now)
    };
    assert!(here(1, 50, 40, &[]) && !here(1, 50, 39, &[]) && !here(1, 49, 45, &[]));
    assert!(here(2, 7, 6, &[1, 3]) && !here(2, 7, 5, &[1]) && !here(2, 7, 6, &[3]));
    assert!(here(2, 8, 1, &[1]) && here(3, 1, 1, &[1]) && !here(4, 1, 1, &[1]));
    // Sent here but never come (its node died first): not a copy.
    assert!(!here(2, 7, 101, &[1]) && !here(2, 8, 2, &[1]) && !here(5, 1, 1, &[1]));
    // A node's run with a gap in what came from it: nothing of that run can be told.
    assert!(!here(6, 1, 1, &[1]));
    let mut gapped = now.clone();
    gapped.gapped.insert((3, 1));
    let m = sent_to(numbered(3, 1, 1), &[1]);
    assert!(!s.state.lock().routed_here(&m.message, &gapped));
    // Its next run numbers afresh: told as ever.
    gapped.max.insert((3, 2), 4);
    let m = sent_to(numbered(3, 2, 4), &[1]);
    assert!(s.state.lock().routed_here(&m.message, &gapped));
    // A topic none of the filters it came with matches (its other copy had one more).
    let other = sent_to(numbered(2, 7, 6), &[1]);
    let mut m = (*other.message).clone();
    m.topic = Arc::from("u");
    assert!(!s.state.lock().routed_here(&m, &now));
    assert!(!s.state.lock().routed_here(&delivery(7).message, &now));
    // Routed here after it came, though numbered before: noted.
    s.push(sent_to(numbered(2, 7, 4), &[1]));
    s.push(numbered(1, 50, 38));
    assert!(here(2, 7, 4, &[]) && here(1, 50, 38, &[]) && !here(2, 7, 3, &[1]));
    s.state.lock().queue.clear();
    // What it holds is known by id.
    s.push(numbered(5, 1, 8));
    s.push_in_flight(Outgoing::Published(numbered(5, 1, 9)), 4097);
    s.push_in_flight(Outgoing::Published(numbered(5, 1, 10)), 4097);
    let (flying, queued) = s.state.lock().held_split();
    assert_eq!((flying.len(), queued.len()), (1, 2));
    assert!(flying.contains(&MessageId {
        node: 5,
        run: 1,
        seq: 9
    }));
    let st = s.state.lock();
    assert!(matches!(st.inflight.get(&4097), Some(Outgoing::Published(d)) if d.lsn == 9));
    assert_eq!(st.queue.iter().map(|d| d.lsn).collect::<Vec<_>>(), [8, 10]);
    drop(st);
    // A member of a shared group gets only some: nothing is left out.
    s.state
        .lock()
        .subscriptions
        .insert("$share/g/t".into(), sub);
    assert!(!here(2, 7, 100, &[1]));
}

/// Each node of a cluster numbers its messages from its own part of the packet ids.
#[test]
fn packet_ids_stay_in_the_node_s_range() {
    let mut st = State::default();
    let range = pkids_of(Some(3));
    assert_eq!(range, (12289, 16383));
    let ids: Vec<u16> = (0..5000).map(|_| st.next_pkid(range).unwrap()).collect();
    assert!(ids.iter().all(|p| (12289..=16383).contains(p)));
    assert_eq!(ids[0], 12289);
    assert_eq!(ids[4095], 12289);
    st.inflight.insert(12290, Outgoing::Released(1));
    st.next_pkid = 12289;
    assert_eq!(st.next_pkid(range), Some(12291));
    assert_eq!(pkids_of(None), (1, u16::MAX));
    assert_eq!(pkids_of(Some(15)).1, 65535);
}

/// What is sent again never takes the client past its receive window: PUBRELs go at
/// once, PUBLISHes oldest first as acknowledgements make room.
#[test]
fn resends_wait_for_room_in_the_client_s_window() {
    let mut st = State::default();
    // Three at the client already; four given back (one a PUBREL), out of order.
    for (k, lsn) in [(1, 1), (2, 2), (3, 3)] {
        st.inflight.insert(k, Outgoing::Published(delivery(lsn)));
    }
    for (k, lsn) in [(4101, 12), (4097, 10), (4099, 11), (4100, 13)] {
        st.inflight.insert(k, Outgoing::Published(delivery(lsn)));
    }
    st.inflight.insert(4098, Outgoing::Released(9));
    st.resend = vec![4101, 4097, 4098, 4099, 4100];
    let ids = |due: Vec<(u16, Outgoing)>| due.into_iter().map(|d| d.0).collect::<Vec<_>>();
    // Four at the client with the one awaiting its PUBREL: room for one more.
    assert_eq!(ids(st.due_resends(5)), [4098, 4097]);
    assert_eq!(st.resend, [4099, 4101, 4100]);
    assert!(st.due_resends(5).is_empty());
    assert_eq!(st.resend, [4099, 4101, 4100]);
    // Acknowledgements (a PUBACK, a PUBCOMP) make room, in the order sent.
    st.inflight.remove(&1);
    assert_eq!(ids(st.due_resends(5)), [4099]);
    st.inflight.remove(&2);
    st.inflight.remove(&4098);
    assert_eq!(ids(st.due_resends(5)), [4101, 4100]);
    assert!(st.resend.is_empty());
    // A returning client's smaller window: what is in flight goes out as far as it goes.
    st.resend = st.inflight.keys().copied().collect();
    assert_eq!(ids(st.due_resends(2)), [3, 4097]);
    assert_eq!(st.resend, [4099, 4101, 4100]);
}

/// A session holding one message twice (a shared and a plain subscription): each
/// acknowledgement takes one copy, the one in flight first.
#[test]
fn an_ack_takes_one_copy() {
    let mut st = State::default();
    st.queue.extend([delivery(7), delivery(8), delivery(7)]);
    st.mark_sent(7, 1);
    assert_eq!(st.queue.iter().map(|d| d.lsn).collect::<Vec<_>>(), [8, 7]);
    st.forget_acked(&[7]);
    assert!(st.inflight.is_empty());
    assert_eq!(st.queue.iter().map(|d| d.lsn).collect::<Vec<_>>(), [8, 7]);
    st.forget_acked(&[7, 8]);
    assert!(st.queue.is_empty());
}

/// A message routed here while what another node held was being logged (its own delivery
/// was on its way) reached the session: a later give-back's copy of it is left out, the
/// copy taken from the other node is not queued again when its own delivery comes, and a
/// journal holding both gives it once after a restart.
#[test]
fn a_message_taken_from_another_node_is_held_once() {
    let (s, _) = subscribed();
    let installed = |next| Installed {
        node: 1,
        run: 50,
        next,
        then: Arrivals::default(),
        filters: Vec::new(),
        until: Some(Instant::now() + LATE_FOR),
        late: HashSet::new(),
        pending: false,
    };
    // Pending: numbers place nothing; what is routed here meanwhile is noted.
    s.install_pending(installed(10));
    s.push(numbered(1, 50, 12));
    s.push(numbered(1, 50, 3));
    let here =
        |seq| (s.state.lock()).routed_here(&numbered(1, 50, seq).message, &Arrivals::default());
    s.state.lock().queue.clear();
    assert!(!here(11), "a number places nothing while pending");
    // In place once its records are logged: numbers from then on, and what was noted.
    s.install(installed(20));
    assert!(here(3) && here(12) && here(20) && !here(11) && !here(19));
    // A second install changes nothing.
    s.install(installed(99));
    assert!(here(20));

    // Taken from another node, then its own delivery comes: queued once.
    s.state.lock().note_imported(MessageId {
        node: 2,
        run: 1,
        seq: 5,
    });
    assert!(!s.push_routed(numbered(2, 1, 5)));
    assert!(s.push_routed(numbered(2, 1, 6)));
    // A retained message sent on a new subscription is no routed copy: queued.
    s.push(numbered(2, 1, 5));
    let ids = |s: &Session| -> Vec<u64> {
        (s.state.lock().queue.iter())
            .map(|d| d.message.id.get().unwrap().seq)
            .collect()
    };
    assert_eq!(ids(&s), [6, 5]);

    // A journal that logged both: once after a restart.
    let r = Session::new(Arc::from("r"), 100, Some(1));
    let logged_at = |mut d: Delivery, lsn| {
        d.lsn = lsn;
        d
    };
    r.push(numbered(3, 1, 1));
    r.push(numbered(3, 1, 2));
    r.push(logged_at(numbered(3, 1, 1), 11));
    // The same record's other delivery (a retained one on a subscription): kept.
    r.push(numbered(3, 1, 2));
    r.push_in_flight(Outgoing::Published(numbered(3, 1, 3)), 4097);
    r.push(logged_at(numbered(3, 1, 3), 13));
    assert_eq!(r.state.lock().drop_copies(), [11, 13]);
    assert_eq!(ids(&r), [1, 2, 2]);
    // What came since a moment: in flight, or queued after it.
    let st = r.state.lock();
    let id = |seq| MessageId {
        node: 3,
        run: 1,
        seq,
    };
    assert!(st.holds_since(st.pushed, &id(3)) && !st.holds_since(st.pushed, &id(2)));
    assert!(st.holds_since(st.pushed - 1, &id(2)) || st.holds_since(st.pushed - 3, &id(2)));
    drop(st);
    // One queued here goes for one the other node had sent under a packet id.
    assert_eq!(r.state.lock().unqueue(&id(2)), [2, 2]);
    assert!(r.state.lock().unqueue(&id(2)).is_empty());
}

/// What a session takes from the nodes' queues for a dead node goes before what came here
/// directly from the same node's run since (numbered after it), else last; the numbers
/// taken are known afterwards, per node's run.
#[test]
fn pulled_messages_keep_their_publishers_order() {
    let (s, _) = subscribed();
    // Came with the standby copy (node 2's 1-2), then directly (node 2's 7-8, node 3's 4).
    for (node, seq) in [(2, 1), (2, 2), (2, 7), (3, 4), (2, 8)] {
        s.push(numbered(node, 1, seq));
    }
    // Pulled: node 2's 3-6, node 3's 1-2, node 4's 9 (nothing of its run here).
    for (node, seq) in [(2, 3), (2, 4), (3, 1), (3, 2), (2, 5), (2, 6), (4, 9)] {
        s.push_in_order(numbered(node, 1, seq));
    }
    let order: Vec<(u64, u64)> = (s.state.lock().queue.iter())
        .map(|d| d.message.id.get().map(|id| (id.node, id.seq)).unwrap())
        .collect();
    let want = [
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (2, 5),
        (2, 6),
        (2, 7),
        (3, 1),
        (3, 2),
        (3, 4),
        (2, 8),
        (4, 9),
    ];
    assert_eq!(order, want);
    // Taken from the queues for node 5: node 2's run 1 up to 6, node 3's up to 2.
    let mut st = s.state.lock();
    st.note_pulled(5, [((2, 1), 6), ((3, 1), 2)]);
    st.note_pulled(5, [((2, 1), 4)]);
    // Given back later: only what was relayed to node 5 (and numbered up to the mark) came
    // through those queues; what went to node 6 only did not.
    let given = |node, run, seq, to: &[u64]| sent_to(numbered(node, run, seq), to).message;
    assert!(st.was_pulled(&given(2, 1, 6, &[5])) && st.was_pulled(&given(3, 1, 1, &[6, 5])));
    assert!(!st.was_pulled(&given(2, 1, 6, &[6])) && !st.was_pulled(&numbered(2, 1, 1).message));
    assert!(!st.was_pulled(&given(2, 1, 7, &[5])) && !st.was_pulled(&given(2, 2, 1, &[5])));
    assert!(!st.was_pulled(&given(3, 1, 3, &[5])) && !st.was_pulled(&given(4, 1, 9, &[5])));
    // The marks go with the session: in its snapshot (a restart, the standby copy) and in
    // what it hands over (`Record::Pulled`).
    let marks = st.copy().pulled_marks();
    assert_eq!(marks, vec![(5, vec![((2, 1), 6), ((3, 1), 2)])]);
    let (t, _) = subscribed();
    let mut moved = t.state.lock();
    for (node, marks) in marks {
        moved.note_pulled(node, marks);
    }
    assert!(moved.was_pulled(&given(2, 1, 6, &[5])) && !moved.was_pulled(&given(2, 1, 7, &[5])));
}
