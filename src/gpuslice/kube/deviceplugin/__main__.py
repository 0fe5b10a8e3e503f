"""``python -m gpuslice.kube.deviceplugin``: compile api.proto now (image builds, CI)."""

from gpuslice.kube.deviceplugin import load

pb2, grpc_mod = load()
print(f"device-plugin API ready: {pb2.__file__}")
