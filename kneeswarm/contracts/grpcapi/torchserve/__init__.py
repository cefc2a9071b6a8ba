"""TorchServe's gRPC APIs: inference.proto and management.proto, their generated stubs (floor 1 contract)."""
