"""Sans-IO codecs: KServe v2 JSON + binary extension, gRPC framing and messages, config.pbtxt, datatypes."""
