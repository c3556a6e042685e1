# Security for every door: TLS contexts (tls.py), users and password hashes (users.py),
# per-stream authorization with casbin (authz.py), and the per-server bundle the doors share
# (guard.py). Nothing is imported here, so reading the configuration stays cheap.
