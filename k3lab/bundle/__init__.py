"""`k3lab bundle OUT_DIR`: an offline install bundle for a machine with no package index (see `build`).

    wheels    reading wheel metadata; slimming a wheel
    resolve   the target, the fetcher and the resolver of the closure
    install   install.sh and manifest.json
    build     the bundle put together, and the command
"""

from k3lab.bundle.build import (BundleOptions, build_bundle, check_size, parse_size, prepare_out_dir, register, run,
                                tidy_specifier)
from k3lab.bundle.install import install_script
from k3lab.bundle.resolve import Fetcher, Resolver, Target, parse_excludes
from k3lab.bundle.wheels import WheelInfo, slim_wheel
from k3lab.errors import UserError

__all__ = ["BundleOptions", "Fetcher", "Resolver", "Target", "UserError", "WheelInfo", "build_bundle", "check_size",
           "install_script", "parse_excludes", "parse_size", "prepare_out_dir", "register", "run", "slim_wheel",
           "tidy_specifier"]
