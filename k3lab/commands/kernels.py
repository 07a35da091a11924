"""`k3lab kernels warm|info|export|import`: the per-machine GPU kernel cache (`k3lab.runner.runtime.kernel_cache`) and
its tuned kernels as archives (`k3lab.runner.runtime.tunings`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from k3lab.errors import UserError
from k3lab.runner.runtime import kernel_cache  # through the module: tests stand in for its GPU functions
from k3lab.runner.runtime.kernel_cache import ENV_VAR
from k3lab.runner.runtime.tunings import export_tunings, import_tunings


def register(subparsers: argparse._SubParsersAction) -> None:
    from k3lab.registry.sweep_cli import add_profile_argument

    parser = subparsers.add_parser("kernels", help="the per-machine GPU kernel cache (FLA autotuning, compiles)")
    commands = parser.add_subparsers(dest="kernels_command", required=True, metavar="ACTION")
    warm = commands.add_parser("warm", help="tune and compile every kernel shape a sweep will use, on this GPU")
    warm.add_argument("file", help="sweep YAML file")
    add_profile_argument(warm)
    warm.add_argument("--kernel-cache", default=None,
                      help=f"cache folder (default: the sweep file's kernel_cache, ${ENV_VAR}, or ~/.cache/k3lab/kernels)")
    warm.set_defaults(func=run_warm)
    info = commands.add_parser("info", help="show the kernel cache")
    add_cache_argument(info)
    info.set_defaults(func=run_info)
    export = commands.add_parser("export", help="write the cache's tuned kernels to one small archive (.tar.xz or .tar.gz)")
    export.add_argument("file", help="archive to write")
    add_cache_argument(export)
    export.add_argument("--gpu", default=None, help="the GPU they were tuned on (default: this machine's GPU)")
    export.add_argument("--compiled", action="store_true",
                        help="the compiled kernels too (Triton's and torch.compile's; megabytes, for this torch version)")
    export.set_defaults(func=run_export)
    imported = commands.add_parser("import", help="merge an exported archive into the cache, if it fits this GPU "
                                                  "and libraries")
    imported.add_argument("file", help="archive written by `k3lab kernels export`")
    add_cache_argument(imported)
    imported.add_argument("--gpu", default=None, help="the GPU the cache serves, on a machine without one "
                                                      "(a cluster head filling the shared volume)")
    imported.set_defaults(func=run_import)


def add_cache_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernel-cache", default=None, help=f"cache folder (default: ${ENV_VAR} or ~/.cache/k3lab/kernels)")


def run_warm(args: argparse.Namespace) -> int:
    from k3lab.registry.sweep_cli import load_sweep_for

    sweep = load_sweep_for(args.file, args.profile)
    kernel_cache.require_cuda()
    cache = kernel_cache.resolve_kernel_cache(args.kernel_cache, sweep.kernel_cache)
    kernel_cache.use_kernel_cache(cache)
    shapes = kernel_cache.kernel_shapes(sweep)
    print(f"warming {len(shapes)} kernel shapes of {sweep.name} ({sweep.profile or 'top-level'} profile) into {cache}")
    result = kernel_cache.warm_kernels(shapes, print_progress, cache=cache)
    print(f"warm: {result['shapes']} shapes in {result['seconds']:.1f} s, "
          f"{result['new_autotune_results']} new autotune results")
    return 0


def print_progress(done: int, total: int, name: str, seconds: float) -> None:
    print(f"  [{done}/{total}] {name}: {seconds:.1f} s", flush=True)


def run_info(args: argparse.Namespace) -> int:
    info = kernel_cache.cache_info(kernel_cache.resolve_kernel_cache(args.kernel_cache))
    if not info["exists"]:
        print(f"kernel cache {info['path']}: empty (nothing tuned on this machine yet)")
        return 0
    print(f"kernel cache {info['path']}: {info['files']} files, {info['bytes'] / 2**20:.1f} MiB, "
          f"{info['compiled_triton_kernels']} compiled Triton kernels, {info['warm_shapes']} sweep shapes warmed")
    for kernel, n in info["autotuned"].items():
        print(f"  {kernel}: {n} tuned shape{'s' if n != 1 else ''}")
    return 0


def gpu_of(args: argparse.Namespace) -> str:
    """--gpu, else this machine's GPU; one line when there is neither."""
    if args.gpu:
        return args.gpu
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"k3lab kernels {args.kernels_command}: no CUDA GPU here; name the GPU with --gpu")
    return kernel_cache.gpu_name()


def run_export(args: argparse.Namespace) -> int:
    manifest = export_tunings(kernel_cache.resolve_kernel_cache(args.kernel_cache), Path(args.file), gpu_of(args),
                              compiled=args.compiled)
    versions = ", ".join(f"{name} {version}" for name, version in manifest["versions"].items())
    compiled = manifest.get("compiled")
    kernel_files = f" and {compiled['files']} compiled kernel files (torch {compiled['torch_build']})" if compiled else ""
    print(f"exported {manifest['autotune_results']} autotune results of {len(manifest['kernels'])} kernels{kernel_files} "
          f"(tuned on {manifest['gpu']}; {versions}) to {args.file}, {Path(args.file).stat().st_size / 1024:.0f} KiB")
    return 0


def run_import(args: argparse.Namespace) -> int:
    cache = kernel_cache.resolve_kernel_cache(args.kernel_cache)
    result = import_tunings(Path(args.file), cache, gpu_of(args))
    compiled = f", {result['compiled']} compiled kernel files added" if result["compiled"] else ""
    print(f"imported {args.file} into {cache}: {result['added']} autotune results added, {result['kept']} already "
          f"there{compiled}, {result['warm_shapes']} warmed shapes recorded")
    return 0
