"""``testbed image build | check``: the trainer image of ``runtime: docker`` hosts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..network.docker_hosts import DEFAULT_IMAGE


def cmd_build(args: argparse.Namespace) -> int:
    from .builder import build

    def log(m: str) -> None:
        print(f"image: {m}", file=sys.stderr, flush=True)

    if args.vagrant_box:
        from .box import build_box

        out = build_box(rebuild=args.rebuild, log=log)
    else:
        out = build(args.name, rebuild=args.rebuild, log=log)
    print(json.dumps(out, indent=2) if args.json else f"{out['name']} = {out['tag']} ({out['id'][:19]})")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from ..network import docker_hosts
    from .builder import check_image

    docker_hosts.require()
    if docker_hosts.image_id(args.image) is None:
        raise docker_hosts.DockerError(f"image {args.image!r} is not in the Docker daemon (fix: `testbed image "
                                       "build`, or docker load/build it)")
    v = check_image(args.image)
    print(f"{args.image}: python {v['python']}, torch {v['torch']}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("image", help="build or check the trainer image of runtime: docker hosts",
                       description="The image runtime: docker hosts use unless the spec names one: Debian from its "
                                   "packages (debootstrap), the project's dependencies as wheels, docker import. "
                                   "Nothing is pulled from an image registry; the project's code is mounted at run "
                                   "time, not copied in.")
    isub = p.add_subparsers(dest="image_cmd", required=True)
    b = isub.add_parser("build", help=f"build the trainer image (tagged {DEFAULT_IMAGE} and by its recipe's hash; "
                                      "reused when the recipe is unchanged)")
    b.add_argument("--name", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})")
    b.add_argument("--rebuild", action="store_true", help="build even when an image of the same recipe exists")
    b.add_argument("--vagrant-box", action="store_true",
                   help="also build the Vagrant Docker provider's box on top (geo-testbed/vagrant-box:latest: sshd, "
                        "sudo, a vagrant user; the Vagrantfile's docker provider builds it before `vagrant up`)")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    b.set_defaults(func=cmd_build)
    c = isub.add_parser("check", help="check that an image can run the trainers (python3 with torch)")
    c.add_argument("image")
    c.set_defaults(func=cmd_check)
