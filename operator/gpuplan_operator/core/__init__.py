"""The operator's pure core: plain data in, plain data out.

Nothing here reaches kopf, the Kubernetes client, HTTP or the operator's edge modules; the
`operator-pure-core` import contract checks the whole package, so a module added here is
covered without editing the contract.
"""
