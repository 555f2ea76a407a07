"""Process-isolated Python models: each instance in a model process of its own.

Selected per model with ``parameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value:
"process" } }`` in config.pbtxt (or for every Python model with
``--backend-config=python,execution-mode=process``). Pure-Python model code then neither holds
the server's GIL nor blocks its event loop, and a model that crashes or hangs takes down only
its own process.

* :mod:`.parent` (server side): :class:`~.parent.IsolatedInstance` starts
  ``python -m trident.backends.python.isolated.child``, talks to it from worker threads and
  one reader thread per process (never from the event loop), serves the process's BLS, model
  management, metrics and ``is_cancelled`` calls, and restarts it when it dies.
* :mod:`.child` (model side): runs the same in-process Python instance
  (:class:`~trident.backends.python.backend.PythonInstance`) with a ``pb_utils`` runtime that
  forwards to the server.
* :mod:`.channel`: control messages are pickles over an ``AF_UNIX`` ``SOCK_SEQPACKET`` socket;
  tensor bytes travel through a shared-memory ring per direction (``memfd``), larger ones
  through a one-off ``memfd`` passed with the message (``SCM_RIGHTS``). Nothing is left in
  ``/dev/shm`` when a process dies. Inputs a client sent through a registered system
  shared-memory region are not copied: the process receives the region's file once (a
  read-only descriptor, ``SCM_RIGHTS``), maps it read-only and the model's
  ``as_numpy()`` is a read-only view of the client's memory; the mapping is dropped soon after
  the region is unregistered (never while a view of it is alive). BYTES and non-contiguous
  tensors are copied. See :mod:`.channel` for the details and bounds.

Failure handling: when the process exits unexpectedly, or ``execute`` runs longer than
``TRIDENT_EXECUTE_TIMEOUT_SECS`` (then the process is killed), the requests it was working
on fail with INTERNAL, the process is started again (``initialize`` runs again) and the
server stays up. While restarting, new batches wait for the new process.
"""
