"""``trident serve --workers N``: one Triton server to the outside, served by N processes.

One trio process serves one core. :mod:`trident.cluster.supervisor` runs N worker processes
(:mod:`trident.cluster.worker`), each a full trident server, over listening sockets it owns
(:mod:`trident.cluster.sockets`), and keeps their control plane in step through one channel per
worker (:mod:`trident.cluster.channel`, :mod:`trident.cluster.wire`,
:mod:`trident.cluster.link`): model control, shared-memory registrations, trace and log settings
are applied to every worker; statistics and metrics are summed over them
(:mod:`trident.cluster.merge`). ``--workers auto`` counts the CPUs this process may use
(:mod:`trident.cluster.cpus`).
"""
