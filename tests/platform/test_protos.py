"""The committed stubs in omru/v1 are what `make protos` generates from protos/ now."""

from __future__ import annotations

from pathlib import Path

from omru import protogen


def test_committed_generated_stubs_are_current(tmp_path):
    fresh = protogen.generate(tmp_path)
    committed_dir = protogen.REPO_ROOT / protogen.PACKAGE_DIR
    fresh_names = sorted(p.name for p in fresh)
    committed_names = sorted(p.name for p in protogen.generated_files(committed_dir))
    assert fresh_names == committed_names, "run `make protos` and commit omru/v1"
    stale = [name for name in fresh_names if (tmp_path / protogen.PACKAGE_DIR / name).read_bytes() != (committed_dir / name).read_bytes()]
    assert not stale, f"stale generated stubs {stale}: run `make protos` and commit omru/v1"


def test_every_proto_message_field_and_rpc_has_a_comment():
    uncommented = []
    for proto in sorted((protogen.PROTO_ROOT / protogen.PACKAGE_DIR).glob("*.proto")):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            declares = stripped.startswith(("message ", "enum ", "service ", "rpc ")) or (
                stripped.endswith(";") and "=" in stripped and not stripped.startswith(("syntax", "option"))
            )
            if declares and not lines[i - 1].strip().startswith("//"):
                uncommented.append(f"{proto.name}:{i + 1}: {stripped}")
    assert not uncommented, "\n".join(uncommented)


def test_enum_zero_values_are_unspecified_and_each_rpc_has_its_own_request_and_response():
    from omru.v1 import common_pb2, executor_pb2, planner_pb2, profiler_pb2, registry_pb2

    for module in (common_pb2, executor_pb2, planner_pb2, profiler_pb2, registry_pb2):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            assert enum.values_by_number[0].name.endswith("_UNSPECIFIED"), enum.full_name
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.name.endswith("Service")
            for method in service.methods:
                assert method.input_type.name == f"{method.name}Request", method.full_name
                assert method.output_type.name == f"{method.name}Response", method.full_name
    assert Path(protogen.__file__).name == "protogen.py"
