# The cluster fault harness behind benchmarks/cluster_faults.py (issue 13, "How it is shown"),
# one concept per module: network.py (a network namespace per server, the cut), servers.py (the
# three `riverlog serve` processes in them, the credentials, metadata look-ups), publishers.py
# (the three doors' publishers and what each had acknowledged), consumers.py (readers that
# record what each replica served), checks.py (what must hold after each fault, pure
# functions over the replicas' files), rounds.py (the faults and the run).
