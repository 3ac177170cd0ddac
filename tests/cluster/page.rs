//! The cluster as its users see it: the console's Cluster page, and users and grants made
//! on one node holding on every node.

use super::{Cluster, GROUPS};
use crate::common::browser::{Browser, end};
use crate::common::{eventually, eventually_eq};

/// The console's Cluster page (node 2) shows the three nodes and every group, and moves a
/// shard's leadership when asked. Leaves a screenshot `cluster.png`.
pub(super) async fn cluster_page(c: &Cluster) {
    let b = Browser::start().await;
    b.go(&c.node(2).url("/#/cluster")).await;
    b.until(
        "three member nodes",
        "return document.querySelectorAll('#cluster-nodes td.state-member').length === 3",
    )
    .await;
    b.until(
        "every group",
        &format!(
            "return document.querySelectorAll('#cluster-shards tbody tr').length === {GROUPS}"
        ),
    )
    .await;
    let shard0 = (c.node(2))
        .rows("SELECT leader, replicas FROM system.shards WHERE shard = 'shard-0'")
        .await;
    let leader = shard0[0]["leader"].as_u64().unwrap();
    let to: u64 = (shard0[0]["replicas"].as_str().unwrap().split(','))
        .map(|r| r.parse().unwrap())
        .find(|r| *r != leader)
        .unwrap();
    // Choose the replica and press the button in one script, so that the page's refresh
    // cannot redraw the table in between.
    b.js(
        "const s = document.querySelector(\"select[data-shard='shard-0']\");
         s.value = arguments[0]; s.dispatchEvent(new Event('change', {bubbles: true}));
         document.querySelector(\"button[data-move='shard-0']\").click();",
        serde_json::json!([to.to_string()]),
    )
    .await;
    b.until(
        "the leadership moved",
        &format!(
            "const t = document.getElementById('cluster-message').innerText;
             const l = document.querySelector(\"tr[data-shard='shard-0'] td[data-col='leader']\");
             return t.includes('led by node {to}') && l && l.innerText === '{to}';"
        ),
    )
    .await;
    b.screenshot("cluster").await;
    end(b).await;
    eventually_eq("shard 0 led by the chosen node", 10, &to, || async {
        (c.node(3)
            .rows("SELECT leader FROM system.shards WHERE shard = 'shard-0'")
            .await)[0]["leader"]
            .as_u64()
            .unwrap_or(0)
    })
    .await;
}

/// Users and grants are catalog changes, committed by the metadata group: made on node 3,
/// they hold on nodes 2 and 4 (logins, a grant, what a plain user may not do).
pub(super) async fn users_and_grants_everywhere(c: &Cluster) {
    let n3 = c.node(3);
    n3.sql_ok("CREATE USER root WITH PASSWORD 'r' ADMIN").await;
    n3.login(Some(("root", "r")));
    n3.sql_ok("CREATE USER viewer WITH PASSWORD 'v'").await;
    n3.sql_ok("GRANT SELECT ON DATABASE iot TO viewer").await;
    for id in [2, 4] {
        let s = c.node(id);
        s.login(Some(("viewer", "v")));
        eventually(&format!("viewer's grant on node {id}"), 10, || async {
            s.sql("SELECT count(*) FROM iot.t2").await.status == 200
        })
        .await;
        assert_eq!(s.sql("DROP TABLE iot.t2").await.status, 403);
        assert_eq!(s.sql("SELECT * FROM system.shards").await.status, 403);
    }
}
