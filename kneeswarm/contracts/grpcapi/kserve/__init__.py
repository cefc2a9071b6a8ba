"""KServe's grpc_predict_v2.proto, kept as the contract Triton's stubs are checked against (floor 1 contract; no stubs: see SOURCE.md)."""
