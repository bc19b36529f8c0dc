"""GPU shares on the node: the limits that hold a container to the share its allocation names.

The scheduler side (`scheduler.py`) writes each share container's share into the allocation's `shares`: per GPU id,
`nvidia.com/gpucores` (percent of compute, 0: none reserved) and `nvidia.com/gpumem` (MiB) or
`nvidia.com/gpumem-percentage` (percent of the GPU's memory, where the scheduler did not know the GPU's memory). The
node side (the CRI shim and the device-plugin mode, through `device.py`'s container edit) turns it into what the
node's enforcement reads, chosen by the node's configuration: `KUBEGPU_NVIDIA_SHARE_LIMITS` in the environment of
`kubegpu crishim` / `kubegpu device-plugin`:

* `hami-core`: HAMi-core (`libvgpu.so`, the CUDA hook HAMi's device plugin uses) preloaded in the container.
  Env, for the container's i-th GPU (0, 1, ... in ascending index order, as CUDA numbers them inside the container):
  `CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`, and `CUDA_DEVICE_SM_LIMIT=<percent>` with `CUDA_DEVICE_SM_LIMIT_<i>` the
  same; HAMi-core's switches at the values that hold the share (`CUDA_OVERSUBSCRIBE=false`,
  `GPU_CORE_UTILIZATION_POLICY=default`, `CUDA_TASK_PRIORITY=1`, `CUDA_REDIRECT=/usr/local/vgpu/libvgpu.so`); and
  `CUDA_DEVICE_MEMORY_SHARED_CACHE` naming the shared region in a directory the node makes empty for each container
  it creates (`region_directory`: `<KUBEGPU_HAMI_CORE_DIR>/containers/<pod uid>_<container>` on the host, at
  `/usr/local/vgpu/cache` in the container). Mounts, from the host directory `KUBEGPU_HAMI_CORE_DIR` (default
  `/usr/local/vgpu`): `libvgpu.so` read-only at `/usr/local/vgpu/libvgpu.so`, `ld.so.preload` (one line naming that
  path) read-only at `/etc/ld.so.preload`, `vgpulock/` at `/tmp/vgpulock` (HAMi-core's node-wide lock directory),
  that region directory, and `/dev/null` read-only at `/overrideEnv`.
* `mps`: an NVIDIA MPS control daemon on the node. Env `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<percent>` (with
  `CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING=0`, NVIDIA's default) and
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M,1=<MiB>M` (the same per-GPU order), `CUDA_MPS_PIPE_DIRECTORY` and
  `CUDA_MPS_LOG_DIRECTORY`; mounts: the daemon's pipe directory `KUBEGPU_MPS_PIPE_DIRECTORY` (default
  `/tmp/nvidia-mps`) at `/tmp/nvidia-mps` and its log directory `KUBEGPU_MPS_LOG_DIRECTORY` (default
  `/var/log/nvidia-mps`) read-only at `/var/log/nvidia-mps`. Only for tenants that trust each other: the CUDA driver
  reaches the control daemon through the pipe directory's `control` socket, the one `nvidia-cuda-mps-control` sends
  its commands to (`quit`, `terminate_client`, `set_active_thread_percentage` of the shared server), and NVIDIA
  documents no check of who sends them; a client that cannot reach the daemon runs without MPS, unlimited. Mounting
  the directory read-only would not help (connecting to a socket writes nothing to the mount), and NVIDIA's own
  device plugin mounts it writable too (docs/security.md, T80).
* `none`: shares run without limits (a scheduling promise only), by the operator's explicit choice.

Unset, a container with a share is refused with a message that says how to configure the node: a share that nothing
enforces is never started silently. A container of whole GPUs gets no limits whatever the mode. A memory share in
percent becomes MiB from the GPU's memory as NVML reports it in this process; 100 % needs no limit. No compute
reserved (`gpucores` 0, or absent) sets no compute limit.

The plugin owns every variable and mount named here (`device.OWNED`): the shim removes them from every container
before the plugin writes the allocation's values, so a tenant cannot raise its limit from the pod spec. It also owns
the knobs that would switch HAMi-core's limits off or turn them against the GPU's other tenants
(`CUDA_DISABLE_CONTROL`, `GPU_CORE_UTILIZATION_POLICY`, `CUDA_OVERSUBSCRIBE`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`,
`CUDA_TASK_PRIORITY`, `ACTIVE_OOM_KILLER`, `CUDA_REDIRECT`), every `CUDA_DEVICE_SM_LIMIT*` and
`CUDA_DEVICE_MEMORY_LIMIT*` and every `CUDA_MPS_*` variable.

The image's own `ENV` is not in the container config the shim edits: the runtime merges it under the config's
(a config variable of the same name wins, an image variable of another name stays), and in device-plugin mode the
kubelet passes Allocate's env as config env too. So a share container is written a value for every variable HAMi-core
reads that could lift its share: the per-GPU `_<i>` limit names of every GPU it has (HAMi-core reads them before the
bare names, and an image's `CUDA_DEVICE_SM_LIMIT_0=100` would win over a bare `CUDA_DEVICE_SM_LIMIT=30`) and each
switch at its neutral value; the ones it does not write only lower the container's own share
(`CUDA_DEVICE_MEMORY_LIMIT` where every GPU has its own, a limit for a GPU the container does not have,
`ACTIVE_OOM_KILLER`, which kills only the processes of the container's own region) or are not HAMi-core's
(`CUDA_DISABLE_CONTROL`, HAMi's device plugin's switch for mounting the preload file, which kubegpu always mounts).
The files HAMi-core reads are the node's too: `/overrideEnv` (its `NAME=value` lines set over the environment, an
image could ship one) is `/dev/null`, and the shared region (whose limits, once written, win over the environment
of every later process) is in the fresh directory, not at the default `/tmp/cudevshr.cache` where an image or a
tenant's volume at `/tmp` could have put one. The node's mounts lie deeper than any tenant volume that holds them
(`/tmp`, `/usr/local`) and come after the tenant's in the config, so the runtime mounts them on top.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubegpu.core.models import ContainerAllocation, Mount
from kubegpu.plugins.nvidia import RESOURCE
from kubegpu.plugins.nvidia.sharing import CORES, MEMORY, MEMORY_PERCENT

__all__ = [
    "HAMI_CORE",
    "MODES",
    "MODE_ENV",
    "MPS",
    "NO_LIMITS",
    "OWNED_ENVS",
    "OWNED_ENV_PREFIXES",
    "OWNED_MOUNTS",
    "ContainerShare",
    "NodeSharing",
    "ShareLimitError",
    "limits",
    "node_sharing",
    "read_container_share",
    "region_directory",
    "remove_gone_regions",
    "sweep_set_aside",
]

log = logging.getLogger("kubegpu.nvidia")

# ----------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------

MODE_ENV = "KUBEGPU_NVIDIA_SHARE_LIMITS"
HAMI_DIR_ENV = "KUBEGPU_HAMI_CORE_DIR"
MPS_PIPE_ENV = "KUBEGPU_MPS_PIPE_DIRECTORY"
MPS_LOG_ENV = "KUBEGPU_MPS_LOG_DIRECTORY"
DEFAULT_HAMI_DIR, DEFAULT_MPS_PIPE, DEFAULT_MPS_LOG = "/usr/local/vgpu", "/tmp/nvidia-mps", "/var/log/nvidia-mps"
HAMI_CORE, MPS, NO_LIMITS = "hami-core", "mps", "none"
MODES = (HAMI_CORE, MPS, NO_LIMITS)

# What the container sees (fixed, so that the shim can own the paths whatever the host's layout).
HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"
PRELOAD = "/etc/ld.so.preload"
HAMI_LOCK = "/tmp/vgpulock"
HAMI_REGION = "/usr/local/vgpu/cache"  # the per-container directory of HAMi-core's shared region
REGION_FILE = "cudevshr.cache"
OVERRIDE_FILE = "/overrideEnv"  # HAMi-core sets its `NAME=value` lines over the environment: the node's is empty
EMPTY_FILE = "/dev/null"
MPS_PIPE = "/tmp/nvidia-mps"
MPS_LOG = "/var/log/nvidia-mps"
# At most this long per sweep of what is set aside (`sweep_set_aside`, in a thread of its own, no lock held); a
# sweep that stops at it is followed by another after `SWEEP_PAUSE`, woken or not, until nothing is left but what
# cannot be removed (tried again at the next wake: the next forget, or creation of a restarted container).
SWEEP_BUDGET = 10.0
SWEEP_PAUSE = 1.0

MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"  # HAMi-core: bare (every GPU) or `_<i>`
SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_PER_CONTEXT = "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING"
SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
# HAMi-core's switches, at the value that holds the share (what HAMi-core does with none set): written into every
# share container so that the config's value wins over the image's own ENV.
HAMI_NEUTRAL = {
    "CUDA_OVERSUBSCRIBE": "false",  # "true" (any case) or "1": allocations over the memory limit go on
    "GPU_CORE_UTILIZATION_POLICY": "default",  # "disable": no compute limit
    "CUDA_TASK_PRIORITY": "1",  # "0" hangs the GPU's other (priority 1) tasks while this one runs
    "CUDA_REDIRECT": HAMI_LIBRARY,  # another library's cu* functions in place of libvgpu.so's hooks
}

OWNED_ENVS = (SHARED_CACHE, *HAMI_NEUTRAL, "CUDA_DISABLE_CONTROL", "ACTIVE_OOM_KILLER")
# HAMi-core reads `CUDA_DEVICE_SM_LIMIT_<i>` and `CUDA_DEVICE_MEMORY_LIMIT_<i>` before the bare names, so a tenant's
# `CUDA_DEVICE_SM_LIMIT_0=100` would undo the share's compute limit: both are owned by prefix.
OWNED_ENV_PREFIXES = (MEMORY_LIMIT, SM_LIMIT, "CUDA_MPS_")
# HAMi-core also reads two files of the container: `/overrideEnv` (`NAME=value` lines it sets over the environment
# before reading its limits) and its shared region at the default `/tmp/cudevshr.cache` (whose limits, once written,
# win over the environment of later processes): a tenant's volume mounted at either would lift the share's limits.
OWNED_MOUNTS = (
    r"/etc/ld\.so\.preload",
    r"/overrideEnv",
    r"/tmp/cudevshr\.cache",
    r"/usr/local/vgpu(/.*)?",
    r"/tmp/vgpulock(/.*)?",
    r"/tmp/nvidia-mps(/.*)?",
    r"/var/log/nvidia-mps(/.*)?",
)


_HOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,250}")
_ASIDE = ".gone-"  # what a container's earlier run, or a gone pod, left, set aside (no holder starts with a dot)


class ShareLimitError(ValueError):
    """A share that cannot be applied on this node; the message names what is wrong and what to change."""


@dataclass(frozen=True, slots=True)
class NodeSharing:
    """How this node enforces shares: `mode` one of `MODES`, None when the node is not configured."""

    mode: str | None
    hami_dir: str = DEFAULT_HAMI_DIR
    mps_pipe: str = DEFAULT_MPS_PIPE
    mps_log: str = DEFAULT_MPS_LOG


@dataclass(frozen=True, slots=True)
class ContainerShare:
    """One container's share: `cores` percent of each GPU's compute (0: no limit) and, per GPU in the container's
    order, its memory limit in MiB (None: the whole memory, no limit)."""

    cores: int
    memory_mib: tuple[int | None, ...]


# ----------------------------------------------------------------------------------------------------------
# Reading the node and the allocation
# ----------------------------------------------------------------------------------------------------------


def node_sharing(environ: Mapping[str, str] = os.environ) -> NodeSharing:
    """The node's configuration from the environment (read at each share container: a handful of lookups)."""
    raw = environ.get(MODE_ENV, "").strip().lower()
    return NodeSharing(
        mode=raw or None,
        hami_dir=environ.get(HAMI_DIR_ENV, "").strip() or DEFAULT_HAMI_DIR,
        mps_pipe=environ.get(MPS_PIPE_ENV, "").strip() or DEFAULT_MPS_PIPE,
        mps_log=environ.get(MPS_LOG_ENV, "").strip() or DEFAULT_MPS_LOG,
    )


def read_container_share(
    allocation: ContainerAllocation, gpus: list[str], memory_total: Callable[[int], int | None]
) -> ContainerShare | None:
    """The container's share over `gpus` (its GPU ids in the container's order), None for whole GPUs; raises
    `ShareLimitError` for a share that is malformed (a decoded annotation may hold anything) or that this node
    cannot turn into limits. `memory_total(index)` is the GPU's memory in bytes, None when unknown here."""
    shares = allocation.shares
    if not any(r in shares for r in (CORES, MEMORY, MEMORY_PERCENT)):
        if shares.get(RESOURCE):
            raise ShareLimitError(f"the share names no {CORES} and no memory for GPU(s) {', '.join(gpus)}")
        return None
    if MEMORY in shares and MEMORY_PERCENT in shares:
        raise ShareLimitError(f"the share names both {MEMORY} and {MEMORY_PERCENT}")
    memory_resource = MEMORY if MEMORY in shares else MEMORY_PERCENT
    # An amount the share leaves out is HAMi's: all of each GPU's memory, no compute reserved (an init container
    # lent 30 % of its pod's whole GPU names only the compute it asked: `kubegpu.core.annotations.init_devices`).
    cores_of = shares.get(CORES, dict.fromkeys(gpus, 0))
    memory_of = shares.get(memory_resource, dict.fromkeys(gpus, 100) if memory_resource == MEMORY_PERCENT else {})
    for resource, named in ((CORES, cores_of), (memory_resource, memory_of)):
        if set(named) != set(gpus):
            listed = ", ".join(sorted(named)) or "none"
            raise ShareLimitError(f"{resource} names GPU(s) {listed}, the container has GPU(s) {', '.join(gpus)}")
    cores = set(cores_of.values())
    if len(cores) != 1:
        raise ShareLimitError(f"{CORES} differs between the container's GPUs ({sorted(cores)}); a share takes one")
    (percent,) = cores
    if not 0 <= percent <= 100:
        raise ShareLimitError(f"{CORES} is {percent}; a share takes 0-100 percent of each GPU's compute")
    limits: list[int | None] = []
    for gpu in gpus:
        amount = memory_of[gpu]
        if memory_resource == MEMORY:
            if amount < 1:
                raise ShareLimitError(f"{MEMORY} of GPU {gpu} is {amount} MiB; a share takes at least 1 MiB")
            limits.append(amount)
            continue
        if not 1 <= amount <= 100:
            raise ShareLimitError(f"{MEMORY_PERCENT} of GPU {gpu} is {amount}; a share takes 1-100 percent")
        if amount == 100:
            limits.append(None)
            continue
        total = memory_total(int(gpu))
        if total is None:
            raise ShareLimitError(
                f"the share is {amount}% of GPU {gpu}'s memory and NVML in this process cannot say how much memory "
                "the GPU has (install nvidia-ml-py where the driver is, or advertise nvidia.com/gpu.memory so that "
                f"the scheduler writes {MEMORY} in MiB)"
            )
        limits.append(max(1, total // (1024 * 1024) * amount // 100))
    return ContainerShare(percent, tuple(limits))


# ----------------------------------------------------------------------------------------------------------
# The limits
# ----------------------------------------------------------------------------------------------------------


def limits(share: ContainerShare, sharing: NodeSharing, holder: str = "") -> tuple[dict[str, str], list[Mount]]:
    """The env and mounts that hold a container to `share` on a node configured as `sharing`; raises
    `ShareLimitError` when the node is not configured for shares, or cannot make the container's region directory.
    `holder` names the container on the node (`<pod uid>_<container>`, `region_directory`)."""
    if sharing.mode == NO_LIMITS:
        return {}, []
    if sharing.mode == HAMI_CORE:
        envs = {f"{MEMORY_LIMIT}_{i}": f"{mib}m" for i, mib in enumerate(share.memory_mib) if mib is not None}
        if share.cores:
            envs[SM_LIMIT] = str(share.cores)
            envs.update({f"{SM_LIMIT}_{i}": str(share.cores) for i in range(len(share.memory_mib))})
        envs.update(HAMI_NEUTRAL)
        envs[SHARED_CACHE] = f"{HAMI_REGION}/{REGION_FILE}"
        root = sharing.hami_dir.rstrip("/") or "/"
        mounts = [
            Mount(host_path=f"{root}/libvgpu.so", container_path=HAMI_LIBRARY, readonly=True),
            Mount(host_path=f"{root}/ld.so.preload", container_path=PRELOAD, readonly=True),
            Mount(host_path=f"{root}/vgpulock", container_path=HAMI_LOCK),
            Mount(host_path=str(region_directory(sharing, holder)), container_path=HAMI_REGION),
            Mount(host_path=EMPTY_FILE, container_path=OVERRIDE_FILE, readonly=True),
        ]
        return envs, mounts
    if sharing.mode == MPS:
        envs = {"CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE, "CUDA_MPS_LOG_DIRECTORY": MPS_LOG}
        if share.cores:
            envs[MPS_THREADS] = str(share.cores)
            envs[MPS_PER_CONTEXT] = "0"  # NVIDIA's default: the percentage holds the client, not each of its contexts
        pinned = [f"{i}={mib}M" for i, mib in enumerate(share.memory_mib) if mib is not None]
        if pinned:
            envs[MPS_MEMORY] = ",".join(pinned)
        mounts = [
            Mount(host_path=sharing.mps_pipe, container_path=MPS_PIPE),
            Mount(host_path=sharing.mps_log, container_path=MPS_LOG, readonly=True),
        ]
        return envs, mounts
    if sharing.mode is None:
        raise ShareLimitError(
            f"this node enforces no GPU shares: set {MODE_ENV}=hami-core (HAMi-core's libvgpu.so) or =mps (an MPS "
            f"daemon) for kubegpu's CRI shim or device plugin ({MODE_ENV}=none runs shares without limits)"
        )
    raise ShareLimitError(f"{MODE_ENV} is {sharing.mode[:40]!r}; give one of {', '.join(MODES)}")


def region_directory(sharing: NodeSharing, holder: str) -> Path:
    """The host directory of one container's HAMi-core shared region, made empty now:
    `<hami dir>/containers/<holder>` (HAMi's layout). Made anew at each creation of the container, so that no region
    written before (by an earlier run of it, whose code could write the limits in its region) is read: whatever that
    run left there is set aside (renamed `.gone-*` beside it, out of every container's reach) and removed by the
    sweeper (`sweep_set_aside`) in a thread of its own, so that a creation, which the CRI shim makes under its
    creation lock, never waits on a tree of millions of files. One directory per container of the node, set aside
    in turn once no sandbox of its pod is left on the node (`remove_gone_regions`). Mode 0777, so that a process of
    any user in the container can create the region; `containers/` is 0700, so that no user of the host reaches
    what a container wrote there. Raises `ShareLimitError` for a holder that is no plain name, or a directory that
    cannot be made (the hami dir missing: HAMi-core is not installed where it says)."""
    if not _HOLDER.fullmatch(holder):
        raise ShareLimitError(f"the container's name on the node ({holder[:80]!r}) is not a plain file name")
    parent = Path(sharing.hami_dir) / "containers"
    directory = parent / holder
    set_aside = False
    try:
        parent.mkdir(mode=0o700, exist_ok=True)
        parent.chmod(0o700)
        if directory.is_symlink() or not directory.is_dir():
            directory.unlink(missing_ok=True)
        else:
            _set_aside(parent, holder)
            set_aside = True
        directory.mkdir(mode=0o700)
        directory.chmod(0o777)
    except OSError as exc:
        raise ShareLimitError(
            f"cannot make the directory of the container's HAMi-core region {str(directory)[:200]!r}: {exc.strerror} "
            f"({HAMI_DIR_ENV} must name the directory HAMi-core is installed in, writable by kubegpu)"
        ) from None
    if set_aside:
        _wake_sweeper(parent)
    return directory


def remove_gone_regions(sharing: NodeSharing, live_pods: frozenset[str]) -> int:
    """Set aside the region directories (`containers/<pod uid>_<container>`, `region_directory`) of every pod whose
    UID is not in `live_pods` (renamed `.gone-*`, which no holder name can take: one rename each, whatever the
    container wrote there) and wake the sweeper, which removes them, and what earlier runs of containers left set
    aside, in a thread of its own (`sweep_set_aside`); returns how many pods' were set aside. The caller holds the
    CRI shim's creation lock (or the device-plugin mode's), so nothing here reads a tree: `containers/` holds one
    entry per container the node created, none a container can add. Whatever the node's mode now: a node switched
    from HAMi-core to MPS still sheds its old directories. One that cannot be renamed (still a mount point) is logged
    and tried again at the next call; a link or file where a directory should be is removed itself."""
    parent = Path(sharing.hami_dir) / "containers"
    try:
        names = sorted(entry.name for entry in os.scandir(parent))
    except OSError:  # no HAMi-core directory here, or no share container was ever created
        return 0
    removed: set[str] = set()
    for name in names:
        pod, separator, _ = name.partition("_")
        if name.startswith(_ASIDE) or not separator or pod in live_pods:
            continue
        try:
            if (parent / name).is_symlink() or not (parent / name).is_dir():
                (parent / name).unlink()
            else:
                _set_aside(parent, name)
        except OSError as exc:
            log.warning("cannot remove the HAMi-core region directory %r of a gone pod: %s", name[:80], exc.strerror)
            continue
        removed.add(pod)
    _wake_sweeper(parent)
    return len(removed)


def sweep_set_aside(parent: Path, *, budget: float = SWEEP_BUDGET, clock: Callable[[], float] = time.monotonic) -> bool:
    """Remove what is set aside (`.gone-*`) in `parent` (a `containers/` directory), whatever the containers wrote
    there (`_remove_tree`: links removed, never followed, at any depth, memory whatever a directory's size), for at
    most `budget` seconds after at least one entry; True when nothing set aside is left. The sweeper's work
    (`_Sweeper`), never under a lock: a tree of millions of files costs its own removal's time, no creation's. One
    that cannot be removed is logged and tried again at the next wake."""
    return not _sweep(parent, budget=budget, clock=clock).left


@dataclass(frozen=True, slots=True)
class _Swept:
    """What one sweep left: `left`, whether anything set aside is still there (a tree it could not remove, or did
    not reach); `stopped_in`, the tree its budget ran out in (None: it went through every tree)."""

    left: bool
    stopped_in: str | None = None


def _sweep(parent: Path, *, budget: float, clock: Callable[[], float], after: str = "") -> _Swept:
    """`sweep_set_aside`, beginning with the trees whose names follow `after` (the one the last sweep's budget ran
    out in), then the others, that one last: a tree that outlasts every budget (millions of files, or one that a
    force-deleted pod's container still running keeps writing into) takes its turn after the others, never all of
    the sweeper's time."""
    deadline = clock() + budget
    try:
        names = sorted(entry.name for entry in os.scandir(parent) if entry.name.startswith(_ASIDE))
    except OSError:
        return _Swept(left=False)
    left = False
    for name in [name for name in names if name > after] + [name for name in names if name <= after]:
        try:
            _remove_tree(parent, name, deadline=deadline, clock=clock)
        except TimeoutError:
            log.info("what gone share containers left in their region directories is removed at the next sweep")
            return _Swept(left=True, stopped_in=name)
        except OSError as exc:
            log.warning("cannot remove what a gone share container left in %r: %s", name[:80], exc.strerror)
            left = True
    return _Swept(left=left)


class _Sweeper:
    """The thread that removes what is set aside under one `containers/` directory (`_sweep`): started by a wake, it
    sweeps, and sweeps again if woken meanwhile, or after `SWEEP_PAUSE` if its budget ran out (so that a tree too
    big for one sweep goes on a quiet node too, where nothing wakes it again), and ends once a sweep went through
    every tree with no wake pending, so that an idle node keeps no thread."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent
        self._lock = threading.Lock()
        self._pending = False
        self._thread: threading.Thread | None = None
        self._after = ""  # the tree the last sweep's budget ran out in: the next sweep takes it last

    def wake(self) -> None:
        with self._lock:
            self._pending = True
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="kubegpu-region-sweeper", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had now: what is set aside waits for the next wake
                    log.warning("cannot start the sweeper of %s: %s", str(self.parent)[:200], exc)
                    return
                self._thread = thread

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                self._pending = False
            try:
                swept = _sweep(self.parent, budget=SWEEP_BUDGET, clock=time.monotonic, after=self._after)
            except Exception:  # a bug of its own: what is set aside waits for the next wake
                log.exception("removing what gone share containers left in %s failed", str(self.parent)[:200])
                continue
            if swept.stopped_in is not None:
                self._after = swept.stopped_in
                time.sleep(SWEEP_PAUSE)  # the disk's other users' turn; then on, whether woken or not
                with self._lock:
                    self._pending = True


_SWEEPERS: dict[Path, _Sweeper] = {}
_SWEEPERS_LOCK = threading.Lock()


def _wake_sweeper(parent: Path) -> None:
    """Have the sweeper of `parent` remove what is set aside there (one per directory, made at its first wake)."""
    with _SWEEPERS_LOCK:
        sweeper = _SWEEPERS.get(parent)
        if sweeper is None:
            sweeper = _SWEEPERS[parent] = _Sweeper(parent)
    sweeper.wake()


def _set_aside(parent: Path, name: str) -> str:
    """Rename the directory `name` of `parent` to a fresh `.gone-*` name there, and return that name."""
    while True:
        aside = f"{_ASIDE}{secrets.token_hex(8)}"
        if not os.path.lexists(parent / aside):
            os.rename(parent / name, parent / aside)
            return aside


def _remove_tree(parent: Path, name: str, *, deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Remove the directory `name` of `parent` and all it holds, whatever the container that owned it left there:
    links are removed, never followed, and nothing recurses or holds a file open per level (`shutil.rmtree` does
    both: a tree nested 3,000 deep raised RecursionError, 400 deep took 400 of the files the process may open).
    Each pass removes the files of the directories at its top and moves their own directories up beside them, so
    every entry is visited once, with two directories open at a time. Entries are removed as they are read, never
    listed first, so memory does not grow with a directory's size, and a directory whose mere listing takes longer
    than the budget is still removed, call by call. Once `deadline` (of `clock`) has passed, after at least one
    entry, it raises `TimeoutError`, leaving what remains under `name`. A directory that is a mount point (another
    filesystem, or a bind mount of a directory of the host) is never gone into: `OSError` (EXDEV), what lies in
    that mount and what remains under `name` left as they are."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    home = _mount_of_path(parent)
    level = os.open(parent / name, flags)  # `parent` is the node's (0700, in no container): only `name` is checked
    spare = _spare_names()
    try:
        _same_mount(level, home, name)
        found = True
        while found:
            found = False
            with os.scandir(level) as entries:
                for entry in entries:
                    found = True
                    if entry.is_dir(follow_symlinks=False):
                        _empty_into(level, entry.name, spare, deadline, clock, home)
                        os.rmdir(entry.name, dir_fd=level)
                    else:
                        os.unlink(entry.name, dir_fd=level)
                    if clock() > deadline:
                        raise TimeoutError(f"removing {name}")
    finally:
        os.close(level)
    os.rmdir(parent / name)


def _empty_into(
    level: int, name: str, spare: Iterator[str], deadline: float, clock: Callable[[], float], home: tuple[int, int]
) -> None:
    """Remove the files of the directory `name` of `level` as they are read and move its directories up into
    `level` (links are files here: removed, never followed); `TimeoutError` once `deadline` has passed, `OSError`
    when `name` is a mount point (not on the mount `home`)."""
    inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=level)
    try:
        _same_mount(inner, home, name)
        with os.scandir(inner) as children:
            for child in children:
                if child.is_dir(follow_symlinks=False):
                    _move_up(inner, child.name, level, spare)
                else:
                    os.unlink(child.name, dir_fd=inner)
                if clock() > deadline:
                    raise TimeoutError(f"removing {name}")
    finally:
        os.close(inner)


def _mount_of(fd: int) -> tuple[int, int]:
    """The mount the open directory `fd` lies in: its filesystem's device and its mount id, which Linux gives in
    /proc's fdinfo (-1 where it does not: the device alone tells another filesystem, not a bind mount of a
    directory of the same one)."""
    device = os.fstat(fd).st_dev
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
            for line in info:
                if line.startswith("mnt_id:"):
                    return device, int(line.split()[1])
    except (OSError, ValueError):
        pass
    return device, -1


def _mount_of_path(directory: Path) -> tuple[int, int]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _mount_of(fd)
    finally:
        os.close(fd)


def _same_mount(fd: int, home: tuple[int, int], name: str) -> None:
    """Raise `OSError` (EXDEV) when the open directory `fd` (`name`) does not lie in the mount `home`: a mount
    point, whose files are another filesystem's or a directory of the host's, none a gone container's."""
    if _mount_of(fd) != home:
        raise OSError(errno.EXDEV, "a mount point, left as it is with what it holds", name[:80])


def _spare_names() -> Iterator[str]:
    """Names for directories moved up: this call's own (a random part), so that a call resuming a tree an earlier
    one left does not try that call's names one by one."""
    prefix = f"~{secrets.token_hex(4)}."
    return (f"{prefix}{n}" for n in itertools.count(1))


def _move_up(source: int, name: str, target: int, spare: Iterator[str]) -> None:
    """Rename the directory `name` of `source` into `target`, under a name no entry there has."""
    for fresh in spare:
        try:
            os.stat(fresh, dir_fd=target, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(name, fresh, src_dir_fd=source, dst_dir_fd=target)
            return
