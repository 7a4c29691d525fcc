"""The simulated cluster: a Kubernetes API server, scheduler, job controller and kubelet
over a fleet of GPU nodes with injected faults, driven by a clock faster than real time.

It sits beside the product's layers: the CLI (demo, sim serve) and the tests import it;
no production module does. It imports only the node-local checks, which its kubelet runs.
"""
