"""The machinery every public call shares, one mechanism per job.

* :mod:`.route`: the one router from a call's arrays to the framework adapter that takes them.
* :mod:`.pairs`: differentiable operations as forward/backward kernel pairs, wrapped once per framework.

Nothing here imports an operation, the front door or an adapter: adapters register with the router.
"""
