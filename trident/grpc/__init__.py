"""Triton's gRPC front end: ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health``
on a trio-native HTTP/2 server (h2). Entry point: :func:`trident.grpc.serve.serve_grpc`."""
