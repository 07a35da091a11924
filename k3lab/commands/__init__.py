"""Every `k3lab` sub-command, one module a command group, each with `register(subparsers)`
(`k3lab.cli` imports them all): thin, they parse, call the package that does the work, and print."""
