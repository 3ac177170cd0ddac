use super::*;

fn sample() -> Arc<Message> {
    Arc::new(Message {
        id: Default::default(),
        sent_to: Default::default(),
        topic: Arc::from("a/b"),
        payload: bytes::Bytes::from_static(b"\x00hello"),
        qos: QoS::ExactlyOnce,
        retain: true,
        properties: Some(PublishProperties {
            payload_format_indicator: Some(1),
            content_type: Some("text/plain".into()),
            correlation_data: Some(bytes::Bytes::from_static(b"c")),
            user_properties: vec![("k".into(), "v".into())],
            ..Default::default()
        }),
        expires: None,
        origin: Arc::from("dev"),
    })
}

#[test]
fn expiry_is_kept_as_wall_clock_time() {
    let mut m = (*sample()).clone();
    m.expires = Some(Instant::now() + Duration::from_secs(60));
    let r = Record::Message {
        message: Arc::new(m),
        chosen: vec![],
        incoming: None,
        will_of: None,
    };
    let Some(Record::Message { message, .. }) = Record::decode(&r.encode()) else {
        panic!("decodes")
    };
    let left = message.expires.unwrap() - Instant::now();
    assert!(left > Duration::from_secs(58) && left <= Duration::from_secs(60));
}

#[test]
fn records_roundtrip() {
    let c: Arc<str> = Arc::from("client");
    let records = vec![
        Record::Open {
            client: c.clone(),
            user: Some(Arc::from("u")),
            expiry: 60,
            fresh: true,
            will: Some((sample(), 5)),
        },
        Record::Close {
            client: c.clone(),
            expiry: 0,
            will_pending: true,
        },
        Record::End { client: c.clone() },
        Record::Barrier,
        Record::Relayed {
            from: 2,
            incarnation: 77,
            last: 1024,
        },
        Record::Queued {
            client: c.clone(),
            qos: QoS::ExactlyOnce,
            retain: true,
            ids: vec![3, 9],
            message: {
                let m = (*sample()).clone();
                let id = MessageId {
                    node: 2,
                    run: 77,
                    seq: 1 << 40,
                };
                m.id.set(id).unwrap();
                m.sent_to.set(Arc::from([3, 1 << 40])).unwrap();
                Arc::new(m)
            },
            sent: Some(513),
        },
        Record::Releasing {
            client: c.clone(),
            pkid: 65535,
        },
        Record::Standby {
            client: c.clone(),
            node: 3,
            lsn: 1 << 40,
        },
        Record::Pulled {
            client: c.clone(),
            node: 2,
            marks: vec![((1, 7), 1 << 33), ((3, 1), 0)],
        },
        Record::Withdrawn { client: c.clone() },
        // As written before message ids: no id, no packet id.
        Record::Queued {
            client: c.clone(),
            qos: QoS::AtLeastOnce,
            retain: false,
            ids: vec![],
            message: sample(),
            sent: None,
        },
        Record::Subscribe {
            client: c.clone(),
            filter: "$share/g/a/#".into(),
            options: SubOptions {
                qos: QoS::AtLeastOnce,
                no_local: true,
                retain_as_published: false,
                id: Some(7),
            },
            retained: true,
        },
        Record::Unsubscribe {
            client: c.clone(),
            filter: "a/#".into(),
        },
        Record::Message {
            message: sample(),
            chosen: vec![c.clone()],
            incoming: Some((c.clone(), 9)),
            will_of: None,
        },
        Record::Sent {
            client: c.clone(),
            items: vec![(5, 1), (6, 2)],
        },
        Record::Received {
            client: c.clone(),
            lsn: 5,
            pkid: 1,
        },
        Record::Acked {
            client: c.clone(),
            lsns: vec![5, 6],
        },
        Record::Released { client: c, pkid: 9 },
    ];
    for r in records {
        let bytes = r.encode();
        let back = Record::decode(&bytes).expect("decodes");
        assert_eq!(back.encode(), bytes, "{r:?}");
        // Every cut is refused, not misread.
        for cut in 0..bytes.len() {
            assert!(
                Record::decode(&bytes[..cut]).is_none(),
                "{r:?} cut at {cut}"
            );
        }
    }
}
