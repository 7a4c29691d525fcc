"""Sweeper: rolling active health checks for the GPU nodes of a Kubernetes cluster."""

__version__ = "0.1.0"
