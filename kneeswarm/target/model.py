"""The demo model: a seeded token-wise MLP built in code as an ONNX graph.

Nothing is downloaded: :func:`build_mlp` writes the graph with ``onnx.helper`` from weights drawn
from a seeded NumPy generator, so the same arguments always give the same model and the same
outputs. The graph is

    input  float32 [batch, input_dim]
    -> MatMul + Add + Relu to [batch, tokens * hidden], Reshape to [batch * tokens, hidden]
    -> (MatMul + Add + Relu) x layers, each [hidden, hidden]
    -> Reshape to [batch, tokens, hidden], ReduceMean over tokens -> [batch, hidden]
    -> MatMul + Add
    -> output float32 [batch, output_dim]

Expanding the small input into ``tokens`` rows makes every hidden layer a matrix-matrix product,
so the model is compute-bound like a real text model of ``tokens`` tokens rather than limited by
memory bandwidth. Cost per inference grows linearly with ``layers`` (``--work`` on the command
line) and with ``tokens``, and quadratically with ``hidden``.

:func:`make_session` opens ONE ONNX Runtime ``InferenceSession`` with the given intra-op and
inter-op thread counts; sessions are thread-safe, so every request thread shares it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

INPUT_NAME = "input"
OUTPUT_NAME = "output"
DEFAULT_INPUT_DIM = 64
DEFAULT_TOKENS = 8
DEFAULT_HIDDEN = 1024
DEFAULT_LAYERS = 32
DEFAULT_OUTPUT_DIM = 16
DEFAULT_SEED = 0
OPSET = 17
IR_VERSION = 8  # old enough for any onnxruntime >= 1.14


@dataclass(frozen=True)
class ModelSpec:
    """The shape of the generated MLP."""

    input_dim: int = DEFAULT_INPUT_DIM
    tokens: int = DEFAULT_TOKENS
    hidden: int = DEFAULT_HIDDEN
    layers: int = DEFAULT_LAYERS
    output_dim: int = DEFAULT_OUTPUT_DIM
    seed: int = DEFAULT_SEED

    @property
    def parameters(self) -> int:
        """Number of weights and biases in the model."""
        embed = (self.input_dim + 1) * self.tokens * self.hidden
        layers = self.layers * (self.hidden + 1) * self.hidden
        return embed + layers + (self.hidden + 1) * self.output_dim


def build_mlp(spec: ModelSpec) -> bytes:
    """Return the serialised ONNX model described by ``spec``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(spec.seed)
    nodes: list = []
    initializers: list = []

    def dense(
        name: str, x: str, fan_in: int, fan_out: int, relu: bool, out: str | None = None
    ) -> str:
        # He-style scaling keeps activations O(1) through many ReLU layers.
        weight = rng.standard_normal((fan_in, fan_out), dtype=np.float32)
        weight *= np.float32(np.sqrt(2.0 / fan_in))
        bias = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.01)
        initializers.append(numpy_helper.from_array(weight, name=f"{name}_w"))
        initializers.append(numpy_helper.from_array(bias, name=f"{name}_b"))
        nodes.append(helper.make_node("MatMul", [x, f"{name}_w"], [f"{name}_mm"]))
        added = out if (out and not relu) else f"{name}_add"
        nodes.append(helper.make_node("Add", [f"{name}_mm", f"{name}_b"], [added]))
        if not relu:
            return added
        nodes.append(helper.make_node("Relu", [added], [f"{name}_relu"]))
        return f"{name}_relu"

    def shape_const(name: str, dims: list[int]) -> str:
        initializers.append(numpy_helper.from_array(np.array(dims, dtype=np.int64), name=name))
        return name

    # [batch, input_dim] -> [batch, tokens * hidden] -> [batch * tokens, hidden]
    x = dense("embed", INPUT_NAME, spec.input_dim, spec.tokens * spec.hidden, relu=True)
    nodes.append(
        helper.make_node("Reshape", [x, shape_const("rows", [-1, spec.hidden])], ["tokens_flat"])
    )
    x = "tokens_flat"
    for i in range(spec.layers):
        x = dense(f"layer{i}", x, spec.hidden, spec.hidden, relu=True)
    # [batch * tokens, hidden] -> [batch, tokens, hidden] -> mean over tokens -> [batch, hidden]
    nodes.append(
        helper.make_node(
            "Reshape", [x, shape_const("seq", [-1, spec.tokens, spec.hidden])], ["tokens_seq"]
        )
    )
    nodes.append(helper.make_node("ReduceMean", ["tokens_seq"], ["pooled"], axes=[1], keepdims=0))
    dense("head", "pooled", spec.hidden, spec.output_dim, relu=False, out=OUTPUT_NAME)

    return _serialise(nodes, initializers, spec)


def _serialise(nodes: list, initializers: list, spec: ModelSpec) -> bytes:
    """The graph of ``nodes`` as a checked ONNX model, serialised."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "kneeswarm_demo_mlp",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", spec.input_dim])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", spec.output_dim])],
        initializers,
    )
    model = helper.make_model(
        graph,
        producer_name="kneeswarm.target",
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    logger.info("built MLP %s: %d parameters", spec, spec.parameters)
    return model.SerializeToString()


def make_session(model: bytes, intra_op_threads: int, inter_op_threads: int):  # noqa: ANN201
    """Open one shared ONNX Runtime CPU session (0 threads = ONNX Runtime's own default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if inter_op_threads > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    options.log_severity_level = 3  # errors only; warnings would clutter the server's stderr
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
