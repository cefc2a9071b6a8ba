"""The gRPC APIs kneeswarm speaks are the servers' own: the stubs kept in
kneeswarm/contracts/grpcapi are what grpcio-tools makes of the .proto files beside them, the .proto
files printed from the PyPI wheels' descriptors are exactly their own descriptors' rendering, KServe's
v2 messages are Triton's (so one set of stubs serves both), and the status codes' HTTP statuses are
google/rpc/code.proto's own mapping."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kneeswarm.contracts.grpcapi import derive, generate

HERE = Path(generate.__file__).resolve().parent
DERIVED = {"triton": ("model_config.proto", "grpc_service.proto"), "kserve": ("grpc_predict_v2.proto",)}


@pytest.mark.parametrize("api", sorted(generate.APIS))
def test_the_stubs_are_generated_from_the_proto_files_kept(api):
    fresh = generate.stubs(api)
    kept = {p.name: p.read_text() for p in (HERE / api).iterdir() if "_pb2" in p.name}
    assert sorted(fresh) == sorted(kept)
    for name, text in fresh.items():
        assert text == kept[name], f"{api}/{name} differs from what grpcio-tools makes of the .proto files"


def _without_header(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("//")) + "\n"


@pytest.mark.parametrize("api,proto", [(a, p) for a, ps in DERIVED.items() for p in ps])
def test_a_printed_proto_file_is_its_own_descriptor_printed(api, proto):
    """Compiling the file and printing its descriptor gives the file back: nothing in it was edited
    by hand after derive.py printed it from the wheel's descriptor (SOURCE.md)."""
    kept = (HERE / api / proto).read_text()
    fdp = derive.compiled(proto, [str(HERE / api)])
    assert derive.proto_text(fdp) == _without_header(kept)


def _fields(fdp) -> dict[str, dict[str, tuple]]:
    out: dict[str, dict[str, tuple]] = {}

    def walk(msgs, scope):
        for m in msgs:
            name = f"{scope}.{m.name}"
            out[name] = {f.name: (f.number, f.type, f.label, f.type_name) for f in m.field}
            walk(m.nested_type, name)

    walk(fdp.message_type, fdp.package)
    return out


#: the data plane kneeswarm calls (health, metadata, inference); the repository extension's messages
#: differ between the two (KServe's RepositoryModelLoadRequest numbers model_name 1, Triton's 2)
DATA_PLANE = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")


def _reached(fields: dict[str, dict[str, tuple]], roots: set[str]) -> set[str]:
    """The messages ``roots`` hold, transitively (their fields' message types, nested ones included)."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in fields:
            continue
        seen.add(name)
        todo += [spec[3].lstrip(".") for spec in fields[name].values() if spec[3]]
        todo += [n for n in fields if n.startswith(name + ".")]
    return seen


def test_kserve_v2_data_plane_is_tritons():
    kserve = derive.compiled("grpc_predict_v2.proto", [str(HERE / "kserve")])
    triton = derive.compiled("grpc_service.proto", [str(HERE / "triton")])
    k, t = _fields(kserve), _fields(triton)
    assert kserve.service[0].name == triton.service[0].name == "GRPCInferenceService"
    kmethods = {m.name: (m.input_type, m.output_type) for m in kserve.service[0].method}
    tmethods = {m.name: (m.input_type, m.output_type) for m in triton.service[0].method}
    roots = set()
    for method in DATA_PLANE:
        assert kmethods[method] == tmethods[method], method
        roots |= {name.lstrip(".") for name in kmethods[method]}
    used = _reached(k, roots)
    assert {"inference.ModelInferRequest.InferInputTensor", "inference.InferTensorContents",
            "inference.InferParameter"} <= used
    for msg in used:  # every KServe field is Triton's (Triton adds some: InferParameter's double_param)
        assert {name: t[msg].get(name) for name in k[msg]} == k[msg], msg
    # and the check can fail: the repository extension's request differs
    assert k["inference.RepositoryModelLoadRequest"] != t["inference.RepositoryModelLoadRequest"]


def test_status_codes_map_to_the_published_http_statuses():
    from google.rpc import status_pb2

    from kneeswarm.locustfiles.protocols.grpcbase import HTTP_STATUS

    code_proto = Path(status_pb2.__file__).with_name("code.proto").read_text()
    found = re.findall(r"HTTP Mapping: (\d+)[^\n]*\n\s+(\w+) = \d+;", code_proto)
    published = {name: int(status) for status, name in found}
    assert len(published) == 17 and published == HTTP_STATUS
