"""The project skeleton: both gRPC stub sets import, and the layout is what DEVELOPERS.md fixes."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_layout_exists():
    for d in ("xapp", "e2sm", "agent", "schemas", "descriptors", "docker", "tests", "testbed"):
        assert (ROOT / d).is_dir(), d


def test_proto_stubs_import_on_protobuf_320():
    import google.protobuf

    from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

    assert google.protobuf.__version__.startswith("3.20")
    lease = lease_pb2.Lease(lease_id="x", sm_count=16, period_ms=100, valid_for_ms=300)
    assert lease_pb2.Lease.FromString(lease.SerializeToString()) == lease
    assert hasattr(lease_pb2_grpc, "LeaseBrokerStub")
