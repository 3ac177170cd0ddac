//! Cluster: openraft-replicated partition logs. Empty until the cluster issue lands.
