# riverlog: a durable, log-based stream server. This package root only names the version;
# everything else lives in its modules and subpackages (docs/layout.md lists them).
__version__ = "0.1.0"
