"""Transports over the services: the gRPC server and servicers, the legacy dyno RPC."""
