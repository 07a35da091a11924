"""`k3lab bundle OUT_DIR`: an offline install bundle for a machine with no package index (see `build`).

    wheels    reading wheel metadata; slimming a wheel
    resolve   the target, the fetcher and the resolver of the closure
    install   install.sh and manifest.json
    sizes     sizes read, written and checked against a limit
    parts     a bundle split into parts of at most a size
    build     the bundle put together, and what `k3lab bundle` runs (its flags: `k3lab.commands.bundle`)
"""

from k3lab.bundle.build import BundleOptions, build_bundle, prepare_out_dir, run, tidy_specifier
from k3lab.bundle.install import install_script
from k3lab.bundle.resolve import Fetcher, Resolver, Target, parse_constraints, parse_excludes
from k3lab.bundle.sizes import check_size, parse_size
from k3lab.bundle.wheels import WheelInfo, slim_wheel
from k3lab.errors import UserError

__all__ = ["BundleOptions", "Fetcher", "Resolver", "Target", "UserError", "WheelInfo", "build_bundle", "check_size",
           "install_script", "parse_constraints", "parse_excludes", "parse_size", "prepare_out_dir", "run",
           "slim_wheel", "tidy_specifier"]
