"""The extender's pure core: the wire protocol, pod plans, node snapshots, scoring and the
in-memory store the watcher feeds.

No module here reaches the Kubernetes client or HTTP (`operator-pure-core` checks the package).
"""
