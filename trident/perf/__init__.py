"""``trident perf``: perf_analyzer's load generator and report, for trident and Triton alike.

Modules: :mod:`.options` (the flags), :mod:`.inputs` (input tensors), :mod:`.wire` (prebuilt
request bytes, lean HTTP/1.1 and HTTP/2 parsing), :mod:`.worker` (a load-generator process),
:mod:`.measure` (windows, stability, server-side deltas), :mod:`.report` (text and CSV),
:mod:`.control` (metadata, statistics, shared memory), :mod:`.engine` (the run) and
:mod:`.inprocess` (``--in-process``: no sockets).
"""
