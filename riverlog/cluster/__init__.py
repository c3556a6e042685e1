# Clustering (docs/clustering.md): cluster metadata agreed through Raft. state.py holds the
# metadata and its transitions as pure functions; metadata.py replicates them with pysyncobj;
# raft_files.py checks the Raft files on disk before Raft starts. Replication of partitions,
# failover and the doors' use of this metadata are not here yet.
