# Clustering (docs/clustering.md): cluster metadata agreed through Raft. state.py holds the
# metadata and its transitions as pure functions; metadata.py replicates them with pysyncobj;
# raft_files.py checks the Raft files on disk before Raft starts; node.py makes `riverlog
# serve` a member (the cluster Placement the doors ask, the reconcile loop); local.py runs a
# cluster of N servers on one machine (`riverlog cluster up`).
