"""k3lab: architecture ablations of the Kimi K3 decoder."""

__version__ = "0.1.0"
