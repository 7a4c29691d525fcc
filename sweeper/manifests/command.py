"""`python -m sweeper.manifests`: its options and what it prints or writes."""

from __future__ import annotations

import argparse
import sys

from sweeper.config import home
from sweeper.errors import ConfigError, SweeperError
from sweeper.manifests.objects import (
    METRICS_NAMESPACE,
    PLATFORMS,
    SYSTEM_TOLERATIONS,
    Options,
    render,
)
from sweeper.manifests.overlays import set_images, write_deploy


def _toleration(spec: str) -> dict[str, str]:
    """KEY, KEY=VALUE, KEY:EFFECT or KEY=VALUE:EFFECT, as in `kubectl taint`."""
    head, _, effect = spec.partition(":")
    key, eq, value = head.partition("=")
    if not key:
        raise ConfigError(f"--toleration {spec!r}: KEY[=VALUE][:EFFECT]")
    tol = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        tol["value"] = value
    if effect:
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ConfigError(f"--toleration {spec!r}: the effect is NoSchedule, PreferNoSchedule or NoExecute")
        tol["effect"] = effect
    return tol


def options(argv: list[str]) -> tuple[str, Options]:
    ap = argparse.ArgumentParser(prog="python -m sweeper.manifests", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", choices=("cronjob", "serve", "overlays"), default="cronjob",
                    help="print the CronJob's or the serve Deployment's manifest, or write every generated file "
                         "of deploy/ (both manifests, the admission policy, deploy/base and the overlays "
                         "deploy/<platform>; the options below but --set-image do not apply to it)")
    ap.add_argument("--platform", choices=sorted(PLATFORMS),
                    help="the config's `platform` (default: auto, read from the cluster) and the storage class "
                         "of the platform's own CSI driver (eks: gp3; aks: managed-csi; gke: standard-rwo; "
                         "default: the cluster's default class)")
    ap.add_argument("--storage-class", help="the history volume's storage class, whatever the platform")
    ap.add_argument("--toleration", action="append", metavar="KEY[=VALUE][:EFFECT]",
                    help="a taint the controller tolerates (repeatable; default: CriticalAddonsOnly)")
    ap.add_argument("--node-selector", action="append", metavar="KEY=VALUE", default=[],
                    help="a label the controller's node must carry (repeatable)")
    ap.add_argument("--image", default="", help="the controller's and the check Jobs' image, pinned by digest "
                                                "(default: deploy/base/kustomization.yaml's images list)")
    ap.add_argument("--metrics-namespace", default=METRICS_NAMESPACE,
                    help="the one namespace whose pods may reach `sweeper serve` (default: monitoring)")
    ap.add_argument("--set-image", action="append", default=[], metavar="NAME=NEWNAME[:TAG]@DIGEST",
                    help="overlays: first set an entry of deploy/base/kustomization.yaml's images list, as "
                         "`kustomize edit set image` does (repeatable)")
    a = ap.parse_args(argv)
    selector = {}
    for s in a.node_selector:
        k, eq, v = s.partition("=")
        if not k or not eq:
            raise ConfigError(f"--node-selector {s!r}: KEY=VALUE")
        selector[k] = v
    tolerations = tuple(_toleration(t) for t in a.toleration) if a.toleration else SYSTEM_TOLERATIONS
    return a.mode, Options(storage_class=a.storage_class or PLATFORMS.get(a.platform or "", ""), tolerations=tolerations,
                           node_selector=selector, image=a.image, metrics_namespace=a.metrics_namespace,
                           platform=a.platform or "")


def main(argv: list[str] | None = None) -> int:
    try:
        args = sys.argv[1:] if argv is None else argv
        mode, opts = options(args)
        pre = argparse.ArgumentParser(add_help=False)
        pre.add_argument("--set-image", action="append", default=[])
        set_image: list[str] = pre.parse_known_args(args)[0].set_image
        if mode == "overlays":
            if set_image:
                set_images(home(), set_image)
            for path in write_deploy():
                print(f"wrote {path}")
        else:
            print(render(mode=mode, opts=opts), end="")
    except SweeperError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0

