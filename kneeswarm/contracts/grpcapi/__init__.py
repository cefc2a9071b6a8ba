"""The servers' gRPC APIs: their .proto files (each with its source and licence) and the stubs
grpcio-tools generated from them (floor 1 contract; generate.py regenerates them, derive.py printed
the .proto files that PyPI's packages carry only compiled).

    triton/      Triton's grpc_service.proto + model_config.proto: ``inference.GRPCInferenceService``
                 (KServe v2's methods and messages, ModelStreamInfer, ModelConfig); kserve-grpc and
                 triton-stream send with these stubs
    kserve/      KServe's grpc_predict_v2.proto: the Open Inference Protocol as KServe defines it,
                 kept as the contract Triton's stubs are checked against (same package, same
                 messages: both cannot be loaded in one process)
    torchserve/  TorchServe's inference.proto + management.proto: ``InferenceAPIsService``

Nothing here imports the project; the stubs import grpcio, protobuf and googleapis-common-protos.
"""
