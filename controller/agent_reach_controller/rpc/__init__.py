"""The gRPC edge: the executor protocol, health checking and reflection."""
