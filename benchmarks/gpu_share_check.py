"""GPU check: a CUDA process in a 30 % share is held to it, on a real NVIDIA GPU under MPS.

Needs a machine with an NVIDIA GPU, its driver's MPS control daemon (`nvidia-cuda-mps-control`), `nvidia-ml-py` and
PyTorch; CI has none of them, so this is a check to run where a GPU is lent, not a test. Every kubegpu part on the way
is the real one; only containerd and the container are left out (the CUDA processes run on the host with the
environment the shim wrote):

1. the node side: the advertiser's collection with the nvidia plugin found through its entry points discovers the
   GPUs through NVML and publishes the Node (`KUBEGPU_NVIDIA_SHARE_LIMITS=mps`: shares offered, held by MPS);
2. the scheduler: the engine places two pods asking `nvidia.com/gpu: 1`, `nvidia.com/gpucores: 30`,
   `nvidia.com/gpumem-percentage: 30` on that Node and refuses a third asking 50 % of the compute, with its reason;
3. the CRI shim's editor verifies each placed pod's signed allocation and edits its CreateContainer request (the
   second pod's spec sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=999999M`,
   a tenant trying to raise its own limit);
4. an MPS control daemon starts on the host directories the edit mounts, and CUDA processes run with each
   container's edited environment: bf16 matrix products for a fixed time (compute), then 1 GiB allocations until
   the first refusal (memory), alone and the two shares at once, beside the whole GPU without MPS and an MPS client
   without limits. A last run is share-a's environment with the tenant's values written over it, as the tenant's own
   entrypoint can before CUDA starts: MPS takes a client's limits from its own environment, so that one is not held
   (docs/security.md T80: `mps` is a mode for tenants that trust each other) and is shown, not judged.

It prints, per process, the streaming multiprocessors (SMs) its blocks ran on, its matrix products' speed and SM
clock, and the memory it could allocate. MPS holds a share's compute by the SMs a client may use, so that is what is
judged: it exits 1 where a share's blocks ran on more than its percent of the SMs (with `--tolerance` points for
rounding) or allocated more than its memory limit, 2 where the machine lacks what it needs. The speed is shown, not
judged: a GPU running all its SMs lowers its clock to stay within its power, so a 30 % share computes more than 30 %
of the whole GPU's speed.

    python benchmarks/gpu_share_check.py [--seconds 4] [--tolerance 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NODE = "gpu-node"
SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem-percentage": "30"}
TOO_MUCH = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}
TENANT_RAISES = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=999999M"}
GIB = 1 << 30
MATRIX = 8192


# ----------------------------------------------------------------------------------------------------------
# The workload (a child process: `--workload SECONDS`)
# ----------------------------------------------------------------------------------------------------------


SMID = r"""
extern "C" __global__ void smid(unsigned int* out, long long spin) {
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    long long begin = clock64();
    while (clock64() - begin < spin) {
    }
    if (threadIdx.x == 0) out[blockIdx.x] = id;
}
"""


def streaming_multiprocessors() -> int:
    """How many streaming multiprocessors this process's blocks ran on: far more blocks than the GPU has SMs, each
    spinning about a millisecond and writing the `%smid` it ran on."""
    import cupy
    import torch

    blocks = torch.cuda.get_device_properties(0).multi_processor_count * 16
    out = cupy.zeros(blocks, dtype=cupy.uint32)
    cupy.RawKernel(SMID, "smid")((blocks,), (128,), (out, cupy.int64(2_000_000)))
    return len(set(out.get().tolist()))


def workload(seconds: float, memory: bool) -> dict[str, float]:
    """The SMs its blocks run on; bf16 matrix products for `seconds` after a warm-up: TFLOP/s and the SM clock
    (median of readings while they run); then, with `memory`, 1 GiB allocations until the first refusal: GiB
    held."""
    import pynvml
    import torch

    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    result: dict[str, float] = {"sms": streaming_multiprocessors()}
    a = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    products, clocks, start = 0, [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            a @ b
        clocks.append(pynvml.nvmlDeviceGetClockInfo(gpu, pynvml.NVML_CLOCK_SM))
        torch.cuda.synchronize()
        products += 4
    elapsed = time.perf_counter() - start
    result |= {"tflops": 2 * MATRIX**3 * products / elapsed / 1e12, "mhz": sorted(clocks)[len(clocks) // 2]}
    if memory:
        del a, b
        torch.cuda.empty_cache()
        blocks: list[Any] = []
        try:
            while len(blocks) < 1024:
                blocks.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
        result["gib"] = float(len(blocks))
    return result


# ----------------------------------------------------------------------------------------------------------
# kubegpu's node side, scheduler and shim edit
# ----------------------------------------------------------------------------------------------------------


def pod(name: str, limits: dict[str, str], env: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda-app", "resources": {"limits": limits}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"containers": [container]},
    }


def place_and_edit() -> tuple[dict[str, Any], dict[str, dict[str, Any]], str]:
    """The advertised Node, each placed pod's edited container (envs, mounts, devices) and the third pod's
    refusal."""
    from cri_api.v1 import api_pb2

    from kubegpu.core.annotations import ALLOCATION_KEY
    from kubegpu.core.manifests import node_info, pod_request
    from kubegpu.core.plugin_manager import make_plugin_manager
    from kubegpu.crishim.shim import ContainerEditor, edit_from_config
    from kubegpu.crishim.testing import advertise
    from kubegpu.scheduler.engine import Engine

    device_side = make_plugin_manager("device")
    node = advertise(device_side, Path("/"), node=NODE, allocatable={"cpu": "16", "memory": "128Gi", "pods": "110"})
    key = secrets.token_bytes(32)
    engine = Engine(make_plugin_manager("scheduler"), signing_key=key)
    engine.add_node(node_info(node))
    editor = ContainerEditor(device_side, node=NODE, key=key)
    edited: dict[str, dict[str, Any]] = {}
    for name, env in (("share-a", None), ("share-b", TENANT_RAISES)):
        manifest = pod(name, SHARE, env)
        decision = engine.schedule(pod_request(manifest, engine.plugins.qualifiers)[0])
        if not decision.scheduled:
            raise SystemExit(f"{name} was not placed: {decision.reason}")
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=f"sandbox-{name}",
            config=api_pb2.ContainerConfig(
                metadata=api_pb2.ContainerMetadata(name="main"),
                envs=[api_pb2.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            ),
            sandbox_config=api_pb2.PodSandboxConfig(
                metadata=api_pb2.PodSandboxMetadata(name=name, namespace="default", uid=f"uid-{name}"),
                annotations={ALLOCATION_KEY: decision.annotations[ALLOCATION_KEY]},
            ),
        )
        config = edit_from_config(
            api_pb2.CreateContainerRequest.FromString(editor.create_container(request.SerializeToString())).config
        )
        edited[name] = {
            "envs": dict(config.envs),
            "mounts": {m.container_path: m.host_path for m in config.mounts},
            "devices": sorted(d.host_path for d in config.devices),
            "shares": decision.allocation.shares if decision.allocation else {},
        }
    refused = engine.schedule(pod_request(pod("share-c", TOO_MUCH), engine.plugins.qualifiers)[0])
    if refused.scheduled:
        raise SystemExit("share-c (50 % beside two 30 % shares) was placed")
    return node, edited, refused.reason or ""


# ----------------------------------------------------------------------------------------------------------
# Running the CUDA processes
# ----------------------------------------------------------------------------------------------------------


def container_env(edited: dict[str, Any]) -> dict[str, str]:
    """The process environment of an edited container run on the host: the host's less every MPS variable, plus the
    container's, with each path the edit mounts read from its host directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    for name, value in edited["envs"].items():
        env[name] = edited["mounts"].get(value, value)
    return env


def start(seconds: float, env: dict[str, str], memory: bool = True) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--workload", str(seconds)] + ([] if memory else ["--no-memory"])
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = process.communicate(timeout=300)
    if process.returncode != 0:
        raise SystemExit(f"a CUDA process failed (exit {process.returncode}): {out[-2000:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def mps_daemon(pipe: str, log: str) -> dict[str, str]:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        print("no nvidia-cuda-mps-control on PATH: MPS cannot run here")
        raise SystemExit(2)
    Path(pipe).mkdir(parents=True, exist_ok=True)
    Path(log).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=log)
    subprocess.run([control, "-d"], env=env, check=True)
    return env


def stop_mps(env: dict[str, str]) -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, check=False, timeout=30)


# ----------------------------------------------------------------------------------------------------------
# The check
# ----------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="compute time of each CUDA process")
    parser.add_argument("--tolerance", type=float, default=2.0, help="points of SMs over the share allowed")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--workload", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--no-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload is not None:
        print(json.dumps(workload(args.workload, memory=not args.no_memory)))
        return 0

    os.environ["KUBEGPU_NVIDIA_SHARE_LIMITS"] = "mps"  # the node's configuration: shares offered, held by MPS
    node, edited, refusal = place_and_edit()
    status = node["status"]
    print(f"advertised: {json.dumps(status['allocatable'], sort_keys=True)}")
    print(f"labels: {json.dumps({k: v for k, v in node['metadata']['labels'].items() if 'nvidia' in k})}")
    for name, container in edited.items():
        mps = {k: v for k, v in container["envs"].items() if k.startswith(("CUDA_MPS_", "NVIDIA_"))}
        print(f"{name}: shares {json.dumps(container['shares'])}; devices {container['devices']}; env {mps}")
    print(f"share-c (gpucores 50): refused: {refusal}")

    host = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    whole = finish(start(args.seconds, host))
    a_env, b_env = container_env(edited["share-a"]), container_env(edited["share-b"])
    daemon = mps_daemon(a_env["CUDA_MPS_PIPE_DIRECTORY"], a_env["CUDA_MPS_LOG_DIRECTORY"])
    try:
        unlimited = finish(start(args.seconds, host | {k: v for k, v in daemon.items() if k.startswith("CUDA_MPS_")}))
        alone = finish(start(args.seconds, a_env))
        tenant = finish(start(args.seconds, b_env))
        rewritten = finish(start(args.seconds, a_env | TENANT_RAISES))
        together = [finish(p) for p in [start(args.seconds, a_env, False), start(args.seconds, b_env, False)]]
    finally:
        stop_mps(daemon)

    total_mib = int(node["metadata"]["labels"]["nvidia.com/gpu.memory"])
    limit_gib = int(total_mib * int(SHARE["nvidia.com/gpumem-percentage"]) / 100) / 1024
    cores = int(SHARE["nvidia.com/gpucores"])
    sms = int(whole["sms"])
    most = math.ceil(sms * (cores + args.tolerance) / 100)
    rows = {
        "whole GPU, no MPS": whole,
        "whole GPU through MPS, no limit": unlimited,
        "share-a alone": alone,
        "share-b alone (its spec sets 100 %)": tenant,
        "share-a beside share-b": together[0],
        "share-b beside share-a": together[1],
    }
    unheld = "share-a, its own process sets 100 % before CUDA starts (T80)"
    rows[unheld] = rewritten
    print(
        f"\n| process | SMs its blocks ran on (of {sms}) | bf16 TFLOP/s | of the unlimited MPS client | SM clock, MHz "
        f"| GiB it could allocate (limit {limit_gib:.1f}) |"
    )
    print("|---|---|---|---|---|---|")
    held = True
    for label, got in rows.items():
        gib = got.get("gib")
        print(
            f"| {label} | {got['sms']:.0f} | {got['tflops']:.0f} | {100 * got['tflops'] / unlimited['tflops']:.1f} % "
            f"| {got['mhz']:.0f} | {'' if gib is None else f'{gib:.0f}'} |"
        )
        if label.startswith("share") and label != unheld:
            held &= got["sms"] <= most and (gib is None or gib <= limit_gib)
    print(
        f"\nshare held: {'yes' if held else 'NO'} (each share's blocks on at most {most} SMs, {cores} % of {sms} "
        f"with {args.tolerance:g} points of rounding; at most {limit_gib:.1f} GiB allocated)"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "limit_gib": limit_gib, "refusal": refusal}, indent=1))
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
