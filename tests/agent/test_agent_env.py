"""The agent venv: torch CPU build and protobuf>=5 coexist with the committed stubs."""


def test_agent_env_has_torch_and_new_protobuf():
    import google.protobuf
    import torch

    from schemas.proto.weaver.v1 import lease_pb2

    assert int(google.protobuf.__version__.split(".")[0]) >= 5
    assert torch.tensor([1.0, 2.0]).sum().item() == 3.0
    msg = lease_pb2.AgentMessage(heartbeat=lease_pb2.Heartbeat(seq=3))
    assert lease_pb2.AgentMessage.FromString(msg.SerializeToString()).heartbeat.seq == 3
