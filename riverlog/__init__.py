# riverlog: a durable, log-based stream server. This package root only names the version;
# everything else lives in the subpackages (log/, and later broker/, protocol/, server/, spark/).
__version__ = "0.1.0"
