"""`k3lab kernels warm|info`: the per-machine GPU kernel cache (`k3lab.tune.kernels`)."""

from __future__ import annotations

import argparse

from k3lab.tune import kernels  # through the module: tests stand in for its GPU functions
from k3lab.tune.kernels import ENV_VAR


def register(subparsers: argparse._SubParsersAction) -> None:
    from k3lab.registry.commands import add_profile_argument

    parser = subparsers.add_parser("kernels", help="the per-machine GPU kernel cache (FLA autotuning, compiles)")
    commands = parser.add_subparsers(dest="kernels_command", required=True, metavar="ACTION")
    warm = commands.add_parser("warm", help="tune and compile every kernel shape a sweep will use, on this GPU")
    warm.add_argument("file", help="sweep YAML file")
    add_profile_argument(warm)
    warm.add_argument("--kernel-cache", default=None,
                      help=f"cache folder (default: the sweep file's kernel_cache, ${ENV_VAR}, or ~/.cache/k3lab/kernels)")
    warm.set_defaults(func=run_warm)
    info = commands.add_parser("info", help="show the kernel cache")
    info.add_argument("--kernel-cache", default=None, help=f"cache folder (default: ${ENV_VAR} or ~/.cache/k3lab/kernels)")
    info.set_defaults(func=run_info)


def run_warm(args: argparse.Namespace) -> int:
    from k3lab.registry.commands import load_sweep_for

    sweep = load_sweep_for(args.file, args.profile)
    kernels.require_cuda()
    cache = kernels.resolve_kernel_cache(args.kernel_cache, sweep.kernel_cache)
    kernels.use_kernel_cache(cache)
    shapes = kernels.kernel_shapes(sweep)
    print(f"warming {len(shapes)} kernel shapes of {sweep.name} ({sweep.profile or 'top-level'} profile) into {cache}")
    result = kernels.warm_kernels(shapes, print_progress, cache=cache)
    print(f"warm: {result['shapes']} shapes in {result['seconds']:.1f} s, "
          f"{result['new_autotune_results']} new autotune results")
    return 0


def print_progress(done: int, total: int, name: str, seconds: float) -> None:
    print(f"  [{done}/{total}] {name}: {seconds:.1f} s", flush=True)


def run_info(args: argparse.Namespace) -> int:
    info = kernels.cache_info(kernels.resolve_kernel_cache(args.kernel_cache))
    if not info["exists"]:
        print(f"kernel cache {info['path']}: empty (nothing tuned on this machine yet)")
        return 0
    print(f"kernel cache {info['path']}: {info['files']} files, {info['bytes'] / 2**20:.1f} MiB, "
          f"{info['compiled_triton_kernels']} compiled Triton kernels, {info['warm_shapes']} sweep shapes warmed")
    for kernel, n in info["autotuned"].items():
        print(f"  {kernel}: {n} tuned shape{'s' if n != 1 else ''}")
    return 0
