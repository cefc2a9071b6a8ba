"""A .proto file's text from its compiled descriptor (a ``FileDescriptorProto``), for the APIs whose
packages on PyPI carry only the compiled form (floor 1 contract).

Triton's grpc_service.proto and model_config.proto and KServe's grpc_predict_v2.proto reach a
Python installation only compiled, as the serialized descriptor inside the ``*_pb2.py`` modules of
``tritonclient`` and ``kserve``.  ``proto_text`` prints such a descriptor back as proto3 source:
every message, field (number, type, label, ``optional``, maps, oneofs), enum, service and method,
with the file's package, imports and options.  Comments are not in a descriptor, so they are not
in the text.  The text is faithful when compiling it gives the descriptor back, field for field
(``python -m kneeswarm.contracts.grpcapi.derive --check``): that is how the files here were made
(their SOURCE.md) and what tests/test_grpc_stubs.py checks of them.

    python -m kneeswarm.contracts.grpcapi.derive MODULE_pb2.py OUT.proto   (print one)
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from google.protobuf import descriptor_pb2

logger = logging.getLogger(__name__)

F = descriptor_pb2.FieldDescriptorProto
#: protobuf's scalar field types by their descriptor number, as a .proto names them
SCALARS = {F.TYPE_DOUBLE: "double", F.TYPE_FLOAT: "float", F.TYPE_INT64: "int64", F.TYPE_UINT64: "uint64",
           F.TYPE_INT32: "int32", F.TYPE_FIXED64: "fixed64", F.TYPE_FIXED32: "fixed32", F.TYPE_BOOL: "bool",
           F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes", F.TYPE_UINT32: "uint32", F.TYPE_SFIXED32: "sfixed32",
           F.TYPE_SFIXED64: "sfixed64", F.TYPE_SINT32: "sint32", F.TYPE_SINT64: "sint64"}
INDENT = "  "


def _type(field: Any) -> str:
    return SCALARS.get(field.type) or field.type_name  # a message or enum: its full name, ".pkg.Name"


def _options(opts: Any) -> list[str]:
    """``name = value`` of every option set in an options message (file, field, message)."""
    out = []
    for fd, value in opts.ListFields():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif fd.enum_type is not None:
            text = fd.enum_type.values_by_number[value].name
        else:
            text = str(value)
        out.append(f"{fd.name} = {text}")
    return out


def _field(field: Any, maps: dict[str, Any], depth: int) -> str:
    entry = maps.get(field.type_name)
    if entry is not None:  # a map<key, value>: its entry message is synthetic
        key, value = entry.field[0], entry.field[1]
        head = f"map<{_type(key)}, {_type(value)}>"
    else:
        label = ("repeated " if field.label == F.LABEL_REPEATED else
                 "optional " if field.proto3_optional else "")
        head = label + _type(field)
    opts = _options(field.options) if field.HasField("options") else []
    tail = f" [{', '.join(opts)}]" if opts else ""
    return f"{INDENT * depth}{head} {field.name} = {field.number}{tail};"


def _enum(enum: Any, depth: int) -> list[str]:
    pad = INDENT * depth
    lines = [f"{pad}enum {enum.name} {{"]
    lines += [f"{pad}{INDENT}option {o};" for o in _options(enum.options)] if enum.HasField("options") else []
    lines += [f"{pad}{INDENT}{v.name} = {v.number};" for v in enum.value]
    return [*lines, f"{pad}}}"]


def _message(msg: Any, scope: str, depth: int) -> list[str]:
    pad, inner = INDENT * depth, INDENT * (depth + 1)
    full = f"{scope}.{msg.name}"
    maps = {f"{full}.{n.name}": n for n in msg.nested_type if n.options.map_entry}
    lines = [f"{pad}message {msg.name} {{"]
    lines += [f"{inner}option {o};" for o in _options(msg.options)] if msg.HasField("options") else []
    for nested in msg.nested_type:
        if not nested.options.map_entry:
            lines += _message(nested, full, depth + 1)
    for enum in msg.enum_type:
        lines += _enum(enum, depth + 1)
    real_oneofs = {f.oneof_index for f in msg.field if f.HasField("oneof_index") and not f.proto3_optional}
    done: set[int] = set()
    for field in msg.field:
        if field.HasField("oneof_index") and field.oneof_index in real_oneofs:
            if field.oneof_index in done:
                continue
            done.add(field.oneof_index)
            lines.append(f"{inner}oneof {msg.oneof_decl[field.oneof_index].name} {{")
            lines += [_field(f, maps, depth + 2) for f in msg.field
                      if f.HasField("oneof_index") and f.oneof_index == field.oneof_index]
            lines.append(f"{inner}}}")
        else:
            lines.append(_field(field, maps, depth + 1))
    for r in msg.reserved_range:
        lines.append(f"{inner}reserved {r.start}" + (f" to {r.end - 1}" if r.end - 1 > r.start else "") + ";")
    if msg.reserved_name:
        lines.append(f"{inner}reserved {', '.join(repr(n).replace(chr(39), chr(34)) for n in msg.reserved_name)};")
    return [*lines, f"{pad}}}"]


def proto_text(fdp: Any, header: str = "") -> str:
    """``fdp`` (a FileDescriptorProto of a proto3 file) as .proto source, ``header`` (comment
    lines: where it came from, its licence) on top."""
    scope = f".{fdp.package}" if fdp.package else ""
    lines = [header.rstrip("\n")] if header else []
    lines += [f'syntax = "{fdp.syntax or "proto2"}";', ""]
    if fdp.package:
        lines += [f"package {fdp.package};", ""]
    lines += [f'import "{dep}";' for dep in fdp.dependency]
    lines += [f"option {o};" for o in _options(fdp.options)] if fdp.HasField("options") else []
    for msg in fdp.message_type:
        lines += ["", *_message(msg, scope, 0)]
    for enum in fdp.enum_type:
        lines += ["", *_enum(enum, 0)]
    for svc in fdp.service:
        lines += ["", f"service {svc.name} {{"]
        for m in svc.method:
            req = ("stream " if m.client_streaming else "") + m.input_type
            resp = ("stream " if m.server_streaming else "") + m.output_type
            lines.append(f"{INDENT}rpc {m.name}({req}) returns ({resp}) {{}}")
        lines.append("}")
    return "\n".join(lines) + "\n"


def descriptor_of_module(path: str) -> Any:
    """The FileDescriptorProto serialized in a generated ``*_pb2.py`` (read, never imported)."""
    import ast

    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            fdp = descriptor_pb2.FileDescriptorProto()
            fdp.ParseFromString(ast.literal_eval(node.args[0]))
            return fdp
    raise ValueError(f"{path}: no serialized descriptor (AddSerializedFile) in it")


def compiled(proto: str, include: list[str]) -> Any:
    """The FileDescriptorProto that grpcio-tools' protoc makes of ``proto`` (a path under one of
    ``include``), its source-code info left out, as a generated module's descriptor has none."""
    import os
    import tempfile

    from grpc_tools import protoc  # grpcio-tools: the test extra, never needed to run

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        args = ["protoc", *[f"-I{i}" for i in include], f"--descriptor_set_out={out}", proto]
        if protoc.main(args) != 0:
            raise ValueError(f"protoc could not compile {proto}")
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
    fdp = fds.file[-1]
    fdp.ClearField("source_code_info")
    return fdp


def main(argv: list[str]) -> int:
    if len(argv) == 2:
        fdp = descriptor_of_module(argv[0])
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(proto_text(fdp))
        return 0
    print(__doc__.rsplit("\n\n", 1)[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
