"""The API contract: generated gRPC code (`v1`) and the vocabulary shared with clients."""
