# Front doors (sockets and tasks over the broker core) and the app that starts and stops them.
