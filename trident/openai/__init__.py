"""The OpenAI-compatible front end: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

Triton's OpenAI front end maps these routes onto text models; trident does the same over the
:class:`~trident.server.Server` facade:

* :mod:`trident.openai.api` (sans-IO): request validation and limits, the mapping onto the
  model's ``text_input`` / ``stream`` / ``sampling_parameters`` / ``exclude_input_in_output``
  inputs, the response and chunk objects, OpenAI's error shape.
* :mod:`trident.openai.template`: chat templates (a documented default, or the model folder's).
* :mod:`trident.openai.app`: the ASGI application (server-sent events, client disconnects).
* :mod:`trident.openai.serve`: ``serve_openai``, the application on a port of its own.
"""
