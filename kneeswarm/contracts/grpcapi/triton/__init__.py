"""Triton Inference Server's gRPC API: grpc_service.proto and model_config.proto, their generated stubs (floor 1 contract)."""
