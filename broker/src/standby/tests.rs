use super::*;
use sluice_engine::access::{LoginFailures, Need};

/// Anyone may do anything (no users, no rules).
#[derive(Default)]
struct Open(LoginFailures);

impl sluice_engine::Logins for Open {
    fn password_hash(&self, _: &str) -> Option<String> {
        None
    }
    fn has_users(&self) -> bool {
        false
    }
    fn authorize(&self, _: Option<&str>, _: Need<'_>) -> sluice_engine::Result<()> {
        Ok(())
    }
    fn is_admin(&self, _: Option<&str>) -> bool {
        true
    }
    fn has_rules(&self) -> bool {
        false
    }
    fn logins(&self) -> &LoginFailures {
        &self.0
    }
}

fn opened(client: &str) -> Vec<u8> {
    Record::Open {
        client: Arc::from(client),
        user: None,
        expiry: 60,
        fresh: true,
        will: None,
    }
    .encode()
}

/// A [`SHIP`] body (after its kind) from node 4's run 9 with these records.
fn shipped(records: &[(u64, u64, Vec<u8>)]) -> Vec<Shipped> {
    let mut body = Vec::new();
    body.put_u64_le(4);
    body.put_u64_le(9);
    for (seq, lsn, r) in records {
        body.extend_from_slice(&frame(*seq, *lsn, r));
    }
    let (from, out) = Shipped::decode(Bytes::from(body)).unwrap();
    assert_eq!(from, 4);
    out
}

#[test]
fn shipped_records_decode_as_framed_and_cut_ones_do_not() {
    let all = shipped(&[(1, 10, opened("a")), (2, 12, Vec::new())]);
    let got: Vec<_> = (all.iter())
        .map(|f| (f.run, f.seq, f.lsn, f.record.len()))
        .collect();
    assert_eq!(got, [(9, 1, 10, opened("a").len()), (9, 2, 12, 0)]);
    let mut body = vec![0; 16];
    body.extend_from_slice(&frame(1, 10, &opened("a")));
    body.pop();
    assert!(Shipped::decode(Bytes::from(body)).is_none());
}

#[test]
fn a_copy_applies_records_in_order_and_breaks_at_a_gap() {
    let auth = Open::default();
    let mut s = Shadow::new(9);
    s.copy = Some(Copy {
        router: Router::new(10, None),
        seq: 5,
        lsn: 40,
    });
    let mut records = shipped(&[
        (6, 41, opened("a")),
        (6, 41, opened("b")),
        (4, 30, opened("c")),
        (7, 45, opened("d")),
        (9, 50, opened("e")),
        (9, 50, opened("e")),
    ])
    .into_iter();
    // The next number applies; numbers already applied (sent again) do not.
    for _ in 0..4 {
        s.take(4, records.next().unwrap(), &auth);
    }
    let copy = s.copy.as_ref().unwrap();
    assert_eq!((copy.seq, copy.lsn), (7, 45));
    let sessions = |c: &Copy| {
        let mut ids: Vec<String> = (c.router.sessions().iter())
            .map(|s| s.client_id.to_string())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(sessions(copy), ["a", "d"]);
    // A number skipped: the copy is no longer whole, and what comes waits for the node's
    // state.
    s.take(4, records.next().unwrap(), &auth);
    assert!(s.copy.is_none());
    // ... and one sent again meanwhile waits once.
    s.take(4, records.next().unwrap(), &auth);
    assert_eq!(s.waiting.iter().map(|f| f.seq).collect::<Vec<_>>(), [9]);
}
